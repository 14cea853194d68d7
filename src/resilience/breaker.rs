//! A circuit breaker per device: closed → open → half-open → closed, in the manner of
//! linkerd2-proxy's `consecutive_failures.rs` and resilience4j.
//!
//! Opens after `failure_threshold` consecutive transient failures, or when at least
//! `failure_rate_percent` of the last `window_size` calls failed (with at least `min_calls`
//! in the window). Stays open for `open`, doubling on each consecutive reopening up to
//! `max_open`. Then exactly one probe is let through (half-open): success closes it,
//! failure reopens it. Only transient failures count; a device that answers "no" is alive.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// Settings of one breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    pub failure_threshold: u32,
    pub failure_rate_percent: u32,
    pub window_size: u32,
    pub min_calls: u32,
    pub open: Duration,
    pub max_open: Duration,
}

/// How a call went, as far as the device's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Timeout, refused or reset connection, busy: the device may be unwell.
    Transient,
    /// The device answered with a refusal: alive, so this counts as a success here.
    Rejected,
}

/// A change of state that one recorded outcome caused: exactly one call sees each, however
/// many finish at the same moment (so each is logged once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Closed → open: the device is down.
    Opened,
    /// A probe failed: open again, for a longer period.
    Reopened,
    /// A probe (or news of the device) succeeded: closed again.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// What `get_device_status` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub state: SnapshotState,
    pub consecutive_failures: u32,
    /// Time until a probe is let through, while open.
    pub retry_after: Option<Duration>,
    /// Failures among the calls in the window.
    pub window_failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotState {
    Closed,
    Open,
    HalfOpen,
}

struct Inner {
    state: State,
    consecutive: u32,
    window: VecDeque<bool>,
    /// Consecutive openings without a close in between.
    reopenings: u32,
}

/// One device's breaker. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Breaker {
    settings: BreakerSettings,
    inner: Arc<Mutex<Inner>>,
    /// Woken when a probe ends (recorded or cancelled).
    settled: Arc<tokio::sync::Notify>,
}

/// Permission for one call. Report how it went with [`Permit::record`]; a permit dropped
/// without a record (a cancelled call) frees the probe slot without judging the device.
pub struct Permit {
    breaker: Breaker,
    probe: bool,
    recorded: bool,
}

impl Permit {
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Records how the call went; the change of state it caused, if any.
    pub fn record(mut self, outcome: Outcome) -> Option<Change> {
        self.recorded = true;
        self.breaker.record(self.probe, outcome)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.recorded && self.probe {
            let mut i = self.breaker.lock();
            if let State::HalfOpen { .. } = i.state {
                i.state = State::HalfOpen { probing: false };
            }
            drop(i);
            self.breaker.settled.notify_waiters();
        }
    }
}

impl Breaker {
    pub fn new(settings: BreakerSettings) -> Breaker {
        Breaker {
            settings,
            inner: Arc::new(Mutex::new(Inner {
                state: State::Closed,
                consecutive: 0,
                window: VecDeque::new(),
                reopenings: 0,
            })),
            settled: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Waits (at most until `until`) for the probe in flight to end, if one is: a call
    /// that arrives while fieldgate probes the device gets the probe's verdict instead of
    /// an immediate refusal.
    pub async fn await_probe(&self, until: Instant) {
        let settled = self.settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        if matches!(self.lock().state, State::HalfOpen { probing: true }) {
            let _ = tokio::time::timeout_at(until, settled).await;
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Asks to make a call: a permit, or how long until a probe will be let through.
    pub fn try_acquire(&self) -> Result<Permit, Duration> {
        let now = Instant::now();
        let mut i = self.lock();
        let probe = match i.state {
            State::Closed => false,
            State::Open { until } if now < until => return Err(until - now),
            State::Open { .. } | State::HalfOpen { probing: false } => {
                i.state = State::HalfOpen { probing: true };
                true
            }
            // Someone is probing; answer at once. The probe takes at most one device
            // timeout, so a retry after a short while finds the outcome.
            State::HalfOpen { probing: true } => return Err(Duration::from_millis(100)),
        };
        Ok(Permit { breaker: self.clone(), probe, recorded: false })
    }

    /// A probe now, whatever is left of the open period (an operator asked for it): a
    /// permit, or `None` while another probe is running. A closed breaker gives an
    /// ordinary permit.
    pub fn force_probe(&self) -> Option<Permit> {
        let mut i = self.lock();
        let probe = match i.state {
            State::Closed => false,
            State::HalfOpen { probing: true } => return None,
            State::Open { .. } | State::HalfOpen { probing: false } => {
                i.state = State::HalfOpen { probing: true };
                true
            }
        };
        Some(Permit { breaker: self.clone(), probe, recorded: false })
    }

    /// News of the device from outside a call (an OPC UA subscription's session came up,
    /// or was lost, or could not be opened). A failure counts as a call's would while the
    /// breaker is closed, and changes nothing while it is open; anything but a failure
    /// closes an open breaker, as a successful probe would: the device demonstrably talks.
    pub fn observe(&self, outcome: Outcome) -> Option<Change> {
        let closes = {
            let mut i = self.lock();
            match i.state {
                State::Closed => false,
                _ if outcome == Outcome::Transient => return None,
                _ => {
                    i.state = State::HalfOpen { probing: true };
                    true
                }
            }
        };
        self.record(closes, outcome)
    }

    /// The open period that follows the current one if the next probe fails.
    pub fn base_open(&self) -> Duration {
        self.settings.open
    }

    fn open_period(&self, reopenings: u32) -> Duration {
        self.settings.open.saturating_mul(1u32 << reopenings.min(16)).min(self.settings.max_open)
    }

    fn record(&self, probe: bool, outcome: Outcome) -> Option<Change> {
        let now = Instant::now();
        let mut i = self.lock();
        let failed = outcome == Outcome::Transient;
        i.window.push_back(failed);
        while i.window.len() > self.settings.window_size as usize {
            i.window.pop_front();
        }
        i.consecutive = if failed { i.consecutive + 1 } else { 0 };
        let settles = probe;
        let change = match i.state {
            State::HalfOpen { .. } if probe => {
                if failed {
                    i.reopenings += 1;
                    let period = self.open_period(i.reopenings);
                    i.state = State::Open { until: now + period };
                    Some(Change::Reopened)
                } else {
                    i.state = State::Closed;
                    i.reopenings = 0;
                    i.window.clear();
                    Some(Change::Closed)
                }
            }
            State::Closed if failed => {
                let failures = i.window.iter().filter(|f| **f).count() as u32;
                let calls = i.window.len() as u32;
                let by_rate = calls >= self.settings.min_calls
                    && failures * 100 >= self.settings.failure_rate_percent * calls;
                (i.consecutive >= self.settings.failure_threshold || by_rate).then(|| {
                    let period = self.open_period(i.reopenings);
                    i.state = State::Open { until: now + period };
                    Change::Opened
                })
            }
            // Results of calls admitted before the breaker opened change nothing more.
            _ => None,
        };
        drop(i);
        if settles {
            self.settled.notify_waiters();
        }
        change
    }

    pub fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let i = self.lock();
        let (state, retry_after) = match i.state {
            State::Closed => (SnapshotState::Closed, None),
            State::Open { until } => (SnapshotState::Open, Some(until.saturating_duration_since(now))),
            State::HalfOpen { .. } => (SnapshotState::HalfOpen, Some(Duration::ZERO)),
        };
        Snapshot {
            state,
            consecutive_failures: i.consecutive,
            retry_after,
            window_failures: i.window.iter().filter(|f| **f).count() as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            failure_threshold: 5,
            failure_rate_percent: 50,
            window_size: 20,
            min_calls: 10,
            open: Duration::from_secs(5),
            max_open: Duration::from_secs(60),
        }
    }

    fn fail(b: &Breaker, n: u32) {
        for _ in 0..n {
            b.try_acquire().unwrap().record(Outcome::Transient);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_and_answers_with_the_wait() {
        let b = Breaker::new(settings());
        fail(&b, 4);
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
        assert_eq!(b.snapshot().consecutive_failures, 4);
        fail(&b, 1);
        assert_eq!(b.snapshot().state, SnapshotState::Open);
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(5)));
        advance(Duration::from_secs(2)).await;
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_consecutive_count() {
        let b = Breaker::new(settings());
        fail(&b, 4);
        b.try_acquire().unwrap().record(Outcome::Success);
        fail(&b, 4);
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn opens_on_the_failure_rate_of_the_window() {
        let b = Breaker::new(settings());
        // Alternating: never 5 in a row, but half of the calls fail.
        for i in 0..9 {
            let outcome = if i % 2 == 0 { Outcome::Transient } else { Outcome::Success };
            b.try_acquire().unwrap().record(outcome);
        }
        // 9 calls, 5 failures: below min_calls, still closed.
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
        b.try_acquire().unwrap().record(Outcome::Success);
        // 10 calls, 5 failures: 50% but the last call succeeded; the rate is checked on a failure.
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
        b.try_acquire().unwrap().record(Outcome::Transient);
        assert_eq!(b.snapshot().state, SnapshotState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn rejections_do_not_count() {
        let b = Breaker::new(settings());
        for _ in 0..50 {
            b.try_acquire().unwrap().record(Outcome::Rejected);
        }
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
        assert_eq!(b.snapshot().consecutive_failures, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_lets_exactly_one_probe_through() {
        let b = Breaker::new(settings());
        fail(&b, 5);
        advance(Duration::from_secs(5)).await;
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe());
        assert_eq!(b.snapshot().state, SnapshotState::HalfOpen);
        // Concurrent callers are refused at once while the probe runs.
        for _ in 0..10 {
            assert!(b.try_acquire().is_err());
        }
        probe.record(Outcome::Success);
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
        assert!(!b.try_acquire().unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_for_twice_as_long_up_to_the_maximum() {
        let b = Breaker::new(settings());
        fail(&b, 5);
        let mut expected = 5u64;
        for _ in 0..6 {
            assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(expected)));
            advance(Duration::from_secs(expected)).await;
            b.try_acquire().unwrap().record(Outcome::Transient);
            expected = (expected * 2).min(60);
        }
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(60)));
        // A successful probe closes it and resets the period.
        advance(Duration::from_secs(60)).await;
        b.try_acquire().unwrap().record(Outcome::Success);
        fail(&b, 5);
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_probe_frees_the_slot() {
        let b = Breaker::new(settings());
        fail(&b, 5);
        advance(Duration::from_secs(5)).await;
        drop(b.try_acquire().unwrap());
        assert!(b.try_acquire().unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn a_forced_probe_runs_before_the_open_period_ends_and_only_once() {
        let b = Breaker::new(settings());
        fail(&b, 5);
        let probe = b.force_probe().expect("an open breaker can be probed at once");
        assert!(probe.is_probe());
        assert!(b.force_probe().is_none(), "a second probe while one runs");
        assert!(b.try_acquire().is_err());
        probe.record(Outcome::Transient);
        // The failed probe reopened it for the next period.
        assert_eq!(b.try_acquire().err(), Some(Duration::from_secs(10)));
        b.force_probe().unwrap().record(Outcome::Success);
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
        assert!(!b.force_probe().unwrap().is_probe(), "a closed breaker gives an ordinary permit");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_probe_closes_it() {
        let b = Breaker::new(settings());
        fail(&b, 5);
        advance(Duration::from_secs(5)).await;
        b.try_acquire().unwrap().record(Outcome::Rejected);
        assert_eq!(b.snapshot().state, SnapshotState::Closed);
    }
}

#[cfg(test)]
#[path = "breaker_model.rs"]
mod model;
