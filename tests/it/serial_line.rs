//! A serial RTU line must stay quiet after a timeout (a late reply may still arrive):
//! calls queued behind it wait for the line within their deadlines and blame nobody.
//! Counts and outcomes, and that a queued call is not failed before its deadline (a lower
//! bound, which load cannot break).

use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::tools::{ErrorCode, ToolService};
use fieldgate_sim::{Faults, Scenario, Wave};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::support::*;

async fn status(service: &ToolService, device: &str) -> Value {
    let e = service.call("get_device_status", json!({"device_id": device})).await.unwrap();
    e.json()["devices"][0].clone()
}

const SERIAL: &str = r#"id = "s-rtu"
plant = "S"
zone = "BUS1"
description = "RTU on a serial line"
protocol = "modbus-rtu"
endpoint = "/dev/ttyUSB0"
unit_id = 5
timeout_ms = TIMEOUT
poll_interval_ms = 0

[serial]
baud_rate = 19200

[[sensors]]
id = "S_BUS1_001"
description = "Flow"
kind = "flow"
unit = "m3/h"
table = "holding"
address = 0
type = "f32"

[[sensors]]
id = "S_BUS1_002"
description = "Temperature"
kind = "temperature"
unit = "degC"
table = "input"
address = 3
type = "i16"
scale = 0.1

[[sensors]]
id = "S_BUS1_003"
description = "Pressure"
kind = "pressure"
unit = "bar"
table = "holding"
address = 10
type = "f32"
"#;

/// A serial RTU device with `timeout_ms`, whose first request stalls the line until just
/// before that timeout; the fault is cleared as soon as the stall began, so only that
/// request goes unanswered.
async fn serial_line(timeout_ms: u64, deadline_ms: u64) -> (tempfile::TempDir, Plant) {
    let dir = device_dir(&[("s.toml", &SERIAL.replace("TIMEOUT", &timeout_ms.to_string()))]);
    let mut scenario = Scenario::default();
    scenario.sensors.insert("S_BUS1_001".into(), Wave::Constant { value: 12.5 });
    scenario.sensors.insert("S_BUS1_002".into(), Wave::Constant { value: -4.0 });
    scenario.sensors.insert("S_BUS1_003".into(), Wave::Constant { value: 3.25 });
    let mut config = Config::default();
    config.calls.deadline_ms = deadline_ms;
    config.calls.retry_backoff_ms = 10;
    let plant = plant_with(dir.path(), scenario, config).await;
    plant.faults("s-rtu", Faults { stall: 1.0, stall_ms: timeout_ms - 50, ..Default::default() });
    (dir, plant)
}

/// Clears the line's stall once the simulator has stalled one request.
async fn clear_after_first_stall(plant: &Plant) {
    wait_for("the first request to stall", || plant.sim.stats("s-rtu").is_some_and(|s| s.stalls >= 1)).await;
    plant.sim.set_faults("s-rtu", Faults::default()).unwrap();
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < until, "waited 20 s for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn read_all_three(service: &ToolService) -> Vec<(String, fieldgate::tools::Envelope, Duration)> {
    let mut calls = JoinSet::new();
    for id in ["S_BUS1_001", "S_BUS1_002", "S_BUS1_003"] {
        let s = service.clone();
        calls.spawn(async move {
            let started = std::time::Instant::now();
            let e = s.call("get_sensor_reading", json!({"sensor_id": id})).await.unwrap();
            (id.to_string(), e, started.elapsed())
        });
    }
    let mut out = Vec::new();
    while let Some(r) = calls.join_next().await {
        out.push(r.unwrap());
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_calls_queued_behind_a_timeout_wait_for_the_quiet_line_and_are_answered() {
    // Timeout 300 ms, the line quiet 300 ms after it; a 4 s deadline leaves room for all.
    let (_dir, plant) = serial_line(300, 4000).await;
    let (answers, ()) = tokio::join!(read_all_three(&plant.service), clear_after_first_stall(&plant));
    let want = [12.5, -4.0, 3.25];
    for ((id, e, _), want) in answers.iter().zip(want) {
        assert!(e.ok, "{id}: {:?}", e.error);
        assert_eq!(e.json()["value"].as_f64(), Some(want), "{id}");
    }
    let d = status(&plant.service, "s-rtu").await;
    assert_eq!(d["failures"], 1, "the one unanswered request is the only failure: {d}");
    assert_eq!(d["breaker"]["state"], "closed", "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_call_the_quiet_line_outlasts_fails_only_at_its_deadline_and_blames_nobody() {
    // Timeout 800 ms: the line stays quiet until 1.6 s, past the 1.2 s deadline of the
    // calls queued behind the first.
    let deadline = Duration::from_millis(1200);
    let (_dir, plant) = serial_line(800, deadline.as_millis() as u64).await;
    let (answers, ()) = tokio::join!(read_all_three(&plant.service), clear_after_first_stall(&plant));
    let requests_before = plant.sim.stats("s-rtu").unwrap().requests;
    for (id, e, took) in &answers {
        let err = e.error.as_ref().unwrap_or_else(|| panic!("{id} answered while the line was quiet"));
        assert_eq!((err.code, err.retryable), (ErrorCode::DeviceTimeout, true), "{id}: {err:?}");
        // Nobody was failed before its deadline was spent (only load can make this longer).
        assert!(*took >= deadline - Duration::from_millis(20), "{id} failed after {took:?}");
    }
    let d = status(&plant.service, "s-rtu").await;
    assert_eq!(d["failures"], 1, "only the unanswered request counts: {d}");
    // Nothing was sent on the quiet line, and it serves again once quiet.
    assert_eq!(requests_before, 1, "requests sent while the line had to stay quiet");
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "S_BUS1_002"})).await;
    assert!(e.ok, "{:?}", e.error);
}
