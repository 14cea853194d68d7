//! The key of a call for the cross-call retry limit: the tool and its arguments in a
//! canonical form (object keys sorted), so the same call is recognised however its JSON
//! was written. Built here, in the tools layer: nothing below it sees tool names.

use serde_json::Value;

/// `tool` and its arguments with object keys sorted, so that key order does not matter.
/// Written into one string without intermediate allocations: it is built for every read
/// call while any call is failing.
pub fn call_key(tool: &str, args: &Value) -> String {
    use std::fmt::Write as _;
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    // Debug quoting is injective, which is all a key needs.
                    let _ = write!(out, "{k:?}:");
                    write(&m[k], out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for x in a {
                    write(x, out);
                    out.push(',');
                }
                out.push(']');
            }
            Value::String(s) => {
                let _ = write!(out, "{s:?}");
            }
            other => {
                let _ = write!(out, "{other}");
            }
        }
    }
    let mut out = String::with_capacity(64);
    out.push_str(tool);
    out.push(':');
    write(args, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_ignore_object_key_order() {
        assert_eq!(
            call_key("t", &json!({"a": 1, "b": [2, {"y": 1, "x": 2}]})),
            call_key("t", &json!({"b": [2, {"x": 2, "y": 1}], "a": 1}))
        );
        assert_ne!(call_key("t", &json!({"a": 1})), call_key("u", &json!({"a": 1})));
        assert_ne!(call_key("t", &json!({"a": 1})), call_key("t", &json!({"a": "1"})));
    }
}
