//! Resilience figures, against the simulator in the same run.
//!
//! `cargo bench --bench resilience` prints: the latency of a `CIRCUIT_OPEN` answer next to
//! a call that waits for a device timeout (and their ratio, target: the answer under
//! 10 µs), the read latency of a healthy device while another device is dead next to while
//! all are healthy, the share of good answers when 1 request in 12 stalls its connection
//! for 30 s and 1 in 12 is answered busy (8 agents, target: at least 95 %), and the time
//! from a dead device's return to its first good answer with no agent traffic (target: the
//! open period left at its return plus 1 s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
use fieldgate_sim::{Bind, Faults, Scenario, Simulator};
use serde_json::json;

fn pct(v: &mut [Duration], p: usize) -> f64 {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1e6
}

async fn healthy_reads(tools: &ToolService, n: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let e = tools.call("get_sensor_reading", json!({"sensor_id": "A_LINE1_001"})).await.unwrap();
        assert!(e.ok);
        times.push(t.elapsed());
    }
    times
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let devices_dir = root.join("devices");
    let devices = fieldgate_sim::plant::load_dir(&devices_dir).unwrap();
    let sim = Simulator::start(devices, Scenario::default(), Bind::Ephemeral).await.unwrap();
    let mut registry = Registry::load(&devices_dir).unwrap();
    registry.override_endpoints(sim.addrs(), sim.serial_paths());
    let mut config = Config::default();
    config.server.rate_limit_per_minute = 1_000_000;
    config.calls.repeat_failure_limit = u32::MAX; // measure the breaker, not the cross-call limit
    config.breaker.open_ms = 600_000;
    config.breaker.max_open_ms = 600_000;
    let tools = ToolService::new(Arc::new(registry), config);

    // All healthy: the baseline for the healthy device.
    healthy_reads(&tools, 300).await;
    let mut all_healthy = healthy_reads(&tools, 3000).await;

    // A call that waits for the meter's timeout (500 ms, three attempts, no breaker yet).
    sim.set_faults("a-util-meter", Faults { no_reply: 1.0, ..Default::default() }).unwrap();
    let t = Instant::now();
    let e = tools.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_001"})).await.unwrap();
    let timeout_call = t.elapsed();
    assert_eq!(e.error.unwrap().code.as_str(), "DEVICE_TIMEOUT");
    // Open the breaker, then measure its answers.
    while tools
        .call("get_sensor_reading", json!({"sensor_id": "A_UTIL_002"}))
        .await
        .unwrap()
        .error
        .map(|e| e.code.as_str())
        != Some("CIRCUIT_OPEN")
    {}
    let mut open = Vec::with_capacity(5000);
    for i in 0..5000 {
        let sensor = format!("A_UTIL_00{}", 1 + i % 9);
        let t = Instant::now();
        let e = tools.call("get_sensor_reading", json!({ "sensor_id": sensor })).await.unwrap();
        open.push(t.elapsed());
        assert_eq!(e.error.unwrap().code.as_str(), "CIRCUIT_OPEN");
    }
    // The healthy device while the meter is dead: calls to the meter run alongside.
    let dead_load = {
        let tools = tools.clone();
        tokio::spawn(async move {
            for i in 0..20_000 {
                let sensor = format!("A_UTIL_00{}", 1 + i % 9);
                let _ = tools.call("get_sensor_reading", json!({ "sensor_id": sensor })).await;
                tokio::task::yield_now().await;
            }
        })
    };
    let mut with_dead = healthy_reads(&tools, 3000).await;
    dead_load.abort();

    let open_p50 = pct(&mut open, 50);
    println!("resilience, in process against the simulator (release build)");
    println!("{:<58} {:>10} {:>10}", "", "p50 µs", "p99 µs");
    println!("{:<58} {:>10.1} {:>10.1}", "CIRCUIT_OPEN answer (breaker open)", open_p50, pct(&mut open, 99));
    println!(
        "{:<58} {:>10.0}",
        "call waiting for the device timeout (3 x 500 ms)",
        timeout_call.as_secs_f64() * 1e6
    );
    println!("ratio timeout call / CIRCUIT_OPEN p50: {:.0}x", timeout_call.as_secs_f64() * 1e6 / open_p50);
    let (h50, h99) = (pct(&mut all_healthy, 50), pct(&mut all_healthy, 99));
    let (d50, d99) = (pct(&mut with_dead, 50), pct(&mut with_dead, 99));
    println!("{:<58} {:>10.1} {:>10.1}", "healthy device read, all devices healthy", h50, h99);
    println!("{:<58} {:>10.1} {:>10.1}", "healthy device read, meter dead and still being called", d50, d99);
    println!("healthy read with a dead device / all healthy, p50: {:.2}x", d50 / h50);
    sim.shutdown().await;
    stall_scenario().await;
    recovery_without_traffic().await;
}

/// The demo devices with `timeout_ms` on every device, in a temporary folder.
fn devices_with_timeout(ms: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("devices");
    for path in fieldgate::registry::device_files(&root).unwrap() {
        let text: String =
            std::fs::read_to_string(&path)
                .unwrap()
                .lines()
                .map(|l| {
                    if l.starts_with("timeout_ms") {
                        format!("timeout_ms = {ms}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    dir
}

async fn plant(dir: &std::path::Path, config: Config) -> (Simulator, ToolService) {
    let sim =
        Simulator::start(fieldgate_sim::plant::load_dir(dir).unwrap(), Scenario::default(), Bind::Ephemeral)
            .await
            .unwrap();
    let mut registry = Registry::load(dir).unwrap();
    registry.override_endpoints(sim.addrs(), sim.serial_paths());
    registry.override_opcua_endpoints(sim.opcua_urls());
    (sim, ToolService::new(Arc::new(registry), config))
}

/// 8 agents, 55 calls each, on random sensors of a device whose connection stalls after
/// 1 request in 12 (for 30 s) and which answers 1 in 12 busy; device timeout 300 ms.
async fn stall_scenario() {
    let dir = devices_with_timeout(300);
    let mut config = Config::default();
    config.server.rate_limit_per_minute = 1_000_000;
    let (sim, tools) = plant(dir.path(), config).await;
    let faults = Faults {
        stall: 1.0 / 12.0,
        stall_ms: 30_000,
        exception_code: Some(6),
        exception_rate: 1.0 / 12.0,
        ..Default::default()
    };
    sim.set_faults("a-line1-plc", faults).unwrap();
    let ids: Arc<Vec<String>> = Arc::new(
        tools
            .registry()
            .sensors_of_device(&"a-line1-plc".parse().unwrap())
            .filter(|s| !matches!(&s.source, fieldgate::registry::SensorSource::Modbus(p) if p.data_type == fieldgate::registry::DataType::String))
            .map(|s| s.id.to_string())
            .collect(),
    );
    let started = Instant::now();
    let agents: Vec<_> = (0..8u64)
        .map(|agent| {
            let (tools, ids) = (tools.clone(), ids.clone());
            tokio::spawn(async move {
                let mut seed =
                    0x9E37_79B9_7F4A_7C15u64.wrapping_mul(agent + 1) ^ started.elapsed().as_nanos() as u64;
                let mut out = Vec::new();
                for _ in 0..55 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let id = &ids[(seed % ids.len() as u64) as usize];
                    let t = Instant::now();
                    let e = tools.call("get_sensor_reading", json!({ "sensor_id": id })).await.unwrap();
                    out.push((t.elapsed(), e.error.map(|e| e.code.as_str())));
                }
                out
            })
        })
        .collect();
    let mut times = Vec::new();
    let mut codes: std::collections::BTreeMap<&str, usize> = Default::default();
    for a in agents {
        for (took, code) in a.await.unwrap() {
            times.push(took);
            *codes.entry(code.unwrap_or("OK")).or_default() += 1;
        }
    }
    let stalls = sim.stats("a-line1-plc").map_or(0, |s| s.stalls);
    let good = codes.get("OK").copied().unwrap_or(0);
    let max = times.iter().max().copied().unwrap_or_default();
    println!();
    println!(
        "stall scenario: 8 agents x 55 calls, 1 in 12 requests stalls 30 s, 1 in 12 busy, timeout 300 ms"
    );
    println!(
        "good answers: {good} of {} ({:.1} %, target >= 95 %), {stalls} stalls, {:.1} s, answers {codes:?}",
        times.len(),
        good as f64 * 100.0 / times.len() as f64,
        started.elapsed().as_secs_f64()
    );
    println!(
        "call duration p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (deadline 2000 ms)",
        pct(&mut times, 50) / 1000.0,
        pct(&mut times, 99) / 1000.0,
        max.as_secs_f64() * 1000.0
    );
    sim.shutdown().await;
}

/// A device killed until its breaker opened, then brought back; no agent calls at all
/// until fieldgate's own probe closed the breaker.
async fn recovery_without_traffic() {
    let dir = devices_with_timeout(300);
    let (sim, tools) = plant(dir.path(), Config::default()).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let tasks = fieldgate::poller::start(&tools.core(), stop.clone());
    sim.set_faults("a-util-meter", Faults { down: true, ..Default::default() }).unwrap();
    let status = |tools: ToolService| async move {
        tools.call("get_device_status", json!({"device_id": "a-util-meter"})).await.unwrap().json()["devices"]
            [0]
        .clone()
    };
    for i in 1..=9 {
        let _ = tools.call("get_sensor_reading", json!({ "sensor_id": format!("A_UTIL_00{i}") })).await;
    }
    while status(tools.clone()).await["breaker"]["state"] != "open" {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = status(tools.clone()).await["breaker"]["retry_after_ms"].as_u64().unwrap_or(0);
    sim.set_faults("a-util-meter", Faults::default()).unwrap();
    let back = Instant::now();
    while status(tools.clone()).await["breaker"]["state"] != "closed" {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let e = tools.call("get_sensor_reading", json!({"sensor_id": "A_UTIL_001"})).await.unwrap();
    let took = back.elapsed();
    assert!(e.ok);
    println!();
    println!(
        "dead device back: first good answer after {:.0} ms with no agent traffic (open period left at its return {left} ms; target <= {} ms)",
        took.as_secs_f64() * 1000.0,
        left + 1000
    );
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    sim.shutdown().await;
}
