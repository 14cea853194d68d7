//! The last value read of every sensor: what `max_age_ms` answers from.

use parking_lot::Mutex;

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
        let mut slots = self.slots.lock();
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
        let slots = self.slots.lock();
        let s = slots.get(sensor.place.sensor)?.as_ref()?;
        let age = (now - s.at).num_milliseconds();
        (age >= 0 && age as u64 <= max_age_ms).then(|| s.clone())
    }

    /// The latest sample, however old (what a Sparkplug birth reports as current).
    pub fn last(&self, sensor: &Sensor) -> Option<Sample> {
        let slots = self.slots.lock();
        slots.get(sensor.place.sensor)?.clone()
    }

    /// How old the cached sample is at `now`, if there is one (and not from a clock that
    /// stepped back since).
    pub fn age_ms(&self, sensor: &Sensor, now: DateTime<Utc>) -> Option<u64> {
        let slots = self.slots.lock();
        let s = slots.get(sensor.place.sensor)?.as_ref()?;
        u64::try_from((now - s.at).num_milliseconds()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::RawValue;
    use crate::driver::SampleQuality;
    use crate::registry::SensorSource;

    #[test]
    fn the_cache_keeps_the_newest_sample_at_the_sensor_place() {
        let cache = Cache::new(3);
        let mut s = Sensor::for_tests(SensorSource::OpcUa { node_id: "ns=2;s=X".into() }, "bar", None);
        let at = |ms| DateTime::<Utc>::from_timestamp_millis(ms).unwrap();
        let sample = |v, ms| Sample { value: RawValue::Float(v), at: at(ms), quality: SampleQuality::Good };
        // Outside a registry: nothing is stored or found.
        cache.put(&s, &sample(1.0, 1_000));
        assert!(cache.fresh(&s, 10_000, at(1_000)).is_none());
        s.place = crate::registry::Place { sensor: 1, device: 0 };
        assert!(cache.fresh(&s, 10_000, at(1_000)).is_none());
        cache.put(&s, &sample(2.0, 2_000));
        // A late read of an older value does not replace it.
        cache.put(&s, &sample(3.0, 1_500));
        let hit = cache.fresh(&s, 10_000, at(2_500)).unwrap();
        assert_eq!((hit.value, hit.at), (RawValue::Float(2.0), at(2_000)));
        // Too old, or from the future, or max_age_ms 0: a miss.
        assert!(cache.fresh(&s, 400, at(2_500)).is_none());
        assert!(cache.fresh(&s, 10_000, at(1_999)).is_none());
        assert!(cache.fresh(&s, 0, at(2_000)).is_none());
        // Its age, for a failed read's hint; none from before it was read.
        assert_eq!(cache.age_ms(&s, at(2_500)), Some(500));
        assert_eq!(cache.age_ms(&s, at(1_999)), None);
        // Other places are untouched.
        s.place.sensor = 0;
        assert!(cache.fresh(&s, 10_000, at(2_500)).is_none());
        assert_eq!(cache.age_ms(&s, at(2_500)), None);
    }
}
