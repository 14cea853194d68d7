//! `tools/call` over HTTP without rmcp's per-request service.
//!
//! rmcp serves each stateless HTTP request by parsing it into its message types, checking
//! its headers against a JSON copy of it, starting a service for it (a task for the
//! service loop, one for the handler, one to await the end, channels between them) and
//! serializing the answer the loop hands back. For the call agents make most, that costs
//! more than the tool itself: under 16 clients, MCP managed a third of the HTTP API's rate.
//!
//! A `tools/call` whose members and headers are exactly what rmcp accepts without a
//! question is answered here instead: through the same [`McpServer::call`], with rmcp's own
//! result types and the same version-dependent finishing (`fill_missing_cache_hints` for
//! 2026-07-28, the legacy strips before), serialized by the same serde code, so the
//! answer is rmcp's to the byte (`tests/it/mcp.rs`,
//! `http_tools_call_answers_as_rmcp_does`). Anything else (a progress token or other
//! metadata, a task, unknown params, arguments that are not an object, a header to be
//! checked or missing) goes to rmcp, which answers it or refuses it as before.

use std::borrow::Cow;

use axum::http::HeaderMap;
use rmcp::model::{ClientCapabilities, RequestId, ServerJsonRpcMessage, ServerResult};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::McpServer;
use super::jsonrpc::{Frame, Kind};
use crate::tools::Caller;

/// A `tools/call` to answer here.
pub struct Call {
    id: RequestId,
    name: String,
    arguments: Option<Map<String, Value>>,
    /// Negotiated before 2026-07-28 (a session): the legacy result shape.
    legacy: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
    #[serde(rename = "_meta", default, borrow)]
    meta: Option<Meta<'a>>,
}

/// The request metadata of 2026-07-28; any other key (a progress token, a log level)
/// needs rmcp.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow)]
    version: Option<Cow<'a, str>>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities")]
    capabilities: Option<ClientCapabilities>,
    /// Not used by rmcp for a tool call.
    #[serde(rename = "io.modelcontextprotocol/clientInfo")]
    _client_info: Option<serde::de::IgnoredAny>,
}

/// The one value of header `name`, if it has exactly one that is text.
fn single<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    let v = values.next()?.to_str().ok()?;
    values.next().is_none().then_some(v)
}

/// The call, when rmcp would take it as it is: stateless (2026-07-28) with matching
/// `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers and complete metadata; or
/// inside a session (`session_version`) negotiated before 2026-07-28, without metadata.
pub fn plan(frame: &Frame<'_>, headers: &HeaderMap, session_version: Option<&str>) -> Option<Call> {
    if frame.kind != Kind::Request || frame.method != "tools/call" {
        return None;
    }
    let params: Params<'_> = serde_json::from_str(frame.params?.get()).ok()?;
    let header_version = match headers.get_all("mcp-protocol-version").iter().count() {
        0 => None,
        _ => Some(single(headers, "mcp-protocol-version")?),
    };
    let legacy = match (params.meta, session_version) {
        (Some(Meta { version: Some(v), capabilities: Some(_), .. }), _) => {
            let matching = v == "2026-07-28"
                && header_version == Some("2026-07-28")
                && single(headers, "mcp-method") == Some("tools/call")
                && single(headers, "mcp-name") == Some(&*params.name);
            if !matching {
                return None;
            }
            false
        }
        (None, Some(session)) => {
            let version = header_version.unwrap_or(session);
            if !matches!(version, "2025-06-18" | "2025-11-25") {
                return None;
            }
            true
        }
        _ => return None,
    };
    let id: RequestId = serde_json::from_str(frame.id?).ok()?;
    Some(Call { id, name: params.name.into_owned(), arguments: params.arguments, legacy })
}

/// The JSON-RPC answer to `call`, as rmcp writes it.
pub async fn answer(server: &McpServer, caller: &Caller, call: Call) -> Vec<u8> {
    let message = match server.call(caller, &call.name, call.arguments).await {
        Ok(response) => {
            let mut result = ServerResult::from(response);
            if call.legacy {
                result.strip_result_type_for_legacy_peer();
                result.strip_non_object_output_for_legacy_peer();
            } else {
                result.fill_missing_cache_hints();
            }
            ServerJsonRpcMessage::response(result, call.id)
        }
        Err(error) => ServerJsonRpcMessage::error(error, Some(call.id)),
    };
    serde_json::to_vec(&message).unwrap_or_else(|_| {
        super::jsonrpc::error_json(-32603, "Internal error: the answer could not be written", None, None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::mcp::jsonrpc::frame;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    const STATELESS: &str = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"name":"list_sensors","arguments":{"limit":1}}}"#;
    const IN_SESSION: &str = r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"list_sensors","arguments":{"limit":1}}}"#;
    const GOOD: [(&str, &str); 3] =
        [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "list_sensors")];

    #[test]
    fn clean_calls_are_planned() {
        let f = frame(STATELESS.as_bytes()).unwrap();
        let c = plan(&f, &headers(&GOOD), None).unwrap();
        assert!(!c.legacy);
        assert_eq!(c.id, RequestId::Number(1));
        let f = frame(IN_SESSION.as_bytes()).unwrap();
        let c = plan(&f, &headers(&[]), Some("2025-06-18")).unwrap();
        assert!(c.legacy);
        assert!(plan(&f, &headers(&[("mcp-protocol-version", "2025-11-25")]), Some("2025-06-18")).is_some());
    }

    #[test]
    fn anything_rmcp_checks_goes_to_rmcp() {
        let f = frame(STATELESS.as_bytes()).unwrap();
        for h in [
            headers(&GOOD[1..]),
            headers(&[GOOD[0], GOOD[1]]),
            headers(&[GOOD[0], GOOD[1], ("mcp-name", "get_sensor_reading")]),
            headers(&[GOOD[0], GOOD[1], GOOD[2], ("mcp-name", "list_sensors")]),
            headers(&[("mcp-protocol-version", "2025-06-18"), GOOD[1], GOOD[2]]),
        ] {
            assert!(plan(&f, &h, None).is_none(), "{h:?}");
        }
        // No session and no metadata, or a session with a header naming 2026-07-28.
        let s = frame(IN_SESSION.as_bytes()).unwrap();
        assert!(plan(&s, &headers(&[]), None).is_none());
        assert!(plan(&s, &headers(&[GOOD[0]]), Some("2025-06-18")).is_none());
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","task":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":1}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
        ] {
            let f = frame(body.as_bytes()).unwrap();
            assert!(plan(&f, &headers(&[]), Some("2025-06-18")).is_none(), "{body}");
        }
        // Metadata missing the capabilities: rmcp refuses it.
        let partial = STATELESS.replace(r#","io.modelcontextprotocol/clientCapabilities":{}"#, "");
        let f = frame(partial.as_bytes()).unwrap();
        assert!(plan(&f, &headers(&GOOD), None).is_none());
    }
}
