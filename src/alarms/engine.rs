//! The alarm engine: every configured limit alarm evaluated over every fresh sample (the
//! sample feed's consumer), its transitions journaled (`store/alarm_journal.rs`), and the
//! operators' acts (acknowledge, shelve, unshelve, out of and back in service) applied
//! through the same lock, so the journal's order is the order things happened.
//!
//! [`Alarms`] is shared (the tools list it, operators act on it); the evaluation state of
//! each alarm (`LimitState`: the delay being counted) belongs to the one task that runs
//! [`Alarms::run`]. At start each alarm's state comes back from the journal: an alarm
//! active before a restart stays active under the same event ID, nothing twice.
//!
//! A transition the journal cannot take (a full disk) is kept, in order, and written again
//! every second until it can (at most [`MAX_UNSAVED`]; beyond, counted and dropped).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::limit::{LimitState, Transition, Value};
use crate::driver::{RawValue, Sample, SampleQuality, normalize};
use crate::metrics::Sheet;
use crate::reading::feed::Batch;
use crate::registry::{AlarmDef, OpcUaMode, Registry, Sensor, SensorSource};
use crate::store::alarm_journal::{Act, AlarmJournal, AlarmState, Instance, JournalError};

/// How often transitions older than `[alarms] journal_days` are removed.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Transitions kept for a journal that cannot write, at most.
pub const MAX_UNSAVED: usize = 10_000;

/// One configured alarm.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `SENSOR_ID.NAME`.
    pub id: String,
    /// The sensor's index in the registry.
    pub sensor: usize,
    pub def: AlarmDef,
}

#[derive(Default)]
struct Counters {
    evaluated: AtomicU64,
    transitions: AtomicU64,
    unsaved_dropped: AtomicU64,
    journal_failures: AtomicU64,
}

/// Every configured alarm and its instance as it stands.
pub struct Alarms {
    entries: Vec<Entry>,
    by_id: HashMap<String, usize>,
    /// Sensor index → the entries watching it.
    by_sensor: HashMap<usize, Vec<usize>>,
    journal: Arc<AlarmJournal>,
    /// Per entry; changed only with the journal written (under this lock).
    instances: Mutex<Vec<Instance>>,
    /// Per entry: out of service (not evaluated), as its instance says.
    out_of_service: Vec<AtomicBool>,
    /// Per entry: an operator changed its service; the evaluation starts again from normal.
    resync: Vec<AtomicBool>,
    /// Entries whose sensor's value holds until it changes (a subscribed OPC UA device):
    /// their delays end on the clock too.
    held: Vec<usize>,
    /// The journal failed its last write (its warning is said once per failure).
    journal_failing: AtomicBool,
    /// Samples the engine's queue had no room for.
    pub lost: Arc<AtomicU64>,
    /// How long the journal keeps a transition.
    keep: Duration,
    counters: Counters,
}

/// An operator act that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("no alarm {0}")]
    NotFound(String),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl Alarms {
    /// The alarms of `registry`'s sensors, their instances restored from `journal`.
    pub fn new(registry: &Registry, journal: Arc<AlarmJournal>) -> Result<Alarms, JournalError> {
        let mut entries = Vec::new();
        let mut by_sensor: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, s) in registry.sensors().iter().enumerate() {
            for def in &s.alarms {
                by_sensor.entry(i).or_default().push(entries.len());
                entries.push(Entry { id: format!("{}.{}", s.id, def.name), sensor: i, def: def.clone() });
            }
        }
        let mut stored: HashMap<String, Instance> =
            journal.instances()?.into_iter().map(|i| (i.alarm_id.clone(), i)).collect();
        let instances: Vec<Instance> =
            entries.iter().map(|e| stored.remove(&e.id).unwrap_or_else(|| Instance::normal(&e.id))).collect();
        let out_of_service = instances.iter().map(|i| AtomicBool::new(i.out_of_service)).collect();
        let resync = instances.iter().map(|_| AtomicBool::new(false)).collect();
        let held = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                registry.sensors().get(e.sensor).is_some_and(|s| {
                    registry.device_of(s).opcua.as_ref().is_some_and(|o| o.mode == OpcUaMode::Subscribe)
                })
            })
            .map(|(i, _)| i)
            .collect();
        let by_id = entries.iter().enumerate().map(|(i, e)| (e.id.clone(), i)).collect();
        Ok(Alarms {
            entries,
            by_id,
            by_sensor,
            journal,
            instances: Mutex::new(instances),
            out_of_service,
            resync,
            held,
            journal_failing: AtomicBool::new(false),
            lost: Arc::default(),
            keep: Duration::from_secs(365 * 86_400),
            counters: Counters::default(),
        })
    }

    /// The journal keeps transitions for `days` (`[alarms] journal_days`).
    pub fn keeping(mut self, days: u64) -> Alarms {
        self.keep = Duration::from_secs(days.saturating_mul(86_400));
        self
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn index_of(&self, alarm_id: &str) -> Option<usize> {
        self.by_id.get(alarm_id).copied()
    }

    /// Every alarm's instance now, in the order of [`Alarms::entries`].
    pub fn instances(&self) -> Vec<Instance> {
        self.instances.lock().clone()
    }

    pub fn journal(&self) -> &AlarmJournal {
        &self.journal
    }

    pub fn journal_handle(&self) -> Arc<AlarmJournal> {
        self.journal.clone()
    }

    /// The most pressing of a sensor's alarms (active-unacknowledged, then active, then
    /// returned-unacknowledged; the higher priority among equals; shelved and out of
    /// service left out): its entry and instance, or `None` when the sensor has no alarm.
    /// `Some((entry, None))`: the first of its alarms, none standing.
    pub fn of_sensor(&self, sensor: usize) -> Option<(&Entry, Option<Instance>)> {
        let watching = self.by_sensor.get(&sensor)?;
        let instances = self.instances.lock();
        let rank = |i: &Instance| match i.state {
            AlarmState::ActiveUnacknowledged => 3,
            AlarmState::ActiveAcknowledged => 2,
            AlarmState::ReturnedUnacknowledged => 1,
            AlarmState::Normal => 0,
        };
        let worst = watching
            .iter()
            .map(|&e| (e, &instances[e]))
            .filter(|(_, i)| rank(i) > 0 && i.shelved_until_ms.is_none() && !i.out_of_service)
            .max_by_key(|(e, i)| (rank(i), self.entries[*e].def.priority));
        match worst {
            Some((e, i)) => Some((&self.entries[e], Some(i.clone()))),
            None => Some((&self.entries[watching[0]], None)),
        }
    }

    /// Whether any alarm watches a sensor (the feed is taken only then).
    pub fn any(&self) -> bool {
        !self.entries.is_empty()
    }

    /// An operator's act on an alarm, journaled before it returns (blocking: call it off
    /// the async threads). `Ok(None)`: it changed nothing.
    pub fn operate(
        &self,
        alarm_id: &str,
        act: &Act,
        at_ms: i64,
        by: Option<&str>,
        comment: Option<&str>,
    ) -> Result<Instance, ActError> {
        let i = self.index_of(alarm_id).ok_or_else(|| ActError::NotFound(alarm_id.to_string()))?;
        let mut instances = self.instances.lock();
        if let Some(now) = self.journal.act(alarm_id, act, at_ms, by, comment)? {
            if matches!(act, Act::OutOfService | Act::InService) {
                self.resync[i].store(true, Ordering::Relaxed);
            }
            self.out_of_service[i].store(now.out_of_service, Ordering::Relaxed);
            instances[i] = now;
        }
        Ok(instances[i].clone())
    }

    /// Writes `acts` in order, as far as the journal takes them; what it does not take
    /// stays at the front of `acts`.
    fn commit(&self, acts: &mut VecDeque<(usize, Act, i64)>) {
        let mut instances = self.instances.lock();
        while let Some((i, act, at)) = acts.front() {
            match self.journal.act(&self.entries[*i].id, act, *at, None, None) {
                Ok(now) => {
                    if let Some(now) = now {
                        instances[*i] = now;
                    }
                    acts.pop_front();
                    if self.journal_failing.swap(false, Ordering::Relaxed) {
                        tracing::info!(
                            "alarm journal: writing again; the transitions that waited are written"
                        );
                    }
                }
                Err(error) => {
                    self.counters.journal_failures.fetch_add(1, Ordering::Relaxed);
                    if !self.journal_failing.swap(true, Ordering::Relaxed) {
                        tracing::warn!(%error, waiting = acts.len(), "alarm journal: transitions wait to be written (said once until it writes again)");
                    }
                    return;
                }
            }
        }
    }

    /// Shelvings whose time ended, undone (by fieldgate).
    fn unshelve_ended(&self, now_ms: i64) {
        let ended: Vec<String> = self
            .instances
            .lock()
            .iter()
            .filter(|i| i.shelved_until_ms.is_some_and(|u| u <= now_ms))
            .map(|i| i.alarm_id.clone())
            .collect();
        for id in ended {
            if let Err(error) = self.operate(&id, &Act::Unshelve, now_ms, None, Some("shelving time ended")) {
                tracing::warn!(%error, alarm = %id, "alarm journal: cannot end a shelving");
            }
        }
    }

    /// The evaluation's state, each alarm as its instance stands.
    fn states(&self) -> Vec<LimitState> {
        self.instances.lock().iter().map(|i| LimitState::restored(i.state.is_active())).collect()
    }

    /// What the journal is told of entry `i`'s transition `t`, and when.
    fn act_of(&self, i: usize, t: Transition) -> (usize, Act, i64) {
        match t {
            Transition::Activated { at_ms, value } => {
                (i, Act::Activate { value: kept(value), priority: self.entries[i].def.priority }, at_ms)
            }
            Transition::Cleared { at_ms, value } => (i, Act::Clear { value: kept(value) }, at_ms),
        }
    }

    /// The delays of held values (subscribed sensors) that ended by `now_ms`.
    fn held_delays(&self, states: &mut [LimitState], now_ms: i64) -> Vec<(usize, Act, i64)> {
        let mut out = Vec::new();
        for &i in &self.held {
            if self.out_of_service[i].load(Ordering::Relaxed) || self.resync[i].load(Ordering::Relaxed) {
                continue;
            }
            out.extend(states[i].on_time(&self.entries[i].def, now_ms).map(|t| self.act_of(i, t)));
        }
        self.counters.transitions.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// `batch` evaluated: the transitions it made, in order.
    fn evaluate(
        &self,
        registry: &Registry,
        states: &mut [LimitState],
        batch: &Batch,
    ) -> Vec<(usize, Act, i64)> {
        let mut out = Vec::new();
        for (s, sample) in &batch.samples {
            let Some(watching) = self.by_sensor.get(s) else { continue };
            let Some(sensor) = registry.sensors().get(*s) else { continue };
            let value = value_of(sensor, sample);
            let good = sample.quality == SampleQuality::Good;
            let t = sample.at.timestamp_millis();
            for &i in watching {
                self.counters.evaluated.fetch_add(1, Ordering::Relaxed);
                if self.resync[i].swap(false, Ordering::Relaxed) {
                    states[i] = LimitState::restored(false);
                }
                if self.out_of_service[i].load(Ordering::Relaxed) {
                    states[i] = LimitState::restored(false);
                    continue;
                }
                out.extend(
                    states[i].on_sample(&self.entries[i].def, t, value, good).map(|t| self.act_of(i, t)),
                );
            }
        }
        self.counters.transitions.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// Evaluates every batch of `feed` until it ends (the producers stopped), ending
    /// shelvings on time; run by one task.
    pub async fn run(self: Arc<Self>, registry: Arc<Registry>, mut feed: mpsc::Receiver<Arc<Batch>>) {
        let mut states = self.states();
        let mut unsaved: VecDeque<(usize, Act, i64)> = VecDeque::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut prune = tokio::time::interval(PRUNE_EVERY);
        prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                batch = feed.recv() => {
                    let Some(batch) = batch else { break };
                    unsaved.extend(self.evaluate(&registry, &mut states, &batch));
                }
                _ = tick.tick() => {
                    let now = chrono::Utc::now().timestamp_millis();
                    unsaved.extend(self.held_delays(&mut states, now));
                    let me = self.clone();
                    let _ = tokio::task::spawn_blocking(move || me.unshelve_ended(now)).await;
                }
                _ = prune.tick() => {
                    let me = self.clone();
                    let keep = i64::try_from(self.keep.as_millis()).unwrap_or(i64::MAX);
                    let cutoff = chrono::Utc::now().timestamp_millis().saturating_sub(keep);
                    let pruned = tokio::task::spawn_blocking(move || me.journal.prune_before(cutoff)).await;
                    if let Ok(Err(error)) = pruned {
                        tracing::warn!(%error, "alarm journal: old transitions not removed (tried again in an hour)");
                    }
                }
            }
            if !unsaved.is_empty() {
                let me = self.clone();
                let mut acts = std::mem::take(&mut unsaved);
                unsaved = tokio::task::spawn_blocking(move || {
                    me.commit(&mut acts);
                    acts
                })
                .await
                .unwrap_or_default();
                if unsaved.len() > MAX_UNSAVED {
                    let over = unsaved.len() - MAX_UNSAVED;
                    unsaved.drain(..over);
                    self.counters.unsaved_dropped.fetch_add(over as u64, Ordering::Relaxed);
                }
            }
        }
        if !unsaved.is_empty() {
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.commit(&mut unsaved)).await;
        }
    }

    /// Writes the engine's counters on `/metrics`.
    pub fn report(&self, s: &mut Sheet<'_>) {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        s.gauge("fieldgate_alarms_configured", "Limit alarms configured.", self.entries.len() as i64);
        let active = self.instances.lock().iter().filter(|i| i.state.is_active()).count();
        s.gauge("fieldgate_alarms_active", "Alarms active now.", active as i64);
        s.counter(
            "fieldgate_alarm_evaluations",
            "Alarm evaluations (one alarm, one sample).",
            load(&c.evaluated),
        );
        s.counter("fieldgate_alarm_transitions", "Alarms activated or cleared.", load(&c.transitions));
        s.counter(
            "fieldgate_alarm_samples_lost",
            "Samples the alarm engine's queue had no room for.",
            load(&self.lost),
        );
        s.counter(
            "fieldgate_alarm_journal_failures",
            "Times the alarm journal could not write a transition (kept and tried again).",
            load(&c.journal_failures),
        );
        s.counter(
            "fieldgate_alarm_transitions_dropped",
            "Transitions dropped because more than 10,000 waited for the journal.",
            load(&c.unsaved_dropped),
        );
    }
}

/// A value as the journal keeps it (a boolean as 0 or 1).
fn kept(v: Value) -> Option<f64> {
    match v {
        Value::Number(x) => Some(x),
        Value::Bool(b) => Some(f64::from(u8::from(b))),
        Value::Other => None,
    }
}

/// A sample's value in the sensor's units, as an alarm reads it.
pub fn value_of(sensor: &Sensor, sample: &Sample) -> Value {
    let v = match &sensor.source {
        SensorSource::Modbus(p) => normalize(p, &sample.value),
        _ => sample.value.clone(),
    };
    match v {
        RawValue::Bool(b) => Value::Bool(b),
        RawValue::Text(_) => Value::Other,
        other => other.as_f64().map_or(Value::Other, Value::Number),
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
