//! Transport throughput and latency, against the simulator in the same run.
//!
//! `cargo bench --bench transport` prints: `get_sensor_reading` over HTTP with keep-alive
//! from 16 concurrent clients (calls/s, p50, p99), with `max_age_ms` cache hits and with
//! live reads; and MCP stdio call latency (p50, p99) through the real `fieldgate mcp`.
//! Targets (issue 4): ≥ 20,000 HTTP calls/s on cache hits; MCP stdio p50 ≤ 100 µs.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
use fieldgate::transport::auth::Tokens;
use fieldgate::transport::client::HttpClient;
use fieldgate::transport::http;
use fieldgate_sim::{Bind, Scenario, Simulator};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const CLIENTS: usize = 16;

fn pct(v: &mut [Duration], p: usize) -> f64 {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1e6
}

async fn http_load(addr: std::net::SocketAddr, body: &'static [u8], per_client: usize) -> (f64, f64, f64) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            let mut times = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let t = Instant::now();
                let r = c.post("/v1/tools/get_sensor_reading", body).await.unwrap();
                assert_eq!(r.status, 200);
                times.push(t.elapsed());
            }
            times
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    (rate, pct(&mut all, 50), pct(&mut all, 99))
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
    config.server.rate_limit_per_minute = 100_000_000;
    let tools = ToolService::new(Arc::new(registry), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let app = http::app(tools.clone(), Arc::new(Tokens::default()), stop.clone());
    let s = stop.clone();
    tokio::spawn(http::serve(
        listener,
        app,
        async move { s.cancelled().await },
        Duration::from_secs(1),
        stop.clone(),
    ));

    // Warm the cache and the connection to the device.
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(
        c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap().status,
        200
    );
    http_load(addr, br#"{"sensor_id":"A_LINE1_001","max_age_ms":3600000}"#, 200).await;

    let (cached_rate, cached_p50, cached_p99) =
        http_load(addr, br#"{"sensor_id":"A_LINE1_001","max_age_ms":3600000}"#, 2500).await;
    let (live_rate, live_p50, live_p99) = http_load(addr, br#"{"sensor_id":"A_LINE1_001"}"#, 500).await;

    // MCP over stdio through the real binary (release build when run by cargo bench).
    let bin = env!("CARGO_BIN_EXE_fieldgate");
    let mut child = tokio::process::Command::new(bin)
        .args(["mcp", "--devices", devices_dir.to_str().unwrap()])
        .env("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let mut mcp_times = Vec::new();
    for i in 0..2200u32 {
        let msg = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"tools/call\",\"params\":{{{meta},\"name\":\"list_sensors\",\"arguments\":{{\"zone\":\"UTIL\",\"limit\":1}}}}}}\n"
        );
        let t = Instant::now();
        stdin.write_all(msg.as_bytes()).await.unwrap();
        let line = lines.next_line().await.unwrap().unwrap();
        assert!(line.contains("\"isError\":false"), "{line}");
        if i >= 200 {
            mcp_times.push(t.elapsed());
        }
    }
    drop(stdin);
    let _ = child.wait().await;

    // Baseline: the same line round trip through `cat` over the same kind of pipes.
    let mut cat = tokio::process::Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut cat_in = cat.stdin.take().unwrap();
    let mut cat_lines = BufReader::new(cat.stdout.take().unwrap()).lines();
    let mut pipe_times = Vec::new();
    let probe = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{{meta}}}}}\n");
    for i in 0..2200 {
        let t = Instant::now();
        cat_in.write_all(probe.as_bytes()).await.unwrap();
        cat_lines.next_line().await.unwrap().unwrap();
        if i >= 200 {
            pipe_times.push(t.elapsed());
        }
    }
    drop(cat_in);
    let _ = cat.wait().await;

    println!("transports, loopback, {CLIENTS} concurrent keep-alive HTTP clients (release build)");
    println!("{:<52} {:>10} {:>9} {:>9}", "", "calls/s", "p50 µs", "p99 µs");
    println!(
        "{:<52} {:>10.0} {:>9.1} {:>9.1}",
        "HTTP get_sensor_reading, max_age_ms cache hits", cached_rate, cached_p50, cached_p99
    );
    println!(
        "{:<52} {:>10.0} {:>9.1} {:>9.1}",
        "HTTP get_sensor_reading, live (16 share reads)", live_rate, live_p50, live_p99
    );
    let p50 = pct(&mut mcp_times, 50);
    let p99 = pct(&mut mcp_times, 99);
    println!("{:<52} {:>10} {:>9.1} {:>9.1}", "MCP stdio tools/call list_sensors, one client", "", p50, p99);
    let (pipe50, pipe99) = (pct(&mut pipe_times, 50), pct(&mut pipe_times, 99));
    println!(
        "{:<52} {:>10} {:>9.1} {:>9.1}",
        "baseline: the same line through `cat` (pipes only)", "", pipe50, pipe99
    );
    println!("MCP stdio p50 minus the pipe baseline (fieldgate and rmcp): {:.1} µs", p50 - pipe50);
    println!(
        "targets: HTTP cache hits ≥ 20,000 calls/s: {}; MCP stdio p50 ≤ 100 µs: {}",
        if cached_rate >= 20_000.0 { "met" } else { "NOT met" },
        if p50 <= 100.0 { "met" } else { "NOT met" }
    );
    println!(
        "for scale (issue 4): the official Python MCP SDK server, 1,174 calls/s over HTTP, 0.3-2 ms per stdio call"
    );
    stop.cancel();
    sim.shutdown().await;
}
