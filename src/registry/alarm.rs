//! A sensor's limit alarms as its device file defines them (`[[sensors.alarms]]`,
//! `docs/device-files.md`): a name (the alarm's ID is `SENSOR_ID.NAME`), a type, a limit
//! in the sensor's units, a deadband on clearing, on and off delays, a priority and the
//! message an operator reads.

use std::time::Duration;

/// What an alarm watches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::VariantNames, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum AlarmKind {
    High,
    HighHigh,
    Low,
    LowLow,
    /// A boolean away from its normal state.
    OffNormal,
}

impl AlarmKind {
    /// Whether it activates above its limit (high, high-high).
    pub fn is_high(self) -> bool {
        matches!(self, AlarmKind::High | AlarmKind::HighHigh)
    }

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// How urgent an alarm is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    strum::EnumString,
    strum::VariantNames,
    strum::IntoStaticStr,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum AlarmPriority {
    Low,
    Medium,
    High,
    Critical,
}

impl AlarmPriority {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlarmDef {
    /// `[A-Z0-9_]{1,16}`, unique per sensor.
    pub name: String,
    pub kind: AlarmKind,
    /// In the sensor's units (high and low kinds).
    pub limit: f64,
    /// Clears only below `limit - deadband` (above `limit + deadband` for low kinds).
    pub deadband: f64,
    /// Beyond the limit this long (in sample time) before it activates.
    pub on_delay: Duration,
    /// Back inside this long before it clears.
    pub off_delay: Duration,
    /// `off_normal`: the boolean's normal state.
    pub normal: bool,
    pub priority: AlarmPriority,
    pub message: String,
}

/// Whether `name` is an alarm name: 1 to 16 of `A-Z`, `0-9` and `_`.
pub fn is_alarm_name(name: &str) -> bool {
    (1..=16).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}
