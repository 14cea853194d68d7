//! The fleet hub's alarms: each edge node's alarms as it publishes them (the node metrics
//! `Alarms/<ALARM_ID>` of docs/sparkplug.md), followed as the hub sees them and journaled
//! in the hub's own journal, so the same tools list them, tell their history and count
//! their figures over the fleet.
//!
//! - An alarm is known from the first birth or data that carries it, by the edge's alarm
//!   ID (the first edge node to publish an ID keeps it; another's alarm of the same ID is
//!   left out and counted).
//! - Each state published is reached by the journal's transitions (activated, cleared,
//!   acknowledged: "acknowledged on the edge", by whom the edge says). Event IDs are the
//!   hub's own.
//! - A birth carries all of an edge node's alarms: one of that node it no longer carries
//!   returns to normal ("no longer published by the edge").
//! - While an edge node is offline its alarms hold as last published.
//! - Operators act on an alarm where it is evaluated, on its edge: the hub refuses acts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Alarms;
use super::conditions::to_state;
use super::entry::{Entry, Remote, Watch, kind_of};
use super::table::{Pending, Table, pressing};
use crate::registry::AlarmPriority;
use crate::store::alarm_journal::{Act, AlarmState, Instance};

/// Alarms the hub follows, at most (beyond: left out and counted).
pub const MAX_REMOTE: usize = 100_000;
/// Alarms of one edge node the hub follows, at most, those it no longer publishes
/// included (beyond: left out and counted): one node cannot fill the table.
pub const MAX_PER_EDGE: usize = 20_000;

const ON_EDGE: &str = "acknowledged on the edge";
/// The longest shelving, as an edge allows it (7 days, in ms).
const MAX_SHELVE_MS: i64 = 7 * 86_400_000;
const ON_EDGE_ACT: &str = "on the edge";
const NOT_PUBLISHED: &str = "no longer published by the edge";

/// An alarm as an edge node published it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteAlarm {
    /// The edge's alarm ID.
    pub id: String,
    pub state: AlarmState,
    /// When its state last changed (ms), if said.
    pub time_ms: Option<i64>,
    pub priority: AlarmPriority,
    /// The edge's `type`.
    pub kind: String,
    pub message: String,
    pub device: String,
    pub sensor: Option<String>,
    pub plant: String,
    pub zone: String,
    /// In the sensor's unit (limit alarms).
    pub limit: Option<f64>,
    pub unit: String,
    pub acknowledged_by: Option<String>,
    /// When its current (or last) event activated on the edge (ms).
    pub activated_ms: Option<i64>,
    /// Shelved on the edge until then (ms).
    pub shelved_until_ms: Option<i64>,
    pub out_of_service: bool,
}

/// Whether a state is active, and acknowledged.
fn flags(state: AlarmState) -> (bool, bool) {
    match state {
        AlarmState::ActiveUnacknowledged => (true, false),
        AlarmState::ActiveAcknowledged => (true, true),
        AlarmState::ReturnedUnacknowledged => (false, false),
        AlarmState::Normal => (false, true),
    }
}

impl Alarms {
    /// The entry of edge node `edge`'s alarm `a`, made or renewed; `None` when its ID is
    /// another's or the hub follows as many as it takes.
    fn remote_entry(
        &self,
        t: &mut Table,
        edge: &str,
        a: &RemoteAlarm,
        restored: &mut HashMap<String, Instance>,
    ) -> Option<usize> {
        let entry = Entry {
            id: a.id.clone(),
            device: usize::MAX,
            watch: Watch::Remote(Box::new(Remote {
                edge: edge.to_string(),
                device: a.device.clone(),
                sensor: a.sensor.clone(),
                kind: kind_of(&a.kind),
                plant: a.plant.clone(),
                zone: a.zone.clone(),
                limit: a.limit,
                unit: a.unit.clone(),
            })),
            priority: a.priority,
            message: a.message.clone(),
        };
        if let Some(&i) = t.by_id.get(&a.id) {
            if !matches!(&t.entries[i].watch, Watch::Remote(r) if r.edge == edge) {
                return None;
            }
            if *t.entries[i] != entry {
                if let Some(s) = &a.sensor {
                    let on = t.by_remote_sensor.entry(s.clone()).or_default();
                    if !on.contains(&i) {
                        on.push(i);
                    }
                }
                t.entries[i] = Arc::new(entry);
                self.touched();
            }
            return Some(i);
        }
        let held = t.per_edge.get(edge).copied().unwrap_or(0);
        if t.entries.len() >= MAX_REMOTE || held >= MAX_PER_EDGE {
            if !self.remote_full.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    edge,
                    max = MAX_REMOTE,
                    per_edge = MAX_PER_EDGE,
                    "hub: alarms left out, the hub follows as many as it takes (those no edge publishes any more stay until it restarts; fieldgate_alarm_remote_left_out counts them; said once)"
                );
            }
            return None;
        }
        t.per_edge.insert(edge.to_string(), held + 1);
        // Known before (the hub restarted): its instance as the journal holds it.
        let instance = restored.remove(&a.id).unwrap_or_else(|| Instance::normal(&a.id));
        let i = t.entries.len();
        if let Some(s) = &a.sensor {
            t.by_remote_sensor.entry(s.clone()).or_default().push(i);
        }
        t.by_id.insert(a.id.clone(), i);
        t.instances.push(instance);
        t.entries.push(Arc::new(entry));
        self.touched();
        Some(i)
    }

    /// The edges' alarms on sensor `sensor`: the most pressing one standing and its
    /// instance, or one of them and `None` when none stands; `None` without any.
    pub fn of_remote_sensor(&self, sensor: &str) -> Option<(Arc<Entry>, Option<Instance>)> {
        let t = self.table.lock();
        let on: Vec<usize> = t
            .by_remote_sensor
            .get(sensor)?
            .iter()
            .copied()
            .filter(
                |&i| matches!(&t.entries[i].watch, Watch::Remote(r) if r.sensor.as_deref() == Some(sensor)),
            )
            .collect();
        let first = *on.first()?;
        let worst = on
            .into_iter()
            .filter(|&i| pressing(&t.instances[i]) > 0)
            .max_by_key(|&i| (pressing(&t.instances[i]), t.entries[i].priority));
        Some(match worst {
            Some(i) => (t.entries[i].clone(), Some(t.instances[i].clone())),
            None => (t.entries[first].clone(), None),
        })
    }

    /// Alarm metrics of the edge nodes left out before they reached the table (not an
    /// alarm ID, no known state, not born, beyond the most), counted.
    pub fn remote_left_out(&self, n: usize) {
        self.counters.remote_left_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Edge node `edge`'s alarms as it published them (`birth`: every one of them),
    /// journaled in one durable write (blocking: call it off the async threads, in the
    /// order they came). The number of transitions the journal did not take (lost:
    /// counted; the edge's next birth says its states again).
    pub fn on_remote(&self, edge: &str, birth: bool, alarms: Vec<RemoteAlarm>) -> usize {
        let now = chrono::Utc::now().timestamp_millis();
        let mut out = Vec::new();
        // What the journal holds of alarms new to the table, read before it is locked.
        let new: Vec<&str> = {
            let t = self.table.lock();
            alarms.iter().map(|a| a.id.as_str()).filter(|id| !t.by_id.contains_key(*id)).collect()
        };
        let mut restored: HashMap<String, Instance> = match self.journal.instances_of(&new) {
            Ok(found) => found.into_iter().map(|i| (i.alarm_id.clone(), i)).collect(),
            Err(_) => HashMap::new(),
        };
        {
            let mut t = self.table.lock();
            let mut seen = HashSet::new();
            for a in &alarms {
                let Some(i) = self.remote_entry(&mut t, edge, a, &mut restored) else {
                    self.counters.remote_left_out.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                seen.insert(i);
                follow(&mut out, i, &t.instances[i], a, now);
            }
            if birth {
                for (i, e) in t.entries.iter().enumerate() {
                    let theirs = matches!(&e.watch, Watch::Remote(r) if r.edge == edge);
                    if theirs && !seen.contains(&i) {
                        let was = &t.instances[i];
                        if was.out_of_service {
                            out.push((
                                i,
                                Act::InService,
                                now.max(was.since_ms),
                                Some(NOT_PUBLISHED.into()),
                                None,
                            ));
                        }
                        if was.shelved_until_ms.is_some() {
                            out.push((
                                i,
                                Act::Unshelve,
                                now.max(was.since_ms),
                                Some(NOT_PUBLISHED.into()),
                                None,
                            ));
                        }
                        let at = now.max(t.instances[i].since_ms);
                        let state = t.instances[i].state;
                        to_state(
                            &mut out,
                            i,
                            state,
                            (false, true),
                            at,
                            e.priority,
                            (NOT_PUBLISHED, &None, true),
                        );
                    }
                }
            }
        }
        let mut pending = out.into();
        self.commit(&mut pending);
        // Said once by `commit` while the journal fails; counted here.
        self.counters.unsaved_dropped.fetch_add(pending.len() as u64, Ordering::Relaxed);
        pending.len()
    }
}

/// The journal's transitions that take instance `was` (entry `i`) to what the edge
/// published: its service and shelving first, then its event (one the hub did not see,
/// activated later than the hub's, ends the hub's and begins anew), then its state.
fn follow(out: &mut Vec<Pending>, i: usize, was: &Instance, a: &RemoteAlarm, now: i64) {
    let on_edge = || Some(ON_EDGE_ACT.to_string());
    let at = a.time_ms.unwrap_or(now).min(now).max(was.since_ms);
    // The edge does not say when it was shelved or taken out of service (its metric's
    // time is its state's): the hub stamps those when it learns them.
    let learned = now.max(was.since_ms);
    match (was.out_of_service, a.out_of_service) {
        (false, true) => {
            out.push((i, Act::OutOfService, learned, on_edge(), None));
            return;
        }
        (true, true) => return,
        (true, false) => out.push((i, Act::InService, learned, on_edge(), None)),
        (false, false) => {}
    }
    // A shelving lasts 7 days at most, as on an edge: one said longer is taken as 7 days
    // from when the hub learned it (and kept while it lasts).
    let bound = learned.saturating_add(MAX_SHELVE_MS);
    let theirs = a.shelved_until_ms.map(|u| match was.shelved_until_ms {
        _ if u <= bound => u,
        Some(w) if w > now => w,
        _ => bound,
    });
    match (was.shelved_until_ms, theirs) {
        (w, Some(u)) if w != Some(u) => out.push((i, Act::Shelve { until_ms: u }, learned, on_edge(), None)),
        (Some(_), None) => out.push((i, Act::Unshelve, learned, on_edge(), None)),
        _ => {}
    }
    let mut state = if was.out_of_service { AlarmState::Normal } else { was.state };
    let (active, acked) = flags(a.state);
    let unseen = match (a.activated_ms, was.activated_ms) {
        (Some(theirs), Some(ours)) => theirs > ours,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if a.state != AlarmState::Normal && (unseen || state == AlarmState::Normal) {
        let began = a.activated_ms.unwrap_or(at).min(now).max(was.since_ms);
        if state.is_active() {
            out.push((i, Act::Clear { value: None }, began, None, None));
        }
        out.push((i, Act::Activate { value: None, priority: a.priority }, began, None, None));
        state = AlarmState::ActiveUnacknowledged;
    }
    let by = a.acknowledged_by.clone();
    to_state(
        out,
        i,
        state,
        (active, acked),
        at.max(a.activated_ms.unwrap_or(at).min(now)),
        a.priority,
        (ON_EDGE, &by, false),
    );
}

#[cfg(test)]
#[path = "remote_tests.rs"]
mod tests;
