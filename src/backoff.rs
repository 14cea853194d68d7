//! One backoff with jitter for every retry loop: Modbus reconnects, OPC UA subscriptions,
//! retries inside a call's deadline.
//!
//! Waits double from a first to a last value and each is drawn from [half, all] of it
//! ("equal jitter"), so that clients which failed together do not retry together, while a
//! wait never collapses to nothing.

use std::time::Duration;

/// A number in [0, 1) that differs between calls.
pub fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one(std::time::SystemTime::now());
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// `d` with equal jitter: a duration in [d/2, d].
pub fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.5 + 0.5 * jitter())
}

/// Exponential backoff with equal jitter, from `first` doubling up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max: max.max(first), next: first }
    }

    /// The next wait (jittered), doubling the one after it.
    pub fn next_wait(&mut self) -> Duration {
        let wait = jittered(self.next);
        self.next = self.next.saturating_mul(2).min(self.max);
        wait
    }

    /// After a success: the next wait starts from `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_maximum_and_stay_within_half_to_all() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(1000));
        let bounds = [100, 200, 400, 800, 1000, 1000];
        for full in bounds {
            let w = b.next_wait();
            assert!(w >= ms(full / 2) && w <= ms(full), "{w:?} outside [{}, {full}] ms", full / 2);
        }
        b.reset();
        assert!(b.next_wait() <= ms(100));
    }

    #[test]
    fn jitter_stays_in_the_unit_interval() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }
}
