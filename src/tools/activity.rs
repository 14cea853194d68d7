//! The agent's recent tool calls, for the operator console: a bounded ring in memory,
//! filled by `ToolService::call_as` (every transport's calls pass there), never by the
//! console's own queries.

use parking_lot::Mutex;
use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// Calls kept; the oldest is dropped first.
pub const CAPACITY: usize = 200;
/// Longest argument text kept for one call (characters).
const ARGS_CHARS: usize = 160;

/// One tool call as the console shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub at: DateTime<Utc>,
    pub tool: &'static str,
    /// The arguments as the caller sent them; [`Call::args_text`] is what may be shown.
    pub args: Value,
    /// `OK` or the error code.
    pub code: &'static str,
    pub duration_ms: f64,
    /// The caller's token name ("anonymous", "local").
    pub caller: String,
}

impl Call {
    /// The arguments as JSON text, anything named like a secret redacted, cut short.
    pub fn args_text(&self) -> String {
        short(&super::redact(&self.args))
    }
}

/// The ring of recent calls.
pub struct Activity {
    calls: Mutex<VecDeque<Call>>,
    capacity: usize,
}

impl Default for Activity {
    fn default() -> Self {
        Activity::with_capacity(CAPACITY)
    }
}

/// `text` cut to [`ARGS_CHARS`] characters, with an ellipsis when cut.
pub fn short(text: &str) -> String {
    match text.char_indices().nth(ARGS_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

impl Activity {
    pub fn with_capacity(capacity: usize) -> Activity {
        Activity { calls: Mutex::new(VecDeque::with_capacity(capacity)), capacity: capacity.max(1) }
    }

    pub fn record(&self, call: Call) {
        let mut calls = self.calls.lock();
        if calls.len() >= self.capacity {
            calls.pop_front();
        }
        calls.push_back(call);
    }

    /// The calls kept, newest first.
    pub fn recent(&self) -> Vec<Call> {
        let calls = self.calls.lock();
        calls.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(n: usize) -> Call {
        const NAMES: [&str; 5] = ["t0", "t1", "t2", "t3", "t4"];
        Call {
            at: Utc::now(),
            tool: NAMES[n],
            args: Value::Null,
            code: "OK",
            duration_ms: 0.0,
            caller: "a".into(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_calls_newest_first() {
        let ring = Activity::with_capacity(3);
        for n in 0..5 {
            ring.record(call(n));
        }
        let tools: Vec<&str> = ring.recent().into_iter().map(|c| c.tool).collect();
        assert_eq!(tools, ["t4", "t3", "t2"]);
    }

    #[test]
    fn long_arguments_are_cut_on_a_character_boundary() {
        let long = "é".repeat(ARGS_CHARS + 10);
        let s = short(&long);
        assert_eq!(s.chars().count(), ARGS_CHARS + 1);
        assert!(s.ends_with('…'));
        assert_eq!(short("{}"), "{}");
    }

    #[test]
    fn secrets_are_not_shown() {
        let c = Call { args: serde_json::json!({"api_Token": "hunter2", "zone": "UTIL"}), ..call(0) };
        assert_eq!(c.args_text(), r#"{"api_Token":"[redacted]","zone":"UTIL"}"#);
    }
}
