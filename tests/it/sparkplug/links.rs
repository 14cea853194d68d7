//! The link's options against a real Mosquitto: `mqtts://` with a client certificate,
//! `data_qos = 1`, and a store-and-forward buffer that fills up.

use std::time::Duration;

use fieldgate::sparkplug::buffer::{Buffer, Rec};
use fieldgate::spb::payload::Value;
use fieldgate::store::gorilla::Stored;

use super::broker::{Broker, Host, Msg, counter, metric};
use super::edge::{demo_sim, mqtt_config, rig, rig_with};

const T: Duration = Duration::from_secs(20);

fn is(kind: &'static str) -> impl Fn(&Msg) -> bool {
    move |m| m.kind() == kind
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtts_with_a_client_certificate_and_a_foreign_ca_refused() {
    let broker = Broker::start_tls().await;
    let tls = broker.tls.as_ref().unwrap();
    // The host listens on the plain listener; the edge node speaks TLS only.
    let mut host = Host::connect(broker.port).await;
    let node = rig(&broker, |c| {
        c.mqtt.brokers = vec![format!("mqtts://127.0.0.1:{}", tls.port)];
        c.mqtt.ca_file = Some(tls.ca.clone());
        c.mqtt.client_cert_file = Some(tls.client_cert.clone());
        c.mqtt.client_key_file = Some(tls.client_key.clone());
    })
    .await;
    host.until("NBIRTH over TLS", T, is("NBIRTH")).await;
    host.until("DDATA over TLS", T, is("DDATA")).await;
    node.running.stop().await.unwrap();

    // A CA that did not sign the broker's certificate: never connected, data buffered.
    let other = tempfile::tempdir().unwrap();
    let foreign = other.path().join("foreign-ca.pem");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    std::fs::write(&foreign, ca.pem()).unwrap();
    let refused = rig(&broker, |c| {
        c.mqtt.brokers = vec![format!("mqtts://127.0.0.1:{}", tls.port)];
        c.mqtt.ca_file = Some(foreign.clone());
    })
    .await;
    let tools = refused.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_buffered", T, |v| v > 0).await;
    assert_eq!(metric(&tools, "fieldgate_sparkplug_connects_total"), Some(0), "no connection made");
    host.take();
    let births = host.seen.iter().filter(|m| m.kind() == "NBIRTH").count();
    assert_eq!(births, 1, "only the first node's birth reached the host");
    refused.running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_qos_1_is_opt_in_and_the_default_is_qos_0() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    for qos in [0u8, 1] {
        let rig = rig(&broker, |c| c.mqtt.data_qos = qos).await;
        let data = host.until("DDATA", T, is("DDATA")).await;
        assert_eq!(data.qos, qos, "DDATA at the configured QoS");
        let birth = host.seen.iter().rev().find(|m| m.kind() == "DBIRTH").expect("a DBIRTH before data");
        assert_eq!(birth.qos, 0, "births at QoS 0, as the specification says");
        rig.running.stop().await.unwrap();
        let death = host.until("NDEATH", T, is("NDEATH")).await;
        assert_eq!(death.qos, 1, "NDEATH is always QoS 1");
    }
}

/// The value the prefilled buffer holds at index `k`: far from anything the simulator sends.
fn prefilled(k: usize) -> f64 {
    1_000_000.0 + k as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_drops_the_oldest_counts_them_and_drains_the_newest_in_order() {
    const N: usize = 40_000;
    const SENSOR: &str = "A_LINE1_001";
    let mut broker = Broker::start().await;
    broker.stop().await;
    // A buffer left by an outage: 40,000 values of one sensor, 10 minutes old, more than
    // the 1 MB bound the service is given (about 27,000 such values).
    let data = tempfile::tempdir().unwrap();
    let start = chrono::Utc::now().timestamp_millis() - 600_000;
    {
        let path = data.path().join(fieldgate::sparkplug::buffer::FILE);
        let mut b = Buffer::open(&path, 1 << 30, 86_400_000).unwrap();
        for k in 0..N {
            b.push(Rec {
                sensor: SENSOR.into(),
                t: start + k as i64,
                value: Stored::Float(prefilled(k)),
                quality: 0,
            });
        }
        b.flush(start + 600_000).unwrap();
        assert_eq!(b.len(), N as u64);
    }
    let mut c = mqtt_config(&broker, data.path());
    c.mqtt.buffer_max_mb = 1;
    c.mqtt.primary_host_id = "scada".into();
    let rig = rig_with(c, demo_sim().await, data).await;
    let tools = rig.running.tools.clone();
    let first_dropped = counter(&tools, "fieldgate_sparkplug_dropped_total", T, |v| v > 0).await;
    let held = metric(&tools, "fieldgate_sparkplug_buffered").unwrap();
    // The bound applies at each flush; samples read since the last one wait in memory on top
    // (a flush interval's worth: a few hundred bytes here, 1 % allowed).
    assert!(held * 39 <= (1 << 20) + (1 << 20) / 100, "{held} values of 39 bytes held within 1 MB (+1 %)");
    assert!(held > 20_000, "{held} values held: the bound, not everything, went");

    // The primary host's STATE holds the births and the drain until it has subscribed.
    broker.restart().await;
    let mut host = Host::connect_as(broker.port, Some("scada")).await;
    host.until("NBIRTH", T, is("NBIRTH")).await;
    counter(&tools, "fieldgate_sparkplug_buffered", T, |v| v == 0).await;
    // Every prefilled value that was not dropped arrives, historical, oldest first (values
    // still go while the drain runs: the live ones it meets push the oldest out).
    let got = |seen: &[Msg]| -> Vec<(f64, u64)> {
        seen.iter()
            .filter(|m| m.kind() == "DDATA")
            .flat_map(|m| &m.payload.metrics)
            .filter(|m| m.is_historical == Some(true))
            .filter_map(|m| match m.value {
                Some(Value::Float(f)) if f as f64 >= prefilled(0) => Some((f as f64, m.timestamp.unwrap())),
                _ => None,
            })
            .collect()
    };
    let dropped_now = || metric(&tools, "fieldgate_sparkplug_dropped_total").unwrap_or(0) as usize;
    let deadline = tokio::time::Instant::now() + T;
    while got(&host.seen).len() + dropped_now() < N {
        let n = got(&host.seen).len();
        assert!(tokio::time::Instant::now() < deadline, "{n} arrived and {} dropped of {N}", dropped_now());
        host.until("drained values", T, is("DDATA")).await;
    }
    let dropped = dropped_now();
    assert!(dropped >= first_dropped as usize);
    let got = got(&host.seen);
    assert_eq!(got.len(), N - dropped, "each kept value once");
    for (i, (v, t)) in got.iter().enumerate() {
        let k = dropped + i;
        assert_eq!((*v, *t), (prefilled(k), (start + k as i64) as u64), "the newest, in order (at {i})");
    }
    rig.running.stop().await.unwrap();
}

/// Two servers in `brokers`: when the primary host goes offline on the first, the edge node
/// sends NDEATH there and moves to the second (as the specification says), and when the
/// first cannot be reached at all it starts on the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_node_moves_to_the_next_broker_when_the_host_leaves_or_the_first_is_down() {
    let (a, b) = (Broker::start().await, Broker::start().await);
    let mut host_a = Host::connect_as(a.port, Some("scada")).await;
    let mut host_b = Host::connect_as(b.port, Some("scada")).await;
    let node = rig(&a, |c| {
        c.mqtt.brokers = vec![a.url(), b.url()];
        c.mqtt.primary_host_id = "scada".into();
    })
    .await;
    host_a.until("NBIRTH on the first broker", T, is("NBIRTH")).await;
    // The host says offline on the first broker: NDEATH there, births on the second.
    host_a.publish("spBv1.0/STATE/scada", super::broker::state(false), true).await;
    host_a.until("NDEATH on the first broker", T, is("NDEATH")).await;
    host_b.until("NBIRTH on the second broker", T, is("NBIRTH")).await;
    host_b.until("DDATA on the second broker", T, is("DDATA")).await;
    let status = node.running.tools.call("get_device_status", serde_json::json!({})).await.unwrap().json();
    assert_eq!(status["northbound"]["broker"], b.url(), "{status}");
    node.running.stop().await.unwrap();

    // The first broker is gone: the node starts on the second.
    let mut a = a;
    a.stop().await;
    host_b.take();
    let seen = host_b.seen.len();
    let node = rig(&b, |c| c.mqtt.brokers = vec![a.url(), b.url()]).await;
    host_b.until("NBIRTH on the second broker after the first refused", T, |m| m.kind() == "NBIRTH").await;
    assert!(host_b.seen.len() > seen);
    node.running.stop().await.unwrap();
}

/// Two servers, and the primary host is already offline on the first (its retained STATE
/// says so): the edge node does not wait there, it tries the next, where the host is online.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_node_does_not_wait_where_the_host_is_already_offline() {
    let (a, b) = (Broker::start().await, Broker::start().await);
    let mut watcher_a = Host::connect_as(a.port, None).await;
    watcher_a.publish("spBv1.0/STATE/scada", super::broker::state(false), true).await;
    watcher_a
        .until("the host's offline STATE kept on the first broker", T, |m| m.topic == "spBv1.0/STATE/scada")
        .await;
    let mut host_b = Host::connect_as(b.port, Some("scada")).await;
    let node = rig(&a, |c| {
        c.mqtt.brokers = vec![a.url(), b.url()];
        c.mqtt.primary_host_id = "scada".into();
    })
    .await;
    host_b.until("NBIRTH on the second broker", T, is("NBIRTH")).await;
    watcher_a.take();
    assert!(!watcher_a.seen.iter().any(|m| m.kind() == "NBIRTH"), "nothing was born on the first");
    let status = node.running.tools.call("get_device_status", serde_json::json!({})).await.unwrap().json();
    assert_eq!(status["northbound"]["broker"], b.url(), "{status}");
    node.running.stop().await.unwrap();
}

/// A user name and password against a Mosquitto that checks them: a wrong password loses
/// nothing (the values wait in the buffer, and health says why); once the broker takes it,
/// every buffered value is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_loses_nothing_and_health_says_why() {
    let mut broker = Broker::start_auth("edge", "the-right-password").await;
    let auth_port = broker.auth.as_ref().unwrap().port;
    let sim = demo_sim().await;
    let devices = super::edge::fast_devices(&sim);
    let data = tempfile::tempdir().unwrap();
    let brokers = format!("[\"mqtt://127.0.0.1:{auth_port}\"]");
    let env = super::edge::auth_node_env(&brokers, "a-wrong-password");
    let mut served = crate::support::serve_binary(devices.path(), data.path(), &env).await;
    let stderr = served.drain_stderr();
    let addr = served.addr;
    let status = || async move {
        let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
        c.post("/v1/tools/get_device_status", b"{}").await.unwrap().json()
    };
    crate::support::wait_until("the refusal shown and values buffered", T, || async {
        let s = status().await;
        let nb = &s["data"]["northbound"];
        let refused = nb["link_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the broker refused this client: not authorized"));
        refused && nb["buffered"].as_u64() > Some(0)
    })
    .await;
    assert_eq!(super::outage::served_metric(addr, "fieldgate_sparkplug_connects_total").await, Some(0));

    // The broker's password file now holds the node's password: connected, and the buffer
    // drains, nothing dropped.
    broker.stop().await;
    broker.set_password("edge", "a-wrong-password");
    broker.restart().await;
    // (The node may be born before a test host could subscribe: its metrics say so.)
    crate::support::wait_until("connected once the password is taken", T, || async {
        super::outage::served_metric(addr, "fieldgate_sparkplug_online").await == Some(1)
    })
    .await;
    // Drained: every buffered value went, as historical or (a sensor's latest value) in its
    // device's DBIRTH; nothing dropped (checked below).
    crate::support::wait_until("the buffer drained", T, || async {
        super::outage::served_metric(addr, "fieldgate_sparkplug_buffered").await == Some(0)
    })
    .await;
    let s = status().await;
    assert_eq!(s["data"]["northbound"]["link_error"], serde_json::Value::Null, "{s}");
    assert_eq!(super::outage::served_metric(addr, "fieldgate_sparkplug_dropped_total").await, Some(0));
    let pid = served.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    crate::support::exited(&mut served.child, "fieldgate").await;
    let log = stderr.await.unwrap();
    assert!(
        !log.contains("a-wrong-password") && !log.contains("the-right-password"),
        "a password in the log"
    );
}

/// The CA and client certificate files are read again for every connection: the broker
/// moves to a new CA (new server and client certificates in the same files) and the node
/// reconnects without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_are_read_again_on_reconnect() {
    let mut broker = Broker::start_tls().await;
    let tls = broker.tls.as_ref().unwrap();
    let (ca, cert, key, port) = (tls.ca.clone(), tls.client_cert.clone(), tls.client_key.clone(), tls.port);
    let mut host = Host::connect(broker.port).await;
    let node = rig(&broker, |c| {
        c.mqtt.brokers = vec![format!("mqtts://127.0.0.1:{port}")];
        c.mqtt.ca_file = Some(ca.clone());
        c.mqtt.client_cert_file = Some(cert.clone());
        c.mqtt.client_key_file = Some(key.clone());
    })
    .await;
    host.until("NBIRTH over TLS", T, is("NBIRTH")).await;
    broker.stop().await;
    broker.rotate_tls();
    broker.restart().await;
    host = Host::connect(broker.port).await;
    host.until("NBIRTH under the new CA", T, is("NBIRTH")).await;
    assert_eq!(metric(&node.running.tools, "fieldgate_sparkplug_connects_total"), Some(2));
    node.running.stop().await.unwrap();
}
