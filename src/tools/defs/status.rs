//! `get_device_status` and the operator's probe: arguments and results (a part of
//! `defs.rs`, where the other tools' are).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::DEVICE_ID_PATTERN;

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetDeviceStatusArgs {
    /// One device, e.g. "a-line1-plc". Default: every device.
    #[schemars(regex(pattern = DEVICE_ID_PATTERN), example = &"a-line1-plc")]
    pub device_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceState {
    /// Never heard from yet (no read or probe has reached it).
    Unknown,
    Up,
    Degraded,
    Down,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BreakerStatus {
    pub state: BreakerState,
    pub consecutive_failures: u32,
    /// Time until a probe is allowed, when open.
    pub retry_after_ms: Option<u64>,
    /// When fieldgate probes the device itself next (RFC 3339): while the breaker is open,
    /// at the end of the open period; `null` when no probe is planned.
    pub next_probe_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LastError {
    pub code: crate::tools::envelope::ErrorCode,
    pub at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Calls the figures are taken over.
    pub samples: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DeviceStatus {
    pub device_id: String,
    pub description: String,
    pub protocol: String,
    pub endpoint: String,
    pub state: DeviceState,
    pub breaker: BreakerStatus,
    pub last_success: Option<String>,
    pub last_error: Option<LastError>,
    /// While the device is down: the first failure since its last success (RFC 3339).
    pub down_since: Option<String>,
    /// When the state was last confirmed by the device itself: its last answer while up,
    /// its last failure while down or degraded; null while unknown.
    pub confirmed_at: Option<String>,
    /// Reads the device failed (no reply, refused or dropped connection, malformed reply,
    /// busy) since fieldgate started; one stalled request is one failure.
    pub failures: u64,
    pub latency: Option<Latency>,
    pub sensors: usize,
    /// Fleet hub only: the edge node the device comes from, and what it last said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<EdgeStatus>,
}

/// An edge node and the device at it, as the fleet hub sees them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EdgeStatus {
    /// The edge node, "group/node".
    pub edge: String,
    /// `online` or `offline`.
    pub edge_state: String,
    /// Since when (RFC 3339).
    pub edge_since: String,
    /// Why offline: `death` (its NDEATH), `broker_lost` (the hub lost the broker),
    /// `not_born` (not born since the hub started); null while online.
    pub edge_offline_reason: Option<String>,
    /// The device at its edge node: `online` or `offline`.
    pub device_state: String,
    pub device_since: String,
    /// The edge node's last NBIRTH (its own time).
    pub last_birth: Option<String>,
    /// Rebirths the hub asked of the edge node.
    pub rebirths_requested: u64,
    /// Messages received from the edge node.
    pub messages: u64,
    /// Gaps in its `seq` that lasted the reorder timeout.
    pub gaps: u64,
    /// Messages dropped: repeats, undecodable, or of a device or alias not born.
    pub dropped: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DeviceStatusData {
    pub devices: Vec<DeviceStatus>,
    /// fieldgate's own storage (history and work orders) on this box.
    pub storage: StorageStatus,
    /// The Sparkplug B link to the MQTT broker, when `[mqtt]` is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub northbound: Option<NorthboundStatus>,
    /// Fleet hub only (and only without `device_id`): its link to the broker and every
    /// edge node born since it started, also those with no device served (none born, or
    /// all in conflict), and a summary of nodes heard from but never born.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<HubStatus>,
}

/// The fleet hub's link to the broker and its edge nodes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HubStatus {
    /// The broker used now (or last tried), e.g. "mqtt://broker.plant:1883".
    pub broker: String,
    /// `online` (its STATE says online: values flow) or `down` (every edge node shows
    /// offline with reason `broker_lost`).
    pub link: String,
    /// Why the link is down, while it is.
    pub link_error: Option<String>,
    /// Every edge node born since the hub started (online or not).
    pub edge_nodes: Vec<EdgeNodeStatus>,
    /// Edge nodes heard from (data, a death, a birth it could not take) but never born.
    pub never_born: NeverBornStatus,
}

/// Edge nodes the hub heard from but that were never born since it started: an edge it
/// asked for a rebirth that has not answered yet, a client publishing on the namespace
/// that is no edge node, a flood of made-up topics. The hub keeps at most 1,000 (each
/// forgotten after 10 minutes of silence) and names the last heard.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NeverBornStatus {
    /// Kept now.
    pub edge_nodes: usize,
    /// Their messages (dropped: nothing is guessed without a birth).
    pub messages: u64,
    /// Messages of nodes beyond the 1,000 kept (counted, not kept).
    pub not_kept: u64,
    /// Births of edge nodes beyond the 10,000 a hub takes (each such node stays never
    /// born until the hub restarts: shard by group, docs/hub.md).
    pub births_refused: u64,
    /// The last heard, "group/node", at most 10.
    pub recent: Vec<String>,
}

/// One edge node as the fleet hub sees it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EdgeNodeStatus {
    /// "group/node".
    pub edge: String,
    /// `online` or `offline`.
    pub state: String,
    /// Since when (RFC 3339).
    pub since: String,
    /// Why offline: `death`, `broker_lost` or `not_born`; null while online.
    pub offline_reason: Option<String>,
    /// Its last NBIRTH (its own time).
    pub last_birth: Option<String>,
    /// Devices it announced (born now or in an earlier life; served or not).
    pub devices: usize,
    pub rebirths_requested: u64,
    pub messages: u64,
    pub gaps: u64,
    pub dropped: u64,
}

/// The Sparkplug B edge node's link and counters since fieldgate started.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NorthboundStatus {
    /// The broker used now (or last tried), e.g. "mqtt://broker.plant:1883".
    pub broker: String,
    /// `online` (births sent, data flowing), `connected` (waiting for the primary host
    /// application to be online; data is buffered) or `down` (data is buffered).
    pub link: String,
    /// Why the link is down, while it is, e.g. "the broker refused the user name or
    /// password" (data waits in the buffer meanwhile).
    pub link_error: Option<String>,
    pub messages_sent: u64,
    pub metrics_sent: u64,
    /// Metric values waiting in the store-and-forward buffer.
    pub buffered: u64,
    /// Buffered values dropped (oldest first) because the buffer was full or too old.
    pub dropped: u64,
    /// Commands from the broker refused (fieldgate never writes from the broker).
    pub commands_refused: u64,
}

/// The state of fieldgate's storage: readings keep working while it fails, but history
/// waits in memory and work orders cannot be created.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct StorageStatus {
    pub state: StorageState,
    /// What is wrong, per store, e.g. "history: the disk reserve is reached".
    pub problems: Vec<String>,
    /// Free and total bytes of the data directory's filesystem, when known.
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// With `history.backend = "postgres"`: how writing history to the database goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_database: Option<HistoryDatabaseStatus>,
}

/// History kept in PostgreSQL: chunks written there since start, shipments that failed,
/// and chunks waiting in the data directory (the database down or refusing).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HistoryDatabaseStatus {
    pub chunks_written: u64,
    pub failures: u64,
    pub chunks_waiting: u64,
}

/// Whether every store can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StorageState {
    /// Every store writes.
    Ok,
    /// A store cannot write (see `problems`).
    Failing,
}

/// How an operator's probe went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeResult {
    /// The device answered: its breaker is closed and blocked calls are lifted.
    Answered,
    /// The device did not answer well; `error` says how.
    Failed,
    /// Another probe of the device is running; ask again after `retry_after_ms`.
    NotNow,
}

/// `POST /v1/devices/{id}/probe`: the outcome and the device's state after it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ProbeData {
    pub outcome: ProbeResult,
    pub error: Option<LastError>,
    pub retry_after_ms: Option<u64>,
    pub device: DeviceStatus,
}
