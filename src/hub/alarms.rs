//! Edge nodes' alarms as they publish them (node metrics `Alarms/<ALARM_ID>`,
//! docs/sparkplug.md "Alarms"), read from their NBIRTH and NDATA for the hub's alarm table
//! (`alarms/remote.rs`). A metric that does not say a known state, or whose ID is not an
//! alarm ID, is left out; texts are cleaned and cut as device text is.

use std::collections::HashMap;

use crate::alarms::remote::RemoteAlarm;
use crate::registry::AlarmPriority;
use crate::spb::ALARM_PREFIX;
use crate::spb::payload::{Metric, Payload, PropertyValueKind, Value};
use crate::spb::topic::Kind;
use crate::store::alarm_journal::AlarmState;

/// The most alarms one edge node's birth is read for.
const MAX_PER_EDGE: usize = 20_000;
/// The most characters of a text property kept.
const MAX_TEXT: usize = 200;

/// Per edge node (`group/node`): its alarms' aliases, from its last NBIRTH.
#[derive(Default)]
pub struct AlarmAliases {
    by_edge: HashMap<String, HashMap<u64, String>>,
}

/// An ID as an alarm ID: the grammar the tools take (`SENSOR_ID.NAME`, `DEVICE_ID.NAME`).
fn is_alarm_id(id: &str) -> bool {
    static GRAMMAR: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(crate::tools::defs::ALARM_ID_PATTERN).ok());
    id.len() <= 100 && GRAMMAR.as_ref().is_some_and(|g| g.is_match(id))
}

fn state_of(text: &str) -> Option<AlarmState> {
    Some(match text {
        "normal" => AlarmState::Normal,
        "active_unacknowledged" => AlarmState::ActiveUnacknowledged,
        "active_acknowledged" => AlarmState::ActiveAcknowledged,
        "returned_unacknowledged" => AlarmState::ReturnedUnacknowledged,
        _ => return None,
    })
}

fn prop<'a>(m: &'a Metric, key: &str) -> Option<&'a PropertyValueKind> {
    m.properties.as_ref()?.get(key)?.value.as_ref()
}

/// A DateTime (or integer) property, ms since the epoch.
fn time(m: &Metric, key: &str) -> Option<i64> {
    match prop(m, key)? {
        PropertyValueKind::Long(t) => i64::try_from(*t).ok(),
        _ => None,
    }
}

fn text(m: &Metric, key: &str) -> Option<String> {
    match prop(m, key)? {
        PropertyValueKind::String(s) => Some(crate::plain::shown(s).chars().take(MAX_TEXT).collect()),
        _ => None,
    }
}

/// One alarm metric read: `None` when it is no alarm fieldgate can follow.
fn parse(id: &str, m: &Metric) -> Option<RemoteAlarm> {
    if !is_alarm_id(id) {
        return None;
    }
    let Some(Value::String(s)) = &m.value else { return None };
    Some(RemoteAlarm {
        id: id.to_string(),
        state: state_of(s)?,
        time_ms: m.timestamp.and_then(|t| i64::try_from(t).ok()),
        priority: text(m, "priority").and_then(|p| p.parse().ok()).unwrap_or(AlarmPriority::Medium),
        kind: text(m, "type").unwrap_or_default(),
        message: text(m, "message").unwrap_or_default(),
        device: text(m, "device").unwrap_or_default(),
        sensor: text(m, "sensor"),
        plant: text(m, "plant").unwrap_or_default(),
        zone: text(m, "zone").unwrap_or_default(),
        limit: match prop(m, "limit") {
            Some(PropertyValueKind::Double(l)) if l.is_finite() => Some(*l),
            _ => None,
        },
        unit: text(m, "unit").unwrap_or_default(),
        acknowledged_by: text(m, "acknowledgedBy"),
        activated_ms: time(m, "activatedAt"),
        shelved_until_ms: time(m, "shelvedUntil"),
        out_of_service: matches!(prop(m, "outOfService"), Some(PropertyValueKind::Boolean(true))),
    })
}

impl AlarmAliases {
    /// The alarms a message of edge node `edge` carries, and whether it is a birth (then
    /// they are all of its alarms); `None` for a message that says nothing of them.
    pub fn read(&mut self, edge: &str, kind: Kind, p: &Payload) -> Option<(bool, Vec<RemoteAlarm>)> {
        let named =
            |m: &Metric| m.name.as_deref().and_then(|n| n.strip_prefix(ALARM_PREFIX)).map(str::to_string);
        match kind {
            Kind::NBirth => {
                let mut aliases = HashMap::new();
                let mut out = Vec::new();
                for m in p.metrics.iter().filter(|m| named(m).is_some()).take(MAX_PER_EDGE) {
                    let Some(id) = named(m) else { continue };
                    if let Some(a) = m.alias {
                        aliases.insert(a, id.clone());
                    }
                    out.extend(parse(&id, m));
                }
                self.by_edge.insert(edge.to_string(), aliases);
                Some((true, out))
            }
            Kind::NData => {
                let aliases = self.by_edge.get(edge)?;
                let out: Vec<RemoteAlarm> = p
                    .metrics
                    .iter()
                    .filter_map(|m| {
                        let id = named(m).or_else(|| aliases.get(&m.alias?).cloned())?;
                        parse(&id, m)
                    })
                    .collect();
                (!out.is_empty()).then_some((false, out))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spb::payload::{PropertySet, PropertyValue, datatype};

    fn alarm(name: Option<&str>, alias: u64, state: &str) -> Metric {
        let mut m = Metric::new(name, Some(alias), datatype::STRING, Some(Value::String(state.into())));
        let mut p = PropertySet::default();
        p.push("priority", PropertyValue::string("critical"));
        p.push("message", PropertyValue::string("hot\u{202e}"));
        p.push("device", PropertyValue::string("b-boiler-rtu"));
        m.properties = Some(p);
        m
    }

    #[test]
    fn births_name_the_alarms_and_data_finds_them_by_alias() {
        let mut a = AlarmAliases::default();
        let birth = Payload {
            metrics: vec![
                Metric::new(Some("bdSeq"), None, datatype::INT64, Some(Value::Long(0))),
                alarm(Some("Alarms/B_BOILER_001.HIHI"), 7, "normal"),
                alarm(Some("Alarms/x/../y"), 8, "normal"),
                alarm(Some("Alarms/X_FLOOD_00001.HI"), 10, "normal"),
                alarm(Some("Alarms/B_BOILER_001.HI"), 9, "blinking"),
            ],
            ..Payload::default()
        };
        let (is_birth, got) = a.read("plant/gw", Kind::NBirth, &birth).unwrap();
        assert!(is_birth);
        assert_eq!(got.len(), 1, "an ID outside the grammar and an unknown state are left out");
        assert_eq!((got[0].priority, got[0].device.as_str()), (AlarmPriority::Critical, "b-boiler-rtu"));
        assert!(!got[0].message.contains('\u{202e}'));
        let data = Payload { metrics: vec![alarm(None, 7, "active_unacknowledged")], ..Payload::default() };
        let (is_birth, got) = a.read("plant/gw", Kind::NData, &data).unwrap();
        assert_eq!(
            (is_birth, got[0].id.as_str(), got[0].state),
            (false, "B_BOILER_001.HIHI", AlarmState::ActiveUnacknowledged)
        );
        assert!(a.read("plant/other", Kind::NData, &data).is_none(), "no birth seen: not placed");
        let other = Payload {
            metrics: vec![Metric::new(None, Some(1), datatype::DOUBLE, Some(Value::Double(1.0)))],
            ..Payload::default()
        };
        assert!(a.read("plant/gw", Kind::NData, &other).is_none());
    }
}
