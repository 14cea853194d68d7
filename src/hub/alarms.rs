//! Edge nodes' alarms as they publish them (node metrics `Alarms/<ALARM_ID>`,
//! docs/sparkplug.md "Alarms"), read from their NBIRTH and NDATA for the hub's alarm table
//! (`alarms/remote.rs`). A metric that does not say a known state, whose ID is not an
//! alarm ID, or (in an NDATA) that its edge node's birth did not carry, is left out and
//! counted; texts are cleaned and cut as device text is. An NDATA metric without
//! properties says only a state: the rest is as last told.

use std::collections::HashMap;

use crate::alarms::remote::{MAX_REMOTE, RemoteAlarm};
use crate::registry::AlarmPriority;
use crate::spb::ALARM_PREFIX;
use crate::spb::payload::{Metric, Payload, PropertyValueKind, Value};
use crate::spb::topic::Kind;
use crate::store::alarm_journal::AlarmState;

/// The most alarms one edge node's birth is read for.
const MAX_PER_EDGE: usize = 20_000;
/// The most characters of a text property kept.
const MAX_TEXT: usize = 200;

/// Per edge node (`group/node`): its alarms as last told, and their aliases, from its
/// last NBIRTH on.
#[derive(Default)]
pub struct AlarmAliases {
    by_edge: HashMap<String, Born>,
    /// Alarms held over every edge node.
    held: usize,
}

/// One edge node's alarms born.
#[derive(Default)]
struct Born {
    aliases: HashMap<u64, String>,
    told: HashMap<String, RemoteAlarm>,
}

/// What one message said of its edge node's alarms.
#[derive(Debug, Default)]
pub struct AlarmNews {
    /// A birth: every one of the edge node's alarms.
    pub birth: bool,
    pub alarms: Vec<RemoteAlarm>,
    /// Alarm metrics left out (not an alarm ID, no known state, not born, beyond the most).
    pub left_out: usize,
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

/// One alarm metric read (`last`: the alarm as last told): `None` when it is no alarm
/// fieldgate can follow. A metric without properties says only its state; one with some
/// says the rest, what describes the alarm kept as last told where it is missing or not
/// understood (who acknowledged, when it activated and the shelving are as sent).
fn parse(id: &str, m: &Metric, last: Option<&RemoteAlarm>) -> Option<RemoteAlarm> {
    if !is_alarm_id(id) {
        return None;
    }
    let Some(Value::String(s)) = &m.value else { return None };
    let state = state_of(s)?;
    let time_ms = m.timestamp.and_then(|t| i64::try_from(t).ok());
    if let Some(last) = last
        && m.properties.as_ref().is_none_or(|p| p.keys.is_empty())
    {
        // Who acknowledged and when it activated belong to an event this does not name.
        return Some(RemoteAlarm {
            state,
            time_ms,
            acknowledged_by: None,
            activated_ms: None,
            ..last.clone()
        });
    }
    let told = |key: &str, was: Option<&String>| text(m, key).or_else(|| was.cloned()).unwrap_or_default();
    Some(RemoteAlarm {
        id: id.to_string(),
        state,
        time_ms,
        priority: text(m, "priority")
            .and_then(|p| p.parse().ok())
            .or(last.map(|l| l.priority))
            .unwrap_or(AlarmPriority::Medium),
        kind: told("type", last.map(|l| &l.kind)),
        message: told("message", last.map(|l| &l.message)),
        device: told("device", last.map(|l| &l.device)),
        sensor: text(m, "sensor").or_else(|| last.and_then(|l| l.sensor.clone())),
        plant: told("plant", last.map(|l| &l.plant)),
        zone: told("zone", last.map(|l| &l.zone)),
        limit: match prop(m, "limit") {
            Some(PropertyValueKind::Double(l)) if l.is_finite() => Some(*l),
            _ => last.and_then(|l| l.limit),
        },
        unit: told("unit", last.map(|l| &l.unit)),
        acknowledged_by: text(m, "acknowledgedBy"),
        activated_ms: time(m, "activatedAt"),
        shelved_until_ms: time(m, "shelvedUntil"),
        out_of_service: match prop(m, "outOfService") {
            Some(PropertyValueKind::Boolean(b)) => *b,
            _ => last.is_some_and(|l| l.out_of_service),
        },
    })
}

impl AlarmAliases {
    /// What a message of edge node `edge` says of its alarms; `None` for a message that
    /// says nothing of them.
    pub fn read(&mut self, edge: &str, kind: Kind, p: &Payload) -> Option<AlarmNews> {
        let named =
            |m: &Metric| m.name.as_deref().and_then(|n| n.strip_prefix(ALARM_PREFIX)).map(str::to_string);
        match kind {
            Kind::NBirth => {
                let was = self.by_edge.remove(edge).map_or(0, |b| b.told.len());
                self.held = self.held.saturating_sub(was);
                // Every edge node's alarms together stay within what the hub follows.
                let room = MAX_PER_EDGE.min(MAX_REMOTE.saturating_sub(self.held));
                let mut born = Born::default();
                let mut news = AlarmNews { birth: true, ..AlarmNews::default() };
                for m in p.metrics.iter() {
                    let Some(id) = named(m) else { continue };
                    let a = match parse(&id, m, None) {
                        Some(a) if born.told.len() < room || born.told.contains_key(&id) => a,
                        _ => {
                            news.left_out += 1;
                            continue;
                        }
                    };
                    if let Some(alias) = m.alias {
                        born.aliases.insert(alias, id.clone());
                    }
                    born.told.insert(id, a.clone());
                    news.alarms.push(a);
                }
                self.held += born.told.len();
                self.by_edge.insert(edge.to_string(), born);
                Some(news)
            }
            Kind::NData => {
                let born = self.by_edge.get_mut(edge)?;
                let mut news = AlarmNews::default();
                for m in &p.metrics {
                    let Some(id) = named(m).or_else(|| born.aliases.get(&m.alias?).cloned()) else {
                        continue;
                    };
                    // Only an alarm its birth carried (Sparkplug: NDATA metrics are born).
                    let Some(told) = born.told.get_mut(&id) else {
                        news.left_out += 1;
                        continue;
                    };
                    match parse(&id, m, Some(told)) {
                        Some(a) => {
                            *told = a.clone();
                            news.alarms.push(a);
                        }
                        None => news.left_out += 1,
                    }
                }
                (!news.alarms.is_empty() || news.left_out > 0).then_some(news)
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
        let news = a.read("plant/gw", Kind::NBirth, &birth).unwrap();
        let (is_birth, got) = (news.birth, news.alarms);
        assert!(is_birth);
        assert_eq!(got.len(), 1, "an ID outside the grammar and an unknown state are left out");
        assert_eq!(news.left_out, 3, "the grammar's two and the unknown state");
        assert_eq!((got[0].priority, got[0].device.as_str()), (AlarmPriority::Critical, "b-boiler-rtu"));
        assert!(!got[0].message.contains('\u{202e}'));
        let data = Payload { metrics: vec![alarm(None, 7, "active_unacknowledged")], ..Payload::default() };
        let news = a.read("plant/gw", Kind::NData, &data).unwrap();
        assert_eq!(
            (news.birth, news.alarms[0].id.as_str(), news.alarms[0].state),
            (false, "B_BOILER_001.HIHI", AlarmState::ActiveUnacknowledged)
        );
        assert!(a.read("plant/other", Kind::NData, &data).is_none(), "no birth seen: not placed");
        let other = Payload {
            metrics: vec![Metric::new(None, Some(1), datatype::DOUBLE, Some(Value::Double(1.0)))],
            ..Payload::default()
        };
        assert!(a.read("plant/gw", Kind::NData, &other).is_none());
    }

    #[test]
    fn data_without_properties_changes_only_the_state_and_unborn_alarms_are_left_out() {
        let mut a = AlarmAliases::default();
        let birth = Payload {
            metrics: vec![alarm(Some("Alarms/B_BOILER_001.HIHI"), 7, "normal")],
            ..Payload::default()
        };
        let born = a.read("plant/gw", Kind::NBirth, &birth).unwrap().alarms.remove(0);
        let bare =
            Metric::new(None, Some(7), datatype::STRING, Some(Value::String("active_unacknowledged".into())));
        let unborn = Metric::new(
            Some("Alarms/B_BOILER_002.HI"),
            None,
            datatype::STRING,
            Some(Value::String("active_unacknowledged".into())),
        );
        let data = Payload { metrics: vec![bare, unborn], ..Payload::default() };
        let news = a.read("plant/gw", Kind::NData, &data).unwrap();
        assert_eq!(news.left_out, 1, "an alarm its birth did not carry");
        let got = &news.alarms[0];
        assert_eq!(
            (got.state, got.priority, got.device.as_str(), got.message.as_str()),
            (
                AlarmState::ActiveUnacknowledged,
                AlarmPriority::Critical,
                "b-boiler-rtu",
                born.message.as_str()
            )
        );
    }

    #[test]
    fn data_with_some_properties_keeps_what_describes_the_alarm() {
        let mut a = AlarmAliases::default();
        let birth = Payload {
            metrics: vec![alarm(Some("Alarms/B_BOILER_001.HIHI"), 7, "normal")],
            ..Payload::default()
        };
        let born = a.read("plant/gw", Kind::NBirth, &birth).unwrap().alarms.remove(0);
        let mut m =
            Metric::new(None, Some(7), datatype::STRING, Some(Value::String("active_acknowledged".into())));
        let mut p = PropertySet::default();
        p.push("priority", PropertyValue::string("bogus"));
        p.push("acknowledgedBy", PropertyValue::string("op"));
        m.properties = Some(p);
        let news =
            a.read("plant/gw", Kind::NData, &Payload { metrics: vec![m], ..Payload::default() }).unwrap();
        let got = &news.alarms[0];
        assert_eq!(
            (got.priority, got.device.as_str(), got.message.as_str(), got.acknowledged_by.as_deref()),
            (AlarmPriority::Critical, "b-boiler-rtu", born.message.as_str(), Some("op"))
        );
    }

    #[test]
    fn every_edge_nodes_alarms_together_stay_within_what_the_hub_follows() {
        let mut a = AlarmAliases::default();
        let birth = |from: usize, n: usize| Payload {
            metrics: (from..from + n)
                .map(|k| alarm(Some(&format!("Alarms/B_BOILER_001.A{k}")), k as u64, "normal"))
                .collect(),
            ..Payload::default()
        };
        let news = a.read("g/one", Kind::NBirth, &birth(0, MAX_PER_EDGE + 5)).unwrap();
        assert_eq!((news.alarms.len(), news.left_out), (MAX_PER_EDGE, 5));
        for e in 1..5 {
            let news = a.read(&format!("g/n{e}"), Kind::NBirth, &birth(0, MAX_PER_EDGE)).unwrap();
            assert_eq!(news.alarms.len(), MAX_PER_EDGE);
        }
        let news = a.read("g/late", Kind::NBirth, &birth(0, 10)).unwrap();
        assert_eq!((news.alarms.len(), news.left_out), (0, 10), "{MAX_REMOTE} held already");
        // A rebirth of a smaller set gives its room back.
        a.read("g/one", Kind::NBirth, &birth(0, 10)).unwrap();
        let news = a.read("g/late", Kind::NBirth, &birth(0, 10)).unwrap();
        assert_eq!(news.alarms.len(), 10);
    }
}
