//! `[[sensors.alarms]]` of one sensor, every problem collected.

use std::collections::HashSet;
use std::time::Duration;

use super::super::alarm::{AlarmDef, AlarmKind, AlarmPriority, is_alarm_name};
use crate::toml_reader::Table;

/// A delay is at most a day.
const MAX_DELAY_S: i64 = 86_400;

/// What a Modbus sensor reads, for the kinds of alarm it can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reads {
    Boolean,
    Number,
    Text,
}

/// The sensor's alarms; `reads`: what the sensor reads (`None` for an OPC UA node, whose
/// type is the server's, or when its type could not be read: that problem is reported).
pub(super) fn read_alarms(s: &Table<'_, '_>, reads: Option<Reads>) -> Vec<AlarmDef> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for a in s.tables("alarms") {
        let name = a.req_str("name").filter(|n| {
            if !is_alarm_name(n) {
                a.problem("name", format!("must be 1 to 16 of A-Z, 0-9 and _ (e.g. \"HI\"), found {n:?}"));
                return false;
            }
            if !names.insert(n.to_string()) {
                a.problem("name", format!("{n} is this sensor's alarm already"));
                return false;
            }
            true
        });
        let kind: Option<AlarmKind> = a.req_pick("type");
        let limit = a.float("limit");
        let normal = a.bool("normal");
        match kind {
            Some(AlarmKind::OffNormal) => {
                match reads {
                    Some(Reads::Number) => {
                        a.problem("type", "off_normal watches a boolean sensor; this sensor reads a number")
                    }
                    Some(Reads::Text) => {
                        a.problem("type", "off_normal watches a boolean sensor; this sensor reads text")
                    }
                    _ => {}
                }
                if a.has("limit") {
                    a.problem("limit", "an off_normal alarm has no limit (it watches `normal`)");
                }
                if a.has("deadband") {
                    a.problem("deadband", "an off_normal alarm has no deadband");
                }
            }
            Some(_) => {
                match reads {
                    Some(Reads::Boolean) => a.problem(
                        "type",
                        "high and low alarms watch a number; this sensor reads a boolean (use off_normal)",
                    ),
                    Some(Reads::Text) => a.problem("type", "no alarm watches text; this sensor reads text"),
                    _ => {}
                }
                if !a.has("limit") {
                    a.problem("limit", "a high or low alarm needs its limit, in the sensor's units");
                }
                if a.has("normal") {
                    a.problem("normal", "only an off_normal alarm has a normal state");
                }
            }
            None => {}
        }
        let deadband = a.float("deadband").unwrap_or(0.0);
        if !(deadband >= 0.0 && deadband.is_finite()) {
            a.problem("deadband", format!("must not be negative, found {deadband}"));
        }
        let delay = |key: &'static str| Duration::from_secs(a.int(key, 0..=MAX_DELAY_S).unwrap_or(0) as u64);
        let (on_delay, off_delay) = (delay("on_delay_s"), delay("off_delay_s"));
        let priority: Option<AlarmPriority> = a.req_pick("priority");
        let message = a.req_text("message").filter(|m| {
            let n = m.trim().chars().count();
            if !(1..=200).contains(&n) {
                a.problem("message", format!("must be 1 to 200 characters, found {n}"));
            }
            (1..=200).contains(&n)
        });
        a.finish();
        let (Some(name), Some(kind), Some(priority), Some(message)) = (name, kind, priority, message) else {
            continue;
        };
        if kind != AlarmKind::OffNormal && !limit.is_some_and(f64::is_finite) {
            continue;
        }
        out.push(AlarmDef {
            name: name.to_string(),
            kind,
            limit: limit.unwrap_or(0.0),
            deadband,
            on_delay,
            off_delay,
            normal: normal.unwrap_or(false),
            priority,
            message: message.to_string(),
        });
    }
    out
}
