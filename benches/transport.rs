//! Transport throughput and latency, against the simulator in the same run.
//!
//! `cargo bench --bench transport` prints: `get_sensor_reading` over HTTP with keep-alive
//! from 16 concurrent clients (calls/s, p50, p99), with `max_age_ms` cache hits and with
//! live reads; the same cache hits as MCP `tools/call` over Streamable HTTP, stateless
//! (2026-07-28) and inside a 2025-06-18 session, each response read to its end, from 16
//! clients and from one client one call at a time, with the ratio to the HTTP API's figure
//! of the same run; MCP stdio call latency (p50, p99) through the real `fieldgate mcp`; and
//! the memory of idle MCP sessions in the real `fieldgate serve` (RSS before and after
//! 5,000 `initialize` requests, the session cap lifted to 10,000).
//! Targets: ≥ 20,000 HTTP calls/s on cache hits (issue 4); MCP stdio p50 ≤ 100 µs (issue 4);
//! MCP over HTTP ≥ 20,000 calls/s in both modes, one client's p50 < 300 µs, within 1.5x of
//! the HTTP API (issue 21); ≤ 20 KB per idle session, < 100 MB after 5,000 opens (issue 16).

use std::net::SocketAddr;
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
/// How long each measured load runs (after its warm-up).
const RUN: Duration = Duration::from_secs(3);
const WARM: Duration = Duration::from_millis(500);

fn pct(v: &mut [Duration], p: usize) -> f64 {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1e6
}

/// What one call is: the HTTP API, or MCP `tools/call` over Streamable HTTP.
#[derive(Clone, Copy, PartialEq)]
enum Wire {
    /// `POST /v1/tools/get_sensor_reading` with this body.
    Api(&'static [u8]),
    /// `POST /mcp`, 2026-07-28: no session, the version in every request.
    Stateless,
    /// `POST /mcp` inside a 2025-06-18 session (`initialize`, then `Mcp-Session-Id`).
    Session,
}

const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");
const CACHED: &[u8] = br#"{"sensor_id":"A_LINE1_001","max_age_ms":3600000}"#;

/// A connection ready for `wire`: for a session, `initialize` and `notifications/initialized`
/// have been sent on it and the session ID is kept.
struct Caller {
    c: HttpClient,
    session: Option<String>,
    next_id: u64,
}

async fn caller(addr: SocketAddr, wire: Wire) -> Caller {
    let mut c = HttpClient::connect(addr).await.unwrap();
    let mut session = None;
    if wire == Wire::Session {
        let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
        let r = c.send("POST", "/mcp", &[ACCEPT], init).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let id = r.header("mcp-session-id").expect("a session").to_string();
        let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let r = c
            .send(
                "POST",
                "/mcp",
                &[ACCEPT, ("mcp-session-id", &id), ("mcp-protocol-version", "2025-06-18")],
                note,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
        session = Some(id);
    }
    Caller { c, session, next_id: 1 }
}

/// One call, its response read to the end (an SSE stream until it closes).
async fn one_call(k: &mut Caller, wire: Wire) {
    let id = k.next_id;
    k.next_id += 1;
    let r = match wire {
        Wire::Api(body) => {
            let r = k.c.post("/v1/tools/get_sensor_reading", body).await.unwrap();
            assert_eq!(r.status, 200);
            return;
        }
        Wire::Stateless => {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}},"name":"get_sensor_reading","arguments":{{"sensor_id":"A_LINE1_001","max_age_ms":3600000}}}}}}"#
            );
            let headers = [
                ACCEPT,
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "get_sensor_reading"),
            ];
            k.c.send("POST", "/mcp", &headers, body.as_bytes()).await.unwrap()
        }
        Wire::Session => {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"get_sensor_reading","arguments":{{"sensor_id":"A_LINE1_001","max_age_ms":3600000}}}}}}"#
            );
            let session = k.session.clone().unwrap_or_default();
            let headers =
                [ACCEPT, ("mcp-session-id", session.as_str()), ("mcp-protocol-version", "2025-06-18")];
            k.c.send("POST", "/mcp", &headers, body.as_bytes()).await.unwrap()
        }
    };
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains(r#""isError":false"#) && text.contains(&format!(r#""id":{id}"#)), "{text}");
}

/// `clients` connections calling in a loop for `RUN` after `WARM`: calls/s, p50, p99 (µs).
async fn load(addr: SocketAddr, wire: Wire, clients: usize) -> (f64, f64, f64) {
    let begin = Instant::now() + WARM;
    let end = begin + RUN;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut k = caller(addr, wire).await;
            let mut times = Vec::with_capacity(100_000);
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                one_call(&mut k, wire).await;
                if t >= begin {
                    times.push(t.elapsed());
                }
            }
            times
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let rate = all.len() as f64 / RUN.as_secs_f64();
    (rate, pct(&mut all, 50), pct(&mut all, 99))
}

/// Resident memory of a process, from `/proc/PID/status` (bytes).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The real `fieldgate serve` (mimalloc, as deployed): RSS before and after `opens`
/// `initialize` requests from 16 clients, the sessions left open and idle.
async fn idle_sessions(devices_dir: &std::path::Path, opens: usize) -> (u64, u64, usize) {
    let data = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices", devices_dir.to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000")
        .env("FIELDGATE_SERVER_MCP_MAX_SESSIONS", "10000")
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("fieldgate serve starts")
            .unwrap()
            .expect("fieldgate serve prints its address");
        if let Some(rest) = line.strip_prefix("fieldgate listening on http://") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    // Drain stderr so the child never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    // Settle: one open and one call, so lazily built state exists before the baseline.
    drop(caller(addr, Wire::Session).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss(pid);
    let opened = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let opened = opened.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#;
            for _ in (i..opens).step_by(CLIENTS) {
                let r = c.send("POST", "/mcp", &[ACCEPT], init).await.unwrap();
                if r.status == 200 && r.header("mcp-session-id").is_some() {
                    opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss(pid);
    let _ = child.kill().await;
    (before, after, opened.load(std::sync::atomic::Ordering::Relaxed))
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
    let timeouts = http::Timeouts { header: Duration::from_secs(30), grace: Duration::from_secs(1) };
    fieldgate::app::serve_http(listener, &tools, Arc::new(Tokens::default()), timeouts, &stop, None);

    // Warm the cache and the connection to the device.
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(
        c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap().status,
        200
    );

    let (cached_rate, cached_p50, cached_p99) = load(addr, Wire::Api(CACHED), CLIENTS).await;
    let (live_rate, live_p50, live_p99) =
        load(addr, Wire::Api(br#"{"sensor_id":"A_LINE1_001"}"#), CLIENTS).await;
    let (_, api_one_p50, _) = load(addr, Wire::Api(CACHED), 1).await;
    let (sl_rate, sl_p50, sl_p99) = load(addr, Wire::Stateless, CLIENTS).await;
    let (_, sl_one_p50, _) = load(addr, Wire::Stateless, 1).await;
    let (se_rate, se_p50, se_p99) = load(addr, Wire::Session, CLIENTS).await;
    let (_, se_one_p50, _) = load(addr, Wire::Session, 1).await;

    // MCP over stdio through the real binary (release build when run by cargo bench).
    let bin = env!("CARGO_BIN_EXE_fieldgate");
    let mcp_data = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(bin)
        .args(["mcp", "--devices", devices_dir.to_str().unwrap()])
        .env("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000")
        .env("FIELDGATE_STORAGE_DATA_DIR", mcp_data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
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
    println!("{:<60} {:>10} {:>9} {:>9}", "", "calls/s", "p50 µs", "p99 µs");
    let row = |name: &str, rate: f64, p50: f64, p99: f64| {
        println!("{name:<60} {rate:>10.0} {p50:>9.1} {p99:>9.1}");
    };
    row("HTTP get_sensor_reading, max_age_ms cache hits", cached_rate, cached_p50, cached_p99);
    row("HTTP get_sensor_reading, live (16 share reads)", live_rate, live_p50, live_p99);
    row("MCP HTTP tools/call, cache hits, stateless 2026-07-28", sl_rate, sl_p50, sl_p99);
    row("MCP HTTP tools/call, cache hits, 2025-06-18 session", se_rate, se_p50, se_p99);
    println!("{:<60} {:>10} {:>9}", "one client, one call at a time, cache hits:", "", "p50 µs");
    println!("{:<60} {:>10} {:>9.1}", "  HTTP API", "", api_one_p50);
    println!("{:<60} {:>10} {:>9.1}", "  MCP HTTP stateless", "", sl_one_p50);
    println!("{:<60} {:>10} {:>9.1}", "  MCP HTTP session", "", se_one_p50);
    println!(
        "HTTP API calls/s over MCP calls/s (same run): stateless {:.2}x, session {:.2}x (aim ≤ 1.5x)",
        cached_rate / sl_rate,
        cached_rate / se_rate
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
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "targets: HTTP cache hits ≥ 20,000 calls/s: {}; MCP stdio p50 ≤ 100 µs: {}",
        met(cached_rate >= 20_000.0),
        met(p50 <= 100.0)
    );
    println!(
        "targets (issue 21): MCP HTTP ≥ 20,000 calls/s stateless: {}, session: {}; one client p50 < 300 µs stateless: {}, session: {}",
        met(sl_rate >= 20_000.0),
        met(se_rate >= 20_000.0),
        met(sl_one_p50 < 300.0),
        met(se_one_p50 < 300.0)
    );
    println!(
        "for scale (issue 4): the official Python MCP SDK server, 1,174 calls/s over HTTP, 0.3-2 ms per stdio call"
    );
    stop.cancel();
    sim.shutdown().await;

    const OPENS: usize = 5000;
    let (before, after, opened) = idle_sessions(&devices_dir, OPENS).await;
    let per = after.saturating_sub(before) as f64 / opened.max(1) as f64;
    println!(
        "idle MCP sessions, real `fieldgate serve`: RSS {:.1} MB before, {:.1} MB after {OPENS} initialize requests ({opened} sessions open): {:.1} KB per session",
        before as f64 / 1e6,
        after as f64 / 1e6,
        per / 1024.0
    );
    println!(
        "targets (issue 16): ≤ 20 KB per idle session: {}; RSS < 100 MB after {OPENS} opens: {}",
        met(per <= 20.0 * 1024.0),
        met(after < 100_000_000)
    );
}
