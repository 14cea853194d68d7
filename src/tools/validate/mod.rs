//! Layer 1 of argument validation: the arguments against the tool's input schema.
//!
//! The schema is the one clients see. It types optional parameters without `null` (some
//! clients refuse `["integer", "null"]`), yet `null` means "the default": an optional
//! parameter sent as `null` is left out before the schema judges the arguments.
//!
//! Layer 2 (domain: ID grammar, dates, bounds) and layer 3 (the referenced thing exists)
//! live with each tool, through the helpers at the end of this file.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use serde_json::Value;

mod keywords;
pub mod text;

use super::envelope::{Detail, ErrorCode, ToolError, cut};
use crate::ids::SensorId;
use crate::registry::Registry;
use keywords::{pattern_keyword, unique_items_keyword};

/// A compiled input schema.
pub struct InputValidator {
    validator: jsonschema::Validator,
    /// Top-level parameter names, for "unknown parameter" suggestions.
    params: Vec<String>,
    /// The parameters not in `required`: `null` for one of them means "the default".
    optional: Vec<String>,
    /// Allowed values of enum-like parameters (`unit`: normalized, raw).
    choices: std::collections::HashMap<String, Vec<String>>,
}

/// Every `const` and `enum` value under a schema node.
fn collect_choices(v: &Value, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        if let Some(c) = m.get("const").and_then(Value::as_str) {
            out.push(c.to_string());
        }
        if let Some(e) = m.get("enum").and_then(Value::as_array) {
            out.extend(e.iter().filter_map(Value::as_str).map(str::to_string));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alts)) = m.get(key) {
                alts.iter().for_each(|a| collect_choices(a, out));
            }
        }
    }
}

impl InputValidator {
    pub fn new(schema: &Value) -> Result<InputValidator, String> {
        let validator = jsonschema::options()
            .with_keyword("pattern", pattern_keyword)
            .with_keyword("uniqueItems", unique_items_keyword)
            // For `patternProperties` (none today): the linear-time engine, like ours.
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(schema)
            .map_err(|e| e.to_string())?;
        let params: Vec<String> = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let optional = params.iter().filter(|p| !required.contains(&p.as_str())).cloned().collect();
        let mut choices = std::collections::HashMap::new();
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, p) in props {
                let mut values = Vec::new();
                collect_choices(p, &mut values);
                if !values.is_empty() {
                    choices.insert(name.clone(), values);
                }
            }
        }
        Ok(InputValidator { validator, params, optional, choices })
    }

    /// The arguments without the optional parameters sent as `null`, when there are any.
    fn without_nulls(&self, args: &Value) -> Option<Value> {
        let map = args.as_object()?;
        let null_optional = |(k, v): (&String, &Value)| v.is_null() && self.optional.contains(k);
        if !map.iter().any(null_optional) {
            return None;
        }
        Some(Value::Object(
            map.iter().filter(|kv| !null_optional(*kv)).map(|(k, v)| (k.clone(), v.clone())).collect(),
        ))
    }

    /// Every schema violation, as one `INVALID_ARGUMENT` (with `details` when several).
    ///
    /// `suggest(parameter, received)` offers close valid values for a malformed string.
    pub fn check(&self, args: &Value, suggest: &dyn Fn(&str, &str) -> Vec<String>) -> Result<(), ToolError> {
        // `null` for an optional parameter: as if it were left out.
        let stripped = self.without_nulls(args);
        let args = stripped.as_ref().unwrap_or(args);
        // The common case, without collecting errors; the same schema decides both.
        if self.validator.is_valid(args) {
            return Ok(());
        }
        let mut found = Found::default();
        for error in self.validator.iter_errors(args) {
            self.describe(&error, args, suggest, &mut found);
        }
        found.into_result()
    }

    /// Adds what `error` says about the arguments to `found`.
    fn describe(
        &self,
        error: &jsonschema::ValidationError<'_>,
        args: &Value,
        suggest: &dyn Fn(&str, &str) -> Vec<String>,
        found: &mut Found,
    ) {
        let path = error.instance_path().to_string();
        let parameter = path.trim_start_matches('/').to_string();
        let received = Some(render(error.instance()));
        let detail = |parameter: String, received: Option<String>, expected: String, message: String| {
            Detail { parameter, received, expected: Some(expected), message, suggestions: Vec::new() }
        };
        match error.kind() {
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or("?").to_string();
                found.details.push(detail(name.clone(), None, "a value".into(), format!("`{name}` is required.")));
            }
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                // Parameters the call already gives are not what another name meant.
                let given = args.as_object();
                let open: Vec<&str> = self
                    .params
                    .iter()
                    .filter(|p| given.is_none_or(|g| !g.contains_key(*p)))
                    .map(String::as_str)
                    .collect();
                for name in unexpected {
                    found.unknown = true;
                    let near = crate::suggest::closest_parameter(name, &open);
                    if let Some(n) = near {
                        found.meant.push((cut(name), n.to_string()));
                    }
                    found.details.push(Detail {
                        parameter: crate::tools::envelope::visible(name).into_owned(),
                        received: None,
                        expected: Some(format!("one of the parameters: {}", self.params.join(", "))),
                        message: format!("`{}` is not a parameter of this tool.", cut(name)),
                        suggestions: near.map(|n| vec![n.to_string()]).unwrap_or_default(),
                    });
                }
            }
            // Our `uniqueItems` (see `new`).
            ValidationErrorKind::Custom { keyword, .. } if keyword == "uniqueItems" => {
                let message = format!("`{parameter}` lists an item twice.");
                found.details.push(detail(parameter, None, "distinct items".into(), message));
            }
            ValidationErrorKind::Pattern { pattern }
            // Our other custom keyword is `pattern` (see `new`); its message is the pattern.
            | ValidationErrorKind::Custom { keyword: _, message: pattern } => {
                let (expected, message) = pattern_text(&parameter, pattern, error.instance().as_str());
                let suggestions = error.instance().as_str().map(|s| suggest(&parameter, s)).unwrap_or_default();
                found.details.push(Detail { parameter, received, expected: Some(expected), message, suggestions });
            }
            kind => {
                let (shows_received, expected, message) = self.plain(kind, &parameter);
                found.details.push(detail(parameter, received.filter(|_| shows_received), expected, message));
            }
        }
    }

    /// What a type, enum, bound or size error expects and says, and whether the value
    /// received is shown with it (not for arrays).
    fn plain(&self, kind: &ValidationErrorKind, parameter: &str) -> (bool, String, String) {
        match kind {
            ValidationErrorKind::Type { kind } => {
                let want = match kind {
                    TypeKind::Single(t) => t.to_string(),
                    TypeKind::Multiple(set) => {
                        let names: Vec<String> =
                            set.iter().map(|t| t.to_string()).filter(|t| t != "null").collect();
                        names.join(" or ")
                    }
                };
                let name = if parameter.is_empty() { "arguments" } else { parameter };
                let message = format!("`{name}` must be {}.", article(&want));
                (true, want, message)
            }
            ValidationErrorKind::Enum { options } => {
                let opts: Vec<String> = options
                    .as_array()
                    .map(|a| a.iter().filter(|v| !v.is_null()).map(render).collect())
                    .unwrap_or_default();
                (
                    true,
                    format!("one of {}", opts.join(", ")),
                    format!("`{parameter}` is not an allowed value."),
                )
            }
            ValidationErrorKind::Minimum { limit } | ValidationErrorKind::ExclusiveMinimum { limit } => {
                (true, format!(">= {limit}"), format!("`{parameter}` is too small."))
            }
            ValidationErrorKind::Maximum { limit } | ValidationErrorKind::ExclusiveMaximum { limit } => {
                (true, format!("<= {limit}"), format!("`{parameter}` is too large."))
            }
            ValidationErrorKind::MinLength { limit } => {
                (true, format!("at least {limit} characters"), format!("`{parameter}` is too short."))
            }
            ValidationErrorKind::MaxLength { limit } => {
                (true, format!("at most {limit} characters"), format!("`{parameter}` is too long."))
            }
            ValidationErrorKind::MinItems { limit } => {
                (false, format!("at least {limit} items"), format!("`{parameter}` has too few items."))
            }
            ValidationErrorKind::MaxItems { limit } => {
                (false, format!("at most {limit} items"), format!("`{parameter}` has too many items."))
            }
            ValidationErrorKind::AnyOf { .. } | ValidationErrorKind::OneOfNotValid { .. }
                if self.choices.contains_key(parameter) =>
            {
                let opts = self.choices[parameter].join(", ");
                (true, format!("one of {opts}"), format!("`{parameter}` is not an allowed value."))
            }
            _ => (
                true,
                "a value matching the input schema".into(),
                format!("`{parameter}` does not match the input schema."),
            ),
        }
    }
}

/// What the schema errors of one call said, gathered into one refusal.
#[derive(Default)]
struct Found {
    details: Vec<Detail>,
    /// Unknown parameters and the real ones they most likely meant, for the hint.
    meant: Vec<(String, String)>,
    unknown: bool,
}

impl Found {
    /// One problem: its own error; several: one error listing them in `details`.
    fn into_result(mut self) -> Result<(), ToolError> {
        match self.details.len() {
            0 => Ok(()),
            1 => {
                let d = self.details.remove(0);
                let hint = match self.meant.first() {
                    Some((name, near)) => {
                        format!("Did you mean `{near}`? Call again with `{near}` instead of `{name}`.")
                    }
                    None if self.unknown => {
                        format!(
                            "Remove `{}` and call again; expected lists the tool's parameters.",
                            cut(&d.parameter)
                        )
                    }
                    None => hint_for(&d.parameter),
                };
                let mut e =
                    ToolError::invalid(d.parameter, None, d.expected.unwrap_or_default(), d.message, hint);
                e.received = d.received;
                e.suggestions = d.suggestions;
                Err(e)
            }
            n => {
                let mut hint = String::from("Fix every parameter listed in details and call again");
                if !self.meant.is_empty() {
                    let renames: Vec<String> = self
                        .meant
                        .iter()
                        .map(|(name, near)| format!("`{near}` instead of `{name}`"))
                        .collect();
                    hint.push_str(&format!("; did you mean {}?", renames.join(", ")));
                    hint.push_str(" The tool's inputSchema lists what is allowed.");
                } else {
                    hint.push_str("; the tool's inputSchema lists what is allowed.");
                }
                let mut e =
                    ToolError::new(ErrorCode::InvalidArgument, format!("{n} arguments are invalid."), hint);
                e.details = self.details;
                Err(e)
            }
        }
    }
}

fn article(t: &str) -> String {
    match t.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => format!("an {t}"),
        _ => format!("a {t}"),
    }
}

/// A value as the caller sent it, for `received`, cut to 100 characters.
fn render(v: &Value) -> String {
    match v {
        Value::String(s) => cut(&crate::tools::envelope::visible(s)),
        other => cut(&crate::tools::envelope::visible(&other.to_string())),
    }
}

pub fn is_sensor_param(p: &str) -> bool {
    p == "sensor_id" || p.starts_with("sensor_ids/")
}

fn pattern_text(parameter: &str, pattern: &str, received: Option<&str>) -> (String, String) {
    if parameter == "idempotency_key" {
        let expected =
            "8-128 characters of A-Z, a-z, 0-9 and . _ : -, e.g. report-2026-11-29-p042".to_string();
        let message = match received.map(|r| r.chars().count()) {
            Some(n) if !(8..=128).contains(&n) => {
                format!("`idempotency_key` has {n} characters; 8-128 are needed.")
            }
            _ => "`idempotency_key` holds a character other than A-Z, a-z, 0-9 and . _ : -.".to_string(),
        };
        return (expected, message);
    }
    if is_sensor_param(parameter) {
        return (
            "a sensor ID PLANT_ZONE_NNN in upper case, e.g. A_LINE1_042".into(),
            format!("`{parameter}` is not a well-formed sensor ID."),
        );
    }
    let what = match parameter {
        "plant" => "a plant code in upper case, e.g. A",
        "zone" => "a zone code in upper case, e.g. LINE1",
        "device_id" => "a device ID of a-z, 0-9 and -, e.g. a-line1-plc",
        _ => "",
    };
    let expected = if what.is_empty() { format!("a string matching {pattern}") } else { what.to_string() };
    (expected, format!("`{parameter}` is not in the expected format."))
}

fn hint_for(parameter: &str) -> String {
    if is_sensor_param(parameter) {
        "Use a suggested ID, or call list_sensors to see valid sensor IDs.".into()
    } else if parameter == "cursor" {
        "Pass next_cursor from the previous page unchanged, or omit cursor to start over.".into()
    } else {
        format!("Fix `{parameter}` and call again; the tool's inputSchema lists what is allowed.")
    }
}

// ---------------------------------------------------------------- layers 2 and 3

/// Layer 2: a sensor ID in the right grammar, or an error with suggestions.
pub fn parse_sensor_id(parameter: &str, raw: &str, registry: &Registry) -> Result<SensorId, ToolError> {
    raw.parse::<SensorId>().map_err(|e| {
        ToolError::invalid(
            parameter,
            Some(raw),
            "a sensor ID PLANT_ZONE_NNN in upper case, e.g. A_LINE1_042",
            format!("`{parameter}` is not a well-formed sensor ID: {e}."),
            "Use a suggested ID, or call list_sensors to see valid sensor IDs.",
        )
        .with_suggestions(registry.suggest_sensors(raw))
    })
}

/// Layers 2 and 3 together: a registered sensor (found at once when it is one), or the
/// error about the grammar or the missing sensor.
pub fn registered_sensor<'r>(
    parameter: &str,
    raw: &str,
    registry: &'r Registry,
) -> Result<&'r crate::registry::Sensor, ToolError> {
    match registry.sensor_named(raw) {
        Some(sensor) => Ok(sensor),
        None => known_sensor(parameter, &parse_sensor_id(parameter, raw, registry)?, registry),
    }
}

/// Layer 3: the sensor exists.
pub fn known_sensor<'r>(
    parameter: &str,
    id: &SensorId,
    registry: &'r Registry,
) -> Result<&'r crate::registry::Sensor, ToolError> {
    registry.sensor(id).ok_or_else(|| {
        let mut e = match registry.conflict(id.as_str()) {
            // The fleet hub withholds an ID two edge nodes announce.
            Some(c) => ToolError::new(
                ErrorCode::SensorNotFound,
                match &c.device {
                    Some(d) => format!(
                        "Sensor {id} (of {}) is withheld: its device ID {} is announced by more than one edge node; the hub serves it from none of them.",
                        c.claimants.join(", "),
                        cut(d)
                    ),
                    // One claimant: its own birth names the sensor twice.
                    None if c.claimants.len() == 1 => format!(
                        "Sensor {id} is named twice in one birth of {}; the hub serves neither.",
                        c.claimants.join(", ")
                    ),
                    None => format!(
                        "Sensor {id} is in a conflict between edge devices ({}); the hub serves it from none of them.",
                        c.claimants.join(", ")
                    ),
                },
                "Report the conflict to a person: a sensor ID must be unique in the fleet and in each birth. Do not retry.",
            ),
            None => ToolError::new(
                ErrorCode::SensorNotFound,
                format!("No sensor {id} is registered."),
                format!("Call list_sensors with plant={} zone={} to see valid IDs.", id.plant(), id.zone()),
            )
            .with_suggestions(registry.suggest_sensors(id.as_str())),
        };
        e.parameter = Some(parameter.to_string());
        e.received = Some(id.to_string());
        e
    })
}

/// Layer 3 for devices: `DEVICE_NOT_FOUND` with the nearest device IDs.
pub fn device_not_found(registry: &Registry, raw: &str, hint: &str) -> ToolError {
    let mut e = match registry.conflict(raw) {
        // The fleet hub withholds a device ID two edge nodes announce.
        Some(c) => ToolError::new(
            ErrorCode::DeviceNotFound,
            format!(
                "Device {} is announced by {} edge nodes ({}); the hub serves none of them.",
                cut(raw),
                c.claimants.len(),
                c.claimants.join(", ")
            ),
            "Report the conflict to a person: device IDs must be unique in the fleet. Do not retry.",
        ),
        None => {
            ToolError::new(ErrorCode::DeviceNotFound, format!("No device {} is registered.", cut(raw)), hint)
                .with_suggestions(registry.suggest_devices(raw))
        }
    };
    e.parameter = Some("device_id".into());
    e.received = Some(cut(raw));
    e
}

#[cfg(test)]
mod tests {
    use super::keywords::{UniqueItemsKeyword, distinct};
    use super::*;
    use serde_json::json;

    fn unique(v: Value) -> bool {
        jsonschema::Keyword::is_valid(&UniqueItemsKeyword, &v)
    }

    proptest::proptest! {
        /// The stack table finds the same duplicates as a set, below and above its 128.
        #[test]
        fn distinct_is_a_set_check(
            strings in proptest::prop_oneof![
                // Few distinct strings: duplicates in nearly every list.
                proptest::collection::vec("[A-C]_[A-C]_00[0-9]|x{0,3}", 0..200),
                // Many: mostly distinct lists, filling the table up to its 128.
                proptest::collection::vec("[A-H]_[A-H]_0[0-9][0-9]", 100..200),
            ],
        ) {
            let refs: Vec<&str> = strings.iter().map(String::as_str).collect();
            let set: std::collections::HashSet<&str> = refs.iter().copied().collect();
            proptest::prop_assert_eq!(distinct(&refs), set.len() == refs.len());
            // The same strings without their duplicates are distinct.
            let mut seen = std::collections::HashSet::new();
            let unique: Vec<&str> = refs.iter().copied().filter(|s| seen.insert(*s)).collect();
            proptest::prop_assert!(distinct(&unique));
        }
    }

    #[test]
    fn unique_items_as_json_schema_defines_them() {
        assert!(unique(json!(["A_LINE1_001", "A_LINE1_002", "a_line1_001"])));
        assert!(!unique(json!(["A_LINE1_001", "A_LINE1_002", "A_LINE1_001"])));
        assert!(unique(json!([])) && unique(json!("not an array")));
        // Not all strings: pairwise, numbers by value, objects by members in any order.
        assert!(!unique(json!([1, "1", 1.0])));
        assert!(unique(json!([1, "1", 1.5, -1, 18446744073709551615u64, null, true])));
        assert!(!unique(json!([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}])));
        assert!(unique(json!([{"a": 1}, {"a": 1, "b": 2}, [1, 2], [2, 1]])));
        assert!(!unique(json!([[1, [true]], [1, [true]]])));
    }
}
