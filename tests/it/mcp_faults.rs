//! Malformed MCP input, over stdio (the real `fieldgate mcp`) and over HTTP (`/mcp` on a
//! real socket): every message is answered per JSON-RPC 2.0, with the exact error code and
//! id, and the server goes on serving.

use std::process::Stdio;
use std::time::Duration;

use fieldgate::transport::auth::Tokens;
use fieldgate::transport::client::HttpClient;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::support::*;

/// Every malformed message of the issue, and the answer it gets: (what, bytes, code, id
/// as raw JSON). The same list is sent over stdio (one line each) and HTTP (one body each).
fn malformed() -> Vec<(&'static str, Vec<u8>, i64, String)> {
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{{"name":"list_sensors","arguments":{{"zone":{}1{}}}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let digits = "7".repeat(400);
    vec![
        ("invalid JSON", br#"{"jsonrpc":"2.0","id":1,"method":"ping""#.to_vec(), -32700, "null".into()),
        (
            "invalid UTF-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"p\xff\xfeng\"}".to_vec(),
            -32700,
            "null".into(),
        ),
        (
            "a NUL byte",
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"pi\0ng\"}".to_vec(),
            -32700,
            "null".into(),
        ),
        (
            "two messages on one line",
            br#"{"jsonrpc":"2.0","id":4,"method":"ping"}{"jsonrpc":"2.0","id":44,"method":"ping"}"#.to_vec(),
            -32700,
            "null".into(),
        ),
        ("10,000-deep nesting", deep.into_bytes(), -32600, "5".into()),
        (
            "an id with 400 digits",
            format!(r#"{{"jsonrpc":"2.0","id":{digits},"method":"ping"}}"#).into_bytes(),
            -32600,
            digits,
        ),
        (
            "a method that is not a string",
            br#"{"jsonrpc":"2.0","id":"m","method":42}"#.to_vec(),
            -32600,
            "\"m\"".into(),
        ),
        ("jsonrpc 1.0", br#"{"jsonrpc":"1.0","id":8,"method":"ping"}"#.to_vec(), -32600, "8".into()),
        (
            "params that are not an object",
            br#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":[1]}"#.to_vec(),
            -32600,
            "9".into(),
        ),
        (
            "an id that is an object",
            br#"{"jsonrpc":"2.0","id":{"n":1},"method":"ping"}"#.to_vec(),
            -32600,
            "null".into(),
        ),
        ("a batch", br#"[{"jsonrpc":"2.0","id":10,"method":"ping"}]"#.to_vec(), -32600, "null".into()),
        ("a JSON value that is not a message", b"12".to_vec(), -32600, "null".into()),
        ("neither request nor response", br#"{"jsonrpc":"2.0","id":11}"#.to_vec(), -32600, "11".into()),
    ]
}

/// The raw `"id":...` member of an answer line, and its error code (the id may be a
/// number no JSON parser here can hold).
fn code_and_raw_id(line: &str) -> (i64, String) {
    let id_start = line.find("\"id\":").expect("an id member") + 5;
    let id_end = line[id_start..].find(",\"error\"").map(|i| id_start + i).expect("id before error");
    let code = line
        .split("\"code\":")
        .nth(1)
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|c| c.trim().parse().ok())
        .expect("an error code");
    (code, line[id_start..id_end].to_string())
}

struct StdioMcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    _data: tempfile::TempDir,
    _devices: (tempfile::TempDir, ClosedPort),
}

impl StdioMcp {
    /// `fieldgate mcp` on the demo devices (every endpoint at a closed port), with nothing
    /// from the test's environment.
    fn spawn() -> StdioMcp {
        let data = tempfile::tempdir().unwrap();
        let closed = ClosedPort::new();
        let devices = demo_devices_unreachable(&closed);
        let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .args(["mcp", "--devices", devices.path().to_str().unwrap()])
            .env_clear()
            .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
            .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
            .env("FIELDGATE_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        StdioMcp { child, stdin, lines, _data: data, _devices: (devices, closed) }
    }

    async fn send_line(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
    }

    async fn next_line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("an answer, never silence")
            .unwrap()
            .expect("stdout stays open")
    }

    /// Closes stdin; the exit status and stderr.
    async fn finish(mut self) -> (std::process::ExitStatus, String) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.unwrap().unwrap();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).await.unwrap();
        (status, err)
    }
}

#[tokio::test]
async fn stdio_answers_every_malformed_message_and_keeps_serving() {
    let mut mcp = StdioMcp::spawn();
    for (what, bytes, code, id) in malformed() {
        mcp.send_line(&bytes).await;
        let line = mcp.next_line().await;
        assert_eq!(code_and_raw_id(&line), (code, id), "{what}: {line}");
    }
    // An oversized line (server.max_body_bytes, 64 KiB) is refused without being read.
    let big =
        format!(r#"{{"jsonrpc":"2.0","id":12,"method":"ping","params":{{"x":"{}"}}}}"#, "x".repeat(70_000));
    mcp.send_line(big.as_bytes()).await;
    assert_eq!(code_and_raw_id(&mcp.next_line().await), (-32600, "null".into()), "oversized");
    // A malformed notification gets no answer (JSON-RPC never answers notifications), a
    // blank line is nothing: the next line out answers the next request.
    mcp.send_line(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{}}}"#).await;
    mcp.send_line(b"   ").await;
    mcp.send_line(br#"{"jsonrpc":"2.0","id":"after","method":"ping"}"#).await;
    let v: Value = serde_json::from_str(&mcp.next_line().await).unwrap();
    assert_eq!(v, json!({"jsonrpc": "2.0", "id": "after", "result": {}}));
    // And the session proper still works.
    let init = json!({"jsonrpc": "2.0", "id": 20, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    mcp.send_line(&serde_json::to_vec(&init).unwrap()).await;
    let v: Value = serde_json::from_str(&mcp.next_line().await).unwrap();
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18", "{v}");
    mcp.send_line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
    mcp.send_line(br#"{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"list_sensors","arguments":{"zone":"UTIL","limit":1}}}"#)
        .await;
    let v: Value = serde_json::from_str(&mcp.next_line().await).unwrap();
    assert_eq!((&v["id"], &v["result"]["isError"]), (&json!(21), &json!(false)), "{v}");
    let (status, err) = mcp.finish().await;
    assert!(status.success(), "{err}");
    // Each refusal is logged on stderr.
    assert!(err.matches("MCP message refused").count() >= malformed().len(), "{err}");
}

#[tokio::test]
async fn stdio_garbage_only_exits_non_zero_and_says_why() {
    let mut mcp = StdioMcp::spawn();
    mcp.send_line(b"GET / HTTP/1.1").await;
    let line = mcp.next_line().await;
    assert_eq!(code_and_raw_id(&line), (-32700, "null".into()), "{line}");
    // A last line without its newline is still answered.
    mcp.stdin.as_mut().unwrap().write_all(b"\x00\x01garbage").await.unwrap();
    drop(mcp.stdin.take());
    let line = mcp.next_line().await;
    assert_eq!(code_and_raw_id(&line), (-32700, "null".into()), "{line}");
    let (status, err) = mcp.finish().await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("the peer never spoke MCP: 2 message(s) refused"), "{err}");
    assert!(err.contains("MCP message refused"), "{err}");
}

#[tokio::test]
async fn stdio_without_any_input_exits_0() {
    let (status, err) = StdioMcp::spawn().finish().await;
    assert!(status.success(), "{err}");
}

const ACCEPT: (&str, &str) = ("accept", "application/json, text/event-stream");

/// POST /mcp with `body` and extra headers; status, content type and JSON body.
async fn post(c: &mut HttpClient, headers: &[(&str, &str)], body: &[u8]) -> (u16, String, Value, String) {
    let mut all = vec![ACCEPT];
    all.extend_from_slice(headers);
    let r = c.send("POST", "/mcp", &all, body).await.unwrap();
    let text = String::from_utf8_lossy(&r.body).to_string();
    let v = serde_json::from_str(&text).unwrap_or(Value::Null);
    (r.status, r.header("content-type").unwrap_or("").to_string(), v, text)
}

/// POST /mcp declared `text/plain` (the client of `support` always declares JSON).
async fn post_as_text(addr: std::net::SocketAddr, body: &[u8]) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\naccept: application/json, text/event-stream\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&answer);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn http_answers_malformed_messages_with_json_rpc_errors() {
    let server = Server::start(service(), Tokens::default()).await;
    let mut c = server.client().await;
    for (what, bytes, code, id) in malformed() {
        let (status, ctype, _, text) = post(&mut c, &[], &bytes).await;
        assert_eq!(status, 400, "{what}: {text}");
        assert_eq!(ctype, "application/json", "{what}");
        assert_eq!(code_and_raw_id(&text), (code, id), "{what}: {text}");
    }
    // A body that is not declared JSON, or a client that cannot take the answers.
    let ping = br#"{"jsonrpc":"2.0","id":30,"method":"ping"}"#;
    let (status, v) = post_as_text(server.addr, ping).await;
    assert_eq!((status, &v["error"]["code"], &v["id"]), (415, &json!(-32600), &json!(30)), "{v}");
    let r = c.send("POST", "/mcp", &[("accept", "application/json")], ping).await.unwrap();
    assert_eq!(r.status, 406);
    assert_eq!((r.json()["error"]["code"].clone(), r.json()["id"].clone()), (json!(-32600), json!(30)));
    // A request of the session protocols without a session, and with one that does not exist.
    let (status, _, v, _) = post(&mut c, &[], ping).await;
    assert_eq!((status, &v["error"]["code"], &v["id"]), (400, &json!(-32600), &json!(30)), "{v}");
    let (status, _, v, _) = post(&mut c, &[("mcp-session-id", "no-such-session")], ping).await;
    assert_eq!((status, &v["error"]["code"], &v["id"]), (404, &json!(-32001), &json!(30)), "{v}");
    // Other methods on /mcp.
    let r = c.send("PUT", "/mcp", &[], b"").await.unwrap();
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, POST, DELETE")));
    assert_eq!(r.json()["error"]["code"], -32600);
    let r = c.send("GET", "/mcp", &[("accept", "application/json")], b"").await.unwrap();
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (406, json!(-32600)));
    // No stream without a session: 405, as Streamable HTTP lets a server say.
    let r = c.send("GET", "/mcp", &[("accept", "text/event-stream")], b"").await.unwrap();
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (405, json!(-32600)));
    let r = c.send("DELETE", "/mcp", &[], b"").await.unwrap();
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (400, json!(-32600)));
    // A method we serve with malformed params: invalid params, with its id, and no session.
    let bad_init = br#"{"jsonrpc":"2.0","id":31,"method":"initialize","params":{"protocolVersion":5}}"#;
    let r = c.send("POST", "/mcp", &[ACCEPT], bad_init).await.unwrap();
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/json")));
    assert_eq!((r.json()["error"]["code"].clone(), r.json()["id"].clone()), (json!(-32602), json!(31)));
    assert!(r.header("mcp-session-id").is_none());
    // And the server goes on serving.
    let (status, _, v, _) = post(
        &mut c,
        &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")],
        br#"{"jsonrpc":"2.0","id":32,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
    )
    .await;
    assert_eq!((status, &v["id"]), (200, &json!(32)), "{v}");
    assert_eq!(v["result"]["tools"].as_array().map(Vec::len), Some(11));
}

#[tokio::test]
async fn http_deleting_a_session_twice_is_404_the_second_time() {
    let server = Server::start(service(), Tokens::default()).await;
    let mut c = server.client().await;
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let r = c.send("POST", "/mcp", &[ACCEPT], init).await.unwrap();
    assert_eq!(r.status, 200);
    let sid = r.header("mcp-session-id").unwrap().to_string();
    let r = c.send("DELETE", "/mcp", &[("mcp-session-id", &sid)], b"").await.unwrap();
    assert_eq!(r.status, 202);
    let r = c.send("DELETE", "/mcp", &[("mcp-session-id", &sid)], b"").await.unwrap();
    assert_eq!(r.status, 404);
    assert_eq!((r.json()["error"]["code"].clone(), r.json()["id"].clone()), (json!(-32001), Value::Null));
    let (status, _, v, _) =
        post(&mut c, &[("mcp-session-id", &sid)], br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
    assert_eq!((status, &v["error"]["code"], &v["id"]), (404, &json!(-32001), &json!(2)), "{v}");
}
