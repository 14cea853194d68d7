//! What an act does to an alarm's instance (`apply`, a pure function), and how one write
//! transaction records it with its transition (`Tables::record`).

use redb::ReadableTable;

use super::{Act, ActRequest, AlarmState, Event, EventKind, Instance, JournalError, Refusal, db, json};

/// What `act` does to `was`: the instance after it, or `None` when it changes nothing
/// (the engine's repeats: activating an active alarm), or the operator's refusal.
pub(super) fn apply(
    was: &Instance,
    act: &Act,
    at_ms: i64,
    by: Option<&str>,
) -> Result<Option<Instance>, Refusal> {
    use AlarmState::*;
    let mut now = Instance { since_ms: at_ms, ..was.clone() };
    match act {
        Act::Activate { .. } | Act::Clear { .. } if was.out_of_service => return Ok(None),
        Act::Activate { value, .. } => match was.state {
            Normal | ReturnedUnacknowledged => {
                now.state = ActiveUnacknowledged;
                now.activated_ms = Some(at_ms);
                now.value = *value;
                now.acknowledged_by = None;
                now.acknowledged_ms = None;
            }
            _ => return Ok(None),
        },
        Act::Clear { .. } => match was.state {
            ActiveUnacknowledged => now.state = ReturnedUnacknowledged,
            ActiveAcknowledged => now.state = Normal,
            _ => return Ok(None),
        },
        Act::Acknowledge { event_id } => {
            if event_id.is_some_and(|e| e != was.event_id) {
                return Err(Refusal::OtherEvent { current: was.event_id });
            }
            now.state = match was.state {
                ActiveUnacknowledged => ActiveAcknowledged,
                ReturnedUnacknowledged => Normal,
                _ => return Err(Refusal::NothingToAcknowledge),
            };
            now.acknowledged_by = by.map(str::to_string);
            now.acknowledged_ms = Some(at_ms);
        }
        Act::Shelve { until_ms } => {
            if was.out_of_service {
                return Err(Refusal::OutOfService);
            }
            now.since_ms = was.since_ms;
            now.shelved_until_ms = Some(*until_ms);
            now.shelved_by = by.map(str::to_string);
        }
        Act::Unshelve => {
            if was.shelved_until_ms.is_none() {
                return Err(Refusal::NotShelved);
            }
            now.since_ms = was.since_ms;
            now.shelved_until_ms = None;
            now.shelved_by = None;
        }
        Act::OutOfService => {
            if was.out_of_service {
                return Err(Refusal::OutOfService);
            }
            now.out_of_service = true;
            now.state = Normal;
            now.shelved_until_ms = None;
            now.shelved_by = None;
        }
        Act::InService => {
            if !was.out_of_service {
                return Err(Refusal::InService);
            }
            now.out_of_service = false;
        }
    }
    Ok(Some(now))
}

/// The tables one write transaction records acts in.
pub(super) struct Tables<'tx> {
    pub(super) instances: redb::Table<'tx, &'static str, &'static [u8]>,
    pub(super) meta: redb::Table<'tx, &'static str, u64>,
    pub(super) events: redb::Table<'tx, (i64, u64), &'static [u8]>,
}

impl Tables<'_> {
    /// Records act `a`: the instance after it, `None` when it changes nothing, or its
    /// refusal.
    pub(super) fn record(
        &mut self,
        a: &ActRequest,
    ) -> Result<Result<Option<Instance>, Refusal>, JournalError> {
        let ActRequest { alarm_id, act, at_ms, by, comment } = *a;
        let was: Instance = match self.instances.get(alarm_id).map_err(db)? {
            Some(v) => serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?,
            None => Instance::new(alarm_id, at_ms),
        };
        let mut now = match apply(&was, act, at_ms, by) {
            Ok(Some(now)) => now,
            Ok(None) => return Ok(Ok(None)),
            Err(refusal) => return Ok(Err(refusal)),
        };
        let seq = self.meta.get("next_seq").map_err(db)?.map_or(1, |v| v.value());
        self.meta.insert("next_seq", seq + 1).map_err(db)?;
        let (kind, value, until_ms) = match act {
            Act::Activate { value, .. } => {
                let id = self.meta.get("next_event").map_err(db)?.map_or(1, |v| v.value());
                self.meta.insert("next_event", id + 1).map_err(db)?;
                now.event_id = id;
                (EventKind::Activated, *value, None)
            }
            Act::Clear { value } => (EventKind::Cleared, *value, None),
            Act::Acknowledge { .. } => (EventKind::Acknowledged, None, None),
            Act::Shelve { until_ms } => (EventKind::Shelved, None, Some(*until_ms)),
            Act::Unshelve => (EventKind::Unshelved, None, None),
            Act::OutOfService => (EventKind::OutOfService, None, None),
            Act::InService => (EventKind::InService, None, None),
        };
        let e = Event {
            seq,
            alarm_id: alarm_id.to_string(),
            event_id: now.event_id,
            kind,
            at_ms,
            value,
            by: by.map(str::to_string),
            comment: comment.map(str::to_string),
            until_ms,
            priority: match act {
                Act::Activate { priority, .. } => Some(*priority),
                _ => None,
            },
            activated_ms: match kind {
                EventKind::Activated => Some(at_ms),
                EventKind::Cleared | EventKind::Acknowledged => was.activated_ms,
                EventKind::OutOfService => was.activated_ms.filter(|_| was.state.is_active()),
                _ => None,
            },
            shelved: kind == EventKind::Activated && was.shelved_until_ms.is_some(),
        };
        self.instances.insert(alarm_id, json(&now).as_slice()).map_err(db)?;
        self.events.insert((at_ms, seq), json(&e).as_slice()).map_err(db)?;
        Ok(Ok(Some(now)))
    }
}
