//! `list_sensors`: the registry, filtered and paged with an opaque cursor.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::ToolResult;
use super::defs::{ListSensorsArgs, ListSensorsData, SensorInfo};
use super::envelope::ToolError;
use crate::ids::DeviceId;
use crate::registry::{Registry, Sensor, SensorSource};
use crate::suggest;

pub const DEFAULT_LIMIT: u32 = 100;

/// What the cursor carries: where the last page ended, and which filters it was for.
#[derive(Serialize, Deserialize)]
struct Cursor {
    /// The last sensor ID returned.
    a: String,
    /// Fingerprint of the filters.
    f: u64,
}

pub fn run(args: ListSensorsArgs, registry: &Registry) -> ToolResult {
    // Layer 3: filters must name things that exist, or the agent would read an empty
    // list as "no such sensors" when it made a typo.
    check_member("plant", args.plant.as_deref(), &registry.plants())?;
    check_member("zone", args.zone.as_deref(), &registry.zones())?;
    check_member("kind", args.kind.as_deref(), &registry.kinds())?;
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
    let fingerprint = fingerprint(&args, &words);
    let after = match &args.cursor {
        Some(c) => Some(decode_cursor(c, fingerprint)?),
        None => None,
    };
    let limit = args.limit.unwrap_or(DEFAULT_LIMIT) as usize;

    let matching = registry.sensors().iter().filter(|s| matches(s, &args, &words));
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
        (true, Some(last)) => Some(encode_cursor(&last.sensor_id, fingerprint)),
        _ => None,
    };
    let data = ListSensorsData { sensors: page, total, complete: next_cursor.is_none(), next_cursor };
    super::to_data(&data)
}

fn check_member(
    param: &str,
    value: Option<&str>,
    known: &std::collections::BTreeSet<&str>,
) -> Result<(), ToolError> {
    let Some(v) = value else { return Ok(()) };
    if known.contains(v) {
        return Ok(());
    }
    let all: Vec<&str> = known.iter().copied().collect();
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

fn matches(s: &Sensor, a: &ListSensorsArgs, words: &[String]) -> bool {
    if a.plant.as_deref().is_some_and(|p| p != s.id.plant())
        || a.zone.as_deref().is_some_and(|z| z != s.id.zone())
        || a.device_id.as_deref().is_some_and(|d| d != s.device.as_str())
        || a.kind.as_deref().is_some_and(|k| k != s.kind)
    {
        return false;
    }
    if words.is_empty() {
        return true;
    }
    let hay = format!(
        "{} {} {} {} {}",
        s.id.as_str().to_lowercase(),
        s.description.to_lowercase(),
        s.equipment.as_deref().unwrap_or("").to_lowercase(),
        s.unit.to_lowercase(),
        s.kind
    );
    words.iter().all(|w| hay.contains(w.as_str()))
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
        },
        range: s.range,
        history: d.poll_interval.is_some(),
    }
}

/// FNV-1a over the filters, so a cursor cannot be replayed with other filters.
fn fingerprint(a: &ListSensorsArgs, words: &[String]) -> u64 {
    let text = format!("{:?}|{:?}|{:?}|{:?}|{}", a.plant, a.zone, a.device_id, a.kind, words.join(" "));
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn encode_cursor(last: &str, f: u64) -> String {
    let json = serde_json::to_vec(&Cursor { a: last.to_string(), f }).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

fn decode_cursor(c: &str, expected: u64) -> Result<String, ToolError> {
    let bad = |msg: &str| {
        ToolError::invalid(
            "cursor",
            Some(c),
            "the next_cursor of the previous page of the same listing",
            msg.to_string(),
            "Pass next_cursor from the previous page unchanged with the same filters, or omit cursor to start over.",
        )
    };
    let cursor: Cursor = URL_SAFE_NO_PAD
        .decode(c)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| bad("`cursor` is not a cursor this service issued."))?;
    if cursor.f != expected {
        return Err(bad("`cursor` belongs to a listing with other filters."));
    }
    Ok(cursor.a)
}
