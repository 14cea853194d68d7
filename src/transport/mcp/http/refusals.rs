//! What `/mcp` answers when it refuses: a session it will not open, and rmcp's own errors
//! with what they echo of the request escaped.

use super::*;

/// rmcp's own JSON-RPC error, with what it echoes of the request (a method name, a header
/// or body value that did not match) escaped like every other echo.
pub(super) async fn escaped_error(res: Response) -> Response {
    let (mut head, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let mut json: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => return Response::from_parts(head, Body::from(bytes)),
    };
    if let Some(m) = json.pointer_mut("/error/message")
        && let Some(text) = m.as_str()
    {
        *m = serde_json::Value::String(crate::tools::envelope::visible(text).into_owned());
    }
    let out = serde_json::to_vec(&json).unwrap_or_else(|_| bytes.to_vec());
    head.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(head, Body::from(out))
}

pub(super) fn refused_session(refusal: &Refusal, id: Option<&str>) -> Response {
    let (status, message, data, retry_after) = match *refusal {
        Refusal::Full { max, retry_after } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Too many MCP sessions: {max} are open (server.mcp_max_sessions). End unused sessions with DELETE /mcp, retry after {} s (when an idle session expires), or use protocol 2026-07-28, which needs no session.",
                retry_after.as_secs()
            ),
            format!("\"reason\":\"session_limit\",\"max_sessions\":{max}"),
            retry_after,
        ),
        Refusal::CallerFull { held, retry_after } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "This caller holds {held} MCP sessions, its share (half of server.mcp_max_sessions). End unused ones with DELETE /mcp, retry after {} s, or use protocol 2026-07-28, which needs no session.",
                retry_after.as_secs()
            ),
            format!("\"reason\":\"caller_session_limit\",\"held\":{held}"),
            retry_after,
        ),
        Refusal::AgentsFull { max, retry_after } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Agents hold {max} MCP sessions, all but those kept for operators (an eighth of server.mcp_max_sessions). End unused sessions with DELETE /mcp, retry after {} s, or use protocol 2026-07-28, which needs no session.",
                retry_after.as_secs()
            ),
            format!("\"reason\":\"agent_session_limit\",\"max_sessions\":{max}"),
            retry_after,
        ),
        Refusal::RateLimited { retry_after } => (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "Too many sessions opened by this caller (server.rate_limit_per_minute per minute); retry after {} s, or keep using the session you have.",
                retry_after.as_secs().max(1)
            ),
            "\"reason\":\"rate_limited\"".to_string(),
            retry_after,
        ),
    };
    let data = format!("{{{data},\"retry_after_ms\":{}}}", retry_after.as_millis());
    let mut res = rpc_error(status, SERVER_ERROR, &message, id, Some(&data));
    set_retry_after(&mut res, retry_after);
    res
}
