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
//! fleet. Then the variants (`common/hub_variants.rs`): one message in 1,000 not sent, an
//! edge node killed, the broker stopped for a minute.
//!
//! `HUB_BENCH_LOG=FILE` keeps what the hub and the demo print (their log at `info`);
//! `HUB_BENCH_WINDOW_S` sets the steady window (default 20), `HUB_BENCH_OUTAGE_S` the
//! broker's outage (default 60), `HUB_BENCH_WRAP` a profiler to run the hub under (heaptrack sees
//! only malloc: `cargo bench --bench hub --features system-alloc`);
//! `HUB_BENCH_VARIANTS=0` stops after the steady window.
//!
//! Targets: 100,000 metrics/s applied, none dropped; CPU ≤ 50 % of one core; RSS ≤ 300 MB;
//! fleet online < 30 s with ≤ 10 rebirth requests/s; a reading ≤ 1.5x the edge's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncBufReadExt;

#[path = "common/fleet_gen.rs"]
mod fleet_gen;
#[path = "common/proc.rs"]
mod proc;

#[path = "common/hub_variants.rs"]
mod variants;

use fleet_gen::{DEVICES, Edge, Offered, TAGS, sensor, spawn_edge};
use variants::{Hub, broker_outage, dropped_messages, edge_killed};

const EDGES: usize = 100;

/// The steady window (`HUB_BENCH_WINDOW_S`, default 20 s).
fn window() -> Duration {
    Duration::from_secs(std::env::var("HUB_BENCH_WINDOW_S").ok().and_then(|v| v.parse().ok()).unwrap_or(20))
}

/// `fieldgate <args>` on a free port: the process and its address.
async fn spawn(
    args: &[&str],
    data: &std::path::Path,
    env: &[(&str, &str)],
) -> (tokio::process::Child, String) {
    // HUB_BENCH_WRAP="heaptrack -o FILE" runs the hub under a profiler (its PID is then the
    // profiler's: CPU and RSS figures are the pair's).
    let wrap = std::env::var("HUB_BENCH_WRAP").ok().filter(|_| args.first() == Some(&"hub"));
    let mut words: Vec<String> = wrap.iter().flat_map(|w| w.split_whitespace().map(str::to_string)).collect();
    words.push(env!("CARGO_BIN_EXE_fieldgate").to_string());
    words.extend(args.iter().map(|a| a.to_string()));
    let mut child = tokio::process::Command::new(&words[0])
        .args(&words[1..])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
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
    // HUB_BENCH_BROKER_LOG=FILE keeps Mosquitto's warnings (a subscriber it drops for).
    let text = match std::env::var("HUB_BENCH_BROKER_LOG") {
        Ok(f) => format!("{text}log_dest file {f}\nlog_type error\nlog_type warning\nlog_type notice\n"),
        Err(_) => text,
    };
    std::fs::write(&conf, text).unwrap();
    let mut broker = mosquitto(&conf, port).await;

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
    let (mut hub_child, hub_addr) = spawn(
        &["hub"],
        &hub_data,
        &[("FIELDGATE_HUB_BROKERS", &brokers), ("FIELDGATE_HUB_HOST_ID", "bench-hub")],
    )
    .await;
    let hub_pid = hub_child.id().expect("running");
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

    // An edge to compare a reading with: `fieldgate demo` (its simulator in the process).
    let demo_data = dir.path().join("demo");
    let (mut demo, demo_addr) = spawn(&["demo"], &demo_data, &[]).await;
    call(&http, &demo_addr, "get_sensor_reading", json!({"sensor_id": "A_LINE1_001"})).await;

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
    // Tool latency while ingesting: readings of sensors across the fleet at the hub, each
    // followed by the same call at the edge, paced alike (an idle process wakes slower than
    // a busy one: both get the same pauses).
    let mut at_hub = Vec::new();
    let mut at_edge = Vec::new();
    let mut rss_series = vec![proc::rss_mb(&hub_pid.to_string())];
    let mut refused = std::collections::BTreeMap::<String, u32>::new();
    let mut k = 0usize;
    while t0.elapsed() < window() {
        let id = sensor(k % EDGES, (k / EDGES) % DEVICES, (k * 7) % TAGS);
        let t = Instant::now();
        let e = call(&http, &hub_addr, "get_sensor_reading", json!({"sensor_id": id})).await;
        at_hub.push(t.elapsed());
        if e["ok"] != true {
            *refused.entry(e["error"]["code"].as_str().unwrap_or("?").to_string()).or_insert(0) += 1;
        }
        let id = format!("A_LINE1_00{}", 1 + k % 5);
        let t = Instant::now();
        let e = call(&http, &demo_addr, "get_sensor_reading", json!({"sensor_id": id})).await;
        at_edge.push(t.elapsed());
        assert_eq!(e["ok"], true, "{e}");
        k += 1;
        if t0.elapsed() >= Duration::from_secs(10 * rss_series.len() as u64) {
            rss_series.push(proc::rss_mb(&hub_pid.to_string()));
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
    let mut firsts = Vec::new();
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
        firsts.push(first);
    }

    // Back to back, no pause: the hub and the edge each kept busy by the calls alone.
    let mut burst_hub = Vec::new();
    let mut burst_edge = Vec::new();
    for k in 0..300 {
        let id = sensor(k % EDGES, (k / EDGES) % DEVICES, (k * 7) % TAGS);
        let t = Instant::now();
        call(&http, &hub_addr, "get_sensor_reading", json!({"sensor_id": id})).await;
        burst_hub.push(t.elapsed());
    }
    for k in 0..300 {
        let id = format!("A_LINE1_00{}", 1 + k % 5);
        let t = Instant::now();
        call(&http, &demo_addr, "get_sensor_reading", json!({"sensor_id": id})).await;
        burst_edge.push(t.elapsed());
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
        "get_sensor_reading while ingesting, every 20 ms: hub p50 {hub_p50:.3} ms (p99 {:.3}); an edge (fieldgate demo) p50 {edge_p50:.3} ms (p99 {:.3}): {:.2}x   target <= 1.5x",
        pct(&mut at_hub, 0.99),
        pct(&mut at_edge, 0.99),
        hub_p50 / edge_p50
    );
    let (bh, be) = (pct(&mut burst_hub, 0.5), pct(&mut burst_edge, 0.5));
    println!(
        "get_sensor_reading back to back (300 calls each): hub p50 {bh:.3} ms; the edge p50 {be:.3} ms: {:.2}x",
        bh / be
    );
    println!("  readings at the hub not answered with a value: {refused:?} of {readings}");
    println!(
        "  rebirth requests by the end: {}",
        metric(&http, &hub_addr, "fieldgate_hub_rebirth_requests_total").await
    );
    println!(
        "list_sensors text over {sensors} sensors at the hub: p50 {:.3} ms; each word's first query {:.3} ms at most (the index built before any query asked)",
        pct(&mut text, 0.5),
        pct(&mut firsts, 1.0)
    );
    println!("RSS after the steady window: {:.0} MB", proc::rss_mb(&hub_pid.to_string()));
    let series: Vec<String> = rss_series.iter().map(|r| format!("{r:.0}")).collect();
    println!("  RSS every 10 s of the window (MB): {}", series.join(", "));
    if std::env::var("HUB_BENCH_VARIANTS").is_ok_and(|v| v == "0") {
        println!("variants skipped (HUB_BENCH_VARIANTS=0)");
    } else {
        let hub = Hub { http: &http, addr: &hub_addr, generator: gen_rt.handle() };
        dropped_messages(&hub, &edges, &offered).await;
        edge_killed(&hub, &edges).await;
        broker = broker_outage(&hub, &edges, &offered, broker, &conf, port).await;
        println!("hub RSS at the end: {:.0} MB", proc::rss_mb(&hub_pid.to_string()));
    }
    if std::env::var("HUB_BENCH_WRAP").is_ok() {
        // The profiler writes its file when the hub stops by itself.
        let _ = std::process::Command::new("pkill")
            .args(["-TERM", "-f", concat!(env!("CARGO_BIN_EXE_fieldgate"), " hub")])
            .status();
        let _ = tokio::time::timeout(Duration::from_secs(120), hub_child.wait()).await;
    }
    let _ = broker.start_kill();
}

/// Mosquitto with `conf`, listening on `port`.
async fn mosquitto(conf: &std::path::Path, port: u16) -> tokio::process::Child {
    let broker = tokio::process::Command::new("/usr/sbin/mosquitto")
        .arg("-c")
        .arg(conf)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("mosquitto (scripts/test-deps installs it)");
    let until = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < until, "Mosquitto listens within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker
}
