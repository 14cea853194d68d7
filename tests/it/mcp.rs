//! MCP through the real binary: `fieldgate mcp` over stdin/stdout, with the `initialize`
//! lifecycle and with `server/discover` and stateless requests (2026-07-28).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::support::*;

struct McpChild {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Responses read while waiting for another id.
    pending: HashMap<String, Value>,
}

impl McpChild {
    fn spawn() -> McpChild {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .arg("mcp")
            .current_dir(root())
            .env("FIELDGATE_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        McpChild { child, stdin, lines, pending: HashMap::new() }
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
    assert_eq!(tools.len(), 8, "{list}");
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
    assert!(d["result"]["capabilities"]["tools"].is_object());
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
    assert!(r["result"].is_object());
    drop(mcp.stdin);
    let status = tokio::time::timeout(Duration::from_secs(10), mcp.child.wait()).await.unwrap().unwrap();
    assert!(status.success());
}
