//! History figures, in one run: ingest rate, bytes per point on disk for the demo
//! waveforms, query times, and polling throughput from the simulator.
//!
//! Targets (issue 6): ≥ 1,000,000 points/s ingest; ≤ 3 bytes/point; 10,000 raw points in
//! ≤ 2 ms; a day at 1 s in 24 hourly buckets in ≤ 10 ms; polling 100,000 tags/s under 15% of
//! 2 cores and 64 MB (for scale: NeuronEX, 100,000 points/s at 30% of 4 cores, 497 MB).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fieldgate::config::Config;
use fieldgate::registry::{DataType, Registry, SensorSource};
use fieldgate::store::HistoryStore;
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::tools::ToolService;
use fieldgate_sim::{Bind, Scenario, SimValue, Simulator};
use serde_json::json;

const DAY_MS: i64 = 86_400_000;
const T0: i64 = 1_790_000_000_000;

fn cpu_seconds() -> f64 {
    // utime + stime of this process, from /proc (clock ticks of 1/100 s on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();

    // 1. Ingest: 200 sensors x 10,000 points of a noisy sine, flushed every 100,000 points.
    let store = HistoryStore::open(&dir.path().join("ingest.redb")).unwrap();
    let names: Vec<String> = (0..200).map(|i| format!("X_Y_{i:03}")).collect();
    let started = Instant::now();
    let mut n = 0u64;
    for k in 0..10_000i64 {
        for (i, name) in names.iter().enumerate() {
            let v = f64::from((((k + i as i64) as f32) * 0.01).sin() * 100.0);
            store.append(name, &Point { t: T0 + k * 1000, value: Stored::Float(v), quality: 0 });
            n += 1;
            if n.is_multiple_of(100_000) {
                store.flush().unwrap();
            }
        }
    }
    store.flush().unwrap();
    let ingest = n as f64 / started.elapsed().as_secs_f64();

    // 2. Bytes per point: the demo waveforms sampled every second for a day, stored as the
    // poller stores them (raw register values; every sample, and with the deadbands).
    let registry = Registry::load(&root.join("devices")).unwrap();
    let scenario = Scenario::parse("demo", fieldgate_sim::wave::DEMO_SCENARIO).unwrap();
    let sim = Simulator::start(
        fieldgate_sim::plant::load_dir(&root.join("devices")).unwrap(),
        scenario,
        Bind::Ephemeral,
    )
    .await
    .unwrap();
    let every = HistoryStore::open(&dir.path().join("every.redb")).unwrap();
    let banded = HistoryStore::open(&dir.path().join("banded.redb")).unwrap();
    let (mut points_every, mut points_banded) = (0u64, 0u64);
    for s in registry.sensors() {
        let SensorSource::Modbus(p) = &s.source else { continue };
        let mut last: Option<(i64, Stored)> = None;
        for k in 0..86_400i64 {
            let Some(v) = sim.expected_at(s.id.as_str(), k as f64) else { break };
            let stored = match (v, p.data_type) {
                (SimValue::Num(x), DataType::F32) => {
                    Stored::Float(f64::from(((x - p.offset) / p.scale) as f32))
                }
                (SimValue::Num(x), DataType::F64) => Stored::Float((x - p.offset) / p.scale),
                (SimValue::Num(x), _) => Stored::Int(((x - p.offset) / p.scale).round() as i64),
                (SimValue::Bool(b), _) => Stored::Bool(b),
                (SimValue::Text(t), _) => Stored::Text(t),
            };
            let pt = Point { t: T0 + k * 1000, value: stored.clone(), quality: 0 };
            every.append(s.id.as_str(), &pt);
            points_every += 1;
            if fieldgate::reading::record::worth_storing(
                s,
                last.as_ref().map(|(t, v)| (*t, v, 0)),
                pt.t,
                &stored,
                0,
                60_000,
            ) {
                banded.append(s.id.as_str(), &pt);
                points_banded += 1;
                last = Some((pt.t, stored));
            }
        }
    }
    every.flush().unwrap();
    banded.flush().unwrap();
    let (bytes_every, _) = every.size().unwrap();
    let (bytes_banded, _) = banded.size().unwrap();
    let file_every = std::fs::metadata(dir.path().join("every.redb")).map(|m| m.len()).unwrap_or(0);

    // 3. Queries: 10,000 raw points; one day at 1 s in 24 hourly buckets.
    let svc = ToolService::with_history(Arc::new(registry), Config::default(), Some(Arc::new(every)));
    let store = svc.history().unwrap().clone();
    let mut raw = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let pts = store.points("A_LINE1_001", T0, T0 + 10_000 * 1000).unwrap();
        raw.push(t.elapsed());
        assert_eq!(pts.len(), 10_000);
    }
    raw.sort();
    let page = json!({"sensor_id": "A_LINE1_001", "from": "2026-09-21T14:13:20Z", "to": "2026-09-21T15:36:40Z", "limit": 5000});
    let mut tool_raw = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        let e = svc.call("get_sensor_history", page.clone()).await.unwrap();
        tool_raw.push(t.elapsed());
        assert!(e.ok, "{:?}", e.error);
    }
    tool_raw.sort();
    let day = json!({"sensor_id": "A_LINE1_001", "from": "2026-09-21T14:13:20Z", "to": "2026-09-22T14:13:20Z", "bucket": "1h"});
    let mut buckets = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let e = svc.call("get_sensor_history", day.clone()).await.unwrap();
        buckets.push(t.elapsed());
        assert_eq!(e.json()["buckets"].as_array().map(Vec::len), Some(25), "a day spans 25 clock hours here");
    }
    buckets.sort();
    let _ = DAY_MS;

    // 4. Polling throughput: 40 devices x 250 u16 sensors polled every 100 ms.
    let plant = tempfile::tempdir().unwrap();
    for d in 0..40 {
        let mut text = format!(
            "id = \"p-{d:02}\"\nplant = \"P\"\nzone = \"Z{d:02}\"\ndescription = \"poll bench\"\nprotocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:1\"\npoll_interval_ms = 100\n"
        );
        for i in 0..250 {
            text.push_str(&format!(
                "\n[[sensors]]\nid = \"P_Z{d:02}_{:03}\"\ndescription = \"s\"\nkind = \"level\"\nunit = \"m\"\ntable = \"holding\"\naddress = {i}\ntype = \"u16\"\n",
                i + 1
            ));
        }
        std::fs::write(plant.path().join(format!("p{d:02}.toml")), text).unwrap();
    }
    let psim = Simulator::start(
        fieldgate_sim::plant::load_dir(plant.path()).unwrap(),
        Scenario::default(),
        Bind::Ephemeral,
    )
    .await
    .unwrap();
    let mut preg = Registry::load(plant.path()).unwrap();
    preg.override_endpoints(psim.addrs(), psim.serial_paths());
    let pstore = Arc::new(HistoryStore::open(&dir.path().join("poll.redb")).unwrap());
    let psvc = ToolService::with_history(Arc::new(preg), Config::default(), Some(pstore));
    let stop = tokio_util::sync::CancellationToken::new();
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let handles = fieldgate::poller::start(&psvc.core(), stop.clone());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let metrics = psvc.render_metrics();
    let polled: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fieldgate_points_polled_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    stop.cancel();
    for h in handles {
        let _ = h.await;
    }

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("history (release build)");
    println!(
        "ingest into the store: {:.0} points/s ({} points, 200 sensors)   target >= 1,000,000: {}",
        ingest,
        n,
        if ingest >= 1e6 { "met" } else { "NOT met" }
    );
    let bpp = bytes_every as f64 / points_every as f64;
    println!(
        "demo waveforms, a day at 1 s, every sample: {} points, {:.2} bytes/point (redb file {:.2} bytes/point)   target <= 3: {}",
        points_every,
        bpp,
        file_every as f64 / points_every as f64,
        if bpp <= 3.0 { "met" } else { "NOT met" }
    );
    println!(
        "demo waveforms with their deadbands and 60 s max silence: {} points stored, {:.2} bytes/point, {:.1} bytes per sensor-second",
        points_banded,
        bytes_banded as f64 / points_banded.max(1) as f64,
        bytes_banded as f64 / points_every as f64
    );
    println!(
        "10,000 raw points from the store: p50 {:.2} ms, p99 {:.2} ms; a 5,000-point page via get_sensor_history: p50 {:.2} ms   target <= 2 ms: {}",
        ms(raw[raw.len() / 2]),
        ms(raw[raw.len() * 99 / 100]),
        ms(tool_raw[tool_raw.len() / 2]),
        if ms(raw[raw.len() / 2]) <= 2.0 { "met" } else { "NOT met" }
    );
    println!(
        "a day at 1 s in hourly buckets via get_sensor_history: p50 {:.2} ms, p99 {:.2} ms   target <= 10 ms: {}",
        ms(buckets[buckets.len() / 2]),
        ms(buckets[buckets.len() * 99 / 100]),
        if ms(buckets[buckets.len() / 2]) <= 10.0 { "met" } else { "NOT met" }
    );
    println!(
        "polling 40 devices x 250 tags every 100 ms: {:.0} tags/s, CPU {:.0}% of one core ({:.1}% of 2 cores) for poller AND simulator in this process, peak RSS {:.0} MB (whole process)",
        polled / wall,
        100.0 * cpu / wall,
        50.0 * cpu / wall,
        peak_rss_mb()
    );
    psim.shutdown().await;
    sim.shutdown().await;
}
