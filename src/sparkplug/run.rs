//! The edge node's task: connects (one broker after another, with backoff), registers the
//! NDEATH will with the `bdSeq` of each connection, sends births once the broker (and the
//! primary host, when configured) is there, turns the poller's samples into DDATA by
//! exception, sends DDEATH/DBIRTH as devices' breakers open and close, answers NCMD
//! Rebirth, refuses DCMD, and keeps in the buffer whatever cannot be sent, draining it
//! after the births, oldest first, between live messages.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, Event, Incoming, Outgoing, QoS};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::buffer::{Buffer, Key, Rec};
use super::node::{Edge, Out, asks_device_rebirth, asks_rebirth, hand_over};
use crate::config::mqtt::{Broker, MqttConfig};
use crate::metrics::sparkplug::Counters;
use crate::reading::feed::Batch;
use crate::resilience::breaker::SnapshotState;
use crate::service::Core;
use crate::spb::link::{self, Link, REQUESTS, Settings};
use crate::spb::payload::Payload;
use crate::spb::topic::{self, Incoming as Topic};

/// Values of one drain step, and metrics per DDATA message.
const DRAIN_CHUNK: usize = 2000;
/// How long a device waits after the node's birth for a value of each sensor before its
/// DBIRTH goes out without them.
const BIRTH_WAIT: Duration = Duration::from_secs(5);
/// A connection up this long resets the reconnect backoff.
const STABLE: Duration = Duration::from_secs(10);
const PER_MESSAGE: usize = 500;
/// Live values held while the birth sequence is not over, at most, before they go to the buffer.
const HELD_MAX: usize = 8 * PER_MESSAGE;
/// Messages handed to rumqttc and not yet written, at most, before data waits in the buffer.
const QUEUED_MAX: u64 = (REQUESTS / 2) as u64;
const TICK: Duration = Duration::from_millis(100);
/// Rebirths asked by NCMD are done at most this often (a flood of them is one a second).
const REBIRTH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Down {
        retry_at: Instant,
    },
    Connecting,
    /// Connected; waiting for the primary host's STATE to say online.
    AwaitingHost,
    Online,
    /// Disconnecting on purpose (the primary host went offline).
    Leaving,
}

pub struct Node {
    core: Core,
    cfg: MqttConfig,
    brokers: Vec<Broker>,
    broker: usize,
    settings: Settings,
    edge: Edge,
    buffer: Buffer,
    counters: Arc<Counters>,
    link: Option<Link>,
    phase: Phase,
    bd_seq: u64,
    backoff: crate::backoff::Backoff,
    /// When the current connection was acknowledged.
    connected_at: Option<Instant>,
    /// When the node was last born (NBIRTH).
    online_at: Instant,
    /// Live values for the next tick's DDATA.
    live: Vec<Rec>,
    /// Messages handed to rumqttc minus those it wrote.
    queued: u64,
    /// Messages the client wrote on this connection (`Outgoing::Publish` events).
    written: u64,
    /// Drained values handed over and not yet written: (the message's number on this
    /// connection, their buffer keys). They leave the buffer once written, not before: a
    /// value still in the client's queue at `kill -9` was never sent.
    unwritten: std::collections::VecDeque<(u64, Vec<(Key, u64)>)>,
    /// The newest key handed over while some are unwritten: the drain goes on after it.
    drain_cursor: Option<Key>,
    /// The last STATE timestamp seen (older ones are ignored, as the specification says).
    host_ts: u64,
    flush_every: Duration,
    last_flush: Instant,
    /// Nothing drainable until the next tick (the rest waits for devices to be born).
    drain_idle: bool,
    /// Warnings the broker's clients can cause, rate-limited.
    throttle: crate::logs::Throttle,
    /// Per device that died on this connection: when (ms), and since when it is up again.
    returning: Vec<Option<(i64, Option<Instant>)>>,
    /// A rebirth asked while the last birth is less than `REBIRTH_EVERY` old waits for it.
    rebirth_pending: bool,
    /// When each device was last born again on a DCMD's request (at most once a second).
    device_rebirths: Vec<Option<Instant>>,
    /// Whether this connection subscribed to NCMD/DCMD, and until when it does not: a
    /// message too large to take on them drops the connection (rumqttc cannot skip it), so
    /// the node goes on without commands for a while rather than flap (`oversized`).
    commands_subscribed: bool,
    commands_off_until: Option<Instant>,
    /// Oversized messages in a row (commands, then STATE): each doubles the next pause.
    oversized: Oversized,
    /// Whether the broker was seen to take this connection's NBIRTH (`echo.rs`).
    echo: echo::Echo,
    /// The alarms published as node metrics (`alarms.rs`), told of each change.
    alarms: Option<Arc<crate::alarms::Alarms>>,
    alarm_changes: Option<tokio::sync::watch::Receiver<u64>>,
    alarm_sent: crate::sparkplug::alarm::Sent,
}

/// How often in a row a message too large to take dropped the connection, and what waits.
#[derive(Default)]
struct Oversized {
    /// On the command topics, without the commands staying subscribed for a pause since.
    commands: u32,
    /// Since commands were subscribed again (the streak ends after a pause without one).
    commands_back_at: Option<Instant>,
    /// On STATE (with commands not subscribed, nothing else is): no STATE taken since.
    state: u32,
    /// No connection before this (after one on STATE: a new one would take it again).
    hold_until: Option<Instant>,
}

async fn next_event(link: &mut Option<Link>) -> Result<Event, ConnectionError> {
    match link {
        // The task ends only after sending an error, which drops the link.
        Some(l) => l.events.recv().await.unwrap_or(Err(ConnectionError::RequestsDone)),
        None => std::future::pending().await,
    }
}

async fn until(phase: Phase) {
    match phase {
        Phase::Down { retry_at } => tokio::time::sleep_until(retry_at).await,
        _ => std::future::pending().await,
    }
}

impl Node {
    pub fn new(
        core: Core,
        cfg: MqttConfig,
        edge: Edge,
        buffer: Buffer,
        settings: Settings,
        counters: Arc<Counters>,
    ) -> Node {
        let brokers = cfg.brokers.iter().filter_map(|b| crate::config::mqtt::parse_broker(b).ok()).collect();
        let flush_every = Duration::from_millis(core.config.storage.flush_interval_ms);
        let backoff = crate::backoff::Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(cfg.reconnect_max_ms),
        );
        // Sparkplug: bdSeq starts at 0 and goes up by one on every CONNECT (kept across
        // restarts, so a late will of the last process never matches this one's NBIRTH).
        let bd_seq = buffer.bd_seq().unwrap_or(255);
        let alarms = core.alarms.clone().filter(|a| a.count() > 0);
        Node {
            core,
            cfg,
            brokers,
            broker: 0,
            settings,
            edge,
            buffer,
            counters,
            link: None,
            phase: Phase::Down { retry_at: Instant::now() },
            bd_seq,
            backoff,
            connected_at: None,
            online_at: Instant::now(),
            live: Vec::new(),
            queued: 0,
            written: 0,
            unwritten: std::collections::VecDeque::new(),
            drain_cursor: None,
            host_ts: 0,
            flush_every,
            last_flush: Instant::now(),
            drain_idle: false,
            throttle: crate::logs::Throttle::default(),
            returning: Vec::new(),
            rebirth_pending: false,
            device_rebirths: Vec::new(),
            commands_subscribed: false,
            commands_off_until: None,
            oversized: Oversized::default(),
            echo: echo::Echo::Off,
            alarm_changes: alarms.as_ref().map(|a| a.changes()),
            alarms,
            alarm_sent: Default::default(),
        }
    }

    /// The task's loop, which takes `samples` from the feed and runs until `stop`.
    pub fn start(
        self,
        samples: mpsc::Receiver<Arc<Batch>>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(samples, stop))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Arc<Batch>>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                ev = next_event(&mut self.link) => self.on_event(ev),
                () = until(self.phase) => self.connect(),
                b = rx.recv() => match b {
                    Some(b) => self.on_batch(&b),
                    None => break,
                },
                _ = tick.tick() => self.on_tick(),
                () = std::future::ready(()), if self.can_drain() => self.drain(),
            }
        }
        // What the poller handed over before it stopped is kept (sent, or buffered by `shut`),
        // not dropped with the queue: the poller's tasks end on the same stop, and the queue
        // closes when the last of them is gone (bounded by a read's deadline, should one hang).
        let grace = Duration::from_millis(self.core.config.calls.deadline_ms) + Duration::from_secs(1);
        let deadline = Instant::now() + grace;
        while let Ok(Some(b)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            self.on_batch(&b);
        }
        self.shut().await;
    }

    fn connect(&mut self) {
        let Some(broker) = self.brokers.get(self.broker).cloned() else {
            self.phase = Phase::Down { retry_at: Instant::now() + Duration::from_secs(3600) };
            return;
        };
        // The will carries the bdSeq of this connection's NBIRTH; a new one for every
        // connection (the first ever is 0).
        self.bd_seq = (self.bd_seq + 1) % 256;
        let failing = self.buffer.problem().is_some();
        if let Err(error) = self.buffer.set_bd_seq(self.bd_seq)
            && !failing
        {
            tracing::warn!(%error, "sparkplug: bdSeq not recorded; a restart may repeat it");
        }
        self.written();
        let will = self.edge.ndeath(self.bd_seq);
        let (client, events) = link::open(
            &self.settings,
            &broker,
            link::Will { topic: will.topic, payload: will.payload, retain: false },
        );
        *self.counters.broker.lock() = broker.to_string();
        self.link = Some(Link::new(client, events));
        self.queued = 0;
        self.written = 0;
        self.unwritten.clear();
        self.drain_cursor = None;
        // A host's STATE is per server (its retained message there): a newer one seen on
        // the last server does not make this server's older than it.
        self.host_ts = 0;
        self.phase = Phase::Connecting;
    }

    fn on_event(&mut self, ev: Result<Event, ConnectionError>) {
        match ev {
            Ok(Event::Incoming(Incoming::ConnAck(_))) => self.connected(),
            // A retained message on the node's own NBIRTH topic is not this connection's.
            Ok(Event::Incoming(Incoming::Publish(p)))
                if p.retain && self.edge.topics().parse(&p.topic) == Topic::OwnBirth =>
            {
                self.echo_received(&p.payload, true)
            }
            Ok(Event::Incoming(Incoming::Publish(p))) => self.on_message(&p.topic, &p.payload),
            Ok(Event::Incoming(Incoming::SubAck(ack))) => self.echo_suback(ack.pkid, &ack.return_codes),
            Ok(Event::Outgoing(Outgoing::Subscribe(pkid))) => self.echo_subscribe_written(pkid),
            Ok(Event::Outgoing(Outgoing::Publish(_))) => {
                self.queued = self.queued.saturating_sub(1);
                self.written += 1;
                Counters::add(&self.counters.messages_sent, 1);
                self.remove_written();
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) if self.phase == Phase::Leaving => {
                self.lost("left the broker: the primary host is offline", false);
            }
            Ok(_) => {}
            Err(e) => {
                if let ConnectionError::MqttState(rumqttc::StateError::Deserialization(
                    rumqttc::Error::PayloadSizeLimitExceeded(size),
                )) = &e
                {
                    self.oversized(*size);
                }
                let never_connected = self.phase == Phase::Connecting;
                let reason = link::reason(&e);
                *self.counters.link_error.lock() = Some(reason.clone());
                self.lost(&reason, never_connected);
            }
        }
    }

    fn connected(&mut self) {
        self.connected_at = Some(Instant::now());
        // With the check on, the link works once the broker takes the NBIRTH (`echo.rs`).
        if self.cfg.confirm_birth_s == 0 {
            *self.counters.link_error.lock() = None;
        }
        self.counters.connected.store(true, Ordering::Relaxed);
        Counters::add(&self.counters.connects, 1);
        tracing::info!(broker = %self.counters.broker(), bd_seq = self.bd_seq, "sparkplug: connected");
        self.echo_subscribe();
        let Some(l) = &self.link else { return };
        let now = Instant::now();
        // While STATE is known to hold a message too large to take, commands stay out too, so
        // that the next drop is known to come from STATE.
        self.commands_subscribed =
            self.oversized.state == 0 && self.commands_off_until.is_none_or(|t| t <= now);
        if self.commands_subscribed && self.commands_off_until.take().is_some() {
            self.oversized.commands_back_at = Some(now);
        }
        let mut filters: Vec<String> =
            if self.commands_subscribed { self.edge.topics().command_filters().into() } else { Vec::new() };
        if !self.cfg.primary_host_id.is_empty() {
            filters.push(topic::state(&self.cfg.primary_host_id));
        }
        for f in filters {
            if let Err(error) = l.client.try_subscribe(f, QoS::AtLeastOnce) {
                tracing::warn!(%error, "sparkplug: cannot subscribe");
            }
        }
        if self.cfg.primary_host_id.is_empty() {
            self.birth();
        } else {
            self.phase = Phase::AwaitingHost;
        }
    }

    /// The connection is gone: data waits in the buffer; the next attempt after a backoff,
    /// on the next broker when this one could not be reached at all (or was left).
    fn lost(&mut self, why: &str, next_broker: bool) {
        let was = self.phase;
        self.link = None;
        self.echo = echo::Echo::Off;
        // Live values not sent yet wait in the buffer (the next births would not carry them).
        std::mem::take(&mut self.live).into_iter().for_each(|r| self.buffer.push(r));
        // What the client had not written stays in the buffer for the next connection.
        self.unwritten.clear();
        self.drain_cursor = None;
        self.edge.all_dead();
        self.returning.clear();
        self.counters.connected.store(false, Ordering::Relaxed);
        self.counters.online.store(false, Ordering::Relaxed);
        if next_broker || was == Phase::Leaving {
            self.broker = (self.broker + 1) % self.brokers.len().max(1);
        }
        // After leaving too: a new connection with the same client ID racing the old one's
        // DISCONNECT would make the broker publish the old will as well.
        // Only a connection that lasted resets the backoff: one the broker (or a retained
        // message too large to take) drops at once is retried like a failed connect.
        if self.connected_at.take().is_some_and(|t| t.elapsed() >= STABLE) {
            self.backoff.reset();
        }
        let held =
            self.oversized.hold_until.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()));
        let wait = self.backoff.next_wait().max(held);
        if matches!(was, Phase::Online | Phase::AwaitingHost | Phase::Leaving) {
            tracing::warn!(reason = why, "sparkplug: broker connection lost; data goes to the buffer");
        } else if let Some(skipped) = self.throttle.allow("connect") {
            let broker = self.counters.broker();
            tracing::warn!(%broker, reason = why, skipped, "sparkplug: cannot connect to the broker; data goes to the buffer");
        }
        self.phase = Phase::Down { retry_at: Instant::now() + wait };
    }

    /// Hands a message to rumqttc; false when it cannot take it now.
    fn send(&mut self, out: Out) -> bool {
        publish(
            self.link.as_ref().map(|l| &l.client),
            self.cfg.data_qos,
            &mut self.queued,
            &self.counters,
            out,
        )
    }

    fn room(&self) -> bool {
        self.queued < QUEUED_MAX
    }

    /// Sends data messages; the values of any that could not be handed over go to the
    /// buffer (and their `seq` is taken back, so the host sees no gap).
    fn send_data(&mut self, recs: Vec<Rec>) {
        if recs.is_empty() {
            return;
        }
        if self.phase != Phase::Online || !self.room() {
            recs.into_iter().for_each(|r| self.buffer.push(r));
            return;
        }
        let outs = self.edge.ddata(&recs, false, PER_MESSAGE);
        let unsent = self.hand_over(outs);
        // Only what was not handed over: a value sent live is never sent again as historical.
        let mut recs: Vec<Option<Rec>> = recs.into_iter().map(Some).collect();
        for j in unsent {
            if let Some(r) = recs.get_mut(j).and_then(Option::take) {
                self.buffer.push(r);
            }
        }
    }

    /// Hands `outs` to the client in order until one cannot be; the `seq` of those not
    /// sent is taken back (the host sees no gap). Returns the indices of the records the
    /// unsent messages carried.
    fn hand_over(&mut self, outs: Vec<Out>) -> Vec<usize> {
        let Node { edge, link, cfg, queued, counters, .. } = self;
        let client = link.as_ref().map(|l| &l.client);
        hand_over(edge, outs, |out| publish(client, cfg.data_qos, queued, counters, out))
    }

    fn on_batch(&mut self, b: &Batch) {
        let online = self.phase == Phase::Online;
        if online && !self.edge.is_born(b.device) && self.ready(b.device) {
            // Back from the dead: its birth carries these values.
            self.dbirth(b.device);
            return;
        }
        let registry = self.edge.registry_arc();
        let recs: Vec<Rec> = b
            .samples
            .iter()
            .filter_map(|(i, sample)| registry.sensors().get(*i).and_then(|s| self.edge.offer(s, sample)))
            .collect();
        if online && self.edge.is_born(b.device) {
            // Sent with the tick's other values: one DDATA for a device's changes, not one
            // per change (a subscription hands them over one at a time).
            self.live.extend(recs);
            if self.live.len() >= PER_MESSAGE {
                self.send_live();
            }
        } else {
            // Not sendable now (offline, or the device not born): kept for later.
            recs.into_iter().for_each(|r| self.buffer.push(r));
        }
    }

    /// The live values gathered since the last tick (held while the birth sequence is not
    /// over; past `HELD_MAX` of them, into the buffer, to follow as historical).
    fn send_live(&mut self) {
        if self.phase == Phase::Online && self.births_pending() {
            if self.live.len() > HELD_MAX {
                std::mem::take(&mut self.live).into_iter().for_each(|r| self.buffer.push(r));
            }
            return;
        }
        let live = std::mem::take(&mut self.live);
        self.send_data(live);
    }

    fn on_tick(&mut self) {
        let now = chrono::Utc::now().timestamp_millis();
        self.commands_back();
        self.echo_due();
        if self.rebirth_pending && self.online_at.elapsed() >= REBIRTH_EVERY {
            self.rebirth();
        }
        if self.phase == Phase::Online {
            for d in 0..self.edge.registry().devices().len() {
                let up = self.device_up(d);
                if self.edge.is_born(d) && !up {
                    let death = self.edge.ddeath(d);
                    self.send(death);
                    self.returning.resize(self.edge.registry().devices().len(), None);
                    self.returning[d] = Some((now, None));
                } else if !self.edge.is_born(d) && up {
                    if let Some(Some((_, up_at @ None))) = self.returning.get_mut(d) {
                        *up_at = Some(Instant::now());
                    }
                    if self.ready(d) {
                        self.dbirth(d);
                    }
                }
            }
            if !self.births_pending() {
                let again = self.edge.silent(now);
                self.send_data(again);
            }
            self.send_alarms();
        }
        self.send_live();
        self.flush_due(now);
        self.counters.buffered.store(self.buffer.len(), Ordering::Relaxed);
        self.counters.dropped.store(self.buffer.dropped(), Ordering::Relaxed);
        self.drain_idle = false;
    }

    /// On stop: the buffer made durable; when connected, NDEATH and a clean disconnect.
    async fn shut(mut self) {
        std::mem::take(&mut self.live).into_iter().for_each(|r| self.buffer.push(r));
        let now = chrono::Utc::now().timestamp_millis();
        if let Err(error) = self.buffer.flush(now) {
            tracing::error!(%error, "sparkplug buffer not fully written at stop");
        }
        // Values births carried leave the buffer: the next process, which cannot know them,
        // would send them again as historical.
        let carried = self.edge.carried();
        if !carried.is_empty()
            && let Err(error) = self.buffer.remove_each(&carried, now).and_then(|_| self.buffer.flush(now))
        {
            tracing::debug!(%error, "sparkplug buffer: values births carried not removed; they may be sent again");
        }
        let Some(mut l) = self.link.take() else { return };
        // Connected (born or waiting for the primary host): NDEATH before DISCONNECT, which
        // the broker takes as the end of the session without sending the will.
        if matches!(self.phase, Phase::Online | Phase::AwaitingHost) {
            let death = self.edge.ndeath(self.bd_seq);
            let _ = l.client.try_publish(death.topic, QoS::AtLeastOnce, false, death.payload);
        }
        let _ = l.client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match l.events.recv().await {
                    Some(Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_)) | None => break,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        self.counters.connected.store(false, Ordering::Relaxed);
        self.counters.online.store(false, Ordering::Relaxed);
    }
}

mod alarms;
mod births;
mod commands;
mod drain;
mod echo;

/// Hands `out` to the client (QoS 1 for data only when `data_qos = 1`); false when it
/// cannot take it now.
pub fn publish(
    client: Option<&AsyncClient>,
    data_qos: u8,
    queued: &mut u64,
    counters: &Counters,
    out: Out,
) -> bool {
    let Some(client) = client else { return false };
    let qos = if out.data && data_qos == 1 { QoS::AtLeastOnce } else { QoS::AtMostOnce };
    match client.try_publish(out.topic, qos, false, out.payload) {
        Ok(()) => {
            *queued += 1;
            Counters::add(&counters.metrics_sent, out.metrics as u64);
            true
        }
        Err(_) => false,
    }
}
