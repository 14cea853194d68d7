//! The documented loss window of history after a crash (`kill -9`): at most one flush
//! interval plus the time one flush takes, checked against the real binary.

use std::time::Duration;

use fieldgate_sim::{Bind, Scenario, Simulator, Wave};

use super::support::*;

const FLUSH_MS: i64 = 200;
const POLL_MS: i64 = 50;
/// What a flush may take on a loaded CI box (an fsync behind other work), beyond the window.
const SLACK_MS: i64 = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_history_keeps_everything_older_than_one_flush_interval_plus_one_flush() {
    let file = GOOD.replace(
        "endpoint = \"127.0.0.1:5020\"",
        &format!("endpoint = \"ADDR\"\npoll_interval_ms = {POLL_MS}"),
    );
    let dir = device_dir(&[("t.toml", &file)]);
    let mut scenario = Scenario::default();
    // A value that changes at every poll, so every poll stores a point.
    scenario.sensors.insert("T_ZONE1_001".into(), Wave::Ramp { from: 0.0, to: 1e6, period_s: 1e4 });
    let sim =
        Simulator::start(fieldgate_sim::plant::load_dir(dir.path()).unwrap(), scenario, Bind::Ephemeral)
            .await
            .unwrap();
    let devices = device_dir(&[("t.toml", &file.replace("ADDR", &sim.addr("t-plc").unwrap().to_string()))]);
    let data = tempfile::tempdir().unwrap();
    let flush = FLUSH_MS.to_string();
    let mut served =
        serve_binary(devices.path(), data.path(), &[("FIELDGATE_STORAGE_FLUSH_INTERVAL_MS", &flush)]).await;
    served.drain_stderr();
    let mut child = served.child;
    // Let it poll and flush for a while (several flushes), then kill it without warning.
    let polls_before = sim.stats("t-plc").unwrap().requests;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while sim.stats("t-plc").unwrap().requests < polls_before + 20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(waited.await.is_ok(), "the device was not polled");
    let pid = child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    let killed_at = chrono::Utc::now().timestamp_millis();
    let _ = crate::support::exited(&mut child, "child").await;
    sim.shutdown().await;

    let store = fieldgate::store::history::HistoryStore::open_in(data.path()).unwrap();
    let points = store.points("T_ZONE1_001", 0, i64::MAX).unwrap();
    assert!(points.len() >= 10, "only {} points survived", points.len());
    let newest = points.iter().map(|p| p.t).max().unwrap();
    let lost_ms = killed_at - newest;
    assert!(
        lost_ms <= FLUSH_MS + POLL_MS + SLACK_MS,
        "points from the last {lost_ms} ms were lost (window: {FLUSH_MS} ms flush interval + one flush)"
    );
}
