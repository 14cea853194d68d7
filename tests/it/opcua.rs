//! OPC UA readings through the tools from the simulator's OPC UA server on a real
//! loopback socket: values and types, status codes, a server that goes away.

use super::support::*;
use fieldgate::registry::SensorSource;
use fieldgate::tools::ErrorCode;
use fieldgate_sim::{Faults, SimValue};
use serde_json::json;

fn opcua_sensors() -> Vec<String> {
    demo_registry()
        .sensors()
        .iter()
        .filter(|s| matches!(s.source, SensorSource::OpcUa { .. }))
        .map(|s| s.id.to_string())
        .collect()
}

#[tokio::test]
async fn every_demo_opcua_sensor_reads_the_simulators_value() {
    let plant = demo_plant().await;
    let sensors = opcua_sensors();
    assert_eq!(sensors.len(), 8);
    for t in [0.0, 37.25, 1234.5] {
        plant.sim.freeze(Some(t));
        for id in &sensors {
            let e = plant.call("get_sensor_reading", json!({ "sensor_id": id })).await;
            assert!(e.ok, "{id}: {:?}", e.error);
            let data = e.json();
            assert_eq!(data["source"], "live", "{id}");
            assert_eq!(data["quality"], "good", "{id}");
            let got = &data["value"];
            match plant.sim.expected(id).unwrap() {
                SimValue::Num(w) => {
                    let g = got.as_f64().unwrap_or_else(|| panic!("{id}: {got}"));
                    assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{id}: read {g}, simulator serves {w}");
                }
                SimValue::Bool(w) => assert_eq!(got.as_bool(), Some(w), "{id}"),
                SimValue::Text(w) => assert_eq!(got.as_str(), Some(w.as_str()), "{id}"),
            }
        }
    }
    assert!(plant.sim.opcua_reads() >= 24, "reads went to the OPC UA server");
}

#[tokio::test]
async fn a_batch_reads_all_opcua_sensors_in_one_call() {
    let plant = demo_plant().await;
    let sensors = opcua_sensors();
    let before = plant.sim.opcua_reads();
    let e = plant.call("get_sensor_readings", json!({ "sensor_ids": sensors })).await;
    assert!(e.ok, "{:?}", e.error);
    assert_eq!(e.json()["readings"].as_array().map(Vec::len), Some(8));
    assert_eq!(plant.sim.opcua_reads() - before, 8, "one value read per node");
}

#[tokio::test]
async fn status_codes_map_to_busy_rejected_and_unavailable() {
    let plant = demo_plant().await;
    plant.faults(
        "b-oven2-opcua",
        Faults { exception_code: Some(6), exception_rate: 1.0, ..Default::default() },
    );
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceBusy, true));

    plant.faults(
        "b-oven2-opcua",
        Faults { exception_code: Some(2), exception_rate: 1.0, ..Default::default() },
    );
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceRejected, false));
    assert!(err.message.contains("BadNodeIdUnknown"), "{}", err.message);
    assert!(err.hint.contains("node ns=2;s=Oven2.Zone3.Temperature"), "{}", err.hint);

    plant.faults("b-oven2-opcua", Faults { down: true, ..Default::default() });
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceUnavailable, true));

    plant.faults("b-oven2-opcua", Faults::default());
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    assert!(e.ok, "{:?}", e.error);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_unavailable_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(demo_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    // A port nothing listens on: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    registry
        .override_opcua_endpoints([("b-oven2-opcua".to_string(), format!("opc.tcp://127.0.0.1:{port}/"))]);
    let service = fieldgate::tools::ToolService::new(std::sync::Arc::new(registry), Default::default());
    let started = std::time::Instant::now();
    let e = service.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001"})).await.unwrap();
    let err = e.error.unwrap();
    assert!(matches!(err.code, ErrorCode::DeviceUnavailable | ErrorCode::DeviceTimeout), "{err:?}");
    assert!(err.retryable);
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_restarted_server_gets_a_new_session_and_values_flow_again() {
    let mut plant = demo_plant().await;
    let read = json!({"sensor_id": "B_OVEN2_001"});
    assert!(plant.call("get_sensor_reading", read.clone()).await.ok);
    plant.sim.restart_opcua("b-oven2-opcua").await.unwrap();
    // The old session died with the server. The first call after the restart may still
    // meet it (a retryable error) but must not hang; within the next call values flow.
    let mut answers = Vec::new();
    for _ in 0..2 {
        let e = plant.call("get_sensor_reading", read.clone()).await;
        if e.ok {
            break;
        }
        let err = e.error.unwrap();
        assert!(err.retryable, "{err:?}");
        answers.push(err.code);
    }
    assert!(answers.len() < 2, "no value after a restart: {answers:?}");
    let e = plant.call("get_sensor_reading", read).await;
    assert!(e.ok, "{:?}", e.error);
    assert_eq!(e.json()["source"], "live");
}

#[tokio::test]
async fn a_secured_endpoint_is_refused_as_not_yet_supported_not_as_a_passing_failure() {
    let oven = std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml"))
        .unwrap()
        .replace("security_policy = \"None\"", "security_policy = \"Basic256Sha256\"")
        .replace("security_mode = \"None\"", "security_mode = \"SignAndEncrypt\"");
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let service = fieldgate::tools::ToolService::new(std::sync::Arc::new(registry), Default::default());
    let e = service.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001"})).await.unwrap();
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceRejected, false));
    assert!(err.message.contains("signing, encryption"), "{}", err.message);
}
