//! The alarm journal (`alarms.redb` in the data directory): each alarm's current instance
//! in its ISA-18.2 state, and every transition, written durably before it is answered.
//!
//! States (ISA-18.2 / OPC UA Part 9): normal, active-unacknowledged, active-acknowledged,
//! returned-unacknowledged; besides them, orthogonal, shelved (until a time, by an
//! operator, with a reason) and out of service. An activation starts a new event (its ID
//! one more than the journal's last); clearing and acknowledging belong to the event they
//! end. Taking an alarm out of service ends its event (the instance returns to normal).
//! A restart finds every instance as it was: the same event IDs, nothing activated twice.
//!
//! Tables: `instances` (alarm ID → the instance, JSON), `events` ((time, sequence number)
//! → the transition, JSON; a range of time is a range of keys), `meta` (`next_event`,
//! `next_seq`), `conditions` (alarm ID → the OPC UA server's condition it follows, JSON:
//! what lists it again at start, before its server is reached).

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::db::{Db, Problem, StorageFailure};
use crate::registry::AlarmPriority;

const INSTANCES: TableDefinition<&str, &[u8]> = TableDefinition::new("instances");
const EVENTS: TableDefinition<(i64, u64), &[u8]> = TableDefinition::new("events");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const CONDITIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("conditions");

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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

    pub fn is_unacknowledged(self) -> bool {
        matches!(self, AlarmState::ActiveUnacknowledged | AlarmState::ReturnedUnacknowledged)
    }

    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum EventKind {
    Activated,
    Cleared,
    Acknowledged,
    Shelved,
    Unshelved,
    OutOfService,
    InService,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        self.into()
    }
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
    /// The value that activated it (a boolean as 0 or 1).
    pub value: Option<f64>,
    pub acknowledged_by: Option<String>,
    #[serde(default)]
    pub acknowledged_ms: Option<i64>,
    /// Shelved until then (ms), by whom.
    #[serde(default)]
    pub shelved_until_ms: Option<i64>,
    #[serde(default)]
    pub shelved_by: Option<String>,
    #[serde(default)]
    pub out_of_service: bool,
}

impl Instance {
    /// An alarm that never activated.
    pub fn normal(alarm_id: &str) -> Instance {
        Instance::new(alarm_id, 0)
    }

    fn new(alarm_id: &str, at_ms: i64) -> Instance {
        Instance {
            alarm_id: alarm_id.to_string(),
            state: AlarmState::Normal,
            event_id: 0,
            since_ms: at_ms,
            activated_ms: None,
            value: None,
            acknowledged_by: None,
            acknowledged_ms: None,
            shelved_until_ms: None,
            shelved_by: None,
            out_of_service: false,
        }
    }
}

/// An OPC UA server's condition followed as an alarm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionRecord {
    pub alarm_id: String,
    /// The device's ID.
    pub device: String,
    /// The condition's NodeId, as text.
    pub node: String,
    /// The sensor it is about, if one is configured.
    pub sensor: Option<String>,
    pub message: String,
    pub priority: AlarmPriority,
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
    /// An activation's priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<AlarmPriority>,
    /// When the event this transition belongs to activated (ms; none for shelving).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_ms: Option<i64>,
    /// A shelving's end (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    /// An activation while the alarm was shelved (journaled, not annunciated).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shelved: bool,
}

/// What a transition does.
#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    /// The limit was crossed: a new event, active and unacknowledged.
    Activate {
        value: Option<f64>,
        priority: AlarmPriority,
    },
    /// Back inside: returned (unacknowledged) or normal (acknowledged before).
    Clear {
        value: Option<f64>,
    },
    /// An operator acknowledges the alarm's event (`event_id`, when given, must be it).
    Acknowledge {
        event_id: Option<u64>,
    },
    /// An operator shelves it until `until_ms` (again: a new end).
    Shelve {
        until_ms: i64,
    },
    Unshelve,
    /// Out of service: not evaluated; an event standing ends.
    OutOfService,
    InService,
}

/// Why an operator's act was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NothingToAcknowledge,
    /// The `event_id` given is not the alarm's current event.
    OtherEvent {
        current: u64,
    },
    NotShelved,
    OutOfService,
    InService,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("alarm journal: {0}")]
    Db(String),
    #[error("alarm journal: a stored record is corrupt")]
    Corrupt,
    #[error("alarm {alarm_id}: {refusal:?}")]
    Refused { alarm_id: String, refusal: Refusal },
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
    /// `alarms.last_event` beside a file-backed journal: the highest event ID ever given.
    marker: Option<std::path::PathBuf>,
}

impl AlarmJournal {
    /// Opens (or creates) `alarms.redb` in a data directory.
    /// A journal with fewer events than its marker says were given (a file emptied or
    /// replaced) is refused: event IDs would be given twice.
    pub fn open_in(dir: &Path) -> Result<AlarmJournal, JournalError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| JournalError::Db(format!("{}: {}", dir.display(), e.kind())))?;
        let path = dir.join("alarms.redb");
        let journal = AlarmJournal::with_db(Db::open_file("alarms", &path).map_err(JournalError::Db)?)?;
        let marker = dir.join("alarms.last_event");
        let given = read_marker(&marker)?;
        let held = journal.last_event()?;
        if given > held {
            return Err(JournalError::Db(format!(
                "{} holds alarm events up to {held} but {} says {given} was given: the journal was replaced, emptied or damaged; restore it from a backup, or move both files aside to start a new journal (event IDs would then be given again)",
                path.display(),
                marker.display()
            )));
        }
        let journal = AlarmJournal { marker: Some(marker), ..journal };
        if held > given {
            journal.mark_given(held);
        }
        Ok(journal)
    }

    /// The highest event ID given (0 before the first).
    fn last_event(&self) -> Result<u64, JournalError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let meta = tx.open_table(META).map_err(db)?;
            Ok(meta.get("next_event").map_err(db)?.map_or(1, |v| v.value()).saturating_sub(1))
        })
    }

    /// Records durably that event `id` was given (after its commit: the marker may lag
    /// the journal after a crash, never lead it).
    fn mark_given(&self, id: u64) {
        let Some(path) = &self.marker else { return };
        if let Err(error) = super::db::write_durably(path, id.to_string().as_bytes()) {
            tracing::error!(file = %path.display(), error = %error.kind(), "cannot record the highest alarm event ID given");
        }
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
            tx.open_table(CONDITIONS).map_err(self::db)?;
            tx.commit().map_err(self::db)
        })?;
        Ok(AlarmJournal { db, marker: None })
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

    /// One alarm's instance, if it has one.
    pub fn instance(&self, alarm_id: &str) -> Result<Option<Instance>, JournalError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(INSTANCES).map_err(db)?;
            match t.get(alarm_id).map_err(db)? {
                Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(|_| JournalError::Corrupt),
                None => Ok(None),
            }
        })
    }

    /// The instances of those of `ids` that have one (one read).
    pub fn instances_of(&self, ids: &[&str]) -> Result<Vec<Instance>, JournalError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(INSTANCES).map_err(db)?;
            let mut out = Vec::new();
            for id in ids {
                if let Some(v) = t.get(*id).map_err(db)? {
                    out.push(serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?);
                }
            }
            Ok(out)
        })
    }

    /// Every server condition followed, by alarm ID.
    pub fn conditions(&self) -> Result<Vec<ConditionRecord>, JournalError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CONDITIONS).map_err(db)?;
            let mut out = Vec::new();
            for item in t.iter().map_err(db)? {
                let (_, v) = item.map_err(db)?;
                out.push(serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?);
            }
            Ok(out)
        })
    }

    /// Records (or renews) a server condition followed.
    pub fn keep_condition(&self, record: &ConditionRecord) -> Result<(), JournalError> {
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            tx.open_table(CONDITIONS)
                .map_err(db)?
                .insert(record.alarm_id.as_str(), json(record).as_slice())
                .map_err(db)?;
            tx.commit().map_err(db)
        })
    }

    /// The transitions with `from <= at_ms < to`, by time (the order written within one
    /// millisecond), after the one keyed `after` (time, sequence number) when given, at
    /// most `max` of them.
    pub fn events(
        &self,
        from: i64,
        to: i64,
        after: Option<(i64, u64)>,
        max: usize,
    ) -> Result<Vec<Event>, JournalError> {
        if from >= to {
            return Ok(Vec::new());
        }
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(EVENTS).map_err(db)?;
            let mut out = Vec::new();
            let start = match after {
                Some((at, seq)) => (at.max(from), seq.saturating_add(1)),
                None => (from, 0),
            };
            for item in t.range(start..(to, 0)).map_err(db)? {
                if out.len() >= max {
                    break;
                }
                let (_, v) = item.map_err(db)?;
                out.push(serde_json::from_slice(v.value()).map_err(|_| JournalError::Corrupt)?);
            }
            Ok(out)
        })
    }

    /// Removes the transitions from before `cutoff_ms` (the instances stay as they are).
    pub fn prune_before(&self, cutoff_ms: i64) -> Result<(), JournalError> {
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            tx.open_table(EVENTS).map_err(db)?.retain_in(..(cutoff_ms, 0u64), |_, _| false).map_err(db)?;
            tx.commit().map_err(db)
        })
    }

    /// Applies `act` to the alarm at `at_ms` (by `by`, with `comment`): the instance
    /// after it, journaled, or `None` when it changes nothing.
    pub fn act(
        &self,
        alarm_id: &str,
        act: &Act,
        at_ms: i64,
        by: Option<&str>,
        comment: Option<&str>,
    ) -> Result<Option<Instance>, JournalError> {
        let one = ActRequest { alarm_id, act, at_ms, by, comment };
        match self.act_all(std::slice::from_ref(&one))?.pop() {
            Some(Ok(done)) => Ok(done),
            Some(Err(refusal)) => Err(JournalError::Refused { alarm_id: alarm_id.to_string(), refusal }),
            None => Ok(None),
        }
    }

    /// Applies `acts` in order, in one durable transaction: for each, the instance after
    /// it, `None` when it changes nothing, or its refusal (which leaves the others to be
    /// done). A storage failure writes none of them.
    pub fn act_all(
        &self,
        acts: &[ActRequest],
    ) -> Result<Vec<Result<Option<Instance>, Refusal>>, JournalError> {
        let mut given = None;
        let done = self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            let mut out = Vec::with_capacity(acts.len());
            {
                let mut tables = Tables {
                    instances: tx.open_table(INSTANCES).map_err(db)?,
                    meta: tx.open_table(META).map_err(db)?,
                    events: tx.open_table(EVENTS).map_err(db)?,
                };
                for a in acts {
                    let done = tables.record(a)?;
                    if let (Act::Activate { .. }, Ok(Some(i))) = (a.act, &done) {
                        given = Some(i.event_id);
                    }
                    out.push(done);
                }
            }
            tx.commit().map_err(db)?;
            Ok(out)
        })?;
        if let Some(id) = given {
            self.mark_given(id);
        }
        Ok(done)
    }
}

/// One act for [`AlarmJournal::act_all`]: `act` on `alarm_id` at `at_ms`, by `by`, with
/// `comment`.
#[derive(Debug, Clone, Copy)]
pub struct ActRequest<'a> {
    pub alarm_id: &'a str,
    pub act: &'a Act,
    pub at_ms: i64,
    pub by: Option<&'a str>,
    pub comment: Option<&'a str>,
}

/// The highest event ID a marker file says was given (0 when there is none).
fn read_marker(path: &Path) -> Result<u64, JournalError> {
    if let Err(e) = std::fs::symlink_metadata(path)
        && e.kind() == std::io::ErrorKind::NotFound
    {
        return Ok(0);
    }
    // Only a regular file of bounded size (a link to /dev/zero never ends).
    let text = crate::toml_reader::read_text_file(path)
        .map_err(|why| JournalError::Db(format!("{} cannot be read: {why}", path.display())))?;
    text.trim().parse().map_err(|_| {
        JournalError::Db(format!("{} does not hold an event number; restore it or remove it", path.display()))
    })
}

/// Our own types as JSON (serializing them cannot fail).
fn json<T: Serialize>(x: &T) -> Vec<u8> {
    serde_json::to_vec(x).unwrap_or_default()
}

#[path = "alarm_record.rs"]
mod record;
use record::Tables;

#[cfg(test)]
#[path = "alarm_journal_tests.rs"]
mod tests;
