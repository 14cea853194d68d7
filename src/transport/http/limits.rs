//! The limits every request meets before its handler: the body size and the time.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use super::{AppState, closing, refusal};
use crate::tools::{ErrorCode, ToolError};

/// Reads the body up to `server.max_body_bytes` (whether its length was declared or it is
/// chunked) and refuses one over the limit with a JSON error, closing the connection.
pub(super) async fn limit_body(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let max = st.tools.config().server.max_body_bytes;
    let too_large = || {
        closing(refusal(ToolError::new(
            ErrorCode::PayloadTooLarge,
            format!("Request bodies are limited to {max} bytes."),
            "Send fewer arguments per call.",
        )))
    };
    // /mcp reads its own bodies, with the same limit, refused as JSON-RPC.
    if req.uri().path() == "/mcp" {
        return next.run(req).await;
    }
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return too_large();
    }
    // A GET's body is not read; everything else is read here, once.
    if req.method() == axum::http::Method::GET {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, max as usize).await {
        Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Err(_) => too_large(),
    }
}

/// Every request has a server-side time limit (`server.request_timeout_ms`).
pub(super) async fn request_timeout(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let limit = std::time::Duration::from_millis(st.tools.config().server.request_timeout_ms);
    // A GET stream (MCP, the console's live updates) lives as long as its session or
    // page, not as one request.
    let path = req.uri().path();
    if (path == "/mcp" || path == "/console/live") && req.method() == axum::http::Method::GET {
        return next.run(req).await;
    }
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(res) => res,
        Err(_) => closing(refusal(ToolError::new(
            ErrorCode::RequestTimeout,
            format!("The request did not complete within {} ms.", limit.as_millis()),
            "Try again; if it keeps happening, tell an operator (server.request_timeout_ms).",
        ))),
    }
}
