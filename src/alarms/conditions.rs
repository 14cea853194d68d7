//! OPC UA servers' own conditions (Alarms & Conditions) as alarms: the server evaluates
//! them; fieldgate follows each condition's state from its events, journals every change
//! as it would its own alarms', and sends an operator's acknowledgement to the server.
//!
//! - A condition becomes an alarm the first time its server reports it: `SENSOR_ID.NAME`
//!   when its source is a configured sensor's node, else `DEVICE_ID.NAME`, NAME its
//!   ConditionName in `[A-Z0-9_]` (at most 16; `_2`, `_3`, ... when taken). Its priority is
//!   its severity in four bands (1-250 low, 251-500 medium, 501-750 high, 751-1000
//!   critical), its message the server's. It is remembered in the journal, so a restart
//!   lists it before the server is reached again.
//! - Each event sets the state: active (ActiveState) and acknowledged (AckedState), as
//!   the transitions of the same journal; an acknowledgement made on the server is
//!   journaled with no operator, as "acknowledged on the server".
//! - A refresh (after every subscription made) re-sends what the server retains; a
//!   condition of that device not re-sent is no longer held by the server: it returns to
//!   normal (cleared and acknowledged, "no longer held by the server").
//! - An operator's acknowledgement goes to the server first (the condition's latest
//!   EventId); only when the server took it is it journaled, by that operator.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::entry::{Entry, Watch};
use super::table::{Pending, Served, Table};
use super::{ActError, Alarms};
use crate::driver::opcua::conditions::{AckFailed, Command, ConditionEvent, ServerEvent};
use crate::registry::{AlarmPriority, Registry, SensorSource};
use crate::store::alarm_journal::{Act, AlarmState, ConditionRecord, Instance, JournalError, Refusal};

/// How long an operator's acknowledgement waits for the server.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// Conditions followed per device, at most (a server reporting more is not followed further).
const MAX_PER_DEVICE: usize = 10_000;

const ON_SERVER: &str = "acknowledged on the server";
const NOT_HELD: &str = "no longer held by the server";

/// Why an operator's acknowledgement of a server's condition was not done.
#[derive(Debug, thiserror::Error)]
pub enum ServerAckError {
    #[error(transparent)]
    Act(#[from] ActError),
    #[error(transparent)]
    Server(#[from] AckFailed),
}

/// A severity (1-1000) as a priority.
pub fn priority_of(severity: u16) -> AlarmPriority {
    match severity {
        0..=250 => AlarmPriority::Low,
        251..=500 => AlarmPriority::Medium,
        501..=750 => AlarmPriority::High,
        _ => AlarmPriority::Critical,
    }
}

/// A ConditionName as an alarm name: `[A-Z0-9_]`, at most 16.
pub fn name_of(condition: &str) -> String {
    let mut name: String = condition
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .take(16)
        .collect();
    if name.trim_matches('_').is_empty() {
        name = "CONDITION".into();
    }
    name
}

/// The alarm ID of a new condition of `device`, and its source's sensor: the sensor's ID
/// when its source is a configured sensor's node, else the device's.
fn new_id(
    registry: &Registry,
    device: usize,
    c: &ConditionEvent,
    taken: &HashMap<String, usize>,
) -> (String, Option<usize>) {
    let source: Option<opcua::types::NodeId> = c.source.as_deref().and_then(|s| s.parse().ok());
    let d = &registry.devices()[device];
    let sensor = registry.sensors_of_device(&d.id).find(|s| match (&s.source, &source) {
        (SensorSource::OpcUa { node_id }, Some(src)) => {
            node_id.parse::<opcua::types::NodeId>().ok().as_ref() == Some(src)
        }
        _ => false,
    });
    let owner = sensor.map_or_else(|| d.id.to_string(), |s| s.id.to_string());
    let name = name_of(&c.name);
    let mut id = format!("{owner}.{name}");
    let mut n = 2;
    while taken.contains_key(&id) {
        let suffix = format!("_{n}");
        id = format!("{owner}.{}{suffix}", &name[..name.len().min(16 - suffix.len())]);
        n += 1;
    }
    (id, sensor.map(|s| s.place.sensor))
}

impl Alarms {
    /// The channel the subscription of `device` takes its commands from (an operator's
    /// acknowledgement); the one before it, if any, is replaced.
    pub fn attach_server(&self, device: usize) -> mpsc::Receiver<Command> {
        let (tx, rx) = mpsc::channel(16);
        self.servers.lock().insert(device, tx);
        rx
    }

    /// An event of `device`'s conditions, for the engine (never waits: a full queue
    /// counts it lost).
    pub fn server_event(&self, device: usize, event: ServerEvent) {
        if self.server_events.try_send((device, event)).is_err() {
            self.counters.server_events_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The condition `i`'s entry renewed or made, with its record when it must be remembered.
    fn follow(
        &self,
        t: &mut Table,
        registry: &Registry,
        device: usize,
        c: &ConditionEvent,
    ) -> Option<(usize, Option<ConditionRecord>)> {
        let priority = priority_of(c.severity);
        let record = |e: &Entry| ConditionRecord {
            alarm_id: e.id.clone(),
            device: registry.devices()[device].id.to_string(),
            node: c.node.clone(),
            sensor: e.sensor().and_then(|s| registry.sensors().get(s)).map(|s| s.id.to_string()),
            message: e.message.clone(),
            priority: e.priority,
        };
        if let Some(served) = t.conditions.get_mut(&(device, c.node.clone())) {
            served.event_id = c.event_id.clone();
            let i = served.index;
            let was = &t.entries[i];
            if was.priority == priority && (was.message == c.message || c.message.is_empty()) {
                return Some((i, None));
            }
            let mut e = (**was).clone();
            e.priority = priority;
            if !c.message.is_empty() {
                e.message = c.message.clone();
            }
            let r = record(&e);
            t.entries[i] = Arc::new(e);
            self.touched();
            return Some((i, Some(r)));
        }
        if t.conditions.keys().filter(|(d, _)| *d == device).count() >= MAX_PER_DEVICE {
            return None;
        }
        let (id, sensor) = new_id(registry, device, c, &t.by_id);
        let e = Entry {
            id: id.clone(),
            device,
            watch: Watch::Condition { sensor, node: c.node.clone() },
            priority,
            message: if c.message.is_empty() { c.name.clone() } else { c.message.clone() },
        };
        let r = record(&e);
        let index = t.entries.len();
        t.by_id.insert(id.clone(), index);
        t.conditions.insert((device, c.node.clone()), Served { index, event_id: c.event_id.clone() });
        t.instances.push(Instance::normal(&id));
        t.entries.push(Arc::new(e));
        self.touched();
        Some((index, Some(r)))
    }

    /// Server events applied: the transitions they make, for the journal (the entries of
    /// new conditions are made and remembered now).
    pub(super) fn on_server_events(
        &self,
        registry: &Registry,
        batch: Vec<(usize, ServerEvent)>,
    ) -> Vec<Pending> {
        let now = chrono::Utc::now().timestamp_millis();
        let mut out = Vec::new();
        let mut remember = Vec::new();
        let mut t = self.table.lock();
        // What the transitions of this batch will have made of each instance.
        let mut projected: HashMap<usize, AlarmState> = HashMap::new();
        for (device, event) in batch {
            match event {
                // The subscription refreshes on its own; nothing to follow here.
                ServerEvent::Overflow => {}
                ServerEvent::RefreshStart => {
                    t.refreshing.insert(device, HashSet::new());
                }
                ServerEvent::RefreshEnd => {
                    let Some(seen) = t.refreshing.remove(&device) else { continue };
                    let gone: Vec<usize> = t
                        .conditions
                        .iter()
                        .filter(|((d, _), s)| *d == device && !seen.contains(&s.index))
                        .map(|(_, s)| s.index)
                        .collect();
                    for i in gone {
                        let state = projected.get(&i).copied().unwrap_or(t.instances[i].state);
                        if t.instances[i].out_of_service {
                            continue;
                        }
                        let at = now.max(t.instances[i].since_ms);
                        to_state(
                            &mut out,
                            i,
                            state,
                            (false, true),
                            at,
                            AlarmPriority::Low,
                            (NOT_HELD, &None, true),
                        );
                        projected.insert(i, AlarmState::Normal);
                    }
                }
                ServerEvent::Condition(c) => {
                    let Some((i, record)) = self.follow(&mut t, registry, device, &c) else { continue };
                    remember.extend(record);
                    if let Some(seen) = t.refreshing.get_mut(&device) {
                        seen.insert(i);
                    }
                    let inst = &t.instances[i];
                    if inst.out_of_service {
                        continue;
                    }
                    let state = projected.get(&i).copied().unwrap_or(inst.state);
                    let at = c.time_ms.unwrap_or(now).min(now).max(inst.since_ms);
                    let priority = t.entries[i].priority;
                    let after = to_state(
                        &mut out,
                        i,
                        state,
                        (c.active, c.acked),
                        at,
                        priority,
                        (ON_SERVER, &None, false),
                    );
                    projected.insert(i, after);
                }
            }
        }
        drop(t);
        for r in remember {
            if let Err(error) = self.journal.keep_condition(&r) {
                tracing::warn!(%error, alarm = %r.alarm_id, "alarm journal: a server condition is not remembered");
            }
        }
        out
    }

    /// An operator's acknowledgement of a server's condition: sent to the server, and
    /// journaled once it took it. `event_id` (fieldgate's), when given, must be the current.
    pub async fn acknowledge_on_server(
        self: &Arc<Self>,
        alarm_id: &str,
        event_id: Option<u64>,
        by: &str,
        comment: Option<&str>,
    ) -> Result<Instance, ServerAckError> {
        let refused =
            |refusal| ActError::Journal(JournalError::Refused { alarm_id: alarm_id.to_string(), refusal });
        let (device, node, server_event, instance) = {
            let t = self.table.lock();
            let i = *t.by_id.get(alarm_id).ok_or_else(|| ActError::NotFound(alarm_id.to_string()))?;
            let Watch::Condition { node, .. } = &t.entries[i].watch else {
                return Err(ActError::NotFound(alarm_id.to_string()).into());
            };
            let device = t.entries[i].device;
            let served = t.conditions.get(&(device, node.clone()));
            (
                device,
                node.clone(),
                served.map(|s| s.event_id.clone()).unwrap_or_default(),
                t.instances[i].clone(),
            )
        };
        if event_id.is_some_and(|e| e != instance.event_id) {
            return Err(refused(Refusal::OtherEvent { current: instance.event_id }).into());
        }
        if !instance.state.is_unacknowledged() {
            return Err(refused(Refusal::NothingToAcknowledge).into());
        }
        let sender = self.servers.lock().get(&device).cloned();
        let (Some(sender), false) = (sender, server_event.is_empty()) else {
            return Err(AckFailed::Unavailable.into());
        };
        let (reply, answer) = oneshot::channel();
        let command = Command::Acknowledge {
            node,
            event_id: server_event,
            comment: comment.unwrap_or_default().to_string(),
            reply,
        };
        sender.try_send(command).map_err(|_| AckFailed::Unavailable)?;
        match tokio::time::timeout(ACK_WAIT, answer).await {
            Ok(Ok(result)) => result?,
            _ => return Err(AckFailed::Unavailable.into()),
        }
        let (me, id, by, comment) =
            (self.clone(), alarm_id.to_string(), by.to_string(), comment.map(str::to_string));
        let now = chrono::Utc::now().timestamp_millis();
        let act = Act::Acknowledge { event_id };
        tokio::task::spawn_blocking(move || me.operate(&id, &act, now, Some(&by), comment.as_deref()))
            .await
            .map_err(|_| AckFailed::Unavailable)?
            .map_err(ServerAckError::from)
    }
}

/// The transitions that take an instance in `state` to (active, acknowledged); the state
/// after them.
pub(super) fn to_state(
    out: &mut Vec<Pending>,
    i: usize,
    state: AlarmState,
    (active, acked): (bool, bool),
    at: i64,
    priority: AlarmPriority,
    (note, by, gone): (&str, &Option<String>, bool),
) -> AlarmState {
    use AlarmState::*;
    let mut now = state;
    if active && !now.is_active() {
        out.push((i, Act::Activate { value: None, priority }, at, None, None));
        now = ActiveUnacknowledged;
    } else if !active && now.is_active() {
        // Gone from its source: the clearing says why too.
        out.push((i, Act::Clear { value: None }, at, gone.then(|| note.to_string()), None));
        now = if now == ActiveUnacknowledged { ReturnedUnacknowledged } else { Normal };
    }
    if acked && now.is_unacknowledged() {
        out.push((i, Act::Acknowledge { event_id: None }, at, Some(note.to_string()), by.clone()));
        now = if now == ActiveUnacknowledged { ActiveAcknowledged } else { Normal };
    }
    now
}

#[cfg(test)]
#[path = "conditions_tests.rs"]
mod tests;
