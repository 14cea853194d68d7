//! What a Sparkplug metric says, read as the hub needs it: the properties a birth gives
//! (fieldgate's edges send them all, others fewer), the quality, and the value as its
//! birth's datatype says (never reinterpreted).

use chrono::{DateTime, Utc};

use crate::driver::{RawValue, SampleQuality};
use crate::spb::payload::{Metric, PropertyValueKind, Value, datatype as dt};

/// The metric an edge node's NBIRTH carries for the host, not a value of its own.
pub const BD_SEQ: &str = "bdSeq";

/// A birth's or death's `bdSeq`: an integer metric (Sparkplug says Int64), not negative.
/// A value of another type, or a negative one, is none.
pub fn bd_seq_of(payload: &crate::spb::payload::Payload) -> Option<u64> {
    let m = payload.metrics.iter().find(|m| m.name.as_deref() == Some(BD_SEQ))?;
    match (m.datatype, m.value.as_ref()?) {
        (Some(dt::INT64), Value::Long(v)) => i64::try_from(*v).ok().map(|v| v as u64),
        (Some(dt::INT8 | dt::INT16 | dt::INT32), Value::Int(v)) => i32::try_from(*v).ok().map(|v| v as u64),
        (Some(dt::UINT8 | dt::UINT16) | None, Value::Int(v)) => Some(u64::from(*v)),
        (Some(dt::UINT32 | dt::UINT64) | None, Value::Long(v)) => Some(*v),
        _ => None,
    }
}

/// What a metric's birth says about it (properties of fieldgate's edges; others may send
/// fewer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Props {
    pub unit: String,
    pub kind: String,
    pub description: String,
    pub range: Option<(f64, f64)>,
    pub equipment: Option<String>,
    /// The device's protocol at the edge (`modbus-tcp`, `opcua`).
    pub protocol: Option<String>,
    /// The register type in the device file (Modbus only).
    pub data_type: Option<String>,
    /// Whether the edge records the sensor's history (its device is polled or subscribed).
    pub history: Option<bool>,
    /// The longest a healthy edge goes without sending the metric (ms).
    pub expected_interval_ms: Option<u64>,
}

pub fn props(m: &Metric) -> Props {
    let Some(p) = &m.properties else { return Props::default() };
    // Cut to what a person reads (a hostile birth could send megabytes of it).
    let text = |k: &str| match p.get(k).and_then(|v| v.value.as_ref()) {
        Some(PropertyValueKind::String(s)) => {
            let most = if k == "description" { 500 } else { 64 };
            Some(crate::plain::shown(&s.chars().take(most).collect::<String>()))
        }
        _ => None,
    };
    let number = |k: &str| match p.get(k).and_then(|v| v.value.as_ref()) {
        Some(PropertyValueKind::Double(v)) => Some(*v),
        Some(PropertyValueKind::Float(v)) => Some(f64::from(*v)),
        Some(PropertyValueKind::Int(v)) => Some(f64::from(*v)),
        Some(PropertyValueKind::Long(v)) => Some(*v as f64),
        _ => None,
    };
    Props {
        unit: text("engUnit").unwrap_or_default(),
        kind: text("kind").unwrap_or_default(),
        description: text("description").unwrap_or_default(),
        range: number("engLow")
            .zip(number("engHigh"))
            .filter(|(l, h)| l.is_finite() && h.is_finite() && l <= h),
        equipment: text("equipment"),
        protocol: text("protocol"),
        data_type: text("dataType"),
        history: match p.get("history").and_then(|v| v.value.as_ref()) {
            Some(PropertyValueKind::Boolean(b)) => Some(*b),
            _ => None,
        },
        expected_interval_ms: number("expectedIntervalMs").filter(|v| *v >= 0.0).map(|v| v as u64),
    }
}

/// The quality a metric carries (`Quality`: 192 good, 500 stale, 0 bad; none: good).
pub fn quality(m: &Metric) -> SampleQuality {
    match m.properties.as_ref().and_then(|p| p.get("Quality")).and_then(|v| v.value.as_ref()) {
        None => SampleQuality::Good,
        Some(PropertyValueKind::Int(192)) => SampleQuality::Good,
        Some(PropertyValueKind::Int(500)) => SampleQuality::Uncertain,
        Some(_) => SampleQuality::Bad,
    }
}

/// A metric's value as its birth's datatype says; `None` for null, or a value that is not
/// of that type (never reinterpreted).
pub fn raw_value(datatype: u32, m: &Metric) -> Option<RawValue> {
    if m.is_null == Some(true) {
        return None;
    }
    Some(match (datatype, m.value.as_ref()?) {
        (dt::INT8, Value::Int(v)) => RawValue::Int(i64::from(*v as u8 as i8)),
        (dt::INT16, Value::Int(v)) => RawValue::Int(i64::from(*v as u16 as i16)),
        (dt::INT32, Value::Int(v)) => RawValue::Int(i64::from(*v as i32)),
        (dt::UINT8 | dt::UINT16 | dt::UINT32, Value::Int(v)) => RawValue::UInt(u64::from(*v)),
        (dt::UINT32, Value::Long(v)) => RawValue::UInt(u64::from(*v as u32)),
        (dt::INT64, Value::Long(v)) => RawValue::Int(*v as i64),
        (dt::UINT64, Value::Long(v)) => RawValue::UInt(*v),
        (dt::FLOAT, Value::Float(v)) => RawValue::Float(f64::from(*v)),
        (dt::DOUBLE, Value::Double(v)) => RawValue::Float(*v),
        (dt::BOOLEAN, Value::Boolean(b)) => RawValue::Bool(*b),
        (dt::STRING, Value::String(s)) if s.len() <= crate::driver::MAX_TEXT => {
            RawValue::Text(crate::plain::shown(s))
        }
        _ => return None,
    })
}

/// The latest value of a metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Latest {
    pub value: Option<RawValue>,
    pub at: DateTime<Utc>,
    pub quality: SampleQuality,
}

#[derive(Debug, Clone)]
pub struct MetricState {
    pub name: String,
    pub alias: Option<u64>,
    pub datatype: u32,
    pub props: Props,
    pub latest: Option<Latest>,
    /// Its alias is another metric's of the edge node too (or given twice in one birth):
    /// data by it cannot be placed, so no value of it is served.
    pub alias_shared: bool,
}

/// Where a metric is: its edge node, device (`None`: the node's own) and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct At {
    pub edge: usize,
    pub device: Option<usize>,
    pub metric: usize,
}

/// A value applied: for history, and (`live`) the latest value of its metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub at: At,
    pub value: Option<RawValue>,
    pub time: DateTime<Utc>,
    pub quality: SampleQuality,
    /// Sent as historical (store-and-forward): history only.
    pub historical: bool,
    /// Became the metric's latest value.
    pub live: bool,
}

/// The metrics a birth defines, keeping what was known of those it names again (their
/// latest value), and the aliases it gives them.
pub fn define(metrics: &[Metric], before: impl Fn(&str) -> Option<Latest>) -> Vec<MetricState> {
    metrics
        .iter()
        .map(|m| {
            let name = m.name.clone().unwrap_or_default();
            MetricState {
                latest: before(&name),
                name,
                alias: m.alias,
                datatype: m.datatype.unwrap_or(0),
                props: props(m),
                alias_shared: false,
            }
        })
        .collect()
}

/// A latest value this far ahead of the hub's clock is no reference for what is newer.
const AHEAD: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

/// A metric's value applied: to history always; as the latest value when it is live and
/// newer than the latest (a birth's value always is: it says what is current), or when
/// the latest is from the future (an edge's clock that ran ahead must not freeze it).
pub fn apply_value(
    at: At,
    slot: &mut MetricState,
    m: &Metric,
    time: DateTime<Utc>,
    birth: bool,
    wall: DateTime<Utc>,
    out: &mut Vec<Update>,
) {
    if slot.name == BD_SEQ
        || slot.name.starts_with("Node Control/")
        || slot.name.starts_with("Device Control/")
    {
        return;
    }
    let value = raw_value(slot.datatype, m);
    let quality = if value.is_none() { SampleQuality::Bad } else { quality(m) };
    let historical = m.is_historical == Some(true);
    let live =
        !historical && (birth || slot.latest.as_ref().is_none_or(|l| time >= l.at || l.at > wall + AHEAD));
    if live {
        slot.latest = Some(Latest { value: value.clone(), at: time, quality });
    }
    out.push(Update { at, value, time, quality, historical, live });
}
