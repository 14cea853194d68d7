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

use super::entry::{self, Entry, Watch};
use super::limit::{LimitState, Transition, Value};
use super::table::pressing;
pub(super) use super::table::{EVENT_QUEUE, Pending, Table};
use crate::config::AlarmsConfig;
use crate::driver::opcua::conditions::{Command, ServerEvent};
use crate::driver::{RawValue, Sample, SampleQuality, normalize};
use crate::metrics::Sheet;
use crate::reading::Reader;
use crate::reading::feed::Batch;
use crate::registry::{OpcUaMode, Registry, Sensor, SensorSource};
use crate::store::alarm_journal::{Act, ActRequest, AlarmJournal, Instance, JournalError};

/// How often transitions older than `[alarms] journal_days` are removed.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Transitions kept for a journal that cannot write, at most.
pub const MAX_UNSAVED: usize = 10_000;

#[derive(Default)]
pub(super) struct Counters {
    pub server_events_lost: AtomicU64,
    /// Edge nodes' alarms the hub left out (an ID another's, or too many).
    pub remote_left_out: AtomicU64,
    evaluated: AtomicU64,
    pub transitions: AtomicU64,
    pub unsaved_dropped: AtomicU64,
    journal_failures: AtomicU64,
}

/// Every alarm and its instance as it stands.
pub struct Alarms {
    /// The alarms fixed at start (limits, communication), read without a lock.
    fixed: Vec<Arc<Entry>>,
    /// Sensor index → the fixed entries watching it.
    by_sensor: HashMap<usize, Vec<usize>>,
    /// The fixed communication alarms.
    comm: Vec<usize>,
    pub(super) journal: Arc<AlarmJournal>,
    pub(super) table: Mutex<Table>,
    /// Per fixed entry: out of service (not evaluated), as its instance says.
    out_of_service: Vec<AtomicBool>,
    /// Per fixed entry: an operator changed its service; the evaluation starts again from normal.
    resync: Vec<AtomicBool>,
    /// Entries whose sensor's value holds until it changes (a subscribed OPC UA device):
    /// their delays end on the clock too.
    held: Vec<usize>,
    /// The journal failed its last write (its warning is said once per failure).
    journal_failing: AtomicBool,
    /// Held by whoever writes the journal (before the table, when both): transitions
    /// reach the journal and the table in one order.
    writer: Mutex<()>,
    /// The hub: the alarm table reached its bound once (said once).
    pub(super) remote_full: AtomicBool,
    /// Samples the engine's queue had no room for.
    pub lost: Arc<AtomicU64>,
    /// How long the journal keeps a transition.
    keep: Duration,
    pub(super) counters: Counters,
    /// Device → the commands of its event subscription (Alarms & Conditions).
    pub(super) servers: Mutex<HashMap<usize, mpsc::Sender<Command>>>,
    pub(super) server_events: mpsc::Sender<(usize, ServerEvent)>,
    server_events_rx: Mutex<Option<mpsc::Receiver<(usize, ServerEvent)>>>,
    /// Counts every change of an instance or of the table (what the edge node publishes).
    changed: tokio::sync::watch::Sender<u64>,
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
    /// The alarms of `registry`'s devices, their instances restored from `journal`.
    pub fn new(
        registry: &Registry,
        journal: Arc<AlarmJournal>,
        config: &AlarmsConfig,
    ) -> Result<Alarms, JournalError> {
        let fixed = entry::fixed(registry, Duration::from_secs(config.comm_delay_s));
        let mut by_sensor: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut comm = Vec::new();
        for (i, e) in fixed.iter().enumerate() {
            match &e.watch {
                Watch::Limit { sensor, .. } => by_sensor.entry(*sensor).or_default().push(i),
                Watch::Comm { .. } => comm.push(i),
                Watch::Condition { .. } | Watch::Remote { .. } => {}
            }
        }
        let mut stored: HashMap<String, Instance> =
            journal.instances()?.into_iter().map(|i| (i.alarm_id.clone(), i)).collect();
        let instances: Vec<Instance> =
            fixed.iter().map(|e| stored.remove(&e.id).unwrap_or_else(|| Instance::normal(&e.id))).collect();
        let out_of_service = instances.iter().map(|i| AtomicBool::new(i.out_of_service)).collect();
        let resync = instances.iter().map(|_| AtomicBool::new(false)).collect();
        let held = fixed
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                matches!(e.watch, Watch::Limit { .. })
                    && registry
                        .devices()
                        .get(e.device)
                        .is_some_and(|d| d.opcua.as_ref().is_some_and(|o| o.mode == OpcUaMode::Subscribe))
            })
            .map(|(i, _)| i)
            .collect();
        let mut table = Table {
            by_id: entry::index(&fixed),
            entries: fixed.clone(),
            instances,
            conditions: HashMap::new(),
            refreshing: HashMap::new(),
            per_edge: HashMap::new(),
            by_remote_sensor: HashMap::new(),
        };
        table.restore_conditions(registry, journal.conditions()?, &mut stored);
        let (server_events, rx) = mpsc::channel(EVENT_QUEUE);
        Ok(Alarms {
            fixed,
            by_sensor,
            comm,
            journal,
            table: Mutex::new(table),
            out_of_service,
            resync,
            held,
            journal_failing: AtomicBool::new(false),
            writer: Mutex::new(()),
            remote_full: AtomicBool::new(false),
            lost: Arc::default(),
            keep: Duration::from_secs(config.journal_days.saturating_mul(86_400)),
            counters: Counters::default(),
            servers: Mutex::default(),
            server_events,
            server_events_rx: Mutex::new(Some(rx)),
            changed: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Every alarm with its instance now: the fixed ones in their order, then the servers'.
    pub fn listing(&self) -> Vec<(Arc<Entry>, Instance)> {
        let t = self.table.lock();
        t.entries.iter().cloned().zip(t.instances.iter().cloned()).collect()
    }

    /// An alarm and its instance now.
    pub fn get(&self, alarm_id: &str) -> Option<(Arc<Entry>, Instance)> {
        let t = self.table.lock();
        let i = *t.by_id.get(alarm_id)?;
        Some((t.entries[i].clone(), t.instances[i].clone()))
    }

    /// Told of every change of an alarm's instance, and of every alarm added (a server's
    /// condition seen first): then [`Alarms::listing`] has something new.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(super) fn touched(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Every alarm's instance now, in the order of [`Alarms::listing`].
    pub fn instances(&self) -> Vec<Instance> {
        self.table.lock().instances.clone()
    }

    /// Every alarm's ID.
    pub fn ids(&self) -> Vec<String> {
        self.table.lock().entries.iter().map(|e| e.id.clone()).collect()
    }

    /// How many alarms there are.
    pub fn count(&self) -> usize {
        self.table.lock().entries.len()
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
    pub fn of_sensor(&self, sensor: usize) -> Option<(Arc<Entry>, Option<Instance>)> {
        let watching = self.by_sensor.get(&sensor)?;
        let table = self.table.lock();
        let instances = &table.instances;
        let worst = watching
            .iter()
            .map(|&e| (e, &instances[e]))
            .filter(|(_, i)| pressing(i) > 0)
            .max_by_key(|(e, i)| (pressing(i), self.fixed[*e].priority));
        match worst {
            Some((e, i)) => Some((self.fixed[e].clone(), Some(i.clone()))),
            None => Some((self.fixed[watching[0]].clone(), None)),
        }
    }

    /// Whether any alarm watches a sensor (the feed is taken only then).
    pub fn any(&self) -> bool {
        !self.fixed.is_empty()
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
        let _writing = self.writer.lock();
        let mut t = self.table.lock();
        let i = *t.by_id.get(alarm_id).ok_or_else(|| ActError::NotFound(alarm_id.to_string()))?;
        if let Some(now) = self.journal.act(alarm_id, act, at_ms, by, comment)? {
            if i < self.fixed.len() {
                if matches!(act, Act::OutOfService | Act::InService) {
                    self.resync[i].store(true, Ordering::Relaxed);
                }
                self.out_of_service[i].store(now.out_of_service, Ordering::Relaxed);
            }
            t.instances[i] = now;
            self.touched();
        }
        Ok(t.instances[i].clone())
    }

    /// Writes `acts` in order, in one durable transaction, or none of them (they stay in
    /// `acts`). The table is locked only to apply what was written: a reader never waits
    /// for the disk.
    pub(super) fn commit(&self, acts: &mut VecDeque<Pending>) {
        if acts.is_empty() {
            return;
        }
        let _writing = self.writer.lock();
        let entries: Vec<Arc<Entry>> = {
            let t = self.table.lock();
            acts.iter().map(|(i, ..)| t.entries[*i].clone()).collect()
        };
        let requests: Vec<ActRequest> = acts
            .iter()
            .zip(&entries)
            .map(|((_, act, at_ms, note, by), e)| ActRequest {
                alarm_id: &e.id,
                act,
                at_ms: *at_ms,
                by: by.as_deref(),
                comment: note.as_deref(),
            })
            .collect();
        let written = self.journal.act_all(&requests);
        drop(requests);
        let done = match written {
            Ok(done) => done,
            Err(error) => {
                self.counters.journal_failures.fetch_add(1, Ordering::Relaxed);
                if !self.journal_failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, waiting = acts.len(), "alarm journal: transitions wait to be written (said once until it writes again)");
                }
                return;
            }
        };
        // A refusal is an act its state no longer allows (a server's repeat): nothing to
        // write.
        let mut t = self.table.lock();
        for (done, (i, act, ..)) in done.into_iter().zip(acts.drain(..)) {
            if let Ok(Some(now)) = done {
                t.instances[i] = now;
                self.touched();
                if matches!(act, Act::Activate { .. } | Act::Clear { .. }) {
                    self.counters.transitions.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        drop(t);
        if self.journal_failing.swap(false, Ordering::Relaxed) {
            tracing::info!("alarm journal: writing again; the transitions that waited are written");
        }
    }

    /// Shelvings whose time ended, undone (by fieldgate).
    fn unshelve_ended(&self, now_ms: i64) {
        let ended: Vec<String> = self
            .table
            .lock()
            .instances
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
        let t = self.table.lock();
        t.instances[..self.fixed.len()].iter().map(|i| LimitState::restored(i.state.is_active())).collect()
    }

    /// What the journal is told of entry `i`'s transition `t`, and when.
    fn act_of(&self, i: usize, t: Transition) -> Pending {
        match t {
            Transition::Activated { at_ms, value } => {
                (i, Act::Activate { value: kept(value), priority: self.fixed[i].priority }, at_ms, None, None)
            }
            Transition::Cleared { at_ms, value } => (i, Act::Clear { value: kept(value) }, at_ms, None, None),
        }
    }

    /// The delays of held values (subscribed sensors) that ended by `now_ms`.
    fn held_delays(&self, states: &mut [LimitState], now_ms: i64) -> Vec<Pending> {
        let mut out = Vec::new();
        for &i in &self.held {
            if self.out_of_service[i].load(Ordering::Relaxed) || self.resync[i].load(Ordering::Relaxed) {
                continue;
            }
            let Some(def) = self.fixed[i].def() else { continue };
            out.extend(states[i].on_time(def, now_ms).map(|t| self.act_of(i, t)));
        }
        out
    }

    /// The communication alarms' transitions by now: active once a device has failed for
    /// its delay (stamped when the delay ended), cleared at its next answer (stamped then).
    /// A device not read yet since start holds its alarm as it was.
    fn comm_changes(&self, reader: &Reader, registry: &Registry, states: &mut [LimitState]) -> Vec<Pending> {
        let mut out = Vec::new();
        for &i in &self.comm {
            if self.resync[i].swap(false, Ordering::Relaxed) || self.out_of_service[i].load(Ordering::Relaxed)
            {
                states[i] = LimitState::restored(false);
                if self.out_of_service[i].load(Ordering::Relaxed) {
                    continue;
                }
            }
            let Watch::Comm { after } = self.fixed[i].watch else { continue };
            let Some(guard) = registry.devices().get(self.fixed[i].device).and_then(|d| reader.guard(&d.id))
            else {
                continue;
            };
            match (states[i].active, guard.health.failing_since()) {
                (false, Some((since, failed))) if failed >= after => {
                    states[i] = LimitState::restored(true);
                    let at = since.timestamp_millis().saturating_add(millis(after));
                    out.push((
                        i,
                        Act::Activate { value: None, priority: self.fixed[i].priority },
                        at,
                        None,
                        None,
                    ));
                }
                (true, None) => {
                    if let Some(answered) = guard.health.last_success() {
                        states[i] = LimitState::restored(false);
                        // Not before its activation (a clock set back between them).
                        let activated = self.table.lock().instances[i].activated_ms.unwrap_or(i64::MIN);
                        out.push((
                            i,
                            Act::Clear { value: None },
                            answered.timestamp_millis().max(activated),
                            None,
                            None,
                        ));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// `batch` evaluated: the transitions it made, in order.
    fn evaluate(&self, registry: &Registry, states: &mut [LimitState], batch: &Batch) -> Vec<Pending> {
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
                let Some(def) = self.fixed[i].def() else { continue };
                out.extend(states[i].on_sample(def, t, value, good).map(|t| self.act_of(i, t)));
            }
        }
        out
    }

    /// Evaluates every batch of `feed` until it ends (the producers stopped), ending
    /// shelvings on time; run by one task.
    pub async fn run(self: Arc<Self>, reader: Arc<Reader>, mut feed: mpsc::Receiver<Arc<Batch>>) {
        let registry = reader.registry().clone();
        let mut server_events = self.server_events_rx.lock().take();
        let mut states = self.states();
        let mut unsaved: VecDeque<Pending> = VecDeque::new();
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
                Some(first) = next_event(&mut server_events) => {
                    let mut batch = vec![first];
                    while let Some(rx) = server_events.as_mut() && batch.len() < 1000 {
                        let Ok(more) = rx.try_recv() else { break };
                        batch.push(more);
                    }
                    let (me, reg) = (self.clone(), registry.clone());
                    let acts = tokio::task::spawn_blocking(move || me.on_server_events(&reg, batch)).await;
                    unsaved.extend(acts.unwrap_or_default());
                }
                _ = tick.tick() => {
                    let now = chrono::Utc::now().timestamp_millis();
                    unsaved.extend(self.held_delays(&mut states, now));
                    unsaved.extend(self.comm_changes(&reader, &registry, &mut states));
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
        let (configured, active) = {
            let t = self.table.lock();
            (t.entries.len(), t.instances.iter().filter(|i| i.state.is_active()).count())
        };
        s.gauge(
            "fieldgate_alarms_configured",
            "Alarms configured (limits, communication, server conditions).",
            configured as i64,
        );
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
            "fieldgate_alarm_server_events_lost",
            "OPC UA condition events the alarm engine's queue had no room for.",
            load(&c.server_events_lost),
        );
        s.counter(
            "fieldgate_alarm_remote_left_out",
            "Edge nodes' alarms the hub left out (an ID another edge node's, or more than 100,000).",
            load(&c.remote_left_out),
        );
        s.counter(
            "fieldgate_alarm_transitions_dropped",
            "Transitions dropped: more than 10,000 waited for the journal, or (the hub) the journal did not take an edge's.",
            load(&c.unsaved_dropped),
        );
    }
}

/// The next server event, or never once there is no channel.
async fn next_event<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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
