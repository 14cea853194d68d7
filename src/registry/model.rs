//! The validated model of the plant: devices and sensors as the rest of the crate sees them.

use std::time::Duration;

use serde::Serialize;

use crate::ids::{DeviceId, SensorId};

/// How fieldgate talks to a device.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum Protocol {
    ModbusTcp,
    ModbusRtu,
    ModbusRtuOverTcp,
    Opcua,
    // A device the fleet hub knows only from an edge node's births, which did not say how
    // the edge reaches it. Never in a device file: not parsed, not in the schema, not
    // among the names a problem lists (a doc comment here would reshape the schema).
    #[serde(skip_deserializing)]
    #[schemars(skip)]
    #[strum(disabled)]
    Sparkplug,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::ModbusTcp => "modbus-tcp",
            Protocol::ModbusRtu => "modbus-rtu",
            Protocol::ModbusRtuOverTcp => "modbus-rtu-over-tcp",
            Protocol::Opcua => "opcua",
            Protocol::Sparkplug => "sparkplug",
        }
    }
}

/// The protocols a device file names (all but the hub's `Sparkplug`).
impl strum::VariantNames for Protocol {
    const VARIANTS: &'static [&'static str] = &["modbus-tcp", "modbus-rtu", "modbus-rtu-over-tcp", "opcua"];
}

/// Where a device is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `host:port` (Modbus TCP and RTU-over-TCP).
    Tcp { host: String, port: u16 },
    /// A serial device path (Modbus RTU).
    Serial { path: String },
    /// `opc.tcp://host:port/path`.
    OpcUa { url: String },
    /// Through a Sparkplug edge node (the fleet hub's devices): its group and node ID.
    Edge { group: String, node: String },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp { host, port } => write!(f, "{host}:{port}"),
            Endpoint::Serial { path } => f.write_str(path),
            Endpoint::OpcUa { url } => f.write_str(url),
            Endpoint::Edge { group, node } => write!(f, "edge node {group}/{node}"),
        }
    }
}

/// Register byte/word order of multi-register values (see docs/device-files.md).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::VariantNames,
)]
pub enum WordOrder {
    ABCD,
    BADC,
    CDAB,
    DCBA,
}

impl WordOrder {
    /// Registers are sent least significant first.
    pub fn swaps_words(self) -> bool {
        matches!(self, WordOrder::CDAB | WordOrder::DCBA)
    }

    /// The two bytes inside each register are swapped.
    pub fn swaps_bytes(self) -> bool {
        matches!(self, WordOrder::BADC | WordOrder::DCBA)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialSettings {
    pub baud_rate: u32,
    pub parity: Parity,
    pub data_bits: u8,
    pub stop_bits: u8,
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Parity {
    None,
    Even,
    Odd,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpcUaSettings {
    pub security_policy: String,
    pub security_mode: String,
    pub username_env: Option<String>,
    pub password_env: Option<String>,
    pub mode: OpcUaMode,
    /// Follow the server's own conditions (Alarms & Conditions) as alarms.
    pub alarms: bool,
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::EnumString,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum OpcUaMode {
    Poll,
    Subscribe,
}

/// A device's own circuit-breaker settings (`[breaker]`); unset keys use the service's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BreakerOverrides {
    pub failure_threshold: Option<u32>,
    pub failure_rate_percent: Option<u32>,
    pub window_size: Option<u32>,
    pub min_calls: Option<u32>,
    pub open_ms: Option<u64>,
    pub max_open_ms: Option<u64>,
}

/// A field device as declared in one `devices/*.toml` file.
#[derive(Debug, Clone)]
pub struct Device {
    pub id: DeviceId,
    pub plant: String,
    pub zone: String,
    pub description: String,
    pub protocol: Protocol,
    pub endpoint: Endpoint,
    pub unit_id: u8,
    pub timeout: Duration,
    /// `None` when the device is not polled.
    pub poll_interval: Option<Duration>,
    pub max_registers_per_read: u16,
    pub max_gap: u16,
    pub word_order: WordOrder,
    pub serial: Option<SerialSettings>,
    pub opcua: Option<OpcUaSettings>,
    pub breaker: Option<BreakerOverrides>,
    /// The file the device came from, for messages.
    pub source: String,
}

/// A Modbus table.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::Display,
    strum::EnumString,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum RegisterTable {
    Coil,
    Discrete,
    Input,
    Holding,
}

impl RegisterTable {
    /// Coils and discrete inputs hold bits, the others 16-bit registers.
    pub fn is_bits(self) -> bool {
        matches!(self, RegisterTable::Coil | RegisterTable::Discrete)
    }
}

/// The type a sensor's registers are decoded as.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum DataType {
    Bool,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F32,
    F64,
    String,
}

impl DataType {
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Registers a value of this type occupies (strings: their `length`).
    pub fn registers(self) -> Option<u16> {
        match self {
            DataType::Bool | DataType::U16 | DataType::I16 => Some(1),
            DataType::U32 | DataType::I32 | DataType::F32 => Some(2),
            DataType::U64 | DataType::I64 | DataType::F64 => Some(4),
            DataType::String => None,
        }
    }
}

/// Where a Modbus sensor's value lives and how it is decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct ModbusPoint {
    pub table: RegisterTable,
    pub address: u16,
    pub data_type: DataType,
    pub word_order: WordOrder,
    /// A single bit of a register, read as bool.
    pub bit: Option<u8>,
    /// Registers (or bits) the value occupies.
    pub count: u16,
    pub scale: f64,
    pub offset: f64,
}

/// Where a sensor's value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum SensorSource {
    Modbus(ModbusPoint),
    OpcUa {
        node_id: String,
    },
    /// A metric of an edge node, as the fleet hub serves it (values arrive in the edge's
    /// units, scale and offset applied there).
    Edge(EdgePoint),
}

/// Where the fleet hub finds a sensor's metric, and what the edge's birth said of it.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgePoint {
    /// The metric's place in the hub's fleet (edge node, device, metric), as the hub
    /// numbers them.
    pub edge: usize,
    pub device: usize,
    pub metric: usize,
    /// Its type in the edge's device file, when the edge said (Modbus).
    pub data_type: Option<DataType>,
    /// Whether the edge keeps its history.
    pub history: bool,
    /// The longest a healthy edge goes without sending it.
    pub expected_interval: Option<Duration>,
}

/// A sensor's place in its registry: `Registry::sensors()[sensor]`, on the device
/// `Registry::devices()[device]`. Dense keys for per-sensor state (the reading cache) and
/// for telling devices apart without comparing their IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub sensor: usize,
    pub device: usize,
}

impl Place {
    /// Not in a registry (yet): no per-sensor state is found for it.
    pub const UNPLACED: Place = Place { sensor: usize::MAX, device: usize::MAX };
}

/// The normal operating range of a sensor, in normalized units.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct NormalRange {
    pub min: f64,
    pub max: f64,
}

#[derive(Debug, Clone)]
pub struct Sensor {
    pub id: SensorId,
    pub device: DeviceId,
    /// Where it stands in the registry that loaded it (set by the registry).
    pub place: Place,
    pub description: String,
    pub kind: String,
    pub unit: String,
    pub equipment: Option<String>,
    pub source: SensorSource,
    pub range: Option<NormalRange>,
    pub deadband: Option<f64>,
    /// Its limit alarms (`[[sensors.alarms]]`).
    pub alarms: Vec<super::alarm::AlarmDef>,
}

#[cfg(test)]
impl Sensor {
    /// A sensor outside any registry, for unit tests.
    pub(crate) fn for_tests(source: SensorSource, unit: &str, range: Option<NormalRange>) -> Sensor {
        Sensor {
            id: "A_LINE1_042".parse().expect("a valid ID"),
            device: "a-line1-plc".parse().expect("a valid ID"),
            place: Place::UNPLACED,
            description: String::new(),
            kind: "pressure".into(),
            unit: unit.into(),
            equipment: None,
            source,
            range,
            deadband: None,
            alarms: Vec::new(),
        }
    }
}

#[cfg(test)]
mod protocol_tests {
    use super::Protocol;
    use std::str::FromStr;
    use strum::VariantNames;

    /// The hand-kept list of the names a device file may use is exactly what parses.
    #[test]
    fn the_names_a_file_may_use_are_those_that_parse() {
        for name in Protocol::VARIANTS {
            assert_eq!(Protocol::from_str(name).map(Protocol::name), Ok(*name));
        }
        assert!(Protocol::from_str("sparkplug").is_err());
        let parsed = [Protocol::ModbusTcp, Protocol::ModbusRtu, Protocol::ModbusRtuOverTcp, Protocol::Opcua];
        assert_eq!(parsed.map(Protocol::name), Protocol::VARIANTS);
        assert_eq!(Protocol::Sparkplug.name(), "sparkplug");
    }
}
