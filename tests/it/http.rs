//! The HTTP API on real sockets: status codes and Retry-After, resource routes, OpenAPI,
//! and the security checks (tokens, Host, Origin, body size, rate, timeout).

use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::transport::auth::Tokens;
use fieldgate_sim::Faults;
use serde_json::{Value, json};

use super::support::*;

async fn plant_server() -> (Plant, Server) {
    let plant = demo_plant().await;
    let server = Server::start(plant.service.clone(), Tokens::default()).await;
    (plant, server)
}

#[tokio::test]
async fn tool_routes_answer_with_the_contracts_status_codes() {
    let (plant, server) = plant_server().await;
    let mut c = server.client().await;

    let r = c.post("/v1/tools/list_sensors", br#"{"zone":"UTIL"}"#).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"]["total"], 9);
    assert_eq!(r.header("content-type"), Some("application/json"));
    // An empty body means no arguments.
    assert_eq!(c.post("/v1/tools/list_sensors", b"").await.unwrap().status, 200);

    let r = c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"a_line1_001"}"#).await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["suggestions"][0], "A_LINE1_001");
    let r = c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_099"}"#).await.unwrap();
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (404, json!("SENSOR_NOT_FOUND")));

    plant
        .faults("a-line1-plc", Faults { exception_code: Some(2), exception_rate: 1.0, ..Default::default() });
    let r = c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap();
    assert_eq!((r.status, r.header("retry-after")), (502, None));

    plant
        .faults("a-line1-plc", Faults { exception_code: Some(6), exception_rate: 1.0, ..Default::default() });
    let r = c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"), "DEVICE_BUSY retry_after_ms 500 rounds up to 1 s");

    plant.faults("a-line1-plc", Faults { down: true, ..Default::default() });
    let r = c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap();
    assert_eq!(r.status, 503);
    assert!(r.header("retry-after").is_some());

    // Malformed JSON and unknown tools are refused with a JSON body.
    let r = c.post("/v1/tools/list_sensors", b"{zone:").await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["parameter"], "body");
    let r = c.post("/v1/tools/make_coffee", b"{}").await.unwrap();
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["hint"].as_str().unwrap().contains("list_sensors"));
    let r = c.get("/nowhere").await.unwrap();
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn definitions_and_resource_routes() {
    let (_plant, server) = plant_server().await;
    let mut c = server.client().await;
    let r = c.get("/v1/tools").await.unwrap();
    let names: Vec<String> = r.json()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "list_sensors",
            "get_sensor_reading",
            "get_sensor_readings",
            "get_sensor_history",
            "get_device_status",
            "create_work_order",
            "get_work_order",
            "list_work_orders",
            "list_alarms",
            "get_alarm_history",
            "get_alarm_summary"
        ]
    );

    let r = c.get("/v1/sensors?zone=LINE1&kind=pressure&limit=1").await.unwrap();
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["data"]["sensors"][0]["sensor_id"], "A_LINE1_001");
    assert_eq!(v["data"]["total"], 2);
    assert_eq!(c.get("/v1/sensors?limit=lots").await.unwrap().status, 400);

    let r = c.get("/v1/sensors/B_BOILER_011").await.unwrap();
    assert_eq!(r.json()["data"]["data_type"], "i32");
    assert_eq!(c.get("/v1/sensors/B_BOILER_099").await.unwrap().status, 404);
    let r = c.get("/v1/sensors/A_LINE1_003/reading?unit=raw").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.json());
    assert_eq!(r.json()["data"]["unit"], "raw");

    let r = c.get("/v1/devices").await.unwrap();
    assert_eq!(r.json()["data"]["devices"].as_array().unwrap().len(), 4);
    assert_eq!(r.json()["meta"]["tool"], "get_device_status");
    let r = c.get("/v1/devices/a-util-meter").await.unwrap();
    assert_eq!(r.json()["data"]["devices"][0]["sensors"], 9);
    assert_eq!(r.json()["data"]["devices"][0]["breaker"]["state"], "closed");
    let r = c.get("/v1/devices/a-util-metr").await.unwrap();
    assert_eq!((r.status, r.json()["error"]["suggestions"][0].clone()), (404, json!("a-util-meter")));

    assert_eq!(c.get("/healthz").await.unwrap().status, 200);
    let ready = c.get("/readyz").await.unwrap().json();
    assert_eq!(
        (ready["ready"].as_bool(), ready["status"].as_str(), ready["storage"]["state"].as_str()),
        (Some(true), Some("ready"), Some("ok")),
        "{ready}"
    );
    assert_eq!(ready["registry"]["sensors"], 44);
    let m = String::from_utf8(c.get("/metrics").await.unwrap().body).unwrap();
    assert!(m.contains("fieldgate_tool_calls_total{tool=\"list_sensors\",code=\"OK\"}"), "{m}");
    assert!(
        m.contains("fieldgate_tool_calls_total{tool=\"list_sensors\",code=\"INVALID_ARGUMENT\"} 1"),
        "{m}"
    );
    assert!(m.contains("fieldgate_device_read_seconds_count{device=\"a-line1-plc\"} 1"), "{m}");
}

#[tokio::test]
async fn openapi_matches_the_committed_file() {
    let (_plant, server) = plant_server().await;
    let served = server.client().await.get("/openapi.json").await.unwrap().json();
    assert_eq!(served["openapi"], "3.1.0");
    for path in [
        "/v1/tools/list_sensors",
        "/v1/tools/get_sensor_readings",
        "/v1/sensors/{id}/reading",
        "/v1/devices/{id}",
        "/mcp",
    ] {
        assert!(served["paths"].get(path).is_some(), "{path}");
    }
    let schemas = served["components"]["schemas"].as_object().unwrap();
    for (name, _) in schemas {
        assert!(jsonschema::validator_for(&schemas[name]).is_ok(), "{name}");
    }
    let text = serde_json::to_string_pretty(&served).unwrap() + "\n";
    committed_equals("openapi.json", &text, "openapi");
}

/// The docs' route list is made from the route table the router and `/openapi.json` use.
#[test]
fn the_docs_route_list_is_the_route_table() {
    committed_equals("docs/http-routes.md", &fieldgate::transport::routes::markdown(), "route_list");
}

/// The committed file `path` holds `text` (rewritten with `UPDATE_SCHEMA=1`, then
/// `cargo test --test it {test}`).
fn committed_equals(path: &str, text: &str, test: &str) {
    let file = root().join(path);
    if updating() {
        std::fs::write(&file, text).unwrap();
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        committed == text,
        "{path} is out of date; run `UPDATE_SCHEMA=1 cargo test --test it {test}` and commit it"
    );
}

fn tokens() -> Tokens {
    let env = [
        ("FIELDGATE_TOKEN_REPORTER".to_string(), "agent:agent-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_SHIFT_LEAD".to_string(), "operator:operator-token-0123456789".to_string()),
    ];
    Tokens::load(None, env).unwrap()
}

#[tokio::test]
async fn bearer_tokens_are_required_once_configured() {
    let plant = demo_plant().await;
    let server = Server::start(plant.service.clone(), tokens()).await;
    let mut c = server.client().await;
    let r = c.post("/v1/tools/list_sensors", b"{}").await.unwrap();
    assert_eq!((r.status, r.header("www-authenticate")), (401, Some("Bearer scope=\"fieldgate.read\"")));
    assert_eq!(r.json()["error"]["code"], "UNAUTHORIZED");
    let mut wrong = server.client().await.with_token("agent-token-0123456780");
    assert_eq!(wrong.post("/v1/tools/list_sensors", b"{}").await.unwrap().status, 401);
    let mut agent = server.client().await.with_token("agent-token-0123456789");
    assert_eq!(agent.post("/v1/tools/list_sensors", b"{}").await.unwrap().status, 200);
    assert_eq!(agent.get("/metrics").await.unwrap().status, 200);
    // Probes and the API description stay open.
    assert_eq!(c.get("/healthz").await.unwrap().status, 200);
    assert_eq!(c.get("/openapi.json").await.unwrap().status, 200);
    // MCP needs the token too.
    let r =
        c.send("POST", "/mcp", &[("accept", "application/json, text/event-stream")], b"{}").await.unwrap();
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn a_network_address_needs_tokens_and_tls_or_an_explicit_plaintext() {
    use fieldgate::transport::http::{Exposure, ServeError, bind};
    let open = Exposure { authenticated: false, tls: false, allow_plaintext: false };
    assert!(matches!(bind("0.0.0.0:0".parse().unwrap(), open).await, Err(ServeError::OpenToNetwork(_))));
    let tls_only = Exposure { tls: true, allow_plaintext: true, ..open };
    assert!(matches!(bind("0.0.0.0:0".parse().unwrap(), tls_only).await, Err(ServeError::OpenToNetwork(_))));
    assert!(bind("127.0.0.1:0".parse().unwrap(), open).await.is_ok());
    let plain = Exposure { authenticated: true, ..open };
    assert!(matches!(bind("0.0.0.0:0".parse().unwrap(), plain).await, Err(ServeError::Plaintext(_))));
    assert!(bind("0.0.0.0:0".parse().unwrap(), Exposure { tls: true, ..plain }).await.is_ok());
    assert!(bind("0.0.0.0:0".parse().unwrap(), Exposure { allow_plaintext: true, ..plain }).await.is_ok());
}

#[tokio::test]
async fn foreign_hosts_and_origins_are_refused() {
    let (_plant, server) = plant_server().await;
    let mut c = server.client().await;
    let accept = ("accept", "application/json, text/event-stream");
    // DNS rebinding: the request names another host.
    let r = c.send("POST", "/mcp", &[accept, ("host", "evil.example")], b"{}").await.unwrap();
    assert_eq!(r.status, 403);
    let r = c.send("GET", "/v1/tools", &[("host", "evil.example:8080")], b"").await.unwrap();
    assert_eq!(r.status, 403);
    // A page from another origin.
    let r = c.send("POST", "/mcp", &[accept, ("origin", "http://evil.example")], b"{}").await.unwrap();
    assert_eq!(r.status, 403);
    let r = c
        .send("POST", "/v1/tools/list_sensors", &[("origin", "https://attacker.test")], b"{}")
        .await
        .unwrap();
    assert_eq!(r.status, 403);
    // The server's own origin is fine, and so is no origin.
    let own = format!("http://{}", server.addr);
    let r = c.send("POST", "/v1/tools/list_sensors", &[("origin", own.as_str())], b"{}").await.unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn configured_origins_and_hosts_are_allowed() {
    let mut config = Config::default();
    config.server.allowed_origins = vec!["http://dashboard.plant.local:3000".into()];
    config.server.allowed_hosts = vec!["fieldgate.plant.local".into()];
    let plant = demo_plant_with(config).await;
    let server = Server::start(plant.service.clone(), Tokens::default()).await;
    let mut c = server.client().await;
    let r = c
        .send("POST", "/v1/tools/list_sensors", &[("origin", "http://dashboard.plant.local:3000")], b"{}")
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = c.send("GET", "/v1/tools", &[("host", "fieldgate.plant.local:8080")], b"").await.unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn bodies_over_64_kib_are_refused() {
    let (_plant, server) = plant_server().await;
    let mut c = server.client().await;
    let big = format!("{{\"text\":\"{}\"}}", "x".repeat(70 * 1024));
    let r = c.post("/v1/tools/list_sensors", big.as_bytes()).await.unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "PAYLOAD_TOO_LARGE");
    assert!(r.json()["meta"]["call_id"].is_string());
    assert_eq!(r.header("connection"), Some("close"), "the unread body ends the connection, and says so");
    let mut c = server.client().await;
    let r = c
        .send("POST", "/mcp", &[("accept", "application/json, text/event-stream")], big.as_bytes())
        .await
        .unwrap();
    assert_eq!(r.status, 413);
}

#[tokio::test]
async fn callers_are_rate_limited_with_retry_after() {
    let mut config = Config::default();
    config.server.rate_limit_per_minute = 5;
    let plant = demo_plant_with(config).await;
    let server = Server::start(plant.service.clone(), tokens()).await;
    let mut a = server.client().await.with_token("agent-token-0123456789");
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(a.post("/v1/tools/list_sensors", b"{}").await.unwrap());
    }
    assert!(statuses[..5].iter().all(|r| r.status == 200));
    let limited = &statuses[5];
    assert_eq!(limited.status, 429);
    assert_eq!(limited.json()["error"]["code"], "RATE_LIMITED");
    assert_eq!(limited.json()["error"]["retryable"], true);
    let wait: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=12).contains(&wait), "{wait}");
    // Another token has its own budget.
    let mut op = server.client().await.with_token("operator-token-0123456789");
    assert_eq!(op.post("/v1/tools/list_sensors", b"{}").await.unwrap().status, 200);
}

#[tokio::test]
async fn requests_have_a_server_side_timeout() {
    let mut config = Config::default();
    config.server.request_timeout_ms = 150;
    let plant = demo_plant_with(config).await;
    plant.faults("a-line1-plc", Faults { no_reply: 1.0, ..Default::default() });
    let server = Server::start(plant.service.clone(), Tokens::default()).await;
    let mut c = server.client().await;
    let r = c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap();
    // 408 with its own envelope, not the device's DEVICE_TIMEOUT after the call's three
    // attempts: the server's timeout ended the request. (How soon is a bench figure.)
    assert_eq!(r.status, 408);
    let error = &r.json()["error"];
    assert_eq!(error["code"], "REQUEST_TIMEOUT", "{error}");
    assert_eq!(error["message"], "The request did not complete within 150 ms.");
    assert_eq!(error["retryable"], false);
}

#[tokio::test]
async fn mcp_over_http_both_lifecycles() {
    let (_plant, server) = plant_server().await;
    let mut c = server.client().await;
    let accept = ("accept", "application/json, text/event-stream");
    // 2026-07-28: stateless, with the metadata in every request.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let call = json!({"jsonrpc": "2.0", "id": 0, "method": "tools/call",
        "params": {"_meta": meta, "name": "get_sensor_reading", "arguments": {"sensor_id": "B_BOILER_001"}}});
    let r = c
        .send(
            "POST",
            "/mcp",
            &[
                accept,
                ("mcp-protocol-version", "2026-07-28"),
                ("mcp-method", "tools/call"),
                ("mcp-name", "get_sensor_reading"),
            ],
            &serde_json::to_vec(&call).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["id"], 0);
    assert_eq!(v["result"]["isError"], false);
    assert_eq!(v["result"]["structuredContent"]["data"]["device_id"], "b-boiler-rtu");

    // 2025-06-18: initialize, answered as a server-sent event with a session.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let r = c.send("POST", "/mcp", &[accept], &serde_json::to_vec(&init).unwrap()).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.header("mcp-session-id").is_some());
    let body = String::from_utf8_lossy(&r.body);
    let data = body.lines().filter_map(|l| l.strip_prefix("data: ")).find(|l| l.starts_with('{')).unwrap();
    let v: Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
}

/// Every route the server answers is in `/openapi.json` with its method, and every route
/// of the document is answered by a handler (not the "no such route" fallback).
#[tokio::test]
async fn every_route_is_documented_and_every_documented_route_is_served() {
    let (_plant, server) = plant_server().await;
    let mut c = server.client().await;
    let doc = c.get("/openapi.json").await.unwrap().json();
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                documented.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    let mut served: Vec<(String, String)> = fieldgate::transport::http::ROUTES
        .iter()
        .map(|r| (r.verb.name().to_string(), r.path.to_string()))
        .collect();
    let tool_paths: Vec<(String, String)> = fieldgate::tools::TOOLS
        .iter()
        .filter(|t| t.served)
        .map(|t| ("POST".to_string(), format!("/v1/tools/{}", t.name())))
        .collect();
    // The document names each tool's route; the router has one route for all of them.
    served.retain(|r| r.1 != "/v1/tools/{name}");
    served.extend(tool_paths);
    documented.sort();
    served.sort();
    assert_eq!(documented, served, "the router's routes and /openapi.json differ");
    for (method, path) in &served {
        let concrete = path
            .replace("/v1/sensors/{id}", "/v1/sensors/A_LINE1_001")
            .replace("/v1/devices/{id}", "/v1/devices/a-line1-plc")
            .replace("/v1/work-orders/{id}", "/v1/work-orders/WO-000001")
            .replace("{action}", "approve");
        let query = if concrete.ends_with("/history") { "?from=-1h" } else { "" };
        let r = c
            .send(method, &format!("{concrete}{query}"), &[("content-type", "application/json")], b"{}")
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&r.body).to_string();
        assert!(!body.contains("No such route."), "{method} {concrete} fell through to the fallback: {body}");
    }
}

#[tokio::test]
async fn the_root_says_what_is_served_here() {
    let (_plant, server) = plant_server().await;
    let r = server.client().await.get("/").await.unwrap();
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["service"], "fieldgate");
    assert!(v["routes"].as_array().unwrap().iter().any(|r| r == "POST /v1/devices/{id}/probe"), "{v}");
}

/// One request written by hand, the answer read to its end (the server closes or sends
/// Content-Length).
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let Ok(n) = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk)).await else { break };
        let n = n.unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            });
            if len.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Every answer of the HTTP API is a JSON envelope with `meta`, each refusal with its own
/// code, and the headers that a careful client or proxy sends are checked, not assumed.
#[tokio::test]
async fn refusals_are_envelopes_with_their_own_codes_and_headers_are_checked() {
    let (_plant, server) = plant_server().await;
    let a = server.addr;
    let host = format!("Host: {a}\r\n");
    let cases: Vec<(String, u16, &str)> = vec![
        (
            format!("DELETE /v1/sensors HTTP/1.1\r\n{host}Content-Length: 2\r\n\r\n{{}}"),
            405,
            "METHOD_NOT_ALLOWED",
        ),
        (format!("GET /v1/nothing HTTP/1.1\r\n{host}\r\n"), 404, "NOT_FOUND"),
        (
            format!("POST /v1/tools/list_sensor HTTP/1.1\r\n{host}Content-Length: 2\r\n\r\n{{}}"),
            404,
            "UNKNOWN_TOOL",
        ),
        ("GET /v1/sensors HTTP/1.1\r\n\r\n".to_string(), 403, "FORBIDDEN"),
        (format!("GET /v1/sensors HTTP/1.1\r\n{host}Host: evil.example\r\n\r\n"), 403, "FORBIDDEN"),
        (format!("GET http://evil.example/v1/sensors HTTP/1.1\r\n{host}\r\n"), 403, "FORBIDDEN"),
        (
            format!(
                "GET /v1/sensors HTTP/1.1\r\n{host}Origin: http://{a}\r\nOrigin: http://evil.example\r\n\r\n"
            ),
            403,
            "FORBIDDEN",
        ),
        (format!("GET /v1/sensors?zone=%ZZ HTTP/1.1\r\n{host}\r\n"), 400, "INVALID_ARGUMENT"),
        (
            format!(
                "POST /v1/tools/list_sensors HTTP/1.1\r\n{host}Content-Length: 24\r\n\r\n{{\"limit\": 1, \"limit\": 9}}"
            ),
            400,
            "INVALID_ARGUMENT",
        ),
        (
            format!(
                "POST /v1/tools/list_sensors HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\n11000\r\n{}\r\n0\r\n\r\n",
                "x".repeat(0x11000)
            ),
            413,
            "PAYLOAD_TOO_LARGE",
        ),
        // hyper refuses these heads itself, before any handler runs.
        ("\u{16}\u{3}\u{1} not http at all\r\n\r\n".to_string(), 400, "MALFORMED_REQUEST"),
        (
            format!("GET /v1/sensors HTTP/1.1\r\n{host}X-Big: {}\r\n\r\n", "b".repeat(1 << 20)),
            431,
            "REQUEST_HEAD_TOO_LARGE",
        ),
    ];
    for (request, status, code) in cases {
        let (got, head, body) = raw(a, request.as_bytes()).await;
        let first = request.lines().next().unwrap_or_default().to_string();
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{first}: {head} {body}");
        assert!(body["meta"]["call_id"].is_string(), "{first}: no meta: {body}");
        if matches!(status, 405 | 413 | 431) || code == "MALFORMED_REQUEST" {
            assert!(head.contains("connection: close"), "{first}: {head}");
        }
    }
    let (_, _, body) = raw(
        a,
        format!("POST /v1/tools/list_sensor HTTP/1.1\r\n{host}Content-Length: 2\r\n\r\n{{}}").as_bytes(),
    )
    .await;
    assert_eq!(body["error"]["suggestions"][0], "list_sensors", "{body}");
    let (_, _, body) = raw(a, format!("POST /v1/tools/list_sensors HTTP/1.1\r\n{host}Content-Length: 24\r\n\r\n{{\"limit\": 1, \"limit\": 9}}").as_bytes()).await;
    assert!(body["error"]["message"].as_str().unwrap().contains("\"limit\" appears twice"), "{body}");
}

/// The bearer scheme is case-insensitive; 401 and 403 are envelopes with meta.
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let plant = demo_plant().await;
    let server = Server::start(plant.service.clone(), tokens()).await;
    let a = server.addr;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let (status, _, body) =
            raw(a, format!("GET /v1/sensors HTTP/1.1\r\nHost: {a}\r\nAuthorization: {scheme} agent-token-0123456789\r\n\r\n").as_bytes()).await;
        assert_eq!(status, 200, "{scheme}: {body}");
    }
    let (status, _, body) = raw(a, format!("GET /v1/sensors HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes()).await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("UNAUTHORIZED")));
    assert!(body["meta"]["call_id"].is_string(), "{body}");
}

/// `/mcp` answers in JSON-RPC, also when a body is over the limit, declared or chunked.
#[tokio::test]
async fn an_mcp_body_over_the_limit_is_a_json_rpc_error() {
    let (_plant, server) = plant_server().await;
    let a = server.addr;
    let big = "x".repeat(0x11000);
    for request in [
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {a}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n11000\r\n{big}\r\n0\r\n\r\n"
        ),
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {a}\r\nAccept: application/json, text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{big}",
            big.len()
        ),
    ] {
        let (status, head, body) = raw(a, request.as_bytes()).await;
        assert_eq!((status, body["error"]["code"].as_i64()), (413, Some(-32600)), "{head} {body}");
        assert_eq!(body["jsonrpc"], "2.0", "{body}");
        assert!(head.contains("connection: close"), "{head}");
    }
}
