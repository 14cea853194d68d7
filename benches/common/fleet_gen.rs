//! The hub bench's fleet: edge nodes of 10 devices of 100 tags, every tag changing at 1 Hz,
//! each edge node its own MQTT connection with its own will (NDEATH, with the bdSeq of its
//! NBIRTH). An edge node keeps the seconds it could not publish (store-and-forward) and sends
//! them after its next births as historical DDATA, as a fieldgate edge drains its buffer.
//! It can drop chosen DDATA messages (its seq goes on: the hub sees a gap), be killed (its
//! connection closed without DISCONNECT: the broker publishes its will, as after `kill -9`)
//! and start again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fieldgate::spb::payload::{Metric, Payload, Value};
use rumqttc::{AsyncClient, Event, Incoming, LastWill, MqttOptions, QoS};

pub const DEVICES: usize = 10;
pub const TAGS: usize = 100;
const DOUBLE: u32 = 10;
const INT64: u32 = 4;
const BOOLEAN: u32 = 11;

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn sensor(edge: usize, device: usize, tag: usize) -> String {
    format!("E{edge:03}_D{device}_{:03}", tag + 1)
}

fn node_topic(kind: &str, edge: usize) -> String {
    format!("spBv1.0/G/{kind}/e{edge:03}")
}

fn device_topic(kind: &str, edge: usize, device: usize) -> String {
    format!("spBv1.0/G/{kind}/e{edge:03}/e{edge:03}-d{device}")
}

pub fn value(edge: usize, device: usize, tag: usize, t: u64) -> f64 {
    ((t as f64 / 1000.0) + (edge * 1000 + device * 100 + tag) as f64).sin() * 100.0
}

/// A device's tags, plus on device 0 of each edge node the probe (`_101`), changed only by
/// probes.
fn tags(device: usize) -> usize {
    if device == 0 { TAGS + 1 } else { TAGS }
}

/// A tag's alias: unique across its edge node, as Sparkplug requires.
fn alias(device: usize, tag: usize) -> u64 {
    (device * 1000 + tag) as u64
}

/// What the whole fleet offered, and what it was told to do.
#[derive(Default)]
pub struct Offered {
    pub metrics: AtomicU64,
    pub births: AtomicU64,
    /// Historical metrics sent (seconds kept while the broker was away).
    pub historical: AtomicU64,
    /// One DDATA message in this many is not sent (0: none), chosen by a hash of a count.
    pub drop_one_in: AtomicU64,
    sent_messages: AtomicU64,
    /// Edge nodes publish only while this host's STATE says online (as fieldgate edges with
    /// a `primary_host_id` do); before it is set, whenever connected.
    pub primary_host: Mutex<Option<String>>,
}

/// One edge node of the generator.
pub struct Edge {
    pub n: usize,
    port: u16,
    client: Mutex<AsyncClient>,
    events: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Births to send (on connect, on the hub's rebirth request).
    birth: AtomicBool,
    pub connected: AtomicBool,
    /// The primary host's last STATE said online.
    host_online: AtomicBool,
    bd_seq: AtomicU64,
    /// A probe value to send on device 0's probe tag, at once, in its seq.
    pub probe: tokio::sync::mpsc::UnboundedSender<f64>,
    /// Ticks (ms) not published while disconnected: sent as historical after the births.
    missed: Mutex<Vec<u64>>,
    /// DDATA messages dropped on purpose, and rebirth requests (NCMD) received.
    pub dropped: AtomicU64,
    pub rebirths_asked: AtomicU64,
    offered: Arc<Offered>,
}

impl Edge {
    fn client(&self) -> AsyncClient {
        self.client.lock().expect("not poisoned").clone()
    }

    /// Closes the connection without DISCONNECT: the broker publishes the will.
    pub fn kill(&self) {
        self.connected.store(false, Ordering::SeqCst);
        if let Some(h) = self.events.lock().expect("not poisoned").take() {
            h.abort();
        }
    }

    /// Connects again, with the next bdSeq in its will and births.
    pub fn restart(self: &Arc<Self>, rt: &tokio::runtime::Handle) {
        self.kill();
        self.bd_seq.fetch_add(1, Ordering::SeqCst);
        connect(self, rt);
    }
}

fn births(edge: usize, bd_seq: u64, seq: &mut u8) -> Vec<(String, Vec<u8>)> {
    let t = now_ms();
    let mut out = Vec::new();
    let mut nbirth = Payload { timestamp: Some(t), seq: Some(0), ..Default::default() };
    nbirth.metrics.push(Metric::new(Some("bdSeq"), None, INT64, Some(Value::Long(bd_seq))));
    nbirth.metrics.push(Metric::new(
        Some("Node Control/Rebirth"),
        None,
        BOOLEAN,
        Some(Value::Boolean(false)),
    ));
    out.push((node_topic("NBIRTH", edge), nbirth.encode_to_bytes()));
    *seq = 0;
    for d in 0..DEVICES {
        *seq = seq.wrapping_add(1);
        let mut p = Payload { timestamp: Some(t), seq: Some(u64::from(*seq)), ..Default::default() };
        for tag in 0..tags(d) {
            let mut m = Metric::new(
                Some(&sensor(edge, d, tag)),
                Some(alias(d, tag)),
                DOUBLE,
                Some(Value::Double(value(edge, d, tag, t))),
            );
            m.timestamp = Some(t);
            p.metrics.push(m);
        }
        out.push((device_topic("DBIRTH", edge, d), p.encode_to_bytes()));
    }
    out
}

/// One device's DDATA at `t`: every tag, historical or not.
fn ddata(edge: usize, device: usize, t: u64, seq: u8, historical: bool) -> Vec<u8> {
    let mut p = Payload { timestamp: Some(t), seq: Some(u64::from(seq)), ..Default::default() };
    for tag in 0..TAGS {
        let mut m = Metric::new(
            None,
            Some(alias(device, tag)),
            DOUBLE,
            Some(Value::Double(value(edge, device, tag, t))),
        );
        m.timestamp = Some(t);
        if historical {
            m.is_historical = Some(true);
        }
        p.metrics.push(m);
    }
    p.encode_to_bytes()
}

/// splitmix64: which messages are dropped, spread over edges and devices.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The connection of `edge`: a new client and its event loop.
fn connect(edge: &Arc<Edge>, rt: &tokio::runtime::Handle) {
    let n = edge.n;
    let mut o = MqttOptions::new(format!("gen-e{n:03}"), "127.0.0.1", edge.port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(true);
    o.set_max_packet_size(1 << 20, 1 << 20);
    let mut death = Payload { timestamp: Some(now_ms()), ..Default::default() };
    let bd_seq = edge.bd_seq.load(Ordering::SeqCst);
    death.metrics.push(Metric::new(Some("bdSeq"), None, INT64, Some(Value::Long(bd_seq))));
    o.set_last_will(LastWill::new(node_topic("NDEATH", n), death.encode_to_bytes(), QoS::AtLeastOnce, false));
    let (client, mut events) = AsyncClient::new(o, 64);
    // Sent when published, as fieldgate's own edge nodes do.
    let mut network = events.network_options();
    network.set_tcp_nodelay(true);
    events.set_network_options(network);
    *edge.client.lock().expect("not poisoned") = client;
    let e = edge.clone();
    let task = rt.spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Incoming::ConnAck(_))) => {
                    let _ = e.client().try_subscribe(node_topic("NCMD", e.n), QoS::AtMostOnce);
                    let host = e.offered.primary_host.lock().expect("not poisoned").clone();
                    if let Some(h) = host {
                        e.host_online.store(false, Ordering::SeqCst);
                        let _ = e.client().try_subscribe(format!("spBv1.0/STATE/{h}"), QoS::AtLeastOnce);
                    }
                    e.birth.store(true, Ordering::SeqCst);
                    e.connected.store(true, Ordering::SeqCst);
                }
                Ok(Event::Incoming(Incoming::Publish(p))) if p.topic.starts_with("spBv1.0/STATE/") => {
                    let online = serde_json::from_slice::<serde_json::Value>(&p.payload)
                        .ok()
                        .and_then(|v| v.get("online").and_then(serde_json::Value::as_bool))
                        .unwrap_or(false);
                    // A host that comes online gets births (and what was kept).
                    if online && !e.host_online.swap(true, Ordering::SeqCst) {
                        e.birth.store(true, Ordering::SeqCst);
                    }
                    e.host_online.store(online, Ordering::SeqCst);
                }
                Ok(Event::Incoming(Incoming::Publish(p))) => {
                    let asks = Payload::decode_bytes(&p.payload).is_ok_and(|pl| {
                        pl.metrics.iter().any(|m| {
                            m.name.as_deref() == Some("Node Control/Rebirth")
                                && m.value == Some(Value::Boolean(true))
                        })
                    });
                    if asks {
                        e.rebirths_asked.fetch_add(1, Ordering::Relaxed);
                        e.birth.store(true, Ordering::SeqCst);
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    e.connected.store(false, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    *edge.events.lock().expect("not poisoned") = Some(task);
}

enum Step {
    Tick,
    Probe(f64),
    Replay,
}

/// Starts edge node `n`: its connection and, each second, a DDATA per device.
pub fn spawn_edge(rt: &tokio::runtime::Runtime, port: u16, n: usize, offered: Arc<Offered>) -> Arc<Edge> {
    let (probe, mut probes) = tokio::sync::mpsc::unbounded_channel();
    let edge = Arc::new(Edge {
        n,
        port,
        client: Mutex::new(AsyncClient::new(MqttOptions::new("unused", "127.0.0.1", port), 1).0),
        events: Mutex::new(None),
        birth: AtomicBool::new(false),
        connected: AtomicBool::new(false),
        host_online: AtomicBool::new(false),
        bd_seq: AtomicU64::new(0),
        probe,
        missed: Mutex::new(Vec::new()),
        dropped: AtomicU64::new(0),
        rebirths_asked: AtomicU64::new(0),
        offered: offered.clone(),
    });
    connect(&edge, rt.handle());
    let e = edge.clone();
    rt.spawn(async move {
        let mut seq = 0u8;
        // Each edge node ticks at its own phase within the second.
        tokio::time::sleep(Duration::from_millis((n * 10) as u64)).await;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Seconds kept while away, oldest first, sent between live seconds.
        let mut backlog = std::collections::VecDeque::new();
        loop {
            let step = tokio::select! {
                biased;
                _ = tick.tick() => Step::Tick,
                Some(v) = probes.recv() => Step::Probe(v),
                _ = std::future::ready(()), if !backlog.is_empty() => Step::Replay,
            };
            let host_away = e.offered.primary_host.lock().expect("not poisoned").is_some()
                && !e.host_online.load(Ordering::SeqCst);
            if !e.connected.load(Ordering::SeqCst) || host_away {
                if let Step::Tick = step {
                    e.missed.lock().expect("not poisoned").push(now_ms());
                }
                continue;
            }
            let client = e.client();
            if e.birth.swap(false, Ordering::SeqCst) {
                for (topic, bytes) in births(n, e.bd_seq.load(Ordering::SeqCst), &mut seq) {
                    let _ = client.publish(topic, QoS::AtMostOnce, false, bytes).await;
                }
                offered.births.fetch_add(1, Ordering::Relaxed);
                backlog.extend(std::mem::take(&mut *e.missed.lock().expect("not poisoned")));
            }
            match step {
                Step::Tick => {}
                Step::Probe(v) => {
                    seq = seq.wrapping_add(1);
                    let t = now_ms();
                    let mut p =
                        Payload { timestamp: Some(t), seq: Some(u64::from(seq)), ..Default::default() };
                    let mut m = Metric::new(None, Some(alias(0, TAGS)), DOUBLE, Some(Value::Double(v)));
                    m.timestamp = Some(t);
                    p.metrics.push(m);
                    let bytes = p.encode_to_bytes();
                    let _ = client.publish(device_topic("DDATA", n, 0), QoS::AtMostOnce, false, bytes).await;
                    continue;
                }
                Step::Replay => {
                    if let Some(t) = backlog.pop_front() {
                        for d in 0..DEVICES {
                            seq = seq.wrapping_add(1);
                            let bytes = ddata(n, d, t, seq, true);
                            let topic = device_topic("DDATA", n, d);
                            if client.publish(topic, QoS::AtMostOnce, false, bytes).await.is_ok() {
                                offered.historical.fetch_add(TAGS as u64, Ordering::Relaxed);
                            }
                        }
                    }
                    continue;
                }
            }
            let t = now_ms();
            for d in 0..DEVICES {
                seq = seq.wrapping_add(1);
                let k = offered.sent_messages.fetch_add(1, Ordering::Relaxed);
                let every = offered.drop_one_in.load(Ordering::Relaxed);
                if every > 0 && mix(k).is_multiple_of(every) {
                    e.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let bytes = ddata(n, d, t, seq, false);
                if client.publish(device_topic("DDATA", n, d), QoS::AtMostOnce, false, bytes).await.is_ok() {
                    offered.metrics.fetch_add(TAGS as u64, Ordering::Relaxed);
                }
            }
        }
    });
    edge
}
