//! The alarm journal (`alarms.redb` in the data directory): each alarm's current instance
//! in its ISA-18.2 state, and every transition, written durably before it is answered.
//!
//! States (ISA-18.2 / OPC UA Part 9, without shelving and out of service yet): normal,
//! active-unacknowledged, active-acknowledged, returned-unacknowledged. An activation
//! starts a new event (its ID one more than the journal's last); clearing and
//! acknowledging belong to the event they end. A restart finds every instance as it was:
//! the same event IDs, nothing activated twice.
//!
//! Tables: `instances` (alarm ID → the instance, JSON), `events` (sequence number → the
//! transition, JSON), `meta` (`next_event`).

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::db::{Db, Problem, StorageFailure};

const INSTANCES: TableDefinition<&str, &[u8]> = TableDefinition::new("instances");
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlarmState {
    Normal,
    ActiveUnacknowledged,
    ActiveAcknowledged,
    ReturnedUnacknowledged,
}

impl AlarmState {
    pub fn is_active(self) -> bool {
        matches!(self, AlarmState::ActiveUnacknowledged | AlarmState::ActiveAcknowledged)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Activated,
    Cleared,
    Acknowledged,
}

/// One alarm as it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub alarm_id: String,
    pub state: AlarmState,
    /// The event it is in (or last was); 0 before its first activation.
    pub event_id: u64,
    /// When its state last changed (ms).
    pub since_ms: i64,
    pub activated_ms: Option<i64>,
    /// The value that activated it.
    pub value: Option<f64>,
    pub acknowledged_by: Option<String>,
}

/// One transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub alarm_id: String,
    pub event_id: u64,
    pub kind: EventKind,
    pub at_ms: i64,
    pub value: Option<f64>,
    pub by: Option<String>,
    pub comment: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("alarm journal: {0}")]
    Db(String),
    #[error("alarm journal: a stored record is corrupt")]
    Corrupt,
    /// Acknowledging an alarm with nothing to acknowledge, or an event that is over.
    #[error("alarm {alarm_id} has no unacknowledged event {event_id}")]
    NothingToAcknowledge { alarm_id: String, event_id: u64 },
}

impl StorageFailure for JournalError {
    fn storage(reason: String) -> Self {
        JournalError::Db(reason)
    }
    fn is_storage(&self) -> bool {
        matches!(self, JournalError::Db(_))
    }
}

fn db<E: std::fmt::Display>(e: E) -> JournalError {
    JournalError::Db(e.to_string())
}

pub struct AlarmJournal {
    db: Db,
}

/// What a transition does to an instance: its new state, and whether it may happen.
fn next(state: AlarmState, kind: EventKind) -> Option<AlarmState> {
    use AlarmState::*;
    match (state, kind) {
        (Normal | ReturnedUnacknowledged, EventKind::Activated) => Some(ActiveUnacknowledged),
        (ActiveUnacknowledged, EventKind::Cleared) => Some(ReturnedUnacknowledged),
        (ActiveAcknowledged, EventKind::Cleared) => Some(Normal),
        (ActiveUnacknowledged, EventKind::Acknowledged) => Some(ActiveAcknowledged),
        (ReturnedUnacknowledged, EventKind::Acknowledged) => Some(Normal),
        _ => None,
    }
}

impl AlarmJournal {
    /// Opens (or creates) `alarms.redb` in a data directory.
    pub fn open_in(dir: &Path) -> Result<AlarmJournal, JournalError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| JournalError::Db(format!("{}: {}", dir.display(), e.kind())))?;
        AlarmJournal::with_db(Db::open_file("alarms", &dir.join("alarms.redb")).map_err(JournalError::Db)?)
    }

    pub fn in_memory() -> Result<AlarmJournal, JournalError> {
        let d =
            Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(db)?;
        AlarmJournal::with_db(Db::memory("alarms", d))
    }

    fn with_db(db: Db) -> Result<AlarmJournal, JournalError> {
        db.write(|d| {
            let tx = d.begin_write().map_err(self::db)?;
            tx.open_table(INSTANCES).map_err(self::db)?;
            tx.open_table(EVENTS).map_err(self::db)?;
            tx.open_table(META).map_err(self::db)?;
            tx.commit().map_err(self::db)
        })?;
        Ok(AlarmJournal { db })
    }

    pub fn problem(&self) -> Option<Problem> {
        self.db.problem()
    }

    /// Every alarm that has an instance, by alarm ID.
    pub fn instances(&self) -> Result<Vec<Instance>, JournalError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(INSTANCES).map_err(db)?;
            let mut out = Vec::new();
            for item in t.iter().map_err(db)? {
                let (_, v) = item.map_err(db)?;
                out.push(serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?);
            }
            Ok(out)
        })
    }

    /// The transitions with `from <= at_ms < to`, in the order they were written.
    pub fn events(&self, from: i64, to: i64) -> Result<Vec<Event>, JournalError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(EVENTS).map_err(db)?;
            let mut out = Vec::new();
            for item in t.iter().map_err(db)? {
                let (_, v) = item.map_err(db)?;
                let e: Event = serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?;
                if e.at_ms >= from && e.at_ms < to {
                    out.push(e);
                }
            }
            Ok(out)
        })
    }

    /// The limit was crossed: a new event, active and unacknowledged. `None` when the
    /// alarm is active already (a restart's evaluation finding it so: nothing twice).
    pub fn activate(
        &self,
        alarm_id: &str,
        at_ms: i64,
        value: Option<f64>,
    ) -> Result<Option<Instance>, JournalError> {
        self.transition(alarm_id, EventKind::Activated, at_ms, value, None, None, None)
    }

    /// Back inside: returned (unacknowledged) or normal (acknowledged before).
    pub fn clear(
        &self,
        alarm_id: &str,
        at_ms: i64,
        value: Option<f64>,
    ) -> Result<Option<Instance>, JournalError> {
        self.transition(alarm_id, EventKind::Cleared, at_ms, value, None, None, None)
    }

    /// An operator acknowledges event `event_id` of the alarm.
    pub fn acknowledge(
        &self,
        alarm_id: &str,
        event_id: u64,
        at_ms: i64,
        by: &str,
        comment: Option<&str>,
    ) -> Result<Instance, JournalError> {
        let done = self.transition(
            alarm_id,
            EventKind::Acknowledged,
            at_ms,
            None,
            Some(by),
            comment,
            Some(event_id),
        )?;
        done.ok_or_else(|| JournalError::NothingToAcknowledge { alarm_id: alarm_id.to_string(), event_id })
    }

    #[allow(clippy::too_many_arguments)]
    fn transition(
        &self,
        alarm_id: &str,
        kind: EventKind,
        at_ms: i64,
        value: Option<f64>,
        by: Option<&str>,
        comment: Option<&str>,
        event: Option<u64>,
    ) -> Result<Option<Instance>, JournalError> {
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            let done = {
                let mut instances = tx.open_table(INSTANCES).map_err(db)?;
                let was: Instance = match instances.get(alarm_id).map_err(db)? {
                    Some(v) => serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?,
                    None => Instance {
                        alarm_id: alarm_id.to_string(),
                        state: AlarmState::Normal,
                        event_id: 0,
                        since_ms: at_ms,
                        activated_ms: None,
                        value: None,
                        acknowledged_by: None,
                    },
                };
                let Some(state) = next(was.state, kind).filter(|_| event.is_none_or(|e| e == was.event_id))
                else {
                    return Ok(None);
                };
                let mut meta = tx.open_table(META).map_err(db)?;
                let seq = meta.get("next_seq").map_err(db)?.map_or(1, |v| v.value());
                meta.insert("next_seq", seq + 1).map_err(db)?;
                let mut now = Instance { state, since_ms: at_ms, ..was };
                if kind == EventKind::Activated {
                    let id = meta.get("next_event").map_err(db)?.map_or(1, |v| v.value());
                    meta.insert("next_event", id + 1).map_err(db)?;
                    now.event_id = id;
                    now.activated_ms = Some(at_ms);
                    now.value = value;
                    now.acknowledged_by = None;
                }
                if kind == EventKind::Acknowledged {
                    now.acknowledged_by = by.map(str::to_string);
                }
                let e = Event {
                    seq,
                    alarm_id: alarm_id.to_string(),
                    event_id: now.event_id,
                    kind,
                    at_ms,
                    value,
                    by: by.map(str::to_string),
                    comment: comment.map(str::to_string),
                };
                instances.insert(alarm_id, json(&now).as_slice()).map_err(db)?;
                tx.open_table(EVENTS).map_err(db)?.insert(seq, json(&e).as_slice()).map_err(db)?;
                now
            };
            tx.commit().map_err(db)?;
            Ok(Some(done))
        })
    }
}

/// Our own types as JSON (serializing them cannot fail).
fn json<T: Serialize>(x: &T) -> Vec<u8> {
    serde_json::to_vec(x).unwrap_or_default()
}

#[cfg(test)]
#[path = "alarm_journal_tests.rs"]
mod tests;
