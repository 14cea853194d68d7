//! Replies that do not match their request, from a raw-socket Modbus peer.
//!
//! [`Peer`] is a Modbus server written by hand on a `TcpListener`: it reads each request
//! frame itself (MBAP for Modbus TCP; unit, PDU and CRC-16/MODBUS for RTU over TCP) and
//! answers with the reply [`Shape`] the test scripted, built byte by byte here, without
//! tokio-modbus or fieldgate's own framing. Each table lists every shape with the code the
//! agent must get and, for a protocol error, which of the driver's checks must fire (from
//! its log).

use std::sync::Arc;

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::{ErrorCode, ToolService};
use serde_json::json;

use super::support::device_dir;

mod peer;

pub use peer::{Framing, Peer, Shape};

/// Log lines of this thread (see `support::Lines`).
pub use super::support::Lines as Logs;

/// The driver's log line for a reply that failed check `name`.
pub fn check_fired(name: &str) -> String {
    format!("check=\"{name}\"")
}

/// A device file for the peer: an f32 in holding 0-1 (T_RAW_001) and two coils, 3
/// (T_RAW_002) and 12 (T_RAW_003), read together as 10 coils from 3.
fn device_file(framing: Framing, port: u16) -> String {
    let protocol = match framing {
        Framing::Tcp => "modbus-tcp",
        Framing::Rtu => "modbus-rtu-over-tcp",
    };
    format!(
        r#"id = "t-raw"
plant = "T"
zone = "RAW"
description = "Raw-socket peer"
protocol = "{protocol}"
endpoint = "127.0.0.1:{port}"
unit_id = 17
timeout_ms = 200

[[sensors]]
id = "T_RAW_001"
description = "Pressure"
kind = "pressure"
unit = "bar"
table = "holding"
address = 0
type = "f32"

[[sensors]]
id = "T_RAW_002"
description = "Pump running"
kind = "status"
unit = ""
table = "coil"
address = 3
type = "bool"

[[sensors]]
id = "T_RAW_003"
description = "Valve open"
kind = "status"
unit = ""
table = "coil"
address = 12
type = "bool"
"#
    )
}

/// The peer, a tool service reading it (one attempt per call, a breaker that never
/// opens), and the device file's folder.
pub async fn setup(framing: Framing) -> (Peer, ToolService, tempfile::TempDir) {
    let peer = Peer::start(framing).await;
    let dir = device_dir(&[("t-raw.toml", &device_file(framing, peer.port))]);
    let mut config = Config::default();
    config.calls.max_retries = 0;
    config.breaker.failure_threshold = 1000;
    config.breaker.failure_rate_percent = 100;
    let service = ToolService::new(Arc::new(Registry::load(dir.path()).unwrap()), config);
    (peer, service, dir)
}

/// Which read a row makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// T_RAW_001: function 3, 2 registers from 0.
    Holding,
    /// T_RAW_002 and T_RAW_003: function 1, 10 coils from 3 (2 bytes).
    Coils,
}

/// What the agent must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The hand-written values: 12.5 bar; coil 3 on, coil 12 off.
    Values,
    /// A protocol error, found by the named check of the driver.
    Protocol(&'static str),
    /// Another error code.
    Code(ErrorCode),
}

use Expect::{Code, Protocol, Values};

const PROTOCOL_MESSAGE: &str =
    "Device t-raw sent a reply that does not match the request; the connection was dropped.";

async fn call(service: &ToolService, read: Read) -> fieldgate::tools::Envelope {
    let args = match read {
        Read::Holding => json!({ "sensor_id": "T_RAW_001" }),
        Read::Coils => json!({ "sensor_ids": ["T_RAW_002", "T_RAW_003"] }),
    };
    let tool = if read == Read::Holding { "get_sensor_reading" } else { "get_sensor_readings" };
    service.call(tool, args).await.unwrap()
}

/// Fails the row with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

/// The read's values, checked against the hand-written ones.
fn check_values(read: Read, e: &fieldgate::tools::Envelope) -> Result<(), String> {
    ensure!(e.ok, "an error instead of values: {:?}", e.error);
    let data = e.json();
    match read {
        Read::Holding => {
            ensure!(data["value"] == json!(12.5), "value {} instead of 12.5", data["value"]);
            ensure!(data["quality"] == "good", "quality {}", data["quality"]);
        }
        Read::Coils => {
            let readings = data["readings"].as_array().cloned().unwrap_or_default();
            let value = |id: &str| readings.iter().find(|r| r["sensor_id"] == id).map(|r| r["value"].clone());
            let got = (value("T_RAW_002"), value("T_RAW_003"));
            ensure!(got == (Some(json!(true)), Some(json!(false))), "coils {got:?} instead of (true, false)");
        }
    }
    Ok(())
}

async fn failures(service: &ToolService) -> u64 {
    let status = service.call("get_device_status", json!({ "device_id": "t-raw" })).await.unwrap().json();
    status["devices"][0]["failures"].as_u64().unwrap()
}

/// One row: the scripted reply, the code (and check) the agent gets, the device's failure
/// count, and a following read that must get the right value (on a new connection
/// whenever the row's reply left the old one in an unknown state).
async fn run_row(
    peer: &Peer,
    service: &ToolService,
    logs: &Logs,
    (shape, read, expect): (Shape, Read, Expect),
) -> Result<(), String> {
    let (failed_before, connections_before, logged_before) =
        (failures(service).await, peer.connections(), logs.text().len());
    peer.next(shape);
    let e = call(service, read).await;
    // The request was the one the table's expectations are written for.
    let req = peer.last_request().ok_or("no request")?;
    let asked = match read {
        Read::Holding => (17, 3, 0, 2),
        Read::Coils => (17, 1, 3, 10),
    };
    ensure!((req.unit, req.function, req.start, req.count) == asked, "asked {req:?}");
    let blamed = match expect {
        Values => {
            check_values(read, &e)?;
            false
        }
        Protocol(check) => {
            let err = e.error.as_ref().ok_or_else(|| format!("values {} instead of an error", e.json()))?;
            ensure!(
                err.code == ErrorCode::DeviceProtocolError,
                "{:?} instead of DEVICE_PROTOCOL_ERROR: {err:?}",
                err.code
            );
            if read == Read::Holding {
                ensure!(err.message == PROTOCOL_MESSAGE, "message {:?}", err.message);
            } else {
                // The batch failed as a whole: each sensor's reason in its detail.
                ensure!(err.message == "2 sensors could not be read.", "message {:?}", err.message);
                let want = format!("DEVICE_PROTOCOL_ERROR: {PROTOCOL_MESSAGE}");
                ensure!(err.details.len() == 2, "details {:?}", err.details);
                ensure!(err.details.iter().all(|d| d.message == want), "details {:?}", err.details);
            }
            ensure!(err.retryable && err.retry_after_ms == Some(500), "retry {err:?}");
            ensure!(err.device_id.as_deref() == Some("t-raw"), "device {err:?}");
            let logged = logs.text()[logged_before..].to_string();
            ensure!(logged.contains(&check_fired(check)), "not check {check:?}; log: {logged}");
            true
        }
        Code(code) => {
            let err = e.error.as_ref().ok_or_else(|| format!("values {} instead of an error", e.json()))?;
            ensure!(err.code == code, "{:?} instead of {code:?}: {err:?}", err.code);
            code != ErrorCode::DeviceRejected
        }
    };
    if shape == Shape::Repeat {
        peer.repeat().await;
    }
    let failed = failures(service).await;
    ensure!(failed == failed_before + u64::from(blamed), "failures {failed_before} -> {failed}");
    // The next read gets the right value (not a second or late reply), and the
    // connection was replaced exactly when the reply was not a well-formed answer.
    check_values(read, &call(service, read).await).map_err(|e| format!("the read after it: {e}"))?;
    let dropped = !matches!(expect, Values | Code(ErrorCode::DeviceRejected) | Code(ErrorCode::DeviceBusy));
    let connections = peer.connections();
    ensure!(
        connections == connections_before + usize::from(dropped),
        "connections {connections_before} -> {connections}"
    );
    Ok(())
}

/// Runs every row and reports every row that failed.
async fn run_table(framing: Framing, rows: &[(Shape, Read, Expect)]) {
    let (logs, _guard) = Logs::capture_at(tracing::Level::WARN);
    let (peer, service, _dir) = setup(framing).await;
    // The connection is open before the first row.
    check_values(Read::Holding, &call(&service, Read::Holding).await).unwrap();
    assert_eq!(peer.connections(), 1);
    let mut failed = Vec::new();
    for &row in rows {
        if let Err(e) = run_row(&peer, &service, &logs, row).await {
            failed.push(format!("{:?} on {:?}, expected {:?}: {e}", row.0, row.1, row.2));
        }
    }
    assert!(
        failed.is_empty(),
        "{framing:?}: {} of {} rows failed:\n{}",
        failed.len(),
        rows.len(),
        failed.join("\n")
    );
}

#[tokio::test]
async fn modbus_tcp_replies_must_match_their_request() {
    let http: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\r\n";
    let rows = [
        (Shape::Good, Read::Holding, Values),
        (Shape::Good, Read::Coils, Values),
        (Shape::WrongTid, Read::Holding, Protocol("transaction ID")),
        (Shape::WrongTid, Read::Coils, Protocol("transaction ID")),
        (Shape::WrongUnit, Read::Holding, Protocol("unit ID")),
        (Shape::WrongUnit, Read::Coils, Protocol("unit ID")),
        (Shape::WrongFunction, Read::Holding, Protocol("function code")),
        (Shape::WrongFunction, Read::Coils, Protocol("function code")),
        (Shape::Exception(2), Read::Holding, Code(ErrorCode::DeviceRejected)),
        (Shape::Exception(6), Read::Holding, Code(ErrorCode::DeviceBusy)),
        (Shape::Exception(2), Read::Coils, Code(ErrorCode::DeviceRejected)),
        // Coils: a well-formed reply with a byte too many (in front) or too few.
        (Shape::Items(1), Read::Coils, Protocol("byte count")),
        (Shape::Items(-1), Read::Coils, Protocol("byte count")),
        // Coils: the byte count field alone is wrong.
        (Shape::ByteCountField(1), Read::Coils, Protocol("byte count")),
        (Shape::ByteCountField(-1), Read::Coils, Protocol("byte count")),
        // Registers: the byte count field alone is wrong.
        (Shape::ByteCountField(2), Read::Holding, Protocol("byte count")),
        (Shape::ByteCountField(-2), Read::Holding, Protocol("byte count")),
        (Shape::ByteCountField(1), Read::Holding, Protocol("byte count")),
        // Registers: a well-formed reply with a register too many or too few.
        (Shape::Items(1), Read::Holding, Protocol("byte count")),
        (Shape::Items(-1), Read::Holding, Protocol("byte count")),
        // The MBAP length cuts the PDU short (the rest follows), or promises more than
        // ever comes.
        (Shape::MbapLength(-2), Read::Holding, Protocol("length")),
        (Shape::MbapLength(-1), Read::Coils, Protocol("length")),
        (Shape::MbapLength(4), Read::Holding, Code(ErrorCode::DeviceTimeout)),
        (Shape::MbapLength(2), Read::Holding, Code(ErrorCode::DeviceTimeout)),
        (Shape::Truncated, Read::Holding, Code(ErrorCode::DeviceTimeout)),
        (Shape::Truncated, Read::Coils, Code(ErrorCode::DeviceTimeout)),
        (Shape::Silence, Read::Holding, Code(ErrorCode::DeviceTimeout)),
        // Two replies for one request: the first is the answer, the second is dropped,
        // whether it came with the first or after it was read.
        (Shape::Twice, Read::Holding, Values),
        (Shape::Twice, Read::Coils, Values),
        (Shape::Repeat, Read::Holding, Values),
        (Shape::Repeat, Read::Coils, Values),
        (Shape::Garbage(http), Read::Holding, Protocol("protocol identifier")),
        // Transaction ID 1, protocol 0, length 0.
        (Shape::Garbage(&[0, 1, 0, 0, 0, 0, 17]), Read::Holding, Protocol("MBAP length")),
        (Shape::Close, Read::Holding, Code(ErrorCode::DeviceUnavailable)),
    ];
    run_table(Framing::Tcp, &rows).await;
}

#[tokio::test]
async fn modbus_rtu_over_tcp_replies_must_match_their_request() {
    let http: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\r\n";
    let rows = [
        (Shape::Good, Read::Holding, Values),
        (Shape::Good, Read::Coils, Values),
        (Shape::WrongUnit, Read::Holding, Protocol("unit ID")),
        (Shape::WrongUnit, Read::Coils, Protocol("unit ID")),
        (Shape::WrongFunction, Read::Holding, Protocol("function code")),
        (Shape::WrongFunction, Read::Coils, Protocol("function code")),
        (Shape::Exception(2), Read::Holding, Code(ErrorCode::DeviceRejected)),
        (Shape::Exception(6), Read::Holding, Code(ErrorCode::DeviceBusy)),
        (Shape::Exception(6), Read::Coils, Code(ErrorCode::DeviceBusy)),
        // Coils: a well-formed reply (right CRC) with a byte too many or too few.
        (Shape::Items(1), Read::Coils, Protocol("byte count")),
        (Shape::Items(-1), Read::Coils, Protocol("byte count")),
        // The byte count field alone is wrong: RTU frames end where the byte count says,
        // so a larger one is a frame that never completes, and a smaller one puts the CRC
        // in the wrong place.
        (Shape::ByteCountField(1), Read::Coils, Code(ErrorCode::DeviceTimeout)),
        (Shape::ByteCountField(-1), Read::Coils, Protocol("CRC")),
        (Shape::ByteCountField(2), Read::Holding, Code(ErrorCode::DeviceTimeout)),
        (Shape::ByteCountField(-2), Read::Holding, Protocol("CRC")),
        // Registers: a well-formed reply with a register too many or too few.
        (Shape::Items(1), Read::Holding, Protocol("byte count")),
        (Shape::Items(-1), Read::Holding, Protocol("byte count")),
        (Shape::Truncated, Read::Holding, Code(ErrorCode::DeviceTimeout)),
        (Shape::Silence, Read::Coils, Code(ErrorCode::DeviceTimeout)),
        (Shape::BadCrc, Read::Holding, Protocol("CRC")),
        (Shape::BadCrc, Read::Coils, Protocol("CRC")),
        // Two replies for one request: RTU has no transaction ID, so only discarding
        // the second keeps it from answering the next request with other values.
        (Shape::Twice, Read::Holding, Values),
        (Shape::Twice, Read::Coils, Values),
        (Shape::Repeat, Read::Holding, Values),
        (Shape::Repeat, Read::Coils, Values),
        (Shape::Garbage(http), Read::Holding, Protocol("function code")),
        (Shape::Close, Read::Coils, Code(ErrorCode::DeviceUnavailable)),
    ];
    run_table(Framing::Rtu, &rows).await;
}

/// RTU frames carry no transaction ID: a second reply to one request that arrived after
/// the next request went out would be taken as its answer. So the driver leaves the line
/// alone for a guard time after each reply (and discards what came in it) before the next
/// request. Measured at the peer: a lower bound, which load can only lengthen.
#[tokio::test]
async fn an_rtu_line_is_left_quiet_after_each_reply_before_the_next_request() {
    let (peer, service, _dir) = setup(Framing::Rtu).await;
    for _ in 0..5 {
        check_values(Read::Holding, &call(&service, Read::Holding).await).unwrap();
    }
    let gaps = peer.quiet_before_requests();
    assert_eq!(gaps.len(), 4, "{gaps:?}");
    assert!(gaps.iter().all(|g| *g >= std::time::Duration::from_millis(19)), "{gaps:?}");
}
