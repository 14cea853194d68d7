//! `get_sensor_reading` and `get_sensor_readings`: live values, or young cached ones.

use super::defs::{FailedSensor, GetSensorReadingArgs, GetSensorReadingsArgs, ReadingSource, UnitMode};
use super::device_error::device_error;
use super::envelope::{Detail, ErrorCode, ToolError};
use super::reading_json::{ReadingJson, Stamps, reading, write_reading};
use super::validate::registered_sensor;
use super::{ToolResult, View, json, to_data};
use crate::driver::Sample;
use crate::reading::{Cache, Source};
use crate::registry::{Registry, Sensor};

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
        && let Some(age) = cache.age_ms(sensor, chrono::Utc::now())
    {
        e.hint.push_str(&cached_note(age, None));
    }
    e
}

/// Where the answer's value came from: at the fleet hub, always its edge node's stream.
fn source(s: Source, sensor: &Sensor) -> ReadingSource {
    match (s, &sensor.source) {
        (_, crate::registry::SensorSource::Edge(_)) => ReadingSource::Hub,
        (Source::Live, _) => ReadingSource::Live,
        (Source::Cache, _) => ReadingSource::Cache,
    }
}

pub(crate) async fn get_one(inner: &View, args: GetSensorReadingArgs, attempts: &mut u32) -> ToolResult {
    let registry = &inner.core.registry;
    let sensor = registered_sensor("sensor_id", &args.sensor_id, registry)?;
    let mode = args.unit.unwrap_or_default();
    let reader = &inner.core.reader;
    let deadline = crate::reading::Reader::deadline(&inner.core.config);
    let mut read = reader.read(&[sensor], Some(args.max_age_ms.unwrap_or(0)), deadline).await;
    *attempts += read.attempts;
    let mut stamps = Stamps::new();
    match read.results.pop() {
        Some(Ok((sample, from))) => {
            let alarm = super::alarms::reading_alarm(inner, sensor);
            to_data(&reading(sensor, &sample, mode, source(from, sensor), &mut stamps, alarm))
        }
        Some(Err(e)) => {
            Err(offer_cached(device_error(&e, registry.device_of(sensor), sensor), reader.cache(), sensor))
        }
        None => Err(ToolError::internal()),
    }
}

pub(crate) async fn get_many(
    inner: &View,
    args: GetSensorReadingsArgs<'_>,
    attempts: &mut u32,
) -> ToolResult {
    let registry = &inner.core.registry;
    let Batch { sensors, positions, unknown } = batch(registry, &args.sensor_ids);
    if sensors.is_empty() {
        return Err(whole_call_failure(unknown.into_iter().map(|(_, f)| f.error).collect()));
    }
    let position = |i: usize| positions.get(i).copied().unwrap_or(i);
    let mode = args.unit.unwrap_or_default();
    let max_age = args.max_age_ms.unwrap_or(0);
    let deadline = crate::reading::Reader::deadline(&inner.core.config);
    let read = inner.core.reader.read(&sensors, Some(max_age), deadline).await;
    *attempts += read.attempts;
    let mut stamps = Stamps::new();
    let mut slots: Vec<Slot> = sensors
        .iter()
        .zip(read.results)
        .map(|(s, r)| match r {
            Ok((sample, from)) => Slot::Read(sample, source(from, s)),
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
                    && let Some(age) = inner.core.reader.cache().age_ms(sensors[i], stamps.now)
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
    write_readings(inner, &sensors, &slots, &failed, mode, &mut stamps)
}

/// The sensors of a batch in request order, with their positions in the request when
/// some IDs are unknown.
struct Batch<'r> {
    sensors: Vec<&'r Sensor>,
    /// Each sensor's position in the request; empty while every ID so far was known.
    positions: Vec<usize>,
    /// Unknown (or removed) sensors, which fail alone next to the readings of the others.
    unknown: Vec<(usize, FailedSensor)>,
}

fn batch<'r>(registry: &'r Registry, ids: &[&str]) -> Batch<'r> {
    let mut sensors = Vec::with_capacity(ids.len());
    // Each sensor's position in the request, when some IDs are unknown.
    let mut positions: Vec<usize> = Vec::new();
    // Unknown (or removed) sensors fail alone, next to the readings of the others.
    let mut unknown: Vec<(usize, FailedSensor)> = Vec::new();
    for (i, raw) in ids.iter().enumerate() {
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
    Batch { sensors, positions, unknown }
}

/// `ReadingsData`, written directly: readings, failed, complete.
fn write_readings(
    inner: &View,
    sensors: &[&Sensor],
    slots: &[Slot],
    failed: &[FailedSensor],
    mode: UnitMode,
    stamps: &mut Stamps,
) -> ToolResult {
    let mut out = String::with_capacity(64 + 256 * sensors.len().saturating_sub(failed.len()));
    out.push_str("{\"readings\":[");
    for (n, (s, (sample, source))) in sensors
        .iter()
        .zip(slots)
        .filter_map(|(s, slot)| match slot {
            Slot::Read(sample, source) => Some((s, (sample, *source))),
            _ => None,
        })
        .enumerate()
    {
        if n > 0 {
            out.push(',');
        }
        let alarm = super::alarms::reading_alarm(inner, s);
        match inner.reading_json.get(s.place.sensor) {
            Some(parts) => write_reading(&mut out, parts, s, sample, mode, source, stamps, alarm.as_ref()),
            None => {
                write_reading(&mut out, &ReadingJson::of(s), s, sample, mode, source, stamps, alarm.as_ref())
            }
        }
    }
    out.push_str("],\"failed\":");
    out.push_str(&serde_json::to_string(failed).map_err(|_| ToolError::internal())?);
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
}
