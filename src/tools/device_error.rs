//! What a failed device read means for the agent: the one mapping of driver and breaker
//! errors to tool errors (codes, retry advice, hints), used by every tool that reads.

use super::envelope::{ErrorCode, ToolError};
use crate::driver::{DriverError, EdgeGone, Refusal};
use crate::registry::{Device, Sensor, SensorSource};
use crate::resilience::ReadError;

const EXCEPTIONS: [&str; 5] =
    ["", "illegal function", "illegal data address", "illegal data value", "server device failure"];

/// The one mapping from read failures to the contract's errors.
pub fn device_error(e: &ReadError, device: &Device, sensor: &Sensor) -> ToolError {
    let id = device.id.as_str();
    let retry =
        "Wait retry_after_ms, then retry; if it keeps failing, call get_device_status and report the device.";
    let e = match e {
        ReadError::CircuitOpen { retry_after, down_since, report } => {
            return circuit_open(id, *retry_after, *down_since, *report);
        }
        ReadError::Driver(e) => e,
    };
    let err = match e {
        DriverError::Timeout => ToolError::new(
            ErrorCode::DeviceTimeout,
            format!("Device {id} did not answer within {} ms.", device.timeout.as_millis()),
            retry,
        )
        .with_retry_after(1000),
        DriverError::Queued => {
            let mut e = ToolError::new(
                ErrorCode::DeviceTimeout,
                format!(
                    "Device {id} could not be asked in time: its connection was held by a request that got no reply."
                ),
                retry,
            )
            .with_retry_after(500);
            e.blameless = true;
            e
        }
        DriverError::Unavailable { retry_after } => ToolError::new(
            ErrorCode::DeviceUnavailable,
            format!("Device {id} refused or dropped the connection."),
            retry,
        )
        .with_retry_after(retry_after.map_or(1000, |d| d.as_millis() as u64).max(100)),
        // The reply does not match the request (function, unit, counts, framing), or
        // cannot be decoded. Which check failed is logged, never told: it is device text.
        DriverError::Malformed => ToolError::new(
            ErrorCode::DeviceProtocolError,
            if device.protocol == crate::registry::Protocol::Opcua {
                format!("Device {id} sent a reply that does not match the request.")
            } else {
                format!(
                    "Device {id} sent a reply that does not match the request; the connection was dropped."
                )
            },
            retry,
        )
        .with_retry_after(500),
        DriverError::Busy => ToolError::new(ErrorCode::DeviceBusy, format!("Device {id} is busy."), retry)
            .with_retry_after(500),
        DriverError::Rejected { code } => {
            let name =
                EXCEPTIONS.get(*code as usize).copied().filter(|n| !n.is_empty()).unwrap_or("device error");
            let place = place_of(sensor);
            ToolError::new(
                ErrorCode::DeviceRejected,
                format!(
                    "Device {id} rejected the read of sensor {} (Modbus exception {code}: {name}).",
                    sensor.id
                ),
                format!(
                    "This is a configuration fault, not a passing failure: tell an operator that sensor {} ({place}) cannot be read from {id}. Do not retry.",
                    sensor.id
                ),
            )
        }
        DriverError::NodeRejected { status } => ToolError::new(
            ErrorCode::DeviceRejected,
            format!("Device {id} refused the read of sensor {} (OPC UA status {status}).", sensor.id),
            format!(
                "This is a configuration fault, not a passing failure: tell an operator that sensor {} ({}) cannot be read from {id}. Do not retry.",
                sensor.id,
                place_of(sensor)
            ),
        ),
        DriverError::Unreadable { received } => ToolError::new(
            ErrorCode::DeviceRejected,
            format!(
                "Device {id} answered for sensor {} with {received}; a sensor reads one number, boolean or text.",
                sensor.id
            ),
            format!(
                "This is a configuration fault, not a passing failure: tell an operator that sensor {} ({}) points at a node that is not a single value. Do not retry.",
                sensor.id,
                place_of(sensor)
            ),
        ),
        DriverError::Refused(r) => refused(id, r),
        DriverError::EdgeOffline { edge, since, why, retry_after } => {
            let at = since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let what = match why {
                EdgeGone::Node => format!("Edge node {edge} is offline since {at} (its death certificate)."),
                EdgeGone::Device => format!("Device {id} of edge node {edge} is offline since {at}."),
                EdgeGone::Broker => {
                    format!("The hub lost its broker at {at}; nothing of edge node {edge} is known since.")
                }
                EdgeGone::NotBorn => {
                    format!("Edge node {edge} has not announced itself since {at}; the hub asked it to.")
                }
            };
            ToolError::new(
                ErrorCode::EdgeOffline,
                what,
                "Wait retry_after_ms, then retry; get_device_status shows every edge node and device with the time it went away. If it stays offline, report the edge node to a person.",
            )
            .with_retry_after(retry_after.as_millis().clamp(100, 3_600_000) as u64)
        }
        DriverError::AliasShared { edge } => ToolError::new(
            ErrorCode::DeviceRejected,
            format!(
                "Edge node {edge} gave sensor {}'s alias to another metric too; its data cannot be told apart, so the hub serves no value of it.",
                sensor.id
            ),
            format!(
                "This is a configuration fault at the edge, not a passing failure: tell an operator that edge node {edge} announces sensor {} ({}) with an alias it also gives another metric. Do not retry.",
                sensor.id,
                place_of(sensor)
            ),
        ),
        DriverError::NotSupported => ToolError::new(
            ErrorCode::DeviceRejected,
            format!("fieldgate has no way to read this sensor from its {} device.", device.protocol.name()),
            "Tell an operator that this device's readings are not available; do not retry.",
        ),
    };
    err.with_device(id)
}

/// The device's breaker is open: wait, and report a device down for long.
fn circuit_open(
    id: &str,
    retry_after: std::time::Duration,
    down_since: Option<chrono::DateTime<chrono::Utc>>,
    report: bool,
) -> ToolError {
    let since = down_since
        .map(|t| format!(" since {}", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
        .unwrap_or_default();
    let hint = if report {
        format!(
            "Device {id} has been down{since}: report it to a person now (get_device_status shows its state). fieldgate keeps probing it; wait retry_after_ms before asking again."
        )
    } else {
        "Wait retry_after_ms before asking again: fieldgate probes the device itself meanwhile, and get_device_status shows its state. Do not retry sooner.".to_string()
    };
    ToolError::new(
        ErrorCode::CircuitOpen,
        format!("Device {id} is failing{since}; fieldgate stopped asking it for now (circuit breaker open)."),
        hint,
    )
    .with_retry_after((retry_after.as_millis() as u64).max(1))
    .with_device(id)
}

/// A device that refused fieldgate itself: what an operator has to do about it.
fn refused(id: &str, r: &Refusal) -> ToolError {
    let (message, hint) = match r {
        Refusal::UntrustedServer { thumbprint, rejected_dir, trusted_dir } => (
            format!("The OPC UA server of device {id} is not trusted yet (certificate thumbprint {thumbprint})."),
            format!(
                "Tell an operator: to trust it, move the file ending in [{thumbprint}].der from {} to {}. Do not retry before that.",
                rejected_dir.display(),
                trusted_dir.display()
            ),
        ),
        Refusal::UnfitServerCertificate { thumbprint, reason } => (
            format!(
                "The OPC UA server of device {id} presented a trusted certificate (thumbprint {thumbprint}) that does not fit: {reason}."
            ),
            "This is a configuration fault: tell an operator to renew the server's certificate or to correct the device's endpoint. Do not retry.".to_string(),
        ),
        Refusal::ClientNotTrusted { own_certificate } => (
            format!("The OPC UA server of device {id} did not accept fieldgate's certificate."),
            format!(
                "Tell an operator to add {} to the trusted certificates of device {id}'s server. Do not retry before that.",
                own_certificate.display()
            ),
        ),
        Refusal::NoMatchingEndpoint { policy, mode } => (
            format!("The OPC UA server of device {id} offers no endpoint with security {policy}/{mode}."),
            format!(
                "This is a configuration fault: tell an operator to set security_policy and security_mode in {id}'s device file to what the server offers. Do not retry."
            ),
        ),
        Refusal::IdentityRejected { user_env } => (
            format!("The OPC UA server of device {id} refused fieldgate's user identity."),
            match user_env {
                Some(var) => format!(
                    "Tell an operator to check the user name and password given in {var} and its password variable. Do not retry."
                ),
                None => "Tell an operator that the server does not accept anonymous sessions. Do not retry.".to_string(),
            },
        ),
        Refusal::CredentialsMissing { var } => (
            format!("fieldgate has no credentials for device {id}: environment variable {var} is not set."),
            format!("Tell an operator to set {var} for the fieldgate service. Do not retry."),
        ),
        Refusal::NoOwnCertificate { .. } => (
            format!("fieldgate has no OPC UA certificate to talk to device {id}."),
            "Tell an operator that fieldgate could not create its certificate in the pki folder of its data directory (check permissions and space). Do not retry.".to_string(),
        ),
    };
    ToolError::new(ErrorCode::DeviceRejected, message, hint)
}

/// Where on its device a sensor is read from, for operators.
fn place_of(sensor: &Sensor) -> String {
    match &sensor.source {
        SensorSource::Modbus(p) => format!("{:?} register {}", p.table, p.address).to_lowercase(),
        SensorSource::OpcUa { node_id } => format!("node {node_id}"),
        SensorSource::Edge(_) => "a metric of its edge node".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{DataType, ModbusPoint, RegisterTable, WordOrder};
    use std::time::Duration;

    #[test]
    fn a_reply_that_does_not_match_its_request_is_a_protocol_error() {
        let mut device = crate::registry::Device {
            id: "a-line1-plc".parse().unwrap(),
            plant: "A".into(),
            zone: "LINE1".into(),
            description: String::new(),
            protocol: crate::registry::Protocol::ModbusTcp,
            endpoint: crate::registry::Endpoint::Tcp { host: "127.0.0.1".into(), port: 502 },
            unit_id: 1,
            timeout: Duration::from_millis(1000),
            poll_interval: None,
            max_registers_per_read: 125,
            max_gap: 8,
            word_order: WordOrder::ABCD,
            serial: None,
            opcua: None,
            breaker: None,
            source: "a.toml".into(),
        };
        let point = ModbusPoint {
            table: RegisterTable::Holding,
            address: 0,
            data_type: DataType::F32,
            word_order: WordOrder::ABCD,
            bit: None,
            count: 2,
            scale: 1.0,
            offset: 0.0,
        };
        let s = Sensor::for_tests(SensorSource::Modbus(point), "bar", None);
        let e = device_error(&ReadError::Driver(DriverError::Malformed), &device, &s);
        assert_eq!(e.code, ErrorCode::DeviceProtocolError);
        assert_eq!(e.code.as_str(), "DEVICE_PROTOCOL_ERROR");
        assert!(e.retryable);
        assert_eq!(e.retry_after_ms, Some(500));
        assert_eq!(
            e.message,
            "Device a-line1-plc sent a reply that does not match the request; the connection was dropped."
        );
        assert_eq!(e.device_id.as_deref(), Some("a-line1-plc"));
        // OPC UA keeps its session after a reply of the wrong shape.
        device.protocol = crate::registry::Protocol::Opcua;
        let e = device_error(&ReadError::Driver(DriverError::Malformed), &device, &s);
        assert_eq!(e.code, ErrorCode::DeviceProtocolError);
        assert_eq!(e.message, "Device a-line1-plc sent a reply that does not match the request.");
    }
}
