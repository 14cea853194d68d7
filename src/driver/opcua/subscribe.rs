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
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use opcua::client::{MonitoredItemMap, OnSubscriptionNotificationCore};
use opcua::types::{
    AttributeId, DataChangeFilter, DataChangeNotification, DataChangeTrigger, DeadbandType,
    EventNotificationList, ExtensionObject, MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters,
    NotificationMessage, ReadValueId, TimestampsToReturn,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::conditions::{self, Command, ServerEvent};
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
    /// How long the server took to answer a read of its current time (asked every
    /// [`ROUND_TRIP_EVERY`]): a subscription's latency, where a polled device's is its reads'.
    RoundTrip(Duration),
    /// An event of its conditions (Alarms & Conditions), when asked for.
    Event(ServerEvent),
}

/// How often a subscribed server's round trip is measured.
pub const ROUND_TRIP_EVERY: Duration = Duration::from_secs(10);

/// What a subscription has done, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Counters {
    /// Sessions opened with their subscription created (1 + reconnects).
    pub sessions: AtomicU64,
    /// Data changes received.
    pub notifications: AtomicU64,
    /// Whether a session with its subscription is up now.
    pub live: AtomicBool,
    /// When the subscription last heard from its server (data or keep-alive), in Unix
    /// milliseconds: values unchanged since are known to hold until then, not later.
    pub heard_ms: AtomicI64,
}

/// The next command, or never without a channel (or once it closed).
async fn next_command(commands: &mut Option<mpsc::Receiver<Command>>) -> Command {
    match commands {
        Some(rx) => match rx.recv().await {
            Some(c) => c,
            None => {
                *commands = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Does `command` on the session, within `limit`.
async fn serve(conn: &Connection, command: Command, limit: Duration) {
    let Command::Acknowledge { node, event_id, comment, reply } = command;
    let Some(call) = conditions::acknowledge(&node, &event_id, &comment) else {
        let _ = reply.send(Err(conditions::AckFailed::Other("BadNodeIdInvalid")));
        return;
    };
    let answer = match tokio::time::timeout(limit, conn.session.call(vec![call])).await {
        Ok(Ok(results)) => match results.first() {
            Some(r) => conditions::ack_status(r.status_code),
            None => Err(conditions::AckFailed::Other("BadUnexpectedError")),
        },
        Ok(Err(e)) => conditions::ack_status(e.status()),
        Err(_) => {
            tracing::warn!(condition = %node, limit_ms = limit.as_millis() as u64, "OPC UA server did not answer an operator's acknowledgement in time");
            Err(conditions::AckFailed::Unavailable)
        }
    };
    if let Err(error @ (conditions::AckFailed::Stale | conditions::AckFailed::Other(_))) = &answer {
        tracing::warn!(condition = %node, %error, "OPC UA server did not take an operator's acknowledgement");
    }
    let _ = reply.send(answer);
}

/// Subscribes to `sensors` on `target` until `stop`, sending every change to `tx`; with
/// `commands`, to its conditions' events too (`ConditionRefresh` after every subscription
/// made), doing what each command asks on the session.
pub async fn run(
    target: Target,
    sensors: Vec<Sensor>,
    interval: Duration,
    tx: mpsc::UnboundedSender<Update>,
    counters: Arc<Counters>,
    stop: CancellationToken,
    mut commands: Option<mpsc::Receiver<Command>>,
) {
    let events = commands.is_some();
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
            Ok(mut conn) => {
                match subscribe(&conn, &sensors, interval, &tx, &counters, &target.clock, events).await {
                    Ok(heard) => {
                        counters.sessions.fetch_add(1, Ordering::Relaxed);
                        counters.live.store(true, Ordering::Relaxed);
                        let _ = tx.send(Update::Up);
                        if warned {
                            tracing::info!(url = %target.url, "OPC UA subscription recreated");
                        }
                        backoff.reset();
                        warned = false;
                        let mut every = tokio::time::interval(ROUND_TRIP_EVERY);
                        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        let mut overflowed = false;
                        // With conditions' events, a server busy with a burst is waited for
                        // longer: dropping its session would throw away the events it queued.
                        let grace = if events { EVENT_GRACE } else { interval.max(WIRE) };
                        let lost = loop {
                            tokio::select! {
                                s = conn.closed() => break format!("session lost ({})", s.sub_code().name()),
                                () = heard.silent(grace) => {
                                    // The server stopped publishing (hung, or the library reconnected
                                    // the session without its publish requests): start afresh.
                                    let _ = tokio::time::timeout(target.request_timeout, conn.session.disconnect()).await;
                                    break "no data and no keep-alive from the subscription".to_string();
                                }
                                () = stop.cancelled() => {
                                    // Close the session so the server frees it now, not at its timeout.
                                    let _ = tokio::time::timeout(target.request_timeout, conn.session.disconnect()).await;
                                    return;
                                }
                                _ = every.tick() => {
                                    if let Some(took) = round_trip(&conn, target.request_timeout).await {
                                        let _ = tx.send(Update::RoundTrip(took));
                                    }
                                }
                                c = next_command(&mut commands) => serve(&conn, c, target.request_timeout).await,
                                () = heard.overflowed.notified() => {
                                    if !overflowed {
                                        tracing::warn!(url = %target.url, "OPC UA server's event queue overflowed (events lost): its conditions are refreshed (said once per session)");
                                        overflowed = true;
                                    }
                                    refresh(&conn, heard.subscription).await;
                                }
                            }
                        };
                        counters.live.store(false, Ordering::Relaxed);
                        let _ = tx.send(Update::Down(DriverError::Unavailable { retry_after: None }));
                        lost
                    }
                    Err(e) => {
                        let text = e.to_string();
                        let _ = tx.send(Update::Down(e));
                        text
                    }
                }
            }
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
        let wait = tokio::time::sleep(backoff.next_wait());
        tokio::pin!(wait);
        loop {
            tokio::select! {
                () = &mut wait => break,
                () = stop.cancelled() => return,
                c = next_command(&mut commands) => c.unavailable(),
            }
        }
    }
}

/// The time a read of the server's current time takes, if it answers within `limit` (a
/// server that does not is the watchdog's to judge, not this measure's).
async fn round_trip(conn: &Connection, limit: Duration) -> Option<Duration> {
    let node = ReadValueId {
        node_id: opcua::types::VariableId::Server_ServerStatus_CurrentTime.into(),
        attribute_id: AttributeId::Value as u32,
        ..Default::default()
    };
    let started = tokio::time::Instant::now();
    let read = conn.session.read(std::slice::from_ref(&node), TimestampsToReturn::Neither, 0.0);
    match tokio::time::timeout(limit, read).await {
        Ok(Ok(values)) if values.len() == 1 => Some(started.elapsed()),
        _ => None,
    }
}

/// Keep-alive every this many publishing intervals when nothing changes: a subscription
/// silent for longer (plus one interval, at least `WIRE`, for the message on its way) is lost.
const KEEP_ALIVE_COUNT: u32 = 5;
/// The least time allowed for a message on its way (a loaded server or network).
const WIRE: Duration = Duration::from_secs(1);
/// The time allowed past a missed keep-alive when the subscription carries conditions'
/// events: a server applying a burst (node-opcua stalls for seconds) still holds them.
const EVENT_GRACE: Duration = Duration::from_secs(10);

/// When the subscription last heard from its server (data or keep-alive), and how often
/// it must hear at least.
#[derive(Clone)]
struct Heard {
    at: Arc<parking_lot::Mutex<tokio::time::Instant>>,
    keep_alive: Duration,
    counters: Arc<Counters>,
    /// The subscription's ID on the server.
    subscription: u32,
    /// The server's event queue overflowed: the conditions must be refreshed.
    overflowed: Arc<tokio::sync::Notify>,
}

impl Heard {
    fn touch(&self) {
        *self.at.lock() = tokio::time::Instant::now();
        self.counters.heard_ms.store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
    }

    /// Completes once one keep-alive period, and `grace` for the message on the wire, has
    /// passed without a message: the server owed one by then.
    async fn silent(&self, grace: Duration) {
        let limit = self.keep_alive + grace;
        loop {
            let last = *self.at.lock();
            if last.elapsed() >= limit {
                return;
            }
            tokio::time::sleep_until(last + limit).await;
        }
    }
}

/// Every message of the subscription, keep-alives included: each says the server is
/// publishing; data changes go on as updates.
struct Notifications {
    tx: mpsc::UnboundedSender<Update>,
    counters: Arc<Counters>,
    heard: Heard,
    clock: Arc<crate::driver::clock::Clock>,
    /// The sensors' IDs, by index (the clock keeps each sensor's last time).
    ids: Vec<String>,
}

impl OnSubscriptionNotificationCore for Notifications {
    fn on_subscription_notification(&mut self, message: NotificationMessage, _items: MonitoredItemMap<'_>) {
        self.heard.touch();
        for data in message.notification_data.into_iter().flatten() {
            if data.inner_is::<EventNotificationList>() {
                let Some(list) = data.into_inner_as::<EventNotificationList>() else { continue };
                // Only the event item has an event filter (its client handle is not relied
                // on: node-opcua sends 0 for the one asked).
                for fields in list.events.into_iter().flatten() {
                    match conditions::parse(fields) {
                        Some(ServerEvent::Overflow) => self.heard.overflowed.notify_one(),
                        Some(event) => {
                            let _ = self.tx.send(Update::Event(event));
                        }
                        None => {}
                    }
                }
                continue;
            }
            let Some(changes) = data.into_inner_as::<DataChangeNotification>() else { continue };
            for change in changes.monitored_items.into_iter().flatten() {
                self.counters.notifications.fetch_add(1, Ordering::Relaxed);
                // Handles are 1-based: the library replaces a handle of 0 with one of its own.
                let Some(sensor) = (change.client_handle as usize).checked_sub(1) else { continue };
                let Some(id) = self.ids.get(sensor) else { continue };
                let sample = sample_of(change.value, &self.clock, id);
                let _ = self.tx.send(Update::Change { sensor, sample });
            }
        }
    }
}

/// Creates the subscription and its items on a fresh session; what tells when it last
/// heard from the server.
async fn subscribe(
    conn: &Connection,
    sensors: &[Sensor],
    interval: Duration,
    tx: &mpsc::UnboundedSender<Update>,
    counters: &Arc<Counters>,
    clock: &Arc<crate::driver::clock::Clock>,
    events: bool,
) -> Result<Heard, DriverError> {
    let heard = Heard {
        at: Arc::new(parking_lot::Mutex::new(tokio::time::Instant::now())),
        keep_alive: interval * KEEP_ALIVE_COUNT,
        counters: counters.clone(),
        subscription: 0,
        overflowed: Arc::default(),
    };
    let callback = Notifications {
        tx: tx.clone(),
        counters: counters.clone(),
        heard: heard.clone(),
        clock: clock.clone(),
        ids: sensors.iter().map(|s| s.id.to_string()).collect(),
    };
    let session = &conn.session;
    // A keep-alive every KEEP_ALIVE_COUNT publishing intervals; the server keeps the
    // subscription through 3 missed ones of ours.
    let id = session
        .create_subscription(interval, 3 * KEEP_ALIVE_COUNT, KEEP_ALIVE_COUNT, 0, 0, true, callback)
        .await
        .map_err(|_| DriverError::Unavailable { retry_after: None })?;
    let monitored: Vec<(usize, &Sensor, opcua::types::NodeId)> =
        sensors.iter().enumerate().filter_map(|(i, s)| Some((i, s, node_of(s)?))).collect();
    let mut items: Vec<MonitoredItemCreateRequest> = monitored
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
    if events {
        items.push(conditions::event_item());
    }
    let created = session
        .create_monitored_items(id, TimestampsToReturn::Both, items)
        .await
        .map_err(|_| DriverError::Unavailable { retry_after: None })?;
    if events {
        match created.get(monitored.len()).map(|c| c.result.status_code) {
            Some(s) if s.is_good() => {
                let queue = created.get(monitored.len()).map_or(0, |c| c.result.revised_queue_size);
                if queue < conditions::EVENT_QUEUE {
                    // A burst beyond it is lost on the server (said by an overflow event, if
                    // the server sends one: then the conditions are refreshed).
                    tracing::info!(
                        queue,
                        "OPC UA server keeps fewer events for fieldgate than asked (10,000)"
                    );
                }
                // The new subscription knows no condition yet: the server re-sends those it holds.
                refresh(conn, id).await;
            }
            s => tracing::warn!(
                status = s.map_or("none", |s| s.sub_code().name()),
                "OPC UA server refused the event item on its Server object: no Alarms & Conditions from it"
            ),
        }
    }
    for (c, (_, s, _)) in created.iter().zip(&monitored) {
        if c.result.status_code.is_bad() {
            tracing::warn!(
                sensor = %s.id,
                status = c.result.status_code.sub_code().name(),
                "OPC UA server refused to monitor the sensor's node"
            );
        }
    }
    // The server may have revised the publishing interval and keep-alive count: expect its
    // own keep-alive, not the one asked for.
    let mut heard = heard;
    heard.subscription = id;
    if let Some(sub) = session.subscription_state().lock().get(id) {
        heard.keep_alive =
            heard.keep_alive.max(sub.publishing_interval() * sub.max_keep_alive_count().max(1));
    }
    heard.touch();
    Ok(heard)
}

/// `ConditionRefresh` of subscription `id`: the server re-sends every condition it holds.
async fn refresh(conn: &Connection, id: u32) {
    let refreshed = conn.session.call(vec![conditions::refresh(id)]).await;
    let status = match &refreshed {
        Ok(r) => r.first().map(|r| r.status_code),
        Err(e) => Some(e.status()),
    };
    if !status.is_some_and(|s| s.is_good()) {
        tracing::warn!(
            status = status.map_or("none", |s| s.sub_code().name()),
            "OPC UA server refused ConditionRefresh: conditions standing before now are not known"
        );
    }
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
