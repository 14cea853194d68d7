//! Read-only resources for people and dashboards (`/v1/sensors/{id}`, `/v1/devices`):
//! not agent tools, but answered in the same envelope with the same validation.

use serde::Serialize;

use super::defs::SensorInfo;
use super::envelope::{ErrorCode, ToolError};
use super::validate::{known_sensor, parse_sensor_id};
use super::{ToolResult, list_sensors, to_data};
use crate::ids::DeviceId;
use crate::registry::Registry;

pub fn sensor(registry: &Registry, raw: &str) -> ToolResult {
    let id = parse_sensor_id("sensor_id", raw, registry)?;
    let s = known_sensor("sensor_id", &id, registry)?;
    let info: SensorInfo = list_sensors::info(s, registry);
    to_data(&info)
}

#[derive(Serialize)]
struct DeviceInfo<'a> {
    device_id: &'a str,
    description: &'a str,
    plant: &'a str,
    zone: &'a str,
    protocol: &'a str,
    endpoint: String,
    unit_id: u8,
    timeout_ms: u128,
    poll_interval_ms: u128,
    sensors: usize,
}

#[derive(Serialize)]
struct Devices<'a> {
    devices: Vec<DeviceInfo<'a>>,
}

pub fn devices(registry: &Registry, only: Option<&str>) -> ToolResult {
    let wanted = match only {
        Some(raw) => {
            let found = raw.parse::<DeviceId>().ok().and_then(|id| registry.device(&id));
            match found {
                Some(d) => Some(d.id.clone()),
                None => {
                    let mut e = ToolError::new(
                        ErrorCode::DeviceNotFound,
                        format!("No device {} is registered.", super::envelope::cut(raw)),
                        "GET /v1/devices lists every device.",
                    )
                    .with_suggestions(registry.suggest_devices(raw));
                    e.parameter = Some("device_id".into());
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let devices = registry
        .devices()
        .iter()
        .filter(|d| wanted.as_ref().is_none_or(|w| *w == d.id))
        .map(|d| DeviceInfo {
            device_id: d.id.as_str(),
            description: &d.description,
            plant: &d.plant,
            zone: &d.zone,
            protocol: d.protocol.name(),
            endpoint: d.endpoint.to_string(),
            unit_id: d.unit_id,
            timeout_ms: d.timeout.as_millis(),
            poll_interval_ms: d.poll_interval.map_or(0, |p| p.as_millis()),
            sensors: registry.sensors_of_device(&d.id).count(),
        })
        .collect();
    to_data(&Devices { devices })
}
