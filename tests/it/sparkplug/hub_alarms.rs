//! The fleet hub lists the edges' alarms with the same tools: a real `fieldgate serve`
//! edge publishes its alarms as node metrics into Mosquitto, `fieldgate hub` follows them
//! into its own journal; an operator acknowledges on the edge and the hub shows who; the
//! hub acts on none.

use std::time::Duration;

use fieldgate_sim::Wave;
use serde_json::{Value, json};

use super::edge::demo_sim;
use super::hub::{edge_env, plant_files};
use crate::support;

const T: Duration = Duration::from_secs(30);
const AGENT: &str = "agent-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";
const HIHI: &str = "B_BOILER_001.HIHI";

async fn post(addr: std::net::SocketAddr, path: &str, token: &str, body: Value) -> (u16, Value) {
    support::post_as(addr, path, token, body).await
}

/// The alarm `id` as `list_alarms` at `addr` shows it, once it is in `state`.
async fn until(addr: std::net::SocketAddr, id: &str, state: &str) -> Value {
    support::wait_for(&format!("{id} {state} at {addr}"), T, || async {
        let (_, e) = post(addr, "/v1/tools/list_alarms", AGENT, json!({ "limit": 1000 })).await;
        e["data"]["alarms"].as_array()?.iter().find(|a| a["alarm_id"] == id && a["state"] == state).cloned()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_lists_the_edges_alarms_and_their_history() {
    let broker = super::broker::Broker::start().await;
    let brokers = format!("[\"{}\"]", broker.url());
    let sim = demo_sim().await;
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 80.0 });
    let all = support::demo_devices_for(&sim);
    let files = plant_files(all.path(), "b-");
    let (data_edge, data_hub) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tokens = [
        ("FIELDGATE_TOKEN_REPORTER", "agent:agent-token-0123456789"),
        ("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:operator-token-0123456789"),
        ("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000"),
    ];
    let mut hub_env = vec![("FIELDGATE_HUB_BROKERS", brokers.as_str()), ("FIELDGATE_HUB_HOST_ID", "hub-1")];
    hub_env.extend(tokens);
    let mut hub = support::hub_binary(data_hub.path(), &hub_env).await;
    let _hub_log = hub.drain_stderr();
    let mut env = edge_env(&brokers, "B", "gw-b");
    env.extend(tokens);
    let mut edge = support::serve_binary(files.path(), data_edge.path(), &env).await;
    let _edge_log = edge.drain_stderr();

    let listed = until(hub.addr, HIHI, "normal").await;
    assert_eq!(
        (
            listed["sensor_id"].as_str(),
            listed["device_id"].as_str(),
            listed["type"].as_str(),
            listed["priority"].as_str()
        ),
        (Some("B_BOILER_001"), Some("b-boiler-rtu"), Some("high_high"), Some("critical"))
    );
    let (_, e) = post(hub.addr, "/v1/tools/list_alarms", AGENT, json!({ "plant": "B" })).await;
    assert_eq!(
        e["data"]["total"], 5,
        "B's three limit alarms and its two devices' communication alarms: {e}"
    );
    assert_eq!((listed["limit"].as_f64(), listed["unit"].as_str()), (Some(90.0), Some("degC")), "{listed}");
    assert_eq!(listed["edge"], "B/gw-b", "the edge node that evaluates it: {listed}");

    sim.set_wave("B_BOILER_001", Wave::Constant { value: 91.0 });
    until(edge.addr, HIHI, "active_unacknowledged").await;
    until(hub.addr, HIHI, "active_unacknowledged").await;
    // A reading at the hub carries the sensor's alarm state as the edge's does.
    let (_, r) =
        post(hub.addr, "/v1/tools/get_sensor_reading", AGENT, json!({ "sensor_id": "B_BOILER_001" })).await;
    assert_eq!(
        (r["data"]["alarm"]["alarm_id"].as_str(), r["data"]["alarm"]["state"].as_str()),
        (Some(HIHI), Some("active_unacknowledged")),
        "the most pressing of HI and HIHI: {r}"
    );
    let (status, e) =
        post(edge.addr, &format!("/v1/alarms/{HIHI}/acknowledge"), OPERATOR, json!({ "comment": "on it" }))
            .await;
    assert_eq!(status, 200, "{e}");
    let acked = until(hub.addr, HIHI, "active_acknowledged").await;
    assert_eq!(acked["acknowledged_by"], "shift-lead");
    // The hub acts on none: the alarm is evaluated on its edge.
    let (status, e) = post(
        hub.addr,
        &format!("/v1/alarms/{HIHI}/shelve"),
        OPERATOR,
        json!({ "comment": "x", "duration_s": 60 }),
    )
    .await;
    assert_eq!((status, e["error"]["code"].as_str()), (409, Some("INVALID_STATE")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("B/gw-b"), "{e}");

    sim.set_wave("B_BOILER_001", Wave::Constant { value: 80.0 });
    until(hub.addr, HIHI, "normal").await;
    let (_, h) =
        post(hub.addr, "/v1/tools/get_alarm_history", AGENT, json!({ "from": "-1h", "alarm_id": HIHI }))
            .await;
    let kinds: Vec<(&str, &str)> = h["data"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["by"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(kinds, [("activated", ""), ("acknowledged", "shift-lead"), ("cleared", "")], "{h}");
    let (_, s) = post(hub.addr, "/v1/tools/get_alarm_summary", AGENT, json!({ "from": "-1h" })).await;
    assert_eq!(s["data"]["by_priority"]["critical"], 1, "{s}");

    // A command the hub cannot decode is nobody's message of the edge node's: the edge is
    // neither charged with a dropped message nor asked for a rebirth. A garbage message of
    // a node never born, sent after it, says when the hub has taken both.
    let status = || async {
        let (_, s) = post(hub.addr, "/v1/tools/get_device_status", AGENT, json!({})).await;
        s["data"]["hub"].clone()
    };
    let dropped = |h: &Value| {
        h["edge_nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["edge"] == "B/gw-b"))
            .and_then(|n| n["dropped"].as_u64())
    };
    let before = status().await;
    let mqtt = super::broker::Host::connect(broker.port).await;
    mqtt.publish("spBv1.0/B/NCMD/gw-b", b"\xff\xff garbage".to_vec(), false).await;
    mqtt.publish("spBv1.0/B/NDATA/never-born", b"\xff\xff garbage".to_vec(), false).await;
    let after = support::wait_for("the never-born node's message at the hub", T, || async {
        let h = status().await;
        (h["never_born"]["messages"].as_u64() > before["never_born"]["messages"].as_u64()).then_some(h)
    })
    .await;
    assert_eq!(dropped(&after), dropped(&before), "{after}");
    assert!(dropped(&before).is_some(), "{before}");
    edge.child.start_kill().unwrap();
    hub.child.start_kill().unwrap();
    let _ = support::exited(&mut edge.child, "edge").await;
    let _ = support::exited(&mut hub.child, "hub").await;
}
