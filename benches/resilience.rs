//! Resilience figures, against the simulator in the same run.
//!
//! `cargo bench --bench resilience` prints: the latency of a `CIRCUIT_OPEN` answer next to
//! a call that waits for a device timeout (and their ratio), and the read latency of a
//! healthy device while another device is dead next to while all are healthy.

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
}
