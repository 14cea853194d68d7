//! The cross-call retry limit (TOOL-CONTRACT.md §5): after `limit` retryable failures in a
//! row of the very same call within `window`, the next identical call is refused with
//! `RETRY_LIMIT_REACHED` until the window ends or the device read successfully since.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::time::Instant;

/// Calls remembered at most; the oldest streaks are forgotten first.
const MAX_ENTRIES: usize = 10_000;

struct Streak {
    failures: u32,
    first: Instant,
    last_failure: DateTime<Utc>,
    device: Option<String>,
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

/// `tool` and its arguments with object keys sorted, so that key order does not matter.
/// Written into one string without intermediate allocations: it is built for every read
/// call while any call is failing.
pub fn call_key(tool: &str, args: &Value) -> String {
    use std::fmt::Write as _;
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    // Debug quoting is injective, which is all a key needs.
                    let _ = write!(out, "{k:?}:");
                    write(&m[k], out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for x in a {
                    write(x, out);
                    out.push(',');
                }
                out.push(']');
            }
            Value::String(s) => {
                let _ = write!(out, "{s:?}");
            }
            other => {
                let _ = write!(out, "{other}");
            }
        }
    }
    let mut out = String::with_capacity(64);
    out.push_str(tool);
    out.push(':');
    write(args, &mut out);
    out
}

impl RepeatGuard {
    pub fn new(limit: u32, window: Duration) -> RepeatGuard {
        RepeatGuard { limit, window, streaks: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Streak>> {
        self.streaks.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Records the outcome of a call that was made.
    pub fn record(&self, key: String, retryable_failure: bool, device: Option<&str>) {
        let mut map = self.lock();
        if !retryable_failure {
            map.remove(&key);
            return;
        }
        if map.len() >= MAX_ENTRIES
            && !map.contains_key(&key)
            && let Some(oldest) = map.iter().min_by_key(|(_, s)| s.first).map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        let now = Instant::now();
        let s = map.entry(key).or_insert(Streak {
            failures: 0,
            first: now,
            last_failure: Utc::now(),
            device: None,
        });
        if now.duration_since(s.first) >= self.window {
            s.failures = 0;
            s.first = now;
        }
        s.failures += 1;
        s.last_failure = Utc::now();
        if device.is_some() {
            s.device = device.map(str::to_string);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_ignore_object_key_order() {
        assert_eq!(
            call_key("t", &json!({"a": 1, "b": [2, {"y": 1, "x": 2}]})),
            call_key("t", &json!({"b": [2, {"x": 2, "y": 1}], "a": 1}))
        );
        assert_ne!(call_key("t", &json!({"a": 1})), call_key("u", &json!({"a": 1})));
        assert_ne!(call_key("t", &json!({"a": 1})), call_key("t", &json!({"a": "1"})));
    }

    #[tokio::test(start_paused = true)]
    async fn three_retryable_failures_block_until_the_window_ends() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        let none = |_: &str| None;
        for _ in 0..2 {
            assert!(g.check("k", none).is_none());
            g.record("k".into(), true, Some("d"));
        }
        assert!(g.check("k", none).is_none(), "two failures are not yet the limit");
        g.record("k".into(), true, Some("d"));
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
        g.record("k".into(), true, Some("d"));
        g.record("k".into(), true, Some("d"));
        g.record("k".into(), false, Some("d"));
        g.record("k".into(), true, Some("d"));
        assert!(g.check("k", |_| None).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_device_answering_again_lifts_the_block() {
        let g = RepeatGuard::new(3, Duration::from_secs(300));
        for _ in 0..3 {
            g.record("k".into(), true, Some("d"));
        }
        assert!(g.check("k", |_| None).is_some());
        let later = Utc::now() + chrono::Duration::seconds(1);
        assert!(g.check("k", |d| (d == "d").then_some(later)).is_none());
    }
}
