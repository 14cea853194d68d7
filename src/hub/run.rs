//! The hub's task: a Sparkplug B primary host application on one broker at a time (the
//! next of `hub.brokers` when one cannot be reached). On every connection: a clean session
//! whose will is `STATE` offline (retained, QoS 1) with this connection's timestamp; the
//! subscriptions (its own STATE first, then the groups it serves); `STATE` online with the
//! same timestamp once the broker granted them; online again whenever its own offline
//! shows up. Every message goes to the fleet; values to history; rebirth requests go out
//! as NCMD `Node Control/Rebirth`; births rebuild the catalogue the tools answer from.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use parking_lot::Mutex;
use rumqttc::{ConnectionError, Event, Incoming, QoS};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::alarm_queue::{ALARM_NEWS, AlarmNews, Waiting, journal_alarms, queued};
use super::catalogue;
use super::fleet::{Clock, Fleet, From, Update};
use super::{Counters, Hub};
use crate::config::hub::HubConfig;
use crate::config::mqtt::Broker;
use crate::driver::Drivers;
use crate::reading::record::stored_of;
use crate::spb::link::{self, Link, Settings, Will};
use crate::spb::payload::{Metric, Payload, Value, datatype};
use crate::spb::topic::{self, Address, Kind};
use crate::tools::ToolService;

const TICK: Duration = Duration::from_millis(100);
/// Births rebuild the catalogue at most this often (a fleet starting up births in bursts).
const REBUILD_EVERY: Duration = Duration::from_millis(250);
/// A catalogue that stood this long gets its text index built before a query asks.
const WARM_TEXT_AFTER: Duration = Duration::from_secs(1);
/// Rebirth requests sent per tick, at most: ten a second, so a fleet coming back (or a
/// flood of unknown edge nodes) never floods the broker or the client's queue.
const REBIRTHS_PER_TICK: usize = 1;
/// A connection up this long resets the reconnect backoff.
const STABLE: Duration = Duration::from_secs(10);

pub(super) struct Host {
    cfg: HubConfig,
    brokers: Vec<Broker>,
    broker: usize,
    settings: Settings,
    fleet: Arc<Mutex<Fleet>>,
    hub: Hub,
    tools: ToolService,
    counters: Arc<Counters>,
    link: Option<Link>,
    /// This connection's STATE timestamp (ms), once connected.
    state_ts: Option<u64>,
    /// Subscriptions not yet granted; STATE online goes out when none is left.
    awaiting_subacks: usize,
    online: bool,
    backoff: crate::backoff::Backoff,
    retry_at: Option<Instant>,
    connected_at: Option<Instant>,
    dirty: bool,
    last_rebuild: Option<Instant>,
    updates: Vec<Update>,
    /// Log lines the broker's clients can cause at will, one a minute per kind.
    throttle: crate::logs::Throttle,
    /// The edge nodes' alarm metrics, and the queue of what they said to the task that
    /// journals it (in order, never holding up this one).
    alarm_aliases: super::alarms::AlarmAliases,
    alarm_news: Option<tokio::sync::mpsc::Sender<AlarmNews>>,
    /// Edge node → its messages waiting in that queue (one node takes a share of it only).
    alarm_waiting: Waiting,
}

impl Host {
    pub(super) fn new(
        cfg: HubConfig,
        brokers: Vec<Broker>,
        settings: Settings,
        hub: Hub,
        tools: ToolService,
        counters: Arc<Counters>,
    ) -> Host {
        let backoff = crate::backoff::Backoff::new(
            Duration::from_millis(200),
            Duration::from_millis(cfg.link.reconnect_max_ms),
        );
        Host {
            fleet: hub.fleet.clone(),
            cfg,
            brokers,
            broker: 0,
            settings,
            hub,
            tools,
            counters,
            link: None,
            state_ts: None,
            awaiting_subacks: 0,
            online: false,
            backoff,
            retry_at: Some(Instant::now()),
            connected_at: None,
            dirty: false,
            last_rebuild: None,
            updates: Vec::new(),
            throttle: crate::logs::Throttle::default(),
            alarm_aliases: Default::default(),
            alarm_news: None,
            alarm_waiting: Arc::default(),
        }
    }

    pub(super) async fn run(mut self, stop: CancellationToken) {
        let (news, rx) = tokio::sync::mpsc::channel(ALARM_NEWS);
        self.alarm_news = Some(news);
        let journal = tokio::spawn(journal_alarms(
            rx,
            self.tools.clone(),
            self.fleet.clone(),
            self.alarm_waiting.clone(),
        ));
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let event = async {
                match self.link.as_mut() {
                    Some(l) => l.events.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                ev = event => match ev {
                    Some(ev) => self.on_event(ev),
                    None => self.lost("the connection's task ended"),
                },
                _ = tick.tick() => self.on_tick(),
            }
        }
        self.alarm_news = None;
        let _ = journal.await;
        self.leave().await;
    }

    fn state_payload(online: bool, ts: u64) -> Vec<u8> {
        serde_json::json!({ "online": online, "timestamp": ts }).to_string().into_bytes()
    }

    fn connect(&mut self) {
        let Some(broker) = self.brokers.get(self.broker).cloned() else { return };
        let ts = Utc::now().timestamp_millis().max(0) as u64;
        let will = Will {
            topic: topic::state(&self.cfg.host_id),
            payload: Self::state_payload(false, ts),
            retain: true,
        };
        let (client, events) = link::open(&self.settings, &broker, will);
        *self.counters.broker.lock() = broker.to_string();
        self.link = Some(Link::new(client, events));
        self.state_ts = Some(ts);
        self.awaiting_subacks = 0;
        self.online = false;
    }

    fn on_event(&mut self, ev: Result<Event, ConnectionError>) {
        match ev {
            Ok(Event::Incoming(Incoming::ConnAck(_))) => self.connected(),
            Ok(Event::Incoming(Incoming::SubAck(ack))) => {
                use rumqttc::SubscribeReasonCode as R;
                if ack.return_codes.iter().any(|c| matches!(c, R::Failure)) {
                    *self.counters.link_error.lock() = Some(
                        "the broker refused a subscription (its ACL): the hub cannot read the fleet".into(),
                    );
                    self.lost("a subscription was refused");
                    return;
                }
                self.awaiting_subacks = self.awaiting_subacks.saturating_sub(1);
                if self.awaiting_subacks == 0 && !self.online {
                    self.publish_online();
                }
            }
            Ok(Event::Incoming(Incoming::Publish(p))) => self.on_publish(&p.topic, &p.payload),
            Ok(_) => {}
            Err(e) => {
                let reason = match &e {
                    ConnectionError::MqttState(rumqttc::StateError::Deserialization(
                        rumqttc::Error::PayloadSizeLimitExceeded(size),
                    )) => format!(
                        "a message of {size} bytes, more than the hub takes ({} MiB), dropped the connection; if it comes back after every reconnect it is retained on a spBv1.0 topic: remove it (publish an empty retained message on its topic), and cap the broker's message_size_limit",
                        super::MAX_MESSAGE >> 20
                    ),
                    _ => link::reason(&e),
                };
                *self.counters.link_error.lock() = Some(reason.clone());
                self.lost(&reason);
            }
        }
    }

    fn connected(&mut self) {
        self.connected_at = Some(Instant::now());
        Counters::add(&self.counters.connects, 1);
        tracing::info!(broker = %self.counters.broker.lock(), host_id = %self.cfg.host_id, "hub: connected");
        let Some(l) = &self.link else { return };
        // Its own STATE first (to see its will if the broker ever publishes it), then the
        // fleet: STATE online only once both are granted.
        let mut filters = vec![(topic::state(&self.cfg.host_id), QoS::AtLeastOnce)];
        if self.cfg.groups.is_empty() {
            filters.push((format!("{}/#", topic::NAMESPACE), QoS::AtMostOnce));
        } else {
            filters.extend(
                self.cfg.groups.iter().map(|g| (format!("{}/{g}/#", topic::NAMESPACE), QoS::AtMostOnce)),
            );
        }
        for (f, qos) in filters {
            if l.client.try_subscribe(f, qos).is_ok() {
                self.awaiting_subacks += 1;
            }
        }
    }

    fn publish_online(&mut self) {
        let (Some(l), Some(ts)) = (&self.link, self.state_ts) else { return };
        let topic = topic::state(&self.cfg.host_id);
        if l.client.try_publish(topic, QoS::AtLeastOnce, true, Self::state_payload(true, ts)).is_ok() {
            self.online = true;
            *self.counters.link_error.lock() = None;
            self.counters.online.store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(host_id = %self.cfg.host_id, "hub: STATE online");
            // What happened while the hub was away is not known: every edge node is asked.
            self.fleet.lock().broker_back(Instant::now());
        }
    }

    fn on_publish(&mut self, t: &str, payload: &[u8]) {
        Counters::add(&self.counters.messages, 1);
        match Address::parse(t) {
            Some(Address::State { host }) if host == self.cfg.host_id => {
                // Its own offline (a will from a connection the broker took for dead):
                // online again, at once.
                let offline = serde_json::from_slice::<serde_json::Value>(payload)
                    .ok()
                    .and_then(|v| v.get("online").and_then(serde_json::Value::as_bool))
                    == Some(false);
                if offline && self.online {
                    self.online = false;
                    self.publish_online();
                }
            }
            Some(Address::Edge { group, kind, node, device }) => {
                if !self.cfg.groups.is_empty() && !self.cfg.groups.iter().any(|g| g == group) {
                    return;
                }
                let clock = Clock { now: Instant::now(), wall: Utc::now() };
                // Decoded before the fleet is locked: readings wait only for the applying.
                let decoded = Payload::decode_bytes(payload);
                // The node's alarms too (a birth may carry 20,000): readers wait for neither.
                let edge = format!("{group}/{node}");
                let alarms = match (&decoded, device) {
                    (Ok(p), None) => self.alarm_aliases.read(&edge, kind, p),
                    _ => None,
                };
                let mut fleet = self.fleet.lock();
                match decoded {
                    Ok(p) => {
                        let refused = fleet.strangers().births_refused;
                        let changed =
                            fleet.on_message(From { group, node, kind, device }, p, clock, &mut self.updates);
                        if let Some(news) = alarms
                            && fleet.strangers().births_refused == refused
                            && let Some(queue) = &self.alarm_news
                            && !queued(queue, &self.alarm_waiting, edge, news)
                        {
                            Counters::add(&self.counters.alarm_news_dropped, 1);
                            // What it said of its alarms is lost: its birth says them again.
                            fleet.want_rebirth(group, node);
                            if let Some(skipped) = self.throttle.allow("alarm news dropped") {
                                tracing::warn!(
                                    skipped,
                                    "hub: edges' alarm messages come faster than they are journaled; one dropped, its edge node asked for a rebirth (one line a minute)"
                                );
                            }
                        }
                        self.dirty |= changed.catalogue;
                        if fleet.strangers().births_refused > refused
                            && let Some(skipped) = self.throttle.allow("births refused")
                        {
                            tracing::warn!(
                                group,
                                node,
                                skipped,
                                max = super::fleet::MAX_EDGE_NODES,
                                "hub: an edge node's birth refused, the hub takes no more edge nodes (shard the fleet by group over several hubs; one line a minute)"
                            );
                        }
                    }
                    Err(_) => {
                        Counters::add(&self.counters.undecodable, 1);
                        // A command is nobody's message of the edge node's: nothing to ask it.
                        if !matches!(kind, Kind::NCmd | Kind::DCmd) {
                            fleet.undecodable(group, node, clock);
                        }
                    }
                }
                drop(fleet);
                self.record();
            }
            _ => {}
        }
    }

    fn on_tick(&mut self) {
        if self.link.is_none() {
            if self.retry_at.is_some_and(|t| Instant::now() >= t) {
                self.retry_at = None;
                self.connect();
            }
            return;
        }
        if self.connected_at.is_some_and(|t| t.elapsed() >= STABLE) {
            self.backoff.reset();
        }
        let clock = Clock { now: Instant::now(), wall: Utc::now() };
        let due = {
            let mut fleet = self.fleet.lock();
            self.dirty |= fleet.tick(clock.now, clock.wall, &mut self.updates).catalogue;
            if self.online { fleet.rebirths(clock.now, REBIRTHS_PER_TICK) } else { Vec::new() }
        };
        self.record();
        for (group, node) in due {
            self.ask_rebirth(&group, &node);
        }
        if self.dirty && self.last_rebuild.is_none_or(|t| t.elapsed() >= REBUILD_EVERY) {
            self.rebuild();
        }
    }

    fn ask_rebirth(&mut self, group: &str, node: &str) {
        let Some(l) = &self.link else { return };
        let mut m =
            Metric::new(Some("Node Control/Rebirth"), None, datatype::BOOLEAN, Some(Value::Boolean(true)));
        m.timestamp = Some(Utc::now().timestamp_millis().max(0) as u64);
        let p = Payload { timestamp: m.timestamp, metrics: vec![m], seq: None, uuid: None, body: None };
        if l.client
            .try_publish(topic::node_command(group, node), QoS::AtMostOnce, false, p.encode_to_bytes())
            .is_ok()
        {
            Counters::add(&self.counters.rebirths_requested, 1);
            if let Some(skipped) = self.throttle.allow("rebirth") {
                tracing::info!(
                    group,
                    node,
                    skipped,
                    "hub: rebirth requested (one line a minute; fieldgate_hub_rebirth_requests counts them all)"
                );
            }
        }
    }

    /// Values applied go to history (the hub's own, whatever their time), a message's
    /// values in one go.
    fn record(&mut self) {
        if self.updates.is_empty() {
            return;
        }
        let updates = std::mem::take(&mut self.updates);
        if let Some(store) = self.tools.history() {
            let fleet = self.fleet.lock();
            // Whether each device holds its device ID, asked once per device of the message.
            let mut holds: Vec<((usize, usize), bool)> = Vec::new();
            let points = updates.iter().filter_map(|u| {
                let (_, Some(_), metric) = fleet.metric(u.at)? else { return None };
                let d = u.at.device?;
                // A sensor ID announced by this device alone, of a device that holds its
                // ID: a conflict is never merged, a superseded device never written.
                let held = match holds.iter().find(|(k, _)| *k == (u.at.edge, d)) {
                    Some(&(_, h)) => h,
                    None => {
                        let h = fleet.holds_device(u.at.edge, d);
                        holds.push(((u.at.edge, d), h));
                        h
                    }
                };
                if !held
                    || !fleet.sole_claim(&metric.name, u.at.edge, d)
                    || metric.name.parse::<crate::ids::SensorId>().is_err()
                {
                    return None;
                }
                let sample = crate::driver::Sample {
                    value: u.value.clone().unwrap_or(crate::driver::RawValue::Float(f64::NAN)),
                    at: u.time,
                    quality: u.quality,
                };
                let (value, quality) = stored_of(&sample);
                Some((
                    metric.name.as_str(),
                    crate::store::gorilla::Point { t: u.time.timestamp_millis(), value, quality },
                ))
            });
            store.append_all(points);
        }
        Counters::add(&self.counters.values, updates.len() as u64);
        self.updates = updates;
        self.updates.clear();
    }

    /// A new catalogue from the fleet, for the tools.
    fn rebuild(&mut self) {
        self.dirty = false;
        self.last_rebuild = Some(Instant::now());
        let built = catalogue::build(&self.fleet.lock());
        match built {
            Ok((registry, left)) => {
                let registry = Arc::new(registry);
                let drivers = Drivers::shared(&registry, self.hub.driver.clone());
                let core = self.tools.core().renewed(registry.clone(), drivers);
                self.tools.renew(core);
                self.warm_text_later(&registry);
                *self.counters.left.lock() = left;
                self.counters
                    .sensors
                    .store(registry.sensors().len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            Err(why) => tracing::error!(%why, "hub: the catalogue could not be built; the last one stays"),
        }
    }

    /// The text index of `registry` built off the tools' path once it has stood for
    /// `WARM_TEXT_AFTER` (during a fleet's births a catalogue stands a quarter second: those
    /// are not worth indexing), so the first `list_sensors` with `text` finds it built.
    fn warm_text_later(&self, registry: &Arc<crate::registry::Registry>) {
        let (tools, registry) = (self.tools.clone(), Arc::downgrade(registry));
        tokio::spawn(async move {
            tokio::time::sleep(WARM_TEXT_AFTER).await;
            let Some(registry) = registry.upgrade().filter(|r| Arc::ptr_eq(r, &tools.registry())) else {
                return;
            };
            let _ = tokio::task::spawn_blocking(move || registry.warm_text()).await;
        });
    }

    fn lost(&mut self, why: &str) {
        let was_online = self.online;
        self.link = None;
        self.online = false;
        self.counters.online.store(false, std::sync::atomic::Ordering::Relaxed);
        self.fleet.lock().broker_lost(Utc::now());
        if was_online {
            tracing::warn!(reason = why, "hub: lost the broker; every edge node is unknown until it is back");
        } else if let Some(skipped) = self.throttle.allow("no broker") {
            tracing::warn!(reason = why, failed_since_last_line = skipped, broker = %self.counters.broker.lock(), "hub: no connection to the broker; trying again (one line a minute)");
        }
        self.broker = (self.broker + 1) % self.brokers.len().max(1);
        self.retry_at = Some(Instant::now() + self.backoff.next_wait());
    }

    /// STATE offline with this connection's timestamp, then a clean disconnect.
    async fn leave(&mut self) {
        let Some(mut l) = self.link.take() else { return };
        if let Some(ts) = self.state_ts.filter(|_| self.online) {
            let _ = l.client.try_publish(
                topic::state(&self.cfg.host_id),
                QoS::AtLeastOnce,
                true,
                Self::state_payload(false, ts),
            );
        }
        let _ = l.client.try_disconnect();
        // Until the broker closes the connection on the DISCONNECT (the event that it was
        // handed to the connection comes before it is on the wire: stopping there cut it
        // off, and the broker published the will as well).
        let deadline = Instant::now() + Duration::from_secs(2);
        while let Ok(Some(Ok(_))) = tokio::time::timeout_at(deadline, l.events.recv()).await {}
    }
}
