//! The device file format as types, for `schemas/device-file.json` (editor completion
//! and documentation). The loader in `load/` is the authority; a test checks that every
//! demo device file validates against this schema.

use schemars::JsonSchema;
use serde::Deserialize;

use super::bounds;
use super::model::{DataType, OpcUaMode, Parity, Protocol, RegisterTable, WordOrder};
use crate::ids::{DEVICE_ID_PATTERN, PLANT_PATTERN, SENSOR_ID_PATTERN, ZONE_PATTERN};

/// One field device (a PLC, a gateway, an OPC UA server) and its sensors.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "fieldgate device file")]
pub struct DeviceFile {
    /// Device ID, unique across all files, e.g. "a-line1-plc".
    #[schemars(regex(pattern = DEVICE_ID_PATTERN))]
    pub id: String,
    /// Must equal the PLANT part of every sensor ID in this file.
    #[schemars(regex(pattern = PLANT_PATTERN))]
    pub plant: String,
    /// Must equal the ZONE part of every sensor ID in this file.
    #[schemars(regex(pattern = ZONE_PATTERN))]
    pub zone: String,
    pub description: String,
    pub protocol: Protocol,
    /// host:port; a serial device path for modbus-rtu; opc.tcp://host:port/path for opcua.
    pub endpoint: String,
    /// Modbus unit (slave) ID. Default 1.
    #[schemars(range(min = bounds::UNIT_ID.min, max = bounds::UNIT_ID.max))]
    pub unit_id: Option<u8>,
    /// Per-request timeout. Default 1000.
    #[schemars(range(min = bounds::TIMEOUT_MS.min, max = bounds::TIMEOUT_MS.max))]
    pub timeout_ms: Option<u32>,
    /// Polling period for history; 0 = not polled. Default 1000.
    #[schemars(range(min = bounds::POLL_INTERVAL_MS.min, max = bounds::POLL_INTERVAL_MS.max))]
    pub poll_interval_ms: Option<u32>,
    /// Cap for coalesced reads. Default 125.
    #[schemars(range(min = bounds::MAX_REGISTERS_PER_READ.min, max = bounds::MAX_REGISTERS_PER_READ.max))]
    pub max_registers_per_read: Option<u16>,
    /// Registers a coalesced read may skip over. Default 8.
    #[schemars(range(min = bounds::MAX_GAP.min, max = bounds::MAX_GAP.max))]
    pub max_gap: Option<u16>,
    /// Default word order of multi-register values. Default ABCD.
    pub word_order: Option<WordOrder>,
    /// modbus-rtu only.
    pub serial: Option<Serial>,
    /// opcua only.
    pub opcua: Option<OpcUa>,
    /// This device's circuit breaker; unset keys use the service configuration's [breaker].
    pub breaker: Option<Breaker>,
    #[serde(default)]
    pub sensors: Vec<SensorEntry>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Serial {
    #[schemars(range(min = bounds::BAUD_RATE.min, max = bounds::BAUD_RATE.max))]
    pub baud_rate: Option<u32>,
    pub parity: Option<Parity>,
    #[schemars(range(min = bounds::DATA_BITS.min, max = bounds::DATA_BITS.max))]
    pub data_bits: Option<u8>,
    #[schemars(range(min = bounds::STOP_BITS.min, max = bounds::STOP_BITS.max))]
    pub stop_bits: Option<u8>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpcUa {
    pub security_policy: Option<SecurityPolicy>,
    pub security_mode: Option<SecurityMode>,
    /// Name of the environment variable holding the user name.
    #[schemars(regex(pattern = "^[A-Z0-9_]+$"))]
    pub username_env: Option<String>,
    /// Name of the environment variable holding the password.
    #[schemars(regex(pattern = "^[A-Z0-9_]+$"))]
    pub password_env: Option<String>,
    pub mode: Option<OpcUaMode>,
    /// Follow the server's own conditions (OPC UA Alarms & Conditions) as alarms
    /// (docs/alarms.md). Default false.
    pub alarms: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
pub enum SecurityPolicy {
    None,
    Basic256Sha256,
    #[serde(rename = "Aes128_Sha256_RsaOaep")]
    Aes128Sha256RsaOaep,
    #[serde(rename = "Aes256_Sha256_RsaPss")]
    Aes256Sha256RsaPss,
}

#[derive(Deserialize, JsonSchema)]
pub enum SecurityMode {
    None,
    Sign,
    SignAndEncrypt,
}

/// One sensor. Modbus sensors use table/address/type; OPC UA sensors use node_id.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SensorEntry {
    /// PLANT_ZONE_NNN, unique across all files, e.g. "A_LINE1_042".
    #[schemars(regex(pattern = SENSOR_ID_PATTERN))]
    pub id: String,
    pub description: String,
    /// One lower-case word used for filtering: temperature, pressure, flow, level, ...
    #[schemars(regex(pattern = "^[a-z][a-z0-9_]{0,31}$"))]
    pub kind: String,
    /// Engineering unit after scaling.
    pub unit: String,
    /// Asset tag of the equipment the sensor belongs to.
    pub equipment: Option<String>,
    pub table: Option<RegisterTable>,
    /// 0-based protocol address (not the 4xxxx notation).
    #[schemars(range(min = bounds::ADDRESS.min, max = bounds::ADDRESS.max))]
    pub address: Option<u16>,
    #[serde(rename = "type")]
    pub data_type: Option<DataType>,
    /// Overrides the device's word order.
    pub word_order: Option<WordOrder>,
    /// Read one bit (0-15) of a register as bool.
    #[schemars(range(min = bounds::BIT.min, max = bounds::BIT.max))]
    pub bit: Option<u8>,
    /// Registers, for type = "string".
    #[schemars(range(min = bounds::LENGTH.min, max = bounds::LENGTH.max))]
    pub length: Option<u16>,
    /// normalized = raw * scale + offset. Default 1.
    pub scale: Option<f64>,
    /// Default 0.
    pub offset: Option<f64>,
    /// OPC UA node, e.g. "ns=2;s=Line1.Pump42.Pressure".
    pub node_id: Option<String>,
    /// Normal operating range, normalized units.
    pub range: Option<Range>,
    /// History stores a new point only when the value moves this much.
    #[schemars(range(min = 0.0))]
    pub deadband: Option<f64>,
    /// Limit alarms on this sensor (docs/device-files.md, "Alarms").
    pub alarms: Option<Vec<AlarmEntry>>,
}

/// A limit alarm; its ID is `SENSOR_ID.NAME`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AlarmEntry {
    /// Unique per sensor, e.g. "HI".
    #[schemars(regex(pattern = "^[A-Z0-9_]{1,16}$"))]
    pub name: String,
    #[serde(rename = "type")]
    pub kind: AlarmType,
    /// In the sensor's units; high and low alarms only. Activates at >= (<= for low).
    pub limit: Option<f64>,
    /// Clears only below limit - deadband (above limit + deadband for low). Default 0.
    #[schemars(range(min = 0.0))]
    pub deadband: Option<f64>,
    /// Beyond the limit this long (sample time) before it activates. Default 0.
    #[schemars(range(min = 0, max = 86400))]
    pub on_delay_s: Option<u32>,
    /// Back inside this long before it clears. Default 0.
    #[schemars(range(min = 0, max = 86400))]
    pub off_delay_s: Option<u32>,
    /// off_normal only: the boolean's normal state. Default false.
    pub normal: Option<bool>,
    pub priority: AlarmPriorityName,
    /// What an operator reads when it activates.
    pub message: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlarmType {
    High,
    HighHigh,
    Low,
    LowLow,
    OffNormal,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlarmPriorityName {
    Low,
    Medium,
    High,
    Critical,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

/// A device's own circuit-breaker settings.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Breaker {
    /// Consecutive transient failures that open the breaker.
    #[schemars(range(min = bounds::FAILURE_THRESHOLD.min, max = bounds::FAILURE_THRESHOLD.max))]
    pub failure_threshold: Option<u32>,
    /// Share of failures in the window (percent) that opens it.
    #[schemars(range(min = bounds::FAILURE_RATE_PERCENT.min, max = bounds::FAILURE_RATE_PERCENT.max))]
    pub failure_rate_percent: Option<u32>,
    #[schemars(range(min = bounds::WINDOW_SIZE.min, max = bounds::WINDOW_SIZE.max))]
    pub window_size: Option<u32>,
    #[schemars(range(min = bounds::MIN_CALLS.min, max = bounds::MIN_CALLS.max))]
    pub min_calls: Option<u32>,
    /// First open period; doubles on each reopening.
    #[schemars(range(min = bounds::OPEN_MS.min, max = bounds::OPEN_MS.max))]
    pub open_ms: Option<u64>,
    #[schemars(range(min = bounds::MAX_OPEN_MS.min, max = bounds::MAX_OPEN_MS.max))]
    pub max_open_ms: Option<u64>,
}
