//! The poller: reads every polled device at its `poll_interval_ms` into the history store.
//!
//! One task per device, started at a random offset within its interval so devices are not
//! polled in lockstep; a slow device delays only its own task. Reads go through
//! `reading::Reader::read`, so the poller shares each device's breaker with the tools: an open
//! device is not polled until its probe. A sample is stored when it moved by at least the
//! sensor's `deadband`, its quality changed, or `history.max_silence_s` passed since the
//! last stored point. Every sample refreshes the reading cache (`max_age_ms`).
//!
//! OPC UA devices in `mode = "subscribe"` are not polled: a subscription delivers their
//! changes (filtered by the deadband on the server), which are recorded the same way; while
//! it is live, a sensor silent for `max_silence_s` has its last value stored again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::driver::Sample;
use crate::driver::codec::{RawValue, normalize};
use crate::driver::opcua::subscribe;
use crate::registry::{OpcUaMode, Sensor, SensorSource};
use crate::resilience::probe;
use crate::store::HistoryStore;
use crate::store::gorilla::{Point, Stored};
use crate::tools::ToolService;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct PollCounters {
    pub polled: AtomicU64,
    pub stored: AtomicU64,
}

/// The last stored point of a sensor, for the deadband.
struct Last {
    t: i64,
    value: Stored,
    quality: u8,
}

/// A sample as history stores it: the raw value and quality 0 good, 1 uncertain, 2 bad.
pub fn stored_of(sample: &Sample) -> (Stored, u8) {
    let (value, quality) = stored_value(sample);
    let quality = match sample.quality {
        crate::driver::SampleQuality::Good => quality,
        crate::driver::SampleQuality::Uncertain => quality.max(1),
        crate::driver::SampleQuality::Bad => 2,
    };
    (value, quality)
}

fn stored_value(sample: &Sample) -> (Stored, u8) {
    match &sample.value {
        RawValue::Float(f) if f.is_finite() => (Stored::Float(*f), 0),
        RawValue::Float(_) => (Stored::Float(f64::NAN), 2),
        RawValue::Int(i) => (Stored::Int(*i), 0),
        RawValue::UInt(u) => (Stored::Int(*u as i64), 0),
        RawValue::Bool(b) => (Stored::Bool(*b), 0),
        RawValue::Text(t) => (Stored::Text(t.clone()), 0),
    }
}

/// In the sensor's units, for comparing with its deadband.
fn normalized(sensor: &Sensor, v: &Stored) -> Option<f64> {
    let raw = match v {
        Stored::Float(f) => RawValue::Float(*f),
        Stored::Int(i) => RawValue::Int(*i),
        _ => return None,
    };
    match &sensor.source {
        SensorSource::Modbus(p) => normalize(p, &raw).as_f64(),
        SensorSource::OpcUa { .. } => raw.as_f64(),
    }
}

/// Whether a new sample is worth storing.
pub fn worth_storing(
    sensor: &Sensor,
    last: Option<(i64, &Stored, u8)>,
    t: i64,
    v: &Stored,
    q: u8,
    max_silence_ms: i64,
) -> bool {
    let Some((lt, lv, lq)) = last else { return true };
    if q != lq || t - lt >= max_silence_ms {
        return true;
    }
    match (normalized(sensor, lv), normalized(sensor, v)) {
        (Some(a), Some(b)) => {
            (b - a).abs() >= sensor.deadband.unwrap_or(0.0) && (b != a || sensor.deadband.is_none())
        }
        _ => lv != v,
    }
}

/// What the poller keeps per device to decide what to store.
struct Recorder<'a> {
    store: &'a HistoryStore,
    counters: &'a PollCounters,
    max_silence: i64,
    last: HashMap<&'a str, Last>,
}

impl<'a> Recorder<'a> {
    fn new(config: &crate::config::Config, store: &'a HistoryStore, counters: &'a PollCounters) -> Self {
        let max_silence = config.history.max_silence_s as i64 * 1000;
        Recorder { store, counters, max_silence, last: HashMap::new() }
    }

    /// A fresh sample of `s` (already in the reading cache): into history when worth it.
    fn record(&mut self, s: &'a Sensor, sample: &Sample) {
        self.counters.polled.fetch_add(1, Ordering::Relaxed);
        let t = sample.at.timestamp_millis();
        let (value, quality) = stored_of(sample);
        let prev = self.last.get(s.id.as_str()).map(|l| (l.t, &l.value, l.quality));
        if worth_storing(s, prev, t, &value, quality, self.max_silence) {
            self.append(s, Last { t, value, quality });
        }
    }

    /// Under a live subscription no news means no change beyond the deadband: repeats the
    /// last value of every sensor silent for `max_silence`, as polling would have stored it.
    fn still(&mut self, sensors: &[&'a Sensor], now: i64) {
        for s in sensors {
            let Some(l) = self.last.get(s.id.as_str()) else { continue };
            if now - l.t >= self.max_silence {
                let again = Last { t: now, value: l.value.clone(), quality: l.quality };
                self.append(s, again);
            }
        }
    }

    fn append(&mut self, s: &'a Sensor, l: Last) {
        if self.store.append(s.id.as_str(), &Point { t: l.t, value: l.value.clone(), quality: l.quality }) {
            self.counters.stored.fetch_add(1, Ordering::Relaxed);
        }
        self.last.insert(s.id.as_str(), l);
    }
}

/// Where the poller also hands its samples (the Sparkplug edge node), if anywhere.
type Tap = Option<crate::sparkplug::run::Tap>;

fn tap_send(tap: &Tap, device: usize, samples: Vec<(usize, Sample)>) {
    if let Some(t) = tap {
        t.send(crate::sparkplug::run::Batch { device, samples });
    }
}

async fn poll_device(
    tools: ToolService,
    store: Arc<HistoryStore>,
    device: usize,
    counters: Arc<PollCounters>,
    tap: Tap,
    stop: CancellationToken,
) {
    let (registry, reader) = (tools.registry(), tools.reader());
    let d = &registry.devices()[device];
    let Some(interval) = d.poll_interval else { return };
    let sensors: Vec<&Sensor> = registry.sensors_of_device(&d.id).collect();
    if sensors.is_empty() || !reader.has_driver(&d.id) {
        return;
    }
    let call_deadline = Duration::from_millis(tools.config().calls.deadline_ms);
    let mut recorder = Recorder::new(tools.config(), &store, &counters);
    // Devices start spread over one interval, not all at once.
    let mut next = Instant::now() + interval.mul_f64(crate::backoff::jitter());
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = stop.cancelled() => return,
        }
        let now = Instant::now();
        next += interval;
        if next <= now {
            // A slow round: skip the ticks it overran rather than bursting.
            next = now + interval;
        }
        let deadline = now + interval.min(call_deadline);
        let read = reader.read(&sensors, None, deadline).await;
        let mut fresh = Vec::with_capacity(if tap.is_some() { sensors.len() } else { 0 });
        for (s, r) in sensors.iter().zip(read.results) {
            if let Ok((sample, _)) = r {
                recorder.record(s, &sample);
                if tap.is_some() {
                    fresh.push((s.place.sensor, sample));
                }
            }
        }
        tap_send(&tap, device, fresh);
    }
}

/// An OPC UA device in `mode = "subscribe"`: its server sends changes (see
/// [`crate::driver::opcua::subscribe`]); they go where polled samples go.
async fn subscribe_device(
    tools: ToolService,
    store: Arc<HistoryStore>,
    device: usize,
    counters: Arc<PollCounters>,
    subscription: Arc<subscribe::Counters>,
    tap: Tap,
    stop: CancellationToken,
) {
    let (registry, reader) = (tools.registry(), tools.reader());
    let d = &registry.devices()[device];
    let pki = crate::driver::opcua::security::Pki::new(tools.config().storage.data_dir.join("pki"));
    let Some(target) = crate::driver::opcua::Target::of(d, &pki) else { return };
    let sensors: Vec<&Sensor> = registry.sensors_of_device(&d.id).collect();
    if sensors.is_empty() {
        return;
    }
    // `poll_interval_ms = 0` means "not collected" in either mode.
    let Some(interval) = d.poll_interval else { return };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let owned = sensors.iter().map(|s| (*s).clone()).collect();
    let task = tokio::spawn(subscribe::run(target, owned, interval, tx, subscription.clone(), stop.clone()));
    let mut recorder = Recorder::new(tools.config(), &store, &counters);
    // What get_device_status shows: the device was heard from; and its sessions, lost or
    // up again, go to its breaker as reads' outcomes would (down and up in the log).
    let health = reader.guard(&d.id).map(|g| &g.health);
    // Sensors whose server says it cannot reach them (BadNotConnected, ...): while every
    // one of them does, the device is unreachable behind a live server, a failure each second.
    let mut cut = std::collections::HashSet::new();
    let unreachable = crate::driver::DriverError::Unavailable { retry_after: None };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            u = rx.recv() => match u {
                Some(subscribe::Update::Change { sensor, sample }) => {
                    let Some(s) = sensors.get(sensor) else { continue };
                    let sample = match sample {
                        Ok(sample) => {
                            cut.remove(&sensor);
                            if let Some(h) = health {
                                h.heard();
                            }
                            sample
                        }
                        // The last value is no longer current: a bad-quality sample says so.
                        Err(crate::driver::DriverError::Unavailable { .. }) => {
                            cut.insert(sensor);
                            if cut.len() == sensors.len() {
                                reader.observe(&d.id, Err(&unreachable));
                            }
                            bad_now()
                        }
                        Err(_) => continue,
                    };
                    reader.cache().put(s, &sample);
                    recorder.record(s, &sample);
                    tap_send(&tap, device, vec![(s.place.sensor, sample)]);
                }
                Some(subscribe::Update::Up) => reader.observe(&d.id, Ok(())),
                Some(subscribe::Update::Down(e)) => reader.observe(&d.id, Err(&e)),
                None => break,
            },
            _ = tick.tick() => {
                if subscription.live.load(Ordering::Relaxed) {
                    recorder.still(&sensors, chrono::Utc::now().timestamp_millis());
                    if cut.len() == sensors.len() {
                        reader.observe(&d.id, Err(&unreachable));
                    }
                }
            }
            () = stop.cancelled() => break,
        }
    }
    let _ = task.await;
}

/// A bad-quality sample at the time now: the last value is no longer current.
fn bad_now() -> Sample {
    let quality = crate::driver::SampleQuality::Bad;
    Sample { value: RawValue::Float(f64::NAN), at: chrono::Utc::now(), quality }
}

/// Flushes the store every `storage.flush_interval_ms` (on a fixed schedule, on a blocking
/// thread so an fsync never holds a runtime worker) and applies retention every minute;
/// flushes a last time on stop. A failed flush keeps its points in memory for the next;
/// the store logs when it starts and stops failing.
async fn keep(tools: ToolService, store: Arc<HistoryStore>, stop: CancellationToken) {
    let cfg = tools.config().storage.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.flush_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_prune = Instant::now();
    let flush = |store: &Arc<HistoryStore>| {
        let s = store.clone();
        async move {
            match tokio::task::spawn_blocking(move || s.flush()).await {
                Ok(Err(error)) => tracing::debug!(%error, "history flush failed; points kept in memory"),
                Err(error) => tracing::error!(%error, "history flush task failed"),
                Ok(Ok(_)) => {}
            }
        }
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => {
                flush(&store).await;
                if let Some(p) = store.problem() {
                    tracing::error!(reason = %p.reason, "history not fully written at stop");
                }
                return;
            }
        }
        flush(&store).await;
        if last_prune.elapsed() >= Duration::from_secs(60) {
            last_prune = Instant::now();
            let older = chrono::Utc::now().timestamp_millis() - cfg.retention_days as i64 * 86_400_000;
            let s = store.clone();
            let max = cfg.retention_max_mb * 1024 * 1024;
            match tokio::task::spawn_blocking(move || s.prune(older, max)).await {
                Ok(Ok(p)) if p.chunks > 0 => {
                    tracing::info!(chunks = p.chunks, bytes = p.bytes, "history retention")
                }
                Ok(Err(error)) => tracing::error!(%error, "history retention failed"),
                _ => {}
            }
        }
    }
}

/// Watches one device for fieldgate's own probes (see [`crate::resilience::probe`]):
/// while its breaker is open or a caller is blocked on it, one small read on the
/// breaker's schedule, so its recovery is seen without agent traffic.
async fn watch_device(tools: ToolService, device: usize, stop: CancellationToken) {
    let reader = tools.reader();
    let d = &tools.registry().devices()[device];
    let Some(guard) = reader.guard(&d.id) else { return };
    if !reader.has_driver(&d.id) || tools.registry().sensors_of_device(&d.id).next().is_none() {
        return;
    }
    let mut last_probe = None;
    loop {
        let now = Instant::now();
        let due = probe::due(guard, tools.blocked_on(&d.id), last_probe, now);
        let wake = due.map_or(now + probe::IDLE, |t| t.min(now + probe::IDLE));
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = stop.cancelled() => return,
        }
        if due.is_some_and(|t| t <= Instant::now()) {
            last_probe = Some(Instant::now());
            let outcome = reader.probe(&d.id, false).await;
            tracing::debug!(device = %d.id, ?outcome, "probe");
        }
    }
}

/// Starts polling every polled device, fieldgate's own probes of every device, and the
/// flush task. Stop with `stop`; await the handles to be sure the last flush happened.
pub fn start(tools: &ToolService, stop: CancellationToken) -> Vec<JoinHandle<()>> {
    start_with(tools, None, stop)
}

/// [`start`], also handing every fresh sample to `tap` (the Sparkplug edge node).
pub fn start_with(tools: &ToolService, tap: Tap, stop: CancellationToken) -> Vec<JoinHandle<()>> {
    let watchers: Vec<JoinHandle<()>> = (0..tools.registry().devices().len())
        .map(|i| tokio::spawn(watch_device(tools.clone(), i, stop.clone())))
        .collect();
    let Some(store) = tools.history().cloned() else { return watchers };
    let counters = Arc::new(PollCounters::default());
    let c = counters.clone();
    tools.metrics().register(Box::new(move |out: &mut String| {
        use std::fmt::Write;
        out.push_str("# HELP fieldgate_points_polled_total Sensor values read by the poller.\n# TYPE fieldgate_points_polled_total counter\n");
        let _ = writeln!(out, "fieldgate_points_polled_total {}", c.polled.load(Ordering::Relaxed));
        out.push_str("# HELP fieldgate_points_stored_total History points stored (after deadbands).\n# TYPE fieldgate_points_stored_total counter\n");
        let _ = writeln!(out, "fieldgate_points_stored_total {}", c.stored.load(Ordering::Relaxed));
    }));
    let mut handles = watchers;
    let mut subscriptions = Vec::new();
    for (i, d) in tools.registry().devices().iter().enumerate() {
        let subscribed = d.opcua.as_ref().is_some_and(|o| o.mode == OpcUaMode::Subscribe);
        if subscribed {
            let c = Arc::new(subscribe::Counters::default());
            subscriptions.push((d.id.to_string(), c.clone()));
            handles.push(tokio::spawn(subscribe_device(
                tools.clone(),
                store.clone(),
                i,
                counters.clone(),
                c,
                tap.clone(),
                stop.clone(),
            )));
        } else {
            handles.push(tokio::spawn(poll_device(
                tools.clone(),
                store.clone(),
                i,
                counters.clone(),
                tap.clone(),
                stop.clone(),
            )));
        }
    }
    if !subscriptions.is_empty() {
        tools.metrics().register(Box::new(move |out: &mut String| {
            use std::fmt::Write;
            out.push_str("# HELP fieldgate_opcua_sessions_total Sessions opened with their subscription created, per subscribed device.\n# TYPE fieldgate_opcua_sessions_total counter\n");
            for (d, c) in &subscriptions {
                let _ = writeln!(out, "fieldgate_opcua_sessions_total{{device=\"{d}\"}} {}", c.sessions.load(Ordering::Relaxed));
            }
            out.push_str("# HELP fieldgate_opcua_notifications_total Data changes received, per subscribed device.\n# TYPE fieldgate_opcua_notifications_total counter\n");
            for (d, c) in &subscriptions {
                let _ = writeln!(out, "fieldgate_opcua_notifications_total{{device=\"{d}\"}} {}", c.notifications.load(Ordering::Relaxed));
            }
        }));
    }
    handles.push(tokio::spawn(keep(tools.clone(), store, stop)));
    handles
}
