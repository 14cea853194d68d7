//! Sparkplug B payloads: the protobuf messages of the specification (Eclipse Tahu's
//! `sparkplug_b.proto`, proto2), written here with `prost` from the specification's
//! field numbers (no schema file, no `protoc`), and the small builders the edge node uses.
//!
//! Only what an edge node sends and the commands it reads are defined; fields of other
//! parts of the schema (metadata, data sets, templates) are skipped by the decoder as
//! unknown fields, as protobuf does.

use prost::Message;

/// `Payload`: one Sparkplug message's body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    /// When the message was sent, ms since the Unix epoch.
    #[prost(uint64, optional, tag = "1")]
    pub timestamp: Option<u64>,
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
    /// 0–255, on every message but NDEATH.
    #[prost(uint64, optional, tag = "3")]
    pub seq: Option<u64>,
    #[prost(string, optional, tag = "4")]
    pub uuid: Option<String>,
    #[prost(bytes = "vec", optional, tag = "5")]
    pub body: Option<Vec<u8>>,
}

/// `Payload.Metric`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(uint64, optional, tag = "2")]
    pub alias: Option<u64>,
    /// The sample's own time, ms since the Unix epoch.
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    /// One of the [`datatype`] numbers.
    #[prost(uint32, optional, tag = "4")]
    pub datatype: Option<u32>,
    #[prost(bool, optional, tag = "5")]
    pub is_historical: Option<bool>,
    #[prost(bool, optional, tag = "6")]
    pub is_transient: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub is_null: Option<bool>,
    #[prost(message, optional, tag = "9")]
    pub properties: Option<PropertySet>,
    #[prost(oneof = "Value", tags = "10, 11, 12, 13, 14, 15, 16")]
    pub value: Option<Value>,
}

/// `Payload.Metric.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    /// Int8, Int16, Int32 (two's complement in 32 bits), UInt8, UInt16.
    #[prost(uint32, tag = "10")]
    Int(u32),
    /// UInt32, Int64 (two's complement), UInt64, DateTime.
    #[prost(uint64, tag = "11")]
    Long(u64),
    #[prost(float, tag = "12")]
    Float(f32),
    #[prost(double, tag = "13")]
    Double(f64),
    #[prost(bool, tag = "14")]
    Boolean(bool),
    /// String, Text, UUID.
    #[prost(string, tag = "15")]
    String(String),
    #[prost(bytes = "vec", tag = "16")]
    Bytes(Vec<u8>),
}

/// `Payload.PropertySet`: parallel lists of keys and values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PropertySet {
    #[prost(string, repeated, tag = "1")]
    pub keys: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    pub values: Vec<PropertyValue>,
}

/// `Payload.PropertyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PropertyValue {
    #[prost(uint32, optional, tag = "1")]
    pub r#type: Option<u32>,
    #[prost(bool, optional, tag = "2")]
    pub is_null: Option<bool>,
    #[prost(oneof = "PropertyValueKind", tags = "3, 4, 5, 6, 7, 8")]
    pub value: Option<PropertyValueKind>,
}

/// `Payload.PropertyValue.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum PropertyValueKind {
    #[prost(uint32, tag = "3")]
    Int(u32),
    #[prost(uint64, tag = "4")]
    Long(u64),
    #[prost(float, tag = "5")]
    Float(f32),
    #[prost(double, tag = "6")]
    Double(f64),
    #[prost(bool, tag = "7")]
    Boolean(bool),
    #[prost(string, tag = "8")]
    String(String),
}

/// The specification's `DataType` numbers (those fieldgate uses).
pub mod datatype {
    pub const INT8: u32 = 1;
    pub const INT16: u32 = 2;
    pub const INT32: u32 = 3;
    pub const INT64: u32 = 4;
    pub const UINT8: u32 = 5;
    pub const UINT16: u32 = 6;
    pub const UINT32: u32 = 7;
    pub const UINT64: u32 = 8;
    pub const FLOAT: u32 = 9;
    pub const DOUBLE: u32 = 10;
    pub const BOOLEAN: u32 = 11;
    pub const STRING: u32 = 12;
}

/// A payload from the broker that is not a Sparkplug payload.
#[derive(Debug, thiserror::Error)]
#[error("not a Sparkplug B payload: {0}")]
pub struct DecodeError(#[from] prost::DecodeError);

impl Payload {
    pub fn encode_to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    pub fn decode_bytes(bytes: &[u8]) -> Result<Payload, DecodeError> {
        Ok(Payload::decode(bytes)?)
    }
}

impl PropertySet {
    pub fn push(&mut self, key: &str, value: PropertyValue) {
        self.keys.push(key.to_string());
        self.values.push(value);
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&PropertyValue> {
        self.keys.iter().position(|k| k == key).and_then(|i| self.values.get(i))
    }
}

impl PropertyValue {
    pub fn string(s: &str) -> PropertyValue {
        PropertyValue {
            r#type: Some(datatype::STRING),
            is_null: None,
            value: Some(PropertyValueKind::String(s.to_string())),
        }
    }

    pub fn double(v: f64) -> PropertyValue {
        PropertyValue {
            r#type: Some(datatype::DOUBLE),
            is_null: None,
            value: Some(PropertyValueKind::Double(v)),
        }
    }

    pub fn long(v: u64) -> PropertyValue {
        PropertyValue {
            r#type: Some(datatype::UINT64),
            is_null: None,
            value: Some(PropertyValueKind::Long(v)),
        }
    }

    pub fn boolean(v: bool) -> PropertyValue {
        PropertyValue {
            r#type: Some(datatype::BOOLEAN),
            is_null: None,
            value: Some(PropertyValueKind::Boolean(v)),
        }
    }

    pub fn int32(v: i32) -> PropertyValue {
        PropertyValue {
            r#type: Some(datatype::INT32),
            is_null: None,
            value: Some(PropertyValueKind::Int(v as u32)),
        }
    }
}

impl Metric {
    /// A metric carrying `value` as `datatype`.
    pub fn new(name: Option<&str>, alias: Option<u64>, datatype: u32, value: Option<Value>) -> Metric {
        Metric {
            name: name.map(str::to_string),
            alias,
            timestamp: None,
            datatype: Some(datatype),
            is_historical: None,
            is_transient: None,
            is_null: value.is_none().then_some(true),
            properties: None,
            value,
        }
    }

    /// The value as a number, when it is one (signed types read as the specification
    /// stores them).
    pub fn as_f64(&self) -> Option<f64> {
        let signed32 = |v: u32| v as i32 as f64;
        match (&self.value, self.datatype) {
            (Some(Value::Int(v)), Some(datatype::INT8 | datatype::INT16 | datatype::INT32)) => {
                Some(signed32(*v))
            }
            (Some(Value::Int(v)), _) => Some(*v as f64),
            (Some(Value::Long(v)), Some(datatype::INT64)) => Some(*v as i64 as f64),
            (Some(Value::Long(v)), _) => Some(*v as f64),
            (Some(Value::Float(v)), _) => Some(*v as f64),
            (Some(Value::Double(v)), _) => Some(*v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_specification_field_numbers() {
        // Hand-assembled protobuf: field 1 varint 5, field 3 varint 7; one metric (field 2)
        // with name "a" (1), alias 3 (2), datatype 10 (4), double 1.5 (13).
        let m = Metric::new(Some("a"), Some(3), datatype::DOUBLE, Some(Value::Double(1.5)));
        let p = Payload { timestamp: Some(5), metrics: vec![m], seq: Some(7), uuid: None, body: None };
        let bytes = p.encode_to_bytes();
        let mut metric = vec![0x0a, 1, b'a', 0x10, 3, 0x20, 10, 0x69];
        metric.extend_from_slice(&1.5f64.to_le_bytes());
        let mut want = vec![0x08, 5, 0x12, metric.len() as u8];
        want.extend(metric);
        want.extend([0x18, 7]);
        assert_eq!(bytes, want);
        assert_eq!(Payload::decode_bytes(&bytes).unwrap(), p);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for junk in [&b"\xff\xff\xff"[..], b"\x12\x05ab", b"{\"online\":true}", b"\x0a"] {
            assert!(Payload::decode_bytes(junk).is_err(), "{junk:?}");
        }
        assert_eq!(Payload::decode_bytes(b"").unwrap(), Payload::default());
    }

    #[test]
    fn signed_values_read_back() {
        let m = Metric::new(None, None, datatype::INT16, Some(Value::Int(-3i32 as u32)));
        assert_eq!(m.as_f64(), Some(-3.0));
        let m = Metric::new(None, None, datatype::INT64, Some(Value::Long(-9i64 as u64)));
        assert_eq!(m.as_f64(), Some(-9.0));
        assert_eq!(Metric::new(None, None, datatype::DOUBLE, None).is_null, Some(true));
    }
}
