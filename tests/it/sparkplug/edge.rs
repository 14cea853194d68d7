//! The edge node against a real Mosquitto, in process over the simulated demo plant.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fieldgate::app::{Options, Running};
use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::spb::payload::{Metric, Value, datatype};
use fieldgate::transport::auth::Tokens;
use fieldgate_sim::{Bind, Scenario, Simulator};

use super::broker::{Broker, Host, Msg, counter, metric};
use crate::support;

const T: Duration = Duration::from_secs(20);

pub struct Rig {
    pub sim: Simulator,
    pub running: Running,
    pub devices: tempfile::TempDir,
    pub data: tempfile::TempDir,
}

/// The demo device files pointed at `sim`, polled every 200 ms.
pub fn fast_devices(sim: &Simulator) -> tempfile::TempDir {
    let dir = support::demo_devices_for(sim);
    for f in fieldgate::registry::device_files(dir.path()).unwrap() {
        let text = std::fs::read_to_string(&f).unwrap();
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("poll_interval_ms") {
                    "poll_interval_ms = 200".to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&f, text + "\n").unwrap();
    }
    dir
}

pub fn mqtt_config(broker: &Broker, data: &std::path::Path) -> Config {
    let mut c = Config::default();
    c.storage.data_dir = data.to_path_buf();
    c.storage.flush_interval_ms = 200;
    c.mqtt.brokers = vec![broker.url()];
    c.mqtt.edge_node_id = "gw".into();
    c.mqtt.group_id = "plant".into();
    c.mqtt.reconnect_max_ms = 300;
    c
}

pub async fn rig_with(config: Config, sim: Simulator, data: tempfile::TempDir) -> Rig {
    let devices = fast_devices(&sim);
    let registry = Registry::load(devices.path()).unwrap();
    let options =
        Options { listen: None, listen_required: false, tokens: Arc::new(Tokens::default()), mode: "serve" };
    let running = fieldgate::app::start(config, registry, options).await.unwrap();
    Rig { sim, running, devices, data }
}

/// The environment that makes a spawned `fieldgate serve` the edge node `plant/gw` on `brokers`
/// (a JSON list of broker URLs).
pub fn node_env(brokers: &str) -> Vec<(&'static str, &str)> {
    vec![
        ("FIELDGATE_MQTT_BROKERS", brokers),
        ("FIELDGATE_MQTT_EDGE_NODE_ID", "gw"),
        ("FIELDGATE_MQTT_GROUP_ID", "plant"),
    ]
}

/// `node_env` for the broker's password listener, as user `edge` with `password`, with fast
/// reconnects and flushes.
pub fn auth_node_env<'a>(brokers: &'a str, password: &'a str) -> Vec<(&'static str, &'a str)> {
    let mut env = node_env(brokers);
    env.extend([
        ("FIELDGATE_MQTT_USERNAME_ENV", "EDGE_MQTT_USER"),
        ("FIELDGATE_MQTT_PASSWORD_ENV", "EDGE_MQTT_PASSWORD"),
        ("EDGE_MQTT_USER", "edge"),
        ("EDGE_MQTT_PASSWORD", password),
        ("FIELDGATE_MQTT_RECONNECT_MAX_MS", "200"),
        ("FIELDGATE_STORAGE_FLUSH_INTERVAL_MS", "200"),
    ]);
    env
}

pub async fn demo_sim() -> Simulator {
    let mut scenario = Scenario::load(&support::root().join("simulator/scenarios/demo.toml")).unwrap();
    scenario.faults.clear();
    let devices = fieldgate_sim::plant::load_dir(&support::demo_dir()).unwrap();
    Simulator::start(devices, scenario, Bind::Ephemeral).await.unwrap()
}

pub async fn rig(broker: &Broker, tweak: impl FnOnce(&mut Config)) -> Rig {
    let data = tempfile::tempdir().unwrap();
    let mut c = mqtt_config(broker, data.path());
    tweak(&mut c);
    rig_with(c, demo_sim().await, data).await
}

fn is(kind: &'static str) -> impl Fn(&Msg) -> bool {
    move |m| m.kind() == kind
}

pub fn bd_seq(m: &Msg) -> u64 {
    match m.payload.metrics.iter().find(|m| m.name.as_deref() == Some("bdSeq")).and_then(|m| m.value.clone())
    {
        Some(Value::Long(v)) => v,
        other => panic!("no bdSeq in {}: {other:?}", m.topic),
    }
}

/// No live DDATA repeats what the DBIRTH before it carried: each live value is newer than
/// the value its metric was (last) born with.
fn no_live_value_repeats_its_birth(seen: &[Msg]) {
    let mut born: HashMap<(String, u64), u64> = HashMap::new();
    for m in seen {
        let device = m.device().unwrap_or("").to_string();
        for x in &m.payload.metrics {
            let (Some(alias), Some(t)) = (x.alias, x.timestamp) else { continue };
            match m.kind() {
                "DBIRTH" => {
                    born.insert((device.clone(), alias), t);
                }
                "DDATA" if x.is_historical != Some(true) => {
                    if let Some(b) = born.get(&(device.clone(), alias)) {
                        assert!(t > *b, "live DDATA of {device}/{alias} at {t} repeats its DBIRTH at {b}");
                    }
                }
                _ => {}
            }
        }
    }
}

/// Every metric of every DBIRTH seen, by alias.
fn aliases(seen: &[Msg]) -> HashMap<u64, Metric> {
    seen.iter()
        .filter(|m| m.kind() == "DBIRTH")
        .flat_map(|m| m.payload.metrics.iter())
        .map(|m| (m.alias.unwrap(), m.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn births_carry_every_sensor_then_data_by_alias_with_continuous_seq() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let rig = rig(&broker, |_| {}).await;
    let registry = rig.running.tools.registry();

    let nbirth = host.until("NBIRTH", T, is("NBIRTH")).await;
    assert_eq!(nbirth.topic, "spBv1.0/plant/NBIRTH/gw");
    assert_eq!(nbirth.payload.seq, Some(0));
    let rebirth =
        nbirth.payload.metrics.iter().find(|m| m.name.as_deref() == Some("Node Control/Rebirth")).unwrap();
    assert_eq!(
        (rebirth.datatype, rebirth.value.clone()),
        (Some(datatype::BOOLEAN), Some(Value::Boolean(false)))
    );
    for _ in registry.devices() {
        host.until("a DBIRTH per device", T, is("DBIRTH")).await;
    }
    for d in registry.devices() {
        let birth =
            host.seen.iter().find(|m| m.kind() == "DBIRTH" && m.device() == Some(d.id.as_str())).unwrap();
        let names: Vec<&str> = birth.payload.metrics.iter().filter_map(|m| m.name.as_deref()).collect();
        let want: Vec<&str> = registry.sensors_of_device(&d.id).map(|s| s.id.as_str()).collect();
        assert_eq!(names, want, "DBIRTH of {} names every sensor", d.id);
        for (m, s) in birth.payload.metrics.iter().zip(registry.sensors_of_device(&d.id)) {
            let p = m.properties.as_ref().unwrap();
            let text = |k: &str| match p.get(k).and_then(|v| v.value.clone()) {
                Some(fieldgate::spb::payload::PropertyValueKind::String(t)) => t,
                other => panic!("{k} of {}: {other:?}", s.id),
            };
            assert_eq!(
                (text("engUnit"), text("kind"), text("description")),
                (s.unit.clone(), s.kind.clone(), s.description.clone())
            );
            assert!(p.get("Quality").is_some());
            assert!(m.datatype.is_some_and(|t| t != 0));
        }
    }
    // A line PLC sensor read as f32 is a Float; one with a scale is a Double.
    let by_name = |n: &str| aliases(&host.seen).into_values().find(|m| m.name.as_deref() == Some(n)).unwrap();
    assert_eq!(by_name("A_LINE1_001").datatype, Some(datatype::FLOAT));

    // DDATA: aliases only, each known from a DBIRTH, several metrics per message.
    let mut ddata = 0;
    let mut several = false;
    while ddata < 10 {
        let m = host.until("DDATA", T, is("DDATA")).await;
        let known = aliases(&host.seen);
        for metric in &m.payload.metrics {
            assert_eq!(metric.name, None);
            assert!(known.contains_key(&metric.alias.unwrap()), "alias {:?} born", metric.alias);
            assert!(metric.timestamp.is_some());
        }
        several |= m.payload.metrics.len() > 1;
        ddata += 1;
    }
    assert!(several, "several metrics of one device share a DDATA");
    no_live_value_repeats_its_birth(&host.seen);
    // seq: 0 at NBIRTH, then +1 per message, every message of this node.
    host.take();
    let seqs: Vec<u64> = host
        .seen
        .iter()
        .filter(|m| m.kind() != "NDEATH" && m.kind() != "STATE")
        .map(|m| m.payload.seq.unwrap())
        .collect();
    for w in seqs.windows(2) {
        assert_eq!(w[1], (w[0] + 1) % 256, "seq continuous: {seqs:?}");
    }
    rig.running.stop().await.unwrap();
    let death = host.until("NDEATH on a clean stop", T, is("NDEATH")).await;
    assert_eq!(bd_seq(&death), bd_seq(&nbirth));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebirth_on_ncmd_and_writes_refused() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let rig = rig(&broker, |_| {}).await;
    let tools = rig.running.tools.clone();
    let first = host.until("NBIRTH", T, is("NBIRTH")).await;
    host.until("DDATA", T, is("DDATA")).await;

    // Commands as Eclipse Tahu's encoder writes them, not ours.
    let rebirth = super::tahu::command("Node Control/Rebirth");
    host.publish("spBv1.0/plant/NCMD/gw", rebirth.clone(), false).await;
    let again = host.until("a second NBIRTH", T, is("NBIRTH")).await;
    assert_eq!(again.payload.seq, Some(0));
    assert_eq!(bd_seq(&again), bd_seq(&first), "a rebirth keeps the connection's bdSeq");
    host.until("DBIRTH after the rebirth", T, is("DBIRTH")).await;
    counter(&tools, "fieldgate_sparkplug_rebirths_total", T, |v| v == 1).await;
    // A flood of rebirths is one more, a second later: not one birth per command.
    for _ in 0..50 {
        host.publish("spBv1.0/plant/NCMD/gw", rebirth.clone(), false).await;
    }
    host.until("the flood's NBIRTH", T, is("NBIRTH")).await;
    counter(&tools, "fieldgate_sparkplug_rebirths_total", T, |v| v == 2).await;
    host.until("data after the flood", T, is("DDATA")).await;
    assert_eq!(metric(&tools, "fieldgate_sparkplug_rebirths_total"), Some(2), "50 asked, one done");
    host.take();
    no_live_value_repeats_its_birth(&host.seen);

    // A device's rebirth: its DBIRTH again, and no other birth.
    host.take();
    let seen = host.seen.len();
    host.publish("spBv1.0/plant/DCMD/gw/a-util-meter", super::tahu::command("Device Control/Rebirth"), false)
        .await;
    let dbirth = host.until("the device's DBIRTH again", T, is("DBIRTH")).await;
    assert_eq!(dbirth.device(), Some("a-util-meter"));
    counter(&tools, "fieldgate_sparkplug_rebirths_total", T, |v| v == 3).await;
    host.until("data after the device's rebirth", T, is("DDATA")).await;
    assert!(!host.seen[seen..].iter().any(|m| m.kind() == "NBIRTH"), "the node was not born again");

    // A write to a device, garbage, and an unknown node command: all refused, counted.
    let write = super::tahu::encode(&serde_json::json!({"timestamp": 1, "metrics": [
        {"name": "A_LINE1_001", "type": "Float", "value": 99.0}]}));
    host.publish("spBv1.0/plant/DCMD/gw/a-line1-plc", write.clone(), false).await;
    host.publish("spBv1.0/plant/NCMD/gw", b"\xff\xff garbage".to_vec(), false).await;
    host.publish("spBv1.0/plant/NCMD/gw", write, false).await;
    counter(&tools, "fieldgate_sparkplug_commands_refused_total", T, |v| v == 3).await;
    assert_eq!(metric(&tools, "fieldgate_sparkplug_connected"), Some(1), "still connected");
    host.until("data still flows", T, is("DDATA")).await;
    let status = tools.call("get_device_status", serde_json::json!({})).await.unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.to_json()).unwrap();
    let north = &status["data"]["northbound"];
    assert_eq!(north["link"], "online", "{status}");
    assert_eq!(north["broker"], format!("mqtt://127.0.0.1:{}", broker.port));
    assert_eq!(north["commands_refused"], 3);
    assert!(north["messages_sent"].as_u64().unwrap() > 5 && north["metrics_sent"].as_u64().unwrap() > 40);
    assert_eq!((north["buffered"].as_u64(), north["dropped"].as_u64()), (Some(0), Some(0)));
    rig.running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_device_gets_ddeath_and_a_dbirth_when_back() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let rig = rig(&broker, |c| {
        c.breaker.failure_threshold = 2;
        c.breaker.open_ms = 200;
        c.breaker.max_open_ms = 400;
    })
    .await;
    host.until("DBIRTH of the meter", T, |m| m.kind() == "DBIRTH" && m.device() == Some("a-util-meter"))
        .await;
    rig.sim.set_faults("a-util-meter", fieldgate_sim::Faults { down: true, ..Default::default() }).unwrap();
    let death = host
        .until("DDEATH of the meter", T, |m| m.kind() == "DDEATH" && m.device() == Some("a-util-meter"))
        .await;
    assert!(death.payload.seq.is_some());
    rig.sim.set_faults("a-util-meter", fieldgate_sim::Faults::default()).unwrap();
    let birth =
        host.until("DBIRTH again", T, |m| m.kind() == "DBIRTH" && m.device() == Some("a-util-meter")).await;
    assert!(birth.payload.metrics.iter().all(|m| m.name.is_some()));
    // Born again with values read since it came back, not the ones from before its death.
    let died = death.payload.timestamp.unwrap();
    for m in &birth.payload.metrics {
        assert!(m.timestamp.is_some_and(|t| t > died), "{:?} at {:?}, died at {died}", m.name, m.timestamp);
    }
    host.until("its data again", T, |m| m.kind() == "DDATA" && m.device() == Some("a-util-meter")).await;
    rig.running.stop().await.unwrap();
}
