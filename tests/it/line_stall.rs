//! Stalls the simulator's own faults do not reach: an OPC UA server that stops answering
//! one session while it serves a new one (a TCP peer in front of the simulator freezes the
//! connections it holds), and a serial RTU line that must stay quiet after a timeout.
//! Counts and outcomes, and for the serial line that a queued call is not failed before
//! its deadline (a lower bound, which load cannot break).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::{ErrorCode, ToolService};
use fieldgate_sim::{Faults, Scenario, Wave};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::support::*;

/// A TCP peer that forwards to `upstream` until told to freeze: then every connection it
/// holds stops passing bytes both ways (kept open, as a hung server's socket is), while
/// connections opened afterwards are forwarded normally. Killed, it closes every
/// connection and closes new ones at once (a dead server) until revived.
struct FreezingPeer {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicU64>,
    /// Connections numbered below this are frozen.
    frozen_below: watch::Sender<u64>,
    dead: watch::Sender<bool>,
    _tasks: JoinSet<()>,
}

impl FreezingPeer {
    async fn start(listen: std::net::SocketAddr, upstream: std::net::SocketAddr) -> FreezingPeer {
        let listener = TcpListener::bind(listen).await.expect("the freezing peer binds");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let (frozen_below, frozen) = watch::channel(0u64);
        let (dead, is_dead) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let count = accepted.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let n = count.fetch_add(1, Ordering::SeqCst);
                if *is_dead.borrow() {
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else { continue };
                conns.spawn(forward(client, server, n, frozen.clone(), is_dead.clone()));
            }
        });
        FreezingPeer { addr, accepted, frozen_below, dead, _tasks: tasks }
    }

    fn kill(&self) {
        self.dead.send_replace(true);
    }

    fn revive(&self) {
        self.dead.send_replace(false);
    }

    fn freeze_open_connections(&self) {
        self.frozen_below.send_replace(self.accepted.load(Ordering::SeqCst));
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn forward(
    mut a: TcpStream,
    mut b: TcpStream,
    n: u64,
    mut frozen: watch::Receiver<u64>,
    mut dead: watch::Receiver<bool>,
) {
    let _ = (a.set_nodelay(true), b.set_nodelay(true));
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let (mut x, mut y) = ([0u8; 8192], [0u8; 8192]);
    loop {
        if *frozen.borrow() > n {
            // Hung: the sockets stay open and nothing passes, until the test ends.
            std::future::pending::<()>().await;
        }
        tokio::select! {
            r = ar.read(&mut x) => match r {
                Ok(0) | Err(_) => return,
                Ok(k) => if bw.write_all(&x[..k]).await.is_err() { return },
            },
            r = br.read(&mut y) => match r {
                Ok(0) | Err(_) => return,
                Ok(k) => if aw.write_all(&y[..k]).await.is_err() { return },
            },
            changed = frozen.changed() => if changed.is_err() { return },
            changed = dead.changed() => if changed.is_err() || *dead.borrow() { return },
        }
    }
}

async fn status(service: &ToolService, device: &str) -> Value {
    let e = service.call("get_device_status", json!({"device_id": device})).await.unwrap();
    e.json()["devices"][0].clone()
}

/// The oven's OPC UA server behind a freezing peer. The peer listens on 127.0.0.2 with the
/// server's own port, because a client matches the endpoints a server advertises by port
/// and path (the host is replaced by the one it dialled).
async fn oven_behind_a_peer(config: Config) -> (Plant, FreezingPeer, ToolService) {
    let plant = demo_plant().await;
    let url = plant.sim.opcua_urls()["b-oven2-opcua"].clone();
    let rest = url.strip_prefix("opc.tcp://").unwrap();
    let (hostport, path) = rest.split_once('/').unwrap();
    let upstream: std::net::SocketAddr = hostport.parse().unwrap();
    let listen = std::net::SocketAddr::new([127, 0, 0, 2].into(), upstream.port());
    let peer = FreezingPeer::start(listen, upstream).await;
    let mut registry = Registry::load(&demo_dir()).unwrap();
    registry.override_endpoints(plant.sim.addrs(), plant.sim.serial_paths());
    registry
        .override_opcua_endpoints([("b-oven2-opcua".to_string(), format!("opc.tcp://{}/{path}", peer.addr))]);
    let service = ToolService::new(Arc::new(registry), config);
    (plant, peer, service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opcua_server_that_stops_answering_one_session_is_one_failure_and_a_new_session_serves() {
    let mut config = Config::default();
    config.calls.deadline_ms = 5000;
    let (_plant, peer, service) = oven_behind_a_peer(config).await;
    let first = service.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001"})).await.unwrap();
    assert!(first.ok, "{:?}", first.error);
    let before = peer.accepted();

    // The server stops answering the session fieldgate holds.
    peer.freeze_open_connections();
    let mut calls = JoinSet::new();
    for i in 1..=4 {
        let s = service.clone();
        calls.spawn(async move {
            let id = format!("B_OVEN2_00{i}");
            s.call("get_sensor_reading", json!({"sensor_id": id})).await.unwrap()
        });
    }
    let mut answers = Vec::new();
    while let Some(e) = calls.join_next().await {
        answers.push(e.unwrap());
    }
    // Every caller got its value from a new session, within its own deadline.
    for e in &answers {
        assert!(e.ok, "{:?}", e.error);
        assert_eq!(e.json()["source"], "live");
    }
    assert!(peer.accepted() > before, "no new connection was opened after the freeze");
    // One stalled session is one failure, not one per waiting caller; the breaker stays closed.
    let d = status(&service, "b-oven2-opcua").await;
    assert_eq!(d["breaker"]["state"], "closed", "{d}");
    assert_eq!(d["failures"], 1, "{d}");
    assert_eq!(d["last_error"]["code"], "DEVICE_TIMEOUT", "{d}");
    assert_eq!(d["state"], "up", "{d}");
}

/// Log lines at INFO and above of this thread (a current-thread test runs every task on it).
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Lines;
    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}

impl Lines {
    fn count(&self, device: &str, what: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines().filter(|l| l.contains(device) && l.contains(what)).count()
    }
}

/// The oven's status once `done` holds for it (asked every 20 ms, for at most 30 s).
async fn oven_until(service: &ToolService, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut d = Value::Null;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            d = status(service, "b-oven2-opcua").await;
            if done(&d) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert!(waited.await.is_ok(), "the oven never {what}: {d}");
    d
}

#[tokio::test]
async fn a_subscribed_server_that_dies_is_down_with_one_log_line_and_up_again_when_it_returns() {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(lines.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut config = Config::default();
    config.breaker.failure_threshold = 3;
    config.breaker.open_ms = 500;
    config.server.rate_limit_per_minute = 1_000_000;
    let (_plant, peer, service) = oven_behind_a_peer(config).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&service, stop.clone());
    // Heard from through the subscription alone: no tool reads the oven in this test.
    oven_until(&service, "up", |d| d["state"] == "up").await;

    // The server dies: its session is lost and every new one fails.
    peer.kill();
    let d = oven_until(&service, "down", |d| d["state"] == "down" && d["breaker"]["state"] != "closed").await;
    assert!(d["down_since"].is_string() && d["last_error"]["code"].is_string(), "{d}");
    assert!(d["failures"].as_u64().unwrap() >= 3, "{d}");

    // It returns: the subscription comes back (or fieldgate's probe sees it first).
    peer.revive();
    oven_until(&service, "up again", |d| d["state"] == "up" && d["breaker"]["state"] == "closed").await;
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
    assert_eq!(lines.count("b-oven2-opcua", "device down"), 1);
    assert_eq!(lines.count("b-oven2-opcua", "device up again"), 1);
}

const SERIAL: &str = r#"id = "s-rtu"
plant = "S"
zone = "BUS1"
description = "RTU on a serial line"
protocol = "modbus-rtu"
endpoint = "/dev/ttyUSB0"
unit_id = 5
timeout_ms = TIMEOUT
poll_interval_ms = 0

[serial]
baud_rate = 19200

[[sensors]]
id = "S_BUS1_001"
description = "Flow"
kind = "flow"
unit = "m3/h"
table = "holding"
address = 0
type = "f32"

[[sensors]]
id = "S_BUS1_002"
description = "Temperature"
kind = "temperature"
unit = "degC"
table = "input"
address = 3
type = "i16"
scale = 0.1

[[sensors]]
id = "S_BUS1_003"
description = "Pressure"
kind = "pressure"
unit = "bar"
table = "holding"
address = 10
type = "f32"
"#;

/// A serial RTU device with `timeout_ms`, whose first request stalls the line until just
/// before that timeout; the fault is cleared as soon as the stall began, so only that
/// request goes unanswered.
async fn serial_line(timeout_ms: u64, deadline_ms: u64) -> (tempfile::TempDir, Plant) {
    let dir = device_dir(&[("s.toml", &SERIAL.replace("TIMEOUT", &timeout_ms.to_string()))]);
    let mut scenario = Scenario::default();
    scenario.sensors.insert("S_BUS1_001".into(), Wave::Constant { value: 12.5 });
    scenario.sensors.insert("S_BUS1_002".into(), Wave::Constant { value: -4.0 });
    scenario.sensors.insert("S_BUS1_003".into(), Wave::Constant { value: 3.25 });
    let mut config = Config::default();
    config.calls.deadline_ms = deadline_ms;
    config.calls.retry_backoff_ms = 10;
    let plant = plant_with(dir.path(), scenario, config).await;
    plant.faults("s-rtu", Faults { stall: 1.0, stall_ms: timeout_ms - 50, ..Default::default() });
    (dir, plant)
}

/// Clears the line's stall once the simulator has stalled one request.
async fn clear_after_first_stall(plant: &Plant) {
    wait_for("the first request to stall", || plant.sim.stats("s-rtu").is_some_and(|s| s.stalls >= 1)).await;
    plant.sim.set_faults("s-rtu", Faults::default()).unwrap();
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < until, "waited 20 s for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn read_all_three(service: &ToolService) -> Vec<(String, fieldgate::tools::Envelope, Duration)> {
    let mut calls = JoinSet::new();
    for id in ["S_BUS1_001", "S_BUS1_002", "S_BUS1_003"] {
        let s = service.clone();
        calls.spawn(async move {
            let started = std::time::Instant::now();
            let e = s.call("get_sensor_reading", json!({"sensor_id": id})).await.unwrap();
            (id.to_string(), e, started.elapsed())
        });
    }
    let mut out = Vec::new();
    while let Some(r) = calls.join_next().await {
        out.push(r.unwrap());
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_calls_queued_behind_a_timeout_wait_for_the_quiet_line_and_are_answered() {
    // Timeout 300 ms, the line quiet 300 ms after it; a 4 s deadline leaves room for all.
    let (_dir, plant) = serial_line(300, 4000).await;
    let (answers, ()) = tokio::join!(read_all_three(&plant.service), clear_after_first_stall(&plant));
    let want = [12.5, -4.0, 3.25];
    for ((id, e, _), want) in answers.iter().zip(want) {
        assert!(e.ok, "{id}: {:?}", e.error);
        assert_eq!(e.json()["value"].as_f64(), Some(want), "{id}");
    }
    let d = status(&plant.service, "s-rtu").await;
    assert_eq!(d["failures"], 1, "the one unanswered request is the only failure: {d}");
    assert_eq!(d["breaker"]["state"], "closed", "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_call_the_quiet_line_outlasts_fails_only_at_its_deadline_and_blames_nobody() {
    // Timeout 800 ms: the line stays quiet until 1.6 s, past the 1.2 s deadline of the
    // calls queued behind the first.
    let deadline = Duration::from_millis(1200);
    let (_dir, plant) = serial_line(800, deadline.as_millis() as u64).await;
    let (answers, ()) = tokio::join!(read_all_three(&plant.service), clear_after_first_stall(&plant));
    let requests_before = plant.sim.stats("s-rtu").unwrap().requests;
    for (id, e, took) in &answers {
        let err = e.error.as_ref().unwrap_or_else(|| panic!("{id} answered while the line was quiet"));
        assert_eq!((err.code, err.retryable), (ErrorCode::DeviceTimeout, true), "{id}: {err:?}");
        // Nobody was failed before its deadline was spent (only load can make this longer).
        assert!(*took >= deadline - Duration::from_millis(20), "{id} failed after {took:?}");
    }
    let d = status(&plant.service, "s-rtu").await;
    assert_eq!(d["failures"], 1, "only the unanswered request counts: {d}");
    // Nothing was sent on the quiet line, and it serves again once quiet.
    assert_eq!(requests_before, 1, "requests sent while the line had to stay quiet");
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "S_BUS1_002"})).await;
    assert!(e.ok, "{:?}", e.error);
}
