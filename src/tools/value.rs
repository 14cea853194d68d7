//! A sensor value as agents get it: an integer kept exact, a number, a boolean or text; and
//! how two numbers compare (integers exactly).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A sensor value: an integer (exact, also beyond 2^53: JSON allows any integer), a number,
/// a boolean or a string.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Value {
    /// An integer of the device, as it sent it (no scale or offset applied).
    Int(i64),
    /// An unsigned integer above 9223372036854775807 (a 64-bit unsigned value).
    UInt(u64),
    Number(f64),
    Bool(bool),
    Text(String),
}

impl Value {
    /// An unsigned integer: `Int` when it fits, so that equal values compare equal.
    pub fn unsigned(u: u64) -> Value {
        i64::try_from(u).map_or(Value::UInt(u), Value::Int)
    }

    /// How two numbers compare: integers exactly, a float with anything as floats.
    pub fn compare(&self, other: &Value) -> Option<std::cmp::Ordering> {
        if let (Value::Number(a), Value::Number(b)) = (self, other) {
            return a.partial_cmp(b);
        }
        let int = |v: &Value| match v {
            Value::Int(i) => Some(i128::from(*i)),
            Value::UInt(u) => Some(i128::from(*u)),
            _ => None,
        };
        match (int(self), int(other)) {
            (Some(a), Some(b)) => Some(a.cmp(&b)),
            _ => self.as_f64()?.partial_cmp(&other.as_f64()?),
        }
    }

    /// The value as a number, when it is one (integers beyond 2^53 rounded).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::UInt(u) => Some(*u as f64),
            Value::Number(n) => Some(*n),
            Value::Bool(_) | Value::Text(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Value;
    use std::cmp::Ordering::{Equal, Greater, Less};

    #[test]
    fn integers_compare_exactly_beyond_two_to_the_53() {
        let (a, b) = (Value::Int((1 << 53) + 1), Value::Int(1 << 53));
        assert_eq!(a.compare(&b), Some(Greater), "equal as floats, not as integers");
        assert_eq!(Value::unsigned(u64::MAX).compare(&Value::Int(-1)), Some(Greater));
        assert_eq!(Value::unsigned(5), Value::Int(5));
        assert_eq!(Value::Number(1.5).compare(&Value::Int(2)), Some(Less));
        assert_eq!(Value::Int(2).compare(&Value::Number(2.0)), Some(Equal));
        assert_eq!(Value::Text("a".into()).compare(&Value::Int(2)), None);
    }
}
