//! OPC UA Alarms & Conditions against node-opcua (a server fieldgate did not write, whose
//! own conditions evaluate its variables): a condition standing before fieldgate connects
//! is listed through ConditionRefresh, an operator's acknowledgement reaches the server,
//! the server's changes are followed, a restarted server's set replaces the old one, and a
//! restarted fieldgate lists the conditions it followed before the server is reached.

use std::time::Duration;

use serde_json::{Value, json};

use super::opcua_peer::OpcuaPeer;
use super::support::{self, device_dir, wait_for};

const AGENT: &str = "agent-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";
const TEMP: &str = "T_PEER_001.TEMP_ALARM";
const LEVEL: &str = "T_PEER_002.LEVEL_ALARM";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("FIELDGATE_TOKEN_REPORTER", "agent:agent-token-0123456789"),
        ("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:operator-token-0123456789"),
        ("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000"),
        ("FIELDGATE_ALARMS_COMM_DELAY_S", "1"),
    ]
}

/// Temp alarms above 80 (exclusive limits), Level above 90 (non-exclusive).
fn nodes(temp: f64, level: f64) -> Value {
    json!([
        {"name": "Temp", "type": "Double", "value": temp,
         "alarm": {"kind": "exclusive", "highHigh": 90, "high": 80, "low": 10, "lowLow": 5}},
        {"name": "Level", "type": "Double", "value": level,
         "alarm": {"kind": "nonexclusive", "high": 90, "low": 10}},
    ])
}

async fn post(addr: std::net::SocketAddr, path: &str, token: &str, body: Value) -> (u16, Value) {
    support::post_as(addr, path, token, body).await
}

/// Every alarm `list_alarms` shows, by ID.
async fn alarms(addr: std::net::SocketAddr) -> Vec<Value> {
    let (status, e) = post(addr, "/v1/tools/list_alarms", AGENT, json!({})).await;
    assert_eq!(status, 200, "{e}");
    e["data"]["alarms"].as_array().unwrap().clone()
}

async fn until(addr: std::net::SocketAddr, id: &str, state: &str) -> Value {
    wait_for(&format!("{id} {state}"), Duration::from_secs(60), || async {
        alarms(addr).await.into_iter().find(|a| a["alarm_id"] == id && a["state"] == state)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_servers_conditions_are_followed_acknowledged_on_it_and_restored() {
    // Temp is beyond its limit when the server starts: standing before fieldgate connects.
    let peer = OpcuaPeer::start(&nodes(95.0, 50.0)).await;
    let port = peer.port().to_string();
    let file = peer
        .device_file(&[("T_PEER_001", "Temp"), ("T_PEER_002", "Level")])
        .replace("security_mode = \"None\"\n", "security_mode = \"None\"\nalarms = true\n");
    let devices = device_dir(&[("t-peer.toml", &file)]);
    let data = tempfile::tempdir().unwrap();
    let mut served = support::serve_binary(devices.path(), data.path(), &env()).await;
    let _log = served.drain_stderr();
    let addr = served.addr;

    let temp = until(addr, TEMP, "active_unacknowledged").await;
    assert_eq!(
        (temp["sensor_id"].as_str(), temp["device_id"].as_str(), temp["type"].as_str()),
        (Some("T_PEER_001"), Some("t-peer"), Some("condition"))
    );
    assert!(!temp["message"].as_str().unwrap().is_empty(), "the server's message: {temp}");
    let first_event = temp["event_id"].as_u64().unwrap();

    // The acknowledgement goes to the server, which says it took it; an agent may not.
    let path = format!("/v1/alarms/{TEMP}/acknowledge");
    let (status, e) = post(addr, &path, AGENT, json!({})).await;
    assert_eq!(status, 403, "{e}");
    let (status, e) = post(addr, &path, OPERATOR, json!({ "comment": "seen from fieldgate" })).await;
    assert_eq!((status, e["data"]["alarm"]["state"].as_str()), (200, Some("active_acknowledged")), "{e}");
    assert_eq!(e["data"]["alarm"]["acknowledged_by"], "shift-lead");
    peer.said("acknowledged Temp.Alarm: seen from fieldgate").await;
    let (status, e) = post(addr, &path, OPERATOR, json!({})).await;
    assert_eq!((status, e["error"]["code"].as_str()), (409, Some("INVALID_STATE")), "{e}");

    // The server's own changes: Level beyond its limit, Temp back to normal.
    let mut peer = peer;
    peer.set("Level", json!({"type": "Double", "value": 96.0})).await;
    until(addr, LEVEL, "active_unacknowledged").await;
    peer.set("Temp", json!({"type": "Double", "value": 20.0})).await;
    until(addr, TEMP, "normal").await;

    // The server restarts with Temp beyond its limit again and Level inside: its set
    // replaces the old one (a new Temp event; Level no longer held by the server).
    drop(peer);
    let peer = OpcuaPeer::start_with(&nodes(95.0, 50.0), &[("PEER_PORT", &port)]).await;
    let again = until(addr, TEMP, "active_unacknowledged").await;
    assert!(again["event_id"].as_u64().unwrap() > first_event, "a new activation: {again}");
    until(addr, LEVEL, "normal").await;
    let (status, h) =
        post(addr, "/v1/tools/get_alarm_history", AGENT, json!({ "from": "-1h", "alarm_id": LEVEL })).await;
    assert_eq!(status, 200, "{h}");
    let kinds: Vec<(&str, &str)> = h["data"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["comment"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        kinds,
        [
            ("activated", ""),
            ("cleared", "no longer held by the server"),
            ("acknowledged", "no longer held by the server")
        ],
        "{h}"
    );

    // fieldgate restarts while the server is away: the conditions it followed are listed
    // as they stood, and an acknowledgement cannot reach the server.
    drop(peer);
    served.child.kill().await.unwrap();
    let mut again_served = support::serve_binary(devices.path(), data.path(), &env()).await;
    let _log = again_served.drain_stderr();
    let addr = again_served.addr;
    let listed = alarms(addr).await;
    let temp = listed.iter().find(|a| a["alarm_id"] == TEMP).expect("listed before the server is reached");
    assert_eq!(
        (temp["state"].as_str(), &temp["event_id"]),
        (Some("active_unacknowledged"), &again["event_id"])
    );
    let (status, e) = post(addr, &format!("/v1/alarms/{TEMP}/acknowledge"), OPERATOR, json!({})).await;
    assert_eq!((status, e["error"]["code"].as_str()), (503, Some("DEVICE_UNAVAILABLE")), "{e}");
    until(addr, "t-peer.COMM", "active_unacknowledged").await;
}

/// In `mode = "subscribe"` the conditions' event item shares the values' subscription: the
/// values still arrive, a standing condition is listed and its acknowledgement reaches the
/// server.
#[tokio::test(flavor = "multi_thread")]
async fn a_subscribed_device_follows_its_conditions_beside_its_values() {
    let peer = OpcuaPeer::start(&nodes(95.0, 50.0)).await;
    let file = peer.device_file(&[("T_PEER_001", "Temp"), ("T_PEER_002", "Level")]).replace(
        "security_mode = \"None\"\n",
        "security_mode = \"None\"\nalarms = true\nmode = \"subscribe\"\n",
    );
    let devices = device_dir(&[("t-peer.toml", &file)]);
    let data = tempfile::tempdir().unwrap();
    let mut served = support::serve_binary(devices.path(), data.path(), &env()).await;
    let log = served.drain_stderr();
    let addr = served.addr;
    until(addr, TEMP, "active_unacknowledged").await;
    let (status, e) =
        post(addr, "/v1/tools/get_sensor_reading", AGENT, json!({ "sensor_id": "T_PEER_001" })).await;
    assert_eq!((status, e["data"]["value"].as_f64()), (200, Some(95.0)), "{e}");
    let (status, e) =
        post(addr, &format!("/v1/alarms/{TEMP}/acknowledge"), OPERATOR, json!({ "comment": "sub" })).await;
    if status != 200 {
        // What fieldgate logged meanwhile says why (a lost session, a slow server).
        let _ = served.child.kill().await;
        let log = tokio::time::timeout(Duration::from_secs(10), log).await;
        panic!("the acknowledgement got {status}: {e}\nfieldgate's log:\n{log:?}");
    }
    peer.said("acknowledged Temp.Alarm: sub").await;
}
