//! The catalogue of tools: names, descriptions, annotations and generated schemas.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::Serialize;
use serde_json::Value;

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

/// One tool's static description.
pub struct ToolSpec {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub annotations: Annotations,
    /// Whether this build serves the tool (later issues implement the rest).
    pub served: bool,
    input: fn() -> Value,
    output: fn() -> Value,
}

impl ToolSpec {
    pub fn input_schema(&self) -> Value {
        (self.input)()
    }
    pub fn output_schema(&self) -> Value {
        (self.output)()
    }

    /// The definition as `fieldgate tools`, MCP `tools/list` and `GET /v1/tools` show it.
    pub fn definition(&self) -> Value {
        serde_json::json!({
            "name": self.name,
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

/// The input schema of an argument type.
pub fn input_schema<T: JsonSchema>() -> Value {
    let schema = settings().into_generator().into_root_schema_for::<T>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    flatten_descriptions(&mut v);
    v
}

/// The output schema: the envelope around `T`.
pub fn output_schema<T: JsonSchema>() -> Value {
    let schema = settings().into_generator().into_root_schema_for::<Envelope<T>>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    flatten_descriptions(&mut v);
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
    ($name:literal, $title:literal, $ann:expr, $served:expr, $args:ty, $data:ty, $desc:expr) => {
        ToolSpec {
            name: $name,
            title: $title,
            description: $desc,
            annotations: $ann,
            served: $served,
            input: input_schema::<$args>,
            output: output_schema::<$data>,
        }
    };
}

/// Every tool of the contract, served or not yet.
pub static TOOLS: [ToolSpec; 8] = [
    spec!(
        "list_sensors",
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
        "get_sensor_reading",
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
        "get_sensor_readings",
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
        "get_sensor_history",
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
        "get_device_status",
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
        "create_work_order",
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
        "get_work_order",
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
        "list_work_orders",
        "List work orders",
        READ_LOCAL,
        true,
        ListWorkOrdersArgs,
        ListWorkOrdersData,
        "List work orders, newest first, filtered by status, sensor or creation time. Use it to \
         see what is already planned before proposing new work. Do not use it for one known order \
         (call get_work_order). Pages with `next_cursor`. No side effects."
    ),
];

pub fn spec(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

/// The JSON Schema of device files.
pub fn device_file_schema() -> Value {
    let schema = SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<crate::registry::file_schema::DeviceFile>();
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    flatten_descriptions(&mut v);
    v
}
