//! The edge node in a real `fieldgate serve` process: `kill -9` leaves the broker to send
//! the NDEATH registered as the will, with the bdSeq of the NBIRTH; a restart sends a new
//! bdSeq and births.

use std::time::Duration;

use super::broker::{Broker, Host};
use super::edge::{bd_seq, demo_sim};
use crate::support;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_leaves_the_will_ndeath_and_a_restart_births_with_a_new_bd_seq() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let sim = demo_sim().await;
    let devices = support::demo_devices_for(&sim);
    let data = tempfile::tempdir().unwrap();
    let brokers = format!("[\"{}\"]", broker.url());
    let env = super::edge::node_env(&brokers);
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = served.drain_stderr();
    let birth = host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    host.until("DBIRTH", T, |m| m.kind() == "DBIRTH").await;

    served.child.start_kill().unwrap();
    crate::support::exited(&mut served.child, "served").await;
    let death = host.until("NDEATH from the will", T, |m| m.kind() == "NDEATH").await;
    assert_eq!(death.topic, "spBv1.0/plant/NDEATH/gw");
    assert_eq!(bd_seq(&death), bd_seq(&birth), "the will carries the NBIRTH's bdSeq");
    assert_eq!(death.payload.seq, None);

    let mut again = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = again.drain_stderr();
    let rebirth = host.until("NBIRTH after the restart", T, |m| m.kind() == "NBIRTH").await;
    assert_eq!(bd_seq(&rebirth), (bd_seq(&birth) + 1) % 256, "a new bdSeq, kept across restarts");
    assert_eq!(rebirth.payload.seq, Some(0));
    host.until("DBIRTH after the restart", T, |m| m.kind() == "DBIRTH").await;
    host.until("DDATA after the restart", T, |m| m.kind() == "DDATA").await;
    again.child.start_kill().unwrap();
    let _ = crate::support::exited(&mut again.child, "again").await;
}

#[tokio::test]
async fn a_damaged_buffer_file_is_refused_with_what_to_do() {
    let closed = support::ClosedPort::new();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("sparkplug.redb"), vec![0x5a; 64 * 1024]).unwrap();
    let mut c = fieldgate::config::Config::default();
    c.storage.data_dir = data.path().to_path_buf();
    c.mqtt.brokers = vec![format!("mqtt://{}", closed.addr())];
    let options = fieldgate::app::Options {
        listen: None,
        listen_required: false,
        tokens: std::sync::Arc::new(fieldgate::transport::auth::Tokens::default()),
        mode: "serve",
    };
    let Err(e) = fieldgate::app::start(c, support::demo_registry(), options).await else {
        panic!("a damaged buffer must not be half-trusted");
    };
    let e = e.to_string();
    assert!(e.contains("sparkplug.redb") && e.contains("damaged") && e.contains("move it aside"), "{e}");
}

/// `kill -9` in the middle of a drain: a buffer of 200,000 values left by an outage is
/// being sent when the process dies; after a restart the drain goes on. Every value
/// arrives (a value leaves the buffer only once the MQTT client has written it: one still
/// in the client's queue at the kill is sent by the next life), each life's in order; the
/// only repeats are the last values the first life sent (written, their removal not yet
/// durable), again with their own timestamps, so a host that keys values by metric and
/// time drops them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_drain_loses_nothing_and_repeats_only_the_last_values_sent() {
    use fieldgate::sparkplug::buffer::{Buffer, Rec};
    use fieldgate::spb::payload::Value;
    use fieldgate::store::gorilla::Stored;
    const N: usize = 200_000;
    let data = tempfile::tempdir().unwrap();
    let start = chrono::Utc::now().timestamp_millis() - 900_000;
    {
        let path = data.path().join(fieldgate::sparkplug::buffer::FILE);
        let mut b = Buffer::open(&path, 1 << 30, 86_400_000).unwrap();
        for k in 0..N {
            let value = Stored::Float(2_000_000.0 + k as f64);
            b.push(Rec { sensor: "A_LINE1_001".into(), t: start + k as i64, value, quality: 0 });
        }
        b.flush(start + 900_000).unwrap();
    }
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let sim = demo_sim().await;
    let devices = support::demo_devices_for(&sim);
    let brokers = format!("[\"{}\"]", broker.url());
    let mut env = super::edge::node_env(&brokers);
    env.push(("FIELDGATE_STORAGE_FLUSH_INTERVAL_MS", "200"));
    // The drained values of A_LINE1_001 (k of each) in `seen`, in arrival order.
    let drained = |seen: &[super::broker::Msg]| -> Vec<(usize, u64)> {
        seen.iter()
            .filter(|m| m.kind() == "DDATA")
            .flat_map(|m| &m.payload.metrics)
            .filter(|m| m.is_historical == Some(true))
            .filter_map(|m| match m.value {
                Some(Value::Float(f)) if f >= 2_000_000.0 => Some(((f - 2_000_000.0) as usize, m.timestamp?)),
                _ => None,
            })
            .collect()
    };
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = served.drain_stderr();
    host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    while drained(&host.seen).len() < 2_000 {
        host.until("drained values", T, |m| m.kind() == "DDATA").await;
    }
    served.child.start_kill().unwrap();
    support::exited(&mut served.child, "fieldgate killed mid-drain").await;
    host.until("NDEATH from the will", T, |m| m.kind() == "NDEATH").await;
    host.take();
    let first = drained(&host.seen);
    assert!(first.len() < N, "the drain ended before the kill: make N larger");
    let split = host.seen.len();

    let mut again = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = again.drain_stderr();
    host.until("NBIRTH after the restart", T, |m| m.kind() == "NBIRTH").await;
    let got_all =
        |seen: &[super::broker::Msg]| drained(&seen[split..]).last().is_some_and(|(k, _)| *k == N - 1);
    while !got_all(&host.seen) {
        host.until("the rest of the drain", T, |m| m.kind() == "DDATA").await;
    }
    let second = drained(&host.seen[split..]);
    for (life, got) in [("first", &first), ("second", &second)] {
        assert!(got.windows(2).all(|w| w[0].0 + 1 == w[1].0), "the {life} life sent in order, no gap");
        assert!(got.iter().all(|(k, t)| *t == (start + *k as i64) as u64), "each value with its own time");
    }
    assert_eq!(first[0].0, 0, "the drain starts at the oldest");
    let (last, resumed) = (first.last().unwrap().0, second[0].0);
    assert!(resumed <= last + 1, "nothing lost between the lives: {last} then {resumed}");
    let repeated = last + 1 - resumed;
    eprintln!("kill -9 mid-drain: {} sent before, {repeated} sent again after the restart", first.len());
    // What the host had before the kill is a prefix of the whole; what comes again is the
    // first life's last values (sent since its buffer's last durable write), not older ones.
    assert!(repeated <= first.len(), "only values the first life sent are repeated");
    again.child.start_kill().unwrap();
    support::exited(&mut again.child, "fieldgate").await;
}
