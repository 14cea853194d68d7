//! OPC UA driver: one client session per device, opened on first use and reopened after
//! it drops; every read is one `Read` service call for all requested nodes.
//!
//! This first slice speaks security policy `None` with anonymous identity (what the
//! registry accepts today for the demo plant) and polls; signing/encryption, user
//! identities are not built yet and such devices get no driver (they read as "not
//! supported"); `mode = "subscribe"` is polled for now.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use opcua::client::{ClientBuilder, IdentityToken, Session};
use opcua::types::{
    AttributeId, DataValue, EndpointDescription, MessageSecurityMode, NodeId, ReadValueId, StatusCode,
    TimestampsToReturn, UserTokenPolicy, Variant,
};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use super::codec::RawValue;
use super::{BoxFuture, Driver, DriverError, ReadOptions, Sample, SampleQuality};
use crate::registry::{Device, Endpoint, Protocol, Sensor, SensorSource};

/// An open session and the task that keeps it alive.
struct Connection {
    session: Arc<Session>,
    event_loop: JoinHandle<StatusCode>,
}

impl Connection {
    fn is_alive(&self) -> bool {
        !self.event_loop.is_finished()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.event_loop.abort();
    }
}

pub struct OpcUaDriver {
    url: String,
    pki_dir: PathBuf,
    request_timeout: Duration,
    conn: Mutex<Option<Connection>>,
}

impl OpcUaDriver {
    /// A driver for `device`, or `None` when the device is not an OPC UA device this slice
    /// can talk to (see the module docs).
    pub fn for_device(device: &Device) -> Option<OpcUaDriver> {
        let Endpoint::OpcUa { url } = &device.endpoint else { return None };
        if device.protocol != Protocol::Opcua {
            return None;
        }
        if let Some(s) = &device.opcua {
            let plain = s.security_policy.eq_ignore_ascii_case("none")
                && s.security_mode.eq_ignore_ascii_case("none")
                && s.username_env.is_none();
            if !plain {
                return None;
            }
        }
        Some(OpcUaDriver {
            url: url.clone(),
            pki_dir: std::env::temp_dir().join("fieldgate-opcua-pki"),
            request_timeout: device.timeout.max(Duration::from_millis(100)),
            conn: Mutex::new(None),
        })
    }

    async fn connect(&self) -> Result<Connection, DriverError> {
        let mut client = ClientBuilder::new()
            .application_name("fieldgate")
            .application_uri("urn:fieldgate")
            .product_uri("urn:fieldgate")
            // Security policy None needs no key pair, and we must not write one to disk.
            .create_sample_keypair(false)
            .trust_server_certs(false)
            .pki_dir(self.pki_dir.clone())
            .session_retry_limit(0)
            .request_timeout(self.request_timeout)
            .client()
            // Only a local problem (e.g. the PKI folder cannot be created) fails here; the
            // device may be fine, so this must not read as "not supported".
            .map_err(|_| DriverError::Unavailable { retry_after: None })?;
        let endpoint: EndpointDescription =
            (self.url.as_str(), "None", MessageSecurityMode::None, UserTokenPolicy::anonymous()).into();
        let (session, event_loop) = client
            .connect_to_matching_endpoint(endpoint, IdentityToken::Anonymous)
            .await
            .map_err(|_| DriverError::Unavailable { retry_after: None })?;
        let conn = Connection { session, event_loop: event_loop.spawn() };
        if !conn.session.wait_for_connection().await {
            return Err(DriverError::Unavailable { retry_after: None });
        }
        Ok(conn)
    }

    async fn read_nodes(
        &self,
        nodes: &[ReadValueId],
        options: ReadOptions,
    ) -> Result<Vec<DataValue>, DriverError> {
        let mut guard =
            timeout_at(options.deadline, self.conn.lock()).await.map_err(|_| DriverError::Timeout)?;
        if guard.as_ref().is_none_or(|c| !c.is_alive()) {
            *guard = None;
            let conn =
                timeout_at(options.deadline, self.connect()).await.map_err(|_| DriverError::Timeout)??;
            *guard = Some(conn);
        }
        let Some(conn) = guard.as_ref() else { return Err(DriverError::Unavailable { retry_after: None }) };
        let session = conn.session.clone();
        match timeout_at(options.deadline, session.read(nodes, TimestampsToReturn::Both, 0.0)).await {
            Err(_) => Err(DriverError::Timeout),
            Ok(Err(e)) => {
                let status = e.status();
                if is_busy(status) {
                    return Err(DriverError::Busy);
                }
                // The session may be broken; open a fresh one next time.
                *guard = None;
                Err(if status == StatusCode::BadTimeout {
                    DriverError::Timeout
                } else {
                    DriverError::Unavailable { retry_after: None }
                })
            }
            Ok(Ok(values)) if values.len() == nodes.len() => Ok(values),
            Ok(Ok(_)) => {
                *guard = None;
                Err(DriverError::Malformed)
            }
        }
    }
}

fn is_busy(status: StatusCode) -> bool {
    status == StatusCode::BadTooManyOperations || status == StatusCode::BadServerTooBusy
}

/// The node a sensor is read from, or `None` when its `node_id` does not parse (the
/// registry checks the form at load, so this is a belt-and-braces guard).
fn node_of(sensor: &Sensor) -> Option<NodeId> {
    match &sensor.source {
        SensorSource::OpcUa { node_id } => NodeId::from_str(node_id).ok(),
        SensorSource::Modbus(_) => None,
    }
}

/// What one `DataValue` of a `Read` reply means for the sensor.
fn sample_of(dv: DataValue) -> Result<Sample, DriverError> {
    let status = dv.status.unwrap_or(StatusCode::Good);
    let at =
        dv.source_timestamp.or(dv.server_timestamp).map(|t| t.as_chrono()).unwrap_or_else(chrono::Utc::now);
    if status.is_bad() {
        let s = StatusCode::from(status.bits() & 0xFFFF_0000);
        if is_busy(s) {
            return Err(DriverError::Busy);
        }
        if [
            StatusCode::BadNodeIdUnknown,
            StatusCode::BadNodeIdInvalid,
            StatusCode::BadAttributeIdInvalid,
            StatusCode::BadNotReadable,
            StatusCode::BadUserAccessDenied,
        ]
        .contains(&s)
        {
            return Err(DriverError::NodeRejected { status: s.sub_code().name() });
        }
        if [StatusCode::BadNotConnected, StatusCode::BadCommunicationError, StatusCode::BadNoCommunication]
            .contains(&s)
        {
            return Err(DriverError::Unavailable { retry_after: None });
        }
        // The server answered for the node but vouches for no value (sensor failure,
        // waiting for initial data, ...): a bad-quality reading, not a failed call.
        return Ok(Sample { value: RawValue::Float(f64::NAN), at, quality: SampleQuality::Bad });
    }
    let quality = if status.is_uncertain() { SampleQuality::Uncertain } else { SampleQuality::Good };
    let value = match dv.value {
        Some(v) => raw_of(v).ok_or(DriverError::Malformed)?,
        None if quality == SampleQuality::Good => return Err(DriverError::Malformed),
        None => RawValue::Float(f64::NAN),
    };
    Ok(Sample { value, at, quality })
}

/// A scalar variant as a raw value; arrays and structures are not sensor readings.
fn raw_of(v: Variant) -> Option<RawValue> {
    Some(match v {
        Variant::Boolean(b) => RawValue::Bool(b),
        Variant::SByte(i) => RawValue::Int(i.into()),
        Variant::Int16(i) => RawValue::Int(i.into()),
        Variant::Int32(i) => RawValue::Int(i.into()),
        Variant::Int64(i) => RawValue::Int(i),
        Variant::Byte(u) => RawValue::UInt(u.into()),
        Variant::UInt16(u) => RawValue::UInt(u.into()),
        Variant::UInt32(u) => RawValue::UInt(u.into()),
        Variant::UInt64(u) => RawValue::UInt(u),
        Variant::Float(f) => RawValue::Float(f.into()),
        Variant::Double(f) => RawValue::Float(f),
        Variant::String(s) => RawValue::Text(s.value().clone().unwrap_or_default()),
        Variant::LocalizedText(t) => RawValue::Text(t.text.value().clone().unwrap_or_default()),
        _ => return None,
    })
}

impl Driver for OpcUaDriver {
    fn read<'a>(
        &'a self,
        sensors: &'a [&'a Sensor],
        options: ReadOptions,
    ) -> BoxFuture<'a, Vec<Result<Sample, DriverError>>> {
        Box::pin(async move {
            let nodes: Vec<Option<NodeId>> = sensors.iter().map(|s| node_of(s)).collect();
            let to_read: Vec<ReadValueId> = nodes
                .iter()
                .flatten()
                .map(|n| ReadValueId {
                    node_id: n.clone(),
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                })
                .collect();
            if to_read.is_empty() {
                return vec![Err(DriverError::NodeRejected { status: "BadNodeIdInvalid" }); sensors.len()];
            }
            let mut values = match self.read_nodes(&to_read, options).await {
                Ok(v) => v.into_iter(),
                Err(e) => return vec![Err(e); sensors.len()],
            };
            nodes
                .iter()
                .map(|n| match n {
                    None => Err(DriverError::NodeRejected { status: "BadNodeIdInvalid" }),
                    Some(_) => values.next().map_or(Err(DriverError::Malformed), sample_of),
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opcua::types::DateTime;

    fn dv(value: Option<Variant>, status: StatusCode) -> DataValue {
        DataValue {
            value,
            status: Some(status),
            source_timestamp: Some(DateTime::now()),
            ..Default::default()
        }
    }

    #[test]
    fn statuses_map_to_errors_or_qualities() {
        let good = sample_of(dv(Some(Variant::Double(1.5)), StatusCode::Good)).unwrap();
        assert_eq!((good.value, good.quality), (RawValue::Float(1.5), SampleQuality::Good));
        let unc = sample_of(dv(Some(Variant::Int32(-4)), StatusCode::UncertainLastUsableValue)).unwrap();
        assert_eq!((unc.value, unc.quality), (RawValue::Int(-4), SampleQuality::Uncertain));
        let bad = sample_of(dv(None, StatusCode::BadSensorFailure)).unwrap();
        assert_eq!(bad.quality, SampleQuality::Bad);
        assert_eq!(
            sample_of(dv(None, StatusCode::BadNodeIdUnknown)),
            Err(DriverError::NodeRejected { status: "BadNodeIdUnknown" })
        );
        assert_eq!(sample_of(dv(None, StatusCode::BadTooManyOperations)), Err(DriverError::Busy));
        assert_eq!(
            sample_of(dv(None, StatusCode::BadNotConnected)),
            Err(DriverError::Unavailable { retry_after: None })
        );
        // A good status with no value, or a value that is no scalar, is a malformed reply.
        assert_eq!(sample_of(dv(None, StatusCode::Good)), Err(DriverError::Malformed));
        let array = Variant::from(vec![1.0f64, 2.0]);
        assert_eq!(sample_of(dv(Some(array), StatusCode::Good)), Err(DriverError::Malformed));
    }

    #[test]
    fn scalar_variants_keep_their_value() {
        assert_eq!(raw_of(Variant::Boolean(true)), Some(RawValue::Bool(true)));
        assert_eq!(raw_of(Variant::UInt16(65535)), Some(RawValue::UInt(65535)));
        assert_eq!(raw_of(Variant::Int64(i64::MIN)), Some(RawValue::Int(i64::MIN)));
        assert_eq!(raw_of(Variant::Float(0.25)), Some(RawValue::Float(0.25)));
        assert_eq!(raw_of(Variant::from("RYE")), Some(RawValue::Text("RYE".into())));
    }
}
