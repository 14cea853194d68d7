//! Read-only resources for people and dashboards (`/v1/sensors/{id}`):
//! not agent tools, but answered in the same envelope with the same validation.

use super::defs::SensorInfo;
use super::validate::registered_sensor;
use super::{ToolResult, list_sensors, to_data};
use crate::registry::Registry;

pub fn sensor(registry: &Registry, raw: &str) -> ToolResult {
    let s = registered_sensor("sensor_id", raw, registry)?;
    let info: SensorInfo = list_sensors::info(s, registry);
    to_data(&info)
}
