//! MCP over Streamable HTTP at `/mcp`: our front, rmcp behind it.
//!
//! rmcp's `StreamableHttpService` runs in its stateless mode only, with the one server
//! instance of the process (tool definitions built once). This front does the rest:
//!
//! - **Framing**: every POST body is framed (`jsonrpc::frame`) before rmcp sees it; what
//!   is not a JSON-RPC message gets a JSON-RPC error body with a fitting status (400 with
//!   `-32700`/`-32600`, 413, 415, 406), never rmcp's plain text.
//! - **Sessions** (2025-06-18, 2025-11-25): `initialize` opens one in `Sessions` (capped,
//!   rate-limited, expiring when idle) and names it in `Mcp-Session-Id`; its requests are
//!   served statelessly by rmcp with the session's protocol version. GET opens an idle
//!   event stream that ends with the session; DELETE closes it (404 when there is none).
//! - **`tools/call` without rmcp's per-request service** when nothing about it needs rmcp
//!   (`fast.rs`): the same answer, at about the cost of the HTTP API.
//! - **Single responses are complete at once**: a stateless (2026-07-28) answer is a JSON
//!   body; an answer inside a session is one server-sent event in a body of known length,
//!   the stream closed right after it. Headers and answer leave in one write, so Nagle's
//!   algorithm has nothing to hold back (rmcp's session streams sent the result as a
//!   second small segment, which waited ~40 ms for the client's delayed ACK).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts};
use axum::response::Response;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::jsonrpc::{self, INVALID_REQUEST, Kind, SERVER_ERROR, SESSION_NOT_FOUND};
use super::sessions::{Refusal, Session, Sessions};
use super::{McpServer, fast};
use crate::tools::{Caller, ToolService};

const SESSION_ID: &str = "mcp-session-id";
const PROTOCOL_VERSION: &str = "mcp-protocol-version";
const EVENT_STREAM: &str = "text/event-stream";
/// A comment on an open GET stream this often keeps proxies from closing it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

struct Inner {
    /// The server rmcp clones for every request; `tools/call` answered here uses it too.
    server: McpServer,
    rmcp: StreamableHttpService<McpServer, NeverSessionManager>,
    sessions: Sessions,
    max_body: usize,
    idle_s: u64,
}

/// The `/mcp` service (a tower `Service` for `Router::route_service`).
#[derive(Clone)]
pub struct McpHttp {
    inner: Arc<Inner>,
}

impl McpHttp {
    /// `allowed_hosts` are the `Host` authorities rmcp accepts (it checks them again
    /// behind the application's own check); `shutdown` ends sessions and streams.
    pub fn new(
        tools: ToolService,
        allowed_hosts: impl IntoIterator<Item = String>,
        shutdown: CancellationToken,
    ) -> McpHttp {
        let cfg = tools.config().server.clone();
        let metrics = tools.core().metrics.clone();
        // The one server instance: every request is served by a clone of it (a few
        // reference counts), never by a new one with its own tool definitions.
        let server = McpServer::new(tools, Caller::anonymous());
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(allowed_hosts)
            .with_allowed_origins(cfg.allowed_origins.clone())
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_max_request_body_bytes(cfg.max_body_bytes as usize)
            .with_cancellation_token(shutdown.clone());
        let factory = server.clone();
        let rmcp = StreamableHttpService::new(
            move || Ok(factory.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        let sessions = Sessions::new(
            cfg.mcp_max_sessions as usize,
            Duration::from_secs(cfg.mcp_session_idle_s),
            cfg.rate_limit_per_minute,
            shutdown,
        );
        let table = sessions.clone();
        metrics.collect("mcp sessions", move |s| table.report(s));
        McpHttp {
            inner: Arc::new(Inner {
                server,
                rmcp,
                sessions,
                max_body: cfg.max_body_bytes as usize,
                idle_s: cfg.mcp_session_idle_s,
            }),
        }
    }

    /// The session table (for tests and metrics).
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    pub async fn handle(&self, req: Request) -> Response {
        // Set by the application's bearer authentication in front of /mcp.
        let caller = req.extensions().get::<Caller>().cloned().unwrap_or_else(Caller::anonymous);
        match *req.method() {
            Method::POST => self.post(req, &caller).await,
            Method::GET => self.get(req.headers(), &caller.id),
            Method::DELETE => self.delete(req.headers(), &caller.id),
            _ => {
                let mut res = rpc_error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    INVALID_REQUEST,
                    "Method Not Allowed: /mcp takes POST (messages), GET (an event stream of a session) and DELETE (end a session)",
                    None,
                    None,
                );
                res.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                res
            }
        }
    }

    async fn post(&self, req: Request, caller: &Caller) -> Response {
        let (mut parts, body) = req.into_parts();
        let bytes = match read_body(body, self.inner.max_body).await {
            Ok(b) => b,
            Err(res) => return res,
        };
        let frame = match jsonrpc::frame(&bytes) {
            Ok(f) => f,
            Err(r) => return rpc_error(StatusCode::BAD_REQUEST, r.code, &r.message, r.id.as_deref(), None),
        };
        let id = frame.id;
        if !is_json(&parts.headers) {
            return rpc_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                INVALID_REQUEST,
                "Unsupported Media Type: send Content-Type: application/json",
                id,
                None,
            );
        }
        if !(accepts(&parts.headers, "application/json") && accepts(&parts.headers, EVENT_STREAM)) {
            return rpc_error(
                StatusCode::NOT_ACCEPTABLE,
                INVALID_REQUEST,
                "Not Acceptable: send Accept: application/json, text/event-stream",
                id,
                None,
            );
        }
        if let Some(refused) = super::scope::refusal(&frame, caller, &parts.extensions) {
            return refused;
        }
        if frame.kind == Kind::Request && frame.method == "initialize" {
            return self.initialize(parts, bytes.clone(), id, caller).await;
        }
        // 2026-07-28 (the version in every request) and discovery need no session.
        if frame.method == "server/discover" || jsonrpc::meta_protocol_version(&frame).is_some() {
            if let Some(call) = fast::plan(&frame, &parts.headers, None) {
                return json_answer(fast::answer(&self.inner.server, caller, call).await);
            }
            return self.forward(parts, bytes.clone(), id).await;
        }
        let Some(sid) = parts.headers.get(SESSION_ID).and_then(|v| v.to_str().ok()) else {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "Bad Request: the Mcp-Session-Id header is required: send initialize first (2025-06-18, 2025-11-25), or the protocol version in params._meta with every request (2026-07-28)",
                id,
                None,
            );
        };
        let Some(session) = self.inner.sessions.get(sid, &caller.id) else {
            return self.session_not_found(id);
        };
        match frame.kind {
            Kind::Notification => {
                if frame.method == "notifications/cancelled"
                    && let Some(request) = cancelled_request(frame.params)
                {
                    session.cancel(&request);
                }
                accepted()
            }
            // fieldgate sends no requests to clients; nothing waits for an answer.
            Kind::Response => accepted(),
            Kind::Request => {
                let fast = fast::plan(&frame, &parts.headers, Some(&session.version));
                if !parts.headers.contains_key(PROTOCOL_VERSION)
                    && let Ok(v) = HeaderValue::from_str(&session.version)
                {
                    parts.headers.insert(PROTOCOL_VERSION, v);
                }
                self.in_session(&session, caller, fast, parts, bytes.clone(), id.unwrap_or("null")).await
            }
        }
    }

    /// A request of a session: one event, the stream closed after it. A request
    /// cancelled (`notifications/cancelled`, or its session closed) ends without one.
    async fn in_session(
        &self,
        session: &Arc<Session>,
        caller: &Caller,
        fast: Option<fast::Call>,
        parts: Parts,
        bytes: Bytes,
        id: &str,
    ) -> Response {
        let flight = session.start(id);
        let answer = async {
            match fast {
                Some(call) => event_stream(sse_event(&fast::answer(&self.inner.server, caller, call).await)),
                None => as_one_event(self.forward(parts, bytes, Some(id)).await).await,
            }
        };
        tokio::select! {
            res = answer => res,
            () = flight.token.cancelled() => event_stream(Bytes::new()),
        }
    }

    /// `initialize`: admitted by the session table, answered by rmcp, and a session
    /// opened when it succeeded.
    async fn initialize(&self, parts: Parts, bytes: Bytes, id: Option<&str>, caller: &Caller) -> Response {
        let operator = caller.is_operator();
        let reservation = match self.inner.sessions.reserve(&caller.id, operator) {
            Ok(r) => r,
            Err(refusal) => return refused_session(&refusal, id),
        };
        let res = self.forward(parts, bytes, id).await;
        if res.status() != StatusCode::OK || !has_type(res.headers(), "application/json") {
            return res;
        }
        let (head, body) = res.into_parts();
        let Ok(json) = axum::body::to_bytes(body, usize::MAX).await else {
            return rpc_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error", id, None);
        };
        #[derive(Deserialize)]
        struct Answer<'a> {
            #[serde(borrow)]
            result: Option<Initialized<'a>>,
        }
        #[derive(Deserialize)]
        struct Initialized<'a> {
            #[serde(rename = "protocolVersion", borrow)]
            version: std::borrow::Cow<'a, str>,
        }
        match serde_json::from_slice::<Answer<'_>>(&json).ok().and_then(|a| a.result) {
            Some(init) => {
                let sid = reservation.open(&init.version);
                let mut res = event_stream(sse_event(&json));
                if let Ok(v) = HeaderValue::from_str(&sid) {
                    res.headers_mut().insert(SESSION_ID, v);
                }
                res
            }
            // An error answer opens nothing.
            None => Response::from_parts(head, Body::from(json)),
        }
    }

    /// rmcp's stateless service; a plain-text refusal of its becomes a JSON-RPC error.
    async fn forward(&self, parts: Parts, bytes: Bytes, id: Option<&str>) -> Response {
        let res = self.inner.rmcp.handle(Request::from_parts(parts, Body::from(bytes))).await.map(Body::new);
        if !res.status().is_success() && has_type(res.headers(), "application/json") {
            return escaped_error(res).await;
        }
        if res.status().is_success()
            || has_type(res.headers(), "application/json")
            || has_type(res.headers(), EVENT_STREAM)
        {
            return res;
        }
        let status = res.status();
        let text = axum::body::to_bytes(res.into_body(), 4096).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let (status, code) = match status {
            // The body was framed as JSON-RPC before; what rmcp could not read is an
            // invalid request (nested too deep, a malformed body of a known method).
            StatusCode::UNSUPPORTED_MEDIA_TYPE => (StatusCode::BAD_REQUEST, INVALID_REQUEST),
            s if s.is_server_error() => (s, -32603),
            s => (s, INVALID_REQUEST),
        };
        let message = match text.strip_prefix("fail to deserialize request body ") {
            Some(why) => format!("Invalid Request: not a valid MCP message: {why}"),
            None => text.trim().to_string(),
        };
        let message = crate::tools::envelope::visible(&message);
        rpc_error(status, code, &message, id, None)
    }

    fn session_not_found(&self, id: Option<&str>) -> Response {
        rpc_error(
            StatusCode::NOT_FOUND,
            SESSION_NOT_FOUND,
            &format!(
                "Session not found: it was ended, expired after {} s unused (server.mcp_session_idle_s), or the service restarted; send initialize for a new one",
                self.inner.idle_s
            ),
            id,
            None,
        )
    }

    fn session_required() -> Response {
        rpc_error(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            "Bad Request: the Mcp-Session-Id header is required",
            None,
            None,
        )
    }

    /// GET: the session's event stream. fieldgate sends nothing unasked, so it carries
    /// keep-alive comments until the session ends (DELETE, expiry, shutdown).
    fn get(&self, headers: &HeaderMap, caller: &str) -> Response {
        if !accepts(headers, EVENT_STREAM) {
            return rpc_error(
                StatusCode::NOT_ACCEPTABLE,
                INVALID_REQUEST,
                "Not Acceptable: send Accept: text/event-stream",
                None,
                None,
            );
        }
        let Some(sid) = headers.get(SESSION_ID).and_then(|v| v.to_str().ok()) else {
            // Streamable HTTP: no stream offered here is 405 (without a session, answers
            // come only in POST responses).
            let mut res = rpc_error(
                StatusCode::METHOD_NOT_ALLOWED,
                INVALID_REQUEST,
                "Method Not Allowed: an event stream belongs to a session (send Mcp-Session-Id); without one, answers come in the POST responses",
                None,
                None,
            );
            res.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
            return res;
        };
        let Some(session) = self.inner.sessions.get(sid, caller) else {
            return self.session_not_found(None);
        };
        // Answers are complete in their POST responses: a stream resumed after one
        // (Last-Event-ID) has nothing to replay.
        if headers.contains_key("last-event-id") {
            return event_stream(Bytes::new());
        }
        let ended = session.ended.clone();
        let tick = tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
        let opened =
            futures_util::stream::once(async { Ok::<_, Infallible>(Bytes::from_static(b": open\n\n")) });
        let kept = futures_util::stream::unfold((tick, ended), |(mut tick, ended)| async move {
            tokio::select! {
                _ = tick.tick() => Some((Ok(Bytes::from_static(b": keep-alive\n\n")), (tick, ended))),
                () = ended.cancelled() => None,
            }
        });
        let mut res = Response::new(Body::from_stream(opened.chain(kept)));
        set_stream_headers(res.headers_mut());
        res
    }

    /// DELETE: ends the session (404 when there is none: unknown, ended or expired).
    fn delete(&self, headers: &HeaderMap, caller: &str) -> Response {
        let Some(sid) = headers.get(SESSION_ID).and_then(|v| v.to_str().ok()) else {
            return Self::session_required();
        };
        if self.inner.sessions.close(sid, caller) { accepted() } else { self.session_not_found(None) }
    }
}

impl tower::Service<Request> for McpHttp {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

/// The body, at most `max` bytes (413 with a JSON-RPC error beyond).
async fn read_body(body: Body, max: usize) -> Result<Bytes, Response> {
    let too_large = || {
        let mut res = rpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID_REQUEST,
            &format!("Payload Too Large: messages are limited to {max} bytes (server.max_body_bytes)"),
            None,
            None,
        );
        // The rest of the body is not read: the client must not send its next request here.
        res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        res
    };
    let mut stream = body.into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut more: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                jsonrpc::PARSE_ERROR,
                "Parse error: the body could not be read",
                None,
                None,
            ));
        };
        let have = first.as_ref().map_or(0, Bytes::len) + more.len();
        if have + chunk.len() > max {
            return Err(too_large());
        }
        match first.take() {
            None if more.is_empty() => first = Some(chunk),
            None => more.extend_from_slice(&chunk),
            Some(f) => {
                more.extend_from_slice(&f);
                more.extend_from_slice(&chunk);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(more)))
}

/// `requestId` of a `notifications/cancelled`, as sent.
fn cancelled_request(params: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "requestId", borrow)]
        request_id: Option<&'a RawValue>,
    }
    let p: Params<'_> = serde_json::from_str(params?.get()).ok()?;
    p.request_id.map(|r| r.get().to_string())
}

fn has_type(headers: &HeaderMap, mime: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(mime))
}

fn is_json(headers: &HeaderMap) -> bool {
    has_type(headers, "application/json")
}

/// Whether `Accept` lists `mime` by name, without `q=0` (as rmcp requires of POST).
fn accepts(headers: &HeaderMap, mime: &str) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |entry| {
            let mut parts = entry.split(';');
            let named = parts.next().is_some_and(|e| e.trim().eq_ignore_ascii_case(mime));
            named
                && !parts.any(|p| {
                    p.split_once('=').is_some_and(|(k, v)| {
                        k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f64>().is_ok_and(|q| q == 0.0)
                    })
                })
        },
    )
}

/// A JSON-RPC error response (`id` and `data` as raw JSON).
fn rpc_error(status: StatusCode, code: i32, message: &str, id: Option<&str>, data: Option<&str>) -> Response {
    let mut res = Response::new(Body::from(jsonrpc::error_json(code, message, id, data)));
    *res.status_mut() = status;
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// A JSON-RPC answer as one JSON body.
fn json_answer(body: Vec<u8>) -> Response {
    let mut res = Response::new(Body::from(body));
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

fn set_retry_after(res: &mut Response, wait: Duration) {
    let secs = wait.as_millis().div_ceil(1000).max(1);
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        res.headers_mut().insert(header::RETRY_AFTER, v);
    }
}

fn accepted() -> Response {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::ACCEPTED;
    res
}

fn set_stream_headers(h: &mut HeaderMap) {
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(EVENT_STREAM));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
}

/// A whole event stream in one body of known length: it ends with its last event.
fn event_stream(events: Bytes) -> Response {
    let mut res = Response::new(Body::from(events));
    set_stream_headers(res.headers_mut());
    res
}

/// `message` (one line of JSON) as a server-sent event.
fn sse_event(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(message);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// rmcp's JSON answer as one event, the stream closed after it; anything else as it is.
async fn as_one_event(res: Response) -> Response {
    if res.status() != StatusCode::OK || !has_type(res.headers(), "application/json") {
        return res;
    }
    let (mut head, body) = res.into_parts();
    let Ok(json) = axum::body::to_bytes(body, usize::MAX).await else {
        return rpc_error(StatusCode::INTERNAL_SERVER_ERROR, -32603, "Internal error", None, None);
    };
    head.headers.remove(header::CONTENT_LENGTH);
    set_stream_headers(&mut head.headers);
    Response::from_parts(head, Body::from(sse_event(&json)))
}

/// The answer to an `initialize` the session table refused: its status, a JSON-RPC error
/// saying why and what to do, the reason in `data`, and `Retry-After`.
mod refusals;
use refusals::{escaped_error, refused_session};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_lists() {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        assert!(accepts(&h, "application/json") && accepts(&h, EVENT_STREAM));
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json;q=0.9, Text/Event-Stream;q=0.5"));
        assert!(accepts(&h, "application/json") && accepts(&h, EVENT_STREAM));
        for refused in ["text/event-stream;q=0", "text/event-stream; q=0.000", "text/*", "*/*"] {
            h.insert(header::ACCEPT, HeaderValue::from_str(&format!("application/json, {refused}")).unwrap());
            assert!(!accepts(&h, EVENT_STREAM), "{refused}");
        }
    }

    #[test]
    fn cancelled_request_ids_are_raw() {
        let p: Box<RawValue> = serde_json::from_str(r#"{"requestId":"a-1","reason":"x"}"#).unwrap();
        assert_eq!(cancelled_request(Some(&p)).as_deref(), Some("\"a-1\""));
        let p: Box<RawValue> = serde_json::from_str(r#"{"requestId":7}"#).unwrap();
        assert_eq!(cancelled_request(Some(&p)).as_deref(), Some("7"));
    }
}
