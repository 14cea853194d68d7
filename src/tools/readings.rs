//! `get_sensor_reading` and `get_sensor_readings`: live values, or young cached ones.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tokio::time::Instant;

use super::defs::{
    FailedSensor, GetSensorReadingArgs, GetSensorReadingsArgs, Quality, Reading, ReadingSource, ReadingsData,
    UnitMode, Value,
};
use super::envelope::{Detail, ErrorCode, ToolError};
use super::validate::{known_sensor, parse_sensor_id};
use super::{Inner, ToolResult, to_data};
use crate::driver::Refusal;
use crate::driver::codec::{RawValue, normalize};
use crate::driver::{DriverError, Sample};
use crate::ids::SensorId;
use crate::registry::{DataType, Device, Sensor, SensorSource};
use crate::resilience::ReadError;

/// The last value read of every sensor, for `max_age_ms`.
#[derive(Default)]
pub struct Cache {
    map: Mutex<foldhash::HashMap<SensorId, Sample>>,
}

impl Cache {
    pub fn put(&self, id: &SensorId, sample: &Sample) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Never let an older sample (a slow read finishing late) replace a newer one.
        if map.get(id).is_none_or(|old| old.at <= sample.at) {
            map.insert(id.clone(), sample.clone());
        }
    }

    /// Stores several samples under one lock.
    fn put_all<'a>(&self, samples: impl Iterator<Item = (&'a SensorId, &'a Sample)>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (id, sample) in samples {
            if map.get(id).is_none_or(|old| old.at <= sample.at) {
                map.insert(id.clone(), sample.clone());
            }
        }
    }

    /// The cached sample if it is at most `max_age_ms` old at `now`.
    pub fn fresh(&self, id: &SensorId, max_age_ms: u64, now: DateTime<Utc>) -> Option<Sample> {
        if max_age_ms == 0 {
            return None;
        }
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let s = map.get(id)?;
        let age = (now - s.at).num_milliseconds();
        (age >= 0 && age as u64 <= max_age_ms).then(|| s.clone())
    }
}

/// Formats timestamps, once per distinct instant (a batch shares a few).
pub(crate) struct Stamps {
    now: DateTime<Utc>,
    last: Option<(DateTime<Utc>, String)>,
}

impl Stamps {
    pub(crate) fn new() -> Stamps {
        Stamps { now: Utc::now(), last: None }
    }

    fn text(&mut self, at: DateTime<Utc>) -> String {
        match &self.last {
            Some((t, text)) if *t == at => text.clone(),
            _ => {
                let text = at.to_rfc3339_opts(SecondsFormat::Millis, true);
                self.last = Some((at, text.clone()));
                text
            }
        }
    }
}

/// Rounds to `digits` significant digits (f32 values carry about 7; scaled integers are
/// exact to 12, beyond which only binary noise such as 72.30000000000001 remains).
fn significant(v: f64, digits: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let exp = digits - 1 - v.abs().log10().floor() as i32;
    if exp > 0 {
        let f = 10f64.powi(exp.min(300));
        (v * f).round() / f
    } else {
        let f = 10f64.powi((-exp).min(300));
        (v / f).round() * f
    }
}

/// The agent-facing reading of a sample.
pub(crate) fn reading(
    sensor: &Sensor,
    sample: &Sample,
    mode: UnitMode,
    source: ReadingSource,
    stamps: &mut Stamps,
) -> Reading {
    let (value, data_type) = match &sensor.source {
        SensorSource::Modbus(p) if mode == UnitMode::Normalized => {
            (normalize(p, &sample.value), Some(p.data_type))
        }
        SensorSource::Modbus(p) => (sample.value.clone(), Some(p.data_type)),
        SensorSource::OpcUa { .. } => (sample.value.clone(), None),
    };
    let (value, quality) = match value {
        _ if sample.quality == crate::driver::SampleQuality::Bad => (None, Quality::Bad),
        RawValue::Float(f) if !f.is_finite() => (None, Quality::Bad),
        RawValue::Bool(b) => (Some(Value::Bool(b)), Quality::Good),
        RawValue::Text(t) => (Some(Value::Text(t)), Quality::Good),
        other => {
            let v = other.as_f64().unwrap_or(f64::NAN);
            let v = match data_type {
                Some(DataType::F32) => significant(v, 7),
                Some(DataType::F64) | None => v,
                Some(_) => significant(v, 12),
            };
            (Some(Value::Number(v)), Quality::Good)
        }
    };
    // The device's own verdict lowers what the value looks like.
    let quality = match (quality, sample.quality) {
        (Quality::Good, crate::driver::SampleQuality::Uncertain) => Quality::Uncertain,
        (q, _) => q,
    };
    let in_range = match (&value, sensor.range, mode) {
        (Some(Value::Number(v)), Some(r), UnitMode::Normalized) => Some(r.min <= *v && *v <= r.max),
        _ => None,
    };
    Reading {
        sensor_id: sensor.id.to_string(),
        value,
        unit: if mode == UnitMode::Raw { "raw".into() } else { sensor.unit.clone() },
        timestamp: stamps.text(sample.at),
        quality,
        source,
        age_ms: (stamps.now - sample.at).num_milliseconds().max(0) as u64,
        device_id: sensor.device.to_string(),
        range: sensor.range,
        in_range,
    }
}

const EXCEPTIONS: [&str; 5] =
    ["", "illegal function", "illegal data address", "illegal data value", "server device failure"];

/// The one mapping from read failures to the contract's errors.
pub fn device_error(e: &ReadError, device: &Device, sensor: &Sensor) -> ToolError {
    let id = device.id.as_str();
    let retry =
        "Wait retry_after_ms, then retry; if it keeps failing, call get_device_status and report the device.";
    let e = match e {
        ReadError::CircuitOpen { retry_after } => {
            return ToolError::new(
                ErrorCode::CircuitOpen,
                format!("Device {id} is failing; fieldgate stopped asking it for now (circuit breaker open)."),
                "Wait retry_after_ms before asking again; get_device_status shows the device's state. Do not retry sooner.",
            )
            .with_retry_after((retry_after.as_millis() as u64).max(1))
            .with_device(id);
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
        DriverError::Unavailable { retry_after } => ToolError::new(
            ErrorCode::DeviceUnavailable,
            format!("Device {id} refused or dropped the connection."),
            retry,
        )
        .with_retry_after(retry_after.map_or(1000, |d| d.as_millis() as u64).max(100)),
        DriverError::Malformed => ToolError::new(
            ErrorCode::DeviceUnavailable,
            format!("Device {id} sent a malformed reply; the connection was reset."),
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
        DriverError::Refused(r) => refused(id, r),
        DriverError::NotSupported => ToolError::new(
            ErrorCode::DeviceRejected,
            format!("fieldgate cannot read {} devices in this version.", device.protocol.name()),
            "Tell an operator that this device's readings are not available; do not retry.",
        ),
    };
    err.with_device(id)
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
    }
}

fn deadline(inner: &Inner) -> Instant {
    Instant::now() + Duration::from_millis(inner.config.calls.deadline_ms)
}

pub(crate) async fn get_one(inner: &Inner, args: GetSensorReadingArgs, attempts: &mut u32) -> ToolResult {
    let registry = &inner.registry;
    let id = parse_sensor_id("sensor_id", &args.sensor_id, registry)?;
    let sensor = known_sensor("sensor_id", &id, registry)?;
    let mode = args.unit.unwrap_or_default();
    let mut stamps = Stamps::new();
    if let Some(hit) = inner.cache.fresh(&id, args.max_age_ms.unwrap_or(0), stamps.now) {
        return to_data(&reading(sensor, &hit, mode, ReadingSource::Cache, &mut stamps));
    }
    let device = registry.device_of(sensor);
    let driver = inner.drivers.get(&device.id).ok_or_else(ToolError::internal)?;
    let started = Instant::now();
    let (mut results, tries) =
        inner.resilience.read(&device.id, driver.as_ref(), &[sensor], deadline(inner)).await;
    *attempts += tries;
    if tries > 0 {
        inner.metrics.device_read(device.id.as_str(), started.elapsed());
    }
    match results.pop() {
        Some(Ok(sample)) => {
            inner.cache.put(&id, &sample);
            stamps.now = Utc::now();
            to_data(&reading(sensor, &sample, mode, ReadingSource::Live, &mut stamps))
        }
        Some(Err(e)) => Err(device_error(&e, device, sensor)),
        None => Err(ToolError::internal()),
    }
}

pub(crate) async fn get_many(inner: &Inner, args: GetSensorReadingsArgs, attempts: &mut u32) -> ToolResult {
    let registry = &inner.registry;
    let mut sensors = Vec::new();
    let mut bad = Vec::new();
    for (i, raw) in args.sensor_ids.iter().enumerate() {
        let param = format!("sensor_ids/{i}");
        match parse_sensor_id(&param, raw, registry).and_then(|id| known_sensor(&param, &id, registry)) {
            Ok(s) => sensors.push(s),
            Err(e) => bad.push(e),
        }
    }
    if !bad.is_empty() {
        return Err(combine(bad, "sensor IDs are invalid or unknown"));
    }
    let mode = args.unit.unwrap_or_default();
    let max_age = args.max_age_ms.unwrap_or(0);
    let mut results: Vec<Option<Result<Reading, ToolError>>> = vec![None; sensors.len()];
    let mut stamps = Stamps::new();
    // Group what the cache cannot answer by device, in request order.
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, s) in sensors.iter().enumerate() {
        match inner.cache.fresh(&s.id, max_age, stamps.now) {
            Some(hit) => results[i] = Some(Ok(reading(s, &hit, mode, ReadingSource::Cache, &mut stamps))),
            None => groups.entry(s.device.as_str()).or_default().push(i),
        }
    }
    let until = deadline(inner);
    let reads = groups.values().map(|idx| {
        let group: Vec<&Sensor> = idx.iter().map(|&i| sensors[i]).collect();
        async move {
            let device = registry.device_of(group[0]);
            let started = Instant::now();
            let (out, tries) = match inner.drivers.get(&device.id) {
                Some(driver) => inner.resilience.read(&device.id, driver.as_ref(), &group, until).await,
                None => (vec![Err(ReadError::Driver(DriverError::NotSupported)); group.len()], 0),
            };
            if tries > 0 {
                inner.metrics.device_read(device.id.as_str(), started.elapsed());
            }
            (idx, out, tries)
        }
    });
    let done = futures_util::future::join_all(reads).await;
    // Devices are read in parallel: the call made as many attempts as its busiest device.
    *attempts += done.iter().map(|(_, _, tries)| *tries).max().unwrap_or(0);
    stamps.now = Utc::now();
    for (idx, out, _) in &done {
        inner
            .cache
            .put_all(idx.iter().zip(out).filter_map(|(&i, r)| r.as_ref().ok().map(|s| (&sensors[i].id, s))));
        for (&i, r) in idx.iter().zip(out) {
            let s = sensors[i];
            results[i] = Some(match r {
                Ok(sample) => Ok(reading(s, sample, mode, ReadingSource::Live, &mut stamps)),
                Err(e) => Err(device_error(e, registry.device_of(s), s)),
            });
        }
    }
    let mut readings = Vec::new();
    let mut failed = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Some(Ok(reading)) => readings.push(reading),
            Some(Err(mut error)) => {
                error.parameter = Some(format!("sensor_ids/{i}"));
                failed.push(FailedSensor { sensor_id: sensors[i].id.to_string(), error });
            }
            None => return Err(ToolError::internal()),
        }
    }
    if readings.is_empty() {
        let errors = failed.into_iter().map(|f| f.error).collect();
        return Err(combine(errors, "sensors could not be read"));
    }
    to_data(&ReadingsData { complete: failed.is_empty(), readings, failed })
}

/// Several errors as one: the first error's code, every one in `details`.
fn combine(mut errors: Vec<ToolError>, what: &str) -> ToolError {
    if errors.len() == 1 {
        return errors.remove(0);
    }
    let first = errors[0].clone();
    let mut e = ToolError::new(first.code, format!("{} {what}.", errors.len()), first.hint.clone());
    e.retry_after_ms = errors.iter().filter_map(|e| e.retry_after_ms).max().filter(|_| e.retryable);
    let devices: Vec<_> = errors.iter().filter_map(|e| e.device_id.clone()).collect();
    if !devices.is_empty() && devices.iter().all(|d| *d == devices[0]) {
        e.device_id = Some(devices[0].clone());
    }
    e.details = errors
        .into_iter()
        .map(|x| Detail {
            parameter: x.parameter.unwrap_or_default(),
            received: x.received,
            expected: x.expected,
            message: format!("{}: {}", x.code.as_str(), x.message),
            suggestions: x.suggestions,
        })
        .collect();
    e
}

#[cfg(test)]
mod tests {
    use super::significant;

    #[test]
    fn significant_digits_remove_binary_noise_only() {
        assert_eq!(significant(f64::from(123.456f32), 7), 123.456);
        assert_eq!(significant(723.0 * 0.1, 12), 72.3);
        assert_eq!(significant(-0.000_123_456_78, 7), -0.000_123_456_8);
        assert_eq!(significant(48_214_131.0, 12), 48_214_131.0);
        assert_eq!(significant(1.5e30, 7), 1.5e30);
        assert_eq!(significant(0.0, 7), 0.0);
    }
}
