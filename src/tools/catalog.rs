//! The catalogue of tools: names, descriptions, annotations and generated schemas.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::Serialize;
use serde_json::{Map, Value};

use super::defs::*;
use super::envelope::Envelope;

/// MCP tool annotations (hints for clients; not security).
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    pub read_only_hint: bool,
    pub destructive_hint: bool,
    pub idempotent_hint: bool,
    pub open_world_hint: bool,
}

const READ_LOCAL: Annotations = Annotations {
    read_only_hint: true,
    destructive_hint: false,
    idempotent_hint: true,
    open_world_hint: false,
};
const READ_DEVICE: Annotations = Annotations {
    read_only_hint: true,
    destructive_hint: false,
    idempotent_hint: true,
    open_world_hint: true,
};
const CREATE: Annotations = Annotations {
    read_only_hint: false,
    destructive_hint: false,
    idempotent_hint: true,
    open_world_hint: true,
};

/// The tools of the contract, one variant each, named as on every wire. Dispatch, the
/// retry limit, the HTTP routes and the catalogue all go by this type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum Tool {
    ListSensors,
    GetSensorReading,
    GetSensorReadings,
    GetSensorHistory,
    GetDeviceStatus,
    CreateWorkOrder,
    GetWorkOrder,
    ListWorkOrders,
    ListAlarms,
    GetAlarmHistory,
    GetAlarmSummary,
}

impl Tool {
    /// The tool's name on every wire.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The tool named `name`, if there is one.
    pub fn named(name: &str) -> Option<Tool> {
        name.parse().ok()
    }

    /// This tool's entry in the catalogue.
    pub fn spec(self) -> &'static ToolSpec {
        &TOOLS[self as usize]
    }

    /// Whether a call reads devices (and so counts towards the cross-call retry limit).
    pub fn reads_devices(self) -> bool {
        matches!(self, Tool::GetSensorReading | Tool::GetSensorReadings)
    }
}

/// One tool's static description.
pub struct ToolSpec {
    pub tool: Tool,
    pub title: &'static str,
    pub description: &'static str,
    pub annotations: Annotations,
    /// Whether this build serves the tool (all do; a tool of the contract can be listed
    /// before it is served).
    pub served: bool,
    input: fn() -> Value,
    output: fn() -> Value,
}

impl ToolSpec {
    pub fn name(&self) -> &'static str {
        self.tool.name()
    }

    pub fn input_schema(&self) -> Value {
        (self.input)()
    }
    pub fn output_schema(&self) -> Value {
        (self.output)()
    }

    /// The definition as `fieldgate tools`, MCP `tools/list` and `GET /v1/tools` show it.
    pub fn definition(&self) -> Value {
        serde_json::json!({
            "name": self.name(),
            "title": self.title,
            "description": self.description,
            "inputSchema": self.input_schema(),
            "outputSchema": self.output_schema(),
            "annotations": self.annotations,
        })
    }
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true)
}

/// Doc comments wrap; agents read descriptions as one line each.
fn flatten_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                match child {
                    Value::String(s) if k == "description" => *s = s.replace('\n', " "),
                    _ => flatten_descriptions(child),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(flatten_descriptions),
        _ => {}
    }
}

/// Calls `f` on every schema object of `v`: the root and every subschema, but never on
/// instance data (`examples`, `default`, `enum`, `const`) or on the maps that hold
/// subschemas by name (`properties`: a parameter may be called `format`).
fn each_schema(v: &mut Value, f: &mut dyn FnMut(&mut Map<String, Value>)) {
    let Value::Object(map) = v else { return };
    f(map);
    for (keyword, child) in map.iter_mut() {
        match (keyword.as_str(), child) {
            (
                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas",
                Value::Object(named),
            ) => named.values_mut().for_each(|s| each_schema(s, f)),
            ("anyOf" | "oneOf" | "allOf" | "prefixItems" | "items", Value::Array(list)) => {
                list.iter_mut().for_each(|s| each_schema(s, f))
            }
            (
                "items"
                | "additionalProperties"
                | "unevaluatedProperties"
                | "unevaluatedItems"
                | "contains"
                | "propertyNames"
                | "not"
                | "if"
                | "then"
                | "else",
                s,
            ) => each_schema(s, f),
            _ => {}
        }
    }
}

/// The `format`s JSON Schema 2020-12 defines (validation vocabulary, §7.3).
const STANDARD_FORMATS: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// The bounds an integer `format` of schemars implies. Bounds beyond 2^53 (64-bit and
/// pointer-sized integers) are left out: a JSON number there is not exact in most clients,
/// and no value of ours comes near.
fn implied_bounds(format: &str) -> (Option<i64>, Option<i64>) {
    match format {
        "uint8" => (Some(0), Some(u8::MAX.into())),
        "uint16" => (Some(0), Some(u16::MAX.into())),
        "uint32" => (Some(0), Some(u32::MAX.into())),
        "uint" | "uint64" | "uint128" => (Some(0), None),
        "int8" => (Some(i8::MIN.into()), Some(i8::MAX.into())),
        "int16" => (Some(i16::MIN.into()), Some(i16::MAX.into())),
        "int32" => (Some(i32::MIN.into()), Some(i32::MAX.into())),
        _ => (None, None),
    }
}

/// Replaces schemars' non-standard `format`s (`uint32`, `uint64`, `double`, ...), which
/// validators warn about, by the `minimum` and `maximum` they imply: the bound already
/// there (a `range` attribute) is kept when it is tighter.
fn standard_formats(v: &mut Value) {
    each_schema(v, &mut |schema| {
        let format = match schema.get("format") {
            Some(Value::String(f)) if !STANDARD_FORMATS.contains(&f.as_str()) => f.clone(),
            _ => return,
        };
        schema.shift_remove("format");
        let (min, max) = implied_bounds(&format);
        let tighter = |keyword: &str, bound: i64, schema: &Map<String, Value>| match schema
            .get(keyword)
            .and_then(Value::as_f64)
        {
            None => true,
            Some(have) if keyword == "minimum" => (bound as f64) > have,
            Some(have) => (bound as f64) < have,
        };
        for (keyword, bound) in [("minimum", min), ("maximum", max)] {
            if let Some(bound) = bound
                && tighter(keyword, bound, schema)
            {
                schema.insert(keyword.into(), Value::from(bound));
            }
        }
    });
}

/// Whether `v` is the schema `{"type": "null"}`.
fn is_null_schema(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.len() == 1 && o.get("type").is_some_and(|t| t == "null"))
}

/// Publishes each optional parameter as its plain type: `["integer", "null"]` becomes
/// `"integer"`, a `null` among the `enum` values goes, and an `anyOf` of a schema and
/// `{"type": "null"}` becomes that schema. Some clients refuse type arrays (the MCP
/// Inspector turned `limit=2` into a string); fieldgate still takes `null` for "the
/// default" (`validate/mod.rs`).
fn without_null(schema: &mut Value) {
    let required: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else { return };
    for (name, p) in props.iter_mut() {
        let Some(p) = p.as_object_mut().filter(|_| !required.contains(name)) else { continue };
        if let Some(Value::Array(types)) = p.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let only = types.remove(0);
                p.insert("type".into(), only);
            }
        }
        if let Some(Value::Array(values)) = p.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
        for keyword in ["anyOf", "oneOf"] {
            let Some(Value::Array(alts)) = p.get_mut(keyword) else { continue };
            alts.retain(|a| !is_null_schema(a));
            if alts.len() == 1 {
                // The one schema left takes the alternatives' place; the parameter's own
                // description, examples and default come first.
                if let Some(Value::Object(only)) =
                    p.shift_remove(keyword).and_then(|mut a| a.as_array_mut()?.pop())
                {
                    for (k, v) in only {
                        p.entry(k).or_insert(v);
                    }
                }
            }
        }
        // Alternatives of one type (`unit`: the constants "normalized" and "raw") state it
        // once more on the parameter, for clients that read nothing else.
        if !p.contains_key("type")
            && let Some(Value::Array(alts)) = p.get("oneOf").or_else(|| p.get("anyOf"))
            && let Some(first) = alts.first().and_then(|a| a.get("type")).filter(|t| t.is_string())
            && alts.iter().all(|a| a.get("type") == Some(first))
        {
            let t = first.clone();
            p.insert("type".into(), t);
        }
    }
}

/// The input schema of an argument type, as clients see it.
pub fn input_schema<T: JsonSchema>() -> Value {
    let schema = settings().into_generator().into_root_schema_for::<T>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    flatten_descriptions(&mut v);
    without_null(&mut v);
    standard_formats(&mut v);
    v
}

/// The output schema: the envelope around `T`. Fields that can be `null` keep saying so:
/// results are checked against it.
pub fn output_schema<T: JsonSchema>() -> Value {
    let schema = settings().into_generator().into_root_schema_for::<Envelope<T>>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    flatten_descriptions(&mut v);
    standard_formats(&mut v);
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "title".into(),
            Value::String(format!(
                "{} envelope",
                std::any::type_name::<T>().rsplit("::").next().unwrap_or("Data")
            )),
        );
    }
    v
}

macro_rules! spec {
    ($tool:expr, $title:literal, $ann:expr, $served:expr, $args:ty, $data:ty, $desc:expr) => {
        ToolSpec {
            tool: $tool,
            title: $title,
            description: $desc,
            annotations: $ann,
            served: $served,
            input: input_schema::<$args>,
            output: output_schema::<$data>,
        }
    };
}

/// Every tool of the contract, in the order of [`Tool`] (a test holds them so).
pub static TOOLS: [ToolSpec; 11] = [
    spec!(
        Tool::ListSensors,
        "List sensors",
        READ_LOCAL,
        true,
        ListSensorsArgs,
        ListSensorsData,
        "Find sensors and their exact IDs (PLANT_ZONE_NNN). Use it first when you do not know a \
         sensor's ID, or to see what a plant, zone, device or piece of equipment measures. Do not \
         use it for values: call get_sensor_reading for a live value or get_sensor_history for \
         past values. Returns one page of sensors sorted by ID, each with description, kind, unit, \
         equipment tag, device and normal range; `total` counts all matches and `next_cursor` \
         continues the listing. No side effects; does not contact devices."
    ),
    spec!(
        Tool::GetSensorReading,
        "Read one sensor",
        READ_DEVICE,
        true,
        GetSensorReadingArgs,
        Reading,
        "Read the current value of one sensor from its device. Use it when you need one value now. \
         Do not use it for several sensors (call get_sensor_readings once instead) or for past \
         values (call get_sensor_history). Returns value, unit, timestamp, quality (good, \
         uncertain, bad), source (live or cache) and whether the value is in the sensor's normal \
         range. A device failure is an error with `retryable` and `retry_after_ms`: wait that long \
         before retrying, and stop when the error is not retryable. No side effects."
    ),
    spec!(
        Tool::GetSensorReadings,
        "Read several sensors",
        READ_DEVICE,
        true,
        GetSensorReadingsArgs<'static>,
        ReadingsData,
        "Read the current values of 1-100 sensors in one call; sensors on the same device are read \
         together. Use it instead of repeated get_sensor_reading calls. Do not use it for past \
         values (call get_sensor_history). Returns `readings` for the sensors that answered and \
         `failed` with an error per sensor that did not (`complete` is false then); the call fails \
         as a whole only when no sensor could be read. No side effects."
    ),
    spec!(
        Tool::GetSensorHistory,
        "Sensor history",
        READ_LOCAL,
        true,
        GetSensorHistoryArgs,
        HistoryData,
        "Stored values of one sensor over a time range, as raw points or summarised per bucket \
         (min, max, avg, count, first, last). Use it for what happened over a period. Do not use \
         it for the value right now (call get_sensor_reading). Raw ranges are limited to 7 days; \
         use `bucket` (e.g. \"1h\") for longer ones. An empty range is a success with no points. \
         Pages with `next_cursor` when `limit` is reached. No side effects; does not contact devices."
    ),
    spec!(
        Tool::GetDeviceStatus,
        "Device status",
        READ_LOCAL,
        true,
        GetDeviceStatusArgs,
        DeviceStatusData,
        "Connection and circuit-breaker state of field devices: up, degraded or down, last \
         success, last error, read latency and number of sensors. Use it when readings fail, to \
         learn whether a device is down and when to try again. Do not use it for sensor values \
         (call get_sensor_reading). \
         No side effects; does not contact devices."
    ),
    spec!(
        Tool::CreateWorkOrder,
        "Propose a work order",
        CREATE,
        true,
        CreateWorkOrderArgs,
        CreateWorkOrderData,
        "Propose maintenance work for the equipment of a sensor. Creates a record that waits for a \
         person's approval; you cannot approve it. Use it only when readings give a concrete \
         reason for work. Do not use it to check an existing order (call get_work_order) or to list \
         orders (call list_work_orders). Needs an `idempotency_key`: send the same key when \
         retrying, and the same order comes back with created=false. If an open order of the same \
         type exists for the sensor, it is returned with `duplicate_of` and nothing new is created."
    ),
    spec!(
        Tool::GetWorkOrder,
        "Get a work order",
        READ_LOCAL,
        true,
        GetWorkOrderArgs,
        WorkOrderData,
        "State and full transition history of one work order, including its delivery to the \
         maintenance system. Use it to follow up on an order you created, after \
         next_check_after_seconds. Do not use it to search (call list_work_orders). No side effects."
    ),
    spec!(
        Tool::ListWorkOrders,
        "List work orders",
        READ_LOCAL,
        true,
        ListWorkOrdersArgs,
        ListWorkOrdersData,
        "List work orders, newest first, filtered by status, sensor or creation time. Use it to \
         see what is already planned before proposing new work. Do not use it for one known order \
         (call get_work_order). Pages with `next_cursor`. No side effects."
    ),
    spec!(
        Tool::ListAlarms,
        "List alarms",
        READ_LOCAL,
        true,
        ListAlarmsArgs,
        ListAlarmsData,
        "The alarms and their state now: normal, active or returned, acknowledged or not, \
         shelved, out of service, with priority, message, limit, when it activated and who \
         acknowledged it. An ID is SENSOR_ID.NAME (a sensor's limit alarm, or an OPC UA server's \
         condition on it) or DEVICE_ID.NAME (a device's own: DEVICE_ID.COMM when it stops \
         answering). Use it for what stands now (state=\"not_normal\") or \
         what waits for an operator (state=\"unacknowledged\"). Do not use it for what happened \
         over a period (call get_alarm_history) or for a shift's figures (call get_alarm_summary). \
         `counts` covers every alarm. Pages with `next_cursor`. No side effects; you cannot \
         acknowledge or shelve (an operator does)."
    ),
    spec!(
        Tool::GetAlarmHistory,
        "Alarm history",
        READ_LOCAL,
        true,
        GetAlarmHistoryArgs,
        AlarmHistoryData,
        "The alarm journal over a time range: every activation, clearing, acknowledgement, \
         shelving and change of service, in time order, with the value, who and their comment. \
         Use it for what happened to an alarm or a sensor's alarms. Do not use it for counts and \
         rates (call get_alarm_summary) or for the state now (call list_alarms). Pages with \
         `next_cursor`. No side effects."
    ),
    spec!(
        Tool::GetAlarmSummary,
        "Alarm summary",
        READ_LOCAL,
        true,
        GetAlarmSummaryArgs,
        AlarmSummaryData,
        "Alarm-management figures over a range (ISA-18.2, EEMUA 191): activations by priority, \
         alarms per 10 minutes (mean, peak), floods (more than 10 in 10 minutes), chattering \
         alarms (3 activations within 60 s), stale alarms (active over 24 h), the most frequent \
         alarms and the top 10's share, time to acknowledge (mean, p90). Use it for a shift or \
         day report. Do not use it for single transitions (call get_alarm_history). At most 31 \
         days. No side effects."
    ),
];

pub fn spec(name: &str) -> Option<&'static ToolSpec> {
    Tool::named(name).map(Tool::spec)
}

/// The JSON Schema of device files.
pub fn device_file_schema() -> Value {
    let schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<crate::registry::file_schema::DeviceFile>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    flatten_descriptions(&mut v);
    standard_formats(&mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::{TOOLS, Tool};

    #[test]
    fn the_table_follows_the_enum_and_names_round_trip() {
        let tools = <Tool as strum::VariantArray>::VARIANTS;
        assert_eq!(TOOLS.len(), tools.len());
        for (spec, &tool) in TOOLS.iter().zip(tools) {
            assert_eq!(spec.tool, tool);
            assert_eq!(Tool::named(tool.name()), Some(tool));
            // Reading devices is what the open-world, read-only annotation says.
            let a = spec.annotations;
            assert_eq!(tool.reads_devices(), a.read_only_hint && a.open_world_hint, "{}", tool.name());
        }
        assert_eq!(Tool::named("get_sensor"), None);
    }

    /// Hints and descriptions name tools in prose ("call list_sensors to see valid IDs").
    /// A tool renamed in `Tool` fails here until every text naming it follows: each word
    /// of a string literal in `src/` shaped like a tool name must be one.
    #[test]
    fn every_tool_named_in_a_text_is_a_tool() {
        let literal = regex::Regex::new(r#""(?:[^"\\\n]|\\.)*""#).unwrap();
        let name = regex::Regex::new(r"\b(?:get|list|create)_[a-z_]+\b").unwrap();
        let mut files = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        let mut unknown = Vec::new();
        let mut seen = 0;
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            // OpenAPI's operation IDs (get_sensors, get_device, ...) name routes, not tools.
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("transport/openapi.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for lit in literal.find_iter(&text) {
                for word in name.find_iter(lit.as_str()).map(|m| m.as_str()) {
                    seen += 1;
                    if Tool::named(word).is_none() && word != "get_sensor" {
                        unknown.push(format!("{}: {word}", path.display()));
                    }
                }
            }
        }
        assert!(seen > 20, "the scan found only {seen} tool names in texts");
        assert!(unknown.is_empty(), "texts name tools that do not exist: {unknown:?}");
    }
}
