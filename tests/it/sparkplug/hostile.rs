//! A broker's other clients misbehaving towards the edge node.

use std::time::Duration;

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

/// Regression (issue 32): a retained command too large for the edge node dropped every
/// connection right after it was made (9 NDEATH/rebirth cycles a minute). rumqttc cannot
/// skip such a message, so the first connection is lost; the next ones leave the command
/// topics out, and the node stays online with data flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_oversized_command_costs_one_reconnect_and_data_keeps_flowing() {
    let broker = Broker::start().await;
    let rig = rig(&broker, |c| c.mqtt.reconnect_max_ms = 10_000).await;
    let tools = rig.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v == 1).await;
    publish_retained(broker.port, "spBv1.0/plant/DCMD/gw/a-line1-plc", vec![0u8; 2 << 20]).await;
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v >= 2).await;
    counter(&tools, "fieldgate_sparkplug_online", T, |v| v == 1).await;
    // Online again: a good while of data later, still the second connection.
    let sent = counter(&tools, "fieldgate_sparkplug_metrics_sent_total", T, |_| true).await;
    counter(&tools, "fieldgate_sparkplug_metrics_sent_total", T, |v| v >= sent + 200).await;
    let connects = counter(&tools, "fieldgate_sparkplug_connects_total", T, |_| true).await;
    assert_eq!(connects, 2, "one reconnect, no flapping");
    assert_eq!(super::broker::metric(&tools, "fieldgate_sparkplug_online"), Some(1));
    rig.running.stop().await.unwrap();
}

/// Regression (review of issue 32): after the pause that follows an oversized command,
/// commands were subscribed again only on a reconnect, which a stable link never makes.
/// Once the retained message is removed and the pause is over, a rebirth asked by NCMD is
/// done on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_taken_again_after_the_pause_on_the_same_connection() {
    let broker = Broker::start().await;
    let rig = rig(&broker, |c| c.mqtt.commands_pause_s = 1).await;
    let tools = rig.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v == 1).await;
    let ncmd = "spBv1.0/plant/NCMD/gw";
    publish_retained(broker.port, ncmd, vec![0u8; 2 << 20]).await;
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v >= 2).await;
    counter(&tools, "fieldgate_sparkplug_online", T, |v| v == 1).await;
    // As Eclipse Tahu encodes it.
    let scratch = tempfile::tempdir().unwrap();
    let rebirth = std::fs::read(super::conformance::tahu_rebirth(scratch.path())).unwrap();
    // Retained (replacing the oversized one), so that it reaches the node as soon as its
    // command subscription is back.
    publish_retained(broker.port, ncmd, rebirth).await;
    counter(&tools, "fieldgate_sparkplug_rebirths_total", T, |n| n >= 1).await;
    assert_eq!(
        super::broker::metric(&tools, "fieldgate_sparkplug_connects_total"),
        Some(2),
        "no reconnect needed"
    );
    rig.running.stop().await.unwrap();
}

/// When each of the next `n` connections was made (by the connects counter), from now.
async fn connect_times(tools: &fieldgate::tools::ToolService, from: u64, n: u64) -> Vec<std::time::Instant> {
    let mut at = Vec::new();
    for k in from..from + n {
        counter(tools, "fieldgate_sparkplug_connects_total", T, |v| v >= k).await;
        at.push(std::time::Instant::now());
    }
    at
}

/// A retained oversized NCMD that is still there when commands are subscribed again after the
/// pause: each pause is twice the last (1 s, 2 s, ...), not one drop every pause forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_stays_oversized_doubles_the_pause_each_time() {
    let broker = Broker::start().await;
    let rig = rig(&broker, |c| c.mqtt.commands_pause_s = 1).await;
    let tools = rig.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_connects_total", T, |v| v == 1).await;
    publish_retained(broker.port, "spBv1.0/plant/NCMD/gw", vec![0u8; 2 << 20]).await;
    let at = connect_times(&tools, 2, 3).await;
    let gap = at[2] - at[1];
    assert!(gap >= Duration::from_millis(1800), "the second pause is 2 s, not 1 s: {gap:?}");
    rig.running.stop().await.unwrap();
}

/// A retained oversized STATE of the primary host: the node cannot do without STATE, so it
/// does not connect again at once to take it again: it waits a pause, twice as long each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_state_holds_the_next_connection_for_a_doubling_pause() {
    let broker = Broker::start().await;
    publish_retained(broker.port, "spBv1.0/STATE/scada", vec![0u8; 2 << 20]).await;
    let rig = rig(&broker, |c| {
        c.mqtt.commands_pause_s = 1;
        c.mqtt.primary_host_id = "scada".into();
    })
    .await;
    let tools = rig.running.tools.clone();
    // 1: commands and STATE (the drop is taken for a command); 2: STATE only, at once;
    // 3: a pause (1 s) later; 4: two pauses (2 s) after that.
    let at = connect_times(&tools, 1, 4).await;
    let (second, third) = (at[2] - at[1], at[3] - at[2]);
    assert!(second >= Duration::from_millis(900), "held for the pause: {second:?}");
    assert!(third >= Duration::from_millis(1800), "then twice the pause: {third:?}");
    assert_eq!(
        super::broker::metric(&tools, "fieldgate_sparkplug_online"),
        Some(0),
        "never born without STATE"
    );
    rig.running.stop().await.unwrap();
}
