//! Modbus read path, measured against the simulator in the same process.
//!
//! `cargo bench --bench modbus` prints, for one f32 sensor over Modbus TCP on loopback:
//! a raw tokio-modbus read (the baseline), an in-process `get_sensor_reading`, and their
//! difference (the tool's overhead); then a 100-sensor `get_sensor_readings` against 100
//! single calls. Targets (issue 3): overhead ≤ 20 µs median; the batch < 3 single reads.
//! Then the same over OPC UA (issue 8): async-opcua's own Read next to the tools, for one
//! node and for 100.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fieldgate::config::Config;
use fieldgate::registry::{Endpoint, Registry};
use fieldgate::tools::ToolService;
use fieldgate_sim::{Bind, Scenario, Simulator, Wave};
use serde_json::json;
use tokio_modbus::client::Reader;

// The `fieldgate` binary runs on mimalloc; measure the tool path with the same allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WARMUP: usize = 300;
const RUNS: usize = 3000;

fn device_file(n: usize) -> String {
    let mut s = String::from(
        "id = \"bench-plc\"\nplant = \"BENCH\"\nzone = \"Z\"\ndescription = \"bench\"\nprotocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:1502\"\ntimeout_ms = 1000\n",
    );
    for i in 0..n {
        s.push_str(&format!(
            "\n[[sensors]]\nid = \"BENCH_Z_{:03}\"\ndescription = \"s{i}\"\nkind = \"pressure\"\nunit = \"bar\"\ntable = \"holding\"\naddress = {}\ntype = \"f32\"\n",
            i + 1,
            i * 2
        ));
    }
    s
}

/// An OPC UA device with `n` double variables.
fn opcua_device_file(n: usize) -> String {
    let mut s = String::from(
        "id = \"bench-ua\"\nplant = \"BENCH\"\nzone = \"UA\"\ndescription = \"bench\"\nprotocol = \"opcua\"\nendpoint = \"opc.tcp://127.0.0.1:4840/\"\ntimeout_ms = 1000\n\n[opcua]\nsecurity_policy = \"None\"\nsecurity_mode = \"None\"\nmode = \"poll\"\n",
    );
    for i in 0..n {
        s.push_str(&format!(
            "\n[[sensors]]\nid = \"BENCH_UA_{:03}\"\ndescription = \"s{i}\"\nkind = \"pressure\"\nunit = \"bar\"\nnode_id = \"ns=2;s=Bench.S{:03}\"\n",
            i + 1,
            i + 1
        ));
    }
    s
}

struct Stats {
    median: Duration,
    p99: Duration,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats { median: v[v.len() / 2], p99: v[v.len() * 99 / 100] }
}

async fn measure<F, Fut>(runs: usize, mut f: F) -> Stats
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..WARMUP.min(runs) {
        f().await;
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        // The closure prepares the call (cloning its arguments) before the clock starts:
        // what is timed is the service, as a transport hands it an owned request.
        let call = f();
        let t = Instant::now();
        call.await;
        times.push(t.elapsed());
    }
    stats(times)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // Spawned, so the baseline and the tool path both run on worker threads.
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bench.toml"), device_file(100)).unwrap();
    std::fs::write(dir.path().join("bench-ua.toml"), opcua_device_file(100)).unwrap();
    let mut scenario = Scenario::default();
    for i in 1..=100 {
        scenario.sensors.insert(format!("BENCH_Z_{i:03}"), Wave::Constant { value: i as f64 * 0.5 });
        scenario.sensors.insert(format!("BENCH_UA_{i:03}"), Wave::Constant { value: i as f64 * 0.25 });
    }
    let devices = fieldgate_sim::plant::load_dir(dir.path()).unwrap();
    let sim = Simulator::start(devices, scenario, Bind::Ephemeral).await.unwrap();
    let addr = sim.addr("bench-plc").unwrap();
    let mut registry = Registry::load(dir.path()).unwrap();
    registry.override_endpoint(
        &"bench-plc".parse().unwrap(),
        Endpoint::Tcp { host: addr.ip().to_string(), port: addr.port() },
    );
    registry.override_opcua_endpoints(sim.opcua_urls());
    let mut config = Config::default();
    // The per-caller limit protects devices from agents; the bench is one caller on purpose.
    config.server.rate_limit_per_minute = 1_000_000;
    let service = ToolService::new(Arc::new(registry), config);

    // Baseline: tokio-modbus itself, one connection, two registers.
    let mut ctx = tokio_modbus::client::tcp::connect_slave(addr, tokio_modbus::Slave(1)).await.unwrap();
    let mut times = Vec::with_capacity(RUNS);
    for i in 0..WARMUP + RUNS {
        let t = Instant::now();
        let r = ctx.read_holding_registers(0, 2).await.unwrap().unwrap();
        assert_eq!(r.len(), 2);
        if i >= WARMUP {
            times.push(t.elapsed());
        }
    }
    let raw = stats(times);
    // The batch's own device reads, without the tool: holding 0-124 and 125-199.
    let mut times = Vec::with_capacity(RUNS / 5);
    for i in 0..WARMUP + RUNS / 5 {
        let t = Instant::now();
        let a = ctx.read_holding_registers(0, 125).await.unwrap().unwrap();
        let b = ctx.read_holding_registers(125, 75).await.unwrap().unwrap();
        assert_eq!(a.len() + b.len(), 200);
        if i >= WARMUP {
            times.push(t.elapsed());
        }
    }
    let raw_batch = stats(times);

    let one = json!({"sensor_id": "BENCH_Z_001"});
    let tool = measure(RUNS, || {
        let (service, one) = (&service, one.clone());
        async move {
            let e = service.call("get_sensor_reading", one).await.unwrap();
            assert!(e.ok, "{:?}", e.error);
        }
    })
    .await;

    let ids: Vec<String> = (1..=100).map(|i| format!("BENCH_Z_{i:03}")).collect();
    let batch_args = json!({ "sensor_ids": ids });
    // Checked once, outside the timed loop: every sensor comes back, with its value.
    let e = service.call("get_sensor_readings", batch_args.clone()).await.unwrap();
    let readings = e.json()["readings"].as_array().cloned().unwrap_or_default();
    assert_eq!(readings.len(), 100);
    for (i, r) in readings.iter().enumerate() {
        assert_eq!(r["value"].as_f64(), Some((i + 1) as f64 * 0.5));
    }
    let batch = measure(RUNS / 5, || {
        let (service, args) = (&service, batch_args.clone());
        async move {
            let e = service.call("get_sensor_readings", args).await.unwrap();
            assert!(e.ok && e.meta.attempts == 1);
        }
    })
    .await;
    let cached_args = json!({ "sensor_ids": ids, "max_age_ms": 3_600_000 });
    let cached = measure(RUNS / 5, || {
        let (service, args) = (&service, cached_args.clone());
        async move {
            let e = service.call("get_sensor_readings", args).await.unwrap();
            assert_eq!(e.meta.attempts, 0);
        }
    })
    .await;
    if let Some(which) = std::env::var_os("BENCH_PROFILE") {
        // For `perf record`: the batch alone, answered from the cache (`cached`) or read live.
        let args = if which == "cached" { &cached_args } else { &batch_args };
        measure(50_000, || {
            let (service, args) = (&service, args.clone());
            async move {
                assert!(service.call("get_sensor_readings", args).await.unwrap().ok);
            }
        })
        .await;
        return;
    }
    let one_each: Vec<_> = ids.iter().map(|id| json!({ "sensor_id": id })).collect();
    let singles = measure(RUNS / 50, || {
        let (service, calls) = (&service, one_each.clone());
        async move {
            for args in calls {
                let e = service.call("get_sensor_reading", args).await.unwrap();
                assert!(e.ok);
            }
        }
    })
    .await;

    println!("modbus read path, loopback, {RUNS} runs after {WARMUP} warm-up (release build)");
    println!("{:<44} {:>10} {:>10}", "", "median µs", "p99 µs");
    println!("{:<44} {:>10.1} {:>10.1}", "raw tokio-modbus read (2 registers)", us(raw.median), us(raw.p99));
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "get_sensor_reading, in process, live",
        us(tool.median),
        us(tool.p99)
    );
    let overhead = us(tool.median) - us(raw.median);
    println!(
        "{:<44} {:>10.1} {:>10.1}   target ≤ 20 µs median: {}",
        "tool overhead (difference)",
        overhead,
        us(tool.p99) - us(raw.p99),
        if overhead <= 20.0 { "met" } else { "NOT met" }
    );
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "raw tokio-modbus, the batch's 2 reads",
        us(raw_batch.median),
        us(raw_batch.p99)
    );
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "get_sensor_readings, 100 sensors (2 reads)",
        us(batch.median),
        us(batch.p99)
    );
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "get_sensor_readings, 100 sensors, all cached",
        us(cached.median),
        us(cached.p99)
    );
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "100 x get_sensor_reading, one after another",
        us(singles.median),
        us(singles.p99)
    );
    let ratio = batch.median.as_secs_f64() / tool.median.as_secs_f64();
    println!(
        "batch / one single read: {ratio:.2}x (target < 3x: {}); 100 singles / batch: {:.1}x",
        if ratio < 3.0 { "met" } else { "NOT met" },
        singles.median.as_secs_f64() / batch.median.as_secs_f64()
    );
    // What the target leaves the service: the batch's own raw reads already take a share of
    // the 3x, and what remains is spread over 100 sensors.
    let per_sensor_ns = (us(batch.median) - us(raw_batch.median) - overhead) * 10.0;
    let allowed_ns = (3.0 * us(tool.median) - us(raw_batch.median) - overhead) * 10.0;
    println!(
        "batch over its raw reads, beyond one call's overhead: {per_sensor_ns:.0} ns per sensor (3x allows {allowed_ns:.0})"
    );
    opcua_figures(&service, &sim.opcua_urls()["bench-ua"]).await;
    sim.shutdown().await;
}

/// The same figures over OPC UA: async-opcua's own `Read` (baseline) next to the tools.
async fn opcua_figures(service: &ToolService, url: &str) {
    use opcua::client::{ClientBuilder, IdentityToken};
    use opcua::types::{
        AttributeId, EndpointDescription, MessageSecurityMode, NodeId, ReadValueId, TimestampsToReturn,
        UserTokenPolicy,
    };
    let mut client = ClientBuilder::new()
        .application_name("bench")
        .application_uri("urn:bench")
        .create_sample_keypair(false)
        .pki_dir(std::env::temp_dir().join("fieldgate-bench-pki"))
        .session_retry_limit(0)
        .client()
        .unwrap();
    let endpoint: EndpointDescription =
        (url, "None", MessageSecurityMode::None, UserTokenPolicy::anonymous()).into();
    let (session, event_loop) =
        client.connect_to_matching_endpoint(endpoint, IdentityToken::Anonymous).await.unwrap();
    let handle = event_loop.spawn();
    assert!(session.wait_for_connection().await);
    let node = |i: usize| ReadValueId {
        node_id: NodeId::new(2, format!("Bench.S{i:03}")),
        attribute_id: AttributeId::Value as u32,
        ..Default::default()
    };
    let one_node = vec![node(1)];
    let all_nodes: Vec<ReadValueId> = (1..=100).map(node).collect();
    let raw = measure(RUNS, || {
        let (session, nodes) = (&session, &one_node);
        async move {
            let v = session.read(nodes, TimestampsToReturn::Both, 0.0).await.unwrap();
            assert!(v[0].status.is_none_or(|s| s.is_good()));
        }
    })
    .await;
    let raw_batch = measure(RUNS / 5, || {
        let (session, nodes) = (&session, &all_nodes);
        async move {
            let v = session.read(nodes, TimestampsToReturn::Both, 0.0).await.unwrap();
            assert_eq!(v.len(), 100);
        }
    })
    .await;
    let one = json!({"sensor_id": "BENCH_UA_001"});
    let tool = measure(RUNS, || {
        let (service, one) = (service, one.clone());
        async move {
            let e = service.call("get_sensor_reading", one).await.unwrap();
            assert!(e.ok);
        }
    })
    .await;
    let ids: Vec<String> = (1..=100).map(|i| format!("BENCH_UA_{i:03}")).collect();
    let args = json!({ "sensor_ids": ids });
    let e = service.call("get_sensor_readings", args.clone()).await.unwrap();
    let readings = e.json()["readings"].as_array().cloned().unwrap_or_default();
    assert_eq!(readings.len(), 100);
    for (i, r) in readings.iter().enumerate() {
        assert_eq!(r["value"].as_f64(), Some((i + 1) as f64 * 0.25));
    }
    let batch = measure(RUNS / 5, || {
        let (service, args) = (service, args.clone());
        async move {
            let e = service.call("get_sensor_readings", args).await.unwrap();
            assert!(e.ok && e.meta.attempts == 1);
        }
    })
    .await;
    let _ = session.disconnect().await;
    handle.abort();

    println!();
    println!("opc ua read path, loopback, security None, same run");
    println!("{:<44} {:>10} {:>10}", "", "median µs", "p99 µs");
    for (name, s) in [
        ("raw async-opcua Read, 1 node", &raw),
        ("get_sensor_reading, in process, live", &tool),
        ("raw async-opcua Read, 100 nodes", &raw_batch),
        ("get_sensor_readings, 100 sensors (1 Read)", &batch),
    ] {
        println!("{:<44} {:>10.1} {:>10.1}", name, us(s.median), us(s.p99));
    }
    println!(
        "tool overhead over async-opcua: {:.1} µs single, {:.1} µs batch; batch / single: {:.2}x",
        us(tool.median) - us(raw.median),
        us(batch.median) - us(raw_batch.median),
        batch.median.as_secs_f64() / tool.median.as_secs_f64()
    );
    println!("for scale (issue 8): Python asyncua 411 µs single, 3.8 ms per 100-node batch");
}
