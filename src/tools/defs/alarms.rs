//! `list_alarms`, `get_alarm_history`, `get_alarm_summary`: arguments and results (a part
//! of `defs.rs`, where the other tools' are). The states, transitions and priorities are
//! the alarm journal's own; the contract shows them as they are.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::alarms::summary::Summary as AlarmFigures;
use crate::ids::{PLANT_PATTERN, SENSOR_ID_PATTERN, ZONE_PATTERN};
pub use crate::registry::AlarmPriority;
pub use crate::store::alarm_journal::{AlarmState, EventKind as AlarmEventKind};

/// Alarm IDs: the sensor's ID, a dot, the alarm's name.
pub const ALARM_ID_PATTERN: &str =
    "^([A-Z][A-Z0-9]{0,7}_[A-Z][A-Z0-9]{0,15}_[0-9]{3}|[a-z0-9-]{1,64})[.][A-Z0-9_]{1,16}$";

/// A sensor's alarm state, in its readings: its most pressing alarm (active and
/// unacknowledged first, then active, then returned unacknowledged; among equals the
/// highest priority); shelved and out-of-service alarms are left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReadingAlarm {
    /// `normal` when none of the sensor's alarms stands.
    pub state: AlarmState,
    /// The alarm in that state; null when normal.
    pub alarm_id: Option<String>,
    pub priority: Option<AlarmPriority>,
}

/// Which alarms `list_alarms` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlarmStateFilter {
    /// Active, acknowledged or not.
    Active,
    /// Waiting for an operator: active-unacknowledged or returned-unacknowledged.
    Unacknowledged,
    /// Anything but normal, shelved or out of service: what stands now.
    NotNormal,
    Normal,
    ActiveUnacknowledged,
    ActiveAcknowledged,
    ReturnedUnacknowledged,
    Shelved,
    OutOfService,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListAlarmsArgs {
    /// Only alarms in this state, e.g. "active" or "unacknowledged". Default: every alarm.
    #[schemars(example = &"active")]
    pub state: Option<AlarmStateFilter>,
    /// Only alarms of this priority (low, medium, high, critical), e.g. "high". Default: all.
    #[schemars(example = &"high")]
    pub priority: Option<AlarmPriority>,
    /// Only alarms of sensors of this plant, e.g. "B". Default: all plants.
    #[schemars(regex(pattern = PLANT_PATTERN), example = &"B")]
    pub plant: Option<String>,
    /// Only alarms of sensors of this zone, e.g. "OVEN2". Default: all zones.
    #[schemars(regex(pattern = ZONE_PATTERN), example = &"OVEN2")]
    pub zone: Option<String>,
    /// Only the alarms of this sensor, e.g. "B_OVEN2_001". Default: every sensor.
    #[schemars(regex(pattern = SENSOR_ID_PATTERN), example = &"B_OVEN2_001")]
    pub sensor_id: Option<String>,
    /// Most alarms in this page, 1-1000, e.g. 100. Default 100.
    #[schemars(range(min = 1, max = 1000), example = 100, extend("default" = ListAlarmsArgs::DEFAULT_LIMIT))]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page, to continue the same listing. Default: first page.
    #[schemars(length(min = 1, max = 200), example = &"eyJhIjoiQl9PVkVOMl8wMDEuSEkifQ")]
    pub cursor: Option<String>,
}

impl ListAlarmsArgs {
    pub const DEFAULT_LIMIT: u32 = 100;
}

/// One configured alarm and its instance now.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlarmInfo {
    /// `SENSOR_ID.NAME`, e.g. "B_OVEN2_001.HI"; a device's own alarm is `DEVICE_ID.NAME`,
    /// e.g. "b-oven2-opcua.COMM".
    pub alarm_id: String,
    /// The sensor it watches; null for the device's own (communication, a server condition
    /// on no configured sensor).
    pub sensor_id: Option<String>,
    pub device_id: String,
    /// Fleet hub only: the edge node that evaluates it, as "group/node" (act on it there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<String>,
    /// high, high_high, low, low_low, off_normal (a device file's limit alarms),
    /// communication (the device answers nothing) or condition (the OPC UA server's own).
    #[serde(rename = "type")]
    pub kind: String,
    pub priority: AlarmPriority,
    /// What the operator reads.
    pub message: String,
    /// In the sensor's unit; null for off_normal, communication and condition alarms.
    pub limit: Option<f64>,
    pub deadband: f64,
    pub unit: String,
    pub state: AlarmState,
    /// The current (or last) activation's event ID; 0 before the first.
    pub event_id: u64,
    /// When the state last changed (RFC 3339); null before the first activation.
    pub since: Option<String>,
    pub activated_at: Option<String>,
    /// The value that activated it (a boolean as 0 or 1).
    pub value: Option<f64>,
    pub acknowledged_by: Option<String>,
    pub acknowledged_at: Option<String>,
    /// Set while shelved: until when, by whom.
    pub shelved_until: Option<String>,
    pub shelved_by: Option<String>,
    pub out_of_service: bool,
}

/// How many alarms stand, over all of them (not only this page).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct AlarmCounts {
    pub configured: usize,
    pub active: usize,
    pub unacknowledged: usize,
    pub shelved: usize,
    pub out_of_service: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListAlarmsData {
    pub alarms: Vec<AlarmInfo>,
    /// Alarms matching the filters, over all pages.
    pub total: usize,
    pub counts: AlarmCounts,
    /// False when more pages follow.
    pub complete: bool,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetAlarmHistoryArgs {
    /// Start of the range: an RFC 3339 instant ("2026-11-29T06:00:00Z"), or a time before
    /// now ("-8h", "-15m", "-7d", ISO 8601 "PT8H", "P1D"). The answer states the absolute
    /// range.
    #[schemars(example = &"-8h")]
    pub from: String,
    /// End of the range (exclusive), not in the future: an RFC 3339 instant, "now", or a
    /// time before now. Default: now (pinned by the first page's `next_cursor`).
    #[schemars(example = &"2026-11-29T14:00:00Z")]
    pub to: Option<String>,
    /// Only this alarm's transitions, e.g. "B_OVEN2_001.HI". Default: every alarm.
    #[schemars(regex(pattern = ALARM_ID_PATTERN), example = &"B_OVEN2_001.HI")]
    pub alarm_id: Option<String>,
    /// Only the transitions of this sensor's alarms, e.g. "B_OVEN2_001". Default: every sensor.
    #[schemars(regex(pattern = SENSOR_ID_PATTERN), example = &"B_OVEN2_001")]
    pub sensor_id: Option<String>,
    /// Most transitions in this page, 1-5000, e.g. 500. Default 500.
    #[schemars(range(min = 1, max = 5000), example = 500, extend("default" = GetAlarmHistoryArgs::DEFAULT_LIMIT))]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page. Default: first page.
    #[schemars(length(min = 1, max = 200), example = &"eyJ0IjoxNzY0MDAwMDAwMDAwfQ")]
    pub cursor: Option<String>,
}

impl GetAlarmHistoryArgs {
    pub const DEFAULT_LIMIT: u32 = 500;
}

/// One transition of the journal.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlarmEvent {
    pub alarm_id: String,
    /// The activation it belongs to.
    pub event_id: u64,
    pub kind: AlarmEventKind,
    /// When (RFC 3339): sample time for activations and clearings, the act's time for an
    /// operator's.
    pub at: String,
    /// The value that activated or cleared it (a boolean as 0 or 1).
    pub value: Option<f64>,
    /// The operator, for an operator's act; null for the engine's (and for a shelving that
    /// ended on time).
    pub by: Option<String>,
    pub comment: Option<String>,
    /// Activations: the alarm's priority.
    pub priority: Option<AlarmPriority>,
    /// When the event this transition belongs to activated.
    pub activated_at: Option<String>,
    /// Shelving: until when.
    pub shelved_until: Option<String>,
    /// An activation while shelved: journaled, not shown to operators.
    pub shelved: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlarmHistoryData {
    /// The range asked for.
    pub from: String,
    pub to: String,
    /// In time order.
    pub events: Vec<AlarmEvent>,
    pub complete: bool,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetAlarmSummaryArgs {
    /// Start of the range, as for get_alarm_history, e.g. "-8h" (a shift). At most 31 days
    /// before `to`.
    #[schemars(example = &"-8h")]
    pub from: String,
    /// End of the range (exclusive). Default: now.
    #[schemars(example = &"now")]
    pub to: Option<String>,
    /// How many alarms the top lists (most frequent, chattering) hold, 1-100. Default 10.
    #[schemars(range(min = 1, max = 100), example = 10, extend("default" = 10))]
    pub top: Option<u32>,
    /// More activations than this in a 10-minute period is a flood, 1-1000. Default 10 (ISA-18.2).
    #[schemars(range(min = 1, max = 1000), example = 10, extend("default" = 10))]
    pub flood_threshold: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlarmSummaryData {
    /// The range the figures are over.
    pub from: String,
    pub to: String,
    /// Alarms configured now.
    pub alarms_configured: usize,
    #[serde(flatten)]
    pub figures: AlarmFigures,
}

/// An operator's act's answer: the alarm as it is after it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AlarmData {
    pub alarm: AlarmInfo,
}
