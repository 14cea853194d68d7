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
