//! MCP through the real binary: `fieldgate mcp` over stdin/stdout, with the `initialize`
//! lifecycle and with `server/discover` and stateless requests (2026-07-28).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use fieldgate::transport::client::HttpClient;

use super::support::*;

struct McpChild {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Responses read while waiting for another id.
    pending: HashMap<String, Value>,
    _data: tempfile::TempDir,
    /// The demo's device files with every endpoint at a closed port (the poller reaches
    /// nobody's device), and that port.
    _devices: (tempfile::TempDir, ClosedPort),
}

impl McpChild {
    fn spawn() -> McpChild {
        // Hermetic: its own data directory and device files, an HTTP listener on a free
        // port, nothing of the test's environment.
        let data = tempfile::tempdir().unwrap();
        let closed = ClosedPort::new();
        let devices = demo_devices_unreachable(&closed);
        let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .arg("mcp")
            .arg("--devices")
            .arg(devices.path())
            .env_clear()
            .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
            .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
            .env("FIELDGATE_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        McpChild { child, stdin, lines, pending: HashMap::new(), _data: data, _devices: (devices, closed) }
    }

    async fn send(&mut self, msg: Value) {
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
    }

    /// The response to request `id`. Every line on stdout must be a JSON-RPC message.
    async fn response(&mut self, id: Value) -> Value {
        let key = id.to_string();
        loop {
            if let Some(v) = self.pending.remove(&key) {
                return v;
            }
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("an answer, never silence")
                .unwrap()
                .expect("stdout stays open");
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|_| panic!("stdout carries only MCP: {line}"));
            assert_eq!(v["jsonrpc"], "2.0", "{line}");
            self.pending.insert(v["id"].to_string(), v);
        }
    }

    async fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        self.response(id).await
    }

    async fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.unwrap().unwrap();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            use tokio::io::AsyncReadExt;
            let _ = e.read_to_string(&mut err).await;
        }
        // Logs went to stderr: one event per tool call.
        assert!(err.contains("tool call"), "{err}");
        status
    }
}

/// The checks both lifecycles share, once the session is usable. `meta` is added to
/// every request's params (empty for an initialized session).
async fn exercise(mcp: &mut McpChild, meta: Value) {
    let with = |mut p: Value| {
        if let (Some(o), Some(m)) = (p.as_object_mut(), meta.as_object())
            && !m.is_empty()
        {
            o.insert("_meta".into(), Value::Object(m.clone()));
        }
        p
    };
    let list = mcp.request(json!(10), "tools/list", with(json!({}))).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 11);
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert_eq!(t["outputSchema"]["type"], "object", "{t}");
        assert_eq!(t["annotations"]["readOnlyHint"], t["name"] != "create_work_order", "{t}");
        assert!(t["annotations"]["openWorldHint"].is_boolean());
        assert!(t["description"].as_str().unwrap().contains("Do not use"));
    }

    // Success: structuredContent is the envelope, the text block the same JSON.
    let r = mcp
        .request(
            json!(11),
            "tools/call",
            with(json!({"name": "list_sensors", "arguments": {"zone": "UTIL", "limit": 2}})),
        )
        .await;
    let result = &r["result"];
    assert_eq!(result["isError"], false, "{r}");
    assert_eq!(result["structuredContent"]["ok"], true);
    assert_eq!(result["structuredContent"]["data"]["total"], 9);
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, result["structuredContent"]);

    // An argument error is a tool result with isError, not a JSON-RPC error.
    let r = mcp
        .request(
            json!(12),
            "tools/call",
            with(json!({"name": "get_sensor_reading", "arguments": {"sensor_id": "a_line1_001"}})),
        )
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(r["result"]["structuredContent"]["error"]["code"], "INVALID_ARGUMENT");
    assert_eq!(r["result"]["structuredContent"]["error"]["suggestions"][0], "A_LINE1_001");
    let r = mcp
        .request(
            json!(13),
            "tools/call",
            with(json!({"name": "list_sensors", "arguments": {"limit": "150"}})),
        )
        .await;
    assert_eq!(r["result"]["structuredContent"]["error"]["expected"], "integer");

    // Unknown tool and non-object arguments: JSON-RPC errors.
    let r = mcp.request(json!(14), "tools/call", with(json!({"name": "make_coffee", "arguments": {}}))).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = mcp
        .request(json!(15), "tools/call", with(json!({"name": "list_sensors", "arguments": [1, 2]})))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // A method nobody handles is answered at once.
    let r = mcp.request(json!(16), "resources/templates/nothing", with(json!({}))).await;
    assert_eq!(r["error"]["code"], -32601, "{r}");
}

#[tokio::test]
async fn stdio_with_initialize() {
    let mut mcp = McpChild::spawn();
    // Request id 0 is a valid id.
    let init = mcp
        .request(
            json!(0),
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
        )
        .await;
    assert_eq!(init["id"], 0);
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(init["result"]["serverInfo"]["name"], "fieldgate");
    mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    exercise(&mut mcp, json!({})).await;
    assert!(mcp.close().await.success());
}

#[tokio::test]
async fn stdio_with_server_discover_and_stateless_requests() {
    let mut mcp = McpChild::spawn();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let d = mcp.request(json!(0), "server/discover", json!({ "_meta": meta })).await;
    let versions: Vec<&str> =
        d["result"]["supportedVersions"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(versions, ["2025-06-18", "2025-11-25", "2026-07-28"], "{d}");
    assert_eq!(d["result"]["capabilities"], json!({"tools": {}}), "{d}");
    assert!(
        d["result"]["instructions"].as_str().unwrap().starts_with("fieldgate reads plant sensors"),
        "{d}"
    );
    exercise(&mut mcp, meta).await;
    assert!(mcp.close().await.success());
}

#[tokio::test]
async fn a_client_that_only_probes_and_leaves_is_not_an_error() {
    let mut mcp = McpChild::spawn();
    let r = mcp
        .request(
            json!(1),
            "server/discover",
            json!({"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }}),
        )
        .await;
    // The answer to this probe, not just any object: the request's id, the versions, and
    // the server named.
    assert_eq!(r["id"], 1, "{r}");
    assert_eq!(r["result"]["supportedVersions"], json!(["2025-06-18", "2025-11-25", "2026-07-28"]), "{r}");
    assert_eq!(r["result"]["capabilities"], json!({"tools": {}}), "{r}");
    assert_eq!(r["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "fieldgate", "{r}");
    drop(mcp.stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), mcp.child.wait()).await.unwrap().unwrap();
    assert!(status.success());
}

// ---- Streamable HTTP at /mcp, through a real socket ----

const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");

fn init_body(id: u64, version: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
    .unwrap()
}

/// `initialize` on `c`: the session ID and the negotiated version.
async fn open_session(c: &mut HttpClient, version: &str) -> (String, String) {
    let r = c.send("POST", "/mcp", &[ACCEPT], &init_body(1, version)).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let event = one_event(&r);
    (
        r.header("mcp-session-id").expect("a session").to_string(),
        event["result"]["protocolVersion"].to_string(),
    )
}

/// The one event of a response inside a session: a body of known length, ending with
/// the event (nothing to wait for after it).
fn one_event(r: &fieldgate::transport::client::HttpResponse) -> Value {
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let length: usize = r.header("content-length").expect("a body of known length").parse().unwrap();
    assert_eq!(length, r.body.len());
    let body = String::from_utf8(r.body.clone()).unwrap();
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.len(), 1, "{body}");
    assert!(body.ends_with("\n\n"), "{body}");
    serde_json::from_str(data[0]).unwrap()
}

async fn in_session(c: &mut HttpClient, sid: &str, msg: Value) -> fieldgate::transport::client::HttpResponse {
    let body = serde_json::to_vec(&msg).unwrap();
    c.send("POST", "/mcp", &[ACCEPT, ("mcp-session-id", sid)], &body).await.unwrap()
}

fn service_with(f: impl FnOnce(&mut fieldgate::config::Config)) -> fieldgate::tools::ToolService {
    let mut config = fieldgate::config::Config::default();
    f(&mut config);
    fieldgate::tools::ToolService::new(std::sync::Arc::new(demo_registry()), config)
}

/// A GET event stream of `sid`, read until it ends (bounded): its status line, headers
/// and first bytes are checked, and the stream must end when the session does.
async fn open_stream(addr: std::net::SocketAddr, sid: &str) -> tokio::task::JoinHandle<String> {
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /mcp HTTP/1.1\r\nhost: {addr}\r\naccept: text/event-stream\r\nmcp-session-id: {sid}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // Headers and the opening comment arrive at once.
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains(": open") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    tokio::spawn(async move {
        let mut rest = Vec::new();
        // The chunked body ends with its last chunk; the server keeps the connection.
        while !rest.ends_with(b"0\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("the stream ends with its session")
                .unwrap();
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&rest).to_string()
    })
}

#[tokio::test]
async fn http_session_answers_are_complete_at_once() {
    let server = Server::start(service(), fieldgate::transport::auth::Tokens::default()).await;
    let mut c = server.client().await;
    let (sid, version) = open_session(&mut c, "2025-06-18").await;
    assert_eq!(version, "\"2025-06-18\"");
    let r = in_session(&mut c, &sid, json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    assert_eq!(r.status, 202);
    let r = in_session(&mut c, &sid, json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    assert_eq!(one_event(&r)["result"]["tools"].as_array().map(Vec::len), Some(11));
    // Each answer arrives whole: a body of known length ending with its event, so nothing
    // waits on a timer (the old session streams took 40 ms per call, the client's delayed
    // ACK). `one_event` checks that shape; the time per call is measured by
    // benches/transport.rs (the 2025-06-18 session wire), not asserted here.
    for id in 10..20 {
        let r = in_session(
            &mut c,
            &sid,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "list_sensors", "arguments": {"zone": "UTIL", "limit": 1}}}),
        )
        .await;
        let v = one_event(&r);
        assert_eq!((&v["id"], &v["result"]["isError"]), (&json!(id), &json!(false)), "{v}");
    }
    // Unknown tools stay JSON-RPC errors inside the session.
    let r = in_session(
        &mut c,
        &sid,
        json!({"jsonrpc": "2.0", "id": 30, "method": "tools/call", "params": {"name": "make_coffee", "arguments": {}}}),
    )
    .await;
    assert_eq!(one_event(&r)["error"]["code"], -32602);
    // 2025-11-25 negotiates itself; a stateless call is one JSON body.
    let (_, version) = open_session(&mut c, "2025-11-25").await;
    assert_eq!(version, "\"2025-11-25\"");
    let call = json!({"jsonrpc": "2.0", "id": 40, "method": "tools/call", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}},
        "name": "list_sensors", "arguments": {"limit": 1}}});
    let headers = [
        ACCEPT,
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "list_sensors"),
    ];
    let r = c.send("POST", "/mcp", &headers, &serde_json::to_vec(&call).unwrap()).await.unwrap();
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/json")));
    assert!(r.header("content-length").is_some());
    assert_eq!(r.json()["id"], 40);
    assert!(r.header("mcp-session-id").is_none());
}

#[tokio::test]
async fn http_get_streams_end_with_their_session() {
    let server = Server::start(service(), fieldgate::transport::auth::Tokens::default()).await;
    let mut c = server.client().await;
    let (sid, _) = open_session(&mut c, "2025-06-18").await;
    let stream = open_stream(server.addr, &sid).await;
    // Requests go on while the stream is open.
    let r = in_session(&mut c, &sid, json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).await;
    assert_eq!(one_event(&r), json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
    assert_eq!(c.send("DELETE", "/mcp", &[("mcp-session-id", &sid)], b"").await.unwrap().status, 202);
    let rest = tokio::time::timeout(Duration::from_secs(10), stream).await.unwrap().unwrap();
    assert!(rest.ends_with("0\r\n\r\n"), "{rest:?}");
    let r = c
        .send("GET", "/mcp", &[("accept", "text/event-stream"), ("mcp-session-id", &sid)], b"")
        .await
        .unwrap();
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (404, json!(-32001)));
}

/// Regression (issue 32): 50 concurrent `initialize`s from one token took all 8 sessions
/// and every other token got 503; sessions being opened now count against the share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_opens_from_one_token_leaves_sessions_for_the_others() {
    let env = [
        ("FIELDGATE_TOKEN_A".to_string(), "agent:agent-a-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_OP".to_string(), "operator:operator-token-0123456789".to_string()),
    ];
    let tokens = fieldgate::transport::auth::Tokens::load(None, env).unwrap();
    let server = Server::start(
        service_with(|c| {
            c.server.mcp_max_sessions = 8;
            c.server.rate_limit_per_minute = 10_000;
        }),
        tokens,
    )
    .await;
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..50 {
        let mut c = server.client().await.with_token("agent-a-token-0123456789");
        burst.spawn(async move {
            c.send("POST", "/mcp", &[ACCEPT], &init_body(i, "2025-06-18")).await.unwrap().status
        });
    }
    let statuses = tokio::time::timeout(Duration::from_secs(30), burst.join_all())
        .await
        .expect("50 concurrent initialize requests answered within 30 s");
    let opened = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(opened, 4, "one token gets half of the sessions: {statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 503), "{statuses:?}");
    let mut op = server.client().await.with_token("operator-token-0123456789");
    open_session(&mut op, "2025-06-18").await;
    let m = String::from_utf8(op.get("/metrics").await.unwrap().body).unwrap();
    assert!(m.contains("fieldgate_mcp_sessions 5\n"), "{m}");
    assert!(m.contains("fieldgate_mcp_sessions_refused_total{reason=\"caller_session_limit\"} 46\n"), "{m}");
}

/// Regression (issue 32, helper-3): two agent tokens, each within its half, took every
/// session and the operator got 503; an eighth of the table is kept for operators.
#[tokio::test]
async fn agents_together_leave_sessions_for_operators() {
    let env = [
        ("FIELDGATE_TOKEN_A".to_string(), "agent:agent-a-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_B".to_string(), "agent:agent-b-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_OP".to_string(), "operator:operator-token-0123456789".to_string()),
    ];
    let tokens = fieldgate::transport::auth::Tokens::load(None, env).unwrap();
    let server = Server::start(service_with(|c| c.server.mcp_max_sessions = 8), tokens).await;
    let mut a = server.client().await.with_token("agent-a-token-0123456789");
    let mut b = server.client().await.with_token("agent-b-token-0123456789");
    for _ in 0..4 {
        open_session(&mut a, "2025-06-18").await;
    }
    for _ in 0..3 {
        open_session(&mut b, "2025-06-18").await;
    }
    let r = b.send("POST", "/mcp", &[ACCEPT], &init_body(9, "2025-06-18")).await.unwrap();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(
        (&v["error"]["data"]["reason"], &v["error"]["data"]["max_sessions"]),
        (&json!("agent_session_limit"), &json!(7)),
        "{v}"
    );
    assert!(r.header("retry-after").is_some());
    let mut op = server.client().await.with_token("operator-token-0123456789");
    open_session(&mut op, "2025-06-18").await;
    let m = String::from_utf8(op.get("/metrics").await.unwrap().body).unwrap();
    assert!(m.contains("fieldgate_mcp_sessions 8\n"), "{m}");
    assert!(m.contains("fieldgate_mcp_sessions_refused_total{reason=\"agent_session_limit\"} 1\n"), "{m}");
}

#[tokio::test]
async fn http_sessions_are_capped() {
    let env = [
        ("FIELDGATE_TOKEN_A".to_string(), "agent:agent-a-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_B".to_string(), "agent:agent-b-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_OP".to_string(), "operator:operator-token-0123456789".to_string()),
    ];
    let tokens = fieldgate::transport::auth::Tokens::load(None, env).unwrap();
    let server = Server::start(service_with(|c| c.server.mcp_max_sessions = 4), tokens).await;
    let mut c = server.client().await.with_token("agent-a-token-0123456789");
    let mut other = server.client().await.with_token("agent-b-token-0123456789");
    let (first, _) = open_session(&mut c, "2025-06-18").await;
    open_session(&mut c, "2025-11-25").await;
    // One caller holds at most half of the sessions; another caller still gets one.
    let r = c.send("POST", "/mcp", &[ACCEPT], &init_body(6, "2025-06-18")).await.unwrap();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!((&v["error"]["code"], &v["id"]), (&json!(-32000), &json!(6)), "{v}");
    assert_eq!(
        (&v["error"]["data"]["reason"], &v["error"]["data"]["held"]),
        (&json!("caller_session_limit"), &json!(2))
    );
    assert!(r.header("retry-after").is_some());
    open_session(&mut other, "2025-06-18").await;
    // Agents hold all but the session kept for operators.
    let r = other.send("POST", "/mcp", &[ACCEPT], &init_body(9, "2025-06-18")).await.unwrap();
    assert_eq!(
        r.json()["error"]["data"]["reason"],
        "agent_session_limit",
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let mut op = server.client().await.with_token("operator-token-0123456789");
    open_session(&mut op, "2025-06-18").await;
    // The table is full now.
    let r = op.send("POST", "/mcp", &[ACCEPT], &init_body(7, "2025-06-18")).await.unwrap();
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!((&v["error"]["code"], &v["id"]), (&json!(-32000), &json!(7)), "{v}");
    assert_eq!(v["error"]["data"]["reason"], "session_limit");
    assert_eq!(v["error"]["data"]["max_sessions"], 4);
    assert!(v["error"]["message"].as_str().unwrap().contains("server.mcp_max_sessions"), "{v}");
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=300).contains(&wait), "{wait}");
    assert!(r.header("mcp-session-id").is_none());
    // Stateless requests need no session and are not refused.
    let r = c
        .send(
            "POST",
            "/mcp",
            &[ACCEPT, ("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")],
            br#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // Ending one frees its place.
    assert_eq!(c.send("DELETE", "/mcp", &[("mcp-session-id", &first)], b"").await.unwrap().status, 202);
    open_session(&mut c, "2025-06-18").await;
}

#[tokio::test]
async fn http_session_opening_is_rate_limited_per_caller() {
    let server =
        Server::start(service_with(|c| c.server.rate_limit_per_minute = 3), Default::default()).await;
    let mut c = server.client().await;
    for _ in 0..3 {
        open_session(&mut c, "2025-06-18").await;
    }
    let r = c.send("POST", "/mcp", &[ACCEPT], &init_body(9, "2025-06-18")).await.unwrap();
    assert_eq!(r.status, 429);
    let v = r.json();
    assert_eq!((&v["error"]["code"], &v["id"]), (&json!(-32000), &json!(9)), "{v}");
    assert_eq!(v["error"]["data"]["reason"], "rate_limited");
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&wait), "{wait}");
}

#[tokio::test]
async fn http_idle_sessions_expire_and_used_ones_stay() {
    let server = Server::start(service_with(|c| c.server.mcp_session_idle_s = 2), Default::default()).await;
    let mut c = server.client().await;
    let (sid, _) = open_session(&mut c, "2025-06-18").await;
    let stream = open_stream(server.addr, &sid).await;
    // Used, it answers. (That use keeps a session and idleness ends it at exactly the idle
    // time is held with paused time in transport/mcp/sessions.rs; here, over the wire.)
    let r = in_session(&mut c, &sid, json!({"jsonrpc": "2.0", "id": 100, "method": "ping"})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // Left alone, it expires: its stream ends, its next request gets 404.
    let rest = tokio::time::timeout(Duration::from_secs(30), stream)
        .await
        .expect("the idle session's stream ends")
        .unwrap();
    assert!(rest.ends_with("0\r\n\r\n"), "{rest:?}");
    let r = in_session(&mut c, &sid, json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).await;
    assert_eq!(r.status, 404);
    assert_eq!((r.json()["error"]["code"].clone(), r.json()["id"].clone()), (json!(-32001), json!(1)));
}

#[tokio::test]
async fn http_a_session_belongs_to_its_caller() {
    let env = [
        ("FIELDGATE_TOKEN_A".to_string(), "agent:agent-a-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_B".to_string(), "agent:agent-b-token-0123456789".to_string()),
    ];
    let tokens = fieldgate::transport::auth::Tokens::load(None, env).unwrap();
    let server = Server::start(service(), tokens).await;
    let mut a = server.client().await.with_token("agent-a-token-0123456789");
    let mut b = server.client().await.with_token("agent-b-token-0123456789");
    let (sid, _) = open_session(&mut a, "2025-06-18").await;
    let r = in_session(&mut b, &sid, json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).await;
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (404, json!(-32001)));
    assert_eq!(b.send("DELETE", "/mcp", &[("mcp-session-id", &sid)], b"").await.unwrap().status, 404);
    let r = in_session(&mut a, &sid, json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).await;
    assert_eq!(one_event(&r), json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
}

#[tokio::test]
async fn http_a_cancelled_request_ends_without_an_answer() {
    let plant = demo_plant().await;
    plant.faults("a-line1-plc", fieldgate_sim::Faults { latency_ms: 5000, ..Default::default() });
    let server = Server::start(plant.service.clone(), Default::default()).await;
    let mut c = server.client().await;
    let (sid, _) = open_session(&mut c, "2025-06-18").await;
    let addr = server.addr;
    let sid2 = sid.clone();
    let slow = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        in_session(
            &mut c,
            &sid2,
            json!({"jsonrpc": "2.0", "id": "slow", "method": "tools/call",
                "params": {"name": "get_sensor_reading", "arguments": {"sensor_id": "A_LINE1_001"}}}),
        )
        .await
    });
    // Cancel until the request is gone (it may not have arrived at the first notice).
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}});
    let c = tokio::sync::Mutex::new(c);
    wait_until("the cancelled request to end", Duration::from_secs(30), || async {
        if slow.is_finished() {
            return true;
        }
        assert_eq!(in_session(&mut *c.lock().await, &sid, cancel.clone()).await.status, 202);
        false
    })
    .await;
    let r = slow.await.unwrap();
    // Ended without an answer: had the read run its course (5 s of latency, past the
    // device's timeout) the stream would carry a result or a DEVICE_TIMEOUT.
    assert_eq!((r.status, r.header("content-type")), (200, Some("text/event-stream")));
    assert!(r.body.is_empty(), "{}", String::from_utf8_lossy(&r.body));
}

/// An answer without what differs between two calls (the envelope's call ID and duration).
fn settled(mut v: Value) -> Value {
    fn strip(e: &mut Value) {
        if let Some(meta) = e.get_mut("meta").and_then(Value::as_object_mut) {
            meta.remove("call_id");
            meta.remove("duration_ms");
        }
    }
    if let Some(result) = v.get_mut("result") {
        if let Some(sc) = result.get_mut("structuredContent") {
            strip(sc);
        }
        if let Some(text) = result.pointer_mut("/content/0/text") {
            let mut e: Value = serde_json::from_str(text.as_str().unwrap()).unwrap();
            strip(&mut e);
            *text = Value::String(e.to_string());
        }
    }
    v
}

#[tokio::test]
async fn http_tools_call_answers_as_rmcp_does() {
    // `tools/call` is answered by fieldgate's fast path unless something needs rmcp; a
    // progress token in `_meta` is such a thing. Both answers must be the same.
    let server = Server::start(service(), fieldgate::transport::auth::Tokens::default()).await;
    let mut c = server.client().await;
    let (sid, _) = open_session(&mut c, "2025-11-25").await;
    let calls = [
        json!({"name": "list_sensors", "arguments": {"zone": "UTIL", "limit": 1}}),
        json!({"name": "get_sensor_reading", "arguments": {"sensor_id": "a_line1_001"}}),
        json!({"name": "list_sensors", "arguments": null}),
        json!({"name": "make_coffee", "arguments": {}}),
    ];
    for (i, params) in calls.iter().enumerate() {
        let mut via_rmcp = params.clone();
        via_rmcp["_meta"] = json!({"progressToken": "p"});
        // In a session: one event each.
        let id = json!(format!("s{i}"));
        let fast = in_session(
            &mut c,
            &sid,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
        )
        .await;
        let slow = in_session(
            &mut c,
            &sid,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": via_rmcp}),
        )
        .await;
        assert_eq!(fast.status, slow.status);
        assert_eq!(settled(one_event(&fast)), settled(one_event(&slow)), "{params}");
        // Stateless: one JSON body each.
        let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
        let mut stateless = params.clone();
        stateless["_meta"] = meta.clone();
        let mut stateless_rmcp = params.clone();
        stateless_rmcp["_meta"] = meta;
        stateless_rmcp["_meta"]["progressToken"] = json!("p");
        let name = params["name"].as_str().unwrap();
        let headers = [
            ACCEPT,
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", name),
        ];
        let mut answers = Vec::new();
        for p in [stateless, stateless_rmcp] {
            let body =
                serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": p}))
                    .unwrap();
            let r = c.send("POST", "/mcp", &headers, &body).await.unwrap();
            assert_eq!(r.header("content-type"), Some("application/json"));
            answers.push((r.status, settled(r.json())));
        }
        assert_eq!(answers[0], answers[1], "{params}");
    }
}

/// What MCP echoes of a request (an unknown method's name, a header that does not match the
/// body) carries no hidden character raw (helper-4: both were echoed as sent).
#[tokio::test]
async fn echoed_methods_and_headers_are_escaped() {
    const RAW: [char; 3] = ['\u{202e}', '\u{1b}', '\u{200b}'];
    let server = Server::start(service_with(|_| {}), fieldgate::transport::auth::Tokens::default()).await;
    let mut c = server.client().await;
    let (sid, _) = open_session(&mut c, "2025-06-18").await;
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "a\u{202e}b\u{1b}[31m\u{200b}"}).to_string();
    let r = c.send("POST", "/mcp", &[ACCEPT, ("mcp-session-id", &sid)], body.as_bytes()).await.unwrap();
    let text = String::from_utf8(r.body.clone()).unwrap();
    assert!(text.contains("-32601") && !text.chars().any(|ch| RAW.contains(&ch)), "{text}");
    let stateless = json!({"jsonrpc": "2.0", "id": 3, "method": "x\u{202e}y\u{1b}", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let r = c
        .send(
            "POST",
            "/mcp",
            &[ACCEPT, ("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")],
            stateless.as_bytes(),
        )
        .await
        .unwrap();
    let text = String::from_utf8(r.body.clone()).unwrap();
    assert_eq!(r.status, 400, "{text}");
    assert!(text.contains("does not match") && !text.chars().any(|ch| RAW.contains(&ch)), "{text}");
}
