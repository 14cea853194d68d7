//! The bounds of every integer key of a device file, in one table: the loader checks
//! values against it and the JSON Schema (`schemas/device-file.json`, from
//! `file_schema.rs`) publishes it, so the two cannot drift apart (a test holds them equal).

use std::ops::RangeInclusive;

/// The inclusive range of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub key: &'static str,
    pub min: i64,
    pub max: i64,
}

impl Bound {
    pub const fn range(&self) -> RangeInclusive<i64> {
        self.min..=self.max
    }
}

const fn bound(key: &'static str, min: i64, max: i64) -> Bound {
    Bound { key, min, max }
}

pub const UNIT_ID: Bound = bound("unit_id", 0, 247);
pub const TIMEOUT_MS: Bound = bound("timeout_ms", 1, 60_000);
pub const POLL_INTERVAL_MS: Bound = bound("poll_interval_ms", 0, 86_400_000);
pub const MAX_REGISTERS_PER_READ: Bound = bound("max_registers_per_read", 1, 125);
pub const MAX_GAP: Bound = bound("max_gap", 0, 124);
pub const BAUD_RATE: Bound = bound("baud_rate", 300, 4_000_000);
pub const DATA_BITS: Bound = bound("data_bits", 5, 8);
pub const STOP_BITS: Bound = bound("stop_bits", 1, 2);
pub const ADDRESS: Bound = bound("address", 0, 65_535);
pub const BIT: Bound = bound("bit", 0, 15);
pub const LENGTH: Bound = bound("length", 1, 125);
pub const FAILURE_THRESHOLD: Bound = bound("failure_threshold", 1, 1000);
pub const FAILURE_RATE_PERCENT: Bound = bound("failure_rate_percent", 1, 100);
pub const WINDOW_SIZE: Bound = bound("window_size", 1, 1000);
pub const MIN_CALLS: Bound = bound("min_calls", 1, 1000);
pub const OPEN_MS: Bound = bound("open_ms", 10, 86_400_000);
pub const MAX_OPEN_MS: Bound = bound("max_open_ms", 10, 86_400_000);

/// Every bound, for the test that ties the table to the published schema.
pub const ALL: [Bound; 17] = [
    UNIT_ID,
    TIMEOUT_MS,
    POLL_INTERVAL_MS,
    MAX_REGISTERS_PER_READ,
    MAX_GAP,
    BAUD_RATE,
    DATA_BITS,
    STOP_BITS,
    ADDRESS,
    BIT,
    LENGTH,
    FAILURE_THRESHOLD,
    FAILURE_RATE_PERCENT,
    WINDOW_SIZE,
    MIN_CALLS,
    OPEN_MS,
    MAX_OPEN_MS,
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every occurrence of a property named `key` in the schema, with its bounds.
    fn bounds_in(v: &Value, key: &str, out: &mut Vec<(Option<i64>, Option<i64>)>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(props)) = m.get("properties")
                    && let Some(p) = props.get(key)
                {
                    out.push((p["minimum"].as_i64(), p["maximum"].as_i64()));
                }
                m.values().for_each(|x| bounds_in(x, key, out));
            }
            Value::Array(a) => a.iter().for_each(|x| bounds_in(x, key, out)),
            _ => {}
        }
    }

    #[test]
    fn the_published_schema_has_the_loaders_bounds() {
        // The schema as published (schemas/device-file.json).
        let schema = crate::tools::catalog::device_file_schema();
        for b in ALL {
            let mut found = Vec::new();
            bounds_in(&schema, b.key, &mut found);
            assert!(!found.is_empty(), "{} is not in the schema", b.key);
            for f in found {
                assert_eq!(f, (Some(b.min), Some(b.max)), "{}", b.key);
            }
        }
    }
}
