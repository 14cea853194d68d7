//! The operator console in process (`Router::oneshot`, no socket): its pages render for
//! the demo plant, every device-provided string is escaped, sign-in, CSRF and role checks
//! refuse what they must, and the console's requests are neither rate limited nor shown
//! as agent calls. The browser drives the real binary in `console_browser.rs`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use fieldgate::app::router as app_router;
use fieldgate::config::Config;
use fieldgate::driver::RawValue;
use fieldgate::driver::{Sample, SampleQuality};
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
use fieldgate::transport::auth::Tokens;
use serde_json::json;
use tower::ServiceExt;

use super::support::*;

/// An answer: status, headers (lower-case names, several values kept), body as text.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// `name=value` of the cookie `name` the answer sets.
    fn cookie(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .filter(|(k, _)| k == "set-cookie")
            .find(|(_, v)| v.starts_with(&format!("{name}=")))
            .map(|(_, v)| v.split(';').next().unwrap_or("").to_string())
    }

    /// The value of the hidden input `name` in the page (first one).
    fn hidden(&self, name: &str) -> Option<String> {
        let at = self.body.find(&format!(r#"name="{name}" value=""#))?;
        let rest = &self.body[at + name.len() + 15..];
        Some(rest[..rest.find('"')?].to_string())
    }
}

async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut req = Request::builder().method(method).uri(uri).header("host", "127.0.0.1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = router.clone().oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
    let status = res.status().as_u16();
    let headers = res
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.unwrap();
    Answer { status, headers, body: String::from_utf8_lossy(&bytes).to_string() }
}

async fn get(router: &axum::Router, uri: &str, cookie: Option<&str>) -> Answer {
    let headers: Vec<(&str, &str)> = cookie.map(|c| ("cookie", c)).into_iter().collect();
    send(router, "GET", uri, &headers, "").await
}

async fn post_form(router: &axum::Router, uri: &str, cookie: &str, form: &str) -> Answer {
    let headers = [
        ("cookie", cookie),
        ("content-type", "application/x-www-form-urlencoded"),
        ("origin", "http://127.0.0.1"),
    ];
    send(router, "POST", uri, &headers, form).await
}

fn router(service: ToolService, tokens: Tokens) -> axum::Router {
    app_router(&service, Arc::new(tokens), &tokio_util::sync::CancellationToken::new())
}

fn tokens() -> Tokens {
    let env = [
        ("FIELDGATE_TOKEN_REPORTER".to_string(), "agent:agent-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_SHIFT_LEAD".to_string(), "operator:operator-token-0123456789".to_string()),
    ];
    Tokens::load(None, env).unwrap()
}

/// Signs in with `token`: the session cookie (`name=value`) and the session's CSRF token.
async fn sign_in(r: &axum::Router, token: &str) -> (String, String) {
    let form = get(r, "/console/login", None).await;
    let nonce = form.hidden("csrf").expect("the sign-in form carries a CSRF token");
    let login_cookie = form.cookie("fieldgate_login").unwrap();
    let a = post_form(r, "/console/login", &login_cookie, &format!("token={token}&csrf={nonce}")).await;
    assert_eq!(a.status, 303, "{}", a.body);
    let set =
        a.headers.iter().find(|(k, v)| k == "set-cookie" && v.starts_with("fieldgate_session=")).unwrap();
    assert!(set.1.contains("HttpOnly") && set.1.contains("SameSite=Strict"), "{}", set.1);
    let cookie = a.cookie("fieldgate_session").unwrap();
    let page = get(r, "/console/work-orders", Some(&cookie)).await;
    assert_eq!(page.status, 200);
    (cookie, page.hidden("csrf").expect("a form with the session's CSRF token"))
}

/// A pending work order on A_LINE1_001, by the agent; its ID.
async fn pending_order(service: &ToolService, key: &str) -> String {
    let agent = fieldgate::tools::Caller::with_role("reporter", fieldgate::tools::Role::Agent);
    let e = service
        .call_as(
            &agent,
            fieldgate::tools::Tool::CreateWorkOrder,
            json!({ "sensor_id": "A_LINE1_001", "type": "inspection", "priority": "high",
                    "summary": "Pressure <b>drops</b> & the pump \"hunts\"", "idempotency_key": key }),
        )
        .await;
    assert!(e.ok, "{e:?}");
    serde_json::from_str::<serde_json::Value>(e.data.as_ref().unwrap().get()).unwrap()["work_order"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn status_of_order(service: &ToolService, id: &str) -> serde_json::Value {
    let e = service.call("get_work_order", json!({ "work_order_id": id })).await.unwrap();
    serde_json::from_str::<serde_json::Value>(e.data.as_ref().unwrap().get()).unwrap()["work_order"].clone()
}

#[tokio::test]
async fn every_page_renders_for_the_demo_plant() {
    let service = service();
    let registry = service.registry();
    // A cached value and some history, as the poller would leave them.
    let s = registry.sensor_named("A_LINE1_001").unwrap();
    let now = chrono::Utc::now();
    service
        .reader()
        .cache()
        .put(s, &Sample { value: RawValue::Float(3.5), at: now, quality: SampleQuality::Good });
    let history = service.history().unwrap();
    for i in 0..30i64 {
        let p = fieldgate::store::gorilla::Point {
            t: now.timestamp_millis() - 1_800_000 + i * 60_000,
            value: fieldgate::store::gorilla::Stored::Float(3.0 + (i % 5) as f64 / 10.0),
            quality: 0,
        };
        assert!(history.append("A_LINE1_001", &p));
    }
    let id = pending_order(&service, "render-1-order").await;
    let r = router(service.clone(), Tokens::default());
    let overview = get(&r, "/console", None).await;
    assert_eq!(overview.status, 200);
    assert!(overview.header("content-type").unwrap().starts_with("text/html"));
    assert!(overview.header("content-security-policy").unwrap().contains("script-src 'self'"));
    for d in ["a-line1-plc", "a-util-meter", "b-boiler-rtu", "b-oven2-opcua"] {
        assert!(overview.body.contains(&format!(r#"<tr id="dev-{d}">"#)), "{d} is listed");
    }
    assert!(overview.body.contains(r#"id="sen-A_LINE1_001""#));
    assert!(overview.body.contains("<b>3.5</b> bar"), "the cached value is shown");
    assert!(overview.body.len() < 200_000, "the first page is well under 200 KB");
    let device = get(&r, "/console/devices/a-line1-plc", None).await;
    assert_eq!(device.status, 200);
    assert!(device.body.contains(r#"<svg class="spark""#), "a sparkline of the last hour");
    let sensor = get(&r, "/console/sensors/A_LINE1_001?range=1h", None).await;
    assert_eq!(sensor.status, 200, "{}", sensor.body);
    assert!(sensor.body.contains(r#"id="chart""#) && sensor.body.contains("<polyline"), "{}", sensor.body);
    for range in ["24h", "7d"] {
        let page = get(&r, &format!("/console/sensors/A_LINE1_001?range={range}"), None).await;
        assert_eq!(page.status, 200, "{range}");
        assert!(page.body.contains(r#"id="chart""#), "{range}");
    }
    let custom = get(&r, "/console/sensors/A_LINE1_001?from=-40m&to=-10m", None).await;
    assert!(custom.body.contains(r#"id="chart""#), "a custom range");
    let queue = get(&r, "/console/work-orders", None).await;
    assert!(queue.body.contains(&format!(r#"id="wo-{id}""#)), "the pending order is queued");
    assert!(queue.body.contains("Evidence: <b>3.5</b> bar"), "with the reading the agent attached");
    assert!(get(&r, &format!("/console/work-orders/{id}"), None).await.body.contains("pending_approval"));
    assert!(
        get(&r, "/console/work-orders?status=approved", None)
            .await
            .body
            .contains("No work orders in this state.")
    );
    let activity = get(&r, "/console/activity", None).await;
    assert!(activity.body.contains("create_work_order") && activity.body.contains("reporter"));
    assert_eq!(get(&r, "/console/assets/console.js", None).await.status, 200);
}

#[tokio::test]
async fn bad_input_gets_a_page_that_says_what_is_wrong() {
    let r = router(service(), Tokens::default());
    let rows = [
        ("/console/sensors/A_LINE1_099", 404, "<h1>No such sensor</h1>"),
        ("/console/sensors/not-an-id", 400, "<h1>Not a valid request</h1>"),
        ("/console/sensors/A_LINE1_001?range=2y", 400, "Unknown range"),
        ("/console/sensors/A_LINE1_001?from=yesterday", 400, "Accepted: "),
        ("/console/sensors/A_LINE1_001?from=%FF", 400, "<h1>Not a valid request</h1>"),
        ("/console/devices/z-nothing", 404, "<h1>No such device</h1>"),
        ("/console/work-orders/WO-999999", 404, "<h1>No such work order</h1>"),
        ("/console/work-orders?status=lost", 400, "Accepted: all, or one of pending_approval"),
        ("/console/nothing-here", 404, "no console page at this address"),
        ("/console/devices/a-line1-plc/more", 404, "no console page at this address"),
        ("/console/assets/other.js", 404, "no console page at this address"),
    ];
    for (uri, status, text) in rows {
        let a = get(&r, uri, None).await;
        assert_eq!(a.status, status, "{uri}: {}", a.body);
        assert!(a.body.contains(text), "{uri}: {}", a.body);
        assert!(a.header("content-type").unwrap().starts_with("text/html"), "{uri}");
        // Regression (issue 32): the raw code as the heading, with markdown backticks.
        assert!(!a.body.contains('`'), "{uri}: {}", a.body);
    }
    // The API's did-you-mean, as links to the pages meant.
    let a = get(&r, "/console/sensors/A_LINE1_0O1", None).await;
    assert!(
        a.body.contains("Did you mean <a href=\"/console/sensors/A_LINE1_001\">A_LINE1_001</a>"),
        "{}",
        a.body
    );
}

const HOSTILE: &str = r#"id = "h-plc"
plant = "H"
zone = "ZONE1"
description = "<script>alert('device')</script> & \"friends\""
protocol = "opcua"
endpoint = "opc.tcp://127.0.0.1:4840/"

[[sensors]]
id = "H_ZONE1_001"
description = "<img src=x onerror=alert('sensor')>"
kind = "text"
unit = "<i>u</i>"
equipment = "<svg onload=alert('equipment')>"
node_id = "ns=2;s=<b>node</b>"
"#;

#[tokio::test]
async fn every_device_provided_string_is_escaped() {
    let registry = Registry::from_texts(&[("hostile.toml".to_string(), HOSTILE.to_string())]).unwrap();
    let service = ToolService::new(Arc::new(registry), Config::default());
    let registry = service.registry();
    let s = registry.sensor_named("H_ZONE1_001").unwrap();
    // An OPC UA string value as hostile as the file.
    let text = RawValue::Text("</span><script>alert('value')</script>".into());
    service
        .reader()
        .cache()
        .put(s, &Sample { value: text, at: chrono::Utc::now(), quality: SampleQuality::Good });
    let r = router(service.clone(), Tokens::default());
    let snapshot = fieldgate::console::Console::new(
        service.clone(),
        Arc::new(Tokens::default()),
        tokio_util::sync::CancellationToken::new(),
    )
    .render_snapshot();
    let live: serde_json::Value = serde_json::from_str(&snapshot).unwrap();
    let live_html: String =
        live.as_object().unwrap().values().map(|v| v.as_str().unwrap().to_string()).collect();
    for uri in ["/console", "/console/devices/h-plc", "/console/sensors/H_ZONE1_001"] {
        let page = get(&r, uri, None).await;
        assert_eq!(page.status, 200, "{uri}: {}", page.body);
        for (name, body) in [(uri, page.body.as_str()), ("the live snapshot", live_html.as_str())] {
            for raw in ["<script>alert", "<img src=x", "<i>u</i>", "<svg onload", "<b>node"] {
                assert!(!body.contains(raw), "{name} contains {raw} unescaped");
            }
        }
        if !uri.contains("sensors") {
            assert!(
                page.body.contains("&lt;script&gt;alert('device')&lt;/script&gt; &amp; &quot;friends&quot;"),
                "{uri}"
            );
        }
    }
    let sensor = get(&r, "/console/sensors/H_ZONE1_001", None).await.body;
    assert!(sensor.contains("&lt;/span&gt;&lt;script&gt;alert('value')&lt;/script&gt;"), "{sensor}");
    assert!(sensor.contains("&lt;svg onload=alert('equipment')&gt;"));
    // The agent's own words in a work order are escaped too.
    let service = self::service();
    let id = pending_order(&service, "hostile-1-order").await;
    let queue =
        get(&router(service, Tokens::default()), &format!("/console/work-orders/{id}"), None).await.body;
    assert!(queue.contains("Pressure &lt;b&gt;drops&lt;/b&gt; &amp; the pump &quot;hunts&quot;"), "{queue}");
}

#[tokio::test]
async fn without_tokens_anyone_may_look_and_nobody_may_act() {
    let service = service();
    let id = pending_order(&service, "open-1-order").await;
    let r = router(service.clone(), Tokens::default());
    let queue = get(&r, "/console/work-orders", None).await;
    assert!(queue.body.contains(r#"id="actions-disabled""#) && queue.body.contains("FIELDGATE_TOKEN_"));
    assert!(queue.body.contains(&format!(r#"id="approve-{id}" disabled"#)), "the control is disabled");
    let a = post_form(&r, &format!("/console/work-orders/{id}"), "", "csrf=&action=approve&note=x").await;
    assert_eq!(a.status, 403);
    assert!(a.body.contains("no tokens configured"), "{}", a.body);
    let login = get(&r, "/console/login", None).await;
    assert!(login.body.contains("configure an operator token") && !login.body.contains("type=\"password\""));
    assert_eq!(status_of_order(&service, &id).await["status"], "pending_approval");
}

#[tokio::test]
async fn decisions_need_an_operator_session_and_the_forms_csrf_token() {
    let service = service();
    let id = pending_order(&service, "csrf-1-order").await;
    let r = router(service.clone(), tokens());
    let uri = format!("/console/work-orders/{id}");
    // With tokens, viewing needs a session too.
    for page in ["/console", "/console/work-orders", "/console/activity", "/console/sensors/A_LINE1_001"] {
        let a = get(&r, page, None).await;
        assert_eq!((a.status, a.header("location")), (303, Some("/console/login")), "{page}");
    }
    assert_eq!(get(&r, "/console/live", None).await.status, 401);
    assert_eq!(get(&r, "/console", Some("fieldgate_session=forged")).await.status, 303);
    // Sign-in: a wrong token, and a form without its own CSRF cookie, are refused.
    let form = get(&r, "/console/login", None).await;
    let (nonce, login_cookie) = (form.hidden("csrf").unwrap(), form.cookie("fieldgate_login").unwrap());
    let wrong =
        post_form(&r, "/console/login", &login_cookie, &format!("token=nope-nope-nope-nope&csrf={nonce}"))
            .await;
    assert_eq!(wrong.status, 401);
    let forged = post_form(&r, "/console/login", "", "token=operator-token-0123456789&csrf=0000").await;
    assert_eq!(forged.status, 403);
    // The agent can look but not decide, even with its session's CSRF token.
    let (agent, agent_csrf) = sign_in(&r, "agent-token-0123456789").await;
    let page = get(&r, "/console/work-orders", Some(&agent)).await;
    assert!(
        page.body.contains(r#"id="actions-refused""#)
            && page.body.contains(&format!(r#"id="approve-{id}" disabled"#))
    );
    let a = post_form(&r, &uri, &agent, &format!("csrf={agent_csrf}&action=approve&note=agent")).await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("agent token"));
    // The operator needs the form's CSRF token; another session's does not do.
    let (op, op_csrf) = sign_in(&r, "operator-token-0123456789").await;
    for csrf in ["", "0123", agent_csrf.as_str()] {
        let a = post_form(&r, &uri, &op, &format!("csrf={csrf}&action=approve&note=x")).await;
        assert_eq!(a.status, 403, "csrf {csrf:?}: {}", a.body);
    }
    // A request from a foreign page is refused before anything else.
    let foreign = send(
        &r,
        "POST",
        &uri,
        &[
            ("cookie", &op),
            ("origin", "http://evil.example"),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        &format!("csrf={op_csrf}&action=approve"),
    )
    .await;
    assert_eq!(foreign.status, 403);
    // Regression (issue 32): a cross-site form post got the API's JSON, not a console page.
    assert!(foreign.header("content-type").unwrap().starts_with("text/html"), "{}", foreign.body);
    assert!(
        foreign.body.contains("<h1>Not allowed</h1>") && foreign.body.contains("Origin"),
        "{}",
        foreign.body
    );
    assert_eq!(status_of_order(&service, &id).await["status"], "pending_approval", "nothing was decided yet");
    // Regression (issue 32): a note over the limit was refused without the limit, and the
    // typed note was lost. The order comes back with why and the note as typed.
    let long = "n".repeat(501);
    let a = post_form(&r, &uri, &op, &format!("csrf={op_csrf}&action=approve&note={long}")).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("at most 500 characters"), "{}", a.body);
    assert!(a.body.contains(&format!(">{long}</textarea>")), "{}", a.body);
    assert_eq!(status_of_order(&service, &id).await["status"], "pending_approval");
    // 490 characters and 10 line breaks, as a browser sends them (CRLF): within the 500 the
    // textarea allows, and kept with one character per line break.
    let note = format!("Checked on site{}", "%0D%0Ax".repeat(10)) + &"n".repeat(465);
    let a = post_form(&r, &uri, &op, &format!("csrf={op_csrf}&action=approve&note={note}")).await;
    assert_eq!((a.status, a.header("location")), (303, Some(uri.as_str())), "{}", a.body);
    let order = status_of_order(&service, &id).await;
    assert_eq!(order["status"], "approved");
    let last = order["history"].as_array().unwrap().last().unwrap().clone();
    let want = format!("Checked on site{}", "\nx".repeat(10)) + &"n".repeat(465);
    assert_eq!((last["by"].as_str(), last["note"].as_str()), (Some("shift-lead"), Some(want.as_str())));
    // Deciding twice is the store's refusal, shown as a page.
    let again = post_form(&r, &uri, &op, &format!("csrf={op_csrf}&action=reject")).await;
    assert_eq!(again.status, 409);
    assert!(again.body.contains("<h1>Not possible in this state</h1>"), "{}", again.body);
    // Signing out ends the session.
    let out = post_form(&r, "/console/logout", &op, &format!("csrf={op_csrf}")).await;
    assert_eq!(out.status, 303);
    assert_eq!(get(&r, "/console", Some(&op)).await.status, 303);
}

#[tokio::test]
async fn the_console_is_neither_rate_limited_nor_shown_as_agent_calls() {
    let mut config = Config::default();
    config.server.rate_limit_per_minute = 2;
    let service = ToolService::new(Arc::new(demo_registry()), config);
    let r = router(service.clone(), Tokens::default());
    for _ in 0..5 {
        for uri in ["/console", "/console/work-orders", "/console/sensors/A_LINE1_001", "/console/activity"] {
            assert_eq!(get(&r, uri, None).await.status, 200, "{uri}");
        }
    }
    assert!(service.activity().is_empty(), "the console's queries are not agent calls");
    // The agent still has its whole allowance, and its calls are shown.
    let call =
        send(&r, "POST", "/v1/tools/list_sensors", &[("content-type", "application/json")], "{}").await;
    assert_eq!(call.status, 200, "{}", call.body);
    let calls = service.activity();
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].tool, calls[0].code, calls[0].caller.as_str()), ("list_sensors", "OK", "anonymous"));
    let refused =
        send(&r, "POST", "/v1/tools/get_sensor_reading", &[], r#"{"sensor_id":"A_LINE1_999"}"#).await;
    assert_eq!(refused.status, 404);
    // A call over MCP is shown the same way: here, refused by the agent's rate limit.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}},
        "name": "list_sensors", "arguments": {"zone": "UTIL"}}});
    let headers = [
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "list_sensors"),
    ];
    let mcp = send(&r, "POST", "/mcp", &headers, &call.to_string()).await;
    assert_eq!(mcp.status, 200, "{}", mcp.body);
    let calls = service.activity();
    assert_eq!(calls.len(), 3);
    assert_eq!((calls[0].tool, calls[0].code), ("list_sensors", "RATE_LIMITED"));
    assert!(calls[0].args_text().contains("UTIL"), "{:?}", calls[0]);
    // Anything named like a secret is not shown.
    let secret = r#"{"api_token":"hunter2-hunter2"}"#;
    send(&r, "POST", "/v1/tools/list_sensors", &[("content-type", "application/json")], secret).await;
    let page = get(&r, "/console/activity", None).await.body;
    assert!(page.contains("SENSOR_NOT_FOUND") && page.contains("A_LINE1_999"), "{page}");
    assert!(page.contains("RATE_LIMITED"), "{page}");
    assert!(page.contains("[redacted]") && !page.contains("hunter2"), "{page}");
}

#[tokio::test]
async fn every_console_route_is_served_and_a_browser_at_the_root_lands_on_it() {
    let r = router(service(), Tokens::default());
    for route in fieldgate::console::ROUTES {
        let (method, path) = (route.verb.name(), route.path);
        let concrete = path
            .replace("/devices/{id}", "/devices/a-line1-plc")
            .replace("/sensors/{id}", "/sensors/A_LINE1_001")
            .replace("/work-orders/{id}", "/work-orders/WO-000001");
        if concrete == "/console/live" {
            continue; // A stream: its answer never ends (the browser test reads it).
        }
        let a =
            send(&r, method, &concrete, &[("content-type", "application/x-www-form-urlencoded")], "").await;
        assert!(!a.body.contains("No such route."), "{method} {concrete} fell through: {}", a.body);
        assert!(a.status != 405, "{method} {concrete}");
        // A method the page does not take is refused by a console page, not the API's JSON.
        for other in ["PUT", "DELETE", if method == "GET" { "POST" } else { "GET" }] {
            if fieldgate::console::ROUTES.iter().any(|r| r.path == path && r.verb.name() == other) {
                continue;
            }
            let a = send(&r, other, &concrete, &[], "").await;
            assert_eq!(a.status, 405, "{other} {concrete}");
            assert!(
                a.header("content-type").is_some_and(|t| t.starts_with("text/html")),
                "{other} {concrete}"
            );
            assert!(a.body.contains("<!DOCTYPE html>") && !a.body.contains("\"ok\""), "{}", a.body);
            let csp = a.header("content-security-policy").unwrap_or_default();
            assert!(csp.contains("script-src 'self'"), "{other} {concrete}: the console's headers ({csp:?})");
        }
    }
    // An unknown page is not found whatever the method.
    for method in ["GET", "POST", "PUT", "DELETE"] {
        let unknown = send(&r, method, "/console/nowhere", &[], "").await;
        assert_eq!(unknown.status, 404, "{method}");
        assert!(unknown.body.contains("<!DOCTYPE html>"), "{} {}", unknown.status, unknown.body);
    }
    let browser = send(&r, "GET", "/", &[("accept", "text/html,application/xhtml+xml")], "").await;
    assert_eq!((browser.status, browser.header("location")), (303, Some("/console")));
    let api = get(&r, "/", None).await;
    assert!(api.body.contains("\"service\""), "API clients still get the JSON index");
}

#[tokio::test]
async fn the_live_stream_sends_every_device_and_sensor_at_once() {
    use http_body_util::BodyExt;
    let service = service();
    let registry = service.registry();
    let s = registry.sensor_named("A_UTIL_001").unwrap();
    let sample =
        Sample { value: RawValue::Float(231.25), at: chrono::Utc::now(), quality: SampleQuality::Good };
    service.reader().cache().put(s, &sample);
    let r = router(service, Tokens::default());
    let req =
        Request::builder().uri("/console/live").header("host", "127.0.0.1").body(Body::empty()).unwrap();
    let res = r.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut body = res.into_body();
    let frame = tokio::time::timeout(std::time::Duration::from_secs(5), body.frame())
        .await
        .expect("the first snapshot comes at once")
        .unwrap()
        .unwrap();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert!(text.starts_with("event: snapshot\ndata: {"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(text.trim_start_matches("event: snapshot\ndata: ").trim()).unwrap();
    let parts = json.as_object().unwrap();
    assert_eq!(parts.keys().filter(|k| k.starts_with("dev-")).count(), 4);
    assert_eq!(parts.keys().filter(|k| k.starts_with("sen-")).count(), 44);
    assert!(
        parts["sen-A_UTIL_001"].as_str().unwrap().contains("<b>231.25</b> V"),
        "{}",
        parts["sen-A_UTIL_001"]
    );
    assert!(parts.contains_key("attention") && parts.contains_key("activity"));
}

/// Opens `/console/live` with `cookie`; the response (its body unread).
async fn open_live(r: &axum::Router, cookie: Option<&str>) -> axum::response::Response {
    let mut req = Request::builder().uri("/console/live").header("host", "127.0.0.1");
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    r.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap()
}

#[tokio::test]
async fn a_viewer_past_its_share_of_live_streams_ends_its_own_oldest() {
    use http_body_util::BodyExt;
    let r = router(service(), tokens());
    let (operator, _) = sign_in(&r, "operator-token-0123456789").await;
    // A second session of the same token counts as the same viewer.
    let (operator2, _) = sign_in(&r, "operator-token-0123456789").await;
    let mut open = Vec::new();
    for i in 0..16 {
        let res = open_live(&r, Some(if i % 2 == 0 { &operator } else { &operator2 })).await;
        assert_eq!(res.status(), 200);
        open.push(res.into_body());
    }
    // A 17th: served, and the token's oldest stream ends (its next event is the end).
    assert_eq!(open_live(&r, Some(&operator2)).await.status(), 200, "a 17th stream of one token");
    let oldest = &mut open[0];
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(frame) = oldest.frame().await {
            frame.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "the oldest stream ended");
    let (agent, _) = sign_in(&r, "agent-token-0123456789").await;
    assert_eq!(open_live(&r, Some(&agent)).await.status(), 200, "another token is not held up");
}

#[tokio::test(start_paused = true)]
async fn a_live_stream_ends_when_its_session_signs_out() {
    use http_body_util::BodyExt;
    let r = router(service(), tokens());
    let (cookie, csrf) = sign_in(&r, "agent-token-0123456789").await;
    let mut body = open_live(&r, Some(&cookie)).await.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.into_data().is_ok(), "the first snapshot");
    let out = post_form(&r, "/console/logout", &cookie, &format!("csrf={csrf}")).await;
    assert_eq!(out.status, 303);
    // The next snapshot is not sent: the stream ends (keep-alive comments aside).
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), body.frame()).await {
            Ok(None) => break,
            Ok(Some(Ok(f))) => {
                let text = String::from_utf8(f.into_data().unwrap().to_vec()).unwrap();
                assert!(!text.contains("event: snapshot"), "sent after sign-out: {text}");
            }
            Ok(Some(Err(e))) => panic!("{e}"),
            Err(_) => panic!("the stream stayed open after sign-out"),
        }
    }
}

/// A sign-in form posted from address `from` (as the server's accept loop records it).
async fn sign_in_from(r: &axum::Router, from: &str, cookie: &str, form: &str) -> u16 {
    let mut req = Request::builder()
        .method("POST")
        .uri("/console/login")
        .header("host", "127.0.0.1")
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", "http://127.0.0.1")
        .body(Body::from(form.to_string()))
        .unwrap();
    req.extensions_mut().insert(fieldgate::transport::Peer(from.parse().unwrap()));
    r.clone().oneshot(req).await.unwrap().status().as_u16()
}

#[tokio::test(start_paused = true)]
async fn failed_sign_ins_answer_one_at_a_time_per_address_and_hold_up_no_other() {
    let r = router(service(), tokens());
    let form = get(&r, "/console/login", None).await;
    let nonce = form.hidden("csrf").unwrap();
    let cookie = form.cookie("fieldgate_login").unwrap();
    let started = tokio::time::Instant::now();
    // Six guesses at once from one address: three wait their turn (a second each), the
    // others are refused at once; meanwhile an operator elsewhere signs in without waiting.
    let tries = (0..6).map(|i| {
        let (r, cookie, nonce) = (r.clone(), cookie.clone(), nonce.clone());
        async move { sign_in_from(&r, "10.0.0.66", &cookie, &format!("token=wrong-{i}&csrf={nonce}")).await }
    });
    let operator = async {
        tokio::task::yield_now().await;
        let t = tokio::time::Instant::now();
        let good = format!("token=operator-token-0123456789&csrf={nonce}");
        (sign_in_from(&r, "10.0.0.7", &cookie, &good).await, t.elapsed())
    };
    let (answers, (status, waited)) = tokio::join!(futures_util::future::join_all(tries), operator);
    let mut answers: Vec<u16> = answers;
    answers.sort();
    assert_eq!(answers, [401, 401, 401, 429, 429, 429]);
    assert!(started.elapsed() >= std::time::Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(status, 303, "the operator's sign-in");
    assert!(waited < std::time::Duration::from_millis(100), "the operator waited {waited:?}");
    // Once the guesses are answered, the guessing address itself signs in at once too.
    let good = tokio::time::Instant::now();
    let ok = sign_in_from(&r, "10.0.0.66", &cookie, &format!("token=operator-token-0123456789&csrf={nonce}"))
        .await;
    assert_eq!(ok, 303);
    assert!(good.elapsed() < std::time::Duration::from_millis(100));
    // A CSRF value the client made up (cookie and field alike) is refused.
    let chosen = "b".repeat(64);
    let forged = sign_in_from(
        &r,
        "10.0.0.7",
        &format!("fieldgate_login={chosen}"),
        &format!("token=operator-token-0123456789&csrf={chosen}"),
    )
    .await;
    assert_eq!(forged, 403);
}

/// Guessing from many addresses at once (more wrong tokens waiting than any one queue
/// holds) locks no operator out, at the console or the API, and each door's wrong tokens
/// are paced alike: after a pause, a few per address, the rest refused unchecked.
#[tokio::test(start_paused = true)]
async fn guessing_from_many_addresses_locks_no_operator_out_at_either_door() {
    let r = router(service(), tokens());
    let form = get(&r, "/console/login", None).await;
    let nonce = form.hidden("csrf").unwrap();
    let cookie = form.cookie("fieldgate_login").unwrap();
    let api = |from: String, token: &str| {
        let mut req = Request::builder()
            .uri("/v1/tools")
            .header("host", "127.0.0.1")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        req.extensions_mut().insert(fieldgate::transport::Peer(from.parse().unwrap()));
        let r = r.clone();
        async move {
            let res = r.oneshot(req).await.unwrap();
            let retry = res.headers().get("retry-after").is_some();
            (res.status().as_u16(), retry)
        }
    };
    let mut guesses = tokio::task::JoinSet::new();
    for i in 0..300u32 {
        let (r, cookie, nonce) = (r.clone(), cookie.clone(), nonce.clone());
        let from = format!("10.1.{}.{}", i / 250, i % 250);
        guesses.spawn(async move {
            sign_in_from(&r, &from, &cookie, &format!("token=wrong-{i}&csrf={nonce}")).await
        });
        let bearer = api(format!("10.2.{}.{}", i / 250, i % 250), "a-wrong-bearer-token");
        guesses.spawn(async move { bearer.await.0 });
    }
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    let good = format!("token=operator-token-0123456789&csrf={nonce}");
    assert_eq!(sign_in_from(&r, "192.168.7.7", &cookie, &good).await, 303, "the operator at the console");
    assert_eq!(
        api("192.168.7.8".into(), "operator-token-0123456789").await,
        (200, false),
        "the operator at the API"
    );
    assert_eq!(started.elapsed(), std::time::Duration::ZERO, "neither waited");
    // One address past its few places: its next wrong token is refused at once with a
    // time to retry, and a right token from that same address (a NAT, a proxy) still gets in.
    let waiting: Vec<_> =
        (0..3).map(|_| tokio::spawn(api("10.9.9.9".into(), "another-wrong-token"))).collect();
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    assert_eq!(api("10.9.9.9".into(), "operator-token-0123456789").await, (200, false), "the right token");
    assert_eq!(started.elapsed(), std::time::Duration::ZERO, "it did not wait");
    assert_eq!(api("10.9.9.9".into(), "a-fourth-wrong-token").await, (429, true));
    for w in waiting {
        assert_eq!(w.await.unwrap(), (401, false));
    }
    let mut wrong = 0;
    while let Some(status) = guesses.join_next().await {
        assert_eq!(status.unwrap(), 401, "every guess answered as wrong");
        wrong += 1;
    }
    assert_eq!(wrong, 600);
}

#[tokio::test]
async fn a_trailing_slash_lands_on_the_console() {
    let r = router(service(), Tokens::default());
    let a = get(&r, "/console/", None).await;
    assert_eq!(a.status, 308);
    assert_eq!(a.headers.iter().find(|(k, _)| k == "location").map(|(_, v)| v.as_str()), Some("/console"));
}

/// With tokens configured, every page of the route table asked without a session (nothing,
/// or an agent's bearer token as the API takes it, or a made-up session cookie) gets the
/// sign-in page or a refusal: never data. Only the sign-in form and the static assets
/// answer, and they hold no plant data.
#[tokio::test]
async fn every_console_page_without_a_session_is_the_sign_in_page_or_a_refusal() {
    let r = router(service(), tokens());
    let open = ["/console/login", "/console/assets/console.css", "/console/assets/console.js"];
    for route in fieldgate::console::ROUTES.iter().filter(|r| r.verb.name() == "GET") {
        let path = route
            .path
            .replace("/devices/{id}", "/devices/a-line1-plc")
            .replace("/sensors/{id}", "/sensors/A_LINE1_001")
            .replace("/work-orders/{id}", "/work-orders/WO-000001");
        if open.contains(&path.as_str()) {
            continue;
        }
        for headers in [
            vec![],
            vec![("authorization", "Bearer agent-token-0123456789")],
            vec![("cookie", "fieldgate_session=0123456789abcdef0123456789abcdef")],
        ] {
            let a = send(&r, "GET", &path, &headers, "").await;
            let to_sign_in = a.status == 303 && a.header("location") == Some("/console/login");
            assert!(to_sign_in || a.status == 401, "GET {path} with {headers:?}: {} {}", a.status, a.body);
            for data in ["A_LINE1_001", "a-line1-plc", "Bottling", "WO-0000"] {
                assert!(!a.body.contains(data), "GET {path} with {headers:?} shows {data}: {}", a.body);
            }
        }
    }
}

/// A live stream ends after its lifetime (the browser opens a new one): a client that
/// stopped reading, which the network's buffers hide for minutes, holds its place no longer.
#[tokio::test(start_paused = true)]
async fn a_live_stream_ends_after_its_lifetime() {
    use http_body_util::BodyExt;
    let r = router(service(), Tokens::default());
    let req =
        Request::builder().uri("/console/live").header("host", "127.0.0.1").body(Body::empty()).unwrap();
    let mut body = r.oneshot(req).await.unwrap().into_body();
    let first = body.frame().await.expect("the first snapshot").unwrap();
    assert!(first.into_data().is_ok());
    let mut frames = 0u64;
    let ended = tokio::time::timeout(
        fieldgate::console::LIVE_STREAM_LIFETIME + std::time::Duration::from_secs(5),
        async {
            while let Some(frame) = body.frame().await {
                frame.unwrap();
                frames += 1;
            }
        },
    )
    .await;
    assert!(ended.is_ok(), "the stream still runs after its lifetime ({frames} frames)");
    assert!(frames >= 10, "snapshots came meanwhile: {frames}");
}
