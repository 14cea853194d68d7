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
