//! Identifier newtypes, parsed once at the edge.
//!
//! Once a value has one of these types it is valid: `SensorId` always matches
//! `PLANT_ZONE_NNN`, `DeviceId` always matches `[a-z0-9-]{1,64}`. Nothing else in
//! the crate re-checks the grammar.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The sensor ID grammar, as the tool schemas and docs state it.
pub const SENSOR_ID_PATTERN: &str = "^[A-Z][A-Z0-9]{0,7}_[A-Z][A-Z0-9]{0,15}_[0-9]{3}$";
/// The device ID grammar.
pub const DEVICE_ID_PATTERN: &str = "^[a-z0-9-]{1,64}$";
/// The plant grammar (first part of a sensor ID).
pub const PLANT_PATTERN: &str = "^[A-Z][A-Z0-9]{0,7}$";
/// The zone grammar (second part of a sensor ID).
pub const ZONE_PATTERN: &str = "^[A-Z][A-Z0-9]{0,15}$";

/// Why a string is not a valid identifier. The text is safe to show to callers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("sensor ID must have the form PLANT_ZONE_NNN, e.g. A_LINE1_042")]
    SensorShape,
    #[error("PLANT must be 1-8 characters of A-Z and 0-9, starting with a letter")]
    Plant,
    #[error("ZONE must be 1-16 characters of A-Z and 0-9, starting with a letter")]
    Zone,
    #[error("NNN must be exactly three digits")]
    Number,
    #[error("device ID must be 1-64 characters of a-z, 0-9 and '-'")]
    Device,
}

fn is_part(s: &str, max: usize) -> bool {
    // Bytes, not chars: every byte of a non-ASCII character fails both tests anyway.
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(c) if c.is_ascii_uppercase())
        && s.len() <= max
        && bytes.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// Validates a plant code (`A`, `NORTH2`).
pub fn check_plant(s: &str) -> Result<(), IdError> {
    if is_part(s, 8) { Ok(()) } else { Err(IdError::Plant) }
}

/// Validates a zone code (`LINE1`, `OVEN2`).
pub fn check_zone(s: &str) -> Result<(), IdError> {
    if is_part(s, 16) { Ok(()) } else { Err(IdError::Zone) }
}

/// A sensor ID of the form `PLANT_ZONE_NNN`, e.g. `A_LINE1_042`.
///
/// ```
/// use fieldgate::ids::SensorId;
///
/// let id: SensorId = "A_LINE1_042".parse().unwrap();
/// assert_eq!((id.plant(), id.zone(), id.number()), ("A", "LINE1", 42));
/// // Input is never corrected: lower case is an error, not a guess.
/// assert!("a_line1_042".parse::<SensorId>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SensorId {
    text: Box<str>,
    plant_len: u8,
    zone_len: u8,
}

impl SensorId {
    pub fn as_str(&self) -> &str {
        &self.text
    }
    pub fn plant(&self) -> &str {
        &self.text[..self.plant_len as usize]
    }
    pub fn zone(&self) -> &str {
        let start = self.plant_len as usize + 1;
        &self.text[start..start + self.zone_len as usize]
    }
    pub fn number(&self) -> u16 {
        let n = &self.text[self.text.len() - 3..];
        n.bytes().fold(0u16, |acc, b| acc * 10 + u16::from(b - b'0'))
    }
}

/// Whether `s` matches `SENSOR_ID_PATTERN`, without a regex or building a `SensorId`: for
/// input schemas, which check up to a hundred IDs per call.
pub fn is_sensor_id(s: &str) -> bool {
    // NNN is the last three bytes, after the last `_`: no search from the end.
    let b = s.as_bytes();
    let Some(head_len) = b.len().checked_sub(4) else { return false };
    if b[head_len] != b'_' || !b[head_len + 1..].iter().all(u8::is_ascii_digit) {
        return false;
    }
    // Cut at ASCII `_`s, so both slices fall on character boundaries.
    let head = &s[..head_len];
    let Some(cut) = head.bytes().position(|c| c == b'_') else { return false };
    is_part(&head[..cut], 8) && is_part(&head[cut + 1..], 16)
}

impl FromStr for SensorId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split('_');
        let (Some(plant), Some(zone), Some(num), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(IdError::SensorShape);
        };
        check_plant(plant)?;
        check_zone(zone)?;
        if num.len() != 3 || !num.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IdError::Number);
        }
        Ok(SensorId { text: s.into(), plant_len: plant.len() as u8, zone_len: zone.len() as u8 })
    }
}

/// A device ID: 1-64 characters of `[a-z0-9-]`, e.g. `a-line1-plc`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(Box<str>);

impl DeviceId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DeviceId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok { Ok(DeviceId(s.into())) } else { Err(IdError::Device) }
    }
}

macro_rules! id_traits {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.as_str())
            }
        }
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
id_traits!(SensorId);
id_traits!(DeviceId);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sensor_id_parts() {
        let id: SensorId = "A_LINE1_042".parse().unwrap();
        assert_eq!((id.plant(), id.zone(), id.number()), ("A", "LINE1", 42));
        assert_eq!(id.to_string(), "A_LINE1_042");
    }

    #[test]
    fn sensor_id_rejections() {
        for (bad, why) in [
            ("a_line1_042", IdError::Plant),
            ("A_line1_042", IdError::Zone),
            ("A_LINE1_42", IdError::Number),
            ("A_LINE1_0042", IdError::Number),
            ("A_LINE1", IdError::SensorShape),
            ("A_LINE_1_042", IdError::SensorShape),
            ("1A_LINE1_042", IdError::Plant),
            ("ABCDEFGHI_LINE1_042", IdError::Plant),
            ("A_ABCDEFGHIJKLMNOPQ_042", IdError::Zone),
            ("", IdError::SensorShape),
            ("A_LINE1_04٢", IdError::Number),
        ] {
            assert_eq!(bad.parse::<SensorId>().err(), Some(why), "{bad}");
        }
    }

    fn regex_match(s: &str) -> bool {
        // An independent reading of SENSOR_ID_PATTERN, written without the parser.
        let parts: Vec<&str> = s.split('_').collect();
        parts.len() == 3
            && (1..=8).contains(&parts[0].len())
            && (1..=16).contains(&parts[1].len())
            && parts[0].starts_with(|c: char| c.is_ascii_uppercase())
            && parts[1].starts_with(|c: char| c.is_ascii_uppercase())
            && parts[..2].iter().all(|p| p.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
            && parts[2].len() == 3
            && parts[2].chars().all(|c| c.is_ascii_digit())
    }

    proptest! {
        #[test]
        fn accepts_every_id_of_the_grammar(s in "[A-Z][A-Z0-9]{0,7}_[A-Z][A-Z0-9]{0,15}_[0-9]{3}") {
            let id: SensorId = s.parse().unwrap();
            prop_assert_eq!(id.as_str(), s.as_str());
            prop_assert_eq!(format!("{}_{}_{:03}", id.plant(), id.zone(), id.number()), s);
        }

        #[test]
        fn agrees_with_the_grammar_on_near_misses(s in "[A-Za-z0-9_ -]{0,30}") {
            prop_assert_eq!(s.parse::<SensorId>().is_ok(), regex_match(&s), "{}", s);
        }

        #[test]
        fn is_sensor_id_is_the_pattern(s in prop_oneof![
            "[A-Z][A-Z0-9]{0,9}_[A-Z][A-Z0-9]{0,17}_[0-9]{2,4}\n?",
            "[A-Za-z0-9]{0,10}_[A-Z0-9a_]{0,18}_[0-9٢]{2,4}",
            "([A-Z0-9_]|[a-z\\-٢É\n]){0,30}",
        ]) {
            // Input schemas check sensor IDs with `is_sensor_id` in place of the pattern.
            let pattern = regex::Regex::new(SENSOR_ID_PATTERN).unwrap();
            prop_assert_eq!(is_sensor_id(&s), pattern.is_match(&s), "{:?}", s);
        }

        #[test]
        fn rejects_lowercase(s in "[a-z][a-z0-9]{0,7}_[A-Z][A-Z0-9]{0,15}_[0-9]{3}") {
            prop_assert!(s.parse::<SensorId>().is_err());
        }

        #[test]
        fn rejects_wrong_digit_counts(s in "[A-Z]{1,8}_[A-Z]{1,16}_([0-9]{0,2}|[0-9]{4,6})") {
            prop_assert!(s.parse::<SensorId>().is_err());
        }

        #[test]
        fn device_ids(s in "[a-z0-9-]{1,64}") {
            prop_assert!(s.parse::<DeviceId>().is_ok());
        }

        #[test]
        fn device_id_rejections(s in "[a-z0-9-]{0,10}[A-Z_ .][a-z0-9-]{0,10}") {
            prop_assert!(s.parse::<DeviceId>().is_err());
        }
    }
}
