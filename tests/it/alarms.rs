//! Alarms through the real binary: a simulated value driven past its limits activates the
//! configured alarms, an operator (and only an operator) acknowledges and shelves them over
//! HTTP and the command line, the agent's tools report the journal and its figures, and a
//! killed process comes back with the same states and event IDs.

use std::time::Duration;

use fieldgate_sim::Wave;
use serde_json::{Value, json};

use super::support::{self, wait_for};

const AGENT: &str = "agent-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("FIELDGATE_TOKEN_REPORTER", "agent:agent-token-0123456789"),
        ("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:operator-token-0123456789"),
        // The waits below ask every 10 ms.
        ("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000"),
    ]
}

async fn post(addr: std::net::SocketAddr, path: &str, token: &str, body: Value) -> (u16, Value) {
    support::post_as(addr, path, token, body).await
}

async fn tool(addr: std::net::SocketAddr, name: &str, args: Value) -> Value {
    let (status, e) = post(addr, &format!("/v1/tools/{name}"), AGENT, args).await;
    assert_eq!(status, 200, "{e}");
    e["data"].clone()
}

/// The alarm `id` as `list_alarms` shows it.
async fn alarm(addr: std::net::SocketAddr, id: &str) -> Value {
    let sensor = id.split('.').next().unwrap();
    let data = tool(addr, "list_alarms", json!({ "sensor_id": sensor })).await;
    data["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["alarm_id"] == id)
        .cloned()
        .expect("the alarm is listed")
}

async fn until_state(addr: std::net::SocketAddr, id: &str, state: &str) -> Value {
    wait_for(&format!("{id} {state}"), Duration::from_secs(30), || async {
        let a = alarm(addr, id).await;
        (a["state"] == state).then_some(a)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_alarm_comes_is_acknowledged_shelved_and_clears_and_a_killed_process_keeps_it() {
    let sim = support::sim_for(&support::demo_dir()).await;
    let devices = support::demo_devices_for(&sim);
    let data = tempfile::tempdir().unwrap();
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 80.0 });
    let mut served = support::serve_binary(devices.path(), data.path(), &env()).await;
    let _log = served.drain_stderr();
    let addr = served.addr;
    assert_eq!(alarm(addr, "B_BOILER_001.HIHI").await["state"], "normal");
    // Paging: two at a time, every configured alarm once (a cursor of the first page was
    // once refused as not issued here).
    let (mut seen, mut cursor) = (Vec::new(), Value::Null);
    for _ in 0..10 {
        let page = tool(addr, "list_alarms", json!({ "limit": 2, "cursor": cursor })).await;
        seen.extend(
            page["alarms"].as_array().unwrap().iter().map(|a| a["alarm_id"].as_str().unwrap().to_string()),
        );
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(seen.len(), 9, "six limit alarms and three devices' communication alarms: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");

    // 91 degC: past HI (84.5, 5 s) and HIHI (90, 2 s).
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 91.0 });
    let hihi = until_state(addr, "B_BOILER_001.HIHI", "active_unacknowledged").await;
    let hi = until_state(addr, "B_BOILER_001.HI", "active_unacknowledged").await;
    assert_eq!((hihi["value"].as_f64(), hihi["priority"].as_str()), (Some(91.0), Some("critical")));
    let event = hihi["event_id"].as_u64().unwrap();
    assert!(event > 0 && hi["event_id"].as_u64().unwrap() != event, "each activation its own event");

    // A reading carries the sensor's most pressing alarm (critical before high); a sensor
    // without alarms carries none.
    let r = tool(addr, "get_sensor_reading", json!({ "sensor_id": "B_BOILER_001" })).await;
    assert_eq!(
        r["alarm"],
        json!({ "state": "active_unacknowledged", "alarm_id": "B_BOILER_001.HIHI", "priority": "critical" })
    );
    let r =
        tool(addr, "get_sensor_readings", json!({ "sensor_ids": ["B_BOILER_001", "B_BOILER_002"] })).await;
    assert_eq!(r["readings"][0]["alarm"]["alarm_id"], "B_BOILER_001.HIHI", "{r}");
    assert!(r["readings"][1].get("alarm").is_none(), "{r}");

    // The agent reads, never acts.
    let path = "/v1/alarms/B_BOILER_001.HIHI/acknowledge";
    let (status, e) = post(addr, path, AGENT, json!({ "comment": "seen" })).await;
    assert_eq!((status, e["error"]["code"].as_str()), (403, Some("FORBIDDEN")), "{e}");
    // An acknowledgement of an event other than the alarm's own is refused.
    let (status, e) = post(addr, path, OPERATOR, json!({ "event_id": event + 100 })).await;
    assert_eq!((status, e["error"]["code"].as_str()), (409, Some("INVALID_STATE")), "{e}");
    let (status, e) =
        post(addr, path, OPERATOR, json!({ "event_id": event, "comment": "checking the feed pump" })).await;
    assert_eq!(status, 200, "{e}");
    let acked = &e["data"]["alarm"];
    assert_eq!(
        (acked["state"].as_str(), acked["acknowledged_by"].as_str()),
        (Some("active_acknowledged"), Some("shift-lead"))
    );
    let (status, e) = post(addr, path, OPERATOR, json!({})).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("INVALID_STATE")),
        "nothing left to acknowledge: {e}"
    );
    // Shelving needs a reason and a bounded time; an unknown alarm is named.
    let shelve = "/v1/alarms/B_BOILER_001.HI/shelve";
    let (status, e) = post(addr, shelve, OPERATOR, json!({ "duration_s": 3600 })).await;
    assert_eq!((status, e["error"]["parameter"].as_str()), (400, Some("comment")), "{e}");
    let (status, e) = post(addr, shelve, OPERATOR, json!({ "duration_s": 999_999, "comment": "x" })).await;
    assert_eq!((status, e["error"]["parameter"].as_str()), (400, Some("duration_s")), "{e}");
    // A field of the wrong type, or one an act does not take, is named.
    for (body, parameter, received) in [
        (json!({ "duration_s": "1h", "comment": "x" }), "duration_s", Some("\"1h\"")),
        (json!({ "duration_s": -5, "comment": "x" }), "duration_s", Some("-5")),
        (json!({ "duration_s": 60, "comment": 5 }), "comment", Some("5")),
        (json!({ "duration_s": 60, "comment": "x", "duraton_s": 1 }), "duraton_s", None),
        (json!({ "duration_s": 60, "comment": "x", "event_id": 1 }), "event_id", None),
    ] {
        let (status, e) = post(addr, shelve, OPERATOR, body.clone()).await;
        assert_eq!(
            (status, e["error"]["parameter"].as_str(), e["error"]["received"].as_str()),
            (400, Some(parameter), received),
            "{body}: {e}"
        );
    }
    let (status, e) =
        post(addr, shelve, OPERATOR, json!({ "duration_s": 3600, "comment": "sensor drift known" })).await;
    assert_eq!(status, 200, "{e}");
    assert!(e["data"]["alarm"]["shelved_until"].is_string(), "{e}");
    let (status, e) = post(addr, "/v1/alarms/B_BOILER_001.HX/acknowledge", OPERATOR, json!({})).await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("ALARM_NOT_FOUND")), "{e}");
    assert_eq!(e["error"]["suggestions"][0], "B_BOILER_001.HI", "{e}");
    // An unknown action is refused and not echoed as a tool's name.
    let (status, e) = post(addr, "/v1/alarms/B_BOILER_001.HI/explode_now", OPERATOR, json!({})).await;
    assert_eq!((status, e["meta"]["tool"].as_str()), (400, Some("alarm_act")), "{e}");
    let (status, e) = post(addr, path, OPERATOR, json!(["seen"])).await;
    assert_eq!((status, e["error"]["parameter"].as_str()), (400, Some("body")), "{e}");

    // Back to 80: the acknowledged HIHI returns to normal, the HI waits for an acknowledgement.
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 80.0 });
    until_state(addr, "B_BOILER_001.HIHI", "normal").await;
    until_state(addr, "B_BOILER_001.HI", "returned_unacknowledged").await;

    let history =
        tool(addr, "get_alarm_history", json!({ "from": "-1h", "sensor_id": "B_BOILER_001" })).await;
    let kinds: Vec<(String, String)> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["alarm_id"].as_str().unwrap().to_string(), e["kind"].as_str().unwrap().to_string()))
        .collect();
    for want in [
        ("HIHI", "activated"),
        ("HIHI", "acknowledged"),
        ("HIHI", "cleared"),
        ("HI", "shelved"),
        ("HI", "cleared"),
    ] {
        assert!(
            kinds.contains(&(format!("B_BOILER_001.{}", want.0), want.1.to_string())),
            "{want:?} in {kinds:?}"
        );
    }
    let (status, e) = post(
        addr,
        "/v1/tools/get_alarm_history",
        AGENT,
        json!({ "from": "-1h", "alarm_id": "B_BOILER_001.HX" }),
    )
    .await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("ALARM_NOT_FOUND")), "{e}");
    let ack = history["events"].as_array().unwrap().iter().find(|e| e["kind"] == "acknowledged").unwrap();
    assert_eq!(
        (ack["by"].as_str(), ack["comment"].as_str()),
        (Some("shift-lead"), Some("checking the feed pump"))
    );
    let summary = tool(addr, "get_alarm_summary", json!({ "from": "-1h" })).await;
    assert!(summary["by_priority"]["critical"].as_u64() >= Some(1), "{summary}");
    assert_eq!(summary["time_to_acknowledge"]["acknowledged"], 1, "{summary}");

    // The command line acts as an operator through the running service.
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .args(args)
            .args(["--url", &format!("http://{addr}")])
            .env("FIELDGATE_CLI_TOKEN", OPERATOR)
            .output()
            .unwrap()
    };
    let acked = cli(&["alarms", "ack", "B_BOILER_001.HI", "--comment", "seen on the console"]);
    assert!(acked.status.success(), "{}", String::from_utf8_lossy(&acked.stderr));
    let listed = cli(&["alarms", "list", "--state", "shelved"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("B_BOILER_001.HI ") && text.contains("shelved until"), "{text}");

    // Killed at any moment, it comes back with the same instances: drive it active again first.
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 91.0 });
    let before = until_state(addr, "B_BOILER_001.HIHI", "active_unacknowledged").await;
    served.child.kill().await.unwrap();
    let mut again = support::serve_binary(devices.path(), data.path(), &env()).await;
    let _log = again.drain_stderr();
    let after = alarm(again.addr, "B_BOILER_001.HIHI").await;
    assert_eq!(
        (after["state"].clone(), after["event_id"].clone()),
        (before["state"].clone(), before["event_id"].clone())
    );
    // Still at 91 after the restart: evaluated again, not activated twice.
    let polled = |a| async move {
        tool(a, "get_sensor_history", json!({ "sensor_id": "B_BOILER_001", "from": "-10s" })).await
    };
    wait_for("a poll after the restart", Duration::from_secs(30), || async {
        (!polled(again.addr).await["points"].as_array()?.is_empty()).then_some(())
    })
    .await;
    let history =
        tool(again.addr, "get_alarm_history", json!({ "from": "-1h", "alarm_id": "B_BOILER_001.HIHI" }))
            .await;
    let activations =
        history["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "activated").count();
    assert_eq!(activations, 2, "{history}");
    assert_eq!(alarm(again.addr, "B_BOILER_001.HIHI").await["event_id"], before["event_id"]);
    sim.shutdown().await;
}

/// A device that stops answering raises its communication alarm after `comm_delay_s`; it
/// lists under the device (no sensor), and clears when the device answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_device_that_stops_answering_is_its_communication_alarm() {
    let sim = support::sim_for(&support::demo_dir()).await;
    let devices = support::demo_devices_for(&sim);
    let data = tempfile::tempdir().unwrap();
    let mut env = env();
    env.push(("FIELDGATE_ALARMS_COMM_DELAY_S", "1"));
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _log = served.drain_stderr();
    let addr = served.addr;
    let comm = || async move {
        let data = tool(addr, "list_alarms", json!({ "plant": "A", "zone": "LINE1" })).await;
        data["alarms"].as_array().unwrap().iter().find(|a| a["alarm_id"] == "a-line1-plc.COMM").cloned()
    };
    let first = comm().await.expect("the PLC's communication alarm is listed under its plant and zone");
    assert_eq!(
        (
            first["state"].as_str(),
            first["sensor_id"].clone(),
            first["device_id"].as_str(),
            first["type"].as_str()
        ),
        (Some("normal"), Value::Null, Some("a-line1-plc"), Some("communication"))
    );
    sim.set_faults("a-line1-plc", fieldgate_sim::Faults { down: true, ..Default::default() }).unwrap();
    let active = wait_for("the communication alarm", Duration::from_secs(30), || async {
        comm().await.filter(|a| a["state"] == "active_unacknowledged")
    })
    .await;
    assert_eq!(active["priority"], "high");
    sim.set_faults("a-line1-plc", fieldgate_sim::Faults::default()).unwrap();
    wait_for("the answer to clear it", Duration::from_secs(30), || async {
        comm().await.filter(|a| a["state"] == "returned_unacknowledged")
    })
    .await;
    let (status, e) = post(addr, "/v1/alarms/a-line1-plc.COMM/acknowledge", OPERATOR, json!({})).await;
    assert_eq!((status, e["data"]["alarm"]["state"].as_str()), (200, Some("normal")), "{e}");
    sim.shutdown().await;
}
