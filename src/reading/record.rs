//! Recording into history: the one rule for what a sample is worth storing (it moved by
//! at least the sensor's `deadband`, its quality changed, or `history.max_silence_s`
//! passed since the last stored point), the sample as history stores it, and the
//! `Recorder` a producer (a poller task, a subscription) keeps per device. The Sparkplug
//! edge node's report by exception uses the same rule.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::driver::Sample;
use crate::driver::{RawValue, normalize};
use crate::metrics::Sheet;
use crate::registry::{Sensor, SensorSource};
use crate::store::HistoryStore;
use crate::store::gorilla::{Point, Stored};

/// What was recorded, for `/metrics`.
#[derive(Default)]
pub struct Counters {
    pub polled: AtomicU64,
    pub stored: AtomicU64,
}

impl Counters {
    /// Writes the counters on `/metrics`.
    pub fn report(&self, s: &mut Sheet<'_>) {
        s.counter(
            "fieldgate_points_polled",
            "Sensor values read by the poller.",
            self.polled.load(Ordering::Relaxed),
        );
        s.counter(
            "fieldgate_points_stored",
            "History points stored (after deadbands).",
            self.stored.load(Ordering::Relaxed),
        );
    }
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
        // Uncertain without a value (an OPC UA Uncertain status with a Null) stays uncertain.
        crate::driver::SampleQuality::Uncertain => 1,
        crate::driver::SampleQuality::Bad => 2,
    };
    (value, quality)
}

fn stored_value(sample: &Sample) -> (Stored, u8) {
    match &sample.value {
        RawValue::Float(f) if f.is_finite() => (Stored::Float(*f), 0),
        RawValue::Float(_) => (Stored::Float(f64::NAN), 2),
        RawValue::Int(i) => (Stored::Int(*i), 0),
        RawValue::UInt(u) => (Stored::UInt(*u), 0),
        RawValue::Bool(b) => (Stored::Bool(*b), 0),
        RawValue::Text(t) => (Stored::Text(t.clone()), 0),
    }
}

/// In the sensor's units, for comparing with its deadband.
fn normalized(sensor: &Sensor, v: &Stored) -> Option<f64> {
    let raw = match v {
        Stored::Float(f) => RawValue::Float(*f),
        Stored::Int(i) => RawValue::Int(*i),
        Stored::UInt(u) => RawValue::UInt(*u),
        _ => return None,
    };
    match &sensor.source {
        SensorSource::Modbus(p) => normalize(p, &raw).as_f64(),
        // An edge's values come in its units already.
        SensorSource::OpcUa { .. } | SensorSource::Edge(_) => raw.as_f64(),
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

/// What a producer keeps per device to decide what to store.
pub struct Recorder<'a> {
    store: &'a HistoryStore,
    counters: &'a Counters,
    max_silence: i64,
    last: HashMap<&'a str, Last>,
}

impl<'a> Recorder<'a> {
    pub fn new(config: &crate::config::Config, store: &'a HistoryStore, counters: &'a Counters) -> Self {
        let max_silence = config.history.max_silence_s as i64 * 1000;
        Recorder { store, counters, max_silence, last: HashMap::new() }
    }

    /// A fresh sample of `s` (already in the reading cache): into history when worth it.
    pub fn record(&mut self, s: &'a Sensor, sample: &Sample) {
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
    pub fn still(&mut self, sensors: &[&'a Sensor], now: i64) {
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
