//! `get_device_status`: breaker state and health of each device, from what the service
//! has seen (it does not contact devices).

use chrono::SecondsFormat;

use super::defs::{
    BreakerState, BreakerStatus, DeviceState, DeviceStatus, DeviceStatusData, EdgeNodeStatus, EdgeStatus,
    GetDeviceStatusArgs, HistoryDatabaseStatus, HubStatus, LastError, Latency, NeverBornStatus,
    NorthboundStatus, ProbeData, ProbeResult, StorageState, StorageStatus,
};
use super::device_error::device_error;
use super::{ToolError, ToolResult, View, to_data};
use crate::driver::DriverError;
use crate::ids::DeviceId;
use crate::registry::Device;
use crate::resilience::breaker::SnapshotState;
use crate::resilience::{ProbeOutcome, ReadError};

fn status_of(inner: &View, d: &Device) -> DeviceStatus {
    let sensors: Vec<_> = inner.core.registry.sensors_of_device(&d.id).collect();
    let (breaker, health) = match inner.core.reader.guard(&d.id) {
        Some(g) => (Some(g.breaker.snapshot()), g.health.snapshot()),
        None => (None, Default::default()),
    };
    let (state, breaker) = match breaker {
        Some(b) => {
            // Evidence, not a default: a device never heard from is unknown, one that
            // never answered but failed is down, as is one refusing our session since its
            // last success (a changed server certificate: nothing can be read, though it
            // answers); one whose last word was a failure is degraded (its breaker still
            // closed).
            let refused = health.failing_since.is_some()
                && matches!(health.last_error, Some((DriverError::Refused(_), _)));
            let state = match b.state {
                SnapshotState::Open | SnapshotState::HalfOpen => DeviceState::Down,
                SnapshotState::Closed if refused => DeviceState::Down,
                SnapshotState::Closed if health.last_success.is_none() && health.last_error.is_none() => {
                    DeviceState::Unknown
                }
                SnapshotState::Closed if health.last_success.is_none() && health.failing_since.is_some() => {
                    DeviceState::Down
                }
                SnapshotState::Closed if health.failing_since.is_some() || b.consecutive_failures > 0 => {
                    DeviceState::Degraded
                }
                SnapshotState::Closed => DeviceState::Up,
            };
            let bs = BreakerStatus {
                state: match b.state {
                    SnapshotState::Closed => BreakerState::Closed,
                    SnapshotState::Open => BreakerState::Open,
                    SnapshotState::HalfOpen => BreakerState::HalfOpen,
                },
                consecutive_failures: b.consecutive_failures,
                retry_after_ms: b.retry_after.map(|d| d.as_millis() as u64),
                next_probe_at: b
                    .retry_after
                    .and_then(|d| chrono::Duration::from_std(d).ok())
                    .map(|d| (chrono::Utc::now() + d).to_rfc3339_opts(SecondsFormat::Millis, true)),
            };
            (state, bs)
        }
        None => (
            DeviceState::Unknown,
            BreakerStatus {
                state: BreakerState::Closed,
                consecutive_failures: 0,
                retry_after_ms: None,
                next_probe_at: None,
            },
        ),
    };
    let edge = inner.core.reader.edge(d);
    // At the hub, the edge node's word decides: its breaker never opens.
    let state = match &edge {
        Some(e) if e.online && e.device_online => DeviceState::Up,
        Some(_) => DeviceState::Down,
        None => state,
    };
    let last_error = match (&health.last_error, sensors.first()) {
        (Some((e, at)), Some(s)) => Some(LastError {
            code: device_error(&ReadError::Driver(e.clone()), d, s).code,
            at: at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }),
        _ => None,
    };
    DeviceStatus {
        device_id: d.id.to_string(),
        description: d.description.clone(),
        protocol: d.protocol.name().to_string(),
        endpoint: d.endpoint.to_string(),
        state,
        breaker,
        last_success: health.last_success.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
        last_error,
        down_since: match &edge {
            Some(e) if state == DeviceState::Down => Some(if e.online { e.device_since } else { e.since }),
            Some(_) => None,
            None => health.failing_since.filter(|_| state == DeviceState::Down),
        }
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
        confirmed_at: match state {
            DeviceState::Unknown => None,
            DeviceState::Up => health.last_success,
            _ => health.last_error.as_ref().map(|(_, at)| *at),
        }
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
        failures: health.failures,
        latency: health.latency.map(|(p50, p99, n)| Latency {
            p50_ms: (p50.as_secs_f64() * 1e6).round() / 1e3,
            p99_ms: (p99.as_secs_f64() * 1e6).round() / 1e3,
            samples: n as u32,
        }),
        sensors: sensors.len(),
        edge: edge.map(|e| edge_status(&e)),
    }
}

fn edge_status(e: &crate::driver::EdgeView) -> EdgeStatus {
    EdgeStatus {
        edge: e.edge.clone(),
        edge_state: state_word(e.online),
        edge_since: rfc3339(e.since),
        edge_offline_reason: e.why.filter(|_| !e.online).map(|w| gone_word(w).to_string()),
        device_state: state_word(e.device_online),
        device_since: rfc3339(e.device_since),
        last_birth: e.last_birth.map(rfc3339),
        rebirths_requested: e.rebirths_requested,
        messages: e.messages,
        gaps: e.gaps,
        dropped: e.dropped,
    }
}

/// `get_device_status`, typed: every device (or the one named) from what was seen.
pub fn device_status(inner: &View, args: &GetDeviceStatusArgs) -> Result<DeviceStatusData, ToolError> {
    let registry = &inner.core.registry;
    let devices = match &args.device_id {
        Some(raw) => match raw.parse::<DeviceId>().ok().and_then(|id| registry.device(&id)) {
            Some(d) => vec![status_of(inner, d)],
            None => {
                return Err(super::validate::device_not_found(
                    registry,
                    raw,
                    "Call get_device_status without device_id to see every device.",
                ));
            }
        },
        None => registry.devices().iter().map(|d| status_of(inner, d)).collect(),
    };
    // One device asked for: the fleet's part (every edge node) is not what was asked.
    let hub = if args.device_id.is_none() { hub(inner) } else { None };
    Ok(DeviceStatusData { devices, storage: storage(inner), northbound: northbound(inner), hub })
}

/// The fleet hub's link and edge nodes (`None` where fieldgate reads its own devices).
pub fn hub(inner: &View) -> Option<HubStatus> {
    let f = inner.core.reader.fleet()?;
    let edge_nodes = f
        .nodes
        .iter()
        .map(|n| EdgeNodeStatus {
            edge: n.edge.clone(),
            state: state_word(n.online),
            since: rfc3339(n.since),
            offline_reason: n.why.filter(|_| !n.online).map(|w| gone_word(w).to_string()),
            last_birth: n.last_birth.map(rfc3339),
            devices: n.devices,
            rebirths_requested: n.rebirths_requested,
            messages: n.messages,
            gaps: n.gaps,
            dropped: n.dropped,
        })
        .collect();
    Some(HubStatus {
        broker: f.broker,
        link: if f.online { "online" } else { "down" }.to_string(),
        link_error: f.link_error,
        edge_nodes,
        never_born: NeverBornStatus {
            edge_nodes: f.strangers.count,
            messages: f.strangers.messages,
            not_kept: f.strangers.not_kept,
            births_refused: f.strangers.births_refused,
            recent: f.strangers.recent,
        },
    })
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn state_word(up: bool) -> String {
    if up { "online" } else { "offline" }.to_string()
}

fn gone_word(w: crate::driver::EdgeGone) -> &'static str {
    use crate::driver::EdgeGone;
    match w {
        EdgeGone::Node | EdgeGone::Device => "death",
        EdgeGone::Broker => "broker_lost",
        EdgeGone::NotBorn => "not_born",
    }
}

fn northbound(inner: &View) -> Option<NorthboundStatus> {
    use crate::metrics::sparkplug::Counters;
    let c = inner.core.sparkplug.get()?;
    Some(NorthboundStatus {
        broker: c.broker(),
        link: c.state().to_string(),
        link_error: c.link_error.lock().clone(),
        messages_sent: Counters::get(&c.messages_sent),
        metrics_sent: Counters::get(&c.metrics_sent),
        buffered: Counters::get(&c.buffered),
        dropped: Counters::get(&c.dropped),
        commands_refused: Counters::get(&c.commands_refused),
    })
}

/// An operator's probe of one device, at once (`POST /v1/devices/{id}/probe`).
pub async fn probe(inner: &View, raw: &str) -> ToolResult {
    let registry = &inner.core.registry;
    let Some(d) = raw.parse::<DeviceId>().ok().and_then(|id| registry.device(&id)) else {
        return Err(super::validate::device_not_found(registry, raw, "GET /v1/devices lists every device."));
    };
    let Some(sensor) = registry.sensors_of_device(&d.id).next() else {
        return Err(ToolError::internal());
    };
    let (outcome, error, retry_after_ms) = match inner.core.reader.probe(&d.id, true).await {
        ProbeOutcome::Answered => (ProbeResult::Answered, None, None),
        ProbeOutcome::Failed(e) => {
            let code = device_error(&ReadError::Driver(e), d, sensor).code;
            let at = chrono::Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
            (ProbeResult::Failed, Some(LastError { code, at }), None)
        }
        ProbeOutcome::NotNow { retry_after } => {
            (ProbeResult::NotNow, None, Some((retry_after.as_millis() as u64).max(1)))
        }
        ProbeOutcome::Unknown => return Err(ToolError::internal()),
    };
    to_data(&ProbeData { outcome, error, retry_after_ms, device: status_of(inner, d) })
}

/// The state of the history and work-order stores and of their disk.
pub fn storage(inner: &View) -> StorageStatus {
    let mut problems = Vec::new();
    for p in inner.core.history.as_ref().map(|h| h.problems()).unwrap_or_default() {
        problems.push(format!(
            "history: {} (since {})",
            p.reason,
            p.since.to_rfc3339_opts(SecondsFormat::Secs, true)
        ));
    }
    if let Some(p) = inner.core.work_orders.as_ref().and_then(|w| w.problem()) {
        problems.push(format!(
            "work orders: {} (since {})",
            p.reason,
            p.since.to_rfc3339_opts(SecondsFormat::Secs, true)
        ));
    }
    if let Some((reason, since)) = inner.core.sparkplug.get().and_then(|c| c.buffer_problem.lock().clone()) {
        problems.push(format!(
            "sparkplug buffer: {reason} (since {})",
            since.to_rfc3339_opts(SecondsFormat::Secs, true)
        ));
    }
    let space = inner.core.history.as_ref().and_then(|h| h.disk_space());
    StorageStatus {
        state: if problems.is_empty() { StorageState::Ok } else { StorageState::Failing },
        problems,
        free_bytes: space.map(|s| s.0),
        total_bytes: space.map(|s| s.1),
        history_database: inner.core.history.as_ref().and_then(|h| h.remote_stats()).map(|r| {
            HistoryDatabaseStatus {
                chunks_written: r.shipped,
                failures: r.failures,
                chunks_waiting: r.waiting,
            }
        }),
    }
}
