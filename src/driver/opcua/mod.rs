//! OPC UA driver: one client session per device, opened on first use and reopened after
//! it drops; every read is one `Read` service call for all requested nodes.
//!
//! Security follows the device file (see [`security`]): policy `None` or a signing /
//! encrypting policy with fieldgate's own certificate from the PKI folder, anonymous or
//! with a user whose credentials come from the environment. `mode = "subscribe"` devices
//! are also read this way on demand; their values arrive through [`subscribe`].
//!
//! Status codes as `DriverError`s: BadNodeIdUnknown and access errors → `NodeRejected`,
//! BadTooManyOperations → `Busy`, BadNotConnected and communication errors →
//! `Unavailable`; any other Bad status is a bad-quality sample, Uncertain an uncertain one.
//! A session is replaced when its event loop ends.

pub mod browse;
pub mod conditions;
pub mod security;
pub mod subscribe;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use opcua::client::{Client, Session};
use opcua::crypto::X509;
use opcua::types::{
    AttributeId, ByteString, DataValue, NodeId, ReadValueId, StatusCode, TimestampsToReturn, Variant,
};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use super::clock::Clock;
use super::codec::RawValue;
use super::{BoxFuture, Driver, DriverError, ReadOptions, Refusal, Sample, SampleQuality};
use crate::registry::{Device, Endpoint, Protocol, Sensor, SensorSource};
use security::{Pki, Security};

/// An open session and the task that keeps it alive.
pub(crate) struct Connection {
    pub(crate) session: Arc<Session>,
    event_loop: JoinHandle<StatusCode>,
}

impl Connection {
    pub(crate) fn is_alive(&self) -> bool {
        !self.event_loop.is_finished()
    }

    /// Waits until the session's event loop ends (the connection is lost).
    pub(crate) async fn closed(&mut self) -> StatusCode {
        (&mut self.event_loop).await.unwrap_or(StatusCode::BadUnexpectedError)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.event_loop.abort();
    }
}

/// How to reach one OPC UA server: everything a connection needs.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub security: Security,
    pub pki: Pki,
    pub request_timeout: Duration,
    /// The device's clock, which its timestamps are checked against.
    pub clock: Arc<Clock>,
}

impl Target {
    /// The target of an OPC UA device, with fieldgate's PKI folder `pki`.
    pub fn of(device: &Device, pki: &Pki) -> Option<Target> {
        let Endpoint::OpcUa { url } = &device.endpoint else { return None };
        if device.protocol != Protocol::Opcua {
            return None;
        }
        Some(Target {
            url: url.clone(),
            security: Security::of(device.opcua.as_ref()),
            pki: pki.clone(),
            request_timeout: device.timeout.max(Duration::from_millis(100)),
            clock: Arc::new(Clock::new(device.id.as_str(), device.poll_interval)),
        })
    }

    /// Opens a session: asks the server for its endpoints, picks the one with the
    /// configured security, and connects with the configured identity.
    pub(crate) async fn connect(&self) -> Result<Connection, DriverError> {
        let secured = self.security.is_secured();
        // Without security no certificate is used, but async-opcua still lays out its PKI
        // folders: keep those out of the data directory.
        let pki_dir =
            if secured { self.pki.dir.clone() } else { std::env::temp_dir().join("fieldgate-opcua-none") };
        let mut client = security::client_builder(&pki_dir, secured)
            .request_timeout(self.request_timeout)
            .client()
            // Only a local problem (e.g. the PKI folder cannot be created) fails here.
            .map_err(|e| DriverError::Refused(Refusal::NoOwnCertificate { reason: e.join("; ") }))?;
        if secured && !self.pki.own_certificate().is_file() {
            return Err(DriverError::Refused(Refusal::NoOwnCertificate {
                reason: format!("{} cannot be created", self.pki.own_certificate().display()),
            }));
        }
        let identity = self.security.token().map_err(DriverError::Refused)?;
        let endpoints =
            client.get_server_endpoints_from_url(self.url.as_str()).await.map_err(|e| lost(e.status()))?;
        let Some(endpoint) =
            Client::find_matching_endpoint(&endpoints, &self.url, self.security.policy, self.security.mode)
        else {
            let (policy, mode) = self.security.names();
            return Err(DriverError::Refused(Refusal::NoMatchingEndpoint { policy, mode }));
        };
        let server_cert = endpoint.server_certificate.clone();
        if secured && self.pki.trusts(&server_cert) {
            let host = url::Url::parse(self.url.as_str()).ok().and_then(|u| u.host_str().map(str::to_string));
            let fit = security::unfit(
                server_cert.as_ref(),
                host.as_deref().unwrap_or_default(),
                endpoint.server.application_uri.as_ref(),
                chrono::Utc::now(),
            );
            if let Some(reason) = fit {
                let thumbprint = X509::from_byte_string(&server_cert)
                    .map(|c| c.thumbprint().as_hex_string())
                    .unwrap_or_default();
                return Err(DriverError::Refused(Refusal::UnfitServerCertificate { thumbprint, reason }));
            }
        }
        let (session, event_loop) =
            client.connect_to_endpoint_directly(endpoint, identity).map_err(|e| lost(e.status()))?;
        let mut conn = Connection { session, event_loop: event_loop.spawn() };
        let session = conn.session.clone();
        let status = tokio::select! {
            ok = session.wait_for_connection() => {
                if ok {
                    return Ok(conn);
                }
                conn.closed().await
            }
            status = conn.closed() => status,
        };
        Err(self.failure(status, &server_cert))
    }

    /// What a failed connect means, from the status the session ended with.
    fn failure(&self, status: StatusCode, server_cert: &ByteString) -> DriverError {
        let status = StatusCode::from(status.bits() & 0xFFFF_0000);
        if self.security.is_secured()
            && let Some(refusal) = self.pki.refusal_for(server_cert, status)
        {
            return DriverError::Refused(refusal);
        }
        if [
            StatusCode::BadUserAccessDenied,
            StatusCode::BadIdentityTokenInvalid,
            StatusCode::BadIdentityTokenRejected,
            StatusCode::BadUserSignatureInvalid,
        ]
        .contains(&status)
        {
            return DriverError::Refused(Refusal::IdentityRejected {
                user_env: self.security.user_vars().map(|(u, _)| u),
            });
        }
        if [StatusCode::BadSecurityPolicyRejected, StatusCode::BadSecurityModeRejected].contains(&status) {
            let (policy, mode) = self.security.names();
            return DriverError::Refused(Refusal::NoMatchingEndpoint { policy, mode });
        }
        lost(status)
    }
}

/// A connect or request that failed for a reason that is not fieldgate's configuration.
fn lost(status: StatusCode) -> DriverError {
    if status == StatusCode::BadTimeout {
        DriverError::Timeout
    } else {
        if status == StatusCode::BadTooManySessions {
            // Many PLCs allow only a few sessions; other clients (or sessions left open
            // by clients that exited) hold them until they time out.
            tracing::warn!(
                "OPC UA: the server refuses a new session: it has too many open (other clients hold them; they expire at the server's session timeout)"
            );
        }
        DriverError::Unavailable { retry_after: None }
    }
}

pub struct OpcUaDriver {
    target: Target,
    conn: Mutex<Option<Connection>>,
}

impl OpcUaDriver {
    /// A driver for `device`, or `None` when it is not an OPC UA device.
    pub fn for_device(device: &Device, pki: &Pki) -> Option<OpcUaDriver> {
        Some(OpcUaDriver { target: Target::of(device, pki)?, conn: Mutex::new(None) })
    }

    async fn read_nodes(
        &self,
        nodes: &[ReadValueId],
        options: ReadOptions,
    ) -> Result<Vec<DataValue>, DriverError> {
        // Waiting for another call's read on the session asks nothing of the device.
        let mut guard =
            timeout_at(options.deadline, self.conn.lock()).await.map_err(|_| DriverError::Queued)?;
        if guard.as_ref().is_none_or(|c| !c.is_alive()) {
            *guard = None;
            let conn = timeout_at(options.deadline, self.target.connect())
                .await
                .map_err(|_| DriverError::Timeout)??;
            *guard = Some(conn);
        }
        let Some(conn) = guard.as_ref() else { return Err(DriverError::Unavailable { retry_after: None }) };
        let session = conn.session.clone();
        let until = options.deadline.min(tokio::time::Instant::now() + self.target.request_timeout);
        match timeout_at(until, session.read(nodes, TimestampsToReturn::Both, 0.0)).await {
            Err(_) => {
                // A server that stopped answering this session may serve a new one: the
                // next read opens it instead of queueing behind the silent one.
                *guard = None;
                Err(DriverError::Timeout)
            }
            Ok(Err(e)) => {
                let status = e.status();
                if is_busy(status) {
                    return Err(DriverError::Busy);
                }
                // The session may be broken; open a fresh one next time.
                *guard = None;
                Err(lost(status))
            }
            Ok(Ok(values)) if values.len() == nodes.len() => Ok(values),
            Ok(Ok(_)) => {
                *guard = None;
                Err(DriverError::Malformed)
            }
        }
    }
}

pub(crate) fn is_busy(status: StatusCode) -> bool {
    status == StatusCode::BadTooManyOperations || status == StatusCode::BadServerTooBusy
}

/// The node a sensor is read from, or `None` when its `node_id` does not parse (the
/// registry checks the form at load, so this is a belt-and-braces guard).
pub(crate) fn node_of(sensor: &Sensor) -> Option<NodeId> {
    match &sensor.source {
        SensorSource::OpcUa { node_id } => NodeId::from_str(node_id).ok(),
        SensorSource::Modbus(_) | SensorSource::Edge(_) => None,
    }
}

/// What one `DataValue` of a `Read` reply means for the sensor.
pub(crate) fn sample_of(dv: DataValue, clock: &Clock, sensor: &str) -> Result<Sample, DriverError> {
    let status = dv.status.unwrap_or(StatusCode::Good);
    let (at, replaced) = clock.time_of(
        (!status.is_bad()).then_some(sensor),
        dv.source_timestamp.map(|t| t.as_chrono()),
        dv.server_timestamp.map(|t| t.as_chrono()),
        chrono::Utc::now(),
    );
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
    // A time that had to be replaced makes the value uncertain: when it was true is unknown.
    let quality =
        if status.is_uncertain() || replaced { SampleQuality::Uncertain } else { SampleQuality::Good };
    let value = match dv.value {
        // A text variable without text: no value now, as a bad-quality reading.
        Some(Variant::String(s)) if s.is_null() => {
            return Ok(Sample { value: RawValue::Float(f64::NAN), at, quality: SampleQuality::Bad });
        }
        Some(Variant::Empty) | None if quality == SampleQuality::Good => {
            return Err(DriverError::Unreadable { received: "no value (a Null variant)" });
        }
        Some(Variant::Empty) | None => RawValue::Float(f64::NAN),
        Some(v) => {
            let received = kind_of(&v);
            raw_of(v).ok_or(DriverError::Unreadable { received })?
        }
    };
    Ok(Sample { value, at, quality })
}

/// What a variant that is no sensor value holds, in words (for the agent's error).
fn kind_of(v: &Variant) -> &'static str {
    match v {
        Variant::Array(_) => "an array",
        Variant::ByteString(_) => "a ByteString",
        Variant::DateTime(_) => "a DateTime",
        Variant::ExtensionObject(_) => "a structure (ExtensionObject)",
        Variant::Guid(_) => "a Guid",
        Variant::NodeId(_) | Variant::ExpandedNodeId(_) => "a NodeId",
        Variant::QualifiedName(_) => "a QualifiedName",
        Variant::StatusCode(_) => "a StatusCode",
        Variant::XmlElement(_) => "an XmlElement",
        Variant::String(_) | Variant::LocalizedText(_) => "a text longer than 1 MiB",
        Variant::DataValue(_) | Variant::Variant(_) | Variant::DiagnosticInfo(_) => "a nested value",
        _ => "a value of another type",
    }
}

/// An f32 as the f64 of its shortest decimal form: 0.1 stays 0.1 (not 0.10000000149011612,
/// the binary noise of widening it), the number the device holds.
fn widened(f: f32) -> f64 {
    if !f.is_finite() {
        return f.into();
    }
    f.to_string().parse().unwrap_or(f.into())
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
        Variant::Float(f) => RawValue::Float(widened(f)),
        Variant::Double(f) => RawValue::Float(f),
        // Device text reaches agents and operators: nothing in it may hide or reorder what
        // they read (control, bidirectional and invisible characters become U+FFFD).
        // (Longer ones are decoded, up to a reply's size, so that they fail only their sensor.)
        Variant::String(s) if s.as_ref().len() <= crate::driver::MAX_TEXT => {
            RawValue::Text(crate::plain::shown(s.as_ref()))
        }
        Variant::LocalizedText(t) if t.text.as_ref().len() <= crate::driver::MAX_TEXT => {
            RawValue::Text(crate::plain::shown(t.text.as_ref()))
        }
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
                .zip(sensors)
                .map(|(n, s)| match n {
                    None => Err(DriverError::NodeRejected { status: "BadNodeIdInvalid" }),
                    Some(_) => values.next().map_or(Err(DriverError::Malformed), |v| {
                        sample_of(v, &self.target.clock, s.id.as_str())
                    }),
                })
                .collect()
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(conn) = self.conn.lock().await.take() else { return };
            let _ = tokio::time::timeout(self.target.request_timeout, conn.session.disconnect()).await;
        })
    }

    fn clock(&self) -> Option<Arc<Clock>> {
        Some(self.target.clock.clone())
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
        let good =
            sample_of(dv(Some(Variant::Double(1.5)), StatusCode::Good), &Clock::new("t", None), "s").unwrap();
        assert_eq!((good.value, good.quality), (RawValue::Float(1.5), SampleQuality::Good));
        let unc = sample_of(
            dv(Some(Variant::Int32(-4)), StatusCode::UncertainLastUsableValue),
            &Clock::new("t", None),
            "s",
        )
        .unwrap();
        assert_eq!((unc.value, unc.quality), (RawValue::Int(-4), SampleQuality::Uncertain));
        let bad = sample_of(dv(None, StatusCode::BadSensorFailure), &Clock::new("t", None), "s").unwrap();
        assert_eq!(bad.quality, SampleQuality::Bad);
        assert_eq!(
            sample_of(dv(None, StatusCode::BadNodeIdUnknown), &Clock::new("t", None), "s"),
            Err(DriverError::NodeRejected { status: "BadNodeIdUnknown" })
        );
        assert_eq!(
            sample_of(dv(None, StatusCode::BadTooManyOperations), &Clock::new("t", None), "s"),
            Err(DriverError::Busy)
        );
        assert_eq!(
            sample_of(dv(None, StatusCode::BadNotConnected), &Clock::new("t", None), "s"),
            Err(DriverError::Unavailable { retry_after: None })
        );
        // A good status with no value, or a value that is no scalar: the sensor's fault.
        assert_eq!(
            sample_of(dv(None, StatusCode::Good), &Clock::new("t", None), "s"),
            Err(DriverError::Unreadable { received: "no value (a Null variant)" })
        );
        let array = Variant::from(vec![1.0f64, 2.0]);
        assert_eq!(
            sample_of(dv(Some(array), StatusCode::Good), &Clock::new("t", None), "s"),
            Err(DriverError::Unreadable { received: "an array" })
        );
    }

    #[test]
    fn scalar_variants_keep_their_value() {
        assert_eq!(raw_of(Variant::Boolean(true)), Some(RawValue::Bool(true)));
        assert_eq!(raw_of(Variant::UInt16(65535)), Some(RawValue::UInt(65535)));
        assert_eq!(raw_of(Variant::Int64(i64::MIN)), Some(RawValue::Int(i64::MIN)));
        assert_eq!(raw_of(Variant::Float(0.25)), Some(RawValue::Float(0.25)));
        assert_eq!(raw_of(Variant::Float(0.1)), Some(RawValue::Float(0.1)));
        assert_eq!(raw_of(Variant::Float(-3.4e38)), Some(RawValue::Float(-3.4e38)));
        assert_eq!(raw_of(Variant::from("RYE")), Some(RawValue::Text("RYE".into())));
    }
}
