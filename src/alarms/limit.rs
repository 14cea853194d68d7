//! When a limit alarm activates and clears, sample by sample (ISA-18.2's alarm condition,
//! before acknowledgement): the rules `docs/device-files.md` states.
//!
//! - It activates at a sample `>=` its limit (`<=` for low kinds; for `off_normal`, a
//!   boolean not in its normal state) once the value has been beyond the limit for
//!   `on_delay` of sample time: the first sample beyond starts the delay, the first sample
//!   at or after its end that is still beyond activates it (a zero delay: that first
//!   sample). A sample back inside before then forgets the delay.
//! - It clears at a sample below `limit - deadband` (above `limit + deadband` for low
//!   kinds; `off_normal`: back in its normal state) once inside for `off_delay`, counted
//!   the same way. The deadband applies on clearing only.
//! - A sample of bad or uncertain quality, or without a value (or of another type), holds
//!   the state and forgets any delay being counted (nothing is known of the time between).
//! - Samples come in time order; one not after the last evaluated is ignored.

use crate::registry::{AlarmDef, AlarmKind};

/// A sample's value as an alarm reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Number(f64),
    Bool(bool),
    /// A value an alarm cannot read (text, none).
    Other,
}

/// What a sample changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    Activated { at_ms: i64, value: Value },
    Cleared { at_ms: i64, value: Value },
}

/// One alarm's condition between samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitState {
    pub active: bool,
    /// Since when (sample time, ms) the value has been on the other side, while a delay
    /// is being counted, and the last sample's value then.
    pending_since: Option<i64>,
    pending_value: Option<Value>,
    last_ms: Option<i64>,
}

impl LimitState {
    /// A state that is active (or not) with no delay counted: as restored at start.
    pub fn restored(active: bool) -> LimitState {
        LimitState { active, pending_since: None, pending_value: None, last_ms: None }
    }

    /// The sample at `t_ms` applied: a transition, if it made one.
    pub fn on_sample(&mut self, def: &AlarmDef, t_ms: i64, value: Value, good: bool) -> Option<Transition> {
        if self.last_ms.is_some_and(|last| t_ms <= last) {
            return None;
        }
        self.last_ms = Some(t_ms);
        let side = if good { side(def, value, self.active) } else { None };
        if side != Some(true) {
            self.pending_since = None;
            self.pending_value = None;
            return None;
        }
        self.pending_value = Some(value);
        let since = *self.pending_since.get_or_insert(t_ms);
        let delay = if self.active { def.off_delay } else { def.on_delay };
        if t_ms.saturating_sub(since) < i64::try_from(delay.as_millis()).unwrap_or(i64::MAX) {
            return None;
        }
        Some(self.flip(t_ms, value))
    }

    /// For a sensor whose last value holds until the next change (an OPC UA subscription
    /// sends changes only): a delay being counted ends at its time, `now_ms`, without
    /// another sample; the transition is stamped when the delay ended.
    pub fn on_time(&mut self, def: &AlarmDef, now_ms: i64) -> Option<Transition> {
        let (since, value) = (self.pending_since?, self.pending_value?);
        let delay = if self.active { def.off_delay } else { def.on_delay };
        let at = since.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
        if now_ms < at {
            return None;
        }
        self.last_ms = Some(at);
        Some(self.flip(at, value))
    }

    fn flip(&mut self, at_ms: i64, value: Value) -> Transition {
        self.pending_since = None;
        self.pending_value = None;
        self.active = !self.active;
        if self.active {
            Transition::Activated { at_ms, value }
        } else {
            Transition::Cleared { at_ms, value }
        }
    }
}

/// Whether `value` is on the side that would change the state (beyond the limit while
/// inactive, back inside past the deadband while active); `None` when it cannot be read.
fn side(def: &AlarmDef, value: Value, active: bool) -> Option<bool> {
    match (def.kind, value) {
        (AlarmKind::OffNormal, Value::Bool(b)) => Some((b != def.normal) != active),
        (AlarmKind::OffNormal, _) => None,
        (kind, Value::Number(x)) if x.is_finite() => Some(if kind.is_high() {
            if active { x < def.limit - def.deadband } else { x >= def.limit }
        } else if active {
            x > def.limit + def.deadband
        } else {
            x <= def.limit
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
