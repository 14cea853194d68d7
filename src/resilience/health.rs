//! What is known about a device's health: last success, last error, recent latency.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::driver::DriverError;

/// Device reads kept for the latency percentiles.
const SAMPLES: usize = 100;

#[derive(Default)]
struct Inner {
    last_success: Option<DateTime<Utc>>,
    last_error: Option<(DriverError, DateTime<Utc>)>,
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
    /// p50, p99 and the number of reads they are taken over.
    pub latency: Option<(Duration, Duration, usize)>,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One device read: how long it took and the error, if it failed as a whole.
    pub fn record(&self, took: Duration, error: Option<&DriverError>) {
        let now = Utc::now();
        let mut i = self.lock();
        match error {
            None => i.last_success = Some(now),
            Some(e) => i.last_error = Some((e.clone(), now)),
        }
        i.latencies.push_back(took);
        if i.latencies.len() > SAMPLES {
            i.latencies.pop_front();
        }
    }

    /// The device was heard from without a read (an OPC UA subscription's data change).
    pub fn heard(&self) {
        self.lock().last_success = Some(Utc::now());
    }

    /// The device was lost without a read failing (an OPC UA subscription's session).
    pub fn lost(&self, error: DriverError) {
        self.lock().last_error = Some((error, Utc::now()));
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
        HealthSnapshot { last_success: i.last_success, last_error: i.last_error.clone(), latency }
    }
}
