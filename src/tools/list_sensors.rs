//! `list_sensors`: the registry, filtered and paged with an opaque cursor.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::ToolResult;
use super::defs::{IdConflict, ListSensorsArgs, ListSensorsData, SensorInfo};
use super::envelope::ToolError;
use crate::ids::{DeviceId, SensorId};
use crate::registry::{Device, Endpoint, Registry, Sensor, SensorSource};
use crate::suggest;

const PAGING: super::cursor::Paging =
    super::cursor::Paging { this: "the same listing", other: "a listing with other filters" };

/// Where the last page ended (the cursor also carries the filters' fingerprint).
#[derive(Serialize, Deserialize)]
struct Cursor {
    /// The last sensor ID returned.
    a: String,
}

pub fn run(args: ListSensorsArgs, registry: &Registry) -> ToolResult {
    // Layer 3: filters must name things that exist, or the agent would read an empty
    // list as "no such sensors" when it made a typo.
    // At a hub a plant (or zone) whose every sensor is in conflict is still one: the answer
    // is no sensor and the conflicts, not "no such plant".
    check_member(
        "plant",
        args.plant.as_deref(),
        &with_conflicts(registry, registry.plants(), SensorId::plant),
    )?;
    check_member("zone", args.zone.as_deref(), &with_conflicts(registry, registry.zones(), SensorId::zone))?;
    check_member("kind", args.kind.as_deref(), registry.kinds())?;
    if args.edge.is_some() {
        let edges: BTreeSet<String> = registry.devices().iter().filter_map(edge_of).collect();
        if edges.is_empty() {
            return Err(ToolError::invalid(
                "edge",
                args.edge.as_deref(),
                "no value: this service reads its own devices, it is no fleet hub",
                "No sensor here comes from an edge node.",
                "Omit edge; it filters only at a fleet hub.",
            ));
        }
        check_member("edge", args.edge.as_deref(), &edges)?;
    }
    if let Some(raw) = &args.device_id {
        let known = raw.parse::<DeviceId>().ok().and_then(|id| registry.device(&id));
        if known.is_none() {
            return Err(super::validate::device_not_found(
                registry,
                raw,
                "Call list_sensors without device_id to see every device's sensors, or get_device_status for the list of devices.",
            ));
        }
    }

    let words: Vec<String> =
        args.text.as_deref().unwrap_or("").split_whitespace().map(str::to_lowercase).collect();
    if args.text.is_some() && words.is_empty() {
        return Err(ToolError::invalid(
            "text",
            args.text.as_deref(),
            "at least one word",
            "text holds no word, only spaces.",
            "Give words to search for, or omit text to list every sensor.",
        ));
    }
    let fingerprint = fingerprint(&args, &words);
    let after = match &args.cursor {
        Some(c) => Some(super::cursor::decode::<Cursor>(c, fingerprint, &PAGING)?.a),
        None => None,
    };
    let limit = args.limit.unwrap_or(ListSensorsArgs::DEFAULT_LIMIT) as usize;

    // Text through the registry's index; the other filters on what it found.
    let found = (!words.is_empty()).then(|| registry.text_matches(&words));
    let sensors = registry.sensors();
    let candidates: Box<dyn Iterator<Item = &Sensor>> = match &found {
        Some(m) => Box::new(m.iter().filter_map(|i| sensors.get(i))),
        None => Box::new(sensors.iter()),
    };
    let matching = candidates.filter(|s| matches(s, registry, &args));
    let mut total = 0;
    let mut page = Vec::new();
    let mut more = false;
    for s in matching {
        total += 1;
        if after.as_deref().is_some_and(|a| s.id.as_str() <= a) {
            continue;
        }
        if page.len() < limit {
            page.push(info(s, registry));
        } else {
            more = true;
        }
    }
    let next_cursor = match (more, page.last()) {
        (true, Some(last)) => Some(super::cursor::encode(Cursor { a: last.sensor_id.clone() }, fingerprint)),
        _ => None,
    };
    let conflicts = registry
        .conflicts()
        .iter()
        .map(|c| IdConflict { id: c.id.clone(), claimants: c.claimants.clone(), device: c.device.clone() })
        .collect();
    let data =
        ListSensorsData { sensors: page, total, complete: next_cursor.is_none(), next_cursor, conflicts };
    super::to_data(&data)
}

/// `mine` and the plants (or zones: `part`) of the sensor IDs in conflict.
fn with_conflicts<'a>(
    registry: &Registry,
    mine: &'a BTreeSet<String>,
    part: fn(&SensorId) -> &str,
) -> Cow<'a, BTreeSet<String>> {
    if registry.conflicts().is_empty() {
        return Cow::Borrowed(mine);
    }
    let mut all = mine.clone();
    all.extend(
        registry
            .conflicts()
            .iter()
            .filter_map(|c| c.id.parse::<SensorId>().ok())
            .map(|id| part(&id).to_string()),
    );
    Cow::Owned(all)
}

fn check_member(param: &str, value: Option<&str>, known: &BTreeSet<String>) -> Result<(), ToolError> {
    let Some(v) = value else { return Ok(()) };
    if known.contains(v) {
        return Ok(());
    }
    let all: Vec<&str> = known.iter().map(String::as_str).collect();
    let mut near: Vec<(usize, &str)> = all
        .iter()
        .map(|k| (suggest::distance(&v.to_ascii_lowercase(), &k.to_ascii_lowercase()), *k))
        .collect();
    near.sort();
    let suggestions = near.into_iter().filter(|(d, _)| *d <= 3).take(3).map(|(_, k)| k.to_string()).collect();
    Err(ToolError::invalid(
        param,
        Some(v),
        format!("one of {}", all.join(", ")),
        format!("No sensor has {param} {}.", super::envelope::cut(v)),
        format!("Use one of the listed values for {param}, or omit it."),
    )
    .with_suggestions(suggestions))
}

/// The edge node a device of the fleet hub comes from, as "group/node".
pub(crate) fn edge_of(d: &Device) -> Option<String> {
    match &d.endpoint {
        Endpoint::Edge { group, node } => Some(format!("{group}/{node}")),
        _ => None,
    }
}

/// Whether `s` passes the filters besides `text`.
fn matches(s: &Sensor, registry: &Registry, a: &ListSensorsArgs) -> bool {
    !(a.plant.as_deref().is_some_and(|p| p != s.id.plant())
        || a.zone.as_deref().is_some_and(|z| z != s.id.zone())
        || a.device_id.as_deref().is_some_and(|d| d != s.device.as_str())
        || a.kind.as_deref().is_some_and(|k| k != s.kind)
        || a.edge.as_deref().is_some_and(|e| !is_edge(registry.device_of(s), e)))
}

/// Whether device `d` comes from edge node `edge` ("group/node").
fn is_edge(d: &Device, edge: &str) -> bool {
    match &d.endpoint {
        Endpoint::Edge { group, node } => {
            edge.split_once('/').is_some_and(|(g, n)| g == group.as_str() && n == node.as_str())
        }
        _ => false,
    }
}

pub(crate) fn info(s: &Sensor, registry: &Registry) -> SensorInfo {
    let d = registry.device_of(s);
    SensorInfo {
        sensor_id: s.id.to_string(),
        description: s.description.clone(),
        kind: s.kind.clone(),
        unit: s.unit.clone(),
        equipment: s.equipment.clone(),
        device_id: d.id.to_string(),
        plant: d.plant.clone(),
        zone: d.zone.clone(),
        protocol: d.protocol.name().to_string(),
        data_type: match &s.source {
            SensorSource::Modbus(p) => p.data_type.name().to_string(),
            SensorSource::OpcUa { .. } => "opcua".to_string(),
            // What the edge itself would answer, as far as its birth said.
            SensorSource::Edge(p) => match (p.data_type, d.protocol) {
                (Some(t), _) => t.name().to_string(),
                (None, crate::registry::Protocol::Opcua) => "opcua".to_string(),
                (None, _) => "unknown".to_string(),
            },
        },
        range: s.range,
        history: d.poll_interval.is_some(),
        edge: edge_of(d),
    }
}

/// The filters' fingerprint, so a cursor cannot be replayed with other filters.
fn fingerprint(a: &ListSensorsArgs, words: &[String]) -> u64 {
    let text =
        format!("{:?}|{:?}|{:?}|{:?}|{}|{:?}", a.plant, a.zone, a.device_id, a.kind, words.join(" "), a.edge);
    super::cursor::fingerprint(&text)
}
