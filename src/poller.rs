//! The poller: reads every polled device at its `poll_interval_ms` into the history store.
//!
//! One task per device, started at a random offset within its interval so devices are not
//! polled in lockstep; a slow device delays only its own task. Reads go through
//! `Resilience::read`, so the poller shares each device's breaker with the tools: an open
//! device is not polled until its probe. A sample is stored when it moved by at least the
//! sensor's `deadband`, its quality changed, or `history.max_silence_s` passed since the
//! last stored point. Every sample refreshes the reading cache (`max_age_ms`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::driver::Sample;
use crate::driver::codec::{RawValue, normalize};
use crate::registry::{Sensor, SensorSource};
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

fn stored_of(sample: &Sample) -> (Stored, u8) {
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

fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one(std::time::SystemTime::now());
    max.mul_f64((n >> 11) as f64 / (1u64 << 53) as f64)
}

async fn poll_device(
    tools: ToolService,
    store: Arc<HistoryStore>,
    device: usize,
    counters: Arc<PollCounters>,
    stop: CancellationToken,
) {
    let inner = tools.inner().clone();
    let registry = &inner.registry;
    let d = &registry.devices()[device];
    let Some(interval) = d.poll_interval else { return };
    let Some(driver) = inner.drivers.get(&d.id).cloned() else { return };
    let sensors: Vec<&Sensor> = registry.sensors_of_device(&d.id).collect();
    if sensors.is_empty() {
        return;
    }
    let max_silence = inner.config.history.max_silence_s as i64 * 1000;
    let call_deadline = Duration::from_millis(inner.config.calls.deadline_ms);
    let mut last: HashMap<&str, Last> = HashMap::new();
    let mut next = Instant::now() + jitter(interval);
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
        let (results, _) = inner.resilience.read(&d.id, driver.as_ref(), &sensors, deadline).await;
        let ok: Vec<(&Sensor, Sample)> =
            sensors.iter().zip(results).filter_map(|(s, r)| r.ok().map(|sample| (*s, sample))).collect();
        counters.polled.fetch_add(ok.len() as u64, Ordering::Relaxed);
        for (s, sample) in ok {
            inner.cache.put(&s.id, &sample);
            let t = sample.at.timestamp_millis();
            let (value, quality) = stored_of(&sample);
            let prev = last.get(s.id.as_str()).map(|l| (l.t, &l.value, l.quality));
            if worth_storing(s, prev, t, &value, quality, max_silence) {
                if store.append(s.id.as_str(), &Point { t, value: value.clone(), quality }) {
                    counters.stored.fetch_add(1, Ordering::Relaxed);
                }
                last.insert(s.id.as_str(), Last { t, value, quality });
            }
        }
    }
}

/// Flushes the store every `storage.flush_interval_ms` and applies retention every minute;
/// flushes a last time on stop.
async fn keep(tools: ToolService, store: Arc<HistoryStore>, stop: CancellationToken) {
    let cfg = tools.config().storage.clone();
    let mut tick = tokio::time::interval(Duration::from_millis(cfg.flush_interval_ms));
    let mut last_prune = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => {
                if let Err(error) = store.flush() {
                    tracing::error!(%error, "final history flush failed");
                }
                return;
            }
        }
        if let Err(error) = store.flush() {
            tracing::error!(%error, "history flush failed");
        }
        if last_prune.elapsed() >= Duration::from_secs(60) {
            last_prune = Instant::now();
            let older = chrono::Utc::now().timestamp_millis() - cfg.retention_days as i64 * 86_400_000;
            match store.prune(older, cfg.retention_max_mb * 1024 * 1024) {
                Ok(p) if p.chunks > 0 => {
                    tracing::info!(chunks = p.chunks, bytes = p.bytes, "history retention")
                }
                Ok(_) => {}
                Err(error) => tracing::error!(%error, "history retention failed"),
            }
        }
    }
}

/// Starts polling every polled device, and the flush task. Stop with `stop`; await the
/// handles to be sure the last flush happened.
pub fn start(tools: &ToolService, stop: CancellationToken) -> Vec<JoinHandle<()>> {
    let Some(store) = tools.history().cloned() else { return Vec::new() };
    let counters = Arc::new(PollCounters::default());
    let c = counters.clone();
    tools.metrics().register(Box::new(move |out: &mut String| {
        use std::fmt::Write;
        out.push_str("# HELP fieldgate_points_polled_total Sensor values read by the poller.\n# TYPE fieldgate_points_polled_total counter\n");
        let _ = writeln!(out, "fieldgate_points_polled_total {}", c.polled.load(Ordering::Relaxed));
        out.push_str("# HELP fieldgate_points_stored_total History points stored (after deadbands).\n# TYPE fieldgate_points_stored_total counter\n");
        let _ = writeln!(out, "fieldgate_points_stored_total {}", c.stored.load(Ordering::Relaxed));
    }));
    let mut handles = Vec::new();
    for i in 0..tools.registry().devices().len() {
        handles.push(tokio::spawn(poll_device(
            tools.clone(),
            store.clone(),
            i,
            counters.clone(),
            stop.clone(),
        )));
    }
    handles.push(tokio::spawn(keep(tools.clone(), store, stop)));
    handles
}
