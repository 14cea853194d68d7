//! A broker whose ACL forbids the node's topics drops its messages without telling it
//! (Mosquitto on MQTT 3.1.1 even acknowledges them). The node finds out because its own
//! NBIRTH does not come back (`run/echo.rs`): nothing is lost, it waits in the buffer, and
//! `get_device_status` says why; once the ACL allows the topics, the buffer drains.

use std::time::Duration;

use serde_json::Value;

use super::broker::Broker;
use super::outage::served_metric;

const T: Duration = Duration::from_secs(30);

/// The node may not publish in its group; it may read its own NBIRTH topic (where a
/// spoofer publishes too) and STATE.
const FORBIDDEN: &str = "user edge\ntopic readwrite spBv1.0/STATE/#\ntopic read spBv1.0/plant/NBIRTH/gw\n";

/// Another client of the broker publishes NBIRTHs on the node's topic with every `bdSeq`
/// the node may use, one of them retained: none may pass for the node's own.
fn spoof(port: u16) -> tokio::task::JoinHandle<()> {
    use fieldgate::spb::payload::{Metric, Payload, Value, datatype};
    tokio::spawn(async move {
        let o = rumqttc::MqttOptions::new(format!("spoofer-{port}"), "127.0.0.1", port);
        let (client, mut events) = rumqttc::AsyncClient::new(o, 64);
        tokio::spawn(async move { while events.poll().await.is_ok() {} });
        let birth = |bd_seq: u64| {
            let m = Metric::new(Some("bdSeq"), None, datatype::INT64, Some(Value::Long(bd_seq)));
            Payload { timestamp: Some(0), seq: Some(0), metrics: vec![m], ..Payload::default() }
                .encode_to_bytes()
        };
        let topic = "spBv1.0/plant/NBIRTH/gw";
        let _ = client.publish(topic, rumqttc::QoS::AtLeastOnce, true, birth(0)).await;
        loop {
            for bd_seq in 0..8 {
                let _ = client.publish(topic, rumqttc::QoS::AtMostOnce, false, birth(bd_seq)).await;
            }
            // Paced by the broker's round trips, not by a clock the test waits on.
            let _ = client.publish("spBv1.0/STATE/nobody", rumqttc::QoS::AtLeastOnce, false, "x").await;
            tokio::task::yield_now().await;
        }
    })
}
const ALLOWED: &str = "user edge\ntopic readwrite spBv1.0/#\n";

async fn status(addr: std::net::SocketAddr) -> Value {
    let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
    c.post("/v1/tools/get_device_status", b"{}").await.unwrap().json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_topic_loses_nothing_and_health_says_why() {
    let mut broker = Broker::start_auth("edge", "the-password").await;
    broker.set_acl(FORBIDDEN);
    broker.stop().await;
    broker.restart().await;
    let spoofer = spoof(broker.port);
    let auth_port = broker.auth.as_ref().unwrap().port;
    let sim = super::edge::demo_sim().await;
    let devices = super::edge::fast_devices(&sim);
    let data = tempfile::tempdir().unwrap();
    let brokers = format!("[\"mqtt://127.0.0.1:{auth_port}\"]");
    let mut env = super::edge::auth_node_env(&brokers, "the-password");
    env.push(("FIELDGATE_MQTT_CONFIRM_BIRTH_S", "1"));
    let mut served = crate::support::serve_binary(devices.path(), data.path(), &env).await;
    let _log = served.drain_stderr();
    let addr = served.addr;
    // Connected (the password is right), but the NBIRTH never comes back: not online, the
    // values buffered, and the status says why.
    crate::support::wait_until("the dropped NBIRTH shown and values buffered", T, || async {
        let s = status(addr).await;
        let nb = &s["data"]["northbound"];
        let said = nb["link_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the broker did not deliver this node's NBIRTH back"));
        said && nb["buffered"].as_u64() > Some(0)
    })
    .await;
    assert!(served_metric(addr, "fieldgate_sparkplug_connects_total").await > Some(0), "it did connect");
    assert_eq!(served_metric(addr, "fieldgate_sparkplug_online").await, Some(0));
    assert_ne!(status(addr).await["data"]["northbound"]["link"], "online");

    // The ACL allows the node's topics: online, the buffer drains, nothing dropped.
    spoofer.abort();
    broker.set_acl(ALLOWED);
    broker.stop().await;
    broker.restart().await;
    crate::support::wait_until("online once the ACL allows it", T, || async {
        served_metric(addr, "fieldgate_sparkplug_online").await == Some(1)
    })
    .await;
    crate::support::wait_until("the buffer drained", T, || async {
        served_metric(addr, "fieldgate_sparkplug_buffered").await == Some(0)
    })
    .await;
    let s = status(addr).await;
    assert_eq!(s["data"]["northbound"]["link_error"], Value::Null, "{s}");
    assert_eq!(served_metric(addr, "fieldgate_sparkplug_dropped_total").await, Some(0));
}
