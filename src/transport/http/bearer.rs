//! The bearer check in front of every protected route: who the caller is (a static token,
//! an identity provider's access token, or anonymous on a loopback listener without
//! tokens), and whether their scopes allow the route. Refusals carry the challenges of
//! `challenge.rs`: 401 for no token or a refused one, 403 for a missing scope.

use std::net::{IpAddr, Ipv4Addr};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

use super::{AppState, refusal, see_console, wants_html};
use crate::tools::{Caller, ErrorCode, Scope, Tool, ToolError};
use crate::transport::auth::Denied;
use crate::transport::routes::{Access, Endpoint, ROUTES};

/// The scopes the request's route needs (a tool call: its tool's; MCP: each call its own,
/// checked by the MCP endpoint), and the scopes a 401 asks a client to get.
fn needed(req: &Request) -> (&'static [Scope], &'static [Scope]) {
    const READ: &[Scope] = &[Scope::Read];
    const WRITE: &[Scope] = &[Scope::WriteWorkOrders];
    const OPERATE: &[Scope] = &[Scope::Operate];
    let path = req.extensions().get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or("");
    let route = ROUTES.iter().find(|r| r.path == path && r.verb.name() == req.method().as_str());
    match route.map(|r| (r.endpoint, r.access)) {
        // Each tool call is checked by the MCP endpoint; the endpoint itself (sessions,
        // tools/list) needs reading, and a 401 asks for that only (MCP's scope selection:
        // the least that works; a call that needs more gets a 403 naming it, step-up).
        Some((Endpoint::Mcp, _)) => (READ, READ),
        Some((Endpoint::CallTool, _)) => {
            let name = req.uri().path().rsplit('/').next().unwrap_or("");
            match Tool::named(name).map(Tool::scope) {
                Some(Scope::WriteWorkOrders) => (WRITE, WRITE),
                Some(Scope::Operate) => (OPERATE, OPERATE),
                _ => (READ, READ),
            }
        }
        Some((_, Access::Operator)) => (OPERATE, OPERATE),
        _ => (READ, READ),
    }
}

/// Bearer authentication: attaches the [`Caller`] to the request.
pub(super) async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let (needs, asks) = needed(&req);
    let caller = if st.tokens.is_empty() {
        Caller::anonymous()
    } else {
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            // The scheme is case-insensitive (RFC 9110 §11.1).
            .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
            .map(|(_, token)| token);
        let Some(presented) = presented else {
            // A browser at the root goes to the console, which has its own sign-in.
            if req.uri().path() == "/" && wants_html(req.headers()) {
                return see_console();
            }
            return unauthorized("A bearer token is required.", st.challenge.unauthorized(asks, None), false);
        };
        // Wrong tokens are answered after a pause, one at a time per address (`pacing.rs`).
        let from = req
            .extensions()
            .get::<crate::transport::Peer>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.0);
        match st.tokens.check("bearer token", from, presented.trim()).await {
            Ok(c) => c,
            Err(Denied::Wrong(why)) => {
                let text = why.map_or_else(|| "the token is not valid".to_string(), |w| w.to_string());
                let message = format!("The bearer token is not valid: {text}.");
                return unauthorized(&message, st.challenge.unauthorized(asks, Some(&text)), why.is_some());
            }
            Err(Denied::Unavailable) => {
                let mut res = refusal(
                    ToolError::new(
                        ErrorCode::AuthUnavailable,
                        "The access token cannot be checked now: the identity provider cannot be reached.",
                        "Retry the same call with the same token after retry_after_ms; tell an operator if it persists.",
                    )
                    .with_retry_after(5000),
                );
                res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                return res;
            }
            Err(Denied::Busy) => {
                let mut res = refusal(ToolError::new(
                    ErrorCode::RateLimited,
                    "Too many wrong tokens from this address are waiting.",
                    "Wait a few seconds and try again; wrong tokens are answered one a second.",
                ));
                res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                return res;
            }
        }
    };
    if let Some(missing) = needs.iter().find(|s| !caller.may(**s)) {
        return forbidden(&st, &caller, *missing, req.uri().path());
    }
    // The MCP endpoint answers its own scope refusals: it needs the challenge and the counts.
    if req.uri().path() == "/mcp" && !(caller.may(Scope::Read) && caller.may(Scope::WriteWorkOrders)) {
        req.extensions_mut().insert(st.challenge.clone());
        req.extensions_mut().insert(st.tokens.clone());
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// 401; `access_token`: the refused token was the identity provider's.
fn unauthorized(message: &str, challenge: HeaderValue, access_token: bool) -> Response {
    let hint = if access_token {
        "Get a new access token from the identity provider (WWW-Authenticate names its metadata) and call again."
    } else {
        "Send the header Authorization: Bearer <token> with a valid token."
    };
    let mut res = refusal(ToolError::new(ErrorCode::Unauthorized, message, hint));
    res.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
    res
}

/// 403 for a caller whose scopes lack `missing`, logged for the audit.
fn forbidden(st: &AppState, caller: &Caller, missing: Scope, path: &str) -> Response {
    st.tokens.scope_refused(caller, path, missing);
    let message = match missing {
        Scope::Operate => format!("Only an operator can do this: it needs the scope {}.", missing.name()),
        other => format!("This needs the scope {}.", other.name()),
    };
    let mut res = refusal(ToolError::new(
        ErrorCode::Forbidden,
        message,
        "Ask for an access token with that scope; fieldgate's administrator grants it at the identity provider.",
    ));
    res.headers_mut().insert(header::WWW_AUTHENTICATE, st.challenge.insufficient(missing, caller.scopes));
    res
}
