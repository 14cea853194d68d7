//! `fieldgate serve` and `fieldgate demo --tour` as processes, as a user runs them.

use std::process::Stdio;
use std::time::Duration;

use fieldgate::transport::client::HttpClient;
use fieldgate_sim::{Bind, Faults, Scenario, Simulator};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::support::*;

/// The demo device files with their endpoints pointed at a running simulator.
fn devices_for(sim: &Simulator) -> tempfile::TempDir {
    demo_devices_for(sim)
}

#[tokio::test]
async fn sigterm_lets_the_request_in_flight_finish_and_exits_0() {
    let devices = fieldgate_sim::plant::load_dir(&demo_dir()).unwrap();
    let sim = Simulator::start(devices, Scenario::default(), Bind::Ephemeral).await.unwrap();
    sim.set_faults("a-line1-plc", Faults { latency_ms: 400, ..Default::default() }).unwrap();
    let dir = devices_for(&sim);
    // Not polled: the only request the device sees is the tool call's, so the test knows
    // when that call is in flight.
    let line1 = dir.path().join("a-line1-plc.toml");
    let text = std::fs::read_to_string(&line1).unwrap();
    assert!(text.contains("poll_interval_ms = 1000"), "the demo file changed: {text}");
    std::fs::write(&line1, text.replace("poll_interval_ms = 1000", "poll_interval_ms = 0")).unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--log-format", "json", "--devices", dir.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = listening_addr(&mut lines).await;
    let before = sim.stats("a-line1-plc").unwrap().requests;
    let in_flight = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap()
    });
    // The request has reached the device: now stop the service.
    wait_until("the request to reach the device", Duration::from_secs(30), || {
        std::future::ready(sim.stats("a-line1-plc").unwrap().requests > before)
    })
    .await;
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let r = in_flight.await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(0));
    // New connections are no longer accepted.
    assert!(HttpClient::connect(addr).await.is_err());

    // One JSON log event per tool call, with the fields of docs/tool-contract.md §8.
    let mut events = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["fields"]["message"] == "tool call"
        {
            events.push(v);
        }
    }
    assert_eq!(events.len(), 1, "{events:?}");
    let f = &events[0]["fields"];
    for key in [
        "call_id",
        "tool",
        "arguments",
        "outcome",
        "code",
        "retryable",
        "attempts",
        "device",
        "duration_ms",
        "caller",
    ] {
        assert!(f.get(key).is_some(), "log event lacks {key}: {f}");
    }
    assert_eq!(f["tool"], "get_sensor_reading");
    assert_eq!(f["code"], "OK");
    // A success names the device read too, not only a failure.
    assert_eq!(f["device"], "a-line1-plc", "{f}");
    // The arguments are a JSON object in JSON logs, not an escaped string.
    assert_eq!(f["arguments"], serde_json::json!({"sensor_id": "A_LINE1_001"}), "{f}");
    sim.shutdown().await;
}

#[tokio::test]
async fn the_demo_tour_runs_through_the_real_http_path() {
    tour_with(&[]).await;
}

/// With tokens configured (here an operator's only), the tour calls with one of them.
#[tokio::test]
async fn the_demo_tour_runs_with_tokens_configured() {
    tour_with(&[("FIELDGATE_TOKEN_SHIFT", "operator:tour-test-token-0123456789abcdef")]).await;
}

/// A bad token is reported as what it is (it was prefixed "simulator:"), as `serve`
/// reports it.
#[tokio::test]
async fn the_demo_names_a_bad_token_as_a_token_problem() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["demo", "--tour", "--data-dir", data.path().to_str().unwrap()])
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_TOKEN_AG1", "agent:short")
        .output_within()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("environment variable FIELDGATE_TOKEN_AG1: a token must be at least 16 characters")
            && !err.contains("simulator"),
        "{err}"
    );
}

async fn tour_with(env: &[(&str, &str)]) {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["demo", "--tour", "--data-dir", data.path().to_str().unwrap()])
        .current_dir(root())
        .env_clear()
        .envs(env.iter().copied())
        .output_within()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("POST /v1/tools/list_sensors"));
    assert!(text.contains("\"suggestions\""));
    assert!(text.contains("DEVICE_TIMEOUT"));
    assert!(text.contains("CIRCUIT_OPEN"));
    assert!(text.contains("The probe succeeds and the breaker closes"));
    assert!(text.contains("Retry-After"));
    assert!(text.trim_end().ends_with("tour complete"), "{text}");
}

/// The shipped device files, with their ports moved to free ones (endpoint paths kept).
fn shipped_files_on_free_ports() -> tempfile::TempDir {
    let ports: Vec<u16> = (0..4)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect::<Vec<_>>()
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let mut text = std::fs::read_to_string(&path).unwrap();
        for (declared, port) in [":5020", ":5021", ":5022", ":4840"].iter().zip(&ports) {
            text = text.replace(declared, &format!(":{port}"));
        }
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    dir
}

/// The standalone simulator serves what the shipped files declare (OPC UA endpoint path
/// included), and `serve` on the same files reads every demo sensor: the README's
/// "simulator alone, then serve" path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reads_every_demo_sensor_from_the_simulator_on_the_shipped_files() {
    let mut started = None;
    // The ports were free a moment ago; another process may take one meanwhile.
    for _ in 0..3 {
        let dir = shipped_files_on_free_ports();
        let scenario = Scenario::load(&root().join("simulator/scenarios/demo.toml")).unwrap();
        let scenario = Scenario { faults: Default::default(), ..scenario };
        if let Ok(sim) =
            Simulator::start(fieldgate_sim::plant::load_dir(dir.path()).unwrap(), scenario, Bind::Declared)
                .await
        {
            started = Some((dir, sim));
            break;
        }
    }
    let (dir, sim) = started.expect("the simulator starts on the declared ports");
    let url = sim.opcua_urls().into_values().next().unwrap();
    assert!(url.ends_with("/fieldgate"), "the simulator serves the file's endpoint path: {url}");
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices", dir.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = listening_addr(&mut lines).await;
    let ids: Vec<String> = demo_registry().sensors().iter().map(|s| s.id.to_string()).collect();
    let body = serde_json::to_vec(&serde_json::json!({ "sensor_ids": ids })).unwrap();
    let mut c = HttpClient::connect(addr).await.unwrap();
    let r = c.post("/v1/tools/get_sensor_readings", &body).await.unwrap().json();
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["data"]["failed"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(r["data"]["readings"].as_array().unwrap().len(), ids.len());
    let _ = child.kill().await;
    sim.shutdown().await;
}

/// A person can break the demo: it prints the simulator's control API, and a device made
/// dead there is dead for the service, and healthy again after a DELETE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_prints_its_fault_control_and_a_fault_set_there_shows_in_the_service() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["demo", "--listen", "127.0.0.1:0", "--data-dir", data.path().to_str().unwrap()])
        .current_dir(root())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut api, mut control) = (None, None);
    while api.is_none() || control.is_none() {
        let line =
            tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
        if let Some(rest) = line.trim().strip_prefix("HTTP API   http://") {
            api = rest.split('/').next().map(|a| a.parse::<std::net::SocketAddr>().unwrap());
        }
        if let Some(rest) = line.strip_prefix("Break the plant (the simulator's control API, http://") {
            control = Some(rest.trim_end_matches("):").parse::<std::net::SocketAddr>().unwrap());
        }
    }
    let (api, control) = (api.unwrap(), control.unwrap());
    let mut sim = HttpClient::connect(control).await.unwrap();
    let index = sim.get("/").await.unwrap().json();
    assert!(index["routes"]["PATCH /devices/{id}/faults"].is_string(), "{index}");
    let devices = sim.get("/devices").await.unwrap().json();
    let ids: Vec<&str> =
        devices["devices"].as_array().unwrap().iter().filter_map(|d| d["id"].as_str()).collect();
    assert!(
        ids.contains(&"b-oven2-opcua") && ids.contains(&"a-util-meter"),
        "every device can be broken: {ids:?}"
    );
    let r = sim
        .send(
            "PATCH",
            "/devices/a-util-meter/faults",
            &[("content-type", "application/json")],
            br#"{"down":true}"#,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let mut c = HttpClient::connect(api).await.unwrap();
    let read = br#"{"sensor_id":"A_UTIL_001"}"#;
    let e = c.post("/v1/tools/get_sensor_reading", read).await.unwrap().json();
    // The device is down: unavailable, or its breaker already open (the demo's poller meets
    // the fault too, and may have opened it during this call).
    let code = e["error"]["code"].as_str().unwrap_or_default();
    assert!(["DEVICE_UNAVAILABLE", "CIRCUIT_OPEN"].contains(&code), "{e}");
    assert_eq!(sim.send("DELETE", "/devices/a-util-meter/faults", &[], b"").await.unwrap().status, 200);
    // Back within the breaker's schedule (it may have opened): bounded.
    wait_until("the device to answer again", Duration::from_secs(30), || async {
        let mut c = HttpClient::connect(api).await.unwrap();
        let e =
            c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_UTIL_002"}"#).await.unwrap().json();
        e["ok"] == true
    })
    .await;
    let _ = child.kill().await;
}

/// The demo honours `[server.oauth]` as `serve` does (it ignored it, answering 404 to the
/// resource metadata and refusing every access token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_honours_the_identity_provider_of_its_configuration() {
    let data = tempfile::tempdir().unwrap();
    let closed = ClosedPort::new();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["demo", "--listen", "127.0.0.1:0", "--data-dir", data.path().to_str().unwrap()])
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_SERVER_PUBLIC_URL", "http://127.0.0.1:8080")
        .env("FIELDGATE_SERVER_OAUTH_ISSUER", format!("http://127.0.0.1:{}", closed.port))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut api = None;
    while api.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the demo's banner")
            .unwrap()
            .expect("the demo's banner");
        if let Some(rest) = line.trim().strip_prefix("HTTP API   http://") {
            api = rest.split('/').next().map(|a| a.parse::<std::net::SocketAddr>().unwrap());
        }
    }
    let mut c = HttpClient::connect(api.unwrap()).await.unwrap();
    let r = c.get("/.well-known/oauth-protected-resource/mcp").await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["resource"], "http://127.0.0.1:8080/mcp");
    let _ = child.kill().await;
}

/// Regression (issue 32): with tokens configured the demo printed an MCP configuration and
/// `curl` examples without the `Authorization` header, and no stdio configuration that
/// reached its plant. The printed stdio entry, used as a client would with its own token,
/// reaches the demo's 44 sensors; no configured secret is ever printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_prints_client_configurations_that_reach_its_plant_with_a_token() {
    use tokio::io::AsyncWriteExt;
    let data = tempfile::tempdir().unwrap();
    let secret = "demo-operator-secret-0123456789";
    let mut demo = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["demo", "--listen", "127.0.0.1:0", "--data-dir", data.path().to_str().unwrap()])
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_TOKEN_OPS", format!("operator:{secret}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(demo.stdout.take().unwrap()).lines();
    let banner = tokio::time::timeout(Duration::from_secs(60), async {
        let mut text = String::new();
        while let Some(line) = out.next_line().await.unwrap() {
            text.push_str(&line);
            text.push('\n');
            if line == "}" {
                break;
            }
        }
        text
    })
    .await
    .expect("the demo's banner within 60 s");
    assert!(!banner.contains(secret), "{banner}");
    assert!(banner.contains("curl -s -H 'Authorization: Bearer YOUR_TOKEN'"), "{banner}");
    let json_start = banner.find("\n{\n").expect("the configuration") + 1;
    let config: Value = serde_json::from_str(&banner[json_start..]).unwrap();
    let http = &config["mcpServers"]["fieldgate"];
    assert_eq!(http["headers"]["Authorization"], "Bearer YOUR_TOKEN", "{config}");
    let stdio = &config["mcpServers"]["fieldgate-stdio"];
    assert_eq!(stdio["env"]["FIELDGATE_CLI_TOKEN"], "YOUR_TOKEN", "{config}");
    // As a desktop client starts it: its command and args, somewhere without device files.
    let elsewhere = tempfile::tempdir().unwrap();
    let args: Vec<String> =
        stdio["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect();
    let mut relay = start_relay(stdio, &args, elsewhere.path(), secret);
    let mut stdin = relay.stdin.take().unwrap();
    let mut answers = BufReader::new(relay.stdout.take().unwrap()).lines();
    for msg in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sensors","arguments":{"limit":1000}}}"#,
    ] {
        stdin.write_all(format!("{msg}\n").as_bytes()).await.unwrap();
    }
    stdin.flush().await.unwrap();
    let listed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let line = answers.next_line().await.unwrap().expect("the relay answers");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == 2 {
                return v;
            }
        }
    })
    .await
    .expect("list_sensors answered through the relay within 30 s");
    let envelope = &listed["result"]["structuredContent"];
    assert_eq!(envelope["ok"], true, "{listed}");
    assert_eq!(envelope["data"]["sensors"].as_array().map(Vec::len), Some(44), "{listed}");
    drop(stdin);
    // The relay ends its session when its client goes (review of issue 32: it was left to
    // count against the token until it expired).
    tokio::time::timeout(Duration::from_secs(30), relay.wait())
        .await
        .expect("the relay exits when stdin closes")
        .unwrap();
    let addr: std::net::SocketAddr = args[2].trim_start_matches("http://").parse().unwrap();
    let mut c = HttpClient::connect(addr).await.unwrap().with_token(secret);
    let m = String::from_utf8(c.get("/metrics").await.unwrap().body).unwrap();
    assert!(m.contains("fieldgate_mcp_sessions 0\n"), "{m}");
    // The configuration pasted unchanged (its placeholder for a token): stdout carries only
    // JSON-RPC, a refused notification nothing, a refused request a JSON-RPC error.
    let mut wrong = start_relay(stdio, &args, elsewhere.path(), "YOUR_TOKEN");
    let mut stdin = wrong.stdin.take().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/list\"}\n")
        .await
        .unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(30), wrong.wait_with_output())
        .await
        .expect("the relay ends")
        .unwrap();
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!((lines[0]["jsonrpc"].as_str(), lines[0]["id"].as_i64()), (Some("2.0"), Some(9)), "{lines:?}");
    let _ = demo.kill().await;
}

/// The printed stdio configuration started as a desktop client would: its command and args,
/// in `dir`, with `token` in its environment.
fn start_relay(stdio: &Value, args: &[String], dir: &std::path::Path, token: &str) -> tokio::process::Child {
    Command::new(stdio["command"].as_str().unwrap())
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("FIELDGATE_CLI_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}
