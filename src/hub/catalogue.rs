//! The fleet's catalogue: every sensor the edge nodes were born with, as a registry the
//! tools answer from. A metric is a sensor when its name is a sensor ID (fieldgate's edges
//! name them so); its device is the device of the birth. An ID (sensor or device) that
//! two edge nodes announce is a conflict: withheld, listed, never merged.

use std::collections::{BTreeMap, HashMap};
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
    /// Sensors of a device whose ID another claim holds (the device moved to another edge
    /// node without them, or a forger's device that died): no longer announced.
    pub superseded: usize,
}

/// The registry of everything born, the conflicts in it, and what was left out. An error
/// would be a bug here (IDs are unique and every sensor's device is there by construction):
/// the caller keeps the catalogue it had.
pub fn build(fleet: &Fleet) -> Result<(Registry, Left), String> {
    let mut left = Left::default();
    // Every claim to an ID, in fleet order: (edge, device index) per device ID, and per
    // sensor ID its device's claim and the metric.
    let mut devices: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
    // One entry a metric, sorted by name below: a catalogue of 100,000 sensors is rebuilt
    // while a fleet is born, and a map of vectors costs several times this.
    let mut sensors: Vec<(&str, usize, usize, usize)> = Vec::new();
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
            devices.entry(dev.id.as_str()).or_default().push((e, d));
            for (m, metric) in dev.metrics.iter().enumerate() {
                if SensorId::from_str(&metric.name).is_ok() {
                    sensors.push((metric.name.as_str(), e, d, m));
                } else if !metric.name.contains('/') && metric.name != "bdSeq" {
                    left.not_sensor_ids += 1;
                }
            }
        }
    }
    // A device its edge node announced in its current life counts over one known only from
    // an earlier life (its edge node dead, or born again without it), and among those the
    // one born last: an ID moved to another edge, or a forger that died, leaves no
    // conflict behind, and an edge node that dies after it keeps its IDs (offline, not in
    // conflict). Among claims of the same standing, more than one is a conflict.
    for claims in devices.values_mut() {
        let best = claims.iter().map(|&(e, d)| fleet.standing(e, d)).max();
        claims.retain(|&(e, d)| Some(fleet.standing(e, d)) == best);
    }
    sensors.sort_unstable();
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
            conflicts.push(Conflict { id: id.to_string(), claimants, device: None });
        }
    }
    let mut out_sensors = Vec::with_capacity(sensors.len());
    for all in sensors.chunk_by(|a, b| a.0 == b.0) {
        let id = all[0].0;
        // The claims of the best standing, as for devices.
        let best = all.iter().map(|&(_, e, d, _)| fleet.standing(e, d)).max();
        let standing = || all.iter().filter(move |&&(_, e, d, _)| Some(fleet.standing(e, d)) == best);
        let mut claims = standing();
        let (Some(&(_, e, d, m)), None) = (claims.next(), claims.next()) else {
            let mut claimants: Vec<String> = standing().map(|&(_, e, d, _)| claimant(e, d)).collect();
            claimants.sort();
            claimants.dedup();
            conflicts.push(Conflict { id: id.to_string(), claimants, device: None });
            continue;
        };
        let edge = &fleet.edges()[e];
        let (dev, metric) = (&edge.devices[d], &edge.devices[d].metrics[m]);
        let device_claims = devices.get(dev.id.as_str()).map_or(&[][..], Vec::as_slice);
        // Its device's ID is held by another claim (the device moved to another edge node
        // without this sensor, or this is a dead forger's device): not served, and the
        // device is never described from it.
        if let [only] = device_claims
            && *only != (e, d)
        {
            left.superseded += 1;
            continue;
        }
        // Its device's ID is in conflict: withheld too, and listed (with who announced
        // the sensor itself, not every claimant of the device), so that no sensor goes
        // missing without a word.
        if device_claims.len() > 1 {
            conflicts.push(Conflict {
                id: id.to_string(),
                claimants: vec![claimant(e, d)],
                device: Some(dev.id.clone()),
            });
            continue;
        }
        let (Ok(sid), Ok(did)) = (SensorId::from_str(id), DeviceId::from_str(&dev.id)) else { continue };
        let device =
            out_devices.entry(dev.id.clone()).or_insert_with(|| device_of(edge, dev, did, (&sid, metric)));
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
/// plant and zone most of its sensors have (the first in its birth's order among equals):
/// one stray ID does not take the device's other sensors with it.
fn device_of(edge: &EdgeState, dev: &DeviceState, id: DeviceId, some: (&SensorId, &MetricState)) -> Device {
    let ids: Vec<(usize, SensorId)> = dev
        .metrics
        .iter()
        .enumerate()
        .filter_map(|(i, m)| Some((i, SensorId::from_str(&m.name).ok()?)))
        .collect();
    // Per plant and zone: how many sensors, and the first of them in the birth's order.
    let mut places: HashMap<(&str, &str), (usize, usize)> = HashMap::new();
    for (k, (_, s)) in ids.iter().enumerate() {
        places.entry((s.plant(), s.zone())).or_insert((0, k)).0 += 1;
    }
    let best = places.into_values().max_by_key(|&(n, first)| (n, std::cmp::Reverse(first)));
    let (first, props) = match best.and_then(|(_, k)| ids.get(k)) {
        Some((i, s)) => (s, &dev.metrics[*i].props),
        None => (some.0, &some.1.props),
    };
    let props = Some(props);
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
        alarms: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
