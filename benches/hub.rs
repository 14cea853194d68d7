//! The fleet hub at fleet size, in one run against a local Mosquitto (issue 35): one
//! generator (this process) simulating 100 edge nodes of 10 devices of 100 tags, every tag
//! changing at 1 Hz, each edge node its own MQTT connection with its own will (NDEATH); the
//! real `fieldgate hub` binary subscribed. Figures printed, not asserted.
//!
//! Reported: the time from the hub's start to the whole fleet online with values (it asks
//! each edge node it does not know for a rebirth, paced), metrics/s applied against
//! offered over a 20 s window and what was dropped, end-to-end lag (a probe value sent
//! through one edge node's own connection until the hub answers it), the hub's CPU share
//! and RSS, history bytes written per second, `get_sensor_reading` at the hub next to the
//! same call at an edge (`fieldgate demo`, same run), and `list_sensors` with `text` over the
//! fleet. Not yet: the variants (an edge killed, a broker outage, dropped messages).
//!
//! `HUB_BENCH_LOG=FILE` keeps what the hub and the demo print (their log at `info`).
//!
//! Targets: 100,000 metrics/s applied, none dropped; CPU ≤ 50 % of one core; RSS ≤ 300 MB;
//! fleet online < 30 s with ≤ 10 rebirth requests/s; a reading ≤ 1.5x the edge's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fieldgate::spb::payload::{Metric, Payload, Value};
use rumqttc::{AsyncClient, Event, Incoming, LastWill, MqttOptions, QoS};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

#[path = "common/proc.rs"]
mod proc;

const EDGES: usize = 100;
const DEVICES: usize = 10;
const TAGS: usize = 100;
const WINDOW: Duration = Duration::from_secs(20);
const DOUBLE: u32 = 10;
const INT64: u32 = 4;
const BOOLEAN: u32 = 11;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn sensor(edge: usize, device: usize, tag: usize) -> String {
    format!("E{edge:03}_D{device}_{:03}", tag + 1)
}

/// One edge node of the generator: its connection, and what its publisher is to do.
struct Edge {
    n: usize,
    client: AsyncClient,
    /// Births to send (on connect, on the hub's rebirth request).
    birth: AtomicBool,
    connected: AtomicBool,
    /// A probe value to send on device 0's probe tag, at once, in its seq.
    probe: tokio::sync::mpsc::UnboundedSender<f64>,
}

#[derive(Default)]
struct Offered {
    metrics: AtomicU64,
    births: AtomicU64,
}

fn node_topic(kind: &str, edge: usize) -> String {
    format!("spBv1.0/G/{kind}/e{edge:03}")
}

fn device_topic(kind: &str, edge: usize, device: usize) -> String {
    format!("spBv1.0/G/{kind}/e{edge:03}/e{edge:03}-d{device}")
}

fn value(edge: usize, device: usize, tag: usize, t: u64) -> f64 {
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

fn births(edge: usize, seq: &mut u8) -> Vec<(String, Vec<u8>)> {
    let t = now_ms();
    let mut out = Vec::new();
    let mut nbirth = Payload { timestamp: Some(t), seq: Some(0), ..Default::default() };
    nbirth.metrics.push(Metric::new(Some("bdSeq"), None, INT64, Some(Value::Long(0))));
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

/// Runs one edge node: its connection's events and, each second, a DDATA per device.
fn spawn_edge(rt: &tokio::runtime::Runtime, port: u16, n: usize, offered: Arc<Offered>) -> Arc<Edge> {
    let mut o = MqttOptions::new(format!("gen-e{n:03}"), "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(true);
    o.set_max_packet_size(1 << 20, 1 << 20);
    let mut death = Payload { timestamp: Some(now_ms()), ..Default::default() };
    death.metrics.push(Metric::new(Some("bdSeq"), None, INT64, Some(Value::Long(0))));
    o.set_last_will(LastWill::new(node_topic("NDEATH", n), death.encode_to_bytes(), QoS::AtLeastOnce, false));
    let (client, mut events) = AsyncClient::new(o, 64);
    // Sent when published, as fieldgate's own edge nodes do.
    let mut network = events.network_options();
    network.set_tcp_nodelay(true);
    events.set_network_options(network);
    let (probe, mut probes) = tokio::sync::mpsc::unbounded_channel();
    let edge =
        Arc::new(Edge { n, client, birth: AtomicBool::new(false), connected: AtomicBool::new(false), probe });
    let e = edge.clone();
    rt.spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Incoming::ConnAck(_))) => {
                    let _ = e.client.try_subscribe(node_topic("NCMD", e.n), QoS::AtMostOnce);
                    e.birth.store(true, Ordering::SeqCst);
                    e.connected.store(true, Ordering::SeqCst);
                }
                Ok(Event::Incoming(Incoming::Publish(p))) => {
                    let asks = Payload::decode_bytes(&p.payload).is_ok_and(|pl| {
                        pl.metrics.iter().any(|m| {
                            m.name.as_deref() == Some("Node Control/Rebirth")
                                && m.value == Some(Value::Boolean(true))
                        })
                    });
                    if asks {
                        e.birth.store(true, Ordering::SeqCst);
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    let e = edge.clone();
    rt.spawn(async move {
        let mut seq = 0u8;
        // Each edge node ticks at its own phase within the second.
        tokio::time::sleep(Duration::from_millis((n * 10) as u64)).await;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let probe = tokio::select! {
                _ = tick.tick() => None,
                Some(v) = probes.recv() => Some(v),
            };
            if !e.connected.load(Ordering::SeqCst) {
                continue;
            }
            if let Some(v) = probe {
                seq = seq.wrapping_add(1);
                let t = now_ms();
                let mut p = Payload { timestamp: Some(t), seq: Some(u64::from(seq)), ..Default::default() };
                let mut m = Metric::new(None, Some(alias(0, TAGS)), DOUBLE, Some(Value::Double(v)));
                m.timestamp = Some(t);
                p.metrics.push(m);
                let _ = e
                    .client
                    .publish(device_topic("DDATA", n, 0), QoS::AtMostOnce, false, p.encode_to_bytes())
                    .await;
                continue;
            }
            if e.birth.swap(false, Ordering::SeqCst) {
                for (topic, bytes) in births(n, &mut seq) {
                    let _ = e.client.publish(topic, QoS::AtMostOnce, false, bytes).await;
                }
                offered.births.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let t = now_ms();
            for d in 0..DEVICES {
                seq = seq.wrapping_add(1);
                let mut p = Payload { timestamp: Some(t), seq: Some(u64::from(seq)), ..Default::default() };
                for tag in 0..TAGS {
                    let mut m = Metric::new(
                        None,
                        Some(alias(d, tag)),
                        DOUBLE,
                        Some(Value::Double(value(n, d, tag, t))),
                    );
                    m.timestamp = Some(t);
                    p.metrics.push(m);
                }
                if e.client
                    .publish(device_topic("DDATA", n, d), QoS::AtMostOnce, false, p.encode_to_bytes())
                    .await
                    .is_ok()
                {
                    offered.metrics.fetch_add(TAGS as u64, Ordering::Relaxed);
                }
            }
        }
    });
    edge
}

/// `fieldgate <args>` on a free port: the process and its address.
async fn spawn(
    args: &[&str],
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(args)
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data)
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_LOG", if std::env::var("HUB_BENCH_LOG").is_ok() { "info" } else { "warn" })
        .env("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("fieldgate starts");
    // `fieldgate hub` says where it listens on stderr, `fieldgate demo` on stdout.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let out = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let err = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    for mut lines in [Box::new(out) as Box<dyn LineSource>, Box::new(err)] {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(l) = lines.next().await {
                let _ = tx.send(l);
            }
        });
    }
    let addr = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("fieldgate listens within 60 s")
            .expect("fieldgate exited before listening");
        let said =
            line.split("listening on http://").nth(1).or_else(|| line.split("HTTP API   http://").nth(1));
        if let Some(rest) = said {
            break rest.split(['/', ' ']).next().unwrap_or("").to_string();
        }
    };
    // HUB_BENCH_LOG=FILE keeps what the processes said (with FIELDGATE_LOG=info there).
    let mut keep = std::env::var("HUB_BENCH_LOG")
        .ok()
        .and_then(|f| std::fs::OpenOptions::new().create(true).append(true).open(f).ok());
    tokio::spawn(async move {
        while let Some(l) = rx.recv().await {
            if let Some(f) = &mut keep {
                use std::io::Write;
                let _ = writeln!(f, "{l}");
            }
        }
    });
    (child, addr)
}

/// Lines of a child's output.
trait LineSource: Send {
    fn next(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + '_>>;
}

impl<R: tokio::io::AsyncBufRead + Unpin + Send> LineSource for tokio::io::Lines<R> {
    fn next(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async move { self.next_line().await.ok().flatten() })
    }
}

async fn metric(http: &reqwest::Client, addr: &str, name: &str) -> f64 {
    let text = match http.get(format!("http://{addr}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

async fn call(http: &reqwest::Client, addr: &str, tool: &str, args: serde_json::Value) -> serde_json::Value {
    let res = http
        .post(format!("http://{addr}/v1/tools/{tool}"))
        .header("content-type", "application/json")
        .body(args.to_string())
        .send()
        .await
        .expect("answers");
    serde_json::from_slice(&res.bytes().await.expect("a body")).expect("an envelope")
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    v.get(((v.len().max(1) - 1) as f64 * p) as usize).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn main() {
    fieldgate::tls::install_crypto_provider();
    let gen_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("gen")
        .enable_all()
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run(&gen_rt));
}

async fn run(gen_rt: &tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let conf = dir.path().join("mosquitto.conf");
    let text = format!(
        "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\nmax_inflight_messages 0\nset_tcp_nodelay true\n"
    );
    std::fs::write(&conf, text).unwrap();
    let mut broker = tokio::process::Command::new("/usr/sbin/mosquitto")
        .arg("-c")
        .arg(&conf)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mosquitto (scripts/test-deps installs it)");
    let until = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < until, "Mosquitto listens within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The fleet, publishing before the hub is there.
    let offered = Arc::new(Offered::default());
    let edges: Vec<Arc<Edge>> = (0..EDGES).map(|n| spawn_edge(gen_rt, port, n, offered.clone())).collect();
    let until = Instant::now() + Duration::from_secs(30);
    while offered.births.load(Ordering::Relaxed) < EDGES as u64 {
        assert!(Instant::now() < until, "every edge node connected and born within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let hub_data = dir.path().join("hub");
    let brokers = format!("[\"mqtt://127.0.0.1:{port}\"]");
    let started = Instant::now();
    let (hub, hub_addr) = spawn(
        &["hub"],
        &hub_data,
        &[("FIELDGATE_HUB_BROKERS", &brokers), ("FIELDGATE_HUB_HOST_ID", "bench-hub")],
    )
    .await;
    let hub_pid = hub.id().expect("running");
    let sensors = (EDGES * (DEVICES * TAGS + 1)) as f64;
    loop {
        let online = metric(&http, &hub_addr, "fieldgate_hub_edge_nodes_online").await;
        let known = metric(&http, &hub_addr, "fieldgate_hub_sensors").await;
        if online == EDGES as f64 && known == sensors {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the fleet online within 120 s ({online} edges, {known} sensors)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let online_after = started.elapsed();
    let rebirths = metric(&http, &hub_addr, "fieldgate_hub_rebirth_requests_total").await;

    // Steady state.
    let history = || std::fs::metadata(hub_data.join("history.redb")).map_or(0, |m| m.len());
    let (v0, d0, g0) = (
        metric(&http, &hub_addr, "fieldgate_hub_values_total").await,
        metric(&http, &hub_addr, "fieldgate_hub_messages_dropped_total").await,
        metric(&http, &hub_addr, "fieldgate_hub_seq_gaps_total").await,
    );
    let (o0, c0, h0, t0) = (
        offered.metrics.load(Ordering::Relaxed),
        proc::cpu_seconds(&std::path::Path::new("/proc").join(hub_pid.to_string()).join("stat")),
        history(),
        Instant::now(),
    );
    // Tool latency while ingesting: readings of sensors across the fleet.
    let mut at_hub = Vec::new();
    let mut refused = std::collections::BTreeMap::<String, u32>::new();
    let mut k = 0usize;
    while t0.elapsed() < WINDOW {
        let id = sensor(k % EDGES, (k / EDGES) % DEVICES, (k * 7) % TAGS);
        k += 1;
        let t = Instant::now();
        let e = call(&http, &hub_addr, "get_sensor_reading", json!({"sensor_id": id})).await;
        at_hub.push(t.elapsed());
        if e["ok"] != true {
            *refused.entry(e["error"]["code"].as_str().unwrap_or("?").to_string()).or_insert(0) += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wall = t0.elapsed().as_secs_f64();

    let applied = (metric(&http, &hub_addr, "fieldgate_hub_values_total").await - v0) / wall;
    let dropped = metric(&http, &hub_addr, "fieldgate_hub_messages_dropped_total").await - d0;
    let gaps = metric(&http, &hub_addr, "fieldgate_hub_seq_gaps_total").await - g0;
    let sent = (offered.metrics.load(Ordering::Relaxed) - o0) as f64 / wall;
    let cpu = (proc::cpu_seconds(&std::path::Path::new("/proc").join(hub_pid.to_string()).join("stat")) - c0)
        / wall
        * 100.0;
    let history_rate = (history().saturating_sub(h0)) as f64 / wall;
    let rss = proc::rss_mb(&hub_pid.to_string());

    // Lag: a probe value through edge node 0's own connection (its seq goes on), until the
    // hub answers it.
    let probe = sensor(0, 0, TAGS);
    let mut lags = Vec::new();
    for k in 0..50u64 {
        let v = 1_000_000.0 + k as f64;
        let sent = Instant::now();
        edges[0].probe.send(v).expect("edge node 0 runs");
        loop {
            let e = call(&http, &hub_addr, "get_sensor_reading", json!({"sensor_id": probe})).await;
            if e["data"]["value"].as_f64() == Some(v) {
                lags.push(sent.elapsed());
                break;
            }
            assert!(sent.elapsed() < Duration::from_secs(10), "probe {k} answered within 10 s: {e}");
        }
    }

    let mut text = Vec::new();
    for q in ["e042_d3_0", "E007 D9", "e099_d0_101"] {
        let t = Instant::now();
        let e = call(&http, &hub_addr, "list_sensors", json!({"text": q, "limit": 50})).await;
        let first = t.elapsed();
        assert_eq!(e["ok"], true, "{e}");
        for _ in 0..20 {
            let t = Instant::now();
            call(&http, &hub_addr, "list_sensors", json!({"text": q, "limit": 50})).await;
            text.push(t.elapsed());
        }
        let _ = first;
    }

    // The same call at an edge: `fieldgate demo` (its simulator in the process).
    let demo_data = dir.path().join("demo");
    let (mut demo, demo_addr) = spawn(&["demo"], &demo_data, &[]).await;
    let mut at_edge = Vec::new();
    for k in 0..300 {
        let id = format!("A_LINE1_00{}", 1 + k % 5);
        let t = Instant::now();
        let e = call(&http, &demo_addr, "get_sensor_reading", json!({"sensor_id": id})).await;
        at_edge.push(t.elapsed());
        assert_eq!(e["ok"], true, "{e}");
    }
    let _ = demo.start_kill();

    let readings = at_hub.len();
    let hub_p50 = pct(&mut at_hub, 0.5);
    let edge_p50 = pct(&mut at_edge, 0.5);
    println!(
        "fleet hub (release build): {EDGES} edge nodes x {DEVICES} devices x {TAGS} tags at 1 Hz, one Mosquitto"
    );
    println!(
        "fleet online with values after the hub started: {:.1} s, {rebirths} rebirth requests ({:.1}/s)   target < 30 s, <= 10/s",
        online_after.as_secs_f64(),
        rebirths / online_after.as_secs_f64()
    );
    println!(
        "metrics applied: {applied:.0}/s of {sent:.0}/s offered; {dropped} messages dropped, {gaps} seq gaps in {wall:.0} s   target 100,000/s, 0 dropped"
    );
    println!("hub CPU: {cpu:.0} % of one core; RSS {rss:.0} MB   targets <= 50 %, <= 300 MB");
    println!("history written: {:.0} KB/s", history_rate / 1024.0);
    println!(
        "end-to-end lag (probe through an edge node's connection): p50 {:.2} ms, p99 {:.2} ms",
        pct(&mut lags, 0.5),
        pct(&mut lags, 0.99)
    );
    println!(
        "get_sensor_reading while ingesting: hub p50 {hub_p50:.3} ms (p99 {:.3}); an edge (fieldgate demo) p50 {edge_p50:.3} ms: {:.2}x   target <= 1.5x",
        pct(&mut at_hub, 0.99),
        hub_p50 / edge_p50
    );
    println!("  readings at the hub not answered with a value: {refused:?} of {readings}");
    println!(
        "  rebirth requests by the end: {}",
        metric(&http, &hub_addr, "fieldgate_hub_rebirth_requests_total").await
    );
    println!("list_sensors text over {sensors} sensors at the hub: p50 {:.3} ms", pct(&mut text, 0.5));
    drop(hub);
    let _ = broker.start_kill();
}
