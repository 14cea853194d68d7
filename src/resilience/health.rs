//! What is known about a device's health: last success, last error, recent latency.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::driver::DriverError;

/// Device reads kept for the latency percentiles.
const SAMPLES: usize = 100;

#[derive(Default)]
struct Inner {
    last_success: Option<DateTime<Utc>>,
    /// The first failure since the last success: when (for people) and the monotonic
    /// instant (for how long, whatever the wall clock does).
    failing_since: Option<(DateTime<Utc>, Instant)>,
    last_error: Option<(DriverError, DateTime<Utc>)>,
    /// Reads the device failed (no reply, refused, malformed, busy) since start.
    failures: u64,
    latencies: VecDeque<Duration>,
}

#[derive(Default)]
pub struct Health {
    inner: Mutex<Inner>,
}

/// A copy for `get_device_status`.
#[derive(Debug, Clone, Default)]
pub struct HealthSnapshot {
    pub last_success: Option<DateTime<Utc>>,
    pub last_error: Option<(DriverError, DateTime<Utc>)>,
    /// The first failure since the last success: since when the device is failing.
    pub failing_since: Option<DateTime<Utc>>,
    /// Reads the device failed since start.
    pub failures: u64,
    /// p50, p99 and the number of reads they are taken over.
    pub latency: Option<(Duration, Duration, usize)>,
}

/// The last [`SAMPLES`] latencies.
fn keep(latencies: &mut VecDeque<Duration>, took: Duration) {
    latencies.push_back(took);
    if latencies.len() > SAMPLES {
        latencies.pop_front();
    }
}

impl Health {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// One device read: how long it took and the error, if it failed as a whole.
    pub fn record(&self, took: Duration, error: Option<&DriverError>) {
        let now = Utc::now();
        let mut i = self.lock();
        match error {
            None => {
                i.last_success = Some(now);
                i.failing_since = None;
            }
            Some(e) => {
                i.last_error = Some((e.clone(), now));
                // A device that answered "no" is alive: only its silence makes it failing,
                // or its refusing us altogether (a session refused: nothing can be read).
                if e.blames_device() {
                    i.failures += 1;
                }
                if e.blames_device() || matches!(e, DriverError::Refused(_)) {
                    i.failing_since.get_or_insert((now, Instant::now()));
                }
            }
        }
        keep(&mut i.latencies, took);
    }

    /// A round trip measured without a read (a subscribed server asked its time): kept
    /// with the reads' latencies, and the device was heard from.
    pub fn round_trip(&self, took: Duration) {
        self.heard();
        keep(&mut self.lock().latencies, took);
    }

    /// The device was heard from without a read (an OPC UA subscription's data change).
    pub fn heard(&self) {
        let mut i = self.lock();
        i.last_success = Some(Utc::now());
        i.failing_since = None;
    }

    /// The device was lost without a read failing (an OPC UA subscription's session was
    /// lost or could not be opened); counted as a failure when the device is to blame.
    pub fn lost(&self, error: DriverError) {
        let now = Utc::now();
        let mut i = self.lock();
        if error.blames_device() {
            i.failures += 1;
        }
        i.last_error = Some((error, now));
        i.failing_since.get_or_insert((now, Instant::now()));
    }

    /// The refusal of fieldgate's session the device answers with since its last success,
    /// if it does (cheap: no snapshot).
    pub fn refusal(&self) -> Option<DriverError> {
        let i = self.lock();
        match (&i.last_error, i.failing_since) {
            (Some((e @ DriverError::Refused(_), _)), Some(_)) => Some(e.clone()),
            _ => None,
        }
    }

    /// Whether the device is failing (no success since its first failure).
    pub fn is_failing(&self) -> bool {
        self.lock().failing_since.is_some()
    }

    /// Since when the device is failing (no success since), if it is, and for how long.
    pub fn failing_since(&self) -> Option<(DateTime<Utc>, Duration)> {
        self.lock().failing_since.map(|(t, i)| (t, i.elapsed()))
    }

    pub fn last_success(&self) -> Option<DateTime<Utc>> {
        self.lock().last_success
    }

    pub fn snapshot(&self) -> HealthSnapshot {
        let i = self.lock();
        let latency = (!i.latencies.is_empty()).then(|| {
            let mut v: Vec<Duration> = i.latencies.iter().copied().collect();
            v.sort();
            let at = |p: usize| v[((v.len() - 1) * p).div_ceil(100)];
            (at(50), at(99), v.len())
        });
        HealthSnapshot {
            last_success: i.last_success,
            last_error: i.last_error.clone(),
            failing_since: i.failing_since.map(|(t, _)| t),
            failures: i.failures,
            latency,
        }
    }
}
