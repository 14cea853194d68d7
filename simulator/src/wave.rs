//! Waveforms: what each simulated sensor measures over time.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::faults::Faults;

/// A simulated value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SimValue {
    Num(f64),
    Bool(bool),
    Text(String),
}

/// One sensor's signal. Times are seconds since the simulator started.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "wave", rename_all = "snake_case", deny_unknown_fields)]
pub enum Wave {
    /// A fixed number (or 0/1 for booleans).
    Constant { value: f64 },
    /// `mean + amplitude * sin(2π (t / period_s + phase))`.
    Sine {
        mean: f64,
        amplitude: f64,
        period_s: f64,
        #[serde(default)]
        phase: f64,
    },
    /// A sawtooth from `from` to `to` over `period_s`, then again.
    Ramp { from: f64, to: f64, period_s: f64 },
    /// Steps of ±`step` every `interval_s`, kept within `[min, max]`, reproducible from `seed`.
    RandomWalk {
        start: f64,
        step: f64,
        min: f64,
        max: f64,
        #[serde(default = "one")]
        interval_s: f64,
        #[serde(default)]
        seed: u64,
    },
    /// `before` until `at_s`, then `after`.
    Step { before: f64, after: f64, at_s: f64 },
    /// A fixed text, for string sensors.
    Text { text: String },
}

fn one() -> f64 {
    1.0
}

/// SplitMix64: small, fast and good enough for reproducible noise.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Wave {
    /// The value at `t` seconds.
    pub fn at(&self, t: f64) -> SimValue {
        SimValue::Num(match self {
            Wave::Constant { value } => *value,
            Wave::Sine { mean, amplitude, period_s, phase } => {
                mean + amplitude * (std::f64::consts::TAU * (t / period_s.max(1e-9) + phase)).sin()
            }
            Wave::Ramp { from, to, period_s } => {
                let p = period_s.max(1e-9);
                from + (to - from) * ((t % p) / p)
            }
            Wave::RandomWalk { start, step, min, max, interval_s, seed } => {
                // Deterministic in t: the walk is replayed from its seed, so any time can be
                // asked for in any order. Walks here are short (minutes of demo time).
                let ticks = (t / interval_s.max(1e-3)).floor().max(0.0) as u64;
                let mut v = *start;
                for k in 0..ticks.min(1_000_000) {
                    let up = splitmix(seed ^ k) & 1 == 1;
                    v = (if up { v + step } else { v - step }).clamp(*min, *max);
                }
                v
            }
            Wave::Step { before, after, at_s } => {
                if t < *at_s {
                    *before
                } else {
                    *after
                }
            }
            Wave::Text { text } => return SimValue::Text(text.clone()),
        })
    }
}

/// A scenario: waveforms per sensor and faults per device.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Seeds fault injection (which requests fail), so runs are reproducible.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub sensors: BTreeMap<String, Wave>,
    #[serde(default)]
    pub faults: BTreeMap<String, Faults>,
    /// The user an OPC UA device with `username_env` accepts, by device ID. Without an
    /// entry the simulator reads the environment variables the device file names.
    #[serde(default)]
    pub opcua_users: BTreeMap<String, UaUser>,
    /// Where the OPC UA servers keep their certificates (one folder per device); by
    /// default a temporary folder that lives as long as the simulator.
    #[serde(default)]
    pub opcua_pki_dir: Option<std::path::PathBuf>,
}

/// A user name and password an OPC UA device accepts.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UaUser {
    pub user: String,
    pub password: String,
}

#[derive(Debug, thiserror::Error)]
#[error("scenario {path}: {message}")]
pub struct ScenarioError {
    pub path: String,
    pub message: String,
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let err = |message: String| ScenarioError { path: path.display().to_string(), message };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Scenario::parse(&path.display().to_string(), &text)
    }

    /// A scenario from TOML text; `name` is used in messages.
    pub fn parse(name: &str, text: &str) -> Result<Scenario, ScenarioError> {
        toml::from_str(text)
            .map_err(|e| ScenarioError { path: name.to_string(), message: e.message().to_string() })
    }
}

/// The demo plant's scenario, built in (the same text as `simulator/scenarios/demo.toml`).
pub const DEMO_SCENARIO: &str = include_str!("../scenarios/demo.toml");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves() {
        assert_eq!(Wave::Constant { value: 2.0 }.at(100.0), SimValue::Num(2.0));
        assert_eq!(Wave::Ramp { from: 0.0, to: 10.0, period_s: 10.0 }.at(12.5), SimValue::Num(2.5));
        assert_eq!(Wave::Step { before: 1.0, after: 5.0, at_s: 3.0 }.at(2.9), SimValue::Num(1.0));
        let SimValue::Num(s) = (Wave::Sine { mean: 5.0, amplitude: 2.0, period_s: 4.0, phase: 0.0 }).at(1.0)
        else {
            panic!()
        };
        assert!((s - 7.0).abs() < 1e-12);
        let w = Wave::RandomWalk { start: 5.0, step: 1.0, min: 0.0, max: 10.0, interval_s: 1.0, seed: 7 };
        assert_eq!(w.at(50.0), w.at(50.0));
        assert!(matches!(w.at(50.0), SimValue::Num(v) if (0.0..=10.0).contains(&v)));
    }
}
