//! `get_sensor_reading` and `get_sensor_readings`: live values, or young cached ones.

use chrono::{DateTime, SecondsFormat, Utc};

use super::defs::{
    FailedSensor, GetSensorReadingArgs, GetSensorReadingsArgs, Quality, Reading, ReadingSource, UnitMode,
    Value,
};
use super::envelope::{Detail, ErrorCode, ToolError};
use super::validate::registered_sensor;
use super::{Inner, ToolResult, json, to_data};
use crate::driver::Refusal;
use crate::driver::codec::{RawValue, scaled};
use crate::driver::{DriverError, Sample};
use crate::reading::{Cache, Source};
use crate::registry::{DataType, Device, Sensor, SensorSource};
use crate::resilience::ReadError;

/// The largest `max_age_ms` the input schemas accept.
const MAX_AGE_MS: u64 = 86_400_000;

/// Whether an error is a device failure worth waiting out, so that the last value read
/// is worth offering meanwhile.
fn passing_device_failure(e: &ToolError) -> bool {
    matches!(
        e.code,
        ErrorCode::DeviceTimeout
            | ErrorCode::DeviceUnavailable
            | ErrorCode::DeviceBusy
            | ErrorCode::CircuitOpen
            | ErrorCode::DeviceProtocolError
    )
}

/// " The last value read, 42 s old, is available: call again with max_age_ms of at least
/// 42000 (e.g. 60000) to get it." for a cached value `age_ms` old; for a batch that read
/// nothing, `of` counts the sensors with a cached value and `age_ms` is the oldest one's.
/// Nothing when `max_age_ms` cannot reach back that far. The example leaves the agent time
/// before its next call, while the value grows older.
fn cached_note(age_ms: u64, of: Option<usize>) -> String {
    let secs = age_ms.div_ceil(1000).max(1);
    let at_least = secs * 1000;
    if at_least > MAX_AGE_MS {
        return String::new();
    }
    let age = match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    };
    let example = (at_least + 10_000).div_ceil(60_000).saturating_mul(60_000).min(MAX_AGE_MS);
    let example = if example > at_least { format!(" (e.g. {example})") } else { String::new() };
    let call = format!("call again with max_age_ms of at least {at_least}{example}");
    match of {
        None => format!(" The last value read, {age} old, is available: {call} to get it."),
        Some(1) => {
            format!(
                " The last value read of one of these sensors, {age} old, is available: {call} to get it."
            )
        }
        Some(n) => format!(
            " The last values read of {n} of these sensors are available, the oldest {age} old: {call} to get them."
        ),
    }
}

/// A device failure of `sensor`, with the cached value the agent can have instead.
fn offer_cached(mut e: ToolError, cache: &Cache, sensor: &Sensor) -> ToolError {
    if passing_device_failure(&e)
        && let Some(age) = cache.age_ms(sensor, Utc::now())
    {
        e.hint.push_str(&cached_note(age, None));
    }
    e
}

/// Formats timestamps and ages, once per distinct instant (a batch shares a few).
pub(crate) struct Stamps {
    now: DateTime<Utc>,
    last: Option<(DateTime<Utc>, String, u64)>,
    /// The JSON from `,"timestamp"` to `age_ms` of the last (instant, quality, source)
    /// written: the same for every reading of a block read together.
    middle: Option<(Written, String)>,
}

/// What the middle part of a reading depends on.
type Written = (DateTime<Utc>, Quality, ReadingSource);

impl Stamps {
    pub(crate) fn new() -> Stamps {
        Stamps { now: Utc::now(), last: None, middle: None }
    }

    /// `at` as RFC 3339 text, and how old a value read then is now (0 for a clock that
    /// stepped back).
    fn of(&mut self, at: DateTime<Utc>) -> (&str, u64) {
        if self.last.as_ref().is_none_or(|(t, _, _)| *t != at) {
            let age = (self.now - at).num_milliseconds().max(0) as u64;
            self.last = Some((at, at.to_rfc3339_opts(SecondsFormat::Millis, true), age));
        }
        self.last.as_ref().map_or(("", 0), |(_, text, age)| (text, *age))
    }

    /// `,"timestamp":…,"quality":…,"source":…,"age_ms":…` of a reading.
    fn middle(&mut self, at: DateTime<Utc>, quality: Quality, source: ReadingSource) -> &str {
        let key = (at, quality, source);
        if self.middle.as_ref().is_none_or(|(k, _)| *k != key) {
            let mut out = String::with_capacity(96);
            let (timestamp, age_ms) = self.of(at);
            out.push_str(",\"timestamp\":");
            json::plain(&mut out, timestamp);
            out.push_str(match quality {
                Quality::Good => ",\"quality\":\"good\"",
                Quality::Uncertain => ",\"quality\":\"uncertain\"",
                Quality::Bad => ",\"quality\":\"bad\"",
            });
            out.push_str(match source {
                ReadingSource::Live => ",\"source\":\"live\"",
                ReadingSource::Cache => ",\"source\":\"cache\"",
            });
            out.push_str(",\"age_ms\":");
            json::unsigned(&mut out, age_ms);
            self.middle = Some((key, out));
        }
        self.middle.as_ref().map_or("", |(_, text)| text)
    }
}

/// The parts of a sensor's reading in JSON that never change, written once per registry:
/// a batch copies them instead of writing them again.
pub(crate) struct ReadingJson {
    /// `{"sensor_id":…,"value":`
    head: String,
    /// `,"unit":…` in normalized units.
    unit: String,
    /// `,"device_id":…,"range":…,"in_range":`
    tail: String,
}

impl ReadingJson {
    pub(crate) fn of(sensor: &Sensor) -> ReadingJson {
        let mut head = String::from("{\"sensor_id\":");
        json::plain(&mut head, sensor.id.as_str());
        head.push_str(",\"value\":");
        let mut unit = String::from(",\"unit\":");
        json::string(&mut unit, &sensor.unit);
        let mut tail = String::from(",\"device_id\":");
        json::plain(&mut tail, sensor.device.as_str());
        tail.push_str(",\"range\":");
        match sensor.range {
            None => tail.push_str("null"),
            Some(r) => {
                tail.push_str("{\"min\":");
                json::number(&mut tail, r.min);
                tail.push_str(",\"max\":");
                json::number(&mut tail, r.max);
                tail.push('}');
            }
        }
        tail.push_str(",\"in_range\":");
        ReadingJson { head, unit, tail }
    }
}

/// Rounds to `digits` significant digits (f32 values carry about 7; scaled integers are
/// exact to 12, beyond which only binary noise such as 72.30000000000001 remains), and
/// gives the decimal it rounded to, whose digits the JSON writer can print instead of
/// converting the float back to text.
fn rounded(v: f64, digits: i32) -> (f64, Option<json::Decimal>) {
    if v == 0.0 || !v.is_finite() {
        return (v, None);
    }
    let exp = digits - 1 - decimal_exponent(v.abs());
    let (value, m) = if exp > 0 {
        let f = pow10(exp.min(300));
        let m = round(v * f);
        (m / f, m)
    } else {
        let f = pow10((-exp).min(300));
        let m = round(v / f);
        (m * f, m)
    };
    // With 10^|exp| exact, `value` is the f64 nearest to m·10^-exp; and no other decimal
    // of at most 15 significant digits has the same nearest f64 (DBL_DIG), so m's digits
    // (trailing zeros dropped) are the shortest form serde_json finds for `value`.
    let decimal = (exp.abs() <= 22 && digits <= 15).then(|| json::Decimal {
        negative: m < 0.0,
        digits: m.abs() as u64,
        scale: exp,
    });
    (value, decimal)
}

/// `x.round()` (half away from zero), bit for bit, without the libm call that baseline
/// x86-64 makes for it: a batch rounds every value it reads.
fn round(x: f64) -> f64 {
    // From 2^52 on every f64 is an integer already (and NaN stays NaN).
    if x.is_nan() || x.abs() >= 4_503_599_627_370_496.0 {
        return x;
    }
    // Truncation by conversion is exact here; copysign keeps the sign of -0.4 → -0.0.
    let t = (x as i64 as f64).copysign(x);
    match x - t {
        d if d >= 0.5 => t + 1.0,
        d if d <= -0.5 => t - 1.0,
        _ => t,
    }
}

/// The powers of ten that an f64 holds exactly.
const EXACT_POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18,
    1e19, 1e20, 1e21, 1e22,
];

fn pow10(n: i32) -> f64 {
    usize::try_from(n).ok().and_then(|i| EXACT_POW10.get(i).copied()).unwrap_or_else(|| 10f64.powi(n))
}

/// floor(log10(a)) for a finite `a` > 0: by comparison with exact powers where they
/// reach (the usual sensor values), by logarithm elsewhere.
fn decimal_exponent(a: f64) -> i32 {
    if (1.0..1e22).contains(&a) {
        // 2^e ≤ a < 2^(e+1) puts floor(log10 a) at floor(e·log10 2) or one more: one
        // comparison with an exact power decides (78913 / 2^18 is log10 2 to 6 digits,
        // exact in the floor for e < 1000).
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let d = (e * 78_913) >> 18;
        d + i32::from(EXACT_POW10.get(d as usize + 1).is_some_and(|p| a >= *p))
    } else {
        a.log10().floor() as i32
    }
}

/// A reading's value before it is owned: what `reading` and `write_reading` share.
enum ValueRef<'a> {
    /// The value, and the decimal it was rounded to (see [`rounded`]).
    Number(f64, Option<json::Decimal>),
    Bool(bool),
    Text(&'a str),
}

/// What a sample says, judged once for both forms of a reading: the value (absent when
/// bad), its quality, and whether it lies in the sensor's normal range.
struct Judged<'a> {
    value: Option<ValueRef<'a>>,
    quality: Quality,
    in_range: Option<bool>,
}

/// `v`, in the sensor's units, rounded to the significant digits its type carries (as
/// readings are): 7 for f32, 12 for scaled integers, f64 as it is.
pub(crate) fn significant(sensor: &Sensor, v: f64) -> f64 {
    match &sensor.source {
        SensorSource::Modbus(p) if p.data_type == DataType::F32 => rounded(v, 7).0,
        SensorSource::Modbus(p) if p.data_type != DataType::F64 => rounded(v, 12).0,
        _ => v,
    }
}

fn judge<'a>(sensor: &Sensor, sample: &'a Sample, mode: UnitMode) -> Judged<'a> {
    let (point, data_type) = match &sensor.source {
        SensorSource::Modbus(p) => ((mode == UnitMode::Normalized).then_some(p), Some(p.data_type)),
        SensorSource::OpcUa { .. } => (None, None),
    };
    let (value, quality) = match &sample.value {
        _ if sample.quality == crate::driver::SampleQuality::Bad => (None, Quality::Bad),
        RawValue::Bool(b) => (Some(ValueRef::Bool(*b)), Quality::Good),
        RawValue::Text(t) => (Some(ValueRef::Text(t)), Quality::Good),
        number => {
            let v = number.as_f64().unwrap_or(f64::NAN);
            let v = point.map_or(v, |p| scaled(p, v));
            let (v, decimal) = match data_type {
                Some(DataType::F32) => rounded(v, 7),
                Some(DataType::F64) | None => (v, None),
                Some(_) => rounded(v, 12),
            };
            match v.is_finite() {
                true => (Some(ValueRef::Number(v, decimal)), Quality::Good),
                false => (None, Quality::Bad),
            }
        }
    };
    // The device's own verdict lowers what the value looks like.
    let quality = match (quality, sample.quality) {
        (Quality::Good, crate::driver::SampleQuality::Uncertain) => Quality::Uncertain,
        (q, _) => q,
    };
    let in_range = match (&value, sensor.range, mode) {
        (Some(ValueRef::Number(v, _)), Some(r), UnitMode::Normalized) => Some(r.min <= *v && *v <= r.max),
        _ => None,
    };
    Judged { value, quality, in_range }
}

/// The agent-facing reading of a sample.
pub(crate) fn reading(
    sensor: &Sensor,
    sample: &Sample,
    mode: UnitMode,
    source: ReadingSource,
    stamps: &mut Stamps,
) -> Reading {
    let j = judge(sensor, sample, mode);
    let (timestamp, age_ms) = stamps.of(sample.at);
    Reading {
        sensor_id: sensor.id.to_string(),
        value: j.value.map(|v| match v {
            ValueRef::Number(n, _) => Value::Number(n),
            ValueRef::Bool(b) => Value::Bool(b),
            ValueRef::Text(t) => Value::Text(t.to_string()),
        }),
        unit: if mode == UnitMode::Raw { "raw".into() } else { sensor.unit.clone() },
        timestamp: timestamp.to_string(),
        quality: j.quality,
        source,
        age_ms,
        device_id: sensor.device.to_string(),
        range: sensor.range,
        in_range: j.in_range,
    }
}

/// Appends the JSON of `reading(...)` to `out`: the same bytes serde writes for it (a
/// test holds them equal), from the sensor's fixed parts (`parts`, from
/// [`ReadingJson::of`]) and what the sample says, without building a `Reading` per
/// sensor of a batch.
pub(crate) fn write_reading(
    out: &mut String,
    parts: &ReadingJson,
    sensor: &Sensor,
    sample: &Sample,
    mode: UnitMode,
    source: ReadingSource,
    stamps: &mut Stamps,
) {
    let j = judge(sensor, sample, mode);
    out.push_str(&parts.head);
    match j.value {
        None => out.push_str("null"),
        Some(ValueRef::Number(_, Some(d))) if json::decimal(out, d) => {}
        Some(ValueRef::Number(n, _)) => json::number(out, n),
        Some(ValueRef::Bool(b)) => json::boolean(out, b),
        Some(ValueRef::Text(t)) => json::string(out, t),
    }
    match mode {
        UnitMode::Raw => out.push_str(",\"unit\":\"raw\""),
        UnitMode::Normalized => out.push_str(&parts.unit),
    }
    out.push_str(stamps.middle(sample.at, j.quality, source));
    out.push_str(&parts.tail);
    match j.in_range {
        None => out.push_str("null"),
        Some(b) => json::boolean(out, b),
    }
    out.push('}');
}

const EXCEPTIONS: [&str; 5] =
    ["", "illegal function", "illegal data address", "illegal data value", "server device failure"];

/// The one mapping from read failures to the contract's errors.
pub fn device_error(e: &ReadError, device: &Device, sensor: &Sensor) -> ToolError {
    let id = device.id.as_str();
    let retry =
        "Wait retry_after_ms, then retry; if it keeps failing, call get_device_status and report the device.";
    let e = match e {
        ReadError::CircuitOpen { retry_after, down_since, report } => {
            let since = down_since
                .map(|t| format!(" since {}", t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
                .unwrap_or_default();
            let hint = if *report {
                format!(
                    "Device {id} has been down{since}: report it to a person now (get_device_status shows its state). fieldgate keeps probing it; wait retry_after_ms before asking again."
                )
            } else {
                "Wait retry_after_ms before asking again: fieldgate probes the device itself meanwhile, and get_device_status shows its state. Do not retry sooner.".to_string()
            };
            return ToolError::new(
                ErrorCode::CircuitOpen,
                format!("Device {id} is failing{since}; fieldgate stopped asking it for now (circuit breaker open)."),
                hint,
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

fn source(s: Source) -> ReadingSource {
    match s {
        Source::Live => ReadingSource::Live,
        Source::Cache => ReadingSource::Cache,
    }
}

pub(crate) async fn get_one(inner: &Inner, args: GetSensorReadingArgs, attempts: &mut u32) -> ToolResult {
    let registry = &inner.registry;
    let sensor = registered_sensor("sensor_id", &args.sensor_id, registry)?;
    let mode = args.unit.unwrap_or_default();
    let reader = &inner.reader;
    let deadline = crate::reading::Reader::deadline(&inner.config);
    let mut read = reader.read(&[sensor], Some(args.max_age_ms.unwrap_or(0)), deadline).await;
    *attempts += read.attempts;
    let mut stamps = Stamps::new();
    match read.results.pop() {
        Some(Ok((sample, from))) => to_data(&reading(sensor, &sample, mode, source(from), &mut stamps)),
        Some(Err(e)) => {
            Err(offer_cached(device_error(&e, registry.device_of(sensor), sensor), reader.cache(), sensor))
        }
        None => Err(ToolError::internal()),
    }
}

pub(crate) async fn get_many(
    inner: &Inner,
    args: GetSensorReadingsArgs<'_>,
    attempts: &mut u32,
) -> ToolResult {
    let registry = &inner.registry;
    let mut sensors = Vec::with_capacity(args.sensor_ids.len());
    // Each sensor's position in the request, when some IDs are unknown.
    let mut positions: Vec<usize> = Vec::new();
    // Unknown (or removed) sensors fail alone, next to the readings of the others.
    let mut unknown: Vec<(usize, FailedSensor)> = Vec::new();
    for (i, raw) in args.sensor_ids.iter().enumerate() {
        // The parameter's name is only spelled out for an error.
        let found = match registry.sensor_named(raw) {
            Some(s) => Ok(s),
            None => registered_sensor(&format!("sensor_ids/{i}"), raw, registry),
        };
        match found {
            Ok(s) => {
                sensors.push(s);
                if !unknown.is_empty() {
                    positions.push(i);
                }
            }
            Err(error) => {
                if unknown.is_empty() {
                    positions.extend(0..sensors.len());
                }
                unknown.push((i, FailedSensor { sensor_id: super::envelope::cut(raw), error }));
            }
        }
    }
    if sensors.is_empty() {
        return Err(whole_call_failure(unknown.into_iter().map(|(_, f)| f.error).collect()));
    }
    let position = |i: usize| positions.get(i).copied().unwrap_or(i);
    let mode = args.unit.unwrap_or_default();
    let max_age = args.max_age_ms.unwrap_or(0);
    let deadline = crate::reading::Reader::deadline(&inner.config);
    let read = inner.reader.read(&sensors, Some(max_age), deadline).await;
    *attempts += read.attempts;
    let mut stamps = Stamps::new();
    let mut slots: Vec<Slot> = sensors
        .iter()
        .zip(read.results)
        .map(|(s, r)| match r {
            Ok((sample, from)) => Slot::Read(sample, source(from)),
            Err(e) => Slot::Failed(Box::new(device_error(&e, registry.device_of(s), s))),
        })
        .collect();
    let mut failed: Vec<(usize, FailedSensor)> = Vec::new();
    // Where in `failed` a device failure has a cached value to offer, and its age.
    let mut cached: Vec<(usize, u64)> = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        match std::mem::replace(slot, Slot::Pending) {
            Slot::Failed(mut error) => {
                let at = position(i);
                error.parameter = Some(format!("sensor_ids/{at}"));
                if passing_device_failure(&error)
                    && let Some(age) = inner.reader.cache().age_ms(sensors[i], stamps.now)
                {
                    cached.push((failed.len(), age));
                }
                failed.push((at, FailedSensor { sensor_id: sensors[i].id.to_string(), error: *error }));
            }
            Slot::Pending => return Err(ToolError::internal()),
            read => *slot = read,
        }
    }
    let read_none = failed.len() == sensors.len();
    // Each failed sensor offers its own; a call that read nothing offers them once (below).
    if !read_none {
        for &(k, age) in &cached {
            if let Some((_, f)) = failed.get_mut(k) {
                f.error.hint.push_str(&cached_note(age, None));
            }
        }
    }
    if !unknown.is_empty() {
        failed.extend(unknown);
        failed.sort_by_key(|(at, _)| *at);
    }
    let failed: Vec<FailedSensor> = failed.into_iter().map(|(_, f)| f).collect();
    if read_none {
        let several = failed.len() > 1;
        let mut e = whole_call_failure(failed.into_iter().map(|f| f.error).collect());
        if let Some(oldest) = cached.iter().map(|(_, age)| *age).max()
            && e.retryable
        {
            e.hint.push_str(&cached_note(oldest, several.then_some(cached.len())));
        }
        return Err(e);
    }
    // `ReadingsData`, written directly: readings, failed, complete.
    let mut out = String::with_capacity(64 + 256 * sensors.len().saturating_sub(failed.len()));
    out.push_str("{\"readings\":[");
    for (n, (s, (sample, source))) in sensors
        .iter()
        .zip(&slots)
        .filter_map(|(s, slot)| match slot {
            Slot::Read(sample, source) => Some((s, (sample, *source))),
            _ => None,
        })
        .enumerate()
    {
        if n > 0 {
            out.push(',');
        }
        match inner.reading_json.get(s.place.sensor) {
            Some(parts) => write_reading(&mut out, parts, s, sample, mode, source, &mut stamps),
            None => write_reading(&mut out, &ReadingJson::of(s), s, sample, mode, source, &mut stamps),
        }
    }
    out.push_str("],\"failed\":");
    out.push_str(&serde_json::to_string(&failed).map_err(|_| ToolError::internal())?);
    out.push_str(",\"complete\":");
    json::boolean(&mut out, failed.is_empty());
    out.push('}');
    json::into_data(out)
}

/// Where each sensor of a batch stands.
enum Slot {
    Pending,
    Read(Sample, ReadingSource),
    Failed(Box<ToolError>),
}

/// A batch that read no sensor at all: one error with every failure in `details`. Its code
/// is the failures' own when they all share it; otherwise `DEVICE_UNAVAILABLE` when any is
/// worth retrying, else `SENSOR_NOT_FOUND`.
fn whole_call_failure(errors: Vec<ToolError>) -> ToolError {
    let Some(first) = errors.first() else { return ToolError::internal() };
    let same = errors.iter().all(|e| e.code == first.code);
    let mut e = combine(errors.clone(), "sensors could not be read");
    if !same && errors.len() > 1 {
        let (code, hint) = if errors.iter().any(|e| e.retryable) {
            (
                ErrorCode::DeviceUnavailable,
                "Some sensors may be readable later: see details; wait retry_after_ms, and fix the unknown IDs (list_sensors).",
            )
        } else {
            (ErrorCode::SensorNotFound, "See details for each sensor; list_sensors shows valid IDs.")
        };
        let mut again = ToolError::new(code, e.message.clone(), hint);
        again.retry_after_ms = e.retry_after_ms.filter(|_| again.retryable);
        again.details = std::mem::take(&mut e.details);
        again.device_id = e.device_id.take();
        again.blameless = e.blameless;
        e = again;
    }
    e
}

/// Several errors as one: the first error's code, every one in `details`.
fn combine(mut errors: Vec<ToolError>, what: &str) -> ToolError {
    if errors.len() == 1 {
        return errors.remove(0);
    }
    // The schema asks for at least one sensor; an empty list never gets here.
    let Some(first) = errors.first().cloned() else { return ToolError::internal() };
    let mut e = ToolError::new(first.code, format!("{} {what}.", errors.len()), first.hint.clone());
    e.retry_after_ms = errors.iter().filter_map(|e| e.retry_after_ms).max().filter(|_| e.retryable);
    e.blameless = errors.iter().all(|e| e.blameless);
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
    use super::*;
    use crate::driver::SampleQuality;
    use crate::registry::{ModbusPoint, NormalRange, RegisterTable, WordOrder};
    use proptest::prelude::*;
    use std::time::Duration;

    fn sensor(source: SensorSource, unit: String, range: Option<NormalRange>) -> Sensor {
        Sensor {
            id: "A_LINE1_042".parse().unwrap(),
            device: "a-line1-plc".parse().unwrap(),
            place: crate::registry::Place::UNPLACED,
            description: String::new(),
            kind: "pressure".into(),
            unit,
            equipment: None,
            source,
            range,
            deadband: None,
        }
    }

    fn any_value() -> impl Strategy<Value = RawValue> {
        prop_oneof![
            any::<bool>().prop_map(RawValue::Bool),
            any::<i64>().prop_map(RawValue::Int),
            any::<u64>().prop_map(RawValue::UInt),
            any::<f64>().prop_map(RawValue::Float),
            prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(1e300), Just(-0.0)]
                .prop_map(RawValue::Float),
            any::<String>().prop_map(RawValue::Text),
            Just(RawValue::Text("a \"quoted\"\\ text\n\u{1}\u{7f}é😀".into())),
        ]
    }

    fn any_source() -> impl Strategy<Value = SensorSource> {
        let types = prop_oneof![
            Just(DataType::F32),
            Just(DataType::F64),
            Just(DataType::I16),
            Just(DataType::U32),
            Just(DataType::Bool)
        ];
        prop_oneof![
            (types, -1e6..1e6f64, -1e3..1e3f64).prop_map(|(data_type, scale, offset)| {
                SensorSource::Modbus(ModbusPoint {
                    table: RegisterTable::Holding,
                    address: 0,
                    data_type,
                    word_order: WordOrder::ABCD,
                    bit: None,
                    count: 2,
                    scale,
                    offset,
                })
            }),
            Just(SensorSource::OpcUa { node_id: "ns=2;s=X".into() }),
        ]
    }

    proptest! {
        /// The hand-written JSON of a batch is the JSON serde writes for the same reading.
        #[test]
        fn written_readings_equal_serde(
            value in any_value(),
            source in any_source(),
            unit in prop_oneof![Just("bar".to_string()), Just("°C \"x\"\t".to_string()), any::<String>()],
            range in proptest::option::of((any::<f64>(), -1e9..1e9f64)),
            quality in prop_oneof![Just(SampleQuality::Good), Just(SampleQuality::Uncertain), Just(SampleQuality::Bad)],
            raw in any::<bool>(),
            cached in any::<bool>(),
            ms in 0i64..4_000_000_000_000,
            age in -5_000i64..5_000,
        ) {
            let range = range.map(|(min, max)| NormalRange { min, max });
            let s = sensor(source, unit, range);
            let at = DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
            let sample = Sample { value, at, quality };
            let mode = if raw { UnitMode::Raw } else { UnitMode::Normalized };
            let source = if cached { ReadingSource::Cache } else { ReadingSource::Live };
            let now = at + chrono::Duration::milliseconds(age);
            let mut stamps = Stamps { now, last: None, middle: None };
            let expected = serde_json::to_string(&reading(&s, &sample, mode, source, &mut stamps)).unwrap();
            let mut written = String::new();
            let mut stamps = Stamps { now, last: None, middle: None };
            write_reading(&mut written, &ReadingJson::of(&s), &s, &sample, mode, source, &mut stamps);
            prop_assert_eq!(written, expected);
        }

        /// A batch writes many readings with one `Stamps`: what it keeps from one reading
        /// never leaks into the next (another instant, quality or source).
        #[test]
        fn readings_written_in_a_row_equal_serde(
            samples in proptest::collection::vec(
                (
                    -1e6..1e6f64,
                    prop_oneof![Just(SampleQuality::Good), Just(SampleQuality::Uncertain), Just(SampleQuality::Bad)],
                    any::<bool>(),
                    prop_oneof![Just(0i64), Just(1), 0i64..100_000],
                ),
                1..8,
            ),
            now_ms in 50_000i64..200_000,
        ) {
            let s = sensor(SensorSource::OpcUa { node_id: "ns=2;s=X".into() }, "bar".into(), None);
            let parts = ReadingJson::of(&s);
            let now = DateTime::<Utc>::from_timestamp_millis(now_ms).unwrap();
            let mut shared = Stamps { now, last: None, middle: None };
            for (v, quality, cached, ms) in samples {
                let at = DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
                let sample = Sample { value: RawValue::Float(v), at, quality };
                let source = if cached { ReadingSource::Cache } else { ReadingSource::Live };
                let mode = UnitMode::Normalized;
                let mut fresh = Stamps { now, last: None, middle: None };
                let expected = serde_json::to_string(&reading(&s, &sample, mode, source, &mut fresh)).unwrap();
                let mut written = String::new();
                write_reading(&mut written, &parts, &s, &sample, mode, source, &mut shared);
                prop_assert_eq!(written, expected);
            }
        }
    }

    fn significant(v: f64, digits: i32) -> f64 {
        rounded(v, digits).0
    }

    /// Log-uniform magnitudes from 10^-8 to 10^18, either sign, and the f32 values a
    /// register holds.
    fn any_reading() -> impl Strategy<Value = f64> {
        prop_oneof![
            (-8.0..18.0f64, 1.0..10.0f64, any::<bool>()).prop_map(|(e, m, neg)| if neg {
                -m * 10f64.powf(e)
            } else {
                m * 10f64.powf(e)
            }),
            any::<f32>().prop_map(f64::from),
            // Just below a power of ten: rounding carries into the next digit.
            (-6i32..17, 1u32..100).prop_map(|(e, k)| 10f64.powi(e) * (1.0 - f64::from(k) * 1e-9)),
            (-1e6..1e6f64).prop_map(|v| (v * 100.0).round() / 100.0),
            // Each decimal exponent around where serde_json turns to exponent notation.
            (-8i32..=18, 1.0..10.0f64).prop_map(|(e, m)| m * 10f64.powi(e)),
        ]
    }

    proptest! {
        /// Where the batch prints a rounded value from its digits, the text is what
        /// serde_json writes for the rounded f64.
        #[test]
        fn decimal_digits_are_serde_text(v in any_reading(), digits in prop_oneof![Just(7), Just(12)]) {
            let (value, decimal) = rounded(v, digits);
            let mut out = String::new();
            let written = decimal.is_some_and(|d| json::decimal(&mut out, d));
            if written {
                prop_assert_eq!(
                    &out,
                    &serde_json::to_string(&value).unwrap(),
                    "{} {:?}", v, decimal
                );
            }
            // The usual readings take this path.
            prop_assert!(written || !(1e-4..1e14).contains(&v.abs()), "{}", v);
        }

        #[test]
        fn round_is_f64_round(x in prop_oneof![
            any::<f64>(),
            (-1e7..1e7f64).prop_map(|v| v.trunc() + 0.5),
            (-1e7..1e7f64).prop_map(f64::trunc).prop_map(|v| v + 0.49999999999999994),
            (-4.6e15..4.6e15f64),
        ]) {
            prop_assert_eq!(round(x).to_bits(), x.round().to_bits(), "{}", x);
        }

        #[test]
        fn decimal_exponent_is_the_exact_powers_search(a in prop_oneof![
            1.0..1e22f64,
            (0.0..22.0f64).prop_map(|e| 10f64.powf(e)),
            (0usize..23).prop_map(|k| EXACT_POW10[k]),
            (1usize..23).prop_map(|k| f64::from_bits(EXACT_POW10[k].to_bits() - 1)),
        ]) {
            let by_search = EXACT_POW10.partition_point(|p| *p <= a) as i32 - 1;
            prop_assert_eq!(decimal_exponent(a), by_search, "{}", a);
        }
    }

    #[test]
    fn the_cached_value_is_offered_with_a_max_age_ms_that_reaches_it() {
        assert_eq!(
            cached_note(41_234, None),
            " The last value read, 42 s old, is available: call again with max_age_ms of at least 42000 (e.g. 60000) to get it."
        );
        // Just read: one second, never "0 s".
        assert!(
            cached_note(0, None).contains(", 1 s old, ") && cached_note(0, None).contains("at least 1000 ")
        );
        // Longer ages in larger units; the example stays ahead of the age.
        let note = cached_note(55_000, Some(1));
        assert!(note.starts_with(" The last value read of one of these sensors, 55 s old"), "{note}");
        assert!(note.contains("at least 55000 (e.g. 120000)"), "{note}");
        let note = cached_note(3_600_000, Some(3));
        assert!(
            note.starts_with(
                " The last values read of 3 of these sensors are available, the oldest 60 min old"
            )
        );
        assert!(note.ends_with("at least 3600000 (e.g. 3660000) to get them."), "{note}");
        assert!(cached_note(10 * 3_600_000, None).contains(", 10 h old, "));
        // Up to the largest max_age_ms, and nothing beyond.
        assert!(cached_note(86_399_500, None).contains("at least 86400000 to get it."));
        assert_eq!(cached_note(86_400_001, None), "");
    }

    #[test]
    fn the_cache_keeps_the_newest_sample_at_the_sensor_place() {
        let cache = Cache::new(3);
        let mut s = sensor(SensorSource::OpcUa { node_id: "ns=2;s=X".into() }, "bar".into(), None);
        let at = |ms| DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
        let sample = |v, ms| Sample { value: RawValue::Float(v), at: at(ms), quality: SampleQuality::Good };
        // Outside a registry: nothing is stored or found.
        cache.put(&s, &sample(1.0, 1_000));
        assert!(cache.fresh(&s, 10_000, at(1_000)).is_none());
        s.place = crate::registry::Place { sensor: 1, device: 0 };
        assert!(cache.fresh(&s, 10_000, at(1_000)).is_none());
        cache.put(&s, &sample(2.0, 2_000));
        // A late read of an older value does not replace it.
        cache.put(&s, &sample(3.0, 1_500));
        let hit = cache.fresh(&s, 10_000, at(2_500)).unwrap();
        assert_eq!((hit.value, hit.at), (RawValue::Float(2.0), at(2_000)));
        // Too old, or from the future, or max_age_ms 0: a miss.
        assert!(cache.fresh(&s, 400, at(2_500)).is_none());
        assert!(cache.fresh(&s, 10_000, at(1_999)).is_none());
        assert!(cache.fresh(&s, 0, at(2_000)).is_none());
        // Its age, for a failed read's hint; none from before it was read.
        assert_eq!(cache.age_ms(&s, at(2_500)), Some(500));
        assert_eq!(cache.age_ms(&s, at(1_999)), None);
        // Other places are untouched.
        s.place.sensor = 0;
        assert!(cache.fresh(&s, 10_000, at(2_500)).is_none());
        assert_eq!(cache.age_ms(&s, at(2_500)), None);
    }

    #[test]
    fn significant_digits_remove_binary_noise_only() {
        assert_eq!(significant(f64::from(123.456f32), 7), 123.456);
        assert_eq!(significant(723.0 * 0.1, 12), 72.3);
        assert_eq!(significant(-0.000_123_456_78, 7), -0.000_123_456_8);
        assert_eq!(significant(48_214_131.0, 12), 48_214_131.0);
        assert_eq!(significant(1.5e30, 7), 1.5e30);
        assert_eq!(significant(0.0, 7), 0.0);
        assert_eq!(significant(999_999.96, 7), 1_000_000.0);
        assert_eq!(significant(1e22, 7), 1e22);
        assert_eq!(significant(f64::from(0.1f32), 7), 0.1);
        for (a, e) in
            [(1.0, 0), (9.999, 0), (10.0, 1), (999.999_999_999_999_9, 2), (1e21, 21), (0.05, -2), (2e30, 30)]
        {
            assert_eq!(decimal_exponent(a), e, "{a}");
        }
    }

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
        let s = sensor(SensorSource::Modbus(point), "bar".into(), None);
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
