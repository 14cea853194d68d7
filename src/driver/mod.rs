//! Device I/O. Only this module talks to field devices.
//!
//! [`Driver`] is transport-independent: the Modbus implementation lives in `modbus/`,
//! OPC UA in `opcua/` implements the same trait. Drivers return [`DriverError`]s that keep "the
//! device answered no" (`Rejected`) apart from "the device did not answer" (`Timeout`,
//! `Unavailable`, `Malformed`) and "the device is busy" (`Busy`): only those last kinds
//! say anything about a device's health ([`DriverError::blames_device`]). `Queued` (the
//! request never had its turn before the deadline) is worth retrying but blames nobody.

pub mod clock;
mod codec;
pub mod discover;
pub mod modbus;
pub mod opcua;
pub mod plan;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::ids::DeviceId;
use crate::registry::{Registry, Sensor};
pub use codec::{RawValue, normalize, scaled};
use modbus::{Link, ModbusDriver};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How far the device vouches for a value (OPC UA status codes; Modbus is always good).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SampleQuality {
    #[default]
    Good,
    Uncertain,
    /// The device reports the sensor as failed; the value is not to be used.
    Bad,
}

/// A value read from a device, decoded but not scaled.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub value: RawValue,
    pub at: chrono::DateTime<chrono::Utc>,
    pub quality: SampleQuality,
}

/// Why a read failed. No variant carries text from the device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    #[error("no reply in time")]
    Timeout,
    /// The call's deadline passed while its request waited for its turn on the connection
    /// (behind another call's stalled request, or a serial line kept quiet): the device
    /// was never asked, so this says nothing about its health.
    #[error("no turn on the connection before the deadline")]
    Queued,
    #[error("connection refused, reset or closed")]
    Unavailable { retry_after: Option<Duration> },
    #[error("the device is busy")]
    Busy,
    #[error("the device rejected the request (exception {code})")]
    Rejected { code: u8 },
    #[error("the device refused to read the node ({status})")]
    NodeRejected { status: &'static str },
    #[error("malformed reply")]
    Malformed,
    /// The device answered for the sensor, with something that is no sensor value (an
    /// OPC UA node holding an array, a structure, bytes, a date or nothing): the sensor's
    /// fault, not the device's, and no retry will change it.
    #[error("the node holds {received}, not a single value")]
    Unreadable { received: &'static str },
    #[error("the device refused the connection: {0}")]
    Refused(Refusal),
    #[error("this protocol is not supported by this build")]
    NotSupported,
    /// Fleet hub: the edge node (or its device) that owns the sensor is offline since
    /// `since`; `edge` names it (`group/node`). Not the device's failure as fieldgate
    /// measures it: no breaker counts it, no retry inside the call helps.
    #[error("edge node {edge} is offline")]
    EdgeOffline { edge: String, since: chrono::DateTime<chrono::Utc>, why: EdgeGone, retry_after: Duration },
    /// Fleet hub: the edge node gave the sensor's alias to another metric too (against
    /// Sparkplug): its data cannot be told apart, so no value of it is served.
    #[error("edge node {edge} gave the sensor's alias to another metric too")]
    AliasShared { edge: String },
}

/// Why the fleet hub has no live value of an edge's sensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeGone {
    /// The edge node died (its NDEATH).
    Node,
    /// Its device died (DDEATH), or was not born again with its edge node.
    Device,
    /// The hub lost the broker.
    Broker,
    /// Not born since the hub started.
    NotBorn,
}

/// Why a device refused fieldgate itself (security or identity): a configuration fault
/// that an operator fixes, never a passing failure. No variant carries device text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the server's certificate (thumbprint {thumbprint}) is not trusted")]
    UntrustedServer { thumbprint: String, rejected_dir: std::path::PathBuf, trusted_dir: std::path::PathBuf },
    #[error("the server's trusted certificate (thumbprint {thumbprint}) does not fit: {reason}")]
    UnfitServerCertificate { thumbprint: String, reason: &'static str },
    #[error("the server did not accept fieldgate's certificate")]
    ClientNotTrusted { own_certificate: std::path::PathBuf },
    #[error("the server offers no endpoint with security {policy}/{mode}")]
    NoMatchingEndpoint { policy: String, mode: String },
    #[error("the server refused the user identity")]
    IdentityRejected { user_env: Option<String> },
    #[error("environment variable {var} is not set")]
    CredentialsMissing { var: String },
    #[error("fieldgate has no OPC UA certificate ({reason})")]
    NoOwnCertificate { reason: String },
}

impl DriverError {
    /// Whether the failure may pass: worth another attempt while the deadline allows.
    pub fn is_transient(&self) -> bool {
        self.blames_device() || *self == DriverError::Queued
    }

    /// Whether the device itself failed this request (it was asked and did not answer
    /// well): only these failures count against its breaker and a caller's retry limit.
    pub fn blames_device(&self) -> bool {
        matches!(
            self,
            DriverError::Timeout
                | DriverError::Unavailable { .. }
                | DriverError::Busy
                | DriverError::Malformed
        )
    }
}

/// How to make one read.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// Give up at this instant.
    pub deadline: Instant,
    /// The device's breaker let this read through as its probe: connect now even if the
    /// link is backing off from failed connects (the breaker already spaced the tries).
    pub probe: bool,
}

impl ReadOptions {
    pub fn until(deadline: Instant) -> ReadOptions {
        ReadOptions { deadline, probe: false }
    }
}

/// The longest text a sensor's value may be (bytes): a longer one fails its own sensor,
/// from a device or from an edge node alike.
pub const MAX_TEXT: usize = 1 << 20;

/// Reads sensors of one device.
pub trait Driver: Send + Sync {
    /// Reads `sensors` (all of this driver's device) as `options` say; one result per
    /// sensor, in order.
    fn read<'a>(
        &'a self,
        sensors: &'a [&'a Sensor],
        options: ReadOptions,
    ) -> BoxFuture<'a, Vec<Result<Sample, DriverError>>>;

    /// Ends what the driver holds open at the device (an OPC UA session, which a server
    /// otherwise keeps until it times out, counting against its session limit).
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// The device's clock, when its samples carry the device's own time.
    fn clock(&self) -> Option<std::sync::Arc<clock::Clock>> {
        None
    }

    /// The fleet hub's driver: what the edge node that serves `device` last said of itself
    /// and of it. `None` for a device fieldgate reads itself.
    fn edge(&self, _device: &crate::registry::Device) -> Option<EdgeView> {
        None
    }

    /// The fleet hub's driver: its link to the broker and every edge node it has heard
    /// of, also those none of whose devices is served (all in conflict, none born).
    fn fleet(&self) -> Option<FleetView> {
        None
    }
}

/// The fleet as the hub sees it: its link to the broker and every edge node.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetView {
    /// The broker it is (or was last) connected to.
    pub broker: String,
    /// Its STATE says online on the broker.
    pub online: bool,
    /// Why the link is down, while it is.
    pub link_error: Option<String>,
    /// Edge nodes born (now or before).
    pub nodes: Vec<NodeView>,
    /// Edge nodes heard from, never born.
    pub strangers: StrangersView,
}

/// Edge nodes the hub heard from but that were never born: how many it keeps, their
/// messages, messages of more than it keeps, and the last heard (`group/node`, a few).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StrangersView {
    pub count: usize,
    pub messages: u64,
    pub not_kept: u64,
    pub births_refused: u64,
    pub recent: Vec<String>,
}

/// One edge node as the fleet hub sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// `group/node`.
    pub edge: String,
    pub online: bool,
    pub since: chrono::DateTime<chrono::Utc>,
    pub why: Option<EdgeGone>,
    pub last_birth: Option<chrono::DateTime<chrono::Utc>>,
    /// Devices it announced (born now or in an earlier life).
    pub devices: usize,
    pub rebirths_requested: u64,
    pub messages: u64,
    pub gaps: u64,
    pub dropped: u64,
}

/// An edge node and one of its devices, as the fleet hub sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeView {
    /// `group/node`.
    pub edge: String,
    /// The edge node: online since, or offline since and why.
    pub online: bool,
    pub since: chrono::DateTime<chrono::Utc>,
    pub why: Option<EdgeGone>,
    /// The device at its edge node.
    pub device_online: bool,
    pub device_since: chrono::DateTime<chrono::Utc>,
    /// The edge node's last NBIRTH (its own time).
    pub last_birth: Option<chrono::DateTime<chrono::Utc>>,
    pub rebirths_requested: u64,
    pub messages: u64,
    /// `seq` gaps that lasted the reorder timeout.
    pub gaps: u64,
    /// Messages dropped (late, undecodable, of what was not born).
    pub dropped: u64,
}

/// Devices whose protocol this build cannot read yet.
struct Unsupported;

impl Driver for Unsupported {
    fn read<'a>(
        &'a self,
        sensors: &'a [&'a Sensor],
        _: ReadOptions,
    ) -> BoxFuture<'a, Vec<Result<Sample, DriverError>>> {
        Box::pin(async move { vec![Err(DriverError::NotSupported); sensors.len()] })
    }
}

/// A driver for every device of the registry; Modbus devices behind the same endpoint
/// share one link (one connection).
pub struct Drivers {
    by_device: HashMap<DeviceId, Arc<dyn Driver>>,
    /// The fleet hub's one driver, asked about the fleet even when no device is served.
    fleet: Option<Arc<dyn Driver>>,
}

impl Drivers {
    /// Drivers for the devices of `registry`; OPC UA drivers keep certificates in `pki_dir`
    /// (fieldgate's own is created there when a device needs one).
    /// Ends every session the drivers hold open (on stop, and after a one-shot command).
    pub async fn close(&self) {
        futures_util::future::join_all(self.by_device.values().map(|d| d.close())).await;
    }

    pub fn new(registry: &Registry, pki_dir: &std::path::Path) -> Drivers {
        let pki = opcua::security::Pki::new(pki_dir);
        let secured =
            registry.devices().iter().any(|d| opcua::security::Security::of(d.opcua.as_ref()).is_secured());
        if secured {
            if let Some(until) = pki.own_expiry().filter(|t| *t < chrono::Utc::now() + chrono::Days::new(30))
            {
                tracing::warn!(
                    expires = %until.to_rfc3339(),
                    certificate = %pki.own_certificate().display(),
                    "OPC UA: fieldgate's certificate expires within 30 days; delete it and its key to have a new one made, then have the servers trust it"
                );
            }
            match pki.ensure() {
                Ok(cert) => tracing::info!(
                    certificate = %cert.display(),
                    trusted = %pki.trusted_dir().display(),
                    "OPC UA: fieldgate's certificate (give it to the servers' administrators); trusted server certificates go to the trusted folder"
                ),
                Err(error) => tracing::error!(%error, "OPC UA: secured devices cannot be read"),
            }
        }
        let mut links: HashMap<modbus::Target, Arc<Link>> = HashMap::new();
        let mut by_device: HashMap<DeviceId, Arc<dyn Driver>> = HashMap::new();
        for d in registry.devices() {
            let driver: Arc<dyn Driver> = match ModbusDriver::target(d) {
                Some(target) => {
                    let link =
                        links.entry(target.clone()).or_insert_with(|| Arc::new(Link::new(target))).clone();
                    Arc::new(ModbusDriver::new(d.clone(), link))
                }
                None => match opcua::OpcUaDriver::for_device(d, &pki) {
                    Some(driver) => Arc::new(driver),
                    None => Arc::new(Unsupported),
                },
            };
            by_device.insert(d.id.clone(), driver);
        }
        Drivers { by_device, fleet: None }
    }

    /// One driver for every device of `registry` (the fleet hub reads them all from its
    /// fleet's latest values).
    pub fn shared(registry: &Registry, driver: Arc<dyn Driver>) -> Drivers {
        let by_device = registry.devices().iter().map(|d| (d.id.clone(), driver.clone())).collect();
        Drivers { by_device, fleet: Some(driver) }
    }

    /// The fleet, when these are the fleet hub's drivers.
    pub fn fleet(&self) -> Option<FleetView> {
        self.fleet.as_ref().and_then(|d| d.fleet())
    }

    pub fn get(&self, device: &DeviceId) -> Option<&Arc<dyn Driver>> {
        self.by_device.get(device)
    }
}
