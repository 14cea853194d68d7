//! `fieldgate mcp` is a whole fieldgate: what it is given is kept in the data directory,
//! it polls into history, and when a running fieldgate already holds the data directory it
//! relays to it (and `call` asks it) instead of pretending.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::support::*;

/// A `fieldgate mcp` process over the simulator, spoken to over stdio.
struct StdioClient {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next: u64,
    /// Messages read while waiting for another answer.
    seen: Vec<Value>,
}

fn fieldgate(devices: &std::path::Path, data: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fieldgate"));
    c.arg("--devices")
        .arg(devices)
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data)
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_STORAGE_FLUSH_INTERVAL_MS", "100")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

impl StdioClient {
    async fn start(devices: &std::path::Path, data: &std::path::Path, extra: &[&str]) -> StdioClient {
        let mut child = fieldgate(devices, data).arg("mcp").args(extra).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut s = StdioClient { child, stdin, lines, next: 1, seen: Vec::new() };
        let init = s
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
            )
            .await;
        assert!(init["result"]["protocolVersion"].is_string(), "{init}");
        s.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        s
    }

    async fn send(&mut self, msg: Value) {
        self.stdin.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
                .await
                .expect("an answer within 20 s")
                .unwrap()
                .expect("stdout open");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
            self.seen.push(v);
        }
    }

    /// A tool's envelope.
    async fn call(&mut self, tool: &str, args: Value) -> Value {
        let r = self.request("tools/call", json!({"name": tool, "arguments": args})).await;
        r["result"]["structuredContent"].clone()
    }

    /// Closes stdin, as a client does when it quits, and waits for the exit.
    async fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin);
        tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.expect("exits").unwrap()
    }
}

fn order(key: &str) -> Value {
    json!({"sensor_id": "A_LINE1_001", "type": "inspection", "priority": "medium",
           "summary": "Discharge pressure above range for an hour; inspect the pump.", "idempotency_key": key})
}

/// The simulator on the demo devices and device files pointed at it.
async fn plant() -> (fieldgate_sim::Simulator, tempfile::TempDir) {
    let sim = sim_for(&demo_dir()).await;
    let dir = demo_devices_for(&sim);
    (sim, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_orders_made_over_stdio_survive_the_session_and_history_fills_meanwhile() {
    let (sim, devices) = plant().await;
    let data = tempfile::tempdir().unwrap();
    let mut s = StdioClient::start(devices.path(), data.path(), &[]).await;
    let created = s.call("create_work_order", order("stdio-keeps-01")).await;
    assert_eq!(created["ok"], true, "{created}");
    let id = created["data"]["work_order"]["id"].as_str().unwrap().to_string();
    // The poller runs in this process: history fills while the session is open.
    let since = chrono::Utc::now().timestamp_millis() - 60_000;
    let from = chrono::Utc.timestamp_millis_opt(since).unwrap().to_rfc3339();
    let session = tokio::sync::Mutex::new(&mut s);
    wait_until("history of A_LINE1_001 from the poller", Duration::from_secs(30), || async {
        let args = json!({"sensor_id": "A_LINE1_001", "from": from});
        let h = session.lock().await.call("get_sensor_history", args).await;
        assert_eq!(h["ok"], true, "{h}");
        !h["data"]["points"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(s.close().await.success());
    assert!(!data.path().join(fieldgate::app::OWNER_FILE).exists(), "the owner file is removed at exit");
    // A new session, a new process: the order is still there.
    let mut s = StdioClient::start(devices.path(), data.path(), &[]).await;
    let got = s.call("get_work_order", json!({"work_order_id": id})).await;
    assert_eq!(got["data"]["work_order"]["id"], id.as_str(), "{got}");
    let h = s.call("get_sensor_history", json!({"sensor_id": "A_LINE1_001", "from": from})).await;
    assert!(!h["data"]["points"].as_array().unwrap().is_empty(), "history kept across sessions: {h}");
    assert!(s.close().await.success());
    sim.shutdown().await;
}

use chrono::TimeZone as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_serve_holds_the_data_directory_mcp_relays_and_call_asks_it() {
    let (sim, devices) = plant().await;
    let data = tempfile::tempdir().unwrap();
    let mut serve = fieldgate(devices.path(), data.path()).arg("serve").spawn().unwrap();
    let mut err = BufReader::new(serve.stderr.take().unwrap()).lines();
    let addr = listening_addr(&mut err).await;
    let owner = fieldgate::app::owner_of(data.path()).expect("serve wrote its owner file");
    assert_eq!(owner.url.as_deref(), Some(format!("http://{addr}").as_str()));
    // A stdio client relays to the running service: its order lands there.
    let mut s = StdioClient::start(devices.path(), data.path(), &[]).await;
    let created = s.call("create_work_order", order("relayed-0001")).await;
    assert_eq!(created["ok"], true, "{created}");
    let id = created["data"]["work_order"]["id"].as_str().unwrap().to_string();
    let mut http = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
    let seen = http.get(&format!("/v1/work-orders/{id}")).await.unwrap().json();
    assert_eq!(seen["data"]["work_order"]["id"], id.as_str(), "{seen}");
    // `call` answers through it too.
    let o = fieldgate(devices.path(), data.path())
        .args(["call", "get_work_order", &json!({"work_order_id": id}).to_string()])
        .output_within()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["data"]["work_order"]["id"], id.as_str());
    // Without the owner file, nothing says where the holder listens: a structured,
    // retryable error naming the holder, never an answer made up from no store.
    std::fs::remove_file(data.path().join(fieldgate::app::OWNER_FILE)).unwrap();
    let o = fieldgate(devices.path(), data.path())
        .args(["call", "list_work_orders", "{}"])
        .output_within()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["ok"].as_bool(), v["error"]["code"].as_str()),
        (Some(false), Some("STORAGE_UNAVAILABLE")),
        "{v}"
    );
    assert_eq!(v["error"]["retryable"], true);
    assert!(v["error"]["message"].as_str().unwrap().contains("held by another fieldgate process"), "{v}");
    let mut refused = StdioClient::start_raw(devices.path(), data.path()).await;
    let r = refused.request("tools/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("held by another fieldgate process"), "{r}");
    // The service stops: the relayed client's next request is told so, not left waiting.
    let _ = std::process::Command::new("kill").args(["-TERM", &serve.id().unwrap().to_string()]).status();
    let _ = tokio::time::timeout(Duration::from_secs(20), serve.wait()).await;
    let r = s.request("tools/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32000, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("does not answer"), "{r}");
    sim.shutdown().await;
}

impl StdioClient {
    /// Started without the MCP handshake (for a process that refuses every request).
    async fn start_raw(devices: &std::path::Path, data: &std::path::Path) -> StdioClient {
        let mut child = fieldgate(devices, data).arg("mcp").spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        StdioClient { child, stdin, lines, next: 1, seen: Vec::new() }
    }
}

/// The held-store hint of `work-orders` names where the holder really listens (from its
/// owner file) and the whole command, ID included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_store_points_at_the_holders_real_address() {
    let (sim, devices) = plant().await;
    let data = tempfile::tempdir().unwrap();
    let mut serve = fieldgate(devices.path(), data.path()).arg("serve").spawn().unwrap();
    let mut err = BufReader::new(serve.stderr.take().unwrap()).lines();
    let addr = listening_addr(&mut err).await.to_string();
    let o = fieldgate(devices.path(), data.path())
        .args(["work-orders", "approve", "WO-000007", "--data-dir"])
        .arg(data.path())
        .output_within()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains(&format!("fieldgate work-orders approve WO-000007 --url http://{addr}")), "{text}");
    let _ = serve.kill().await;
    sim.shutdown().await;
}

/// Device state is evidence: a device nobody has reached is unknown, one whose connect
/// failed is down, and an OPC UA server that never existed is not up.
#[tokio::test]
async fn device_state_is_evidence_not_a_default() {
    // A port that refuses for the whole test (bound, never listening).
    let port = ClosedPort::new();
    let closed = port.addr();
    let file = GOOD.replace("127.0.0.1:5020", &closed.to_string());
    let ua = GOOD
        .replace("t-plc", "t-ua")
        .replace("T_ZONE1_001", "T_ZONE2_001")
        .replace("zone = \"ZONE1\"", "zone = \"ZONE2\"")
        .replace("protocol = \"modbus-tcp\"", "protocol = \"opcua\"")
        .replace("endpoint = \"127.0.0.1:5020\"", &format!("endpoint = \"opc.tcp://{closed}/none\""))
        .replace("table = \"holding\"\naddress = 0\ntype = \"f32\"", "node_id = \"ns=2;s=x\"");
    let dir = device_dir(&[("t.toml", &file), ("u.toml", &ua)]);
    let registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let svc = fieldgate::tools::ToolService::new(
        std::sync::Arc::new(registry),
        fieldgate::config::Config::default(),
    );
    let state = |svc: &fieldgate::tools::ToolService, id: &str| {
        let svc = svc.clone();
        let id = id.to_string();
        async move {
            svc.call("get_device_status", json!({"device_id": id})).await.unwrap().json()["devices"][0]
                .clone()
        }
    };
    let before = state(&svc, "t-plc").await;
    assert_eq!(
        (before["state"].as_str(), before["confirmed_at"].as_str()),
        (Some("unknown"), None),
        "{before}"
    );
    let _ = svc.call("get_sensor_reading", json!({"sensor_id": "T_ZONE1_001"})).await;
    let after = state(&svc, "t-plc").await;
    assert_eq!(after["state"], "down", "{after}");
    assert!(after["confirmed_at"].is_string() && after["last_error"]["code"].is_string(), "{after}");
    let _ = svc.call("get_sensor_reading", json!({"sensor_id": "T_ZONE2_001"})).await;
    let ua = state(&svc, "t-ua").await;
    assert_ne!(ua["state"], "up", "{ua}");
}

/// A device killed and brought back gives exactly one "down" line and one "up" line in
/// the log, however many reads failed in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_going_down_is_a_warning_that_a_warn_log_level_shows() {
    let (sim, devices) = plant().await;
    let data = tempfile::tempdir().unwrap();
    sim.set_faults("a-line1-plc", fieldgate_sim::Faults { down: true, ..Default::default() }).unwrap();
    let mut serve = fieldgate(devices.path(), data.path())
        .arg("serve")
        .env("FIELDGATE_LOG", "warn")
        .env("FIELDGATE_BREAKER_OPEN_MS", "300")
        .spawn()
        .unwrap();
    let mut err = BufReader::new(serve.stderr.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = err.next_line().await.unwrap().expect("fieldgate runs");
            if line.contains("a-line1-plc") && line.contains("device down") {
                return line;
            }
        }
    })
    .await
    .expect("a 'device down' line within 30 s with FIELDGATE_LOG=warn");
    assert!(line.contains("WARN"), "{line}");
    let _ = serve.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_device_is_one_down_line_and_one_up_line() {
    let (sim, devices) = plant().await;
    let data = tempfile::tempdir().unwrap();
    let mut serve = fieldgate(devices.path(), data.path())
        .arg("serve")
        // The resilience layer's debug events say when a probe failed.
        .env("FIELDGATE_LOG", "info,fieldgate::resilience=debug")
        .env("FIELDGATE_BREAKER_OPEN_MS", "300")
        .env("FIELDGATE_BREAKER_MAX_OPEN_MS", "600")
        .spawn()
        .unwrap();
    let mut err = BufReader::new(serve.stderr.take().unwrap()).lines();
    async fn next(err: &mut Lines<BufReader<tokio::process::ChildStderr>>) -> String {
        tokio::time::timeout(Duration::from_secs(30), err.next_line())
            .await
            .expect("a log line within 30 s")
            .unwrap()
            .unwrap()
    }
    loop {
        if next(&mut err).await.contains("fieldgate listening on") {
            break;
        }
    }
    sim.set_faults("a-line1-plc", fieldgate_sim::Faults { down: true, ..Default::default() }).unwrap();
    let (mut down, mut up) = (0, 0);
    loop {
        let line = next(&mut err).await;
        if line.contains("a-line1-plc") && line.contains("device down") {
            down += 1;
            break;
        }
    }
    // Down until two probes have failed and reopened the breaker (observed in the log),
    // without more "down" lines meanwhile.
    let down_while_probing = tokio::time::timeout(Duration::from_secs(60), async {
        let (mut failed_probes, mut more_down) = (0, 0);
        while failed_probes < 2 {
            let line = next(&mut err).await;
            let this = line.contains("a-line1-plc");
            more_down += usize::from(this && line.contains("device down"));
            failed_probes += usize::from(this && line.contains("probe failed"));
        }
        more_down
    })
    .await
    .expect("two failed probes of the dead device within 60 s");
    down += down_while_probing;
    sim.set_faults("a-line1-plc", fieldgate_sim::Faults::default()).unwrap();
    loop {
        let line = next(&mut err).await;
        down += usize::from(line.contains("a-line1-plc") && line.contains("device down"));
        if line.contains("a-line1-plc") && line.contains("device up again") {
            up += 1;
            break;
        }
    }
    let _ = std::process::Command::new("kill").args(["-TERM", &serve.id().unwrap().to_string()]).status();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(10), err.next_line()).await {
        down += usize::from(line.contains("a-line1-plc") && line.contains("device down"));
        up += usize::from(line.contains("a-line1-plc") && line.contains("device up again"));
    }
    assert_eq!((down, up), (1, 1));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_answers_input_it_cannot_pass_on_and_keeps_relaying() {
    let devices = device_dir(&[("t.toml", GOOD)]);
    let data = tempfile::tempdir().unwrap();
    let mut serve = fieldgate(devices.path(), data.path()).arg("serve").spawn().unwrap();
    let mut err = BufReader::new(serve.stderr.take().unwrap()).lines();
    let _addr = listening_addr(&mut err).await;
    let mut s = StdioClient::start(devices.path(), data.path(), &[]).await;
    // Not UTF-8, then a line longer than server.max_body_bytes (64 KiB), then a ping.
    s.stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\",\"x\":\"\xff\"}\n").await.unwrap();
    let long =
        format!("{{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\",\"x\":\"{}\"}}\n", "a".repeat(70_000));
    s.stdin.write_all(long.as_bytes()).await.unwrap();
    s.stdin.flush().await.unwrap();
    let ping = s.request("ping", json!({})).await;
    assert!(ping["result"].is_object(), "{ping}");
    // The two answers came first, in order, each a JSON-RPC error without an id.
    let answered: Vec<Value> = s.seen.drain(..).collect();
    let codes: Vec<i64> = answered.iter().map(|v| v["error"]["code"].as_i64().unwrap_or(0)).collect();
    assert_eq!(codes, [-32700, -32600], "{answered:?}");
    assert!(answered.iter().all(|v| v["id"].is_null()), "{answered:?}");
    let _ = serve.kill().await;
}
