//! Model-based test of the breaker: random sequences of calls (succeeding, failing,
//! refused by the device), calls held open across other events, cancelled calls, operator
//! probes and the passing of time, run against the real [`Breaker`] in paused time and
//! against a small reference model written from the module's documentation. After every
//! event both must agree on the answer given and on what `get_device_status` shows.

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// The reference model, in milliseconds since the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum M {
    Closed,
    Open { until: u64 },
    HalfOpen { probing: bool },
}

struct Model {
    s: BreakerSettings,
    now: u64,
    state: M,
    /// Consecutive transient failures.
    consecutive: u32,
    /// The last `window_size` calls: whether each failed.
    window: VecDeque<bool>,
    /// Openings since the breaker was last closed.
    openings: u32,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Model {
    fn new(s: BreakerSettings) -> Model {
        Model { s, now: 0, state: M::Closed, consecutive: 0, window: VecDeque::new(), openings: 0 }
    }

    /// The open period after `openings` openings without a close: `open`, doubled for each
    /// opening after the first, never more than `max_open`.
    fn period(&self) -> u64 {
        let mut p = ms(self.s.open);
        for _ in 1..self.openings {
            p = (p * 2).min(ms(self.s.max_open));
        }
        p.min(ms(self.s.max_open))
    }

    fn open(&mut self) {
        self.openings += 1;
        self.state = M::Open { until: self.now + self.period() };
    }

    /// `Ok(is_probe)` or `Err(wait in ms)`.
    fn acquire(&mut self, forced: bool) -> Result<bool, u64> {
        match self.state {
            M::Closed => Ok(false),
            M::Open { until } if self.now < until && !forced => Err(until - self.now),
            M::HalfOpen { probing: true } => Err(100),
            M::Open { .. } | M::HalfOpen { probing: false } => {
                self.state = M::HalfOpen { probing: true };
                Ok(true)
            }
        }
    }

    fn record(&mut self, probe: bool, outcome: Outcome) {
        let failed = outcome == Outcome::Transient;
        self.window.push_back(failed);
        if self.window.len() > self.s.window_size as usize {
            self.window.pop_front();
        }
        self.consecutive = if failed { self.consecutive + 1 } else { 0 };
        match self.state {
            // Only the probe decides a half-open breaker.
            M::HalfOpen { .. } if probe => {
                if failed {
                    self.open();
                } else {
                    self.state = M::Closed;
                    self.openings = 0;
                    self.window.clear();
                }
            }
            M::Closed if failed => {
                let calls = self.window.len() as u32;
                let failures = self.window.iter().filter(|f| **f).count() as u32;
                let rate = calls >= self.s.min_calls && failures * 100 >= self.s.failure_rate_percent * calls;
                if self.consecutive >= self.s.failure_threshold || rate {
                    self.open();
                }
            }
            _ => {}
        }
    }

    fn cancel(&mut self, probe: bool) {
        if probe && matches!(self.state, M::HalfOpen { .. }) {
            self.state = M::HalfOpen { probing: false };
        }
    }

    /// (state, consecutive failures, wait while open, failures in the window)
    fn snapshot(&self) -> (SnapshotState, u32, Option<u64>, u32) {
        let (state, wait) = match self.state {
            M::Closed => (SnapshotState::Closed, None),
            M::Open { until } => (SnapshotState::Open, Some(until.saturating_sub(self.now))),
            M::HalfOpen { .. } => (SnapshotState::HalfOpen, Some(0)),
        };
        (state, self.consecutive, wait, self.window.iter().filter(|f| **f).count() as u32)
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// A call made and finished at once.
    Call(Outcome),
    /// A call admitted and kept in flight.
    Hold,
    /// The held call `i % held` ends with this outcome.
    Finish(usize, Outcome),
    /// The held call `i % held` is cancelled (dropped without a verdict).
    Cancel(usize),
    /// An operator's probe (`force_probe`), finished at once.
    Force(Outcome),
    Advance(u64),
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![3 => Just(Outcome::Transient), 2 => Just(Outcome::Success), 1 => Just(Outcome::Rejected)]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        8 => outcome().prop_map(Event::Call),
        2 => Just(Event::Hold),
        2 => (any::<usize>(), outcome()).prop_map(|(i, o)| Event::Finish(i, o)),
        1 => any::<usize>().prop_map(Event::Cancel),
        1 => outcome().prop_map(Event::Force),
        3 => prop_oneof![0u64..50, 50u64..3_000, 3_000u64..200_000].prop_map(Event::Advance),
    ]
}

fn settings() -> impl Strategy<Value = BreakerSettings> {
    (1u32..8, 1u32..=100, 1u32..12, 10u64..2_000, 1u64..40).prop_flat_map(
        |(threshold, rate, window, open, times)| {
            (1u32..=window).prop_map(move |min_calls| BreakerSettings {
                failure_threshold: threshold,
                failure_rate_percent: rate,
                window_size: window,
                min_calls,
                open: Duration::from_millis(open),
                max_open: Duration::from_millis(open * times),
            })
        },
    )
}

fn agree(b: &Breaker, m: &Model, step: usize, e: Event) -> Result<(), TestCaseError> {
    let s = b.snapshot();
    let got = (s.state, s.consecutive_failures, s.retry_after.map(ms), s.window_failures);
    prop_assert_eq!(got, m.snapshot(), "after step {} ({:?})", step, e);
    Ok(())
}

/// The breaker's answer to an acquire, in the model's terms.
fn answer(r: &Result<Permit, Duration>) -> Result<bool, u64> {
    match r {
        Ok(p) => Ok(p.is_probe()),
        Err(wait) => Err(ms(*wait)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn the_breaker_agrees_with_a_reference_model(
        s in settings(),
        events in prop::collection::vec(event(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async {
            let b = Breaker::new(s);
            let mut m = Model::new(s);
            let mut held: Vec<(Permit, bool)> = Vec::new();
            for (step, e) in events.iter().copied().enumerate() {
                match e {
                    Event::Call(o) => {
                        let r = b.try_acquire();
                        prop_assert_eq!(answer(&r), m.acquire(false), "step {} ({:?})", step, e);
                        if let Ok(p) = r {
                            m.record(p.is_probe(), o);
                            p.record(o);
                        }
                    }
                    Event::Hold => {
                        let r = b.try_acquire();
                        prop_assert_eq!(answer(&r), m.acquire(false), "step {} ({:?})", step, e);
                        if let Ok(p) = r {
                            let probe = p.is_probe();
                            held.push((p, probe));
                        }
                    }
                    Event::Finish(i, o) if !held.is_empty() => {
                        let (p, probe) = held.remove(i % held.len());
                        m.record(probe, o);
                        p.record(o);
                    }
                    Event::Cancel(i) if !held.is_empty() => {
                        let (p, probe) = held.remove(i % held.len());
                        m.cancel(probe);
                        drop(p);
                    }
                    Event::Force(o) => {
                        let got = b.force_probe();
                        let want = m.acquire(true);
                        prop_assert_eq!(got.as_ref().map(Permit::is_probe), want.ok(), "step {} ({:?})", step, e);
                        if let Some(p) = got {
                            m.record(p.is_probe(), o);
                            p.record(o);
                        }
                    }
                    Event::Advance(d) => {
                        tokio::time::advance(Duration::from_millis(d)).await;
                        m.now += d;
                    }
                    Event::Finish(..) | Event::Cancel(_) => {}
                }
                agree(&b, &m, step, e)?;
            }
            Ok(())
        })?;
    }
}

/// Directed cases: waiting for a probe's verdict, the base period, and calls that outlive
/// the state they were admitted in (found missing by `cargo mutants`, see docs/mutants.md).
mod waiting {
    use std::time::Duration;

    use tokio::time::{Instant, advance};

    use super::super::*;

    /// The first failure opens it for `open`.
    fn one_failure_opens(open: Duration) -> BreakerSettings {
        BreakerSettings {
            failure_threshold: 1,
            failure_rate_percent: 100,
            window_size: 10,
            min_calls: 10,
            open,
            max_open: Duration::from_secs(60),
        }
    }

    fn open_breaker() -> Breaker {
        let b = Breaker::new(one_failure_opens(Duration::from_secs(5)));
        b.try_acquire().unwrap().record(Outcome::Transient);
        b
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_probe_in_flight_await_probe_returns_at_once() {
        let b = open_breaker();
        let start = Instant::now();
        b.await_probe(start + Duration::from_secs(30)).await;
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn await_probe_returns_with_the_probes_verdict_or_at_its_limit() {
        for end in ["recorded", "cancelled", "never"] {
            let b = open_breaker();
            advance(Duration::from_secs(5)).await;
            let probe = b.try_acquire().unwrap();
            assert!(probe.is_probe());
            let start = Instant::now();
            let waiter = {
                let b = b.clone();
                tokio::spawn(async move { b.await_probe(start + Duration::from_secs(30)).await })
            };
            advance(Duration::from_millis(700)).await;
            assert!(!waiter.is_finished(), "{end}: returned while the probe runs");
            match end {
                "recorded" => {
                    probe.record(Outcome::Success);
                }
                "cancelled" => drop(probe),
                _ => std::mem::forget(probe),
            }
            waiter.await.unwrap();
            let waited = Instant::now() - start;
            if end == "never" {
                assert_eq!(waited, Duration::from_secs(30), "{end}");
            } else {
                assert_eq!(waited, Duration::from_millis(700), "{end}");
            }
        }
    }

    #[test]
    fn the_base_period_is_the_configured_open_time() {
        let b = Breaker::new(one_failure_opens(Duration::from_millis(1234)));
        assert_eq!(b.base_open(), Duration::from_millis(1234));
    }

    /// A call admitted before the breaker opened and cancelled while a probe runs does not
    /// free the probe's slot: only the probe's own end does.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_ordinary_call_does_not_free_the_probe_slot() {
        let b = Breaker::new(one_failure_opens(Duration::from_secs(5)));
        let ordinary = b.try_acquire().unwrap();
        assert!(!ordinary.is_probe());
        b.try_acquire().unwrap().record(Outcome::Transient);
        advance(Duration::from_secs(5)).await;
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_probe());
        drop(ordinary);
        assert_eq!(b.try_acquire().err(), Some(Duration::from_millis(100)), "still probing");
        drop(probe);
        assert!(b.try_acquire().unwrap().is_probe());
    }

    /// A call admitted before the breaker opened and answered while a probe runs changes
    /// nothing: only the probe decides a half-open breaker.
    #[tokio::test(start_paused = true)]
    async fn an_ordinary_call_answered_during_a_probe_does_not_decide_the_breaker() {
        for outcome in [Outcome::Success, Outcome::Transient] {
            let b = Breaker::new(one_failure_opens(Duration::from_secs(5)));
            let ordinary = b.try_acquire().unwrap();
            b.try_acquire().unwrap().record(Outcome::Transient);
            advance(Duration::from_secs(5)).await;
            let probe = b.try_acquire().unwrap();
            assert!(probe.is_probe());
            ordinary.record(outcome);
            assert_eq!(b.snapshot().state, SnapshotState::HalfOpen, "{outcome:?}");
            assert_eq!(b.try_acquire().err(), Some(Duration::from_millis(100)), "{outcome:?}: still probing");
            probe.record(Outcome::Success);
            assert_eq!(b.snapshot().state, SnapshotState::Closed);
        }
    }
}
