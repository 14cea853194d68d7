//! The cross-call retry limit (docs/tool-contract.md §5): after `limit` calls in a row of
//! the very same call failed at the device within `window`, the next identical call is
//! refused with `RETRY_LIMIT_REACHED` until the window ends or the device answered since
//! (a call, a poll or fieldgate's own probe).
//!
//! It counts what the caller did, not what happened around it: a call counts once when
//! its own attempts at the device all failed ([`Verdict::DeviceFailure`]); a failure that
//! another call's stalled request caused, or a `RATE_LIMITED` answer, changes nothing; a
//! `CIRCUIT_OPEN` answer counts only when the caller came back before the
//! `retry_after_ms` it was given, so a caller that waits as told is never blocked by
//! fieldgate's own fail-fast.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// Calls remembered at most; the oldest streaks are forgotten first.
const MAX_ENTRIES: usize = 10_000;

struct Streak {
    failures: u32,
    first: Instant,
    last_failure: DateTime<Utc>,
    device: Option<String>,
    /// The caller was told not to come back before this (a `CIRCUIT_OPEN` answer).
    not_before: Option<Instant>,
}

pub struct RepeatGuard {
    limit: u32,
    window: Duration,
    streaks: Mutex<HashMap<String, Streak>>,
}

/// A blocked call: which device, and how long the block lasts at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub failures: u32,
    pub device: Option<String>,
    pub until_window_ends: Duration,
}

/// What one call's outcome means for its streak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It succeeded, or failed in a way no repetition changes: the streak ends.
    Ended,
    /// Every attempt it made at the device failed with a transient error: one count.
    DeviceFailure,
    /// Nothing the caller did: rate limited, or failed behind another call's request.
    Neutral,
    /// Answered `CIRCUIT_OPEN` with this wait: counts only for a caller that came back
    /// before the wait it was given the last time.
    CircuitOpen { retry_after: Duration },
}

impl RepeatGuard {
    pub fn new(limit: u32, window: Duration) -> RepeatGuard {
        RepeatGuard { limit, window, streaks: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Streak>> {
        self.streaks.lock()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Whether this call is refused. `last_success` tells when a device last answered.
    pub fn check(&self, key: &str, last_success: impl Fn(&str) -> Option<DateTime<Utc>>) -> Option<Blocked> {
        let mut map = self.lock();
        let s = map.get(key)?;
        let elapsed = s.first.elapsed();
        let recovered = s.device.as_deref().and_then(&last_success).is_some_and(|t| t > s.last_failure);
        if elapsed >= self.window || recovered {
            map.remove(key);
            return None;
        }
        (s.failures >= self.limit).then(|| Blocked {
            failures: s.failures,
            device: s.device.clone(),
            until_window_ends: self.window - elapsed,
        })
    }

    /// Records what the outcome of a call that was made means.
    pub fn record(&self, key: String, verdict: Verdict, device: Option<&str>) {
        let mut map = self.lock();
        let now = Instant::now();
        let counts = match verdict {
            Verdict::Ended => {
                map.remove(&key);
                return;
            }
            Verdict::Neutral => return,
            Verdict::DeviceFailure => true,
            Verdict::CircuitOpen { .. } => map.get(&key).and_then(|s| s.not_before).is_some_and(|t| now < t),
        };
        if map.len() >= MAX_ENTRIES
            && !map.contains_key(&key)
            && let Some(oldest) = map.iter().min_by_key(|(_, s)| s.first).map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        let s = map.entry(key).or_insert(Streak {
            failures: 0,
            first: now,
            last_failure: Utc::now(),
            device: None,
            not_before: None,
        });
        if now.duration_since(s.first) >= self.window {
            s.failures = 0;
            s.first = now;
        }
        if counts {
            s.failures += 1;
            s.last_failure = Utc::now();
        }
        if let Verdict::CircuitOpen { retry_after } = verdict {
            s.not_before = Some(now + retry_after);
        }
        if device.is_some() {
            s.device = device.map(str::to_string);
        }
    }

    /// Devices with a blocked call (at the limit, inside the window): fieldgate probes
    /// them itself, since their callers no longer reach them.
    /// Blocks the device lifted already (it answered since, per `last_success`) are left
    /// out.
    pub fn blocked_devices(&self, last_success: impl Fn(&str) -> Option<DateTime<Utc>>) -> Vec<String> {
        let map = self.lock();
        let mut out: Vec<String> = map
            .values()
            .filter(|s| s.failures >= self.limit && s.first.elapsed() < self.window)
            .filter_map(|s| {
                let d = s.device.as_deref()?;
                let recovered = last_success(d).is_some_and(|t| t > s.last_failure);
                (!recovered).then(|| d.to_string())
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn three_retryable_failures_block_until_the_window_ends() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        let none = |_: &str| None;
        for _ in 0..2 {
            assert!(g.check("k", none).is_none());
            g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        }
        assert!(g.check("k", none).is_none(), "two failures are not yet the limit");
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        let b = g.check("k", none).unwrap();
        assert_eq!((b.failures, b.device.as_deref()), (3, Some("d")));
        assert!(g.check("other", none).is_none(), "other calls are not affected");
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(g.check("k", none).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(g.check("k", none).is_none(), "the window ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_in_between_resets_the_streak() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        g.record("k".into(), Verdict::Ended, Some("d"));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        assert!(g.check("k", |_| None).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_device_answering_again_lifts_the_block() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        for _ in 0..3 {
            g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        }
        assert!(g.check("k", |_| None).is_some());
        let later = Utc::now() + chrono::Duration::seconds(1);
        assert!(g.check("k", |d| (d == "d").then_some(later)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_and_failures_behind_other_calls_change_nothing() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        for _ in 0..10 {
            g.record("k".into(), Verdict::Neutral, Some("d"));
        }
        assert!(g.check("k", |_| None).is_none(), "neutral answers neither count nor end the streak");
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        assert_eq!(g.check("k", |_| None).map(|b| b.failures), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn circuit_open_counts_only_for_a_caller_that_came_back_too_soon() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        let wait = Duration::from_secs(5);
        // A patient caller: each time it comes back after the wait it was given.
        for _ in 0..10 {
            g.record("k".into(), Verdict::CircuitOpen { retry_after: wait }, Some("d"));
            assert!(g.check("k", |_| None).is_none());
            tokio::time::advance(wait).await;
        }
        assert!(g.blocked_devices(|_| None).is_empty());
        // An impatient one: it comes back at once, three times.
        g.record("j".into(), Verdict::CircuitOpen { retry_after: wait }, Some("d"));
        for _ in 0..3 {
            tokio::time::advance(Duration::from_millis(100)).await;
            g.record("j".into(), Verdict::CircuitOpen { retry_after: wait }, Some("d"));
        }
        assert_eq!(g.check("j", |_| None).map(|b| b.failures), Some(3));
        assert_eq!(g.blocked_devices(|_| None), vec!["d".to_string()]);
        assert!(g.check("k", |_| None).is_none(), "the patient caller is still not blocked");
    }

    #[tokio::test(start_paused = true)]
    async fn blocked_devices_forget_a_block_whose_window_ended() {
        let g = RepeatGuard::new(2, Duration::from_secs(60));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        assert!(g.blocked_devices(|_| None).is_empty(), "one failure blocks nothing");
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        assert_eq!(g.blocked_devices(|_| None), vec!["d".to_string()]);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(g.blocked_devices(|_| None).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn empty_until_a_streak_and_again_once_it_ends() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        assert!(g.is_empty());
        g.record("k".into(), Verdict::Neutral, Some("d"));
        assert!(g.is_empty(), "a neutral answer starts no streak");
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        assert!(!g.is_empty());
        g.record("k".into(), Verdict::Ended, Some("d"));
        assert!(g.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_block_says_how_long_is_left_of_its_window() {
        let g = RepeatGuard::new(2, Duration::from_secs(300));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        tokio::time::advance(Duration::from_secs(40)).await;
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        tokio::time::advance(Duration::from_secs(60)).await;
        // The window runs from the streak's first failure.
        let b = g.check("k", |_| None).unwrap();
        assert_eq!(b.until_window_ends, Duration::from_secs(200));
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_answer_after_the_last_failure_lifts_the_block() {
        let g = RepeatGuard::new(2, Duration::from_secs(300));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        g.record("k".into(), Verdict::DeviceFailure, Some("d"));
        let last_failure = g.lock()["k"].last_failure;
        assert!(g.check("k", |_| Some(last_failure)).is_some(), "an answer at the failure's own instant");
        assert_eq!(g.blocked_devices(|_| Some(last_failure)), vec!["d".to_string()]);
        let after = last_failure + chrono::Duration::milliseconds(1);
        assert!(g.blocked_devices(|_| Some(after)).is_empty());
        assert!(g.check("k", |_| Some(after)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn distinct_calls_keep_their_own_streaks_up_to_the_bound_then_the_oldest_goes() {
        let g = RepeatGuard::new(1, Duration::from_secs(300));
        g.record("first".into(), Verdict::DeviceFailure, Some("d"));
        tokio::time::advance(Duration::from_millis(1)).await;
        for i in 1..MAX_ENTRIES {
            g.record(format!("k{i}"), Verdict::DeviceFailure, Some("d"));
        }
        assert_eq!(g.lock().len(), MAX_ENTRIES);
        assert!(g.check("first", |_| None).is_some(), "every streak kept up to the bound");
        // A call already remembered counts again without pushing anything out.
        g.record("k1".into(), Verdict::DeviceFailure, Some("d"));
        assert_eq!(g.lock().len(), MAX_ENTRIES);
        assert!(g.check("first", |_| None).is_some());
        // A new one pushes out the oldest streak.
        g.record("new".into(), Verdict::DeviceFailure, Some("d"));
        assert_eq!(g.lock().len(), MAX_ENTRIES);
        assert!(g.check("first", |_| None).is_none(), "the oldest streak was forgotten");
        assert!(g.check("new", |_| None).is_some());
    }
}
