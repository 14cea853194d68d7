//! One `[[sensors]]` entry of a device file: its ID, description and units, and where
//! it is read (a Modbus point or an OPC UA node), every problem collected.

use super::super::bounds;
use super::super::model::*;
use super::MODBUS_SENSOR_KEYS;
use crate::ids::{DeviceId, SensorId};
use crate::toml_reader::Table;

pub(super) fn read_sensor(
    s: &Table<'_, '_>,
    protocol: Option<Protocol>,
    plant: Option<&str>,
    zone: Option<&str>,
    device_word_order: WordOrder,
    device: Option<&DeviceId>,
) -> Option<Sensor> {
    let id = s.req_str("id").and_then(|raw| match raw.parse::<SensorId>() {
        Ok(id) => Some(id),
        Err(e) => {
            let norm = crate::suggest::normalize_sensor_id(raw);
            let hint = if norm != raw && norm.parse::<SensorId>().is_ok() {
                format!("; did you mean {norm}?")
            } else {
                String::new()
            };
            s.problem("id", format!("{e}, found {raw:?}{hint}"));
            None
        }
    });
    if let (Some(id), Some(plant), Some(zone)) = (&id, plant, zone)
        && (id.plant() != plant || id.zone() != zone)
    {
        s.problem(
            "id",
            format!(
                "sensor {id} must start with this device's PLANT_ZONE {plant}_{zone}_ (found {}_{}_)",
                id.plant(),
                id.zone()
            ),
        );
    }
    let description = s.req_text("description");
    let kind = s.req_str("kind").filter(|k| {
        let ok = !k.is_empty()
            && k.len() <= 32
            && k.starts_with(|c: char| c.is_ascii_lowercase())
            && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            s.problem("kind", format!("must be one lower-case word such as \"pressure\", found {k:?}"));
        }
        ok
    });
    let unit = s.req_text("unit");
    let equipment = s.text("equipment");
    let range = s.table("range").and_then(|r| {
        let (min, max) = (r.float("min"), r.float("max"));
        if !r.has("min") || !r.has("max") {
            r.table_problem("range needs both min and max");
        }
        r.finish();
        match (min, max) {
            (Some(min), Some(max)) if min < max => Some(NormalRange { min, max }),
            (Some(min), Some(max)) => {
                s.problem("range", format!("min ({min}) must be less than max ({max})"));
                None
            }
            _ => None,
        }
    });
    let deadband = s.float("deadband").filter(|d| {
        if *d < 0.0 {
            s.problem("deadband", format!("must not be negative, found {d}"));
        }
        *d >= 0.0
    });

    let source = read_source(s, protocol, device_word_order);
    // Whether it reads a boolean (unknown for an OPC UA node: its type is the server's).
    let reads = match &source {
        Some(SensorSource::Modbus(p)) => Some(match p.data_type {
            DataType::Bool => super::alarm::Reads::Boolean,
            DataType::String => super::alarm::Reads::Text,
            _ => super::alarm::Reads::Number,
        }),
        _ => None,
    };
    let alarms = super::alarm::read_alarms(s, reads);

    Some(Sensor {
        id: id?,
        device: device?.clone(),
        place: Place::UNPLACED,
        description: description?.to_string(),
        kind: kind?.to_string(),
        unit: unit?.to_string(),
        equipment: equipment.map(str::to_string),
        source: source?,
        range,
        deadband,
        alarms,
    })
}

/// Where a sensor is read: an OPC UA node, or a Modbus point; the other protocol's keys
/// are refused.
fn read_source(
    s: &Table<'_, '_>,
    protocol: Option<Protocol>,
    device_word_order: WordOrder,
) -> Option<SensorSource> {
    let modbus_keys_present: Vec<&str> = MODBUS_SENSOR_KEYS.iter().copied().filter(|k| s.has(k)).collect();
    let has_node = s.has("node_id");
    match protocol {
        Some(Protocol::Opcua) => {
            for k in &modbus_keys_present {
                s.problem(k, "an OPC UA sensor is addressed by node_id, not by Modbus keys");
            }
            let node = s.req_str("node_id");
            node.and_then(|n| match check_node_id(n) {
                Ok(()) => Some(SensorSource::OpcUa { node_id: n.to_string() }),
                Err(m) => {
                    s.problem("node_id", m);
                    None
                }
            })
        }
        Some(_) => {
            if has_node {
                s.problem("node_id", "a Modbus sensor is addressed by table and address, not node_id");
            }
            read_modbus_point(s, device_word_order).map(SensorSource::Modbus)
        }
        None => None,
    }
}

fn read_modbus_point(s: &Table<'_, '_>, device_word_order: WordOrder) -> Option<ModbusPoint> {
    let table = s.req_pick::<RegisterTable>("table");
    let address =
        if s.require("address") { s.int(bounds::ADDRESS.key, bounds::ADDRESS.range()) } else { None };
    let data_type = s.req_pick::<DataType>("type");
    let word_order = s.pick::<WordOrder>("word_order").unwrap_or(device_word_order);
    let bit = s.int(bounds::BIT.key, bounds::BIT.range());
    let has_bit = s.has("bit");
    let length = s.int(bounds::LENGTH.key, bounds::LENGTH.range());
    let scale = s.float("scale").unwrap_or(1.0);
    let offset = s.float("offset").unwrap_or(0.0);
    if scale == 0.0 {
        s.problem("scale", "must not be 0");
    }
    let (table, address, data_type) = (table?, address?, data_type?);

    if table.is_bits() {
        if data_type != DataType::Bool {
            s.problem(
                "type",
                format!(
                    "a {} table holds single bits: type must be \"bool\", found {:?}",
                    table,
                    data_type.name()
                ),
            );
            return None;
        }
        if has_bit {
            s.problem("bit", "`bit` selects a bit of a register; coils and discrete inputs are bits already");
            return None;
        }
    } else if data_type == DataType::Bool && !has_bit {
        s.problem("type", "bool on a register table needs `bit` (0-15) to say which bit of the register");
        return None;
    } else if has_bit && data_type != DataType::Bool {
        s.problem(
            "bit",
            format!("`bit` reads one bit as bool: type must be \"bool\", found {:?}", data_type.name()),
        );
        return None;
    }
    if data_type == DataType::String && length.is_none() {
        if !s.has("length") {
            s.problem("type", "a string needs `length` (registers, 1-125)");
        }
        return None;
    }
    if data_type != DataType::String && s.has("length") {
        s.problem("length", "`length` applies to type \"string\" only");
        return None;
    }
    if has_bit && bit.is_none() {
        return None;
    }
    let count = data_type.registers().or(length.map(|l| l as u16))?;
    if address + i64::from(count) > 65536 {
        s.problem(
            "address",
            format!("address {address} + {count} registers runs past the end of the table (65536)"),
        );
        return None;
    }
    Some(ModbusPoint {
        table,
        address: address as u16,
        data_type,
        word_order,
        bit: bit.map(|b| b as u8),
        count,
        scale,
        offset,
    })
}

/// Checks the shape of an OPC UA node ID string (`ns=2;s=Line1.Temp`, `i=2258`).
fn check_node_id(n: &str) -> Result<(), String> {
    let body = match n.strip_prefix("ns=") {
        Some(rest) => {
            let (ns, body) = rest
                .split_once(';')
                .ok_or_else(|| format!("must look like \"ns=2;s=Line1.Temp\", found {n:?}"))?;
            ns.parse::<u16>().map_err(|_| format!("namespace index must be 0-65535, found {ns:?}"))?;
            body
        }
        None => n,
    };
    let ok = match body.split_once('=') {
        Some(("i", v)) => v.parse::<u32>().is_ok(),
        Some(("s" | "g" | "b", v)) => !v.is_empty(),
        _ => false,
    };
    if ok { Ok(()) } else { Err(format!("must look like \"ns=2;s=Line1.Temp\" or \"i=2258\", found {n:?}")) }
}
