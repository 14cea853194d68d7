//! The alarm table: every alarm and its instance as they stand (the fixed alarms first,
//! then the servers' conditions), under the engine's one lock; and a transition waiting
//! for the journal.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::entry::{Entry, Watch};
use crate::registry::Registry;
use crate::store::alarm_journal::{Act, AlarmState, ConditionRecord, Instance};

/// Server events waiting for the engine, at most (beyond: counted and dropped).
pub const EVENT_QUEUE: usize = 4096;

/// A transition waiting for the journal: the entry, what, when, a comment and by whom.
pub type Pending = (usize, Act, i64, Option<String>, Option<String>);

/// Every alarm and its instance, as they stand.
pub struct Table {
    /// The fixed alarms first (limits, communication), then the servers' conditions.
    pub entries: Vec<Arc<Entry>>,
    /// Per entry; changed only with the journal written (under the table's lock).
    pub instances: Vec<Instance>,
    pub by_id: HashMap<String, usize>,
    /// (device, condition node) → the servers' conditions followed.
    pub conditions: HashMap<(usize, String), Served>,
    /// Device → the conditions its refresh under way has re-sent.
    pub refreshing: HashMap<usize, HashSet<usize>>,
    /// The hub: edge node → the alarms of it followed (those it no longer publishes too).
    pub per_edge: HashMap<String, usize>,
    /// The hub: sensor ID → the edges' alarms on it.
    pub by_remote_sensor: HashMap<String, Vec<usize>>,
}

/// How pressing an instance is, for a reading's alarm state (0: nothing stands).
pub fn pressing(i: &Instance) -> u8 {
    if i.shelved_until_ms.is_some() || i.out_of_service {
        return 0;
    }
    match i.state {
        AlarmState::ActiveUnacknowledged => 3,
        AlarmState::ActiveAcknowledged => 2,
        AlarmState::ReturnedUnacknowledged => 1,
        AlarmState::Normal => 0,
    }
}

/// A condition followed: its alarm and the server's latest EventId of it.
pub struct Served {
    pub index: usize,
    pub event_id: Vec<u8>,
}

/// The entry of a condition as a record says.
fn entry_of(registry: &Registry, r: &ConditionRecord) -> Option<Entry> {
    let device = registry.devices().iter().position(|d| d.id.as_str() == r.device)?;
    registry.devices()[device].opcua.as_ref().filter(|o| o.alarms)?;
    let sensor = r.sensor.as_deref().and_then(|s| registry.sensors().iter().position(|x| x.id.as_str() == s));
    Some(Entry {
        id: r.alarm_id.clone(),
        device,
        watch: Watch::Condition { sensor, node: r.node.clone() },
        priority: r.priority,
        message: r.message.clone(),
    })
}

impl Table {
    /// Adds the conditions the journal remembers (of devices that still follow them).
    pub fn restore_conditions(
        &mut self,
        registry: &Registry,
        records: Vec<ConditionRecord>,
        stored: &mut HashMap<String, Instance>,
    ) {
        for r in records {
            let Some(e) = entry_of(registry, &r) else { continue };
            if self.by_id.contains_key(&e.id) {
                continue;
            }
            let index = self.entries.len();
            self.by_id.insert(e.id.clone(), index);
            self.conditions.insert((e.device, r.node.clone()), Served { index, event_id: Vec::new() });
            self.instances.push(stored.remove(&e.id).unwrap_or_else(|| Instance::normal(&e.id)));
            self.entries.push(Arc::new(e));
        }
    }
}
