//! The operator console: server time to render the overview and a sensor page with a 24 h
//! chart, and the service's added CPU share while 5 browsers keep the overview open with
//! live updates, on a plant of 100 sensors.
//!
//! `cargo bench --bench console` prints: the median and p99 render time of the overview of
//! the demo plant (44 sensors, every value cached), of a sensor page over 24 h (a point
//! every 10 s: 8,640 points in about 120 buckets) and of one live snapshot; then, for the
//! real `fieldgate serve` polling 100 sensors once a second from the simulator, its CPU
//! time over 10 s without a browser and over 10 s with 5 live streams open (each reads
//! every event), and the difference as a share of one core. It also prints what recording
//! one call in the agent-activity ring costs.
//! Targets (issue 24): under 5 ms per render; under 2 % of one core for the 5 streams.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fieldgate::console::Console;
use fieldgate::driver::RawValue;
use fieldgate::driver::{Sample, SampleQuality};
use fieldgate::registry::Registry;
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::tools::ToolService;
use fieldgate::transport::auth::Tokens;
use fieldgate_sim::{Bind, Scenario, Simulator};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const RENDERS: usize = 300;
const STREAMS: usize = 5;
const WINDOW: Duration = Duration::from_secs(10);

/// Median and p99 of `f`'s time, in milliseconds.
fn time(mut f: impl FnMut() -> usize) -> (f64, f64, usize) {
    let mut bytes = 0;
    for _ in 0..20 {
        bytes = f();
    }
    let mut t: Vec<Duration> = (0..RENDERS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .collect();
    t.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(t[RENDERS / 2]), ms(t[RENDERS * 99 / 100]), bytes)
}

fn renders() {
    let registry = Registry::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("devices")).unwrap();
    let service = ToolService::new(Arc::new(registry), fieldgate::config::Config::default());
    let now = chrono::Utc::now();
    for (i, s) in service.registry().sensors().iter().enumerate() {
        let sample =
            Sample { value: RawValue::Float(10.0 + i as f64 / 7.0), at: now, quality: SampleQuality::Good };
        service.reader().cache().put(s, &sample);
    }
    let history = service.history().unwrap();
    let start = now.timestamp_millis() - 86_400_000;
    for i in 0..8_640i64 {
        let v = 4.2 + 0.6 * ((i as f64) / 540.0).sin();
        let ok = history
            .append("A_LINE1_001", &Point { t: start + i * 10_000, value: Stored::Float(v), quality: 0 });
        assert!(ok);
    }
    let console =
        Console::new(service, Arc::new(Tokens::default()), tokio_util::sync::CancellationToken::new());
    let (p50, p99, bytes) = time(|| console.render_overview().len());
    println!("overview (44 sensors):      p50 {p50:.3} ms  p99 {p99:.3} ms  ({bytes} bytes)   target < 5 ms");
    let (p50, p99, bytes) =
        time(|| console.render_sensor("A_LINE1_001", "24h").map(|s| s.len()).unwrap_or(0));
    println!("sensor page, 24 h chart:    p50 {p50:.3} ms  p99 {p99:.3} ms  ({bytes} bytes)   target < 5 ms");
    let (p50, p99, bytes) = time(|| console.render_snapshot().len());
    println!("live snapshot (44 sensors): p50 {p50:.3} ms  p99 {p99:.3} ms  ({bytes} bytes)");
}

/// What recording one call in the activity ring costs `ToolService::call_as`: the call's
/// arguments are moved in (their copies here are made before the clock starts), and the
/// ring's lock taken.
fn activity_cost() {
    use fieldgate::tools::activity::{Activity, Call};
    let ring = Activity::default();
    let args = serde_json::json!({ "sensor_id": "A_LINE1_001", "max_age_ms": 3_600_000 });
    let n = 200_000;
    let batch: Vec<serde_json::Value> = (0..n).map(|_| args.clone()).collect();
    let start = Instant::now();
    for args in batch {
        ring.record(Call {
            at: chrono::Utc::now(),
            tool: "get_sensor_reading",
            args,
            code: "OK",
            duration_ms: 0.1,
            caller: std::hint::black_box("agent").to_string(),
        });
    }
    let ns = start.elapsed().as_secs_f64() * 1e9 / n as f64;
    println!(
        "activity ring: {ns:.0} ns to record one call (arguments moved in, the lock, the oldest dropped)"
    );
}

/// One device with 100 holding registers, polled once a second.
fn hundred_sensors(endpoint: &str) -> String {
    let mut text = format!(
        "id = \"p-bench-plc\"\nplant = \"P\"\nzone = \"BENCH\"\ndescription = \"Bench PLC\"\nprotocol = \"modbus-tcp\"\nendpoint = \"{endpoint}\"\ntimeout_ms = 500\npoll_interval_ms = 1000\n"
    );
    for i in 1..=100 {
        text.push_str(&format!(
            "\n[[sensors]]\nid = \"P_BENCH_{i:03}\"\ndescription = \"Bench value {i}\"\nkind = \"level\"\nunit = \"%\"\ntable = \"holding\"\naddress = {}\ntype = \"u16\"\nrange = {{ min = 0.0, max = 60000.0 }}\n",
            i - 1
        ));
    }
    text
}

/// User and system CPU time of process `pid` so far.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest.split(' ').skip(11).take(2).map(|x| x.parse().unwrap()).collect();
    let tck: u64 = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100);
    Duration::from_secs_f64((f[0] + f[1]) as f64 / tck as f64)
}

/// One browser's live stream: reads every event, counts them.
async fn stream(addr: std::net::SocketAddr, events: Arc<AtomicU64>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /console/live HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail = Vec::new();
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        tail.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&tail);
        let seen = text.matches("event: snapshot").count() as u64;
        if seen > 0 {
            events.fetch_add(seen, Ordering::Relaxed);
            let last = text.rfind("event: snapshot").unwrap_or(0) + 1;
            tail = tail[last..].to_vec();
        }
    }
}

async fn cpu_share() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p-bench-plc.toml"), hundred_sensors("127.0.0.1:5020")).unwrap();
    let sim = Simulator::start(
        fieldgate_sim::plant::load_dir(dir.path()).unwrap(),
        Scenario::default(),
        Bind::Ephemeral,
    )
    .await
    .unwrap();
    let addr = sim.addr("p-bench-plc").unwrap();
    std::fs::write(dir.path().join("p-bench-plc.toml"), hundred_sensors(&addr.to_string())).unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices"])
        .arg(dir.path())
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let served: std::net::SocketAddr = loop {
        let line = lines.next_line().await.unwrap().expect("fieldgate listens");
        if let Some(rest) = line.strip_prefix("fieldgate listening on http://") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = cpu(pid);
    tokio::time::sleep(WINDOW).await;
    let idle = cpu(pid) - before;
    let events = Arc::new(AtomicU64::new(0));
    for _ in 0..STREAMS {
        tokio::spawn(stream(served, events.clone()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before, seen) = (cpu(pid), events.load(Ordering::Relaxed));
    tokio::time::sleep(WINDOW).await;
    let live = cpu(pid) - before;
    let seen = events.load(Ordering::Relaxed) - seen;
    let share = |d: Duration| d.as_secs_f64() / WINDOW.as_secs_f64() * 100.0;
    println!(
        "fieldgate serve, 100 sensors polled at 1 Hz: CPU {:.2} % of one core without a browser, {:.2} % with {STREAMS} live overviews ({:.1} events/s each)",
        share(idle),
        share(live),
        seen as f64 / STREAMS as f64 / WINDOW.as_secs_f64()
    );
    println!(
        "added by {STREAMS} live overviews: {:.2} % of one core   target < 2 %",
        share(live) - share(idle)
    );
    let _ = child.kill().await;
    sim.shutdown().await;
}

fn main() {
    renders();
    activity_cost();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(cpu_share());
}
