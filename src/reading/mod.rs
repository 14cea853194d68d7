//! The reading core: the one way to read sensors. It owns the drivers (behind each
//! device's breaker, with bounded retries inside a deadline: [`crate::resilience`]), the
//! reading cache and the device-read metrics. The tools and the poller both read through
//! [`Reader::read`]; neither sees a driver.
//!
//! It also owns what becomes of a fresh sample: `record.rs`, the one rule for what is worth
//! storing and the recording into history, and `feed.rs`, the sample feed that other
//! consumers (Sparkplug; alarms and the hub next) take samples from.

pub mod cache;
pub mod feed;
pub mod record;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

pub use cache::Cache;

use crate::config::Config;
use crate::driver::{DriverError, Drivers, Sample};
use crate::ids::DeviceId;
use crate::metrics::Metrics;
use crate::registry::{Registry, Sensor};
use crate::resilience::{Guard, ProbeOutcome, ReadError, Resilience};

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read from the device during this call.
    Live,
    /// From the cache, young enough for the caller.
    Cache,
}

/// What a read of several sensors gave, in the order asked.
pub struct Read {
    pub results: Vec<Result<(Sample, Source), ReadError>>,
    /// Device attempts made (devices are read in parallel: the most any one device took).
    pub attempts: u32,
}

pub struct Reader {
    registry: Arc<Registry>,
    drivers: Drivers,
    resilience: Resilience,
    cache: Cache,
    /// Each device's read-latency histogram, by its index in the registry.
    latency: Vec<prometheus_client::metrics::histogram::Histogram>,
}

impl Reader {
    pub fn new(registry: Arc<Registry>, config: &Config, metrics: &Metrics) -> Reader {
        let drivers = Drivers::new(&registry, &config.storage.data_dir.join("pki"));
        Reader::with_drivers(registry, config, metrics, drivers)
    }

    /// A reader through `drivers` rather than drivers made from the registry's devices
    /// (the fleet hub's).
    pub fn with_drivers(
        registry: Arc<Registry>,
        config: &Config,
        metrics: &Metrics,
        drivers: Drivers,
    ) -> Reader {
        let resilience = Resilience::new(&registry, config);
        let cache = Cache::new(registry.sensors().len());
        let latency = registry.devices().iter().map(|d| metrics.device_reads(d.id.as_str())).collect();
        Reader { registry, drivers, resilience, cache, latency }
    }

    /// Reads `sensors` by `deadline`: from the cache where a value is at most `max_age_ms`
    /// old (`None`: always from the device), the others from their devices, each device
    /// once and all in parallel. Values read are cached.
    pub async fn read(&self, sensors: &[&Sensor], max_age_ms: Option<u64>, deadline: Instant) -> Read {
        let now = Utc::now();
        let mut results: Vec<Option<Result<(Sample, Source), ReadError>>> = Vec::with_capacity(sensors.len());
        // What the cache cannot answer, by device, in request order. A batch names a few
        // devices, usually one run of sensors after another: the last group is tried first.
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, s) in sensors.iter().enumerate() {
            match max_age_ms.and_then(|age| self.cache.fresh(s, age, now)) {
                Some(hit) => results.push(Some(Ok((hit, Source::Cache)))),
                None => {
                    results.push(None);
                    match groups.iter_mut().rev().find(|(d, _)| *d == s.place.device) {
                        Some((_, members)) => members.push(i),
                        None => {
                            // Room for the rest of the batch: usually one device's run.
                            let mut members = Vec::with_capacity(sensors.len() - i);
                            members.push(i);
                            groups.push((s.place.device, members));
                        }
                    }
                }
            }
        }
        let reads = groups.iter().map(|(_, idx)| {
            let group: Vec<&Sensor> = idx.iter().map(|&i| sensors[i]).collect();
            async move {
                let (out, tries) = self.read_device(&group, deadline).await;
                (idx, out, tries)
            }
        });
        let done = futures_util::future::join_all(reads).await;
        let attempts = done.iter().map(|(_, _, tries)| *tries).max().unwrap_or(0);
        for (idx, out, _) in done {
            self.cache
                .put_all(idx.iter().zip(&out).filter_map(|(&i, r)| r.as_ref().ok().map(|s| (sensors[i], s))));
            for (&i, r) in idx.iter().zip(out) {
                results[i] = Some(r.map(|sample| (sample, Source::Live)));
            }
        }
        let results = results
            .into_iter()
            .map(|r| r.unwrap_or(Err(ReadError::Driver(DriverError::Malformed))))
            .collect();
        Read { results, attempts }
    }

    /// One device's sensors, live, through its breaker; the attempts made.
    async fn read_device(
        &self,
        group: &[&Sensor],
        deadline: Instant,
    ) -> (Vec<Result<Sample, ReadError>>, u32) {
        let Some(first) = group.first() else { return (Vec::new(), 0) };
        let device = self.registry.device_of(first);
        let started = Instant::now();
        let (out, tries) = match self.drivers.get(&device.id) {
            Some(driver) => self.resilience.read(&device.id, driver.as_ref(), group, deadline).await,
            None => (vec![Err(ReadError::Driver(DriverError::NotSupported)); group.len()], 0),
        };
        if let Some(h) = self.latency.get(first.place.device).filter(|_| tries > 0) {
            h.observe(started.elapsed().as_secs_f64());
        }
        (out, tries)
    }

    /// fieldgate's own probe of `device` (one small read), on its breaker's schedule, or
    /// at once when `force`d (an operator asked).
    pub async fn probe(&self, device: &DeviceId, force: bool) -> ProbeOutcome {
        let (Some(driver), Some(sensor)) =
            (self.drivers.get(device), self.registry.sensors_of_device(device).next())
        else {
            return ProbeOutcome::Unknown;
        };
        self.resilience.probe(device, driver.as_ref(), sensor, force).await
    }

    /// News of a device from outside a read (an OPC UA subscription's session).
    pub fn observe(&self, device: &DeviceId, result: Result<(), &DriverError>) {
        self.resilience.observe(device, result);
    }

    /// A round trip to `device` measured without a read of its sensors (a subscribed
    /// server's): counted in its latency like a read's.
    pub fn round_trip(&self, device: &DeviceId, took: std::time::Duration) {
        let Some(guard) = self.resilience.guard(device) else { return };
        guard.health.round_trip(took);
        let at = self.registry.devices().iter().position(|d| &d.id == device);
        if let Some(h) = at.and_then(|i| self.latency.get(i)) {
            h.observe(took.as_secs_f64());
        }
    }

    /// A device's breaker and health.
    pub fn guard(&self, device: &DeviceId) -> Option<&Guard> {
        self.resilience.guard(device)
    }

    /// The clock of `device`, when its samples carry its own time.
    pub fn clock(&self, device: &DeviceId) -> Option<Arc<crate::driver::clock::Clock>> {
        self.drivers.get(device)?.clock()
    }

    /// Whether `device` can be read at all (it has a driver).
    /// What the fleet hub knows of `device`'s edge node (`None` outside a hub).
    pub fn edge(&self, device: &crate::registry::Device) -> Option<crate::driver::EdgeView> {
        self.drivers.get(&device.id).and_then(|d| d.edge(device))
    }

    /// The fleet hub's link and edge nodes; `None` where fieldgate reads its own devices.
    pub fn fleet(&self) -> Option<crate::driver::FleetView> {
        self.drivers.fleet()
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn has_driver(&self, device: &DeviceId) -> bool {
        self.drivers.get(device).is_some()
    }

    /// Ends the sessions held open at devices (on stop, and after a one-shot command).
    pub async fn close(&self) {
        self.drivers.close().await;
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The deadline of a call that starts now.
    pub fn deadline(config: &Config) -> Instant {
        Instant::now() + Duration::from_millis(config.calls.deadline_ms)
    }
}
