//! The mapping from fieldgate's sensors to Sparkplug metrics: name, alias, datatype,
//! value and properties (docs/sparkplug.md has the table).

use crate::driver::normalize;
use crate::registry::{DataType, Device, Sensor, SensorSource};
use crate::store::gorilla::Stored;

use crate::spb::payload::{Metric, PropertySet, PropertyValue, Value, datatype as dt};

/// Codes of the `Quality` property, indexed by fieldgate's quality 0 good, 1 uncertain,
/// 2 bad. Sparkplug 3.0 allows only 192 (good), 0 (bad) and 500 (stale): an uncertain value
/// (an OPC UA Uncertain status, such as its last usable value) is sent as 500.
pub const QUALITY: [i32; 3] = [192, 500, 0];

/// A metric's alias: unique across the edge node, stable while the registry is.
pub fn alias(sensor: &Sensor) -> u64 {
    (sensor.place.sensor as u64).wrapping_add(1)
}

/// The Sparkplug datatype of a sensor: its register type when the value is sent as read,
/// Double when scale or offset make it a measurement in engineering units; an OPC UA
/// sensor's from its value (`current`), Double when none is known yet.
pub fn datatype_of(sensor: &Sensor, current: Option<&Stored>) -> u32 {
    match &sensor.source {
        SensorSource::Modbus(p) => {
            let unscaled = p.scale == 1.0 && p.offset == 0.0;
            match p.data_type {
                DataType::Bool => dt::BOOLEAN,
                DataType::String => dt::STRING,
                _ if !unscaled => dt::DOUBLE,
                DataType::U16 => dt::UINT16,
                DataType::I16 => dt::INT16,
                DataType::U32 => dt::UINT32,
                DataType::I32 => dt::INT32,
                DataType::U64 => dt::UINT64,
                DataType::I64 => dt::INT64,
                DataType::F32 => dt::FLOAT,
                DataType::F64 => dt::DOUBLE,
            }
        }
        SensorSource::OpcUa { .. } | SensorSource::Edge(_) => match current {
            Some(Stored::Bool(_)) => dt::BOOLEAN,
            Some(Stored::Text(_)) => dt::STRING,
            Some(Stored::Int(_)) => dt::INT64,
            Some(Stored::UInt(_)) => dt::UINT64,
            _ => dt::DOUBLE,
        },
    }
}

/// A stored sample's value as `datatype`, in the sensor's units.
pub fn value_of(sensor: &Sensor, datatype: u32, v: &Stored) -> Option<Value> {
    let number = match v {
        Stored::Float(f) => Some(*f),
        Stored::Int(i) => Some(*i as f64),
        Stored::UInt(u) => Some(*u as f64),
        Stored::Bool(b) => Some(f64::from(u8::from(*b))),
        Stored::Text(_) => None,
    };
    let number = match (&sensor.source, number) {
        (SensorSource::Modbus(p), Some(n)) => normalize(p, &crate::driver::RawValue::Float(n)).as_f64(),
        (_, n) => n,
    };
    // Integers as they came, exactly (the number above is for scaled values and checks).
    let int = || match v {
        Stored::Int(i) => Some(*i),
        Stored::UInt(u) => Some(*u as i64),
        _ => number.filter(|n| n.is_finite()).map(|n| n.round() as i64),
    };
    Some(match datatype {
        dt::BOOLEAN => Value::Boolean(match v {
            Stored::Bool(b) => *b,
            _ => number? != 0.0,
        }),
        dt::STRING => Value::String(match v {
            Stored::Text(t) => t.clone(),
            Stored::Bool(b) => b.to_string(),
            _ => number?.to_string(),
        }),
        dt::FLOAT => Value::Float(number? as f32),
        dt::INT8 | dt::INT16 | dt::INT32 => Value::Int(int()? as i32 as u32),
        dt::UINT8 | dt::UINT16 => Value::Int(int()? as u32),
        // UInt32 travels in `long_value`, as Int64 and UInt64 do (the specification's table).
        dt::UINT32 => Value::Long(u64::from(int()? as u32)),
        dt::INT64 | dt::UINT64 => Value::Long(int()? as u64),
        _ => Value::Double(number?),
    })
}

/// A metric of a DBIRTH: name, alias, datatype, the current value (null when none is
/// known) and the sensor's properties, with what a host application needs to serve it as
/// the edge does (its device's protocol, its type in the device file, whether the edge keeps
/// its history, and `every_ms`: the longest the edge goes without sending it).
pub fn birth(
    sensor: &Sensor,
    device: &Device,
    every_ms: u64,
    datatype: u32,
    current: Option<(i64, &Stored, u8)>,
) -> Metric {
    let value = current.and_then(|(_, v, _)| value_of(sensor, datatype, v));
    let mut m = Metric::new(Some(sensor.id.as_str()), Some(alias(sensor)), datatype, value);
    m.timestamp = current.map(|(t, _, _)| t as u64);
    let mut p = PropertySet::default();
    p.push("engUnit", PropertyValue::string(&sensor.unit));
    p.push("kind", PropertyValue::string(&sensor.kind));
    p.push("description", PropertyValue::string(&sensor.description));
    if let Some(r) = sensor.range {
        p.push("engLow", PropertyValue::double(r.min));
        p.push("engHigh", PropertyValue::double(r.max));
    }
    if let Some(e) = &sensor.equipment {
        p.push("equipment", PropertyValue::string(e));
    }
    p.push("protocol", PropertyValue::string(device.protocol.name()));
    if let SensorSource::Modbus(point) = &sensor.source {
        p.push("dataType", PropertyValue::string(point.data_type.into()));
    }
    p.push("history", PropertyValue::boolean(device.poll_interval.is_some()));
    p.push("expectedIntervalMs", PropertyValue::long(every_ms));
    // No value yet: nothing known about it, which is what bad quality says.
    let q = current.map_or(2, |(_, _, q)| q);
    p.push("Quality", PropertyValue::int32(QUALITY[usize::from(q.min(2))]));
    m.properties = Some(p);
    m
}

/// A metric of a DDATA: alias only, the sample's time, and `Quality` when it is not good
/// or has just changed.
pub fn data(
    sensor: &Sensor,
    datatype: u32,
    t: i64,
    v: &Stored,
    q: u8,
    quality_changed: bool,
    historical: bool,
) -> Metric {
    let mut m = Metric::new(None, Some(alias(sensor)), datatype, value_of(sensor, datatype, v));
    m.timestamp = Some(t as u64);
    if historical {
        m.is_historical = Some(true);
    }
    if q != 0 || quality_changed {
        let mut p = PropertySet::default();
        p.push("Quality", PropertyValue::int32(QUALITY[usize::from(q.min(2))]));
        m.properties = Some(p);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{ModbusPoint, NormalRange, RegisterTable, WordOrder};

    fn modbus(t: DataType, scale: f64) -> Sensor {
        let p = ModbusPoint {
            table: RegisterTable::Holding,
            address: 0,
            data_type: t,
            word_order: WordOrder::ABCD,
            bit: None,
            count: 1,
            scale,
            offset: 0.0,
        };
        Sensor::for_tests(SensorSource::Modbus(p), "bar", Some(NormalRange { min: 0.0, max: 10.0 }))
    }

    #[test]
    fn datatypes_and_values() {
        let s = modbus(DataType::I16, 1.0);
        assert_eq!(datatype_of(&s, None), dt::INT16);
        assert_eq!(value_of(&s, dt::INT16, &Stored::Int(-2)), Some(Value::Int(-2i32 as u32)));
        let s = modbus(DataType::U16, 0.1);
        assert_eq!(datatype_of(&s, None), dt::DOUBLE);
        assert_eq!(value_of(&s, dt::DOUBLE, &Stored::Int(125)), Some(Value::Double(12.5)));
        let u = modbus(DataType::U64, 1.0);
        assert_eq!(datatype_of(&u, None), dt::UINT64);
        assert_eq!(value_of(&u, dt::UINT64, &Stored::UInt(u64::MAX)), Some(Value::Long(u64::MAX)));
        assert_eq!(datatype_of(&modbus(DataType::Bool, 1.0), None), dt::BOOLEAN);
        assert_eq!(value_of(&s, dt::BOOLEAN, &Stored::Bool(true)), Some(Value::Boolean(true)));
        let ua = Sensor::for_tests(SensorSource::OpcUa { node_id: "ns=2;i=1".into() }, "", None);
        assert_eq!(datatype_of(&ua, Some(&Stored::Text("x".into()))), dt::STRING);
        assert_eq!(datatype_of(&ua, None), dt::DOUBLE);
        // A value that does not fit the birth's datatype is sent as null, not invented.
        assert_eq!(value_of(&ua, dt::DOUBLE, &Stored::Text("x".into())), None);
    }

    #[test]
    fn birth_and_data_metrics() {
        let s = modbus(DataType::U16, 0.1);
        let registry = crate::registry::Registry::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("devices"),
        )
        .unwrap();
        let d = &registry.devices()[0];
        let m = birth(&s, d, 60_000, dt::DOUBLE, Some((5, &Stored::Int(10), 0)));
        assert_eq!(
            (m.name.as_deref(), m.alias, m.timestamp),
            (Some("A_LINE1_042"), Some(alias(&s)), Some(5))
        );
        let p = m.properties.unwrap();
        assert_eq!(p.get("engUnit"), Some(&PropertyValue::string("bar")));
        assert_eq!(p.get("engHigh"), Some(&PropertyValue::double(10.0)));
        assert_eq!(p.get("Quality"), Some(&PropertyValue::int32(192)));
        // What a host needs to serve the sensor as the edge does.
        assert_eq!(p.get("protocol"), Some(&PropertyValue::string(d.protocol.name())));
        assert_eq!(p.get("dataType"), Some(&PropertyValue::string("u16")));
        assert_eq!(p.get("history"), Some(&PropertyValue::boolean(d.poll_interval.is_some())));
        assert_eq!(p.get("expectedIntervalMs"), Some(&PropertyValue::long(60_000)));
        assert_eq!(p.get("equipment"), None);
        let m = birth(&s, d, 60_000, dt::DOUBLE, None);
        assert_eq!(m.is_null, Some(true));
        let d = data(&s, dt::DOUBLE, 7, &Stored::Int(20), 0, false, true);
        assert_eq!((d.name, d.is_historical, d.properties), (None, Some(true), None));
        let d = data(&s, dt::DOUBLE, 7, &Stored::Int(20), 2, true, false);
        assert_eq!(d.properties.unwrap().get("Quality"), Some(&PropertyValue::int32(0)));
        // Sparkplug 3.0 knows 192, 0 and 500 only: uncertain is 500 ("stale"), never OPC's 64.
        let d = data(&s, dt::DOUBLE, 7, &Stored::Int(20), 1, true, false);
        assert_eq!(d.properties.unwrap().get("Quality"), Some(&PropertyValue::int32(500)));
    }
}
