//! What an agent meets: the published tool definitions and a few answers, through the
//! real binary over MCP on stdio, and hints that use what fieldgate already knows.

use std::process::Stdio;
use std::time::Duration;

use fieldgate::tools::ErrorCode;
use fieldgate_sim::{Bind, Faults, Scenario, Simulator};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::support::*;

/// Every `"null"` type and every `format` that is not standard, under `v`.
fn unusual(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let here = format!("{at}/{k}");
                match (k.as_str(), child) {
                    ("format", Value::String(f)) if !STANDARD_FORMATS.contains(&f.as_str()) => {
                        out.push(format!("{here}: {f}"))
                    }
                    ("type", Value::String(t)) if t == "null" => out.push(here),
                    ("type", Value::Array(ts)) if ts.iter().any(|t| t == "null") => out.push(here),
                    ("enum", Value::Array(vs)) if vs.iter().any(Value::is_null) => out.push(here),
                    ("examples" | "default" | "const", _) => {}
                    _ => unusual(child, &here, out),
                }
            }
        }
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, c)| unusual(c, &format!("{at}/{i}"), out))
        }
        _ => {}
    }
}

/// `fieldgate mcp` with its stdin and stdout.
struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Mcp {
    async fn send(&mut self, msg: Value) {
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        self.stdin.as_mut().unwrap().write_all(&line).await.unwrap();
    }

    /// Sends a request and reads up to its answer (fieldgate sends nothing unasked).
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method} within 20 s"))
                .unwrap()
                .expect("stdout stays open");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON-RPC: {line}"));
            if v["id"] == id {
                return v;
            }
        }
    }

    /// A tool's envelope (`structuredContent`), checked against the text block and `isError`.
    async fn call(&mut self, id: u64, tool: &str, args: Value) -> Value {
        let r = self.request(id, "tools/call", json!({"name": tool, "arguments": args})).await;
        let result = &r["result"];
        let envelope = result["structuredContent"].clone();
        assert!(envelope["ok"].is_boolean(), "{r}");
        assert_eq!(result["isError"], !envelope["ok"].as_bool().unwrap(), "{r}");
        let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text, envelope);
        envelope
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_over_mcp_publishes_plain_schemas_and_answers_as_documented() {
    // The demo's line 1 PLC, on a simulator at a free port.
    let devices = tempfile::tempdir().unwrap();
    let file = devices.path().join("a-line1-plc.toml");
    std::fs::copy(demo_dir().join("a-line1-plc.toml"), &file).unwrap();
    let mut scenario = Scenario::load(&root().join("simulator/scenarios/demo.toml")).unwrap();
    scenario.faults.clear();
    let sim =
        Simulator::start(fieldgate_sim::plant::load_dir(devices.path()).unwrap(), scenario, Bind::Ephemeral)
            .await
            .unwrap();
    let addr = sim.addrs()["a-line1-plc"];
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"127.0.0.1:5020\""));
    std::fs::write(&file, text.replace("127.0.0.1:5020", &addr.to_string())).unwrap();

    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["mcp", "--devices", devices.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut mcp = Mcp { child, stdin, lines };

    let init = mcp
        .request(
            1,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent-contract", "version": "1"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;

    // The input schemas say each parameter's one type: no "null", no non-standard format.
    let list = mcp.request(2, "tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap_or_else(|| panic!("{list}"));
    assert_eq!(tools.len(), 11);
    let mut found = Vec::new();
    for t in tools {
        unusual(&t["inputSchema"], t["name"].as_str().unwrap(), &mut found);
    }
    assert!(found.is_empty(), "{found:#?}");
    let list_sensors = tools.iter().find(|t| t["name"] == "list_sensors").unwrap();
    assert_eq!(list_sensors["inputSchema"]["properties"]["limit"]["type"], "integer");
    assert_eq!(list_sensors["inputSchema"]["properties"]["limit"]["default"], 100);
    // What a client sends after reading it, and null for the default: both taken.
    let e = mcp.call(3, "list_sensors", json!({"limit": 2})).await;
    assert_eq!((&e["ok"], e["data"]["sensors"].as_array().map(Vec::len)), (&json!(true), Some(2)), "{e}");
    let e = mcp.call(4, "list_sensors", json!({"limit": null})).await;
    assert_eq!(e["ok"], true, "{e}");

    // A relative `from`: answered with the absolute range.
    let e = mcp.call(5, "get_sensor_history", json!({"sensor_id": "A_LINE1_001", "from": "-1h"})).await;
    assert_eq!(e["ok"], true, "{e}");
    let instant = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or("")).ok();
    let (from, to) = (instant(&e["data"]["from"]), instant(&e["data"]["to"]));
    let (Some(from), Some(to)) = (from, to) else { panic!("absolute from and to: {e}") };
    assert_eq!((to - from).num_seconds(), 3600, "{e}");

    // One known and one unknown sensor: the known one is read, the other fails alone.
    let e = mcp.call(6, "get_sensor_readings", json!({"sensor_ids": ["A_LINE1_001", "A_LINE1_099"]})).await;
    assert_eq!(e["ok"], true, "{e}");
    let data = &e["data"];
    assert_eq!(data["readings"].as_array().map(Vec::len), Some(1), "{e}");
    assert_eq!(data["readings"][0]["sensor_id"], "A_LINE1_001");
    assert_eq!(data["readings"][0]["source"], "live");
    assert_eq!(data["failed"].as_array().map(Vec::len), Some(1), "{e}");
    assert_eq!(data["failed"][0]["sensor_id"], "A_LINE1_099");
    assert_eq!(data["failed"][0]["error"]["code"], "SENSOR_NOT_FOUND");
    assert_eq!(data["complete"], false);

    // An idempotency key never used: no such work order (so creating it is safe).
    let e = mcp.call(7, "get_work_order", json!({"idempotency_key": "never-used-0001"})).await;
    assert_eq!(e["ok"], false, "{e}");
    assert_eq!(e["error"]["code"], "WORK_ORDER_NOT_FOUND", "{e}");

    // Closing stdin ends the server.
    drop(mcp.stdin.take());
    let status = tokio::time::timeout(Duration::from_secs(20), mcp.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
}

/// The number after `max_age_ms of at least ` and the one after `e.g. ` in a hint.
fn offered(hint: &str) -> (u64, u64) {
    let number_after = |marker: &str| -> u64 {
        let rest =
            &hint[hint.find(marker).unwrap_or_else(|| panic!("{marker:?} in {hint}")) + marker.len()..];
        rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
    };
    (number_after("max_age_ms of at least "), number_after("(e.g. "))
}

#[tokio::test]
async fn a_device_failure_offers_the_cached_value_and_the_max_age_ms_that_returns_it() {
    let plant = demo_plant().await;
    let one = plant.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_001"})).await;
    assert!(one.ok, "{one:?}");
    let batch = plant.call("get_sensor_readings", json!({"sensor_ids": ["A_UTIL_003", "A_UTIL_004"]})).await;
    assert!(batch.ok, "{batch:?}");
    plant.faults("a-util-meter", Faults { down: true, ..Default::default() });

    // One sensor: the hint says how old its last value is and how to get it.
    let err = plant.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_001"})).await.error.unwrap();
    assert!(err.retryable, "{err:?}");
    let (at_least, example) = offered(&err.hint);
    // A second or so: the value read just before, aged by the failed call.
    assert!((1000..=10_000).contains(&at_least) && example == 60_000, "{}", err.hint);
    let age = format!("The last value read, {} s old, is available", at_least / 1000);
    assert!(err.hint.contains(&age), "{}", err.hint);
    let cached =
        plant.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_001", "max_age_ms": example})).await;
    assert!(cached.ok, "{cached:?}");
    assert_eq!(cached.json()["source"], "cache");
    // A sensor never read has nothing to offer.
    let err = plant.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_002"})).await.error.unwrap();
    assert!(err.retryable && !err.hint.contains("last value"), "{}", err.hint);

    // In a batch that read others: each failed sensor with a value says so.
    let e = plant
        .call("get_sensor_readings", json!({"sensor_ids": ["A_UTIL_001", "A_LINE1_001", "A_UTIL_002"]}))
        .await;
    assert!(e.ok, "{e:?}");
    let failed = &e.json()["failed"];
    assert_eq!(failed[0]["sensor_id"], "A_UTIL_001");
    assert!(failed[0]["error"]["hint"].as_str().unwrap().contains("The last value read, "), "{failed}");
    assert_eq!(failed[1]["sensor_id"], "A_UTIL_002");
    assert!(!failed[1]["error"]["hint"].as_str().unwrap().contains("last value"), "{failed}");

    // A batch that read nothing says it once, for the sensors that have a value.
    let err = plant
        .call("get_sensor_readings", json!({"sensor_ids": ["A_UTIL_001", "A_UTIL_002", "A_UTIL_003"]}))
        .await
        .error
        .unwrap();
    assert!(err.retryable, "{err:?}");
    assert_eq!(err.hint.matches("last value").count(), 1, "{}", err.hint);
    assert!(
        err.hint.contains("The last values read of 2 of these sensors are available, the oldest "),
        "{}",
        err.hint
    );
    let (_, example) = offered(&err.hint);
    let e = plant
        .call(
            "get_sensor_readings",
            json!({"sensor_ids": ["A_UTIL_001", "A_UTIL_003"], "max_age_ms": example}),
        )
        .await;
    assert!(e.ok && e.json()["complete"] == true, "{e:?}");

    // A failure that is no device's (an unknown sensor) offers nothing.
    let err = plant.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_099"})).await.error.unwrap();
    assert_eq!(err.code, ErrorCode::SensorNotFound);
    assert!(!err.hint.contains("max_age_ms"), "{}", err.hint);
}

/// What a caller sent and the service echoes back (an unknown parameter's or tool's name)
/// carries no hidden character raw: escape sequences, overrides and invisible ones are
/// written `\u{..}` in the parameter, message and hint.
#[tokio::test]
async fn echoed_names_carry_no_hidden_characters() {
    const RAW: [char; 4] = ['\u{1b}', '\u{7}', '\u{202e}', '\u{e0041}'];
    let hostile = "\u{1b}[2J\u{202e}key\u{7}\u{e0041}";
    let env = call("list_sensors", serde_json::json!({hostile: 1})).await;
    let e = env.error.expect("refused");
    let echoed = format!("{:?} {} {}", e.parameter, e.message, e.hint);
    assert!(!echoed.chars().any(|c| RAW.contains(&c)) && echoed.contains("\\u{202e}"), "{echoed}");
    let Err(unknown) = service().call("list_sensors\u{202e}\u{1b}", serde_json::json!({})).await else {
        panic!("not a tool");
    };
    let text = unknown.to_string();
    assert!(!text.chars().any(|c| RAW.contains(&c)), "{text}");
}
