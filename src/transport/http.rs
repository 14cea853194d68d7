//! The HTTP API (axum) and MCP over Streamable HTTP at `/mcp`, behind one set of checks:
//! `Host` and `Origin` validation (DNS rebinding, foreign browser pages), bearer tokens,
//! a body limit and a request timeout. `status.rs` has the one mapping from the envelope
//! to HTTP.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodFilter, MethodRouter};
use axum::{Extension, Router};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::auth::Tokens;
use super::mcp::http::McpHttp;
pub use super::routes::ROUTES;
use super::routes::{Access, Endpoint};
use crate::tools::{Caller, Envelope, ErrorCode, Tool, ToolError, ToolService};

/// What the HTTP layer shares between requests.
mod bearer;
mod limits;
use limits::{limit_body, request_timeout};

#[derive(Clone)]
struct AppState {
    tools: ToolService,
    tokens: Arc<Tokens>,
    challenge: Arc<super::challenge::Challenge>,
    hosts: Arc<Vec<String>>,
    origins: Arc<Vec<String>>,
    mounted: Option<Pages>,
}

/// Pages served beside the API under `prefix` (the console, mounted by `app.rs`): the
/// Host and Origin checks, body limit and timeout apply to them too, and what the Host and
/// Origin checks refuse there is shown by `refusal`, as one of their pages.
#[derive(Clone, Copy)]
pub struct Pages {
    pub prefix: &'static str,
    pub refusal: fn(ToolError) -> Response,
}

pub use super::status::{status_of, status_of_code};

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// The envelope with its status and, on retryable errors, `Retry-After` (seconds).
fn envelope_response(e: &Envelope) -> Response {
    let mut res = json_response(status_of(e), e.to_json());
    if let Some(ms) = e.error.as_ref().and_then(|err| err.retry_after_ms) {
        let secs = ms.div_ceil(1000).max(1);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            res.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    res
}

/// An error that is not the answer of a tool (authentication, origin, routing, limits):
/// still an envelope with `meta`, its status from [`status_of`].
fn refusal(error: ToolError) -> Response {
    envelope_response(&Envelope::failure(error, crate::tools::Meta::refusal("http")))
}

/// A refusal after which the request's body may still be unread: the connection is closed
/// (and says so), so that a keep-alive client does not send its next request into it.
fn closing(mut res: Response) -> Response {
    res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

/// `Host` names accepted: loopback names, the listen address and configured extras.
pub fn allowed_hosts(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.push(listen.ip().to_string());
    hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The host part of a `Host` header (`[::1]:8080` → `::1`, `Example.com:80` → `example.com`).
fn host_name(authority: &str) -> String {
    let a = authority.trim().to_ascii_lowercase();
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("").to_string();
    }
    match a.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h.to_string(),
        _ => a,
    }
}

/// Refuses requests for foreign `Host` names (DNS rebinding) and from foreign `Origin`s:
/// a request without exactly one `Host`, with two `Origin`s, or whose absolute-form URI
/// names another host is refused too.
async fn check_origin(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    // Pages mounted beside the API (the console) show their refusals as pages of their own.
    let pages = st.mounted.filter(|m| req.uri().path().starts_with(m.prefix));
    let refuse = |message: &str, hint: &str| {
        let e = ToolError::new(ErrorCode::Forbidden, message, hint);
        match pages {
            Some(m) => (m.refusal)(e),
            None => refusal(e),
        }
    };
    let hosts: Vec<&str> = headers.get_all(header::HOST).iter().filter_map(|h| h.to_str().ok()).collect();
    let served = |authority: &str| {
        let name = host_name(authority);
        let whole = authority.trim().to_ascii_lowercase();
        st.hosts.iter().any(|h| *h == name || *h == whole)
    };
    let host = match hosts.as_slice() {
        [one] if served(one) => *one,
        [_] => {
            return refuse(
                "This Host name is not served here.",
                "Use the server's configured address, or add the name to server.allowed_hosts.",
            );
        }
        [] => {
            return refuse("The request has no Host header.", "Send the Host header (HTTP/1.1 requires it).");
        }
        _ => return refuse("The request has more than one Host header.", "Send exactly one Host header."),
    };
    if let Some(authority) = req.uri().authority()
        && !served(authority.as_str())
    {
        return refuse(
            "The request URI names a host not served here.",
            "Send the request for this server's own address.",
        );
    }
    let origins: Vec<_> = headers.get_all(header::ORIGIN).iter().collect();
    if origins.len() > 1 {
        return refuse("The request has more than one Origin header.", "Send at most one Origin header.");
    }
    if let Some(origin) = origins.first() {
        let origin = origin.to_str().unwrap_or("").trim_end_matches('/').to_ascii_lowercase();
        let h = host.trim().to_ascii_lowercase();
        let same_origin = origin == format!("http://{h}") || origin == format!("https://{h}");
        if !same_origin && !st.origins.iter().any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(&origin)) {
            return refuse(
                "Requests from this Origin are not allowed.",
                "Add the origin to server.allowed_origins if this page should reach fieldgate.",
            );
        }
    }
    next.run(req).await
}

/// `POST /v1/tools/{name}`: the arguments are the body (empty means `{}`).
async fn call_tool(
    State(st): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let args: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        match super::json_body::parse(&body) {
            Ok(v) => v,
            Err(why) => {
                return refusal(ToolError::invalid(
                    "body",
                    None,
                    "a JSON object of arguments, each name once",
                    format!("The body is not valid JSON: {why}."),
                    "Send the tool's arguments as a JSON object, e.g. {\"zone\": \"LINE1\"}.",
                ));
            }
        }
    };
    match st.tools.tool(&name) {
        Ok(tool) => envelope_response(&st.tools.call_as(&caller, tool, args).await),
        Err(e) => {
            let served: Vec<&str> = st.tools.served().map(|t| t.name()).collect();
            let mut err = ToolError::new(
                ErrorCode::UnknownTool,
                e.to_string(),
                format!("GET /v1/tools lists the tools: {}.", served.join(", ")),
            );
            err.suggestions = crate::suggest::closest(&name, served.iter().copied())
                .map(|s| vec![s.to_string()])
                .unwrap_or_default();
            refusal(err)
        }
    }
}

async fn list_tools(State(st): State<AppState>) -> Response {
    let defs: Vec<Value> = st.tools.served().map(|t| t.definition()).collect();
    json_response(StatusCode::OK, serde_json::to_vec(&json!({ "tools": defs })).unwrap_or_default())
}

/// Query parameters as tool arguments: integers where they parse as integers.
fn query_args(q: HashMap<String, String>) -> Value {
    let map = q
        .into_iter()
        .map(|(k, v)| {
            let value = match v.parse::<i64>() {
                Ok(n) if k == "limit" || k.ends_with("_ms") => Value::from(n),
                _ => Value::String(v),
            };
            (k, value)
        })
        .collect();
    Value::Object(map)
}

async fn sensors(State(st): State<AppState>, Extension(c): Extension<Caller>, Params(q): Params) -> Response {
    answer(&st, &c, Tool::ListSensors, query_args(q)).await
}

async fn sensor(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    envelope_response(&st.tools.describe_sensor(&c, &id))
}

async fn reading(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
    Params(q): Params,
) -> Response {
    sensor_tool(&st, &c, Tool::GetSensorReading, id, q).await
}

async fn history(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
    Params(q): Params,
) -> Response {
    sensor_tool(&st, &c, Tool::GetSensorHistory, id, q).await
}

/// `GET /v1/sensors/{id}/...`: the query string as arguments, with the path's sensor ID.
async fn sensor_tool(
    st: &AppState,
    c: &Caller,
    tool: Tool,
    id: String,
    q: HashMap<String, String>,
) -> Response {
    let mut args = query_args(q);
    if let Some(o) = args.as_object_mut() {
        o.insert("sensor_id".into(), Value::String(id));
    }
    answer(st, c, tool, args).await
}

/// The envelope of a known tool called with `args`.
async fn answer(st: &AppState, c: &Caller, tool: Tool, args: Value) -> Response {
    envelope_response(&st.tools.call_as(c, tool, args).await)
}

async fn list_work_orders(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Params(q): Params,
) -> Response {
    answer(&st, &c, Tool::ListWorkOrders, query_args(q)).await
}

async fn get_work_order(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    answer(&st, &c, Tool::GetWorkOrder, json!({ "work_order_id": id })).await
}

/// `POST /v1/work-orders/{id}/{action}` with an optional `{"note": "..."}`: operators only.
async fn act_on_work_order(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let note =
        serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["note"].as_str().map(str::to_string));
    let e = st.tools.act_on_work_order(&c, &id, &action, note).await;
    envelope_response(&e)
}

async fn list_alarms(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Params(q): Params,
) -> Response {
    answer(&st, &c, Tool::ListAlarms, query_args(q)).await
}

/// `POST /v1/alarms/{alarm_id}/{action}`: an operator's act on an alarm; the body (JSON,
/// optional) holds `comment`, `duration_s` (shelve) and `event_id` (acknowledge).
async fn act_on_alarm(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    match crate::tools::AlarmActBody::from_json(&body) {
        Ok(b) => envelope_response(&st.tools.act_on_alarm(&c, &id, &action, b).await),
        Err(e) => refusal(e),
    }
}

/// `POST /v1/devices/{id}/probe`: an operator's probe of the device, at once.
async fn probe_device(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let e = st.tools.probe_device(&c, &id).await;
    envelope_response(&e)
}

async fn devices(State(st): State<AppState>, Extension(c): Extension<Caller>) -> Response {
    answer(&st, &c, Tool::GetDeviceStatus, json!({})).await
}

async fn device(
    State(st): State<AppState>,
    Extension(c): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    answer(&st, &c, Tool::GetDeviceStatus, json!({ "device_id": id })).await
}

async fn metrics(State(st): State<AppState>) -> Response {
    let mut res = Response::new(Body::from(st.tools.render_metrics()));
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    res
}

/// `GET /.well-known/oauth-protected-resource[/mcp]`: where to get a token for this
/// server (`[server.oauth]`), outside the bearer check; 404 without one.
async fn resource_metadata(State(st): State<AppState>, uri: axum::http::Uri) -> Response {
    let Some(oauth) = st.tokens.oauth() else {
        return refusal(ToolError::new(
            ErrorCode::NotFound,
            "This server takes no OAuth access tokens.",
            "Use a bearer token from fieldgate's administrator; [server.oauth] turns OAuth on.",
        ));
    };
    let path = if uri.path().ends_with("/mcp") { "/mcp" } else { "" };
    json_response(StatusCode::OK, serde_json::to_vec(&oauth.metadata(path)).unwrap_or_default())
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready once the registry is loaded (the service exists only then) and the store is open.
/// Ready while readings can be served: a failing store makes the service `degraded`
/// (readings keep working), not unready. The fleet hub is ready only while online on a
/// broker: without one it has no reading to give (503, `status: "no_broker"`).
async fn readyz(State(st): State<AppState>) -> Response {
    let storage = st.tools.storage();
    let hub = st.tools.hub();
    let linked = hub.as_ref().is_none_or(|h| h.link == "online");
    let status = match (linked, storage.state == crate::tools::defs::StorageState::Ok) {
        (false, _) => "no_broker",
        (true, true) => "ready",
        (true, false) => "degraded",
    };
    let mut body = json!({
        "ready": linked,
        "status": status,
        "registry": { "devices": st.tools.registry().devices().len(), "sensors": st.tools.registry().sensors().len() },
        "storage": storage,
    });
    if let Some(h) = hub {
        body["hub"] = json!({
            "broker": h.broker,
            "link": h.link,
            "link_error": h.link_error,
            "edge_nodes": h.edge_nodes.len(),
            "edge_nodes_online": h.edge_nodes.iter().filter(|n| n.state == "online").count(),
        });
    }
    let code = if linked { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    json_response(code, serde_json::to_vec(&body).unwrap_or_default())
}

async fn openapi() -> Response {
    json_response(StatusCode::OK, serde_json::to_vec_pretty(&super::openapi::document()).unwrap_or_default())
}

/// Whether the client takes HTML (a browser).
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"))
}

/// `303 See Other` to the console.
fn see_console() -> Response {
    let mut res = axum::response::Redirect::to("/console").into_response();
    *res.status_mut() = StatusCode::SEE_OTHER;
    res
}

/// `GET /`: what is served here. A browser (it accepts HTML) is sent to the console.
async fn index(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if wants_html(&headers) {
        return see_console();
    }
    let routes: Vec<String> = ROUTES.iter().map(|r| format!("{} {}", r.verb.name(), r.path)).collect();
    let body = json!({
        "service": "fieldgate",
        "version": env!("CARGO_PKG_VERSION"),
        "devices": st.tools.registry().devices().len(),
        "sensors": st.tools.registry().sensors().len(),
        "docs": "/openapi.json",
        "mcp": "/mcp",
        "routes": routes,
    });
    json_response(StatusCode::OK, serde_json::to_vec_pretty(&body).unwrap_or_default())
}

async fn not_found() -> Response {
    refusal(ToolError::new(
        ErrorCode::NotFound,
        "No such route.",
        "GET / and GET /openapi.json list every route.",
    ))
}

/// A method a route does not serve: the API's envelope, or under mounted pages one of
/// their pages.
fn method_not_allowed(mounted: Option<Pages>, path: &str) -> Response {
    let refused = match mounted.filter(|m| path.starts_with(m.prefix)) {
        Some(m) => (m.refusal)(ToolError::new(
            ErrorCode::MethodNotAllowed,
            "This page does not take this method.",
            "Follow the console's own links and buttons.",
        )),
        None => refusal(ToolError::new(
            ErrorCode::MethodNotAllowed,
            "This method is not served on this route.",
            "GET /openapi.json lists each route's methods.",
        )),
    };
    closing(refused)
}

/// Query parameters, or a JSON refusal when they do not decode (e.g. bad percent-encoding).
struct Params(HashMap<String, String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Params {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Query::<HashMap<String, String>>::from_request_parts(parts, state).await {
            Ok(Query(q)) => Ok(Params(q)),
            Err(_) => Err(refusal(ToolError::invalid(
                "query",
                None,
                "name=value pairs, percent-encoded",
                "The query string does not decode.",
                "Percent-encode the query parameters (e.g. %2B for +).",
            ))),
        }
    }
}

pub use super::server::{Exposure, ServeError, Timeouts, bind, exposure_refusal, serve};

/// The handler of `endpoint` (every one but MCP's service) for the method `on`.
fn handler(endpoint: Endpoint, on: MethodFilter) -> MethodRouter<AppState> {
    match endpoint {
        Endpoint::Index => routing::on(on, index),
        Endpoint::ListTools => routing::on(on, list_tools),
        Endpoint::CallTool => routing::on(on, call_tool),
        Endpoint::Sensors => routing::on(on, sensors),
        Endpoint::Sensor => routing::on(on, sensor),
        Endpoint::Reading => routing::on(on, reading),
        Endpoint::History => routing::on(on, history),
        Endpoint::WorkOrders => routing::on(on, list_work_orders),
        Endpoint::WorkOrder => routing::on(on, get_work_order),
        Endpoint::ActOnWorkOrder => routing::on(on, act_on_work_order),
        Endpoint::Alarms => routing::on(on, list_alarms),
        Endpoint::ActOnAlarm => routing::on(on, act_on_alarm),
        Endpoint::Devices => routing::on(on, devices),
        Endpoint::Device => routing::on(on, device),
        Endpoint::ProbeDevice => routing::on(on, probe_device),
        Endpoint::Metrics => routing::on(on, metrics),
        // Mounted as a service (`app`); a method router here would be our mistake.
        Endpoint::Mcp => routing::on(on, not_found),
        Endpoint::Healthz => routing::on(on, healthz),
        Endpoint::ResourceMetadata => routing::on(on, resource_metadata),
        Endpoint::Readyz => routing::on(on, readyz),
        Endpoint::OpenApi => routing::on(on, openapi),
    }
}

/// The whole application: API, MCP, health and metrics, with `mounted` (the console's
/// pages, which `app.rs` mounts) behind the same host, origin, body and time checks.
pub fn app(
    tools: ToolService,
    tokens: Arc<Tokens>,
    shutdown: CancellationToken,
    mounted: Option<(Pages, Router)>,
) -> Router {
    let cfg = tools.config().server.clone();
    // The host of server.public_url is the name clients use: accepted too.
    let public = url::Url::parse(&cfg.public_url).ok();
    let public_host =
        public.as_ref().and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_string()));
    let public_authority =
        public.as_ref().and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)));
    let extra: Vec<String> = cfg.allowed_hosts.iter().cloned().chain(public_host).collect();
    let hosts = allowed_hosts(cfg.listen, &extra);
    let st = AppState {
        tools: tools.clone(),
        challenge: Arc::new(super::challenge::Challenge::of(&tokens)),
        tokens,
        hosts: Arc::new(hosts.clone()),
        origins: Arc::new(cfg.allowed_origins.clone()),
        mounted: mounted.as_ref().map(|(pages, _)| *pages),
    };
    // MCP at /mcp: one server instance, fieldgate's own sessions and framing (mcp/http.rs).
    let mcp = McpHttp::new(
        tools.clone(),
        hosts
            .iter()
            .cloned()
            .chain(hosts.iter().map(|h| format!("{h}:{}", cfg.listen.port())))
            .chain(public_authority),
        shutdown.clone(),
    );
    let (mut open, mut protected) = (Router::new(), Router::new());
    let mut mcp = Some(mcp);
    // Off loopback (where tokens are required) only the liveness probe answers without one.
    let loopback = cfg.listen.ip().is_loopback();
    for r in ROUTES {
        let public = r.access == Access::Open || (r.access == Access::Local && loopback);
        let router = if public { &mut open } else { &mut protected };
        *router = match r.endpoint {
            // One service answers every method of MCP's path.
            Endpoint::Mcp => match mcp.take() {
                Some(m) => std::mem::take(router).route_service(r.path, m),
                None => continue,
            },
            e => std::mem::take(router).route(r.path, handler(e, r.verb.filter())),
        };
    }
    let protected = protected.layer(middleware::from_fn_with_state(st.clone(), bearer::authenticate));
    let timed = st.clone();
    open.merge(protected)
        .with_state(st.clone())
        .merge(mounted.map(|(_, r)| r).unwrap_or_default())
        .fallback(not_found)
        .method_not_allowed_fallback(move |uri: axum::http::Uri| async move {
            method_not_allowed(st.mounted, uri.path())
        })
        .layer(middleware::from_fn_with_state(st.clone(), check_origin))
        .layer(middleware::from_fn_with_state(st.clone(), limit_body))
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(timed, request_timeout))
}

/// The `Retry-After` of a response, for tests and clients.
pub fn retry_after(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::RETRY_AFTER)?.to_str().ok()?.parse().ok()
}
