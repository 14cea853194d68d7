//! Fault injection per device, changeable at run time.

use serde::{Deserialize, Serialize};

/// What a device does wrong. The default is a healthy device.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Added to every reply.
    pub latency_ms: u64,
    /// Up to this much more, uniformly.
    pub jitter_ms: u64,
    /// Share of requests swallowed without a reply (0-1).
    pub no_reply: f64,
    /// Share of requests answered only after `late_reply_ms` (0-1).
    pub late_reply: f64,
    pub late_reply_ms: u64,
    /// Modbus exception code to answer with (1-4, 6, ...), with probability `exception_rate`.
    pub exception_code: Option<u8>,
    pub exception_rate: f64,
    /// Share of requests on which the connection is closed instead of answered (0-1).
    pub reset: f64,
    /// The device refuses connections.
    pub down: bool,
    /// Connections accepted at once; more are closed at once, as many real devices do.
    pub max_connections: Option<u32>,
}

impl Faults {
    /// Checks probabilities and codes; every problem in one message.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        for (name, p) in [
            ("no_reply", self.no_reply),
            ("late_reply", self.late_reply),
            ("exception_rate", self.exception_rate),
            ("reset", self.reset),
        ] {
            if !(0.0..=1.0).contains(&p) {
                problems.push(format!("{name} must be between 0 and 1"));
            }
        }
        if self.exception_code.is_some_and(|c| c == 0 || c > 0x7f) {
            problems.push("exception_code must be 1-127".to_string());
        }
        if self.exception_rate > 0.0 && self.exception_code.is_none() {
            problems.push("exception_rate needs exception_code".to_string());
        }
        if self.max_connections == Some(0) {
            problems.push("max_connections must be at least 1".to_string());
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }
}
