//! `get_sensor_history`: stored points over a range, raw or per bucket, with cursors.

use chrono::{SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::defs::{Gap, GetSensorHistoryArgs, HistoryBucket, HistoryData, HistoryPoint, Quality, Value};
use super::envelope::{ErrorCode, ToolError};
use super::validate::registered_sensor;
use super::{View, when};
use crate::driver::{RawValue, normalize};
use crate::registry::{DataType, Sensor, SensorSource};
use crate::store::gorilla::{Point, Stored};

/// Longest range of raw points; longer ones need a bucket.
const MAX_RAW_MS: i64 = 7 * 86_400_000;
/// Most buckets one range may have.
const MAX_BUCKETS: i64 = 100_000;
/// Tolerated clock difference for `to` in the future.
use when::SKEW_MS;

const PAGING: super::cursor::Paging = super::cursor::Paging { this: "this query", other: "another query" };

#[derive(Serialize, Deserialize)]
struct Cursor {
    /// Raw: the last point's time; buckets: the last bucket's start.
    t: i64,
    /// The range the first page resolved (`to` omitted means "now", `-1h` an hour before
    /// it): later pages keep it, so paging returns each point exactly once.
    from: i64,
    to: i64,
}

fn rfc3339(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn invalid(param: &str, received: &str, expected: &str, message: String, hint: &str) -> ToolError {
    ToolError::invalid(param, Some(received), expected, message, hint)
}

/// `30s`, `5m`, `1h`, `1d` in milliseconds.
fn bucket_ms(raw: &str) -> Option<i64> {
    let (n, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: i64 = n.parse().ok().filter(|n| *n > 0)?;
    let unit = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// A stored value in the sensor's units (scale and offset applied at read time).
fn value_of(sensor: &Sensor, p: &Point) -> (Option<Value>, Quality, Option<f64>) {
    let quality = match p.quality {
        0 => Quality::Good,
        1 => Quality::Uncertain,
        _ => Quality::Bad,
    };
    let point = match &sensor.source {
        SensorSource::Modbus(m) => Some(m),
        SensorSource::OpcUa { .. } | SensorSource::Edge(_) => None,
    };
    let raw = match &p.value {
        Stored::Float(f) => RawValue::Float(*f),
        // A `u64` register stored before unsigned integers had a kind of their own.
        Stored::Int(i) if point.is_some_and(|m| m.data_type == DataType::U64) => RawValue::UInt(*i as u64),
        Stored::Int(i) => RawValue::Int(*i),
        Stored::UInt(u) => RawValue::UInt(*u),
        Stored::Bool(b) => RawValue::Bool(*b),
        Stored::Text(t) => RawValue::Text(t.clone()),
    };
    if quality != Quality::Bad
        && let Some(i) = super::reading_json::exact_integer(point, &raw)
    {
        let f = i.as_f64();
        return (Some(i), quality, f);
    }
    let v = match point {
        Some(m) => normalize(m, &raw),
        None => raw,
    };
    match v {
        _ if quality == Quality::Bad => (None, quality, None),
        RawValue::Bool(b) => (Some(Value::Bool(b)), quality, Some(f64::from(u8::from(b)))),
        RawValue::Text(t) => (Some(Value::Text(t)), quality, None),
        other => match other.as_f64().filter(|f| f.is_finite()) {
            // Rounded as readings are: no binary noise of an f32 or a scale factor.
            Some(f) => {
                let f = super::reading_json::significant(sensor, f);
                (Some(Value::Number(f)), quality, Some(f))
            }
            // Uncertain without a value, as the reading was.
            None if quality == Quality::Uncertain => (None, quality, None),
            None => (None, Quality::Bad, None),
        },
    }
}

/// The range and bucket width of a query: the cursor's pinned range on later pages, else
/// `from`/`to` resolved against `now`; refused when empty, in the future, or too large.
fn range(
    args: &GetSensorHistoryArgs,
    cursor: Option<&Cursor>,
    now: i64,
) -> Result<(i64, i64, Option<i64>), ToolError> {
    let (from, to) = match cursor {
        // A cursor's range was checked when it was issued; one that does not pass the checks
        // below was not issued by this service.
        Some(c) if c.from < 0 || c.from >= c.to || c.to > now + SKEW_MS => {
            return Err(invalid(
                "cursor",
                args.cursor.as_deref().unwrap_or(""),
                "the next_cursor of the previous page of this query",
                "`cursor` is not a cursor this service issued.".into(),
                "Pass next_cursor from the previous page unchanged with the same arguments, or omit cursor to start over.",
            ));
        }
        Some(c) => (c.from, c.to),
        None => when::range(&args.from, args.to.as_deref(), now)?,
    };
    let bucket = match &args.bucket {
        Some(b) => Some(bucket_ms(b).ok_or_else(|| {
            invalid(
                "bucket",
                b,
                "a count and s, m, h or d, e.g. 5m",
                "`bucket` is not a width.".into(),
                "Use 30s, 5m, 1h or 1d.",
            )
        })?),
        None => None,
    };
    match bucket {
        None if to - from > MAX_RAW_MS => {
            return Err(invalid(
                "to",
                args.to.as_deref().unwrap_or("now"),
                "at most 7 days after `from` for raw points",
                "Raw points are limited to 7 days per call.".into(),
                "Add a bucket such as \"1h\" to summarise longer ranges, or narrow the range.",
            ));
        }
        Some(w) if (to - from) / w > MAX_BUCKETS => {
            return Err(invalid(
                "bucket",
                args.bucket.as_deref().unwrap_or(""),
                "a width giving at most 100000 buckets over the range",
                "This range has too many buckets of that width.".into(),
                "Use a wider bucket, such as \"1h\" or \"1d\".",
            ));
        }
        _ => {}
    }
    Ok((from, to, bucket))
}

/// One page of raw points after `after`, and the time of its last point when more follow.
fn raw_page(
    sensor: &Sensor,
    points: &[Point],
    after: Option<i64>,
    limit: usize,
) -> (Vec<HistoryPoint>, Option<i64>) {
    let mut page = points.iter().filter(|p| after.is_none_or(|a| p.t > a));
    let mut out = Vec::new();
    let mut last = None;
    for p in page.by_ref().take(limit) {
        let (value, quality, _) = value_of(sensor, p);
        out.push(HistoryPoint { t: rfc3339(p.t), value, quality });
        last = Some(p.t);
    }
    (out, last.filter(|_| page.next().is_some()))
}

/// One page of buckets of width `w` starting after `after`, aligned to multiples of their
/// width since the epoch (empty ones are left out: see `gaps`), and the start of its last
/// bucket when more follow.
fn bucket_page(
    sensor: &Sensor,
    points: &[Point],
    w: i64,
    after: Option<i64>,
    limit: usize,
) -> (Vec<HistoryBucket>, Option<i64>) {
    let mut current: Option<Acc> = None;
    let mut done: Vec<(i64, HistoryBucket)> = Vec::new();
    let mut more = false;
    for p in points {
        let start = p.t.div_euclid(w) * w;
        if after.is_some_and(|a| start <= a) {
            continue;
        }
        if current.as_ref().is_some_and(|c| c.start != start) {
            if let Some(acc) = current.take() {
                done.push((acc.start, acc.finish(sensor)));
            }
            if done.len() == limit {
                more = true;
                break;
            }
        }
        let (value, _, num) = value_of(sensor, p);
        let c = current.get_or_insert_with(|| Acc::new(start, value.clone()));
        c.add(value, num);
    }
    if !more && let Some(acc) = current.take() {
        done.push((acc.start, acc.finish(sensor)));
    }
    let last = done.last().map(|(s, _)| *s).filter(|_| more);
    (done.into_iter().map(|(_, b)| b).collect(), last)
}

/// One bucket being filled.
struct Acc {
    start: i64,
    bucket: HistoryBucket,
    /// Sum of the float (and boolean) values, sum of the integers (exact: a float sum of
    /// 64-bit extremes loses the small ones), and the count of both, for the mean.
    sum: f64,
    ints: i128,
    numeric: u64,
    /// The least and greatest float (or boolean as 0/1) value, kept as plain numbers.
    lo: f64,
    hi: f64,
}

impl Acc {
    fn new(start: i64, first: Option<Value>) -> Acc {
        let bucket = HistoryBucket {
            start: rfc3339(start),
            count: 0,
            min: None,
            max: None,
            avg: None,
            first,
            last: None,
        };
        Acc { start, bucket, sum: 0.0, ints: 0, numeric: 0, lo: f64::INFINITY, hi: f64::NEG_INFINITY }
    }

    fn add(&mut self, value: Option<Value>, num: Option<f64>) {
        self.bucket.count += 1;
        // Min and max keep the values' type: integers exact, compared as integers (and
        // copied only when one becomes the new min or max); floats and booleans as numbers.
        match &value {
            Some(v @ (Value::Int(_) | Value::UInt(_))) => {
                use std::cmp::Ordering::{Greater, Less};
                self.ints += match v {
                    Value::Int(i) => i128::from(*i),
                    Value::UInt(u) => i128::from(*u),
                    _ => 0,
                };
                self.numeric += 1;
                let b = &mut self.bucket;
                if b.min.as_ref().is_none_or(|m| v.compare(m) == Some(Less)) {
                    b.min = Some(v.clone());
                }
                if b.max.as_ref().is_none_or(|m| v.compare(m) == Some(Greater)) {
                    b.max = Some(v.clone());
                }
            }
            Some(Value::Number(_) | Value::Bool(_)) => {
                if let Some(x) = num {
                    self.lo = self.lo.min(x);
                    self.hi = self.hi.max(x);
                    self.sum += x;
                    self.numeric += 1;
                }
            }
            _ => {}
        }
        self.bucket.last = value;
    }

    fn finish(self, sensor: &Sensor) -> HistoryBucket {
        let mut b = self.bucket;
        // Floats and integers in one bucket (a sensor whose type changed): the lesser wins.
        if self.lo <= self.hi {
            let (lo, hi) = (Value::Number(self.lo), Value::Number(self.hi));
            use std::cmp::Ordering::{Greater, Less};
            if b.min.as_ref().is_none_or(|m| lo.compare(m) == Some(Less)) {
                b.min = Some(lo);
            }
            if b.max.as_ref().is_none_or(|m| hi.compare(m) == Some(Greater)) {
                b.max = Some(hi);
            }
        }
        finish(sensor, b, self.ints as f64 + self.sum, self.numeric)
    }
}

/// `get_sensor_history`, typed.
pub fn history(inner: &View, args: &GetSensorHistoryArgs) -> Result<HistoryData, ToolError> {
    let registry = &inner.core.registry;
    let sensor = registered_sensor("sensor_id", &args.sensor_id, registry)?;
    let id = &sensor.id;
    let now = Utc::now().timestamp_millis();
    let f = super::cursor::fingerprint(&format!("{id}|{}|{:?}|{:?}", args.from, args.to, args.bucket));
    let cursor = match &args.cursor {
        Some(c) => Some(super::cursor::decode::<Cursor>(c, f, &PAGING)?),
        None => None,
    };
    let (from, to, bucket) = range(args, cursor.as_ref(), now)?;
    let after = cursor.as_ref().map(|c| c.t);
    let limit = args.limit.unwrap_or(GetSensorHistoryArgs::DEFAULT_LIMIT) as usize;
    let Some(store) = inner.core.history.as_ref() else {
        return Err(ToolError::new(
            ErrorCode::Internal,
            "History is not stored by this instance.",
            "Report this to an operator.",
        ));
    };
    let points = store.points(id.as_str(), from, to).map_err(|error| match error {
        // The database history is kept in cannot be read now: a passing failure.
        crate::store::StoreError::Remote(why) => {
            tracing::debug!(%why, sensor = %id, "history read failed");
            ToolError::new(
                ErrorCode::StorageUnavailable,
                "The history database cannot be read now; nothing was read.",
                "Retry after retry_after_ms; if it persists, tell an operator that fieldgate cannot reach its history database (get_device_status shows why).",
            )
            .with_retry_after(5000)
        }
        error => {
            tracing::error!(%error, sensor = %id, "history read failed");
            ToolError::internal()
        }
    })?;
    let device = registry.device_of(sensor);
    let poll = device.poll_interval.map_or(0, |d| d.as_millis() as i64);
    let gap_ms = inner.core.config.history.max_silence_s as i64 * 1000 + 3 * poll.max(1000);
    let gaps: Vec<Gap> = points
        .windows(2)
        .filter(|w| w[1].t - w[0].t > gap_ms)
        .map(|w| Gap { from: rfc3339(w[0].t), to: rfc3339(w[1].t) })
        .collect();
    let encode = |t: i64| super::cursor::encode(Cursor { t, from, to }, f);
    let (raw_out, buckets_out, last) = match bucket {
        None => {
            let (page, last) = raw_page(sensor, &points, after, limit);
            (page, Vec::new(), last)
        }
        Some(w) => {
            let (page, last) = bucket_page(sensor, &points, w, after, limit);
            (Vec::new(), page, last)
        }
    };
    let next = last.map(encode);
    let data = HistoryData {
        sensor_id: id.to_string(),
        unit: sensor.unit.clone(),
        from: rfc3339(from),
        to: rfc3339(to),
        bucket: args.bucket.clone(),
        points: raw_out,
        buckets: buckets_out,
        first_sample: points.first().map(|p| rfc3339(p.t)),
        last_sample: points.last().map(|p| rfc3339(p.t)),
        gaps,
        complete: next.is_none(),
        next_cursor: next,
    };
    Ok(data)
}

/// The average, once the bucket is complete: over its numeric values only.
fn finish(sensor: &Sensor, mut b: HistoryBucket, sum: f64, numeric: u64) -> HistoryBucket {
    if numeric > 0 {
        let mean = sum / numeric as f64;
        // Integers exact: their mean is not rounded to a scaled type's digits; and a mean
        // never lies outside min and max (as the rounding of large values could put it).
        let exact = matches!(b.min, Some(Value::Int(_) | Value::UInt(_)));
        let mean = if exact { mean } else { super::reading_json::significant(sensor, mean) };
        let (lo, hi) = (b.min.as_ref().and_then(Value::as_f64), b.max.as_ref().and_then(Value::as_f64));
        b.avg = Some(match (lo, hi) {
            (Some(lo), Some(hi)) if lo <= hi => mean.clamp(lo, hi),
            _ => mean,
        });
    }
    b
}

#[cfg(test)]
mod tests {
    use super::{Acc, Value};

    /// 64-bit extremes in one bucket: their sum is exact (a float sum gave a mean of
    /// -0.0588 for values whose mean is -0.4706), min and max keep their type.
    #[test]
    fn a_buckets_integers_are_summed_exactly() {
        let mut a = Acc::new(0, None);
        let values = [i64::MIN, i64::MAX, -1, 0, i64::MIN, i64::MAX, -1, 0, -7];
        for v in values {
            a.add(Some(Value::Int(v)), Some(v as f64));
        }
        assert_eq!((a.ints, a.numeric), (-11, 9));
        assert_eq!((a.bucket.min, a.bucket.max), (Some(Value::Int(i64::MIN)), Some(Value::Int(i64::MAX))));
        let mut u = Acc::new(0, None);
        for v in [u64::MAX, 0, u64::MAX, 1] {
            u.add(Some(Value::UInt(v)), Some(v as f64));
        }
        assert_eq!(u.ints, 2 * i128::from(u64::MAX) + 1);
        // Floats and booleans go the float way.
        let mut f = Acc::new(0, None);
        f.add(Some(Value::Number(0.5)), Some(0.5));
        f.add(Some(Value::Bool(true)), Some(1.0));
        assert_eq!((f.sum, f.numeric, f.lo, f.hi), (1.5, 2, 0.5, 1.0));
    }
}
