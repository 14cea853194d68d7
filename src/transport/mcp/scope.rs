//! A `tools/call` the caller's scopes do not allow is refused over HTTP before it is
//! served: 403 with `WWW-Authenticate: Bearer error="insufficient_scope"` naming the scope,
//! as MCP's authorization specification has it, so a client can ask for a token with it.

use std::borrow::Cow;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Extensions, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;

use super::jsonrpc::{Frame, INVALID_REQUEST, Kind};
use crate::tools::{Caller, Scope, Tool};
use crate::transport::challenge::Challenge;

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

/// The 403 of a request whose tool needs a scope `caller` lacks; `extensions` hold the
/// server's [`Challenge`] (set by the bearer check).
pub fn refusal(frame: &Frame<'_>, caller: &Caller, extensions: &Extensions) -> Option<Response> {
    let (scope, tool) = missing(frame, caller)?;
    if let Some(tokens) = extensions.get::<Arc<crate::transport::auth::Tokens>>() {
        tokens.scope_refused(caller, tool, scope);
    }
    let challenge = extensions.get::<Arc<Challenge>>().map_or_else(Challenge::default, |c| (**c).clone());
    let message = format!("Forbidden: calling {tool} needs the scope {}", scope.name());
    let mut res =
        Response::new(Body::from(super::jsonrpc::error_json(INVALID_REQUEST, &message, frame.id, None)));
    *res.status_mut() = StatusCode::FORBIDDEN;
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res.headers_mut().insert(header::WWW_AUTHENTICATE, challenge.insufficient(scope, caller.scopes));
    Some(res)
}

/// The scope a request needs that `caller` lacks, with the tool's name.
fn missing(frame: &Frame<'_>, caller: &Caller) -> Option<(Scope, &'static str)> {
    // A caller who may call every tool (an agent's or operator's token, anonymous on
    // loopback) needs no look at the call: the common case costs nothing.
    let every = caller.may(Scope::Read) && caller.may(Scope::WriteWorkOrders);
    if every || frame.kind != Kind::Request || frame.method != "tools/call" {
        return None;
    }
    let named: Named<'_> = serde_json::from_str(frame.params?.get()).ok()?;
    let tool = Tool::named(&named.name)?;
    (!caller.may(tool.scope())).then(|| (tool.scope(), tool.name()))
}
