//! `mode = "subscribe"`: the server samples the sensors and sends their changes.
//!
//! [`run`] keeps one session with one subscription holding a monitored item per sensor
//! (sampling at the device's `poll_interval_ms`, the sensor's `deadband` as an absolute
//! data-change filter, queue of one). Every change is sent as an [`Update`]. When the
//! session is lost (server restarted, network down) the client library is told not to
//! reconnect by itself (`session_retry_limit(0)`); `run` opens a *new* session and
//! recreates the subscription and every item, backing off exponentially with jitter
//! while the server is away. Gateways that only reconnect the socket and keep the old
//! subscription IDs receive nothing after a server restart; this is the failure it avoids.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opcua::client::{DataChangeCallback, MonitoredItem};
use opcua::types::{
    AttributeId, DataChangeFilter, DataChangeTrigger, DataValue, DeadbandType, ExtensionObject,
    MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters, ReadValueId, TimestampsToReturn,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Connection, Target, node_of, sample_of};
use crate::driver::{DriverError, Sample};
use crate::registry::Sensor;

/// What a subscription tells its owner.
#[derive(Debug)]
pub enum Update {
    /// A value change of one sensor (its index in the list given to [`run`]).
    Change { sensor: usize, sample: Result<Sample, DriverError> },
    /// A session with its subscription is up: the server answers.
    Up,
    /// The session was lost, or could not be opened or subscribed: the server failed.
    Down(DriverError),
}

/// What a subscription has done, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Counters {
    /// Sessions opened with their subscription created (1 + reconnects).
    pub sessions: AtomicU64,
    /// Data changes received.
    pub notifications: AtomicU64,
    /// Whether a session with its subscription is up now.
    pub live: AtomicBool,
}

/// Subscribes to `sensors` on `target` until `stop`, sending every change to `tx`.
pub async fn run(
    target: Target,
    sensors: Vec<Sensor>,
    interval: Duration,
    tx: mpsc::UnboundedSender<Update>,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(30);
    let mut backoff = crate::backoff::Backoff::new(FIRST, MAX);
    let mut warned = false;
    loop {
        let connect = tokio::time::timeout(target.request_timeout * 4, target.connect());
        let opened = tokio::select! {
            r = connect => r.unwrap_or(Err(DriverError::Timeout)),
            () = stop.cancelled() => return,
        };
        let failure = match opened {
            Ok(mut conn) => match subscribe(&conn, &sensors, interval, &tx, &counters).await {
                Ok(()) => {
                    counters.sessions.fetch_add(1, Ordering::Relaxed);
                    counters.live.store(true, Ordering::Relaxed);
                    let _ = tx.send(Update::Up);
                    if warned {
                        tracing::info!(url = %target.url, "OPC UA subscription recreated");
                    }
                    backoff.reset();
                    warned = false;
                    let status = tokio::select! {
                        s = conn.closed() => s,
                        () = stop.cancelled() => {
                            // Close the session so the server frees it now, not at its timeout.
                            let _ = tokio::time::timeout(target.request_timeout, conn.session.disconnect()).await;
                            return;
                        }
                    };
                    counters.live.store(false, Ordering::Relaxed);
                    let _ = tx.send(Update::Down(DriverError::Unavailable { retry_after: None }));
                    format!("session lost ({})", status.sub_code().name())
                }
                Err(e) => {
                    let text = e.to_string();
                    let _ = tx.send(Update::Down(e));
                    text
                }
            },
            Err(e) => {
                let text = e.to_string();
                let _ = tx.send(Update::Down(e));
                text
            }
        };
        if !warned {
            tracing::warn!(url = %target.url, error = %failure, "OPC UA subscription down; reconnecting");
            warned = true;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Creates the subscription and its items on a fresh session.
async fn subscribe(
    conn: &Connection,
    sensors: &[Sensor],
    interval: Duration,
    tx: &mpsc::UnboundedSender<Update>,
    counters: &Arc<Counters>,
) -> Result<(), DriverError> {
    let (tx, c) = (tx.clone(), counters.clone());
    let callback = DataChangeCallback::new(move |dv: DataValue, item: &MonitoredItem| {
        c.notifications.fetch_add(1, Ordering::Relaxed);
        // Handles are 1-based: the library replaces a handle of 0 with one of its own.
        let Some(sensor) = (item.client_handle() as usize).checked_sub(1) else { return };
        let _ = tx.send(Update::Change { sensor, sample: sample_of(dv) });
    });
    let session = &conn.session;
    // Keep-alive every 10 publishing intervals; the subscription outlives 3 missed ones.
    let id = session
        .create_subscription(interval, 30, 10, 0, 0, true, callback)
        .await
        .map_err(|_| DriverError::Unavailable { retry_after: None })?;
    let monitored: Vec<(usize, &Sensor, opcua::types::NodeId)> =
        sensors.iter().enumerate().filter_map(|(i, s)| Some((i, s, node_of(s)?))).collect();
    let items: Vec<MonitoredItemCreateRequest> = monitored
        .iter()
        .map(|(i, s, node_id)| {
            let node_id = node_id.clone();
            MonitoredItemCreateRequest {
                item_to_monitor: ReadValueId {
                    node_id,
                    attribute_id: AttributeId::Value as u32,
                    ..Default::default()
                },
                monitoring_mode: MonitoringMode::Reporting,
                requested_parameters: MonitoringParameters {
                    client_handle: *i as u32 + 1,
                    sampling_interval: interval.as_secs_f64() * 1000.0,
                    filter: filter_of(s),
                    queue_size: 1,
                    discard_oldest: true,
                },
            }
        })
        .collect();
    let created = session
        .create_monitored_items(id, TimestampsToReturn::Both, items)
        .await
        .map_err(|_| DriverError::Unavailable { retry_after: None })?;
    for (c, (_, s, _)) in created.iter().zip(&monitored) {
        if c.result.status_code.is_bad() {
            tracing::warn!(
                sensor = %s.id,
                status = c.result.status_code.sub_code().name(),
                "OPC UA server refused to monitor the sensor's node"
            );
        }
    }
    Ok(())
}

/// The sensor's deadband as an absolute data-change filter (none: every change).
fn filter_of(sensor: &Sensor) -> ExtensionObject {
    match sensor.deadband {
        Some(d) if d > 0.0 => ExtensionObject::from_message(DataChangeFilter {
            trigger: DataChangeTrigger::StatusValue,
            deadband_type: DeadbandType::Absolute as u32,
            deadband_value: d,
        }),
        _ => ExtensionObject::null(),
    }
}
