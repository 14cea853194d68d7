//! OPC UA faults the simulator's own cannot make: a server that stops answering one
//! session while it serves a new one, a subscription's server that hangs, one that dies
//! and returns. A TCP peer in front of the simulator freezes or drops the connections it
//! holds. Counts and outcomes only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
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
    oven_polled_behind_a_peer(config, 1000).await
}

/// As [`oven_behind_a_peer`], the oven sampled (polled or subscribed) every `poll_ms`.
async fn oven_polled_behind_a_peer(config: Config, poll_ms: u64) -> (Plant, FreezingPeer, ToolService) {
    let plant = demo_plant().await;
    let url = plant.sim.opcua_urls()["b-oven2-opcua"].clone();
    let rest = url.strip_prefix("opc.tcp://").unwrap();
    let (hostport, path) = rest.split_once('/').unwrap();
    let upstream: std::net::SocketAddr = hostport.parse().unwrap();
    let listen = std::net::SocketAddr::new([127, 0, 0, 2].into(), upstream.port());
    let peer = FreezingPeer::start(listen, upstream).await;
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let text = std::fs::read_to_string(&path).unwrap();
        let text = match path.file_name().and_then(|n| n.to_str()) {
            Some("b-oven2-opcua.toml") => {
                text.replace("poll_interval_ms = 1000", &format!("poll_interval_ms = {poll_ms}"))
            }
            _ => text,
        };
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    let mut registry = Registry::load(dir.path()).unwrap();
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
    let (lines, _guard) = Lines::capture();
    let mut config = Config::default();
    config.breaker.failure_threshold = 3;
    config.breaker.open_ms = 500;
    config.server.rate_limit_per_minute = 1_000_000;
    let (_plant, peer, service) = oven_behind_a_peer(config).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&service.core(), stop.clone());
    // Heard from through the subscription alone: no tool reads the oven in this test.
    oven_until(&service, "up", |d| d["state"] == "up" && d["breaker"]["state"] == "closed").await;

    // The server dies: its session is lost and every new one fails. (Counted from here: on
    // a loaded box the first sessions can time out and open the breaker before "up".)
    let mark = lines.mark();
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
    let all = lines.text();
    assert_eq!(lines.count_since(mark, "b-oven2-opcua", "device down"), 1, "{all}");
    assert_eq!(lines.count_since(mark, "b-oven2-opcua", "device up again"), 1, "{all}");
}

fn metric(service: &ToolService, name: &str) -> u64 {
    let text = service.render_metrics();
    let line = format!("{name}{{device=\"b-oven2-opcua\"}} ");
    text.lines().find_map(|l| l.strip_prefix(line.as_str())).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_whose_server_stops_publishing_is_recreated_on_a_new_session() {
    // Sampled every 50 ms: a keep-alive is due every 500 ms at most.
    let (plant, peer, service) = oven_polled_behind_a_peer(Config::default(), 50).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&service.core(), stop.clone());
    wait_for("the first session", || metric(&service, "fieldgate_opcua_sessions_total") == 1).await;
    let before = metric(&service, "fieldgate_opcua_notifications_total");
    wait_for("notifications", || metric(&service, "fieldgate_opcua_notifications_total") > before).await;

    // The server hangs on the session (its socket stays open, nothing comes back): no
    // data, no keep-alive. fieldgate gives up on it and subscribes again on a new one.
    peer.freeze_open_connections();
    wait_for("a second session", || metric(&service, "fieldgate_opcua_sessions_total") == 2).await;
    plant.sim.set_wave("B_OVEN2_001", fieldgate_sim::Wave::Constant { value: 199.0 });
    let store = service.history().unwrap().clone();
    wait_for("the new value in history", || {
        store
            .points("B_OVEN2_001", 0, i64::MAX)
            .unwrap()
            .iter()
            .any(|p| matches!(p.value, fieldgate::store::gorilla::Stored::Float(v) if v == 199.0))
    })
    .await;
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
}

/// Waits (observing) until `done` holds; fails after 30 s.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < until, "waited 30 s for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_calls_close_their_opcua_session_so_the_servers_limit_is_never_reached() {
    let plant = demo_plant().await;
    let oven = std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml")).unwrap();
    let url = plant.sim.opcua_urls()["b-oven2-opcua"].clone();
    let devices = device_dir(&[("oven.toml", &oven.replace("opc.tcp://127.0.0.1:4840/fieldgate", &url))]);
    let data = tempfile::tempdir().unwrap();
    // More calls than the simulator's 20 sessions: each must end its own.
    for n in 0..24 {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .args(["--devices", devices.path().to_str().unwrap(), "call", "get_sensor_reading"])
            .arg(r#"{"sensor_id":"B_OVEN2_001"}"#)
            .env_clear()
            .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
            // In this process: no fieldgate another program runs on the default port is asked.
            .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
            .output_within()
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["ok"], true, "call {n}: {v}");
    }
}
