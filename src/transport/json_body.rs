//! Request bodies of the HTTP API as JSON, with every object's names unique: `{"limit": 1,
//! "limit": 500}` is refused instead of silently taking the last value. (serde_json keeps
//! the last; what an agent meant is anyone's guess.)

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON value that refuses duplicate object names while it is read.
struct Unique(Value);

impl<'de> de::Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Unique(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Unique(v) = map.next_value()?;
            if out.contains_key(&key) {
                let shown: String = key.chars().take(40).collect();
                return Err(de::Error::custom(format!("the name \"{shown}\" appears twice in one object")));
            }
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// The body as JSON, or why not (a short sentence, with the line and column).
pub fn parse(body: &[u8]) -> Result<Value, String> {
    let mut d = serde_json::Deserializer::from_slice(body);
    let value = <Unique as de::Deserialize>::deserialize(&mut d).map_err(|e| e.to_string())?;
    d.end().map_err(|e| e.to_string())?;
    Ok(value.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn duplicate_names_are_refused_at_any_depth() {
        assert_eq!(parse(br#"{"a": 1, "b": [1, {"c": null}]}"#), Ok(json!({"a": 1, "b": [1, {"c": null}]})));
        assert!(parse(br#"{"limit": 1, "limit": 500}"#).unwrap_err().contains("\"limit\" appears twice"));
        assert!(parse(br#"{"a": [{"x": 1, "x": 2}]}"#).is_err());
        assert!(parse(br#"{"a": 1} {"b": 2}"#).is_err(), "trailing content");
        assert!(parse(&[b'['; 10_000]).is_err(), "deep nesting is an error, not a stack overflow");
        assert_eq!(parse(b"1.5"), Ok(json!(1.5)));
    }
}
