//! Resilience between the reading core and the drivers: a circuit breaker per device,
//! bounded retries inside a call's deadline, the cross-call retry limit, and device health.
//!
//! The reading core (`reading::Reader`, used by the tools and the poller alike) reads
//! devices only through [`Resilience::read`] (and an operator's or a watcher's probe
//! through [`Resilience::probe`]), so both share each device's breaker: an open device is
//! neither read nor polled until its probe.

pub mod breaker;
pub mod health;
pub mod repeat;

pub mod probe;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
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
        /// Since when the device is failing, if known.
        down_since: Option<DateTime<Utc>>,
        /// Down for longer than `breaker.report_down_after_s`: a person should know.
        report: bool,
    },
}

/// How a probe went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The device answered: its breaker is closed and every block on it lifted.
    Answered,
    /// The device failed the probe; the breaker stays open for its next period.
    Failed(DriverError),
    /// Not probed: another probe is running, or (unforced) the open period is not over.
    NotNow { retry_after: Duration },
    /// The device has no sensor to read, or is not one of this registry's.
    Unknown,
}

/// The breaker and health of one device.
pub struct Guard {
    /// The device, for the log.
    pub id: DeviceId,
    pub breaker: Breaker,
    pub health: Health,
    /// Whether the device's refusal of fieldgate's session has been logged (until it is read).
    pub refusal_logged: std::sync::atomic::AtomicBool,
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
    /// Down for longer than this: `CIRCUIT_OPEN` tells the agent to report the device.
    report_after: Duration,
    deadline: Duration,
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

impl Resilience {
    /// Guards for `devices` with one breaker setting (unit tests of the read loop).
    #[cfg(test)]
    fn for_devices(devices: &[DeviceId], settings: BreakerSettings, config: &Config) -> Resilience {
        Resilience::with_guards(devices.iter().map(|d| (d.clone(), settings)), config)
    }

    pub fn new(registry: &Registry, config: &Config) -> Resilience {
        let devices = registry.devices().iter().map(|d| (d.id.clone(), breaker_settings(config, d)));
        Resilience::with_guards(devices, config)
    }

    fn with_guards(
        devices: impl Iterator<Item = (DeviceId, BreakerSettings)>,
        config: &Config,
    ) -> Resilience {
        let guards = devices
            .map(|(id, settings)| {
                let guard = Guard {
                    id: id.clone(),
                    breaker: Breaker::new(settings),
                    health: Health::default(),
                    refusal_logged: Default::default(),
                };
                (id, guard)
            })
            .collect();
        let retry = RetryPolicy {
            max_retries: config.calls.max_retries,
            first_backoff: Duration::from_millis(config.calls.retry_backoff_ms),
        };
        Resilience {
            guards,
            retry,
            report_after: Duration::from_secs(config.breaker.report_down_after_s),
            deadline: Duration::from_millis(config.calls.deadline_ms),
        }
    }

    fn circuit_open(&self, guard: &Guard, retry_after: Duration) -> ReadError {
        let failing = guard.health.failing_since();
        let report = failing.is_some_and(|(_, down)| down >= self.report_after);
        ReadError::CircuitOpen { retry_after, down_since: failing.map(|(t, _)| t), report }
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
        let mut backoff = crate::backoff::Backoff::new(self.retry.first_backoff, self.deadline);
        let mut waited_for_probe = false;
        loop {
            let permit = match guard.breaker.try_acquire() {
                Ok(p) => p,
                Err(_)
                    if !waited_for_probe
                        && guard.breaker.snapshot().state == breaker::SnapshotState::HalfOpen =>
                {
                    // A probe is in flight (often fieldgate's own): its verdict is due
                    // within one device timeout, so wait for it rather than refuse.
                    waited_for_probe = true;
                    guard.breaker.await_probe(deadline).await;
                    continue;
                }
                Err(retry_after) => {
                    let open = self.circuit_open(guard, retry_after);
                    if out.is_empty() {
                        out = sensors.iter().map(|_| Err(open.clone())).collect();
                    }
                    for &i in &pending {
                        out[i] = Err(open.clone());
                    }
                    return (out, attempts);
                }
            };
            attempts += 1;
            let group: Vec<&Sensor> = pending.iter().map(|&i| sensors[i]).collect();
            let options = ReadOptions { deadline, probe: permit.is_probe() };
            let results = attempt(guard, permit, driver, &group, options).await;
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
            // Only if the deadline leaves room for the wait and a little more.
            let wait = backoff.next_wait();
            if Instant::now() + wait + Duration::from_millis(10) >= deadline {
                return (out, attempts);
            }
            tokio::time::sleep(wait).await;
            pending = again;
        }
    }

    /// One small read of `sensor` (one register or one node) on the device's breaker
    /// schedule: fieldgate's own probe while callers are refused or blocked. `force` (an
    /// operator asked) probes at once, whatever is left of the open period.
    pub async fn probe(
        &self,
        device: &DeviceId,
        driver: &dyn Driver,
        sensor: &Sensor,
        force: bool,
    ) -> ProbeOutcome {
        let Some(guard) = self.guards.get(device) else { return ProbeOutcome::Unknown };
        let permit = if force {
            match guard.breaker.force_probe() {
                Some(p) => p,
                None => return ProbeOutcome::NotNow { retry_after: Duration::from_millis(100) },
            }
        } else {
            match guard.breaker.try_acquire() {
                Ok(p) => p,
                Err(retry_after) => return ProbeOutcome::NotNow { retry_after },
            }
        };
        let options = ReadOptions { deadline: Instant::now() + self.deadline, probe: true };
        let mut results = attempt(guard, permit, driver, &[sensor], options).await;
        match results.pop() {
            Some(Ok(_)) => ProbeOutcome::Answered,
            // The device answered "no" for this sensor: alive all the same.
            Some(Err(e)) if !e.is_transient() => ProbeOutcome::Answered,
            Some(Err(e)) => ProbeOutcome::Failed(e),
            None => ProbeOutcome::Failed(DriverError::Malformed),
        }
    }
}

/// One device attempt under `permit`: the driver's results, with the verdict given to the
/// breaker and the device's health. An attempt whose requests never had their turn
/// (every failure `Queued`) judges nothing: the device was not asked.
async fn attempt(
    guard: &Guard,
    permit: breaker::Permit,
    driver: &dyn Driver,
    sensors: &[&Sensor],
    options: ReadOptions,
) -> Vec<Result<Sample, DriverError>> {
    let started = Instant::now();
    let failing = guard.health.failing_since();
    if permit.is_probe() {
        tracing::info!(device = guard.id.as_str(), "probing the device: circuit breaker half-open");
    }
    let results = driver.read(sensors, options).await;
    let took = started.elapsed();
    let any_ok = results.iter().any(Result::is_ok);
    let blamed = results.iter().find_map(|r| r.as_ref().err().filter(|e| e.blames_device()));
    let asked = results.iter().find_map(|r| r.as_ref().err().filter(|e| **e != DriverError::Queued));
    // Health first, so that the line logged for a change says why.
    let change = match (any_ok, blamed, asked) {
        (true, _, _) => {
            guard.health.record(took, None);
            permit.record(Outcome::Success)
        }
        (false, Some(e), _) => {
            guard.health.record(took, Some(e));
            permit.record(Outcome::Transient)
        }
        (false, None, Some(e)) => {
            guard.health.record(took, Some(e));
            permit.record(Outcome::Rejected)
        }
        // Dropped unrecorded: a probe's slot is freed for the next one.
        (false, None, None) => {
            drop(permit);
            None
        }
    };
    log_change(guard, change, failing);
    results
}

impl Resilience {
    /// News of a device from outside a read (an OPC UA subscription's session came up:
    /// `Ok`; was lost or could not be opened: `Err`), for its breaker, its health and the
    /// log, as a read's outcome would be.
    pub fn observe(&self, device: &DeviceId, result: Result<(), &DriverError>) {
        let Some(guard) = self.guards.get(device) else { return };
        let failing = guard.health.failing_since();
        let change = match result {
            Ok(()) => {
                guard.health.heard();
                guard.breaker.observe(Outcome::Success)
            }
            Err(e) => {
                guard.health.lost(e.clone());
                guard.breaker.observe(if e.blames_device() { Outcome::Transient } else { Outcome::Rejected })
            }
        };
        log_change(guard, change, failing);
    }
}

/// One line when a device goes down (its breaker opens: with why; a warning, so
/// `FIELDGATE_LOG=warn` still shows plant outages) and one when it comes back (its breaker
/// closes: with how long it was down), not one per failed read: what a person on an edge
/// box needs to see. The breaker hands each change to exactly one
/// outcome, so calls failing together log it once.
fn log_change(guard: &Guard, change: Option<breaker::Change>, failing: Option<(DateTime<Utc>, Duration)>) {
    let device = guard.id.as_str();
    // A device that answers but refuses fieldgate's session (a server certificate no longer
    // trusted, a user refused) is not up, though its breaker closes: said once, when it starts.
    use std::sync::atomic::Ordering::Relaxed;
    // (Not a health snapshot: that sorts the latencies, on every read.)
    if let Some(e) = guard.health.refusal() {
        if !guard.refusal_logged.swap(true, Relaxed) {
            tracing::warn!(device, reason = %e, "device refuses fieldgate's session: nothing can be read until an operator acts");
        }
        return;
    }
    if guard.refusal_logged.load(Relaxed)
        && !guard.health.is_failing()
        && guard.refusal_logged.swap(false, Relaxed)
    {
        tracing::info!(device, "device accepts fieldgate's session again");
    }
    match change {
        Some(breaker::Change::Opened) => {
            let reason = guard.health.snapshot().last_error.map(|(e, _)| e.to_string()).unwrap_or_default();
            tracing::warn!(device, %reason, "device down: circuit breaker open");
        }
        Some(breaker::Change::Closed) => {
            let down = failing.map_or(0, |(_, d)| d.as_secs());
            tracing::info!(device, down_for_s = down, "device up again: circuit breaker closed");
        }
        Some(breaker::Change::Reopened) => tracing::info!(device, "probe failed: circuit breaker open again"),
        None => {}
    }
}

#[cfg(test)]
mod tests;
