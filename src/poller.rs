//! The poller: reads every polled device at its `poll_interval_ms` into the history store.
//!
//! One task per device, started at a random offset within its interval so devices are not
//! polled in lockstep; a slow device delays only its own task. Reads go through
//! `reading::Reader::read`, so the poller shares each device's breaker with the tools: an open
//! device is not polled until its probe. Samples are recorded into history by the reading
//! core's rule (`reading/record.rs`) and handed to the sample feed (`reading/feed.rs`) for
//! the consumers that want them. Every sample refreshes the reading cache (`max_age_ms`).
//!
//! OPC UA devices in `mode = "subscribe"` are not polled: a subscription delivers their
//! changes (filtered by the deadband on the server), which are recorded the same way; while
//! it is live, a sensor silent for `max_silence_s` has its last value stored again.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::driver::RawValue;
use crate::driver::Sample;
use crate::driver::opcua::subscribe;
use crate::reading::feed::{Batch, Publisher};
use crate::reading::record::{Counters, Recorder};
use crate::registry::{OpcUaMode, Sensor};
use crate::resilience::probe;
use crate::service::Core;
use crate::store::HistoryStore;

async fn poll_device(
    core: Core,
    store: Arc<HistoryStore>,
    device: usize,
    counters: Arc<Counters>,
    feed: Publisher,
    stop: CancellationToken,
) {
    let (registry, reader) = (&core.registry, &core.reader);
    let d = &registry.devices()[device];
    let Some(interval) = d.poll_interval else { return };
    let sensors: Vec<&Sensor> = registry.sensors_of_device(&d.id).collect();
    if sensors.is_empty() || !reader.has_driver(&d.id) {
        return;
    }
    let call_deadline = Duration::from_millis(core.config.calls.deadline_ms);
    let mut recorder = Recorder::new(&core.config, &store, &counters);
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
        let mut fresh = Vec::with_capacity(if feed.wanted() { sensors.len() } else { 0 });
        for (s, r) in sensors.iter().zip(read.results) {
            if let Ok((sample, _)) = r {
                recorder.record(s, &sample);
                if feed.wanted() {
                    fresh.push((s.place.sensor, sample));
                }
            }
        }
        feed.send(Batch { device, samples: fresh });
    }
}

/// An OPC UA device in `mode = "subscribe"`: its server sends changes (see
/// [`crate::driver::opcua::subscribe`]); they go where polled samples go.
async fn subscribe_device(
    core: Core,
    store: Arc<HistoryStore>,
    device: usize,
    counters: Arc<Counters>,
    subscription: Arc<subscribe::Counters>,
    feed: Publisher,
    stop: CancellationToken,
) {
    let (registry, reader) = (&core.registry, &core.reader);
    let d = &registry.devices()[device];
    let pki = crate::driver::opcua::security::Pki::new(core.config.storage.data_dir.join("pki"));
    let Some(mut target) = crate::driver::opcua::Target::of(d, &pki) else { return };
    // One clock per device, whether its samples come from reads or from the subscription.
    if let Some(clock) = reader.clock(&d.id) {
        target.clock = clock;
    }
    let sensors: Vec<&Sensor> = registry.sensors_of_device(&d.id).collect();
    if sensors.is_empty() {
        return;
    }
    // `poll_interval_ms = 0` means "not collected" in either mode.
    let Some(interval) = d.poll_interval else { return };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let owned = sensors.iter().map(|s| (*s).clone()).collect();
    let alarms = core.alarms.clone().filter(|_| d.opcua.as_ref().is_some_and(|o| o.alarms));
    let commands = alarms.as_ref().map(|a| a.attach_server(device));
    let task = tokio::spawn(subscribe::run(
        target,
        owned,
        interval,
        tx,
        subscription.clone(),
        stop.clone(),
        commands,
    ));
    let mut recorder = Recorder::new(&core.config, &store, &counters);
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
                        // The node no longer holds a value (it became an array, a Null, ...):
                        // the last value is not current either; the device is not to blame.
                        Err(_) => {
                            cut.remove(&sensor);
                            bad_now()
                        }
                    };
                    reader.cache().put(s, &sample);
                    recorder.record(s, &sample);
                    feed.send(Batch { device, samples: vec![(s.place.sensor, sample)] });
                }
                Some(subscribe::Update::Up) => reader.observe(&d.id, Ok(())),
                Some(subscribe::Update::Down(e)) => reader.observe(&d.id, Err(&e)),
                Some(subscribe::Update::RoundTrip(took)) => reader.round_trip(&d.id, took),
                Some(subscribe::Update::Event(e)) => {
                    if let Some(a) = &alarms {
                        a.server_event(device, e);
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                if subscription.live.load(Ordering::Relaxed) {
                    // Unchanged values are known to hold until the server last spoke, not
                    // now: a subscription silently dead leaves a gap, not repeated values.
                    let heard = subscription.heard_ms.load(Ordering::Relaxed);
                    recorder.still(&sensors, heard.min(chrono::Utc::now().timestamp_millis()));
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

/// A polled OPC UA device with `alarms = true`: a subscription to its server's condition
/// events only (its values are polled; its health is the polls').
async fn follow_conditions(core: Core, device: usize, stop: CancellationToken) {
    let d = &core.registry.devices()[device];
    let Some(alarms) = core.alarms.clone() else { return };
    let pki = crate::driver::opcua::security::Pki::new(core.config.storage.data_dir.join("pki"));
    let Some(target) = crate::driver::opcua::Target::of(d, &pki) else { return };
    let interval = d.poll_interval.unwrap_or(Duration::from_secs(1)).max(Duration::from_millis(100));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let counters = Arc::new(subscribe::Counters::default());
    let commands = Some(alarms.attach_server(device));
    let task = tokio::spawn(subscribe::run(target, Vec::new(), interval, tx, counters, stop, commands));
    while let Some(update) = rx.recv().await {
        if let subscribe::Update::Event(e) = update {
            alarms.server_event(device, e);
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
async fn keep(core: Core, store: Arc<HistoryStore>, stop: CancellationToken) {
    let cfg = core.config.storage.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.flush_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_prune = Instant::now();
    let mut pruning: Option<tokio::task::JoinHandle<()>> = None;
    if store.is_remote() {
        tokio::spawn(ship(store.clone(), cfg.flush_interval_ms, stop.clone()));
    }
    let flush = |store: &Arc<HistoryStore>, all: bool| {
        let s = store.clone();
        async move {
            match tokio::task::spawn_blocking(move || if all { s.flush_all() } else { s.flush() }).await {
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
                flush(&store, true).await;
                if let Some(p) = store.problem() {
                    tracing::error!(reason = %p.reason, "history not fully written at stop");
                }
                return;
            }
        }
        flush(&store, false).await;
        // Retention on a task of its own (a database that hangs must not hold up the
        // flushes); one at a time.
        if last_prune.elapsed() >= Duration::from_secs(60) && pruning.as_ref().is_none_or(|h| h.is_finished())
        {
            last_prune = Instant::now();
            let (s, c) = (store.clone(), cfg.clone());
            pruning = Some(tokio::spawn(async move { prune(&s, &c).await }));
        }
    }
}

/// With a database: what flushes wrote goes on to it every flush interval, on a task of its
/// own (a database that hangs never holds up the flushes that keep history durable here).
async fn ship(store: Arc<HistoryStore>, every_ms: u64, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(every_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        let s = store.clone();
        if let Ok(Err(error)) = tokio::task::spawn_blocking(move || s.ship()).await {
            tracing::debug!(%error, "history: shipment failed; chunks wait in the data directory");
        }
    }
    // A last shipment of what the last flush wrote (what it cannot ship waits on disk).
    let s = store.clone();
    let _ = tokio::task::spawn_blocking(move || s.ship()).await;
}

/// Retention: the store's file (a day only when a database keeps history), then the
/// database's days older than `retention_days`.
async fn prune(store: &Arc<HistoryStore>, cfg: &crate::config::StorageConfig) {
    let now = chrono::Utc::now().timestamp_millis();
    let older = now - cfg.retention_days as i64 * 86_400_000;
    let local = if store.is_remote() { older.max(now - crate::store::history::LOCAL_KEEP_MS) } else { older };
    let (s, max) = (store.clone(), cfg.retention_max_mb * 1024 * 1024);
    let remote = store.is_remote();
    match tokio::task::spawn_blocking(move || (s.prune(local, max), remote.then(|| s.prune_remote(older))))
        .await
    {
        Ok((local, remote)) => {
            match local {
                Ok(p) if p.chunks > 0 => {
                    tracing::info!(chunks = p.chunks, bytes = p.bytes, "history retention")
                }
                Err(error) => tracing::error!(%error, "history retention failed"),
                _ => {}
            }
            match remote {
                Some(Ok(d)) if d.partitions > 0 => {
                    tracing::info!(days = d.partitions, bytes = d.bytes, "history retention in the database")
                }
                Some(Err(error)) => tracing::warn!(%error, "history retention in the database failed"),
                _ => {}
            }
        }
        Err(error) => tracing::error!(%error, "history retention task failed"),
    }
}

/// Watches one device for fieldgate's own probes (see [`crate::resilience::probe`]):
/// while its breaker is open or a caller is blocked on it, one small read on the
/// breaker's schedule, so its recovery is seen without agent traffic.
async fn watch_device(core: Core, device: usize, stop: CancellationToken) {
    let reader = &core.reader;
    let d = &core.registry.devices()[device];
    let Some(guard) = reader.guard(&d.id) else { return };
    if !reader.has_driver(&d.id) || core.registry.sensors_of_device(&d.id).next().is_none() {
        return;
    }
    let mut last_probe = None;
    loop {
        let now = Instant::now();
        let due = probe::due(guard, core.blocked_on(&d.id), last_probe, now);
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

/// Starts polling every polled device (handing every fresh sample to the core's feed as
/// well), fieldgate's own probes of every device, and the flush task. Stop with `stop`;
/// await the handles to be sure the last flush happened.
pub fn start(core: &Core, stop: CancellationToken) -> Vec<JoinHandle<()>> {
    let mut watchers: Vec<JoinHandle<()>> = (0..core.registry.devices().len())
        .map(|i| tokio::spawn(watch_device(core.clone(), i, stop.clone())))
        .collect();
    for (i, d) in core.registry.devices().iter().enumerate() {
        if d.opcua.as_ref().is_some_and(|o| o.alarms && o.mode == OpcUaMode::Poll) && core.alarms.is_some() {
            watchers.push(tokio::spawn(follow_conditions(core.clone(), i, stop.clone())));
        }
    }
    let Some(store) = core.history.clone() else { return watchers };
    let feed = core.feed.publisher();
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    core.metrics.collect("poller", move |s| c.report(s));
    let mut handles = watchers;
    let mut subscriptions = Vec::new();
    for (i, d) in core.registry.devices().iter().enumerate() {
        let subscribed = d.opcua.as_ref().is_some_and(|o| o.mode == OpcUaMode::Subscribe);
        if subscribed {
            let c = Arc::new(subscribe::Counters::default());
            subscriptions.push((d.id.to_string(), c.clone()));
            handles.push(tokio::spawn(subscribe_device(
                core.clone(),
                store.clone(),
                i,
                counters.clone(),
                c,
                feed.clone(),
                stop.clone(),
            )));
        } else {
            handles.push(tokio::spawn(poll_device(
                core.clone(),
                store.clone(),
                i,
                counters.clone(),
                feed.clone(),
                stop.clone(),
            )));
        }
    }
    if !subscriptions.is_empty() {
        core.metrics.collect("opcua subscriptions", move |s| {
            let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            s.counters(
                "fieldgate_opcua_sessions",
                "Sessions opened with their subscription created, per subscribed device.",
                "device",
                subscriptions.iter().map(|(d, c)| (d.as_str(), n(&c.sessions))),
            );
            s.counters(
                "fieldgate_opcua_notifications",
                "Data changes received, per subscribed device.",
                "device",
                subscriptions.iter().map(|(d, c)| (d.as_str(), n(&c.notifications))),
            );
        });
    }
    handles.push(tokio::spawn(keep(core.clone(), store, stop)));
    handles
}
