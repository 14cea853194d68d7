//! Our own implementations of two JSON Schema keywords of the input schemas, and a
//! keyword that checks nothing (for the formats the published schemas leave out).

use serde_json::Value;

use crate::ids::SENSOR_ID_PATTERN;

/// The `pattern` keyword of our input schemas. The sensor-ID grammar, which a batch
/// checks up to a hundred times per call, is checked by `ids::is_sensor_id` (faster than the
/// regex in the batch bench; a property test in `ids` holds the two equal); any other pattern by the regex engine. Like `pattern`, it only judges
/// strings.
enum PatternKeyword {
    SensorId,
    Regex(regex::Regex),
}

impl PatternKeyword {
    fn matches(&self, s: &str) -> bool {
        match self {
            PatternKeyword::SensorId => crate::ids::is_sensor_id(s),
            PatternKeyword::Regex(r) => r.is_match(s),
        }
    }

    fn pattern(&self) -> &str {
        match self {
            PatternKeyword::SensorId => SENSOR_ID_PATTERN,
            PatternKeyword::Regex(r) => r.as_str(),
        }
    }
}

impl<'i> jsonschema::Keyword<'i> for PatternKeyword {
    fn validate(&self, instance: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        match self.is_valid(instance) {
            true => Ok(()),
            // Read back as `ValidationErrorKind::Custom` with the pattern as its message.
            false => Err(jsonschema::ValidationError::custom(self.pattern())),
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        instance.as_str().is_none_or(|s| self.matches(s))
    }
}

pub(super) fn pattern_keyword<'a>(
    _: &'a serde_json::Map<String, Value>,
    value: &'a Value,
    _: jsonschema::paths::Location,
) -> Result<Box<dyn for<'i> jsonschema::Keyword<'i>>, jsonschema::ValidationError<'a>> {
    let pattern =
        value.as_str().ok_or_else(|| jsonschema::ValidationError::schema("pattern must be a string"))?;
    if pattern == SENSOR_ID_PATTERN {
        return Ok(Box::new(PatternKeyword::SensorId));
    }
    // Our patterns are plain (no look-around): the linear-time engine.
    let regex =
        regex::Regex::new(pattern).map_err(|_| jsonschema::ValidationError::schema("invalid pattern"))?;
    Ok(Box::new(PatternKeyword::Regex(regex)))
}

/// The `uniqueItems` keyword of our input schemas. Its one use is a batch's `sensor_ids`:
/// up to a hundred strings, checked by [`distinct`] (jsonschema's own check hashes every
/// item as a JSON value with SipHash into a new set, slower in the batch bench). Arrays of
/// anything else are compared pairwise, with numbers equal by value (1 and 1.0 are the
/// same item), as JSON Schema asks.
pub(super) struct UniqueItemsKeyword;

impl<'i> jsonschema::Keyword<'i> for UniqueItemsKeyword {
    fn validate(&self, instance: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        match self.is_valid(instance) {
            true => Ok(()),
            // Read back as `ValidationErrorKind::Custom` with keyword "uniqueItems".
            false => Err(jsonschema::ValidationError::custom("items are not unique")),
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        let Some(items) = instance.as_array() else { return true };
        let strings: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
        match strings {
            Some(strings) => distinct(&strings),
            None => items.iter().enumerate().all(|(i, a)| items[..i].iter().all(|b| !same_json(a, b))),
        }
    }
}

/// Whether no string occurs twice. Up to 128 strings (a batch's IDs) go into a table of 256
/// slots on the stack (no allocation; a one-byte tag of the hash spares most string
/// comparisons); more into a hash set.
pub(super) fn distinct(strings: &[&str]) -> bool {
    use std::hash::BuildHasher;
    const EMPTY: u8 = u8::MAX;
    if strings.len() > 128 {
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(strings.len(), Default::default());
        return strings.iter().all(|s| seen.insert(s));
    }
    let hasher = foldhash::fast::FixedState::default();
    let (mut slots, mut tags) = ([EMPTY; 256], [0u8; 256]);
    for (i, s) in strings.iter().enumerate() {
        let h = hasher.hash_one(s);
        let tag = (h >> 56) as u8;
        let mut k = h as usize;
        loop {
            let slot = k & 255;
            match slots[slot] {
                EMPTY => {
                    (slots[slot], tags[slot]) = (i as u8, tag);
                    break;
                }
                j if tags[slot] == tag && strings[j as usize] == *s => return false,
                _ => k += 1,
            }
        }
    }
    true
}

/// JSON equality as JSON Schema defines it: numbers by value, objects by members.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(x), Some(y), _, _) => x == y,
            (_, _, Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

pub(super) fn unique_items_keyword<'a>(
    _: &'a serde_json::Map<String, Value>,
    value: &'a Value,
    _: jsonschema::paths::Location,
) -> Result<Box<dyn for<'i> jsonschema::Keyword<'i>>, jsonschema::ValidationError<'a>> {
    match value {
        Value::Bool(true) => Ok(Box::new(UniqueItemsKeyword)),
        // `false` asks nothing.
        Value::Bool(false) => Ok(Box::new(NoCheck)),
        _ => Err(jsonschema::ValidationError::schema("uniqueItems must be a boolean")),
    }
}

/// A keyword that accepts every instance.
pub(super) struct NoCheck;

impl<'i> jsonschema::Keyword<'i> for NoCheck {
    fn validate(&self, _: &'i Value) -> Result<(), jsonschema::ValidationError<'i>> {
        Ok(())
    }

    fn is_valid(&self, _: &'i Value) -> bool {
        true
    }
}
