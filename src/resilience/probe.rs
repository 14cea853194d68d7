//! When fieldgate probes a device by itself: while its breaker is open (when the open
//! period ends, so the probe is the breaker's half-open trial), and while a caller is
//! blocked by the retry limit on it (once per base open period). Callers that are refused
//! or blocked never reach the device, so without these probes nothing would see it
//! recover. The first answer closes the breaker and lifts every block on the device.

use std::time::Duration;

use tokio::time::Instant;

use super::Guard;
use super::breaker::SnapshotState;

/// How often a watcher looks again when nothing is due: a block or an opening is noticed
/// within this long.
pub const IDLE: Duration = Duration::from_secs(1);

/// When the device's next probe is due, if one is: `blocked` says whether a caller is
/// blocked on it, `last_probe` when fieldgate last probed it.
pub fn due(guard: &Guard, blocked: bool, last_probe: Option<Instant>, now: Instant) -> Option<Instant> {
    let b = guard.breaker.snapshot();
    match b.state {
        SnapshotState::Open => Some(now + b.retry_after.unwrap_or_default()),
        // A trial is let through now (or one is running, and the probe waits its turn).
        SnapshotState::HalfOpen => Some(now),
        SnapshotState::Closed if blocked => {
            Some(last_probe.map_or(now, |t| t + guard.breaker.base_open()).max(now))
        }
        SnapshotState::Closed => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resilience::breaker::{Breaker, BreakerSettings, Outcome};
    use crate::resilience::health::Health;

    fn guard() -> Guard {
        let settings = BreakerSettings {
            failure_threshold: 2,
            failure_rate_percent: 50,
            window_size: 20,
            min_calls: 10,
            open: Duration::from_secs(5),
            max_open: Duration::from_secs(60),
        };
        Guard {
            id: "d1".parse().unwrap(),
            breaker: Breaker::new(settings),
            health: Health::default(),
            refusal_logged: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_device_with_no_blocked_caller_is_never_probed() {
        let g = guard();
        assert_eq!(due(&g, false, None, Instant::now()), None);
        g.breaker.try_acquire().unwrap().record(Outcome::Transient);
        assert_eq!(due(&g, false, None, Instant::now()), None, "one failure opens nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_breaker_is_probed_when_its_period_ends() {
        let g = guard();
        for _ in 0..2 {
            g.breaker.try_acquire().unwrap().record(Outcome::Transient);
        }
        let now = Instant::now();
        assert_eq!(due(&g, false, None, now), Some(now + Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        assert_eq!(due(&g, false, None, now), Some(now), "due now, blocked or not");
        // The probe fails: the next one is due after the doubled period.
        g.breaker.try_acquire().unwrap().record(Outcome::Transient);
        let now = Instant::now();
        assert_eq!(due(&g, true, Some(now), now), Some(now + Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_blocked_caller_on_a_closed_breaker_gets_a_probe_each_open_period() {
        let g = guard();
        let now = Instant::now();
        assert_eq!(due(&g, true, None, now), Some(now), "never probed: at once");
        assert_eq!(due(&g, true, Some(now), now), Some(now + Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(7)).await;
        let later = Instant::now();
        assert_eq!(due(&g, true, Some(now), later), Some(later), "overdue is now, not in the past");
    }
}
