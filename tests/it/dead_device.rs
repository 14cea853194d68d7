//! A dead device next to healthy ones: it holds up nobody, and a batch that touches it is
//! a partial result (or, when nothing is readable, an error with every detail).

use std::time::Duration;

use fieldgate::tools::ErrorCode;
use fieldgate_sim::Faults;
use serde_json::json;

use super::support::*;

/// The demo plant with the meter's timeout and the call deadline at a minute: a call to a
/// silent meter cannot end while the test runs.
async fn plant_with_a_meter_that_waits_a_minute() -> (Plant, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let mut text = std::fs::read_to_string(&path).unwrap();
        if path.ends_with("a-util-meter.toml") {
            text = text.replace("timeout_ms = 500", "timeout_ms = 60000");
        }
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    let mut config = fieldgate::config::Config::default();
    config.calls.deadline_ms = 60_000;
    let mut scenario = fieldgate_sim::Scenario::load(&root().join("simulator/scenarios/demo.toml")).unwrap();
    scenario.faults.clear();
    (plant_with(dir.path(), scenario, config).await, dir)
}

#[tokio::test]
async fn a_dead_device_does_not_delay_another() {
    let (plant, _dir) = plant_with_a_meter_that_waits_a_minute().await;
    // Warm both connections up so the comparison is between reads, not connects.
    assert!(plant.call("get_sensor_reading", json!({"sensor_id": "A_LINE1_001"})).await.ok);
    plant.faults("a-util-meter", Faults { no_reply: 1.0, ..Default::default() });
    let service = plant.service.clone();
    let slow = tokio::spawn(async move {
        service.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_001"})).await.unwrap()
    });
    wait_until("the meter to receive the call's request", Duration::from_secs(30), || {
        std::future::ready(plant.sim.stats("a-util-meter").unwrap().requests >= 1)
    })
    .await;
    // The healthy device answers while the meter's call is still waiting (it cannot end
    // within a minute): no ordering on time, only on what finished first.
    let fast = tokio::time::timeout(
        Duration::from_secs(30),
        plant.call("get_sensor_reading", json!({"sensor_id": "A_LINE1_001"})),
    )
    .await
    .expect("the healthy device's read is not held up by the dead one");
    assert!(fast.ok, "{:?}", fast.error);
    assert!(!slow.is_finished(), "the dead device's call cannot have ended yet");
    slow.abort();
}

#[tokio::test]
async fn a_batch_with_a_dead_device_is_partial() {
    let plant = demo_plant().await;
    plant.faults("a-util-meter", Faults { no_reply: 1.0, ..Default::default() });
    // In one batch: a partial result that names what failed.
    let e = plant
        .call("get_sensor_readings", json!({"sensor_ids": ["A_LINE1_001", "A_UTIL_001", "A_LINE1_002"]}))
        .await;
    assert!(e.ok);
    let data = e.json();
    assert_eq!(data["complete"], false);
    assert_eq!(data["readings"].as_array().unwrap().len(), 2);
    assert_eq!(data["failed"][0]["sensor_id"], "A_UTIL_001");
    // Three more timeouts in this call open the breaker (five in a row), so the last
    // attempt may already be refused by it: both are retryable device errors.
    let code = data["failed"][0]["error"]["code"].as_str().unwrap().to_string();
    assert!(code == "DEVICE_TIMEOUT" || code == "CIRCUIT_OPEN", "{code}");
    assert_eq!(data["failed"][0]["error"]["retryable"], true);
    assert_eq!(data["failed"][0]["error"]["parameter"], "sensor_ids/1");
}

#[tokio::test]
async fn a_batch_with_nothing_readable_fails_with_details() {
    let plant = demo_plant().await;
    plant.faults("a-util-meter", Faults { down: true, ..Default::default() });
    plant.faults(
        "b-oven2-opcua",
        Faults { exception_code: Some(2), exception_rate: 1.0, ..Default::default() },
    );
    let e = plant
        .call("get_sensor_readings", json!({"sensor_ids": ["A_UTIL_001", "A_UTIL_002", "B_OVEN2_001"]}))
        .await;
    let err = e.error.unwrap();
    assert_eq!(err.details.len(), 3, "{err:?}");
    assert_eq!(err.code, ErrorCode::DeviceUnavailable);
    assert!(err.details[2].message.starts_with("DEVICE_REJECTED"), "{:?}", err.details[2]);
}
