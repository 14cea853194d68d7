//! The fleet hub through the real binaries: two `fieldgate serve` edges (plants A and B of
//! the demo, each its own edge node) publishing into Mosquitto, and `fieldgate hub` serving
//! the same tools for both. What the hub answers is held to what each edge answers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::broker::{Broker, Host};
use super::edge::demo_sim;
use crate::support::{self, tool_over_http as call};

const T: Duration = Duration::from_secs(30);

/// The demo's device files of one plant (`a-…` or `b-…`), pointed at the simulator.
pub fn plant_files(all: &Path, prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(all).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with(prefix) {
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
    }
    dir
}

/// Every sensor `list_sensors` lists at `addr` (all pages), by ID.
async fn sensors(addr: std::net::SocketAddr, filter: Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut args = filter;
    args["limit"] = json!(1000);
    loop {
        let e = call(addr, "list_sensors", args.clone()).await;
        assert_eq!(e["ok"], true, "{e}");
        for s in e["data"]["sensors"].as_array().unwrap() {
            out.insert(s["sensor_id"].as_str().unwrap().to_string(), s.clone());
        }
        match e["data"]["next_cursor"].as_str() {
            Some(c) => args["cursor"] = json!(c),
            None => return out,
        }
    }
}

/// `GET path` at `addr`: the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    fieldgate::tls::install_crypto_provider();
    let res = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    (res.status().as_u16(), res.text().await.unwrap())
}

/// A console page at `addr`, as HTML.
async fn console(addr: std::net::SocketAddr, path: &str) -> String {
    let (code, page) = get(addr, path).await;
    assert_eq!(code, 200, "GET {path}");
    page
}

/// The fleet page's row of edge node `edge`, up to the next row.
fn fleet_row<'a>(page: &'a str, edge: &str) -> &'a str {
    let at =
        page.find(&format!("data-edge=\"{edge}\"")).unwrap_or_else(|| panic!("{edge} on the fleet page"));
    let row = &page[at..];
    &row[..row.find("</tr>").unwrap_or(row.len())]
}

/// `/readyz` at `addr`: its status code and body.
async fn readyz(addr: std::net::SocketAddr) -> (u16, Value) {
    let (code, body) = get(addr, "/readyz").await;
    (code, serde_json::from_str(&body).unwrap())
}

/// What a STATE message says (`None`: not JSON with an `online` flag).
fn online(raw: &[u8]) -> Option<bool> {
    serde_json::from_slice::<Value>(raw).ok()?.get("online")?.as_bool()
}

pub fn edge_env<'a>(brokers: &'a str, group: &'a str, node: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("FIELDGATE_MQTT_BROKERS", brokers),
        ("FIELDGATE_MQTT_GROUP_ID", group),
        ("FIELDGATE_MQTT_EDGE_NODE_ID", node),
        ("FIELDGATE_MQTT_RECONNECT_MAX_MS", "500"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_edges_through_one_hub_answer_as_each_edge_does() {
    let broker = Broker::start().await;
    let brokers = format!("[\"{}\"]", broker.url());
    let sim = demo_sim().await;
    let all = support::demo_devices_for(&sim);
    let (files_a, files_b) = (plant_files(all.path(), "a-"), plant_files(all.path(), "b-"));
    let (data_a, data_b, data_hub) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A watcher on the broker, to see the hub's STATE and what crosses it.
    let mut watch = Host::connect(broker.port).await;

    let hub_env = [("FIELDGATE_HUB_BROKERS", brokers.as_str()), ("FIELDGATE_HUB_HOST_ID", "hub-1")];
    let mut hub = support::hub_binary(data_hub.path(), &hub_env).await;
    let _hub_log = hub.drain_stderr();
    let state = watch.until("the hub's STATE", T, |m| m.topic == "spBv1.0/STATE/hub-1").await;
    let state: Value = serde_json::from_slice(&state.raw).unwrap();
    assert_eq!(state["online"], true, "{state}");

    let mut edge_a =
        support::serve_binary(files_a.path(), data_a.path(), &edge_env(&brokers, "A", "gw-a")).await;
    let _a_log = edge_a.drain_stderr();
    let mut edge_b =
        support::serve_binary(files_b.path(), data_b.path(), &edge_env(&brokers, "B", "gw-b")).await;
    let _b_log = edge_b.drain_stderr();

    // Both plants listed through the hub, each sensor described as its edge describes it.
    let at_a = sensors(edge_a.addr, json!({})).await;
    let at_b = sensors(edge_b.addr, json!({})).await;
    assert!(!at_a.is_empty() && !at_b.is_empty());
    let expected = at_a.len() + at_b.len();
    let at_hub = support::wait_for("every sensor of both edges at the hub", T, || async {
        let s = sensors(hub.addr, json!({})).await;
        (s.len() == expected).then_some(s)
    })
    .await;
    for (id, edge_view) in at_a.iter().chain(&at_b) {
        let mut hub_view = at_hub[id].clone();
        let edge = hub_view.as_object_mut().unwrap().remove("edge").unwrap();
        assert_eq!(edge, if id.starts_with("A_") { "A/gw-a" } else { "B/gw-b" });
        assert_eq!(&hub_view, edge_view, "{id} as the hub lists it");
    }
    fieldgate::tls::install_crypto_provider();
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", hub.addr))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "fieldgate_hub_online 1",
        "fieldgate_hub_edge_nodes_online 2",
        &format!("fieldgate_hub_sensors {expected}"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in /metrics");
    }
    // The console's fleet page: both edge nodes online, each with its devices; an edge's
    // console has no fleet to show.
    let fleet = console(hub.addr, "/console/fleet").await;
    assert!(fleet.contains("2 of 2 edge nodes online"), "{fleet}");
    for edge in ["A/gw-a", "B/gw-b"] {
        assert!(fleet_row(&fleet, edge).contains("▲ online"), "{edge}: {fleet}");
    }
    assert!(
        console(hub.addr, "/console").await.contains("href=\"/console/fleet\""),
        "Fleet in the hub's menu"
    );
    let at_edge = console(edge_a.addr, "/console/fleet").await;
    assert!(at_edge.contains("it is an edge node") && !at_edge.contains("data-edge"), "{at_edge}");
    assert!(!console(edge_a.addr, "/console").await.contains("href=\"/console/fleet\""));
    // A device of the fleet has its console page at the hub.
    let device = at_hub.values().next().unwrap()["device_id"].as_str().unwrap().to_string();
    assert!(console(hub.addr, &format!("/console/devices/{device}")).await.contains(&device));

    // `fieldgate call --data-dir` on the hub's box, where there is no devices folder:
    // it asks the running hub (regression, the adversarial walk: it failed on the
    // missing device files).
    let here = tempfile::tempdir().unwrap();
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["call", "get_device_status", "{}", "--data-dir"])
        .arg(data_hub.path())
        .current_dir(here.path())
        .env_clear()
        .kill_on_drop(true)
        .output();
    let o = tokio::time::timeout(T, o).await.expect("call ends").unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert!(o.status.success() && v["ok"] == true, "{v} {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(v["data"]["hub"]["edge_nodes"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["data"]["hub"]["never_born"]["edge_nodes"], 0, "{v}");

    // At the hub a raw reading is in the sensor's unit: the edge sent it scaled.
    let (id, listed) = at_a.iter().next().unwrap();
    let raw = call(hub.addr, "get_sensor_reading", json!({"sensor_id": id, "unit": "raw"})).await;
    assert_eq!(raw["data"]["unit"], listed["unit"], "{raw}");
    let only_b = sensors(hub.addr, json!({"edge": "B/gw-b"})).await;
    assert_eq!(only_b.keys().collect::<Vec<_>>(), at_b.keys().collect::<Vec<_>>());

    // Readings: the hub's value is the edge's for the same sample (same timestamp). Each
    // round asks every sensor not matched yet; a pair of readings of one instant must agree.
    let matched = std::cell::RefCell::new(std::collections::BTreeSet::new());
    support::wait_for("readings of 10 sensors matched by timestamp at the hub and the edge", T, || async {
        for id in at_a.keys().chain(at_b.keys()) {
            if matched.borrow().contains(id) {
                continue;
            }
            let edge = if id.starts_with("A_") { edge_a.addr } else { edge_b.addr };
            let h = call(hub.addr, "get_sensor_reading", json!({"sensor_id": id})).await;
            let e = call(edge, "get_sensor_reading", json!({"sensor_id": id, "max_age_ms": 60000})).await;
            if h["ok"] != true || e["ok"] != true {
                continue;
            }
            assert_eq!(h["data"]["source"], "hub", "{h}");
            if h["data"]["timestamp"] == e["data"]["timestamp"] {
                for k in ["value", "unit", "quality", "device_id", "range", "in_range"] {
                    assert_eq!(h["data"][k], e["data"][k], "{id}: {k} at the hub {h} and at the edge {e}");
                }
                matched.borrow_mut().insert(id.clone());
            }
        }
        (matched.borrow().len() >= 10).then_some(())
    })
    .await;

    // A work order for a sensor of the fleet, at the hub, waiting for a person; history of
    // what arrived.
    let order = call(
        hub.addr,
        "create_work_order",
        json!({"sensor_id": at_b.keys().next().unwrap(), "type": "inspection", "priority": "low",
               "summary": "Checked from the fleet hub: inspect this sensor.", "idempotency_key": "hub-order-1"}),
    )
    .await;
    assert_eq!(
        (order["ok"].clone(), order["data"]["status"].clone()),
        (json!(true), json!("pending_approval")),
        "{order}"
    );
    // Its evidence: the latest value the edge sent, whether or not a reading was asked.
    let evidence = &order["data"]["work_order"]["evidence"];
    assert_eq!(
        (evidence["source"].clone(), evidence["sensor_id"].clone()),
        (json!("hub"), json!(at_b.keys().next().unwrap())),
        "{order}"
    );
    assert!(!evidence["value"].is_null(), "{order}");
    let history = call(
        hub.addr,
        "get_sensor_history",
        json!({"sensor_id": at_a.keys().next().unwrap(), "from": "-10m"}),
    )
    .await;
    assert!(!history["data"]["points"].as_array().is_none_or(Vec::is_empty), "{history}");

    // kill -9 of edge A: its will reaches the hub, which answers EDGE_OFFLINE; B goes on.
    let a_sensor = at_a.keys().next().unwrap().clone();
    let b_sensor = at_b.keys().next().unwrap().clone();
    edge_a.child.start_kill().unwrap();
    support::exited(&mut edge_a.child, "edge A").await;
    let offline = support::wait_for("EDGE_OFFLINE for plant A", T, || async {
        let e = call(hub.addr, "get_sensor_reading", json!({"sensor_id": a_sensor})).await;
        (e["error"]["code"] == "EDGE_OFFLINE").then_some(e)
    })
    .await;
    assert_eq!(offline["error"]["retryable"], true, "{offline}");
    assert!(offline["error"]["retry_after_ms"].as_u64().unwrap() > 0, "{offline}");
    assert!(offline["error"]["message"].as_str().unwrap().contains("A/gw-a"), "{offline}");
    let b = call(hub.addr, "get_sensor_reading", json!({"sensor_id": b_sensor})).await;
    assert_eq!(b["ok"], true, "{b}");
    // get_device_status names each device's edge node and what it last said.
    let status = call(hub.addr, "get_device_status", json!({})).await;
    let devices = status["data"]["devices"].as_array().unwrap();
    let of =
        |prefix: &str| devices.iter().find(|d| d["device_id"].as_str().unwrap().starts_with(prefix)).unwrap();
    let (a, b) = (of("a-"), of("b-"));
    assert_eq!(
        (a["state"].clone(), a["edge"]["edge"].clone(), a["edge"]["edge_state"].clone()),
        (json!("down"), json!("A/gw-a"), json!("offline")),
        "{a}"
    );
    assert_eq!(a["edge"]["edge_offline_reason"], "death", "{a}");
    assert_eq!(a["down_since"], a["edge"]["edge_since"], "{a}");
    assert_eq!((b["state"].clone(), b["edge"]["edge_state"].clone()), (json!("up"), json!("online")), "{b}");
    let fleet = console(hub.addr, "/console/fleet").await;
    assert!(fleet.contains("1 of 2 edge nodes online"), "{fleet}");
    let row = fleet_row(&fleet, "A/gw-a");
    assert!(row.contains("▼ offline") && row.contains("its death message"), "{row}");
    assert!(b["edge"]["last_birth"].is_string() && b["edge"]["messages"].as_u64().unwrap() > 1, "{b}");

    // Back after a restart (a new NBIRTH, a new bdSeq).
    let mut again =
        support::serve_binary(files_a.path(), data_a.path(), &edge_env(&brokers, "A", "gw-a")).await;
    let _again_log = again.drain_stderr();
    support::wait_until("plant A back at the hub", T, || async {
        call(hub.addr, "get_sensor_reading", json!({"sensor_id": a_sensor})).await["ok"] == true
    })
    .await;

    // The hub killed and started again: edges it does not know send data, it asks them for
    // a rebirth, and the fleet is complete again.
    hub.child.start_kill().unwrap();
    support::exited(&mut hub.child, "the first hub").await;
    let dead = watch
        .until("the killed hub's will", T, |m| {
            m.topic == "spBv1.0/STATE/hub-1" && online(&m.raw) == Some(false)
        })
        .await;
    let dead: Value = serde_json::from_slice(&dead.raw).unwrap();
    assert_eq!(dead["timestamp"], state["timestamp"], "the will carries the connection's timestamp");
    let mut hub = support::hub_binary(data_hub.path(), &hub_env).await;
    let _hub_log = hub.drain_stderr();
    let state = watch
        .until("the restarted hub's STATE", T, |m| {
            m.topic == "spBv1.0/STATE/hub-1" && online(&m.raw) == Some(true)
        })
        .await;
    let state: Value = serde_json::from_slice(&state.raw).unwrap();
    support::wait_until("every sensor again at the restarted hub", T, || async {
        sensors(hub.addr, json!({})).await.len() == expected
    })
    .await;
    for node in ["spBv1.0/A/NCMD/gw-a", "spBv1.0/B/NCMD/gw-b"] {
        // Either may come first: the one that did is among what was seen meanwhile.
        let ask = match watch.seen.iter().find(|m| m.topic == node) {
            Some(m) => m.payload.clone(),
            None => watch.until(node, T, |m| m.topic == node).await.payload,
        };
        assert_eq!(ask.metrics[0].name.as_deref(), Some("Node Control/Rebirth"), "{node}");
    }

    // An ID a third edge node announces too (its births encoded by Eclipse Tahu): a
    // conflict, served by neither, and listed.
    let now = chrono::Utc::now().timestamp_millis();
    let spoof = |seq: u64, metrics: Value| {
        super::tahu::encode(&json!({"timestamp": now, "seq": seq, "metrics": metrics}))
    };
    let nbirth = spoof(
        0,
        json!([{"name": "bdSeq", "type": "Int64", "value": 0}, {"name": "Node Control/Rebirth", "type": "Boolean", "value": false}]),
    );
    watch.publish("spBv1.0/C/NBIRTH/gw-c", nbirth, false).await;
    let dbirth =
        spoof(1, json!([{"name": b_sensor, "alias": 1, "type": "Double", "value": 1.5, "timestamp": now}]));
    watch.publish("spBv1.0/C/DBIRTH/gw-c/b-spare", dbirth, false).await;
    let listed = support::wait_for("the conflict listed", T, || async {
        let e = call(hub.addr, "list_sensors", json!({"plant": "B"})).await;
        e["data"]["conflicts"].as_array().filter(|c| !c.is_empty()).cloned()
    })
    .await;
    assert_eq!(listed[0]["id"], json!(b_sensor));
    let claimants: Vec<&str> =
        listed[0]["claimants"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(claimants.len(), 2, "{claimants:?}");
    assert!(claimants.contains(&"C/gw-c/b-spare"), "{claimants:?}");
    let fleet = console(hub.addr, "/console/fleet").await;
    let conflicts = &fleet[fleet.find("id=\"conflicts\"").expect("the conflicts on the fleet page")..];
    assert!(conflicts.contains(&b_sensor) && conflicts.contains("C/gw-c/b-spare"), "{fleet}");
    // The forger serves nothing, yet it is an edge node of the fleet: listed with the others.
    assert!(fleet.contains("3 of 3 edge nodes online"), "{fleet}");
    assert!(fleet_row(&fleet, "C/gw-c").contains("▲ online"), "{fleet}");
    assert!(fleet.contains("No device served: 1 announced"), "{fleet}");
    let status = call(hub.addr, "get_device_status", json!({})).await;
    let nodes = status["data"]["hub"]["edge_nodes"].as_array().expect("the hub's edge nodes");
    let c = nodes.iter().find(|n| n["edge"] == "C/gw-c").expect("C/gw-c among the edge nodes");
    assert_eq!((c["state"].clone(), c["devices"].clone()), (json!("online"), json!(1)), "{c}");
    assert_eq!(status["data"]["hub"]["link"], "online", "{status}");
    let refused = call(hub.addr, "get_sensor_reading", json!({"sensor_id": b_sensor})).await;
    assert_eq!(refused["error"]["code"], "SENSOR_NOT_FOUND", "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("C/gw-c/b-spare"), "{refused}");
    // One device asked for: its status, not the fleet's.
    let one = call(hub.addr, "get_device_status", json!({"device_id": device})).await;
    assert!(one["ok"] == true && one["data"].get("hub").is_none(), "{one}");

    // Data of an edge node never born (a client that is no edge node): not one of the
    // fleet, summed up as never born and asked for a rebirth.
    watch
        .publish(
            "spBv1.0/Z/DDATA/ghost/d1",
            spoof(5, json!([{"alias": 1, "type": "Double", "value": 1.0}])),
            false,
        )
        .await;
    watch.until("the hub's rebirth request to Z/ghost", T, |m| m.topic == "spBv1.0/Z/NCMD/ghost").await;
    let status = call(hub.addr, "get_device_status", json!({})).await;
    let hub_part = &status["data"]["hub"];
    assert_eq!(hub_part["never_born"]["edge_nodes"], 1, "{hub_part}");
    assert_eq!(hub_part["never_born"]["recent"], json!(["Z/ghost"]), "{hub_part}");
    assert!(hub_part["edge_nodes"].as_array().unwrap().iter().all(|n| n["edge"] != "Z/ghost"), "{hub_part}");
    let fleet = console(hub.addr, "/console/fleet").await;
    assert!(fleet.contains("id=\"never-born\"") && fleet.contains("Z/ghost"), "{fleet}");

    // Stopped by SIGTERM, the hub leaves with STATE offline, retained, with the timestamp
    // it came online with.
    let pid = hub.child.id().expect("running").to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let gone = watch
        .until("the hub's STATE offline", T, |m| {
            m.topic == "spBv1.0/STATE/hub-1" && online(&m.raw) == Some(false)
        })
        .await;
    let gone: Value = serde_json::from_slice(&gone.raw).unwrap();
    assert_eq!(
        (gone["online"].clone(), gone["timestamp"].clone()),
        (json!(false), state["timestamp"].clone())
    );
    support::exited(&mut hub.child, "the hub").await;
    again.child.start_kill().unwrap();
    edge_b.child.start_kill().unwrap();
    support::exited(&mut again.child, "edge A again").await;
    support::exited(&mut edge_b.child, "edge B").await;
}

/// Points of `sensor`'s history at `addr` from `from` on: (time in ms, value), and gaps.
async fn history(addr: std::net::SocketAddr, sensor: &str, from: &str) -> (Vec<(i64, Value)>, Vec<Value>) {
    let mut args = json!({"sensor_id": sensor, "from": from, "limit": 5000});
    let e = call(addr, "get_sensor_history", args.take()).await;
    assert_eq!(e["ok"], true, "{e}");
    let t = |p: &Value| {
        chrono::DateTime::parse_from_rfc3339(p["t"].as_str().unwrap()).unwrap().timestamp_millis()
    };
    let points = e["data"]["points"].as_array().unwrap().iter().map(|p| (t(p), p["value"].clone())).collect();
    (points, e["data"]["gaps"].as_array().cloned().unwrap_or_default())
}

/// A broker outage: the edge buffers, and after the broker is back replays what it
/// buffered (historical) while its live values flow again. The hub's history has the
/// outage's values in place, as the edge recorded them: no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_broker_outage_the_hubs_history_has_the_edges_replay_in_place() {
    let mut broker = Broker::start().await;
    let brokers = format!("[\"{}\"]", broker.url());
    let sim = demo_sim().await;
    let all = support::demo_devices_for(&sim);
    let files = plant_files(all.path(), "a-");
    let (data_edge, data_hub) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hub_env = [
        ("FIELDGATE_HUB_BROKERS", brokers.as_str()),
        ("FIELDGATE_HUB_HOST_ID", "hub-1"),
        ("FIELDGATE_HUB_RECONNECT_MAX_MS", "500"),
    ];
    let mut hub = support::hub_binary(data_hub.path(), &hub_env).await;
    let _hub_log = hub.drain_stderr();
    // The edge waits for the hub (its primary host): nothing it buffered is published while
    // the hub is not there to take it (a clean session would lose it).
    let mut env = edge_env(&brokers, "A", "gw-a");
    env.push(("FIELDGATE_MQTT_PRIMARY_HOST_ID", "hub-1"));
    let mut edge = support::serve_binary(files.path(), data_edge.path(), &env).await;
    let _edge_log = edge.drain_stderr();
    let ids: Vec<String> = sensors(edge.addr, json!({})).await.into_keys().collect();
    support::wait_until("every sensor of the edge at the hub", T, || async {
        sensors(hub.addr, json!({})).await.len() == ids.len()
    })
    .await;
    // Some sensor already in the hub's history (the others' values may change less often).
    support::wait_until("history at the hub", T, || async {
        for id in &ids {
            if !history(hub.addr, id, "-10m").await.0.is_empty() {
                return true;
            }
        }
        false
    })
    .await;

    let (code, ready) = readyz(hub.addr).await;
    assert_eq!(
        (code, ready["hub"]["link"].clone(), ready["hub"]["edge_nodes_online"].clone()),
        (200, json!("online"), json!(1)),
        "{ready}"
    );
    broker.stop().await;
    let stopped = chrono::Utc::now().timestamp_millis();
    // Without a broker the hub has no reading to give: not ready (a standby can take over).
    let down = support::wait_for("the hub unready without its broker", T, || async {
        let (code, ready) = readyz(hub.addr).await;
        (code == 503).then_some(ready)
    })
    .await;
    assert_eq!((down["ready"].clone(), down["status"].clone()), (json!(false), json!("no_broker")), "{down}");
    // The outage lasts until the edge has recorded five new values of one sensor.
    let busiest = support::wait_for("five values recorded at the edge during the outage", T, || async {
        for id in &ids {
            let (points, _) = history(edge.addr, id, "-10m").await;
            if points.iter().filter(|(t, _)| *t > stopped).count() >= 5 {
                return Some(id.clone());
            }
        }
        None
    })
    .await;
    broker.restart().await;
    let restarted = chrono::Utc::now().timestamp_millis();
    support::wait_until("the hub ready again", T, || async { readyz(hub.addr).await.0 == 200 }).await;
    let during = |points: &[(i64, Value)]| -> Vec<(i64, Value)> {
        points.iter().filter(|(t, _)| *t > stopped && *t < restarted).cloned().collect()
    };
    let at_edge = during(&history(edge.addr, &busiest, "-10m").await.0);
    assert!(at_edge.len() >= 5, "{at_edge:?}");
    // Every value the edge recorded during the outage, replayed to the hub, in place.
    let (at_hub, gaps) = support::wait_for("the outage's values in the hub's history", T, || async {
        let (points, gaps) = history(hub.addr, &busiest, "-10m").await;
        let during = during(&points);
        at_edge.iter().all(|p| during.contains(p)).then_some((points, gaps))
    })
    .await;
    assert!(at_hub.windows(2).all(|w| w[0].0 < w[1].0), "in time order, one point per instant");
    let spans_outage = |g: &Value| {
        let at = |k: &str| {
            chrono::DateTime::parse_from_rfc3339(g[k].as_str().unwrap()).unwrap().timestamp_millis()
        };
        at("from") < restarted && at("to") > stopped
    };
    assert!(!gaps.iter().any(spans_outage), "no gap in the outage: {gaps:?}");
    edge.child.start_kill().unwrap();
    hub.child.start_kill().unwrap();
    support::exited(&mut edge.child, "the edge").await;
    support::exited(&mut hub.child, "the hub").await;
}
