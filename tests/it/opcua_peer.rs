//! node-opcua as the OPC UA server (a server fieldgate did not write, installed by
//! `scripts/test-deps` into `target/opcua-js`), serving the variables each test names, and
//! the real binary reading it.

use std::path::PathBuf;
use std::time::Duration;

use fieldgate::transport::client::HttpClient;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::support::{self, device_dir};

const T: Duration = Duration::from_secs(60);

/// A node-opcua server; it stops when this is dropped (its stdin closes, and it is killed).
pub struct OpcuaPeer {
    pub url: String,
    /// The namespace index of its variables (`ns=<ns>;s=<name>`).
    pub ns: u16,
    child: tokio::process::Child,
    /// What it printed after `listening` (e.g. `acknowledged NAME.Alarm: COMMENT`).
    said: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

fn modules() -> PathBuf {
    support::root().join("target/opcua-js/node_modules")
}

impl OpcuaPeer {
    /// Serves `nodes`: `[{"name", "type", "value", "array"?}]`.
    pub async fn start(nodes: &Value) -> OpcuaPeer {
        OpcuaPeer::start_with(nodes, &[]).await
    }

    /// As [`OpcuaPeer::start`], with `env` (`PEER_SECURE`, `PEER_PORT`: see server.js).
    pub async fn start_with(nodes: &Value, env: &[(&str, &str)]) -> OpcuaPeer {
        assert!(
            modules().join("node-opcua").is_dir(),
            "node-opcua is not installed: run scripts/test-deps (npm install --prefix target/opcua-js node-opcua@2)"
        );
        let dir = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new("node")
            .arg(support::root().join("tests/it/opcua_peer/server.js"))
            .arg(dir.path())
            .arg(nodes.to_string())
            .env("NODE_PATH", modules())
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        // Its log, drained (a full pipe would stall it): the line saying why, if it fails.
        let mut errors = BufReader::new(child.stderr.take().unwrap()).lines();
        let failed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let why = failed.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = errors.next_line().await {
                if l.contains("failed") {
                    *why.lock().unwrap() = l;
                }
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(T, async {
            while let Ok(Some(l)) = lines.next_line().await {
                if l.starts_with("listening ") {
                    return Some(l);
                }
            }
            None
        })
        .await
        .expect("node-opcua listened within 60 s");
        let Some(line) = line else {
            let _ = crate::support::exited(&mut child, "child").await;
            panic!("node-opcua did not start: {}", failed.lock().unwrap());
        };
        // It goes on writing to stdout (node-opcua's own dumps): a closed pipe would kill it.
        let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let heard = said.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                heard.lock().unwrap().push(l);
            }
        });
        let mut words = line.split(' ').skip(1);
        let url = words.next().unwrap().to_string();
        let ns = words.next().and_then(|w| w.strip_prefix("ns=")).and_then(|n| n.parse().ok()).unwrap();
        OpcuaPeer { url, ns, child, said, _dir: dir }
    }

    /// Waits (at most 30 s) until the server has printed a line starting with `start`.
    pub async fn said(&self, start: &str) -> String {
        support::wait_for(&format!("node-opcua to print {start:?}"), Duration::from_secs(30), || async {
            self.said.lock().unwrap().iter().find(|l| l.starts_with(start)).cloned()
        })
        .await
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().and_then(|p| p.split('/').next()).and_then(|p| p.parse().ok()).unwrap()
    }

    /// Gives variable `name` a new value from now on: `{"type", "value", "array"?}`.
    pub async fn set(&mut self, name: &str, value: Value) {
        use tokio::io::AsyncWriteExt;
        let mut change = value;
        change["set"] = json!(name);
        let stdin = self.child.stdin.as_mut().expect("stdin piped");
        stdin.write_all(format!("{change}\n").as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Freezes the server (SIGSTOP: its sockets stay open, it sends nothing) or thaws it.
    pub fn freeze(&self, frozen: bool) {
        let pid = self.child.id().expect("node-opcua runs").to_string();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill").args([signal, &pid]).status().expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// A device file reading `sensors` (sensor ID, variable name) from this server, by polling.
    pub fn device_file(&self, sensors: &[(&str, &str)]) -> String {
        let mut text = format!(
            "id = \"t-peer\"\nplant = \"T\"\nzone = \"PEER\"\ndescription = \"node-opcua\"\nprotocol = \"opcua\"\n\
             endpoint = \"{}\"\ntimeout_ms = 2000\npoll_interval_ms = 200\n\n[opcua]\nsecurity_policy = \"None\"\n\
             security_mode = \"None\"\n",
            self.url
        );
        for (id, name) in sensors {
            text += &format!(
                "\n[[sensors]]\nid = \"{id}\"\ndescription = \"Peer variable\"\nkind = \"count\"\nunit = \"count\"\n\
                 node_id = \"ns={};s={name}\"\n",
                self.ns
            );
        }
        text
    }
}

/// The real binary reading every variable of a node-opcua server, as sensors `T_PEER_001`,
/// `T_PEER_002`, ... in the order of `nodes`.
struct Rig {
    served: support::Served,
    client: HttpClient,
    ids: Vec<String>,
    _stderr: tokio::task::JoinHandle<String>,
    peer: OpcuaPeer,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Rig {
    async fn start(nodes: Value) -> Rig {
        Rig::start_with(nodes, |file| file, &[]).await
    }

    /// As [`Rig::start`], with the device file edited and the process given `env`.
    async fn start_with(nodes: Value, edit: impl Fn(String) -> String, env: &[(&str, &str)]) -> Rig {
        let peer = OpcuaPeer::start(&nodes).await;
        let ids: Vec<String> =
            (1..=nodes.as_array().unwrap().len()).map(|i| format!("T_PEER_{i:03}")).collect();
        let names: Vec<&str> =
            nodes.as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
        let sensors: Vec<(&str, &str)> = ids.iter().map(String::as_str).zip(names).collect();
        let devices = device_dir(&[("t-peer.toml", &edit(peer.device_file(&sensors)))]);
        let data = tempfile::tempdir().unwrap();
        let mut served = support::serve_binary(devices.path(), data.path(), env).await;
        let _stderr = served.drain_stderr();
        let client = HttpClient::connect(served.addr).await.unwrap();
        Rig { served, client, ids, _stderr, peer, _dirs: (devices, data) }
    }

    /// A tool's answer, as written.
    async fn call(&mut self, tool: &str, args: Value) -> String {
        let res = self.client.post(&format!("/v1/tools/{tool}"), args.to_string().as_bytes()).await.unwrap();
        String::from_utf8(res.body).unwrap()
    }

    /// Every sensor's reading, in one call.
    async fn readings(&mut self) -> String {
        let args = json!({"sensor_ids": self.ids.clone()});
        self.call("get_sensor_readings", args).await
    }

    /// The device's state in `get_device_status`.
    async fn state(&mut self) -> String {
        let v: Value =
            serde_json::from_str(&self.call("get_device_status", json!({"device_id": "t-peer"})).await)
                .unwrap();
        v["data"]["devices"][0]["state"].as_str().unwrap_or_default().to_string()
    }

    async fn stop(mut self) {
        self.served.child.start_kill().unwrap();
        let _ = crate::support::exited(&mut self.served.child, "self").await;
    }
}

/// The `"value":…` of each reading in a body, as written.
fn written(body: &str) -> Vec<String> {
    body.match_indices("\"value\":")
        .map(|(i, m)| body[i + m.len()..].chars().take_while(|c| !matches!(c, ',' | '}')).collect())
        .collect()
}

/// 64-bit integers from an OPC UA server arrive with every digit (before: Int64 max read as
/// 9.22337203685e+18, UInt64 max as 1.84467440737e+19, Int32 -7 as -7.0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_from_node_opcua_stay_exact() {
    let mut rig = Rig::start(json!([
        {"name": "I64Max", "type": "Int64", "value": [0x7FFF_FFFFu32, 0xFFFF_FFFFu32]},
        {"name": "U64Max", "type": "UInt64", "value": [0xFFFF_FFFFu32, 0xFFFF_FFFFu32]},
        {"name": "Big", "type": "Int64", "value": [0x0020_0000u32, 1]},
        {"name": "Minus7", "type": "Int32", "value": -7},
        {"name": "Half", "type": "Double", "value": 0.5},
    ]))
    .await;
    let body = rig.readings().await;
    assert_eq!(
        written(&body),
        ["9223372036854775807", "18446744073709551615", "9007199254740993", "-7", "0.5"],
        "{body}"
    );
    rig.stop().await;
}

/// Every built-in scalar type node-opcua serves, as an agent gets it: booleans as booleans,
/// integers as JSON integers with every digit at both ends of their range, a Float as the
/// number it holds (0.1, not 0.10000000149011612: it was widened with its binary noise),
/// text as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scalar_type_from_node_opcua_keeps_its_type() {
    let mut rig = Rig::start(json!([
        {"name": "B", "type": "Boolean", "value": true},
        {"name": "SB", "type": "SByte", "value": -128},
        {"name": "U8", "type": "Byte", "value": 255},
        {"name": "I16", "type": "Int16", "value": -32768},
        {"name": "U16", "type": "UInt16", "value": 65535},
        {"name": "I32", "type": "Int32", "value": -2147483648i64},
        {"name": "U32", "type": "UInt32", "value": 4294967295u32},
        {"name": "I64Min", "type": "Int64", "value": [0x8000_0000u32, 0]},
        {"name": "U64Max", "type": "UInt64", "value": [0xFFFF_FFFFu32, 0xFFFF_FFFFu32]},
        {"name": "F", "type": "Float", "value": 0.1},
        {"name": "FBig", "type": "Float", "value": -3.4e38},
        {"name": "D", "type": "Double", "value": 0.1},
        {"name": "S", "type": "String", "value": "ok"},
        {"name": "LT", "type": "LocalizedText", "value": {"text": "Ofen", "locale": "de"}},
    ]))
    .await;
    let body = rig.readings().await;
    assert_eq!(
        written(&body),
        [
            "true",
            "-128",
            "255",
            "-32768",
            "65535",
            "-2147483648",
            "4294967295",
            "-9223372036854775808",
            "18446744073709551615",
            "0.1",
            "-3.4e+38",
            "0.1",
            "\"ok\"",
            "\"Ofen\""
        ],
        "{body}"
    );
    rig.stop().await;
}

/// Nodes that cannot become a sensor value (an array, bytes, a date, nothing) beside a good
/// one: each is DEVICE_REJECTED, not retryable, saying what it holds; reading them again and
/// again does not open the device's breaker, and the good sensor reads on (before: a
/// retryable DEVICE_PROTOCOL_ERROR, and the breaker opened within seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_odd_node_is_the_sensors_fault_not_the_devices() {
    let mut rig = Rig::start(json!([
        {"name": "List", "type": "Double", "value": [1.0, 2.0], "array": true},
        {"name": "Bytes", "type": "ByteString", "value": "abc"},
        {"name": "When", "type": "DateTime", "value": "2026-01-01T00:00:00Z"},
        {"name": "Nothing", "type": "Null", "value": null},
        {"name": "Good", "type": "Double", "value": 21.5},
    ]))
    .await;
    let odd = [
        ("T_PEER_001", "an array"),
        ("T_PEER_002", "a ByteString"),
        ("T_PEER_003", "a DateTime"),
        ("T_PEER_004", "no value"),
    ];
    for (id, holds) in odd {
        for _ in 0..4 {
            let v: Value =
                serde_json::from_str(&rig.call("get_sensor_reading", json!({"sensor_id": id})).await)
                    .unwrap();
            assert_eq!(v["error"]["code"], "DEVICE_REJECTED", "{id}: {v}");
            assert_eq!(v["error"]["retryable"], false, "{id}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains(holds), "{id}: {v}");
        }
    }
    let v: Value =
        serde_json::from_str(&rig.call("get_sensor_reading", json!({"sensor_id": "T_PEER_005"})).await)
            .unwrap();
    assert_eq!(v["data"]["value"], 21.5, "the good sensor reads on: {v}");
    let v: Value =
        serde_json::from_str(&rig.call("get_device_status", json!({"device_id": "t-peer"})).await).unwrap();
    assert_eq!(v["data"]["devices"][0]["state"], "up", "{v}");
    assert_eq!(v["data"]["devices"][0]["breaker"]["state"], "closed", "{v}");
    rig.stop().await;
}

/// Text from the server as agents get it: control, bidirectional and invisible characters
/// replaced by U+FFFD (they reached the agent raw; Modbus strings already replaced them);
/// a null String is no value, quality bad (it was "" and good); a text of 100,000 characters
/// is read like any other (it closed the connection and opened the breaker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_from_the_server_is_shown_safely_whatever_its_size() {
    let mut rig = Rig::start(json!([
        {"name": "Hostile", "type": "String", "value": "\u{1b}[31mRED\u{202e}X\u{7}\u{200b}ok"},
        {"name": "Empty", "type": "String", "value": null},
        {"name": "Long", "type": "String", "value": "x".repeat(100_000)},
        {"name": "Good", "type": "Double", "value": 21.5},
    ]))
    .await;
    let v: Value = serde_json::from_str(&rig.readings().await).unwrap();
    let r = &v["data"]["readings"];
    assert_eq!(r[0]["value"], "\u{fffd}[31mRED\u{fffd}X\u{fffd}\u{fffd}ok", "{v}");
    assert_eq!((&r[1]["value"], &r[1]["quality"]), (&Value::Null, &json!("bad")), "{v}");
    assert_eq!(r[2]["value"].as_str().map(str::len), Some(100_000), "{}", r[2]);
    assert_eq!(r[3]["value"], 21.5, "{v}");
    rig.stop().await;
}

/// A text longer than the 1 MiB a sensor may hold is that sensor's fault: DEVICE_REJECTED
/// saying so, the device's other sensor reads on and the device stays up (it closed the
/// connection and took the whole device down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_over_a_mebibyte_fails_only_its_sensor() {
    let mut rig = Rig::start(json!([
        {"name": "Huge", "type": "String", "value": "x"},
        {"name": "Good", "type": "Double", "value": 21.5},
    ]))
    .await;
    // (Too long for the server's command line: given on its stdin.)
    rig.peer.set("Huge", json!({"type": "String", "value": "x".repeat((1 << 20) + 1)})).await;
    let addr = rig.served.addr;
    support::wait_until("the long text served", T, || async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let args = json!({"sensor_id": "T_PEER_001"});
        let v = c.post("/v1/tools/get_sensor_reading", args.to_string().as_bytes()).await.unwrap().json();
        v["error"]["code"] == "DEVICE_REJECTED"
    })
    .await;
    for _ in 0..4 {
        let v: Value =
            serde_json::from_str(&rig.call("get_sensor_reading", json!({"sensor_id": "T_PEER_001"})).await)
                .unwrap();
        assert_eq!(v["error"]["code"], "DEVICE_REJECTED", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("longer than 1 MiB"), "{v}");
    }
    let v: Value =
        serde_json::from_str(&rig.call("get_sensor_reading", json!({"sensor_id": "T_PEER_002"})).await)
            .unwrap();
    assert_eq!(v["data"]["value"], 21.5, "{v}");
    assert_eq!(rig.state().await, "up");
    rig.stop().await;
}

/// A node stamped a year ahead by its device's clock: the reading is filed by the time it was
/// received, marked uncertain, counted per device; history has it in the last hour (it stayed
/// empty: the point was filed a year ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_clock_a_year_ahead_is_not_believed() {
    let mut rig = Rig::start(json!([
        {"name": "Ahead", "type": "Double", "value": 7.5, "source": "year-ahead"},
        {"name": "Good", "type": "Double", "value": 21.5},
    ]))
    .await;
    let v: Value = serde_json::from_str(&rig.readings().await).unwrap();
    let r = &v["data"]["readings"];
    assert_eq!((&r[0]["value"], &r[0]["quality"]), (&json!(7.5), &json!("uncertain")), "{v}");
    let t = chrono::DateTime::parse_from_rfc3339(r[0]["timestamp"].as_str().unwrap()).unwrap();
    let off = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds().abs();
    assert!(off < 60, "filed by the receive time, not a year ahead: {v}");
    assert_eq!(r[1]["quality"], "good", "{v}");
    let m = String::from_utf8(rig.client.get("/metrics").await.unwrap().body).unwrap();
    let line =
        m.lines().find(|l| l.starts_with("fieldgate_device_clock_corrections_total{device=\"t-peer\"}"));
    assert!(line.is_some_and(|l| !l.ends_with(" 0")), "{m}");
    let addr = rig.served.addr;
    support::wait_until("the point in the last hour of history", T, || async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let args = json!({"sensor_id": "T_PEER_001", "from": "-1h"});
        let h = c.post("/v1/tools/get_sensor_history", args.to_string().as_bytes()).await.unwrap().json();
        h["data"]["points"].as_array().is_some_and(|p| !p.is_empty())
    })
    .await;
    rig.stop().await;
}

/// An Uncertain status without a value is an uncertain reading without a value (it was a
/// protocol error, then a bad reading); with a value, that value, uncertain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_node_without_a_value_is_uncertain() {
    let mut rig = Rig::start(json!([
        {"name": "NoValue", "type": "Null", "value": null, "status": "UncertainLastUsableValue"},
        {"name": "Stale", "type": "Double", "value": 3.5, "status": "UncertainLastUsableValue"},
    ]))
    .await;
    let v: Value = serde_json::from_str(&rig.readings().await).unwrap();
    let r = &v["data"]["readings"];
    assert_eq!((&r[0]["value"], &r[0]["quality"]), (&Value::Null, &json!("uncertain")), "{v}");
    assert_eq!((&r[1]["value"], &r[1]["quality"]), (&json!(3.5), &json!("uncertain")), "{v}");
    // History keeps it as it was read: uncertain, no value (it was stored as bad).
    let addr = rig.served.addr;
    let point = support::wait_for("a stored point of the uncertain node", T, || async move {
        let mut c = HttpClient::connect(addr).await.ok()?;
        let args = json!({"sensor_id": "T_PEER_001", "from": "-1h"});
        let h = c.post("/v1/tools/get_sensor_history", args.to_string().as_bytes()).await.ok()?.json();
        h["data"]["points"].as_array().and_then(|p| p.first().cloned())
    })
    .await;
    assert_eq!((&point["value"], &point["quality"]), (&Value::Null, &json!("uncertain")), "{point}");
    rig.stop().await;
}

/// A subscribed node that stops being a value (it turns into an array) is no longer given as
/// its last good value from the cache, nor stored again as that value: its reading turns bad,
/// the device stays up and its other sensor reads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_node_that_turns_odd_is_not_its_last_value_any_more() {
    let subscribe = |f: String| {
        f.replace("security_mode = \"None\"\n", "security_mode = \"None\"\nmode = \"subscribe\"\n")
    };
    let nodes = json!([{"name": "Odd", "type": "Double", "value": 1.5}, {"name": "Good", "type": "Double", "value": 2.5}]);
    let mut rig = Rig::start_with(nodes, subscribe, &[]).await;
    let addr = rig.served.addr;
    let cached = move |id: &'static str| async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let args = json!({"sensor_id": id, "max_age_ms": 60000});
        c.post("/v1/tools/get_sensor_reading", args.to_string().as_bytes()).await.unwrap().json()
    };
    support::wait_until("the odd node's value in the cache", T, || async {
        cached("T_PEER_001").await["data"]["value"] == 1.5
    })
    .await;
    rig.peer.set("Odd", json!({"type": "Double", "value": [1.0, 2.0], "array": true})).await;
    support::wait_until("the odd node's reading bad, without its last value", T, || async {
        let v = cached("T_PEER_001").await;
        v["data"]["quality"] == "bad" && v["data"]["value"].is_null()
    })
    .await;
    assert_eq!(cached("T_PEER_002").await["data"]["value"], 2.5);
    assert_eq!(rig.state().await, "up");
    rig.stop().await;
}

/// A subscription whose server goes silent (frozen: its socket open, nothing sent, as when
/// it aborts its channels) is lost after one keep-alive period: the device is no longer up,
/// and history has a gap where nothing was heard (before: lost after three periods, and the
/// last value was stored again all the while, so history showed no gap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_subscription_is_lost_after_one_keep_alive_and_leaves_a_gap() {
    let subscribe = |f: String| {
        f.replace("security_mode = \"None\"\n", "security_mode = \"None\"\nmode = \"subscribe\"\n")
    };
    let nodes = json!([{"name": "Level", "type": "Double", "value": 4.5}]);
    let mut rig = Rig::start_with(nodes, subscribe, &[("FIELDGATE_HISTORY_MAX_SILENCE_S", "1")]).await;
    let addr = rig.served.addr;
    let history = move || async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let args = json!({"sensor_id": "T_PEER_001", "from": "-1h"});
        c.post("/v1/tools/get_sensor_history", args.to_string().as_bytes()).await.unwrap().json()
    };
    support::wait_until("the value stored again while the subscription is live", T, || async {
        history().await["data"]["points"].as_array().is_some_and(|p| p.len() >= 3)
    })
    .await;
    assert_eq!(rig.state().await, "up");

    let frozen_at = chrono::Utc::now();
    rig.peer.freeze(true);
    // Keep-alive every 5 x 200 ms: lost 2 s after the last message (1 s for the wire; it took 6 s:
    // three periods of 10).
    let lost = Duration::from_secs(4);
    let client = std::sync::Arc::new(tokio::sync::Mutex::new(HttpClient::connect(addr).await.unwrap()));
    support::wait_until("the device no longer up within 4 s of its server going silent", lost, || {
        let client = client.clone();
        async move {
            let args = json!({"device_id": "t-peer"});
            let res =
                client.lock().await.post("/v1/tools/get_device_status", args.to_string().as_bytes()).await;
            res.is_ok_and(|r| r.json()["data"]["devices"][0]["state"] != "up")
        }
    })
    .await;
    // Silent longer than history's gap threshold (max_silence 1 s + 3 polls of at least 1 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    rig.peer.freeze(false);
    let thawed_at = chrono::Utc::now();
    support::wait_until("the subscription recreated and the value stored after the thaw", T, || async {
        let h = history().await;
        h["data"]["points"].as_array().is_some_and(|p| {
            p.last()
                .and_then(|p| p["t"].as_str())
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t > thawed_at)
        })
    })
    .await;
    let h = history().await;
    let gaps = h["data"]["gaps"].as_array().cloned().unwrap_or_default();
    let spans = |g: &Value| {
        let at = |k: &str| chrono::DateTime::parse_from_rfc3339(g[k].as_str().unwrap()).unwrap();
        // (A message on the wire as the server froze may be heard just after.)
        at("from") <= frozen_at + chrono::TimeDelta::milliseconds(500) && at("to") >= thawed_at
    };
    assert!(gaps.iter().any(spans), "a gap from before the freeze to after the thaw: {h}");
    assert_eq!(rig.state().await, "up", "up again");
    rig.stop().await;
}

/// A secured server whose certificate changes (a new one after a restart): every read is
/// DEVICE_REJECTED naming the new certificate, and `get_device_status` says the device is down
/// with that error (it said `up`, from the last success before the change, while nothing
/// could be read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_certificate_changed_is_down_not_up() {
    let nodes = json!([{"name": "Level", "type": "Double", "value": 4.5}]);
    let secure = [("PEER_SECURE", "1")];
    let first = OpcuaPeer::start_with(&nodes, &secure).await;
    let port = first.url.rsplit(':').next().and_then(|p| p.split('/').next()).unwrap().to_string();
    let file = first.device_file(&[("T_PEER_001", "Level")]).replace(
        "security_policy = \"None\"\nsecurity_mode = \"None\"",
        "security_policy = \"Basic256Sha256\"\nsecurity_mode = \"SignAndEncrypt\"",
    );
    let devices = device_dir(&[("t-peer.toml", &file)]);
    let data = tempfile::tempdir().unwrap();
    let mut served = support::serve_binary(devices.path(), data.path(), &[]).await;
    let _stderr = served.drain_stderr();
    let mut client = HttpClient::connect(served.addr).await.unwrap();
    let mut call = async |tool: &str, args: Value| -> Value {
        client.post(&format!("/v1/tools/{tool}"), args.to_string().as_bytes()).await.unwrap().json()
    };
    let read = json!({"sensor_id": "T_PEER_001"});
    let status = json!({"device_id": "t-peer"});
    // Trusted the way an operator does it: the refused certificate moved to trusted/.
    let v = call("get_sensor_reading", read.clone()).await;
    assert_eq!(v["error"]["code"], "DEVICE_REJECTED", "untrusted at first: {v}");
    let pki = data.path().join("pki");
    let trust = || {
        let rejected =
            std::fs::read_dir(pki.join("rejected")).unwrap().map(|f| f.unwrap().path()).collect::<Vec<_>>();
        for r in rejected {
            std::fs::rename(&r, pki.join("trusted").join(r.file_name().unwrap())).unwrap();
        }
    };
    trust();
    let v = call("get_sensor_reading", read.clone()).await;
    assert_eq!(v["data"]["value"], 4.5, "read once trusted: {v}");
    let addr = served.addr;
    // Up (a poll that began before the trust may still end refused: it is the last word
    // until the next poll).
    let up = || async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let args = json!({"device_id": "t-peer"});
        let s = c.post("/v1/tools/get_device_status", args.to_string().as_bytes()).await.unwrap().json();
        s["data"]["devices"][0]["state"] == "up"
    };
    support::wait_until("the device up once trusted", T, up).await;

    // The server comes back on the same port with a new certificate.
    let changed_at = chrono::Utc::now();
    drop(first);
    let second = OpcuaPeer::start_with(&nodes, &[("PEER_SECURE", "1"), ("PEER_PORT", &port)]).await;
    // The poller meets the new certificate (while the server was away the device failed
    // and its breaker may have opened: its probe does). The last error is kept after a
    // success, so the first refusal (before trust) must not count: only one after the change.
    support::wait_until("the poller to meet the new certificate", T, || async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let args = json!({"device_id": "t-peer"});
        let s = c.post("/v1/tools/get_device_status", args.to_string().as_bytes()).await.unwrap().json();
        let e = &s["data"]["devices"][0]["last_error"];
        let at = e["at"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
        e["code"] == "DEVICE_REJECTED" && at.is_some_and(|at| at > changed_at)
    })
    .await;
    let v = call("get_sensor_reading", read.clone()).await;
    assert_eq!(v["error"]["code"], "DEVICE_REJECTED", "the new certificate is not trusted: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("not trusted"), "{v}");
    let s = call("get_device_status", status.clone()).await;
    let d = &s["data"]["devices"][0];
    assert_eq!(d["state"], "down", "nothing can be read: {s}");
    assert_eq!(d["last_error"]["code"], "DEVICE_REJECTED", "{s}");
    assert!(d["down_since"].is_string(), "{s}");
    // Trusted again: up again.
    trust();
    let v = call("get_sensor_reading", read.clone()).await;
    assert_eq!(v["data"]["value"], 4.5, "read once the new certificate is trusted: {v}");
    support::wait_until("the device up again once the new certificate is trusted", T, up).await;
    drop(second);
    served.child.start_kill().unwrap();
    let _ = crate::support::exited(&mut served.child, "served").await;
}
