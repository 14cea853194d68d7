//! A reading as the agent sees it: the value judged against the sensor (unit mode,
//! range, quality), rounded to the digits its source carries, and written as JSON, with
//! each sensor's fixed parts written once.
//!
//! A batch's readings are written directly (`write_reading`, with the small writers of
//! `tools/json.rs`) instead of through a serde `Reading` per sensor: the parts of a reading
//! that never change are written once per registry (`ReadingJson`), the timestamp-to-age
//! part once per block read together, and a value rounded to significant digits is printed
//! from those digits. A test keeps the output byte for byte equal to serde's.

use chrono::{DateTime, SecondsFormat, Utc};

use super::defs::{Quality, Reading, ReadingAlarm, ReadingSource, UnitMode, Value};
use super::json;
use crate::driver::Sample;
use crate::driver::{RawValue, scaled};
use crate::registry::{DataType, EdgePoint, Sensor, SensorSource};

/// Formats timestamps and ages, once per distinct instant (a batch shares a few).
pub(crate) struct Stamps {
    /// The instant ages are counted to.
    pub(crate) now: DateTime<Utc>,
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
                ReadingSource::Hub => ",\"source\":\"hub\"",
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

/// An integer the device sent, exact, when no scale or offset applies to it (`point`: the
/// Modbus point whose scaling the value takes, `None` when it takes none).
pub(crate) fn exact_integer(point: Option<&crate::registry::ModbusPoint>, raw: &RawValue) -> Option<Value> {
    if point.is_some_and(|p| p.scale != 1.0 || p.offset != 0.0) {
        return None;
    }
    match raw {
        RawValue::Int(i) => Some(Value::Int(*i)),
        RawValue::UInt(u) => Some(Value::unsigned(*u)),
        _ => None,
    }
}

/// A reading's value before it is owned: what `reading` and `write_reading` share.
enum ValueRef<'a> {
    /// An integer, exact ([`Value::Int`] or [`Value::UInt`]).
    Integer(Value),
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
        SensorSource::Edge(EdgePoint { data_type: Some(DataType::F32), .. }) => rounded(v, 7).0,
        SensorSource::Edge(EdgePoint { data_type: Some(t), .. }) if *t != DataType::F64 => rounded(v, 12).0,
        _ => v,
    }
}

fn judge<'a>(sensor: &Sensor, sample: &'a Sample, mode: UnitMode) -> Judged<'a> {
    let (point, data_type) = match &sensor.source {
        SensorSource::Modbus(p) => ((mode == UnitMode::Normalized).then_some(p), Some(p.data_type)),
        SensorSource::OpcUa { .. } => (None, None),
        // In the edge's units already; rounded as the edge rounds its type.
        SensorSource::Edge(p) => (None, p.data_type),
    };
    let (value, quality) = match &sample.value {
        _ if sample.quality == crate::driver::SampleQuality::Bad => (None, Quality::Bad),
        RawValue::Bool(b) => (Some(ValueRef::Bool(*b)), Quality::Good),
        RawValue::Text(t) => (Some(ValueRef::Text(t)), Quality::Good),
        number if let Some(i) = exact_integer(point, number) => (Some(ValueRef::Integer(i)), Quality::Good),
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
                // The device vouched for nothing better than "uncertain" and sent no value
                // (an OPC UA Uncertain status with a Null): uncertain, without a value.
                false if sample.quality == crate::driver::SampleQuality::Uncertain && v.is_nan() => {
                    (None, Quality::Uncertain)
                }
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
        (Some(ValueRef::Integer(i)), Some(r), UnitMode::Normalized) => {
            i.as_f64().map(|v| r.min <= v && v <= r.max)
        }
        _ => None,
    };
    Judged { value, quality, in_range }
}

/// The agent-facing reading of a sample.
/// The unit a reading is in: at the fleet hub always the sensor's (the edge sends its
/// values scaled, so there is no raw value to give, and none is labelled raw).
fn unit_mode(sensor: &Sensor, asked: UnitMode) -> UnitMode {
    match sensor.source {
        SensorSource::Edge(_) => UnitMode::Normalized,
        _ => asked,
    }
}

pub(crate) fn reading(
    sensor: &Sensor,
    sample: &Sample,
    mode: UnitMode,
    source: ReadingSource,
    stamps: &mut Stamps,
    alarm: Option<ReadingAlarm>,
) -> Reading {
    let mode = unit_mode(sensor, mode);
    let j = judge(sensor, sample, mode);
    let (timestamp, age_ms) = stamps.of(sample.at);
    Reading {
        sensor_id: sensor.id.to_string(),
        value: j.value.map(|v| match v {
            ValueRef::Integer(i) => i,
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
        alarm,
    }
}

/// Appends the JSON of `reading(...)` to `out`: the same bytes serde writes for it (a
/// test holds them equal), from the sensor's fixed parts (`parts`, from
/// [`ReadingJson::of`]) and what the sample says, without building a `Reading` per
/// sensor of a batch.
// The hot path of a batch: every part passed as it is, nothing gathered per sensor.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_reading(
    out: &mut String,
    parts: &ReadingJson,
    sensor: &Sensor,
    sample: &Sample,
    mode: UnitMode,
    source: ReadingSource,
    stamps: &mut Stamps,
    alarm: Option<&ReadingAlarm>,
) {
    let mode = unit_mode(sensor, mode);
    let j = judge(sensor, sample, mode);
    out.push_str(&parts.head);
    match j.value {
        None => out.push_str("null"),
        Some(ValueRef::Integer(Value::Int(i))) => json::signed(out, i),
        Some(ValueRef::Integer(Value::UInt(u))) => json::unsigned(out, u),
        Some(ValueRef::Integer(_)) => out.push_str("null"),
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
    // Rare and small: serde writes it, as it writes it in a `Reading`.
    if let Some(a) = alarm.and_then(|a| serde_json::to_string(a).ok()) {
        out.push_str(",\"alarm\":");
        out.push_str(&a);
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::SampleQuality;
    use crate::registry::{ModbusPoint, NormalRange, RegisterTable, WordOrder};
    use proptest::prelude::*;

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
            alarm in proptest::option::of((0usize..4, any::<bool>())),
        ) {
            use crate::store::alarm_journal::AlarmState::*;
            let alarm = alarm.map(|(n, named)| ReadingAlarm {
                state: [Normal, ActiveUnacknowledged, ActiveAcknowledged, ReturnedUnacknowledged][n],
                alarm_id: named.then(|| "A_B_001.HI".to_string()),
                priority: named.then_some(crate::registry::AlarmPriority::Critical),
            });
            let range = range.map(|(min, max)| NormalRange { min, max });
            let s = Sensor::for_tests(source, &unit, range);
            let at = DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
            let sample = Sample { value, at, quality };
            let mode = if raw { UnitMode::Raw } else { UnitMode::Normalized };
            let source = [ReadingSource::Cache, ReadingSource::Live, ReadingSource::Hub][usize::from(cached) + usize::from(raw && cached)];
            let now = at + chrono::Duration::milliseconds(age);
            let mut stamps = Stamps { now, last: None, middle: None };
            let expected = serde_json::to_string(&reading(&s, &sample, mode, source, &mut stamps, alarm.clone())).unwrap();
            let mut written = String::new();
            let mut stamps = Stamps { now, last: None, middle: None };
            write_reading(&mut written, &ReadingJson::of(&s), &s, &sample, mode, source, &mut stamps, alarm.as_ref());
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
            let s = Sensor::for_tests(SensorSource::OpcUa { node_id: "ns=2;s=X".into() }, "bar", None);
            let parts = ReadingJson::of(&s);
            let now = DateTime::<Utc>::from_timestamp_millis(now_ms).unwrap();
            let mut shared = Stamps { now, last: None, middle: None };
            for (v, quality, cached, ms) in samples {
                let at = DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
                let sample = Sample { value: RawValue::Float(v), at, quality };
                let source = if cached { ReadingSource::Cache } else { ReadingSource::Live };
                let mode = UnitMode::Normalized;
                let mut fresh = Stamps { now, last: None, middle: None };
                let expected = serde_json::to_string(&reading(&s, &sample, mode, source, &mut fresh, None)).unwrap();
                let mut written = String::new();
                write_reading(&mut written, &parts, &s, &sample, mode, source, &mut shared, None);
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
}
