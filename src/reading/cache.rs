//! The last value read of every sensor: what `max_age_ms` answers from.

use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::driver::Sample;
use crate::registry::Sensor;

/// The last value read of every sensor, for `max_age_ms`, at the sensor's place in the
/// registry (no hashing of IDs on a batch's hundred reads and writes).
pub struct Cache {
    slots: Mutex<Vec<Option<Sample>>>,
}

impl Cache {
    /// An empty cache for a registry of `sensors` sensors.
    pub fn new(sensors: usize) -> Cache {
        Cache { slots: Mutex::new(vec![None; sensors]) }
    }

    pub fn put(&self, sensor: &Sensor, sample: &Sample) {
        self.put_all(std::iter::once((sensor, sample)));
    }

    /// Stores several samples under one lock.
    pub fn put_all<'a>(&self, samples: impl Iterator<Item = (&'a Sensor, &'a Sample)>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for (sensor, sample) in samples {
            match slots.get_mut(sensor.place.sensor) {
                // Never let an older sample (a slow read finishing late) replace a newer one.
                Some(Some(old)) if old.at > sample.at => {}
                Some(Some(old)) => old.clone_from(sample),
                Some(slot) => *slot = Some(sample.clone()),
                None => {}
            }
        }
    }

    /// The cached sample if it is at most `max_age_ms` old at `now`.
    pub fn fresh(&self, sensor: &Sensor, max_age_ms: u64, now: DateTime<Utc>) -> Option<Sample> {
        if max_age_ms == 0 {
            return None;
        }
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let s = slots.get(sensor.place.sensor)?.as_ref()?;
        let age = (now - s.at).num_milliseconds();
        (age >= 0 && age as u64 <= max_age_ms).then(|| s.clone())
    }

    /// How old the cached sample is at `now`, if there is one (and not from a clock that
    /// stepped back since).
    pub fn age_ms(&self, sensor: &Sensor, now: DateTime<Utc>) -> Option<u64> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let s = slots.get(sensor.place.sensor)?.as_ref()?;
        u64::try_from((now - s.at).num_milliseconds()).ok()
    }
}
