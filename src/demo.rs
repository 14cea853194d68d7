//! `fieldgate demo`: the simulator in-process on the demo plant, the service against it,
//! and (`--tour`) a scripted session through the real HTTP path.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use fieldgate_sim::{Bind, Faults, Scenario, Simulator};
use serde_json::{Value, json};

use crate::config::Config;
use crate::registry::Registry;
use crate::tools::{Role, Tool, ToolService};
use crate::transport::auth::Tokens;
use crate::transport::client::HttpClient;
use crate::transport::http;

/// A running demo: the simulator, the service and where it listens.
pub struct Demo {
    pub sim: Arc<Simulator>,
    pub tools: ToolService,
    pub addr: SocketAddr,
    /// The simulator's control API (faults per device), on loopback.
    pub control: SocketAddr,
    control_task: tokio::task::JoinHandle<()>,
    pub data_dir: PathBuf,
    /// Whether tokens are configured (the examples then carry an `Authorization` header).
    tokens: bool,
    /// With tokens configured, one the tour calls with (an agent's, else an operator's).
    tour_token: Option<String>,
    running: crate::app::Running,
    _temp: Option<tempfile::TempDir>,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("simulator: {0}")]
    Sim(String),
    #[error("tokens: {0}")]
    Tokens(String),
    #[error("{0}")]
    Start(crate::app::StartError),
    #[error("{0}")]
    Serve(#[from] http::ServeError),
    #[error("data directory {0}: {1}")]
    DataDir(String, std::io::Error),
}

impl Demo {
    /// Starts the simulator on free loopback ports and the service on `listen`, with the
    /// configuration's static tokens.
    pub async fn start(
        config: Config,
        registry: Registry,
        listen: SocketAddr,
        data_dir: Option<PathBuf>,
    ) -> Result<Demo, DemoError> {
        let tokens = Tokens::load(config.auth.tokens_file.as_deref(), std::env::vars()).map_err(|p| {
            DemoError::Tokens(p.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        })?;
        Demo::start_with(config, registry, listen, data_dir, Arc::new(tokens)).await
    }

    /// As `start`, with `tokens` (the configuration's, and the identity provider's when
    /// `[server.oauth]` is set: the demo honours them as `serve` does).
    pub async fn start_with(
        config: Config,
        mut registry: Registry,
        listen: SocketAddr,
        data_dir: Option<PathBuf>,
        tokens: Arc<Tokens>,
    ) -> Result<Demo, DemoError> {
        let devices =
            fieldgate_sim::plant::load_dir(&config.devices.dir).map_err(|e| DemoError::Sim(e.to_string()))?;
        let mut scenario = Scenario::parse("built-in demo scenario", fieldgate_sim::wave::DEMO_SCENARIO)
            .map_err(|e| DemoError::Sim(e.to_string()))?;
        scenario.faults.clear();
        let sim = Simulator::start(devices, scenario, Bind::Ephemeral)
            .await
            .map_err(|e| DemoError::Sim(e.to_string()))?;
        registry.override_endpoints(sim.addrs(), sim.serial_paths());
        registry.override_opcua_endpoints(sim.opcua_urls());
        let (data_dir, temp) = match data_dir {
            Some(d) => {
                std::fs::create_dir_all(&d).map_err(|e| DemoError::DataDir(d.display().to_string(), e))?;
                (d, None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("fieldgate-demo-")
                    .tempdir()
                    .map_err(|e| DemoError::DataDir("temporary".into(), e))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        // The demo owns both ends: it trusts its own simulator's secured OPC UA servers, as
        // an operator would by moving their certificates to pki/trusted.
        let pki = crate::driver::opcua::security::Pki::new(data_dir.join("pki"));
        for device in sim.opcua_urls().keys() {
            if let Some(cert) = sim.opcua_certificate(device) {
                let trusted = std::fs::read(&cert).map_err(|e| e.to_string()).and_then(|der| pki.trust(&der));
                match trusted {
                    Ok(path) => {
                        tracing::info!(%device, file = %path.display(), "demo: trusting the simulator's certificate")
                    }
                    Err(error) => {
                        tracing::warn!(%device, %error, "demo: cannot trust the simulator's certificate")
                    }
                }
            }
        }
        let mut config = config;
        config.storage.data_dir = data_dir.clone();
        // The demo honours configured tokens, so an operator can approve work orders in it.
        let with_tokens = !tokens.is_empty();
        let tour_token = tokens.secret_of(Role::Agent).or_else(|| tokens.secret_of(Role::Operator));
        let options =
            crate::app::Options { listen: Some(listen), listen_required: true, tokens, mode: "demo" };
        let running = crate::app::start(config, registry, options).await.map_err(|e| match e {
            crate::app::StartError::Serve(e) => DemoError::Serve(e),
            other => DemoError::Start(other),
        })?;
        let addr = running.addr.unwrap_or(listen);
        let tools = running.tools.clone();
        let sim = Arc::new(sim);
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let (control, control_task) = fieldgate_sim::control::serve(sim.clone(), loopback)
            .await
            .map_err(|e| DemoError::Sim(format!("control API: {}", e.kind())))?;
        Ok(Demo {
            sim,
            tools,
            addr,
            control,
            control_task,
            data_dir,
            tokens: with_tokens,
            tour_token,
            running,
            _temp: temp,
        })
    }

    /// The MCP client configurations that reach this demo: over HTTP, and over stdio through
    /// `fieldgate mcp --url` (a relay to the demo's `/mcp`). With tokens configured both
    /// carry a placeholder for the caller's own token, never a configured secret.
    pub fn mcp_config(&self) -> serde_json::Value {
        let base = self.url().to_string();
        let command =
            std::env::current_exe().map_or_else(|_| "fieldgate".to_string(), |p| p.display().to_string());
        let mut http = json!({ "type": "http", "url": format!("{base}/mcp") });
        let mut stdio = json!({ "type": "stdio", "command": command, "args": ["mcp", "--url", base] });
        if self.tokens {
            http["headers"] = json!({ "Authorization": "Bearer YOUR_TOKEN" });
            stdio["env"] = json!({ "FIELDGATE_CLI_TOKEN": "YOUR_TOKEN" });
        }
        if self.tools.config().server.tls.is_some() {
            // The relay checks the certificate: a plant's own CA must be named.
            stdio["env"]["FIELDGATE_CA_FILE"] = json!("/path/to/the-ca-that-signed-the-server.pem");
        }
        json!({ "mcpServers": { "fieldgate": http, "fieldgate-stdio": stdio } })
    }

    /// Where clients reach it: `https://` and `public_url` under TLS.
    pub fn url(&self) -> crate::transport::service_url::ServiceUrl {
        crate::app::own_url(&self.tools.config().server)
    }

    /// What a person needs to start using it.
    pub fn banner(&self) -> String {
        let base = self.url().to_string();
        let auth = if self.tokens { " -H 'Authorization: Bearer YOUR_TOKEN'" } else { "" };
        let tokens_note = if self.tokens {
            "\n  (tokens are configured: replace YOUR_TOKEN with one of yours; the console asks for it at sign-in)"
        } else {
            ""
        };
        let mut out = format!(
            "fieldgate demo: {} devices, {} sensors; simulator on loopback\n\n  console    {base}/console   (open it in a browser)\n  HTTP API   {base}/v1/tools   (try: curl -s{auth} '{base}/v1/sensors?zone=LINE1')\n  MCP        {base}/mcp\n  OpenAPI    {base}/openapi.json\n  metrics    {base}/metrics\n  data       {}{tokens_note}\n\nMCP client configuration (over HTTP, or over stdio through `fieldgate mcp --url`):\n{}\n",
            self.tools.registry().devices().len(),
            self.tools.registry().sensors().len(),
            self.data_dir.display(),
            serde_json::to_string_pretty(&self.mcp_config()).unwrap_or_default()
        );
        if let Some(b) = self.tools.config().mqtt.brokers.first() {
            let (group, node) = (
                crate::sparkplug::group_id(&self.tools.core()),
                crate::sparkplug::edge_node_id(&self.tools.core()),
            );
            out.push_str(&format!(
                "  Sparkplug  {b}   group {group}, edge node {node}   (watch: mosquitto_sub -v -t 'spBv1.0/#')\n"
            ));
        }
        for (id, addr) in self.sim.addrs() {
            out.push_str(&format!("\n  simulated {id:<16} modbus on {addr}"));
        }
        for (id, url) in self.sim.opcua_urls() {
            out.push_str(&format!("\n  simulated {id:<16} opcua at {url}"));
        }
        for id in self.sim.skipped() {
            out.push_str(&format!("\n  not simulated {id}"));
        }
        let control = format!("http://{}", self.control);
        out.push_str(&format!(
            "\n\nBreak the plant (the simulator's control API, {control}):\n  curl -X PATCH {control}/devices/a-util-meter/faults -H 'content-type: application/json' -d '{{\"down\":true}}'   # dead\n  curl -X PATCH {control}/devices/a-line1-plc/faults -H 'content-type: application/json' -d '{{\"latency_ms\":300}}'   # slow (within its 500 ms timeout)\n  curl -X PATCH {control}/devices/a-line1-plc/faults -H 'content-type: application/json' -d '{{\"latency_ms\":800}}'   # slower than its timeout: DEVICE_TIMEOUT\n  curl -X PATCH {control}/devices/a-line1-plc/faults -H 'content-type: application/json' -d '{{\"exception_code\":6,\"exception_rate\":0.5}}'   # busy\n  curl -X PATCH {control}/devices/a-line1-plc/faults -H 'content-type: application/json' -d '{{\"stall\":0.1,\"stall_ms\":30000}}'   # stalls\n  curl -X DELETE {control}/devices/a-util-meter/faults   # healthy again\n"
        ));
        let operator = if self.tokens {
            "FIELDGATE_CLI_TOKEN=AN_OPERATOR_TOKEN "
        } else {
            "(acknowledging is an operator's act: start the demo with FIELDGATE_TOKEN_SHIFT_LEAD=operator:<16+ characters>, then)\n  FIELDGATE_CLI_TOKEN=THAT_TOKEN "
        };
        let lister = if self.tokens { "FIELDGATE_CLI_TOKEN=YOUR_TOKEN " } else { "" };
        out.push_str(&format!(
            "\nRaise an alarm (docs/alarms.md): drive boiler B-1's feed water to 91 degC, past its HI and HIHI limits, and back:\n  curl -X PUT {control}/sensors/B_BOILER_001 -H 'content-type: application/json' -d '{{\"wave\":\"constant\",\"value\":91}}'\n  {lister}fieldgate alarms list --state not_normal --url {base}\n  {operator}fieldgate alarms ack B_BOILER_001.HIHI --comment 'seen, checking the feed pump' --url {base}\n  curl -X PUT {control}/sensors/B_BOILER_001 -H 'content-type: application/json' -d '{{\"wave\":\"sine\",\"mean\":82,\"amplitude\":3,\"period_s\":180}}'\n"
        ));
        out
    }

    pub async fn stop(self) {
        self.control_task.abort();
        let _ = self.control_task.await;
        let _ = self.running.stop().await;
        if let Ok(sim) = Arc::try_unwrap(self.sim) {
            sim.shutdown().await;
        }
    }
}

/// One step of the tour: a call through the real HTTP API, printed with its answer.
async fn step(
    client: &mut HttpClient,
    title: &str,
    tool: &str,
    args: Value,
    out: &mut dyn FnMut(&str),
) -> Value {
    out(&format!("\n== {title}\n-> POST /v1/tools/{tool} {args}"));
    let body = serde_json::to_vec(&args).unwrap_or_default();
    match client.post(&format!("/v1/tools/{tool}"), &body).await {
        Ok(res) => {
            let v = res.json();
            let retry = res.header("retry-after").map(|r| format!(", Retry-After: {r}")).unwrap_or_default();
            out(&format!(
                "<- HTTP {}{retry}\n{}",
                res.status,
                serde_json::to_string_pretty(&v).unwrap_or_default()
            ));
            v
        }
        Err(e) => {
            out(&format!("<- request failed: {e}"));
            Value::Null
        }
    }
}

/// The scripted tour. Returns whether every step answered as expected.
pub async fn tour(demo: &Demo, out: &mut dyn FnMut(&str)) -> bool {
    let mut client = match demo.url().connect_to(demo.addr).await {
        Ok(c) => c,
        Err(e) => {
            out(&format!("cannot reach the demo's HTTP API: {e}"));
            return false;
        }
    };
    if let Some(token) = &demo.tour_token {
        client = client.with_token(token);
    }
    let mut t = Tour { client, out, ok: true };
    t.normal_calls().await;
    t.outage(demo).await;
    t.recovery(demo).await;
    t.ok
}

/// The tour's client, where it writes, and whether every step went as expected.
struct Tour<'a> {
    client: HttpClient,
    out: &'a mut dyn FnMut(&str),
    ok: bool,
}

impl Tour<'_> {
    async fn step(&mut self, title: &str, tool: Tool, args: Value) -> Value {
        step(&mut self.client, title, tool.name(), args, self.out).await
    }

    fn check(&mut self, cond: bool, what: &str) {
        if !cond {
            (self.out)(&format!("!! unexpected: {what}"));
            self.ok = false;
        }
    }

    /// Discovery, a batch, and a malformed ID.
    async fn normal_calls(&mut self) {
        let t = self;
        let v = t
            .step("Discover sensors on line 1", Tool::ListSensors, json!({"zone": "LINE1", "limit": 4}))
            .await;
        t.check(v["ok"] == true, "list_sensors should succeed");
        let v = t
            .step(
                "Read three sensors on three devices in one call",
                Tool::GetSensorReadings,
                json!({"sensor_ids": ["A_LINE1_001", "A_UTIL_001", "B_BOILER_003"]}),
            )
            .await;
        t.check(v["data"]["complete"] == true, "all three readings");
        let v = t
            .step(
                "A malformed ID: rejected, with the ID that was meant",
                Tool::GetSensorReading,
                json!({"sensor_id": "a_line1_001"}),
            )
            .await;
        t.check(v["error"]["suggestions"][0] == "A_LINE1_001", "a suggestion");
    }

    /// The meter stops answering: a retryable error, then the breaker opens.
    async fn outage(&mut self, demo: &Demo) {
        let t = self;
        (t.out)("\n== The power meter stops answering (simulator fault: no reply)");
        let _ = demo.sim.set_faults("a-util-meter", Faults { no_reply: 1.0, ..Default::default() });
        let v = t.step("Reading it gives a retryable error (the call retried inside its deadline; meta.attempts counts the tries)",
        Tool::GetSensorReading,
        json!({"sensor_id": "A_UTIL_005"}))
    .await;
        t.check(
            v["error"]["code"] == "DEVICE_TIMEOUT" && v["error"]["retryable"] == true,
            "DEVICE_TIMEOUT, retryable",
        );
        // The poller reads the meter too and shares its breaker, so it opens after a few
        // more failures, whoever makes them.
        let mut opened = false;
        for (i, sensor) in ["A_UTIL_006", "A_UTIL_008", "A_UTIL_009"].into_iter().enumerate() {
            let title = if i == 0 {
                "More failures open the meter's circuit breaker"
            } else {
                "Another sensor of the same meter"
            };
            let v = t.step(title, Tool::GetSensorReading, json!({ "sensor_id": sensor })).await;
            if v["error"]["code"] == "CIRCUIT_OPEN" {
                opened = true;
                break;
            }
        }
        t.check(opened, "CIRCUIT_OPEN");
        let v = t
            .step(
                "While it is open, calls are answered at once, with the time until a probe",
                Tool::GetSensorReading,
                json!({"sensor_id": "A_UTIL_007"}),
            )
            .await;
        t.check(
            v["error"]["code"] == "CIRCUIT_OPEN" && v["meta"]["attempts"] == 0,
            "CIRCUIT_OPEN without a device attempt",
        );
        let v = t
            .step(
                "get_device_status shows the device down",
                Tool::GetDeviceStatus,
                json!({"device_id": "a-util-meter"}),
            )
            .await;
        t.check(v["data"]["devices"][0]["state"] == "down", "device down");
    }

    /// The meter answers again: too early is still open, then the probe closes it.
    async fn recovery(&mut self, demo: &Demo) {
        let t = self;
        (t.out)("\n== The meter answers again");
        let _ = demo.sim.set_faults("a-util-meter", Faults::default());
        let v = t
            .step(
                "Too early: still open",
                Tool::GetSensorReading,
                json!({"sensor_id": "A_UTIL_005", "unit": "raw"}),
            )
            .await;
        let wait = v["error"]["retry_after_ms"].as_u64().unwrap_or(0);
        (t.out)(&format!("\n(waiting {wait} ms, as retry_after_ms says)"));
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        let v = t
            .step(
                "The probe succeeds and the breaker closes",
                Tool::GetSensorReading,
                json!({"sensor_id": "A_UTIL_005", "unit": "raw"}),
            )
            .await;
        t.check(v["ok"] == true, "recovery");
        let v = t
            .step("The device is up again", Tool::GetDeviceStatus, json!({"device_id": "a-util-meter"}))
            .await;
        t.check(v["data"]["devices"][0]["breaker"]["state"] == "closed", "breaker closed");
    }
}
