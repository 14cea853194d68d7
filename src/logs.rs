//! `--log-format json`: one JSON object per event, `{"timestamp", "level", "target",
//! "fields": {...}}`, in which a field that holds JSON text (a tool call's `arguments`) is
//! written as the JSON it is, not as an escaped string, so log pipelines can query it.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Fields written as JSON values when their text parses as JSON.
const JSON_FIELDS: [&str; 1] = ["arguments"];

/// The JSON event format.
pub struct JsonEvents;

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        let v = if JSON_FIELDS.contains(&field.name()) {
            serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
        } else {
            Value::String(value.to_string())
        };
        self.0.insert(field.name().to_string(), v);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), Value::Bool(value));
    }
}

impl<S, N> FormatEvent<S, N> for JsonEvents
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let meta = event.metadata();
        let line = serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": meta.level().to_string(),
            "target": meta.target(),
            "fields": Value::Object(fields.0),
        });
        writeln!(w, "{line}")
    }
}

/// Log lines anyone outside can cause at will (a refused command, a STATE that does not
/// parse, a sign-in): at most one line per key a minute, saying how many were left out, so
/// a flood cannot fill the box's log.
pub struct Throttle<K = &'static str> {
    last: std::collections::HashMap<K, (tokio::time::Instant, u64)>,
}

impl<K> Default for Throttle<K> {
    fn default() -> Self {
        Throttle { last: std::collections::HashMap::new() }
    }
}

impl<K: std::hash::Hash + Eq> Throttle<K> {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);
    /// Keys remembered at most (the oldest line's key is forgotten first).
    const KEYS: usize = 1024;

    /// Whether to log this line of `key` now: `Some(n)`, with `n` the ones left out since
    /// the last line; `None` to leave it out.
    pub fn allow(&mut self, key: K) -> Option<u64> {
        let now = tokio::time::Instant::now();
        match self.last.get_mut(&key) {
            Some((at, skipped)) if now.duration_since(*at) < Self::EVERY => {
                *skipped += 1;
                None
            }
            Some((at, skipped)) => {
                *at = now;
                Some(std::mem::take(skipped))
            }
            None => {
                if self.last.len() >= Self::KEYS {
                    self.last.retain(|_, (at, _)| now.duration_since(*at) < Self::EVERY);
                }
                self.last.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_key_a_minute_with_the_count_left_out() {
        let mut t = Throttle::default();
        assert_eq!(t.allow("dcmd"), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.allow("dcmd"), None);
        }
        assert_eq!(t.allow("state"), Some(0), "keys are throttled apart");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(t.allow("dcmd"), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(t.allow("dcmd"), Some(1001));
        assert_eq!(t.allow("dcmd"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_past_the_bound_forget_the_ones_a_minute_old() {
        let mut t: Throttle<u32> = Throttle::default();
        for k in 0..1024 {
            assert_eq!(t.allow(k), Some(0));
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(t.allow(5000), Some(0));
        assert_eq!(t.last.len(), 1, "the old keys are forgotten");
    }
}
