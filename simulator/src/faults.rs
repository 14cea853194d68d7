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
    /// Share of requests after which the connection stalls (0-1): that request and every
    /// request sent on the connection during the next `stall_ms` get no reply, as a
    /// serial gateway or a busy PLC comms task does. A new connection is served normally.
    pub stall: f64,
    pub stall_ms: u64,
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
            ("stall", self.stall),
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
        if self.stall > 0.0 && self.stall_ms == 0 {
            problems.push("stall needs stall_ms".to_string());
        }
        if self.max_connections == Some(0) {
            problems.push("max_connections must be at least 1".to_string());
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) }
    }
}

/// Faults changed by a JSON object of some of their fields (`PATCH`/`PUT /devices/{id}/faults`):
/// the fields it names take its values, the others keep theirs; `null` sets a field back
/// to healthy.
pub fn merged(current: &Faults, patch: &serde_json::Value) -> Result<Faults, String> {
    let serde_json::Value::Object(changes) = patch else {
        return Err("the body must be a JSON object of fault fields".to_string());
    };
    let healthy = serde_json::to_value(Faults::default()).map_err(|e| e.to_string())?;
    let mut v = serde_json::to_value(current).map_err(|e| e.to_string())?;
    if let serde_json::Value::Object(fields) = &mut v {
        for (k, new) in changes {
            let value = if new.is_null() { healthy.get(k).cloned().unwrap_or_default() } else { new.clone() };
            fields.insert(k.clone(), value);
        }
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_patch_changes_only_the_fields_it_names() {
        let scenario = Faults { latency_ms: 40, down: true, ..Faults::default() };
        let up = merged(&scenario, &json!({"down": false})).unwrap();
        assert_eq!(up, Faults { latency_ms: 40, ..Faults::default() }, "latency kept");
        let stalled = merged(&up, &json!({"stall": 0.1, "stall_ms": 3000})).unwrap();
        assert_eq!((stalled.latency_ms, stalled.stall, stalled.stall_ms), (40, 0.1, 3000));
        assert_eq!(merged(&stalled, &json!({"latency_ms": null})).unwrap().latency_ms, 0);
        assert!(merged(&up, &json!({"lattency_ms": 1})).is_err(), "unknown fields are refused");
        assert!(merged(&up, &json!([1])).is_err());
    }
}
