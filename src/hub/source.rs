//! The hub's way of "reading" a sensor: its latest value from the fleet, as the edge sent
//! it, behind the same `Driver` trait the reading core reads every device through. An
//! edge node or device that is offline answers `DriverError::EdgeOffline` with since when;
//! a value older than the sensor's expected interval (and half again) is uncertain:
//! stale, as Sparkplug's own quality code 500 says.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

use super::fleet::{Fleet, Gone, Status, Stranger, Strangers};
use crate::driver::{
    BoxFuture, Driver, DriverError, EdgeGone, EdgeView, FleetView, NodeView, RawValue, ReadOptions, Sample,
    SampleQuality, StrangersView,
};
use crate::registry::{Device, Endpoint, Sensor, SensorSource};

/// How soon an agent should ask again about an edge node that is offline.
pub const RETRY_OFFLINE: Duration = Duration::from_secs(5);

/// Every hub device's driver: the fleet's latest values.
pub struct FleetDriver {
    pub fleet: Arc<Mutex<Fleet>>,
    pub counters: Arc<super::Counters>,
}

impl Driver for FleetDriver {
    fn read<'a>(
        &'a self,
        sensors: &'a [&'a Sensor],
        _: ReadOptions,
    ) -> BoxFuture<'a, Vec<Result<Sample, DriverError>>> {
        let now = Utc::now();
        let fleet = self.fleet.lock();
        let out = sensors.iter().map(|s| latest(&fleet, s, now)).collect();
        Box::pin(async move { out })
    }

    fn edge(&self, device: &Device) -> Option<EdgeView> {
        let Endpoint::Edge { group, node } = &device.endpoint else { return None };
        let fleet = self.fleet.lock();
        let e = fleet.edge(group, node)?;
        let d = e.devices.iter().find(|d| d.id == device.id.as_str())?;
        let (online, since, why) = split(e.status, false);
        let (device_online, device_since, _) = split(d.status, true);
        Some(EdgeView {
            edge: format!("{group}/{node}"),
            online,
            since,
            why,
            device_online,
            device_since,
            last_birth: e.birth,
            rebirths_requested: e.stats.rebirths_requested,
            messages: e.stats.messages,
            gaps: e.stats.gaps,
            dropped: e.stats.dropped,
        })
    }

    fn fleet(&self) -> Option<FleetView> {
        let fleet = self.fleet.lock();
        let nodes = fleet
            .edges()
            .iter()
            .map(|e| {
                let (online, since, why) = split(e.status, false);
                NodeView {
                    edge: format!("{}/{}", e.group, e.node),
                    online,
                    since,
                    why,
                    last_birth: e.birth,
                    devices: e.devices.len(),
                    rebirths_requested: e.stats.rebirths_requested,
                    messages: e.stats.messages,
                    gaps: e.stats.gaps,
                    dropped: e.stats.dropped,
                }
            })
            .collect();
        let strangers = strangers_view(fleet.strangers());
        drop(fleet);
        let c = &self.counters;
        Some(FleetView {
            broker: c.broker.lock().clone(),
            online: c.online.load(std::sync::atomic::Ordering::Relaxed),
            link_error: c.link_error.lock().clone(),
            nodes,
            strangers,
        })
    }
}

/// Strangers shown by name, at most (the last heard).
const STRANGERS_NAMED: usize = 10;

fn strangers_view(s: &Strangers) -> StrangersView {
    let mut recent: Vec<&Stranger> = s.list().iter().collect();
    recent.sort_by(|a, b| {
        b.last_seen.cmp(&a.last_seen).then_with(|| (&a.group, &a.node).cmp(&(&b.group, &b.node)))
    });
    StrangersView {
        count: s.list().len(),
        messages: s.list().iter().map(|x| x.messages).sum(),
        not_kept: s.not_kept,
        births_refused: s.births_refused,
        recent: recent.iter().take(STRANGERS_NAMED).map(|x| format!("{}/{}", x.group, x.node)).collect(),
    }
}

fn split(s: Status, device: bool) -> (bool, DateTime<Utc>, Option<EdgeGone>) {
    match s {
        Status::Online { since } => (true, since, None),
        Status::Offline { since, why } => (false, since, Some(gone(why, device))),
    }
}

fn gone(why: Gone, device: bool) -> EdgeGone {
    match (why, device) {
        (Gone::BrokerLost, _) => EdgeGone::Broker,
        (Gone::NotBorn, false) => EdgeGone::NotBorn,
        (_, false) => EdgeGone::Node,
        (_, true) => EdgeGone::Device,
    }
}

fn offline(edge: String, status: Status, device: bool) -> Option<DriverError> {
    let Status::Offline { since, why } = status else { return None };
    Some(DriverError::EdgeOffline { edge, since, why: gone(why, device), retry_after: RETRY_OFFLINE })
}

fn name_of(edge: &super::fleet::EdgeState) -> String {
    format!("{}/{}", edge.group, edge.node)
}

/// A sensor's latest value, as its edge node sent it; the edge's or device's absence.
pub fn latest(fleet: &Fleet, sensor: &Sensor, now: DateTime<Utc>) -> Result<Sample, DriverError> {
    let SensorSource::Edge(p) = &sensor.source else { return Err(DriverError::NotSupported) };
    let Some(edge) = fleet.edges().get(p.edge) else { return Err(DriverError::NotSupported) };
    if let Some(e) = offline(name_of(edge), edge.status, false) {
        return Err(e);
    }
    let Some(dev) = edge.devices.get(p.device) else { return Err(DriverError::NotSupported) };
    if let Some(e) = offline(name_of(edge), dev.status, true) {
        return Err(e);
    }
    // The catalogue may be a moment older than a rebirth that reordered the metrics.
    let metric = match dev.metrics.get(p.metric).filter(|m| m.name == sensor.id.as_str()) {
        Some(m) => m,
        None => dev.metric_named(sensor.id.as_str()).ok_or(DriverError::NotSupported)?,
    };
    if metric.alias_shared {
        return Err(DriverError::AliasShared { edge: name_of(edge) });
    }
    let Some(l) = &metric.latest else {
        // Born without a value: nothing known yet.
        let at = dev.birth.unwrap_or(now);
        return Ok(Sample { value: RawValue::Float(f64::NAN), at, quality: SampleQuality::Bad });
    };
    let stale = p
        .expected_interval
        .and_then(|i| chrono::Duration::from_std(i + i / 2).ok())
        .is_some_and(|limit| now - l.at > limit);
    let quality = match l.quality {
        SampleQuality::Good if stale => SampleQuality::Uncertain,
        q => q,
    };
    match &l.value {
        Some(v) => Ok(Sample { value: v.clone(), at: l.at, quality }),
        None => Ok(Sample { value: RawValue::Float(f64::NAN), at: l.at, quality: SampleQuality::Bad }),
    }
}
