//! HTTP status and header mapping through `Router::oneshot` (no socket): every error code
//! against the status and retryability `docs/tool-contract.md` documents, and real
//! requests for each kind of refusal with the headers that must come with it.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use fieldgate::app::router as app_router;
use fieldgate::config::Config;
use fieldgate::tools::{Envelope, ErrorCode, Meta, ToolError, ToolService};
use fieldgate::transport::auth::Tokens;
use fieldgate::transport::http::status_of;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::support::*;

/// `(code, retryable, status)` from the contract's table of codes, read from the document
/// (not from the code under test).
fn documented_codes() -> Vec<(String, bool, u16)> {
    let doc = std::fs::read_to_string(root().join("docs/tool-contract.md")).unwrap();
    let start = doc.find("| code | retryable | HTTP |").expect("the table of codes");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let code = cells[1].trim_matches('`').to_string();
            let retryable = match cells[2] {
                "yes" => true,
                "no" => false,
                other => panic!("{code}: retryable {other:?}"),
            };
            (code, retryable, cells[3].parse().unwrap())
        })
        .collect()
}

#[test]
fn every_code_maps_to_the_status_and_retryability_the_contract_documents() {
    let codes = documented_codes();
    // The closed list of codes, each documented once.
    let variants = <ErrorCode as strum::VariantArray>::VARIANTS.len();
    let names: std::collections::BTreeSet<&str> = codes.iter().map(|c| c.0.as_str()).collect();
    assert_eq!((codes.len(), names.len()), (variants, variants), "{names:?}");
    for (name, retryable, status) in codes {
        let code: ErrorCode = serde_json::from_value(json!(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(code.is_retryable(), retryable, "{name}");
        let meta = Meta { call_id: "c_test".into(), tool: "t".into(), duration_ms: 0.0, attempts: 0 };
        let e = Envelope::failure(ToolError::new(code, "m", "h"), meta);
        assert_eq!(status_of(&e).as_u16(), status, "{name}");
    }
}

/// A request and what must come back: (method, uri, extra headers, body, status, code).
type Row<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a [u8], u16, &'a str);

/// One request through the router: its status, its Content-Type, Retry-After and
/// WWW-Authenticate headers, and its JSON body.
async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<Option<String>>, Value) {
    let mut req = Request::builder().method(method).uri(uri).header("host", "127.0.0.1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = router.clone().oneshot(req.body(Body::from(body.to_vec())).unwrap()).await.unwrap();
    let status = res.status().as_u16();
    let pick = ["content-type", "retry-after", "www-authenticate"]
        .iter()
        .map(|h| res.headers().get(*h).map(|v| v.to_str().unwrap().to_string()))
        .collect();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.unwrap();
    (status, pick, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn router(service: ToolService, tokens: Tokens) -> axum::Router {
    app_router(&service, Arc::new(tokens), &tokio_util::sync::CancellationToken::new())
}

/// A service on the demo registry whose devices all refuse connections.
fn unreachable_service(config: Config) -> (ToolService, tempfile::TempDir, ClosedPort) {
    let closed = ClosedPort::new();
    let dir = demo_devices_unreachable(&closed);
    let registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    (ToolService::new(Arc::new(registry), config), dir, closed)
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn refusals_have_their_status_code_and_headers() {
    let mut config = Config::default();
    config.server.max_body_bytes = 1024;
    let (svc, _dir, _closed) = unreachable_service(config);
    let r = router(svc, Tokens::default());
    let big = vec![b' '; 2048];
    let rows: [Row; 9] = [
        ("POST", "/v1/tools/list_sensors", &[], b"{}", 200, ""),
        ("POST", "/v1/tools/list_sensors", &[], br#"{"zone":"LINE2"}"#, 400, "INVALID_ARGUMENT"),
        (
            "POST",
            "/v1/tools/get_sensor_reading",
            &[],
            br#"{"sensor_id":"A_LINE1_099"}"#,
            404,
            "SENSOR_NOT_FOUND",
        ),
        ("POST", "/v1/tools/make_coffee", &[], b"{}", 404, "UNKNOWN_TOOL"),
        ("GET", "/v1/nothing-here", &[], b"", 404, "NOT_FOUND"),
        ("DELETE", "/v1/tools", &[], b"", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/v1/sensors", &[("origin", "http://evil.example")], b"", 403, "FORBIDDEN"),
        ("GET", "/v1/work-orders/WO-999999", &[], b"", 404, "WORK_ORDER_NOT_FOUND"),
        (
            "POST",
            "/v1/tools/list_sensors",
            &[("content-type", "application/json")],
            &big,
            413,
            "PAYLOAD_TOO_LARGE",
        ),
    ];
    for (method, uri, headers, body, status, code) in rows {
        let (got, h, v) = send(&r, method, uri, headers, body).await;
        assert_eq!(got, status, "{method} {uri}: {v}");
        assert_eq!(h[0].as_deref(), JSON, "{method} {uri}: content type");
        assert_eq!(h[1], None, "{method} {uri}: no Retry-After on a non-retryable answer");
        if status == 200 {
            assert_eq!(v["ok"], true);
        } else {
            assert_eq!((v["ok"].as_bool(), v["error"]["code"].as_str()), (Some(false), Some(code)), "{v}");
            assert!(v["meta"]["call_id"].as_str().unwrap().starts_with("c_"), "{v}");
        }
    }
    // A Host that is not served (DNS rebinding) is refused before routing.
    let res = r
        .clone()
        .oneshot(Request::get("/v1/sensors").header("host", "evil.example").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
}

/// A retryable error carries `Retry-After`: `retry_after_ms` in whole seconds, rounded up,
/// at least 1.
#[tokio::test]
async fn retryable_errors_carry_retry_after_in_whole_seconds_rounded_up() {
    let (svc, _dir, _closed) = unreachable_service(Config::default());
    let r = router(svc, Tokens::default());
    let (status, h, v) =
        send(&r, "POST", "/v1/tools/get_sensor_reading", &[], br#"{"sensor_id":"A_LINE1_001"}"#).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "DEVICE_UNAVAILABLE", "{v}");
    let ms = v["error"]["retry_after_ms"].as_u64().expect("a wait");
    let secs: u64 = h[1].as_deref().expect("Retry-After").parse().unwrap();
    assert_eq!(secs, ms.div_ceil(1000).max(1), "{ms} ms");

    // The per-caller rate limit: 429 with its wait.
    let mut config = Config::default();
    config.server.rate_limit_per_minute = 2;
    let (svc, _dir2, _closed2) = unreachable_service(config);
    let r = router(svc, Tokens::default());
    for _ in 0..2 {
        assert_eq!(send(&r, "POST", "/v1/tools/list_sensors", &[], b"{}").await.0, 200);
    }
    let (status, h, v) = send(&r, "POST", "/v1/tools/list_sensors", &[], b"{}").await;
    assert_eq!((status, v["error"]["code"].as_str()), (429, Some("RATE_LIMITED")), "{v}");
    let secs: u64 = h[1].as_deref().expect("Retry-After").parse().unwrap();
    assert_eq!(secs, v["error"]["retry_after_ms"].as_u64().unwrap().div_ceil(1000).max(1));
}

/// Regression (issue 32): with tokens configured, `/`, `/readyz` and `/openapi.json`
/// answered anyone (counts, routes, disk sizes). Off loopback only `/healthz` does now; a
/// browser at `/` still lands on the console, which has its own sign-in.
#[tokio::test]
async fn off_loopback_only_the_liveness_probe_answers_without_a_token() {
    let env = || [("FIELDGATE_TOKEN_BOT".to_string(), "agent:bot-token-0123456789".to_string())];
    let mut config = Config::default();
    config.server.listen = "0.0.0.0:8080".parse().unwrap();
    let wide =
        router(ToolService::new(Arc::new(demo_registry()), config), Tokens::load(None, env()).unwrap());
    let local = router(service(), Tokens::load(None, env()).unwrap());
    let token = [("authorization", "Bearer bot-token-0123456789")];
    for path in ["/", "/readyz", "/openapi.json"] {
        let (status, _, v) = send(&wide, "GET", path, &[], b"").await;
        assert_eq!((status, v["error"]["code"].as_str()), (401, Some("UNAUTHORIZED")), "{path}: {v}");
        assert_eq!(send(&wide, "GET", path, &token, b"").await.0, 200, "{path} with a token");
        assert_eq!(send(&local, "GET", path, &[], b"").await.0, 200, "{path} on loopback");
    }
    assert_eq!(send(&wide, "GET", "/healthz", &[], b"").await.0, 200);
    let browser = [("accept", "text/html,application/xhtml+xml")];
    assert_eq!(send(&wide, "GET", "/", &browser, b"").await.0, 303, "a browser goes to the console");
}

#[tokio::test]
async fn bearer_tokens_decide_401_403_and_public_routes() {
    let env = [
        ("FIELDGATE_TOKEN_BOT".to_string(), "agent:bot-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_LEAD".to_string(), "operator:lead-token-0123456789".to_string()),
    ];
    let r = router(service(), Tokens::load(None, env).unwrap());
    let bearer = |t: &'static str| [("authorization", t)];
    for (headers, status) in [
        (&[][..], 401),
        (&bearer("Bearer wrong-token-0123456789")[..], 401),
        (&bearer("Basic bot-token-0123456789")[..], 401),
        (&bearer("Bearer bot-token-0123456789")[..], 200),
        (&bearer("bearer bot-token-0123456789")[..], 200), // the scheme is case-insensitive
    ] {
        let (got, h, v) = send(&r, "GET", "/v1/sensors", headers, b"").await;
        assert_eq!(got, status, "{headers:?}: {v}");
        if status == 401 {
            assert_eq!(v["error"]["code"], "UNAUTHORIZED");
            let challenge = h[2].as_deref().unwrap_or("");
            assert!(
                challenge.starts_with("Bearer ") && challenge.contains("scope=\"fieldgate.read\""),
                "{challenge}"
            );
            let presented = headers.first().is_some_and(|(_, v)| v.starts_with("Bearer "));
            assert_eq!(challenge.contains("error=\"invalid_token\""), presented, "{challenge}");
        } else {
            assert_eq!(h[2], None);
        }
    }
    // Health needs no token.
    assert_eq!(send(&r, "GET", "/healthz", &[], b"").await.0, 200);
    // An agent may not decide a work order; an operator may (404: no such order, but past
    // the role check).
    let (status, _, v) =
        send(&r, "POST", "/v1/work-orders/WO-000001/approve", &bearer("Bearer bot-token-0123456789"), b"{}")
            .await;
    assert_eq!((status, v["error"]["code"].as_str()), (403, Some("FORBIDDEN")), "{v}");
    let (status, _, v) =
        send(&r, "POST", "/v1/work-orders/WO-000001/approve", &bearer("Bearer lead-token-0123456789"), b"{}")
            .await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("WORK_ORDER_NOT_FOUND")), "{v}");
}
