//! A device's clock, checked: the time a sample is filed at comes from the device (an OPC UA
//! source or server timestamp) only while that time is believable. A server whose own
//! timestamp is off from ours by more than `SKEW_MS` has its timestamps moved by the same
//! offset (a clock 40 days behind would file every point 40 days back); a time still ahead of
//! ours, before 2000 (a server stuck at 1601), or older than the same sensor's previous
//! sample by more than the device's poll interval (its clock jumped back), is replaced by
//! the time it was received, and the sample marked uncertain: a sensor's samples are never
//! filed going back in time. Each correction is counted per device
//! (`fieldgate_device_clock_corrections_total`); the first is logged once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// A device timestamp this far from ours says the device's clock is off.
const SKEW_MS: i64 = 5_000;
/// The earliest time a sample may have (2000-01-01T00:00:00Z).
const FLOOR_MS: i64 = 946_684_800_000;

/// One device's clock: how often its times were corrected.
#[derive(Debug)]
pub struct Clock {
    device: String,
    /// How far back a sensor's sample may be from its previous one (the poll interval, at
    /// least `SKEW_MS`).
    back_ms: i64,
    /// The time each sensor's last sample was filed at.
    last: parking_lot::Mutex<HashMap<String, i64>>,
    corrected: AtomicU64,
    warned: AtomicBool,
}

impl Clock {
    /// The clock of `device`, polled every `poll` (none: it is not polled).
    pub fn new(device: &str, poll: Option<Duration>) -> Clock {
        Clock {
            device: device.to_string(),
            // At least the skew tolerated ahead: servers re-send a value with a stamp a little
            // older than one they sent before (a status change, a resampled value).
            back_ms: poll.map_or(SKEW_MS, |p| p.as_millis().min(i64::MAX as u128) as i64).max(SKEW_MS),
            last: parking_lot::Mutex::new(HashMap::new()),
            corrected: AtomicU64::new(0),
            warned: AtomicBool::new(false),
        }
    }

    /// Samples whose time was corrected or replaced.
    pub fn corrections(&self) -> u64 {
        self.corrected.load(Ordering::Relaxed)
    }

    /// The time to file a sample of `sensor` at, received `now`, from the device's `source`
    /// and `server` timestamps; and whether the device's time was replaced by `now` (the
    /// sample is then uncertain). `sensor` is `None` for a sample without a value (a bad
    /// status): its time is neither checked against nor kept as the sensor's last one (a
    /// server may stamp a status change now and the value's return with the value's own,
    /// older, time).
    pub fn time_of(
        &self,
        sensor: Option<&str>,
        source: Option<DateTime<Utc>>,
        server: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> (DateTime<Utc>, bool) {
        let Some(device) = source.or(server) else { return (now, false) };
        let offset = server
            .map(|s| now.signed_duration_since(s))
            .filter(|o| o.num_milliseconds().abs() > SKEW_MS)
            .unwrap_or_default();
        let moved = device.checked_add_signed(offset);
        let ahead = now + TimeDelta::milliseconds(SKEW_MS);
        let (mut t, mut replaced) = match moved {
            Some(t) if t.timestamp_millis() >= FLOOR_MS && t <= ahead => (t, false),
            _ => (now, true),
        };
        // The latest device time a sensor's value was believed at: a time further back than
        // the poll interval is a clock that jumped back (replaced, until it is past again).
        if let Some(sensor) = sensor.filter(|_| !replaced) {
            let mut last = self.last.lock();
            let ms = t.timestamp_millis();
            match last.get_mut(sensor) {
                Some(prev) if ms < prev.saturating_sub(self.back_ms) => (t, replaced) = (now, true),
                Some(prev) => *prev = (*prev).max(ms),
                None => {
                    last.insert(sensor.to_string(), ms);
                }
            }
        }
        if replaced || !offset.is_zero() {
            self.corrected.fetch_add(1, Ordering::Relaxed);
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    device = %self.device,
                    device_time = %device.to_rfc3339(),
                    offset_ms = offset.num_milliseconds(),
                    "device clock is off: its samples are filed by fieldgate's clock (counted in fieldgate_device_clock_corrections_total; logged once)"
                );
            }
        }
        (t, replaced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).unwrap()
    }

    #[test]
    fn believable_times_are_kept_and_others_moved_or_replaced() {
        let now = at(1_790_000_000_000);
        let c = Clock::new("d", None);
        // A value changed an hour ago, from a server whose clock is right: kept.
        assert_eq!(
            c.time_of(Some("s"), Some(at(now.timestamp_millis() - 3_600_000)), Some(now), now),
            (at(now.timestamp_millis() - 3_600_000), false)
        );
        assert_eq!(c.time_of(Some("s"), None, None, now), (now, false));
        assert_eq!(c.corrections(), 0);
        // A server 40 days behind: its times move forward by the same 40 days.
        let behind = TimeDelta::days(40);
        let t = now - behind - TimeDelta::seconds(2);
        assert_eq!(
            c.time_of(Some("s"), Some(t), Some(now - behind), now),
            (now - TimeDelta::seconds(2), false)
        );
        // A year ahead with no server time, or stuck at 1601: the receive time, uncertain.
        assert_eq!(c.time_of(Some("s"), Some(now + TimeDelta::days(365)), None, now), (now, true));
        assert_eq!(c.time_of(Some("s"), Some(at(-11_644_473_600_000)), None, now), (now, true));
        assert_eq!(c.corrections(), 3);
        // Absurd times do not overflow: a server stuck at the first instant is moved to ours.
        assert_eq!(
            c.time_of(Some("s"), Some(DateTime::<Utc>::MIN_UTC), Some(DateTime::<Utc>::MIN_UTC), now).0,
            now
        );
        assert_eq!(c.time_of(Some("s"), Some(DateTime::<Utc>::MAX_UTC), Some(now), now), (now, true));
    }

    #[test]
    fn a_sensors_samples_never_go_back_by_more_than_the_poll_interval() {
        let now = at(1_790_000_000_000);
        let c = Clock::new("d", Some(Duration::from_secs(1)));
        let ms = |t: DateTime<Utc>| t.timestamp_millis();
        assert_eq!(c.time_of(Some("a"), Some(now), None, now), (now, false));
        // Unchanged value, same source time; or back by less than a poll: kept.
        assert_eq!(c.time_of(Some("a"), Some(now), None, now + TimeDelta::seconds(1)), (now, false));
        let back = at(ms(now) - 900);
        assert_eq!(c.time_of(Some("a"), Some(back), None, now + TimeDelta::seconds(2)), (back, false));
        // The device's clock jumps back an hour (no server time to tell): the receive time,
        // uncertain, until its time passes the last filed one.
        let later = now + TimeDelta::seconds(3);
        assert_eq!(c.time_of(Some("a"), Some(now - TimeDelta::hours(1)), None, later), (later, true));
        let again = later + TimeDelta::seconds(1);
        assert_eq!(c.time_of(Some("a"), Some(now - TimeDelta::hours(1)), None, again), (again, true));
        // Another sensor of the same device has its own past.
        let old = now - TimeDelta::hours(1);
        assert_eq!(c.time_of(Some("b"), Some(old), None, now), (old, false));
        assert_eq!(c.corrections(), 2);
        // A bad status stamped now, then the value back with its own older time: no jump (the
        // simulator's server does this; it failed a CI run).
        let d = Clock::new("d", Some(Duration::from_millis(50)));
        assert_eq!(d.time_of(Some("v"), Some(old), None, now), (old, false));
        assert_eq!(d.time_of(None, Some(now), None, now), (now, false));
        assert_eq!(d.time_of(Some("v"), Some(old), None, now), (old, false));
    }
}
