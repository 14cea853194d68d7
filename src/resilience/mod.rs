//! Resilience between the tools and the drivers: a circuit breaker per device, bounded
//! retries inside a call's deadline, the cross-call retry limit, and device health.
//!
//! The tools and (later) the poller read devices only through [`Resilience::read`], so they
//! share each device's breaker: an open device is neither read nor polled until its probe.

pub mod breaker;
pub mod health;
pub mod repeat;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Config;
use crate::driver::{Driver, DriverError, ReadOptions, Sample};
use crate::ids::DeviceId;
use crate::registry::{Device, Registry, Sensor};
use breaker::{Breaker, BreakerSettings, Outcome};
use health::Health;

/// Why a sensor could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Driver(DriverError),
    /// The device's breaker is open; a probe is allowed after `retry_after`.
    CircuitOpen {
        retry_after: Duration,
    },
}

/// The breaker and health of one device.
pub struct Guard {
    pub breaker: Breaker,
    pub health: Health,
}

/// Retry settings of calls.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub first_backoff: Duration,
}

pub struct Resilience {
    guards: HashMap<DeviceId, Guard>,
    retry: RetryPolicy,
}

/// Breaker settings of a device: its own where its file sets them, else the defaults.
pub fn breaker_settings(config: &Config, device: &Device) -> BreakerSettings {
    let b = &config.breaker;
    let o = device.breaker.unwrap_or_default();
    BreakerSettings {
        failure_threshold: o.failure_threshold.unwrap_or(b.failure_threshold),
        failure_rate_percent: o.failure_rate_percent.unwrap_or(b.failure_rate_percent),
        window_size: o.window_size.unwrap_or(b.window_size),
        min_calls: o.min_calls.unwrap_or(b.min_calls),
        open: Duration::from_millis(o.open_ms.unwrap_or(b.open_ms)),
        max_open: Duration::from_millis(o.max_open_ms.unwrap_or(b.max_open_ms)),
    }
}

/// A number in [0, 1) for backoff jitter.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one(std::time::SystemTime::now());
    (n >> 11) as f64 / (1u64 << 53) as f64
}

impl Resilience {
    pub fn new(registry: &Registry, config: &Config) -> Resilience {
        let guards = registry
            .devices()
            .iter()
            .map(|d| {
                (
                    d.id.clone(),
                    Guard { breaker: Breaker::new(breaker_settings(config, d)), health: Health::default() },
                )
            })
            .collect();
        let retry = RetryPolicy {
            max_retries: config.calls.max_retries,
            first_backoff: Duration::from_millis(config.calls.retry_backoff_ms),
        };
        Resilience { guards, retry }
    }

    pub fn guard(&self, device: &DeviceId) -> Option<&Guard> {
        self.guards.get(device)
    }

    /// Reads `sensors` of one device through its breaker, retrying transient failures at
    /// most `max_retries` times with exponential backoff and jitter while `deadline`
    /// allows. Returns one result per sensor and the number of device attempts.
    pub async fn read(
        &self,
        device: &DeviceId,
        driver: &dyn Driver,
        sensors: &[&Sensor],
        deadline: Instant,
    ) -> (Vec<Result<Sample, ReadError>>, u32) {
        let Some(guard) = self.guards.get(device) else {
            let none = sensors.iter().map(|_| Err(ReadError::Driver(DriverError::NotSupported)));
            return (none.collect(), 0);
        };
        // Filled by the first attempt, which asks for every sensor in order; later attempts
        // overwrite the ones they retry.
        let mut out: Vec<Result<Sample, ReadError>> = Vec::new();
        let mut pending: Vec<usize> = (0..sensors.len()).collect();
        let mut attempts = 0;
        let mut backoff = self.retry.first_backoff;
        loop {
            let permit = match guard.breaker.try_acquire() {
                Ok(p) => p,
                Err(retry_after) => {
                    if out.is_empty() {
                        out = sensors.iter().map(|_| Err(ReadError::CircuitOpen { retry_after })).collect();
                    }
                    for &i in &pending {
                        out[i] = Err(ReadError::CircuitOpen { retry_after });
                    }
                    return (out, attempts);
                }
            };
            attempts += 1;
            let group: Vec<&Sensor> = pending.iter().map(|&i| sensors[i]).collect();
            let started = Instant::now();
            let options = ReadOptions { deadline, probe: permit.is_probe() };
            let results = driver.read(&group, options).await;
            let took = started.elapsed();
            let any_ok = results.iter().any(Result::is_ok);
            let transient =
                results.iter().find_map(|r| r.as_ref().err().filter(|e| e.is_transient())).cloned();
            let outcome = match (&transient, any_ok) {
                (_, true) => Outcome::Success,
                (Some(_), false) => Outcome::Transient,
                (None, false) => Outcome::Rejected,
            };
            permit.record(outcome);
            let whole_failure =
                if any_ok { None } else { results.iter().find_map(|r| r.as_ref().err()).cloned() };
            guard.health.record(took, whole_failure.as_ref());
            let mut again = Vec::new();
            let mut answered = results.into_iter().zip(&pending).map(|(r, &i)| {
                if r.as_ref().err().is_some_and(DriverError::is_transient) {
                    again.push(i);
                }
                (i, r.map_err(ReadError::Driver))
            });
            if out.is_empty() {
                out = answered.by_ref().map(|(_, r)| r).collect();
                // A driver that answered for fewer sensors than asked failed the others.
                out.resize_with(sensors.len(), || Err(ReadError::Driver(DriverError::Malformed)));
            } else {
                answered.for_each(|(i, r)| out[i] = r);
            }
            if again.is_empty() || attempts > self.retry.max_retries {
                return (out, attempts);
            }
            // Full jitter in [backoff/2, backoff], and only if the deadline leaves room
            // for the wait and a little more.
            let wait = backoff.mul_f64(0.5 + 0.5 * jitter());
            if Instant::now() + wait + Duration::from_millis(10) >= deadline {
                return (out, attempts);
            }
            tokio::time::sleep(wait).await;
            backoff = backoff.saturating_mul(2);
            pending = again;
        }
    }
}
