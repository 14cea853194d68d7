//! What each alarm watches, and the table of them: a sensor's limit (a device file's
//! `[[sensors.alarms]]`), a device that stopped answering (its communication alarm), or a
//! condition of an OPC UA server (Alarms & Conditions), known once the server reports it.
//!
//! The limit and communication alarms are fixed at start, first in the table and in this
//! order; the server's conditions are added as they come (and restored from the journal
//! at start, so a standing one is listed before its server is reached again).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::registry::{AlarmDef, AlarmKind, AlarmPriority, Registry};

/// The name of a device's communication alarm: its ID is `DEVICE_ID.COMM`.
pub const COMM: &str = "COMM";

/// What an alarm watches.
#[derive(Debug, Clone, PartialEq)]
pub enum Watch {
    /// A sensor's value against a limit.
    Limit { sensor: usize, def: AlarmDef },
    /// The device answered nothing for this long (`[alarms] comm_delay_s`).
    Comm { after: Duration },
    /// A condition its OPC UA server evaluates (`node`: the condition's NodeId, as text).
    Condition { sensor: Option<usize>, node: String },
    /// An edge node's alarm as it publishes it (the fleet hub): named by the edge's IDs,
    /// which need not be in the hub's catalogue.
    Remote(Box<Remote>),
}

/// An edge node's alarm, as it says it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    /// `group/node`.
    pub edge: String,
    pub device: String,
    pub sensor: Option<String>,
    pub kind: &'static str,
    pub plant: String,
    pub zone: String,
    pub limit: Option<f64>,
    pub unit: String,
}

/// The kinds an edge's alarm may say it is (anything else is `remote`).
const KINDS: [&str; 7] = ["high", "high_high", "low", "low_low", "off_normal", "communication", "condition"];

/// An edge's `type` property as a kind.
pub fn kind_of(text: &str) -> &'static str {
    KINDS.iter().find(|k| **k == text).copied().unwrap_or("remote")
}

/// One alarm.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `SENSOR_ID.NAME`, or `DEVICE_ID.NAME` for what belongs to the device.
    pub id: String,
    /// The device's index in the registry.
    pub device: usize,
    pub watch: Watch,
    pub priority: AlarmPriority,
    /// What the operator reads.
    pub message: String,
}

impl Entry {
    /// The sensor it belongs to (none: the device's own).
    pub fn sensor(&self) -> Option<usize> {
        match &self.watch {
            Watch::Limit { sensor, .. } => Some(*sensor),
            Watch::Condition { sensor, .. } => *sensor,
            Watch::Comm { .. } | Watch::Remote { .. } => None,
        }
    }

    /// The ID of the sensor it belongs to, if any.
    pub fn sensor_id(&self, registry: &Registry) -> Option<String> {
        match &self.watch {
            Watch::Remote(r) => r.sensor.clone(),
            _ => self.sensor().and_then(|s| registry.sensors().get(s)).map(|s| s.id.to_string()),
        }
    }

    /// The ID of its device.
    pub fn device_id(&self, registry: &Registry) -> String {
        match &self.watch {
            Watch::Remote(r) => r.device.clone(),
            _ => registry.devices().get(self.device).map(|d| d.id.to_string()).unwrap_or_default(),
        }
    }

    /// Its plant and zone: its device's (an edge's alarm: as the edge says).
    pub fn plant_zone(&self, registry: &Registry) -> Option<(String, String)> {
        if let Watch::Remote(r) = &self.watch {
            return Some((r.plant.clone(), r.zone.clone()));
        }
        let device = registry.devices().get(self.device)?;
        Some((device.plant.clone(), device.zone.clone()))
    }

    /// high, high_high, low, low_low, off_normal, communication or condition.
    pub fn kind(&self) -> &'static str {
        match &self.watch {
            Watch::Limit { def, .. } => def.kind.name(),
            Watch::Comm { .. } => "communication",
            Watch::Condition { .. } => "condition",
            Watch::Remote(r) => r.kind,
        }
    }

    /// The limit, in the sensor's units (high and low kinds only).
    pub fn limit(&self) -> Option<f64> {
        match &self.watch {
            Watch::Limit { def, .. } if def.kind != AlarmKind::OffNormal => Some(def.limit),
            Watch::Remote(r) => r.limit,
            _ => None,
        }
    }

    /// Its sensor's unit ("" for none).
    pub fn unit(&self, registry: &Registry) -> String {
        match &self.watch {
            Watch::Remote(r) => r.unit.clone(),
            _ => self
                .sensor()
                .and_then(|s| registry.sensors().get(s))
                .map(|s| s.unit.clone())
                .unwrap_or_default(),
        }
    }

    pub fn deadband(&self) -> f64 {
        match &self.watch {
            Watch::Limit { def, .. } => def.deadband,
            _ => 0.0,
        }
    }

    pub fn def(&self) -> Option<&AlarmDef> {
        match &self.watch {
            Watch::Limit { def, .. } => Some(def),
            _ => None,
        }
    }
}

/// The alarms fixed at start: every sensor's limit alarms, then a communication alarm for
/// each device that has one (unless `comm_after` is zero).
pub fn fixed(registry: &Registry, comm_after: Duration) -> Vec<Arc<Entry>> {
    let mut out = Vec::new();
    for (i, s) in registry.sensors().iter().enumerate() {
        for def in &s.alarms {
            out.push(Arc::new(Entry {
                id: format!("{}.{}", s.id, def.name),
                device: s.place.device,
                watch: Watch::Limit { sensor: i, def: def.clone() },
                priority: def.priority,
                message: def.message.clone(),
            }));
        }
    }
    if comm_after.is_zero() {
        return out;
    }
    let watched: std::collections::BTreeSet<usize> = out.iter().map(|e| e.device).collect();
    for (d, device) in registry.devices().iter().enumerate() {
        if watched.contains(&d) || device.opcua.as_ref().is_some_and(|o| o.alarms) {
            out.push(Arc::new(Entry {
                id: format!("{}.{COMM}", device.id),
                device: d,
                watch: Watch::Comm { after: comm_after },
                priority: AlarmPriority::High,
                message: format!(
                    "Device {}: communication failure (its alarms cannot see while it lasts)",
                    device.id
                ),
            }));
        }
    }
    out
}

/// Alarm ID → its place in a table.
pub fn index(entries: &[Arc<Entry>]) -> HashMap<String, usize> {
    entries.iter().enumerate().map(|(i, e)| (e.id.clone(), i)).collect()
}
