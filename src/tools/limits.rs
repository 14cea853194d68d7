//! Per-caller rate limiting: a token bucket per caller.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Allows `per_minute` calls per caller, with bursts up to the same number.
pub struct RateLimiter {
    per_minute: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(per_minute: u64) -> RateLimiter {
        RateLimiter { per_minute: per_minute.max(1) as f64, buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one call for `caller`; `Err(wait)` when the caller must wait that long.
    pub fn take(&self, caller: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let rate = self.per_minute / 60.0; // calls per second
        let mut map = self.buckets.lock();
        let b = match map.get_mut(caller) {
            Some(b) => b,
            None => map.entry(caller.to_string()).or_insert(Bucket { tokens: self.per_minute, at: now }),
        };
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(self.per_minute);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_caller_gets_its_rate_and_waits_for_more() {
        let r = RateLimiter::new(60); // one per second, bursts of 60
        for _ in 0..60 {
            assert!(r.take("a").is_ok());
        }
        let wait = r.take("a").unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1), "{wait:?}");
        // Another caller is not affected.
        assert!(r.take("b").is_ok());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(r.take("a").is_ok());
        assert!(r.take("a").is_err());
    }
}
