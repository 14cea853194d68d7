//! The fleet's catalogue: every sensor the edge nodes were born with, as a registry the
//! tools answer from. A metric is a sensor when its name is a sensor ID (fieldgate's edges
//! name them so); its device is the device of the birth. An ID (sensor or device) that
//! two edge nodes announce is a conflict: withheld, listed, never merged.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use super::fleet::{DeviceState, EdgeState, Fleet, MetricState};
use crate::ids::{DeviceId, SensorId};
use crate::registry::{
    Conflict, DataType, Device, EdgePoint, Endpoint, NormalRange, Place, Protocol, Registry, Sensor,
    SensorSource, WordOrder,
};

/// When an edge's birth says nothing of how often it sends, history's gaps are judged
/// against this.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// What was left out of the catalogue, and why (for the log and the fleet page).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Left {
    /// Metrics whose name is no sensor ID (another Sparkplug edge's own names).
    pub not_sensor_ids: usize,
    /// Devices whose ID is no fieldgate device ID.
    pub not_device_ids: usize,
    /// Sensors not of the plant and zone of their device's first sensor.
    pub misplaced: usize,
}

/// The registry of everything born, the conflicts in it, and what was left out. An error
/// would be a bug here (IDs are unique and every sensor's device is there by construction):
/// the caller keeps the catalogue it had.
pub fn build(fleet: &Fleet) -> Result<(Registry, Left), String> {
    let mut left = Left::default();
    // Every claim to an ID, in fleet order: (edge, device index) per device ID, and per
    // sensor ID its device's claim and the metric.
    let mut devices: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
    let mut sensors: BTreeMap<String, Vec<(usize, usize, usize)>> = BTreeMap::new();
    for (e, edge) in fleet.edges().iter().enumerate() {
        if edge.birth.is_none() {
            continue;
        }
        for (d, dev) in edge.devices.iter().enumerate() {
            if dev.birth.is_none() {
                continue;
            }
            if DeviceId::from_str(&dev.id).is_err() {
                left.not_device_ids += 1;
                continue;
            }
            devices.entry(dev.id.clone()).or_default().push((e, d));
            for (m, metric) in dev.metrics.iter().enumerate() {
                if SensorId::from_str(&metric.name).is_ok() {
                    sensors.entry(metric.name.clone()).or_default().push((e, d, m));
                } else if !metric.name.contains('/') && metric.name != "bdSeq" {
                    left.not_sensor_ids += 1;
                }
            }
        }
    }
    // A device its edge node announced in its current life counts over one known only from
    // an earlier life (its edge node dead, or born again without it): an ID moved to
    // another edge, or a forger that died, leaves no conflict behind. Among claims of
    // the same standing, more than one is a conflict.
    let current = |e: usize, d: usize| {
        let edge = &fleet.edges()[e];
        edge.status.is_online() && edge.devices[d].current
    };
    for claims in devices.values_mut() {
        if claims.iter().any(|&(e, d)| current(e, d)) {
            claims.retain(|&(e, d)| current(e, d));
        }
    }
    for claims in sensors.values_mut() {
        if claims.iter().any(|&(e, d, _)| current(e, d)) {
            claims.retain(|&(e, d, _)| current(e, d));
        }
    }
    let claimant = |e: usize, d: usize| {
        let edge = &fleet.edges()[e];
        format!("{}/{}/{}", edge.group, edge.node, edge.devices[d].id)
    };
    let mut conflicts = Vec::new();
    let mut out_devices: BTreeMap<String, Device> = BTreeMap::new();
    for (id, claims) in &devices {
        if claims.len() > 1 {
            let mut claimants: Vec<String> = claims.iter().map(|&(e, d)| claimant(e, d)).collect();
            claimants.sort();
            conflicts.push(Conflict { id: id.clone(), claimants, device: None });
        }
    }
    let mut out_sensors = Vec::with_capacity(sensors.len());
    for (id, claims) in &sensors {
        let &[(e, d, m)] = claims.as_slice() else {
            let mut claimants: Vec<String> = claims.iter().map(|&(e, d, _)| claimant(e, d)).collect();
            claimants.sort();
            claimants.dedup();
            conflicts.push(Conflict { id: id.clone(), claimants, device: None });
            continue;
        };
        let edge = &fleet.edges()[e];
        let (dev, metric) = (&edge.devices[d], &edge.devices[d].metrics[m]);
        // Its device's ID is in conflict: withheld too, and listed (with who announced
        // the sensor itself, not every claimant of the device), so that no sensor goes
        // missing without a word.
        if devices.get(&dev.id).is_some_and(|c| c.len() > 1) {
            conflicts.push(Conflict {
                id: id.clone(),
                claimants: vec![claimant(e, d)],
                device: Some(dev.id.clone()),
            });
            continue;
        }
        let (Ok(sid), Ok(did)) = (SensorId::from_str(id), DeviceId::from_str(&dev.id)) else { continue };
        let device = out_devices.entry(dev.id.clone()).or_insert_with(|| device_of(edge, dev, did, &sid));
        if device.plant != sid.plant() || device.zone != sid.zone() {
            left.misplaced += 1;
            continue;
        }
        out_sensors.push(sensor_of(sid, device, e, d, m, metric));
    }
    let devices: Vec<Device> = out_devices.into_values().collect();
    Registry::assembled(devices, out_sensors, conflicts).map(|r| (r, left))
}

/// The device as the catalogue shows it: its edge node, the protocol its edge said, the
/// plant and zone of its first sensor.
fn device_of(edge: &EdgeState, dev: &DeviceState, id: DeviceId, first: &SensorId) -> Device {
    let props = dev.metrics.iter().find(|m| m.name == first.as_str()).map(|m| &m.props);
    let protocol = props
        .and_then(|p| p.protocol.as_deref())
        .and_then(|p| Protocol::from_str(p).ok())
        .unwrap_or(Protocol::Sparkplug);
    let interval = dev
        .metrics
        .iter()
        .filter_map(|m| m.props.expected_interval_ms)
        .max()
        .map_or(DEFAULT_INTERVAL, Duration::from_millis);
    Device {
        id,
        plant: first.plant().to_string(),
        zone: first.zone().to_string(),
        description: format!("device {} of edge node {}/{}", dev.id, edge.group, edge.node),
        protocol,
        endpoint: Endpoint::Edge { group: edge.group.clone(), node: edge.node.clone() },
        unit_id: 0,
        timeout: Duration::from_secs(1),
        poll_interval: Some(interval),
        max_registers_per_read: 0,
        max_gap: 0,
        word_order: WordOrder::ABCD,
        serial: None,
        opcua: None,
        breaker: None,
        source: format!("edge node {}/{}", edge.group, edge.node),
    }
}

fn sensor_of(id: SensorId, device: &Device, e: usize, d: usize, m: usize, metric: &MetricState) -> Sensor {
    let p = &metric.props;
    Sensor {
        id,
        device: device.id.clone(),
        place: Place::UNPLACED,
        description: p.description.clone(),
        kind: if p.kind.is_empty() { "unknown".into() } else { p.kind.clone() },
        unit: p.unit.clone(),
        equipment: p.equipment.clone(),
        source: SensorSource::Edge(EdgePoint {
            edge: e,
            device: d,
            metric: m,
            data_type: p.data_type.as_deref().and_then(|t| DataType::from_str(t).ok()),
            history: p.history.unwrap_or(true),
            expected_interval: p.expected_interval_ms.map(Duration::from_millis),
        }),
        range: p.range.map(|(min, max)| NormalRange { min, max }),
        deadband: None,
    }
}

#[cfg(test)]
mod tests;
