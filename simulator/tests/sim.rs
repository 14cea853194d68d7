//! The simulator on its own: served values, faults, the control API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use fieldgate_sim::plant::Device;
use fieldgate_sim::{Bind, Faults, Scenario, SimValue, Simulator, Wave};
use tokio_modbus::client::Reader;
use tokio_modbus::prelude::{Slave, SlaveContext};
use tower::ServiceExt;

fn plant() -> BTreeMap<String, Device> {
    let text = r#"
id = "d1"
protocol = "modbus-tcp"
endpoint = "127.0.0.1:1"
unit_id = 4
word_order = "CDAB"

[[sensors]]
id = "X_Y_001"
table = "holding"
address = 10
type = "f32"

[[sensors]]
id = "X_Y_002"
table = "input"
address = 0
type = "i16"
scale = 0.1

[[sensors]]
id = "X_Y_003"
table = "holding"
address = 12
type = "bool"
bit = 2
"#;
    let d: Device = toml::from_str(text).unwrap();
    BTreeMap::from([(d.id.clone(), d)])
}

async fn sim() -> Simulator {
    let mut s = Scenario::default();
    s.sensors.insert("X_Y_001".into(), Wave::Constant { value: 123.456 });
    s.sensors.insert("X_Y_002".into(), Wave::Ramp { from: 0.0, to: 100.0, period_s: 100.0 });
    s.sensors.insert("X_Y_003".into(), Wave::Constant { value: 1.0 });
    Simulator::start(plant(), s, Bind::Ephemeral).await.unwrap()
}

#[tokio::test]
async fn serves_encoded_values_on_a_free_port() {
    let sim = sim().await;
    sim.freeze(Some(25.0));
    let addr = sim.addr("d1").unwrap();
    assert_ne!(addr.port(), 0);
    let mut ctx = tokio_modbus::client::tcp::connect_slave(addr, Slave(4)).await.unwrap();
    // CDAB: the low word of 123.456f32 (0x42F6E979) first.
    assert_eq!(ctx.read_holding_registers(10, 2).await.unwrap().unwrap(), [0xE979, 0x42F6]);
    // Ramp at t=25 of 0..100 over 100 s = 25.0, scale 0.1: register 250.
    assert_eq!(ctx.read_input_registers(0, 1).await.unwrap().unwrap(), [250]);
    assert_eq!(ctx.read_holding_registers(12, 1).await.unwrap().unwrap(), [0b100]);
    assert_eq!(sim.expected("X_Y_002"), Some(SimValue::Num(25.0)));
    // Another unit on this TCP endpoint is a gateway error.
    ctx.set_slave(Slave(9));
    assert!(ctx.read_holding_registers(10, 2).await.unwrap().is_err());
    // Out of the table: illegal data address.
    ctx.set_slave(Slave(4));
    assert!(ctx.read_holding_registers(65535, 2).await.unwrap().is_err());
}

#[tokio::test]
async fn down_refuses_connections_and_up_serves_again() {
    let sim = sim().await;
    let addr = sim.addr("d1").unwrap();
    sim.set_faults("d1", Faults { down: true, ..Default::default() }).unwrap();
    let mut refused = false;
    for _ in 0..100 {
        // While the listener closes, a queued connection may be reset instead.
        if let Err(e) = tokio::net::TcpStream::connect(addr).await
            && e.kind() == std::io::ErrorKind::ConnectionRefused
        {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the listener should close");
    sim.set_faults("d1", Faults::default()).unwrap();
    let mut served = false;
    for _ in 0..100 {
        if let Ok(mut ctx) = tokio_modbus::client::tcp::connect_slave(addr, Slave(4)).await {
            served = ctx.read_input_registers(0, 1).await.is_ok_and(|r| r.is_ok());
            if served {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served, "the device should listen again on the same port");
}

#[tokio::test]
async fn a_connection_limit_closes_extra_connections() {
    let sim = sim().await;
    sim.set_faults("d1", Faults { max_connections: Some(1), ..Default::default() }).unwrap();
    let addr = sim.addr("d1").unwrap();
    let mut first = tokio_modbus::client::tcp::connect_slave(addr, Slave(4)).await.unwrap();
    assert!(first.read_input_registers(0, 1).await.unwrap().is_ok());
    let mut second = tokio_modbus::client::tcp::connect_slave(addr, Slave(4)).await.unwrap();
    assert!(second.read_input_registers(0, 1).await.is_err(), "the second connection is closed at once");
    let stats = sim.stats("d1").unwrap();
    assert_eq!((stats.accepted, stats.refused_over_limit, stats.max_open), (1, 1, 1));
}

#[tokio::test]
async fn invalid_faults_are_refused() {
    let sim = sim().await;
    for bad in [
        Faults { no_reply: 1.5, ..Default::default() },
        Faults { exception_rate: 0.5, ..Default::default() },
        Faults { max_connections: Some(0), ..Default::default() },
    ] {
        assert!(sim.set_faults("d1", bad).is_err());
    }
    assert!(sim.set_faults("nope", Faults::default()).is_err());
}

async fn send(app: &axum::Router, method: &str, uri: &str, body: &str) -> (StatusCode, serde_json::Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = to_bytes(res.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

#[tokio::test]
async fn control_api_changes_faults_and_reports_values() {
    let sim = Arc::new(sim().await);
    let app = fieldgate_sim::control::router(sim.clone());
    let (status, body) = send(&app, "GET", "/devices", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["devices"][0]["id"], "d1");

    let (status, body) = send(
        &app,
        "PUT",
        "/devices/d1/faults",
        r#"{"latency_ms": 20, "exception_code": 6, "exception_rate": 0.5}"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(sim.faults("d1").unwrap().latency_ms, 20);
    assert_eq!(sim.faults("d1").unwrap().exception_code, Some(6));

    // Changing one fault keeps the others (merge, with PATCH or PUT); null clears one.
    let (status, body) = send(&app, "PATCH", "/devices/d1/faults", r#"{"down": true}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["down"].as_bool(), body["latency_ms"].as_u64()), (Some(true), Some(20)));
    let (_, body) = send(
        &app,
        "PUT",
        "/devices/d1/faults",
        r#"{"down": false, "exception_code": null, "exception_rate": null}"#,
    )
    .await;
    let f = sim.faults("d1").unwrap();
    assert_eq!((f.down, f.latency_ms, f.exception_code), (false, 20, None), "{body}");
    let (status, _) = send(&app, "PATCH", "/devices/d1/faults", r#"{"stall": 0.5, "stall_ms": 100}"#).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.faults("d1").unwrap().stall_ms, 100);
    let (status, _) = send(&app, "PATCH", "/devices/d1/faults", r#"{"stall_ms": 0}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a stall share needs a stall length");
    let (status, body) = send(&app, "DELETE", "/devices/d1/faults", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["latency_ms"], 0);
    assert_eq!(sim.faults("d1").unwrap(), fieldgate_sim::Faults::default());

    let (status, _) = send(&app, "PUT", "/devices/d1/faults", r#"{"no_reply": 2}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = send(&app, "PUT", "/devices/d1/faults", r#"{"bogus": 1}"#).await;
    assert!(status.is_client_error());
    let (status, _) = send(&app, "PUT", "/devices/zz/faults", "{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (_, body) = send(&app, "PUT", "/clock", r#"{"frozen_at_s": 50.0}"#).await;
    assert_eq!(body["frozen"], true);
    let (status, body) = send(&app, "GET", "/sensors/X_Y_002", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["value"], 50.0);
    let (status, _) = send(&app, "GET", "/sensors/NOPE_X_001", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
