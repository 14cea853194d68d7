//! A broker's other clients misbehaving towards the edge node.

use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, QoS};

use super::broker::{Broker, counter};
use super::edge::rig;

const T: Duration = Duration::from_secs(20);

/// Publishes `payload` retained on `topic` with a client of its own that may send large
/// messages, and waits until the broker has it.
async fn publish_retained(port: u16, topic: &str, payload: Vec<u8>) {
    let mut o = MqttOptions::new(format!("poisoner-{port}"), "127.0.0.1", port);
    o.set_max_packet_size(1 << 20, 16 << 20);
    let (client, mut events) = AsyncClient::new(o, 8);
    client.publish(topic, QoS::AtLeastOnce, true, payload).await.unwrap();
    let deadline = tokio::time::Instant::now() + T;
    loop {
        match tokio::time::timeout_at(deadline, events.poll()).await.expect("the broker acknowledges") {
            Ok(Event::Incoming(Incoming::PubAck(_))) => break,
            Ok(_) => {}
            Err(e) => panic!("publishing the poison failed: {e}"),
        }
    }
    let _ = client.disconnect().await;
}

/// A retained command too large for the edge node drops every connection right after it
/// is made; fieldgate must back off between such connections as between failed ones (one
/// that lives only a moment does not reset the backoff), not reconnect in a tight loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_oversized_command_does_not_make_a_reconnect_storm() {
    let broker = Broker::start().await;
    let rig = rig(&broker, |c| c.mqtt.reconnect_max_ms = 10_000).await;
    let tools = rig.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v == 1).await;
    publish_retained(broker.port, "spBv1.0/plant/DCMD/gw/a-line1-plc", vec![0u8; 2 << 20]).await;
    // Connections 2..6 die at once; the waits before them grow: 100 ms doubled each time
    // (jittered to between half and all of it), so the one before the sixth is >= 0.8 s.
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v >= 5).await;
    let fifth = Instant::now();
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v >= 6).await;
    let gap = fifth.elapsed();
    assert!(gap >= Duration::from_millis(500), "reconnected {gap:?} after a connection that died at once");
    rig.running.stop().await.unwrap();
}
