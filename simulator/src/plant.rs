//! The devices to simulate, read from the same `devices/*.toml` as the service.
//!
//! This reader is deliberately separate from fieldgate's registry: the simulator is a test
//! instrument, and encoding values with an independent implementation is what lets the
//! tests catch a decoding bug in the service instead of mirroring it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Table {
    Coil,
    Discrete,
    Input,
    Holding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Order {
    ABCD,
    BADC,
    CDAB,
    DCBA,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    ModbusTcp,
    ModbusRtu,
    ModbusRtuOverTcp,
    Opcua,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

/// One sensor as the simulator needs it. Unknown keys are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct Point {
    pub id: String,
    pub table: Option<Table>,
    pub address: Option<u16>,
    #[serde(rename = "type")]
    pub kind: Option<Kind>,
    pub word_order: Option<Order>,
    pub bit: Option<u8>,
    pub length: Option<u16>,
    pub scale: Option<f64>,
    pub offset: Option<f64>,
    pub node_id: Option<String>,
    pub range: Option<Range>,
    /// The sensor's kind word (temperature, status, ...).
    #[serde(rename = "kind")]
    pub kind_name: Option<String>,
    /// Served as the OPC UA variable's description.
    pub description: Option<String>,
    /// Served as the OPC UA variable's `EngineeringUnits` property.
    pub unit: Option<String>,
}

impl Point {
    pub fn scale(&self) -> f64 {
        self.scale.unwrap_or(1.0)
    }
    pub fn offset(&self) -> f64 {
        self.offset.unwrap_or(0.0)
    }
    /// Registers (or bits) the point occupies.
    pub fn width(&self) -> u16 {
        match self.kind {
            Some(Kind::U32 | Kind::I32 | Kind::F32) => 2,
            Some(Kind::U64 | Kind::I64 | Kind::F64) => 4,
            Some(Kind::String) => self.length.unwrap_or(1),
            _ => 1,
        }
    }
}

/// One device file.
#[derive(Debug, Clone, Deserialize)]
pub struct Device {
    pub id: String,
    pub protocol: Protocol,
    pub endpoint: String,
    pub unit_id: Option<u8>,
    pub word_order: Option<Order>,
    #[serde(default)]
    pub sensors: Vec<Point>,
    /// OPC UA security (`[opcua]`); absent or "None": unsecured, anonymous.
    pub opcua: Option<UaSettings>,
}

/// The `[opcua]` table of a device file, as far as the simulated server cares.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UaSettings {
    #[serde(default)]
    pub security_policy: Option<String>,
    #[serde(default)]
    pub security_mode: Option<String>,
    #[serde(default)]
    pub username_env: Option<String>,
    #[serde(default)]
    pub password_env: Option<String>,
}

impl Device {
    pub fn unit(&self) -> u8 {
        self.unit_id.unwrap_or(1)
    }
    pub fn order_of(&self, p: &Point) -> Order {
        p.word_order.or(self.word_order).unwrap_or(Order::ABCD)
    }
}

/// Reading the plant failed.
#[derive(Debug, thiserror::Error)]
pub enum PlantError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
}

/// Every device file of a folder, by device ID.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Device>, PlantError> {
    let io = |e| PlantError::Io { path: dir.display().to_string(), source: e };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = BTreeMap::new();
    for path in files {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(&path).map_err(|e| PlantError::Io { path: name.clone(), source: e })?;
        let device: Device = toml::from_str(&text)
            .map_err(|e| PlantError::Parse { path: name, message: e.message().to_string() })?;
        out.insert(device.id.clone(), device);
    }
    Ok(out)
}
