//! Alarm states as metrics of the edge node. Sparkplug B 3.0 has no alarm model; this is
//! fieldgate's convention (docs/sparkplug.md, "Alarms"): each alarm is a node metric
//! `Alarms/<ALARM_ID>` of datatype String whose value is its state (`normal`,
//! `active_unacknowledged`, ...), with properties saying the rest. Node metrics, not device
//! metrics: a dead device's communication alarm must be told while its device is dead.
//! Every alarm is in the NBIRTH; a change of one is an NDATA with its alias; an alarm the
//! birth did not carry (an OPC UA server's condition seen first) asks for a rebirth.

use std::sync::Arc;

use crate::alarms::Entry;
use crate::registry::Registry;
use crate::spb::payload::{Metric, PropertySet, PropertyValue, Value, datatype};
use crate::store::alarm_journal::Instance;

pub use crate::spb::ALARM_PREFIX as PREFIX;
/// Aliases of alarm metrics start here (sensors' are 1..=n).
pub const ALIAS_BASE: u64 = 1 << 32;

/// The DateTime property type (ms since the Unix epoch).
const DATETIME: u32 = 13;

fn time(ms: i64) -> PropertyValue {
    PropertyValue {
        r#type: Some(DATETIME),
        is_null: None,
        value: Some(crate::spb::payload::PropertyValueKind::Long(ms.max(0) as u64)),
    }
}

/// Alarm `index` as a metric: named in a birth, by alias alone in data.
pub fn metric(registry: &Registry, index: usize, entry: &Entry, i: &Instance, birth: bool) -> Metric {
    let name = format!("{PREFIX}{}", entry.id);
    let state = Value::String(i.state.name().to_string());
    let mut m = Metric::new(
        birth.then_some(name.as_str()),
        Some(ALIAS_BASE + index as u64),
        datatype::STRING,
        Some(state),
    );
    m.timestamp = (i.since_ms > 0).then_some(i.since_ms as u64);
    let mut p = PropertySet::default();
    p.push("priority", PropertyValue::string(entry.priority.name()));
    p.push("type", PropertyValue::string(entry.kind()));
    p.push("message", PropertyValue::string(&entry.message));
    p.push("device", PropertyValue::string(&entry.device_id(registry)));
    if let Some((plant, zone)) = entry.plant_zone(registry) {
        p.push("plant", PropertyValue::string(&plant));
        p.push("zone", PropertyValue::string(&zone));
    }
    if let Some(s) = entry.sensor().and_then(|s| registry.sensors().get(s)) {
        p.push("sensor", PropertyValue::string(s.id.as_str()));
        if !s.unit.is_empty() {
            p.push("unit", PropertyValue::string(&s.unit));
        }
    }
    if let Some(limit) = entry.limit() {
        p.push("limit", PropertyValue::double(limit));
    }
    p.push("eventId", PropertyValue::long(i.event_id));
    if let Some(t) = i.activated_ms {
        p.push("activatedAt", time(t));
    }
    if let Some(by) = &i.acknowledged_by {
        p.push("acknowledgedBy", PropertyValue::string(by));
    }
    if let Some(t) = i.acknowledged_ms {
        p.push("acknowledgedAt", time(t));
    }
    if let Some(t) = i.shelved_until_ms {
        p.push("shelvedUntil", time(t));
    }
    p.push("outOfService", PropertyValue::boolean(i.out_of_service));
    m.properties = Some(p);
    m
}

/// What the node last published of each alarm.
#[derive(Default)]
pub struct Sent {
    /// In the order of the alarms' listing (an alarm keeps its place): its entry (a
    /// server's condition may change its message or priority) and instance.
    last: Vec<(Arc<Entry>, Instance)>,
}

impl Sent {
    /// Every alarm, for an NBIRTH; remembered as sent.
    pub fn birth(&mut self, registry: &Registry, listing: &[(Arc<Entry>, Instance)]) -> Vec<Metric> {
        self.last = listing.to_vec();
        listing.iter().enumerate().map(|(n, (e, i))| metric(registry, n, e, i, true)).collect()
    }

    /// The alarms that changed since last sent, for an NDATA (remembered as sent); `None`
    /// when an alarm the birth did not carry is listed: a rebirth must carry it first.
    pub fn changes(
        &mut self,
        registry: &Registry,
        listing: &[(Arc<Entry>, Instance)],
    ) -> Option<Vec<Metric>> {
        let same_alarms = listing.len() == self.last.len()
            && listing.iter().zip(&self.last).all(|((e, _), (was, _))| e.id == was.id);
        if !same_alarms {
            return None;
        }
        let mut out = Vec::new();
        for (n, ((e, i), was)) in listing.iter().zip(self.last.iter_mut()).enumerate() {
            if (e, i) != (&was.0, &was.1) {
                out.push(metric(registry, n, e, i, false));
                *was = (e.clone(), i.clone());
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alarms::Watch;
    use crate::registry::AlarmPriority;
    use crate::store::alarm_journal::AlarmState;

    fn entry(id: &str) -> Arc<Entry> {
        Arc::new(Entry {
            id: id.into(),
            device: 0,
            watch: Watch::Comm { after: std::time::Duration::from_secs(60) },
            priority: AlarmPriority::High,
            message: "m".into(),
        })
    }

    #[test]
    fn only_changed_alarms_are_sent_and_a_new_one_asks_for_a_rebirth() {
        let registry = Registry::from_texts(&[]).unwrap();
        let mut listing = vec![
            (entry("a.COMM"), Instance::normal("a.COMM")),
            (entry("b.COMM"), Instance::normal("b.COMM")),
        ];
        let mut sent = Sent::default();
        let born = sent.birth(&registry, &listing);
        assert_eq!(born.len(), 2);
        assert_eq!(born[1].name.as_deref(), Some("Alarms/b.COMM"));
        assert_eq!(born[1].alias, Some(ALIAS_BASE + 1));
        assert_eq!(sent.changes(&registry, &listing).map(|m| m.len()), Some(0));
        listing[1].1.state = AlarmState::ActiveUnacknowledged;
        listing[1].1.event_id = 7;
        let changed = sent.changes(&registry, &listing).unwrap();
        assert_eq!(
            (changed.len(), changed[0].name.as_deref(), changed[0].alias),
            (1, None, Some(ALIAS_BASE + 1))
        );
        assert_eq!(changed[0].value, Some(Value::String("active_unacknowledged".into())));
        assert_eq!(sent.changes(&registry, &listing).map(|m| m.len()), Some(0), "sent once");
        listing.push((entry("c.COND"), Instance::normal("c.COND")));
        assert!(sent.changes(&registry, &listing).is_none(), "a new alarm needs a birth");
    }
}
