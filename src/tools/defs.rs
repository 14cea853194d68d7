//! Arguments and results of all eleven tools, with the descriptions agents read.
//!
//! The JSON Schemas in `schemas/` are generated from these types; the golden test in
//! `tests/it/schemas.rs` keeps them in step.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{DEVICE_ID_PATTERN, PLANT_PATTERN, SENSOR_ID_PATTERN, ZONE_PATTERN};
use crate::registry::NormalRange;

/// Work order IDs: `WO-` and at least six digits.
pub const WORK_ORDER_ID_PATTERN: &str = "^WO-[0-9]{6,}$";
/// Idempotency keys: 8-128 characters of `[A-Za-z0-9._:-]`.
pub const IDEMPOTENCY_KEY_PATTERN: &str = "^[A-Za-z0-9._:-]{8,128}$";
/// History buckets: a count and a unit, `30s`, `5m`, `1h`, `1d`.
pub const BUCKET_PATTERN: &str = "^[1-9][0-9]{0,3}[smhd]$";

mod alarms;
mod status;
pub use alarms::*;
pub use status::*;

// ---------------------------------------------------------------- list_sensors

/// Arguments of `list_sensors`. Every filter is optional; filters combine with AND.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSensorsArgs {
    /// Only sensors of this plant (the PLANT part of the ID), e.g. "A". Default: all plants.
    #[schemars(regex(pattern = PLANT_PATTERN), example = &"A")]
    pub plant: Option<String>,
    /// Only sensors of this zone (the ZONE part of the ID), e.g. "LINE1". Default: all zones.
    #[schemars(regex(pattern = ZONE_PATTERN), example = &"LINE1")]
    pub zone: Option<String>,
    /// Only sensors of this device, e.g. "a-line1-plc". Default: all devices.
    #[schemars(regex(pattern = DEVICE_ID_PATTERN), example = &"a-line1-plc")]
    pub device_id: Option<String>,
    /// Only sensors of this kind, e.g. "temperature", "pressure", "flow". Default: all kinds.
    #[schemars(length(min = 1, max = 32), example = &"pressure")]
    pub kind: Option<String>,
    /// Case-insensitive words that must all appear in the ID, description, equipment tag,
    /// unit or kind, e.g. "pump discharge" or "P-042". Default: no text filter.
    #[schemars(length(min = 1, max = 100), example = &"pump discharge")]
    pub text: Option<String>,
    /// Fleet hub only: sensors of this edge node, as "group/node", e.g. "A/gw1". Default: all
    /// edge nodes.
    #[schemars(length(min = 3, max = 200), example = &"A/gw1")]
    pub edge: Option<String>,
    /// Most sensors to return in this page, 1-1000. Default 100.
    #[schemars(range(min = 1, max = 1000), example = 100, extend("default" = ListSensorsArgs::DEFAULT_LIMIT))]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page, to continue the same listing. Default: first page.
    #[schemars(length(min = 1, max = 200), example = &"eyJhIjoiQV9MSU5FMV8wMjAifQ")]
    pub cursor: Option<String>,
}

impl ListSensorsArgs {
    /// The page size when `limit` is not given (sensors).
    pub const DEFAULT_LIMIT: u32 = 100;
}

/// One sensor as `list_sensors` describes it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SensorInfo {
    pub sensor_id: String,
    pub description: String,
    pub kind: String,
    /// Engineering unit of normalized values.
    pub unit: String,
    /// Asset tag of the equipment the sensor belongs to.
    pub equipment: Option<String>,
    pub device_id: String,
    pub plant: String,
    pub zone: String,
    pub protocol: String,
    /// Value type: bool, u16, i16, u32, i32, u64, i64, f32, f64, string; "opcua" for OPC UA nodes.
    pub data_type: String,
    /// Normal operating range in normalized units.
    pub range: Option<NormalRange>,
    /// True when the device is polled, so `get_sensor_history` has data.
    pub history: bool,
    /// Fleet hub only: the edge node the sensor comes from, as "group/node".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<String>,
}

/// An ID that more than one edge node announces (fleet hub only): served by none of them
/// until an operator gives it to one.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct IdConflict {
    /// The sensor or device ID.
    pub id: String,
    /// Who announces it: "group/node/device" of each.
    pub claimants: Vec<String>,
    /// Set for a sensor withheld because its device's ID is in conflict (listed too):
    /// that device ID; `claimants` are then who announced the sensor itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListSensorsData {
    pub sensors: Vec<SensorInfo>,
    /// Sensors matching the filters, over all pages.
    pub total: usize,
    /// False when more pages follow.
    pub complete: bool,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// Fleet hub only: IDs two edge nodes announce, withheld (never merged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<IdConflict>,
}

// ---------------------------------------------------------------- readings

/// Which value a reading returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnitMode {
    /// After scale and offset, in the sensor's engineering unit.
    #[default]
    Normalized,
    /// The decoded register value before scale and offset.
    Raw,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetSensorReadingArgs {
    /// The sensor, as `PLANT_ZONE_NNN`, e.g. "A_LINE1_001". Use list_sensors to find IDs.
    #[schemars(regex(pattern = SENSOR_ID_PATTERN), example = &"A_LINE1_001")]
    pub sensor_id: String,
    /// "normalized" (engineering units) or "raw" (the decoded device value before scale and
    /// offset), e.g. "raw". Default "normalized".
    #[schemars(example = &"normalized", extend("default" = "normalized"))]
    pub unit: Option<UnitMode>,
    /// Accept a value read at most this many milliseconds ago instead of asking the device,
    /// 0-86400000, e.g. 5000. Default 0: always ask the device.
    #[schemars(range(min = 0, max = 86_400_000), example = 5000, extend("default" = 0))]
    pub max_age_ms: Option<u64>,
}

// Borrows the IDs from the call's arguments: a batch copies none of its hundred IDs.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetSensorReadingsArgs<'a> {
    /// 1-100 distinct sensor IDs, e.g. ["A_LINE1_001", "A_LINE1_002"].
    #[schemars(length(min = 1, max = 100), inner(regex(pattern = SENSOR_ID_PATTERN)))]
    #[schemars(extend("uniqueItems" = true), example = ["A_LINE1_001", "A_LINE1_002"])]
    #[serde(borrow)]
    pub sensor_ids: Vec<&'a str>,
    /// "normalized" or "raw", for every sensor, e.g. "raw". Default "normalized".
    #[schemars(example = &"normalized", extend("default" = "normalized"))]
    pub unit: Option<UnitMode>,
    /// Accept values read at most this many milliseconds ago, 0-86400000, e.g. 5000. Default 0.
    #[schemars(range(min = 0, max = 86_400_000), example = 5000, extend("default" = 0))]
    pub max_age_ms: Option<u64>,
}

/// How far a value can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Quality {
    Good,
    Uncertain,
    Bad,
}

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadingSource {
    /// Read from the device during this call.
    Live,
    /// The last value read, within `max_age_ms`.
    Cache,
    /// The fleet hub: the latest value the sensor's edge node sent (`age_ms` says how old).
    Hub,
}

pub use super::value::Value;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Reading {
    pub sensor_id: String,
    /// Null when the device gave no value (quality bad, or uncertain when it said so).
    pub value: Option<Value>,
    /// Engineering unit, or "raw".
    pub unit: String,
    /// When the value was read (RFC 3339).
    pub timestamp: String,
    pub quality: Quality,
    pub source: ReadingSource,
    /// Age of the value when answered.
    pub age_ms: u64,
    pub device_id: String,
    pub range: Option<NormalRange>,
    /// Whether a numeric normalized value lies inside `range`; null when not applicable.
    pub in_range: Option<bool>,
    /// The sensor's alarms, when it has any (see list_alarms): the most pressing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm: Option<ReadingAlarm>,
}

/// A sensor that could not be read in a batch.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FailedSensor {
    pub sensor_id: String,
    pub error: super::envelope::ToolError,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReadingsData {
    pub readings: Vec<Reading>,
    /// Sensors that could not be read, with the reason for each.
    pub failed: Vec<FailedSensor>,
    /// False when `failed` is not empty.
    pub complete: bool,
}

// ---------------------------------------------------------------- history

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetSensorHistoryArgs {
    /// The sensor, e.g. "A_LINE1_001".
    #[schemars(regex(pattern = SENSOR_ID_PATTERN), example = &"A_LINE1_001")]
    pub sensor_id: String,
    /// Start of the range: an RFC 3339 instant ("2026-11-29T08:00:00Z"), or a time before
    /// now ("-1h", "-15m", "-7d", ISO 8601 "PT1H", "P1D"; no months or years). The answer
    /// states the absolute range.
    #[schemars(example = &"-1h")]
    pub from: String,
    /// End of the range (exclusive), not in the future: an RFC 3339 instant, "now", or a
    /// time before now as for `from`, e.g. "2026-11-29T09:00:00Z". Default: now (pinned by
    /// the first page's `next_cursor`).
    #[schemars(example = &"2026-11-29T09:00:00Z")]
    pub to: Option<String>,
    /// Summarise per bucket of this width instead of returning raw points: a count and
    /// s, m, h or d, e.g. "5m", "1h". Default: raw points (ranges over 7 days need a bucket).
    #[schemars(regex(pattern = BUCKET_PATTERN), example = &"5m")]
    pub bucket: Option<String>,
    /// Most points or buckets in this page, 1-5000, e.g. 500. Default 500.
    #[schemars(range(min = 1, max = 5000), example = 500, extend("default" = GetSensorHistoryArgs::DEFAULT_LIMIT))]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page. Default: first page.
    #[schemars(length(min = 1, max = 200), example = &"eyJ0IjoxNzY0MDAwMDAwMDAwfQ")]
    pub cursor: Option<String>,
}

impl GetSensorHistoryArgs {
    /// The page size when `limit` is not given (points).
    pub const DEFAULT_LIMIT: u32 = 500;
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HistoryPoint {
    /// RFC 3339 instant.
    pub t: String,
    pub value: Option<Value>,
    pub quality: Quality,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HistoryBucket {
    /// Start of the bucket (RFC 3339).
    pub start: String,
    /// Points stored in the bucket, those without a value (bad quality) included; `min`,
    /// `max`, `avg`, `first` and `last` are of the points with a value.
    pub count: u64,
    /// The smallest value, of the sensor's type (an integer sensor's exact).
    pub min: Option<Value>,
    pub max: Option<Value>,
    /// The mean, as a number (beyond 2^53 rounded, as every float is).
    pub avg: Option<f64>,
    pub first: Option<Value>,
    pub last: Option<Value>,
}

/// A stretch longer than a few poll intervals without stored points.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Gap {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HistoryData {
    pub sensor_id: String,
    pub unit: String,
    /// The range asked for.
    pub from: String,
    pub to: String,
    /// The bucket width, or null for raw points.
    pub bucket: Option<String>,
    /// Raw points (empty when `bucket` is set).
    pub points: Vec<HistoryPoint>,
    /// Buckets (empty when `bucket` is null).
    pub buckets: Vec<HistoryBucket>,
    /// First and last stored sample in the range; null when there is none.
    pub first_sample: Option<String>,
    pub last_sample: Option<String>,
    pub gaps: Vec<Gap>,
    /// False when more pages follow.
    pub complete: bool,
    pub next_cursor: Option<String>,
}

// ---------------------------------------------------------------- work orders

// The kinds, priorities and states are the work-order module's own; the contract shows
// them as they are.
pub use crate::work_orders::model::{Priority, WorkOrderStatus, WorkOrderType};

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkOrderArgs {
    /// The sensor whose equipment needs work, e.g. "A_LINE1_003".
    #[schemars(regex(pattern = SENSOR_ID_PATTERN), example = &"A_LINE1_003")]
    pub sensor_id: String,
    /// What kind of work: inspection, calibration, repair, replacement or cleaning, e.g. "inspection".
    #[serde(rename = "type")]
    #[schemars(example = &"inspection")]
    pub work_type: WorkOrderType,
    /// low, medium, high or urgent, e.g. "medium".
    #[schemars(example = &"medium")]
    pub priority: Priority,
    /// 10-500 characters: what was observed and what should be done, e.g.
    /// "Discharge pressure 2 bar above range for 3 h; inspect pump P-042 for blockage."
    #[schemars(length(min = 10, max = 500), example = &"Discharge pressure 2 bar above range for 3 h; inspect pump P-042 for blockage.")]
    pub summary: String,
    /// A key you choose for this request, 8-128 characters of A-Z a-z 0-9 . _ : -, e.g.
    /// "report-2026-11-29-p042". Send the same key when retrying the same request; if a
    /// call timed out, get_work_order with this key tells whether it took effect.
    #[schemars(regex(pattern = IDEMPOTENCY_KEY_PATTERN), example = &"report-2026-11-29-p042")]
    pub idempotency_key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Transition {
    /// Null for the creation.
    pub from: Option<WorkOrderStatus>,
    pub to: WorkOrderStatus,
    pub at: String,
    /// Who made the change: "agent", an operator's name, or "system".
    pub by: String,
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Delivery {
    /// pending, delivered or failing; not_configured when no webhook is set (nothing will be
    /// delivered).
    pub state: String,
    pub attempts: u32,
    pub last_attempt_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WorkOrder {
    /// `WO-000001`, never reused.
    pub id: String,
    pub sensor_id: String,
    pub equipment: Option<String>,
    #[serde(rename = "type")]
    pub work_type: WorkOrderType,
    pub priority: Priority,
    pub summary: String,
    pub status: WorkOrderStatus,
    /// The sensor's latest reading when the order was created, if one was known.
    pub evidence: Option<Reading>,
    pub created_by: String,
    pub created_at: String,
    pub updated_at: String,
    pub history: Vec<Transition>,
    /// Delivery to the maintenance system, once approved.
    pub delivery: Option<Delivery>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CreateWorkOrderData {
    pub work_order: WorkOrder,
    /// False when an existing work order was returned instead of a new one.
    pub created: bool,
    /// The open work order this request duplicates, when one exists.
    pub duplicate_of: Option<String>,
    pub status: WorkOrderStatus,
    pub approval_required: bool,
    /// Check the order with get_work_order after this long; do not create it again.
    pub next_check_after_seconds: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetWorkOrderArgs {
    /// The work order, e.g. "WO-000042". Give this or `idempotency_key`, not both.
    /// Default: none (then `idempotency_key` is needed).
    #[schemars(regex(pattern = WORK_ORDER_ID_PATTERN), example = &"WO-000042")]
    pub work_order_id: Option<String>,
    /// The `idempotency_key` of a create_work_order call, e.g. after that call timed out:
    /// the order it created, or WORK_ORDER_NOT_FOUND when it created none (then it is safe
    /// to send it again). Default: none (then `work_order_id` is needed).
    #[schemars(regex(pattern = IDEMPOTENCY_KEY_PATTERN), example = &"report-2026-11-29-p042")]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WorkOrderData {
    pub work_order: WorkOrder,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListWorkOrdersArgs {
    /// Only work orders in this state, e.g. "pending_approval". Default: every state.
    #[schemars(example = &"pending_approval")]
    pub status: Option<WorkOrderStatus>,
    /// Only work orders for this sensor, e.g. "A_LINE1_003". Default: every sensor.
    #[schemars(regex(pattern = SENSOR_ID_PATTERN), example = &"A_LINE1_003")]
    pub sensor_id: Option<String>,
    /// Only work orders created at or after this instant: RFC 3339 ("2026-11-01T00:00:00Z")
    /// or a time before now ("-24h", "-7d", "P1D"). Default: no lower bound.
    #[schemars(example = &"2026-11-01T00:00:00Z")]
    pub since: Option<String>,
    /// Most work orders in this page, 1-500, e.g. 50. Default 50.
    #[schemars(range(min = 1, max = 500), example = 50, extend("default" = ListWorkOrdersArgs::DEFAULT_LIMIT))]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page. Default: first page.
    #[schemars(length(min = 1, max = 200), example = &"eyJpZCI6Ik")]
    pub cursor: Option<String>,
}

impl ListWorkOrdersArgs {
    /// The page size when `limit` is not given (orders).
    pub const DEFAULT_LIMIT: u32 = 50;
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListWorkOrdersData {
    pub work_orders: Vec<WorkOrder>,
    pub total: usize,
    pub complete: bool,
    pub next_cursor: Option<String>,
    /// The `since` applied, as an absolute instant (RFC 3339), when one was given; a
    /// relative one (`-1h`) is pinned by `next_cursor` for the following pages.
    pub since: Option<String>,
}
