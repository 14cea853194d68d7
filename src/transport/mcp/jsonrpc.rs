//! JSON-RPC 2.0 framing in front of rmcp, shared by stdio and `/mcp`: what a message is
//! before rmcp sees it, and the error answers for what it cannot take.
//!
//! rmcp skips unparsable stdio lines and answers invalid ones without their id; over HTTP
//! it answers 415 in plain text. Here every message is first read as a *frame*: its
//! top-level members as raw JSON, which serde_json checks without recursion (a value
//! nested 10,000 deep is valid JSON and costs no stack). Then:
//!
//! - not UTF-8, not JSON, or more than one JSON value: `-32700` with `id: null`;
//! - JSON but not a JSON-RPC 2.0 message (not an object, `jsonrpc` not `"2.0"`, a method
//!   that is not a string, params that are not an object, an id that is not a string or an
//!   integer rmcp can hold, no method/result/error): `-32600`, with the id as it was sent
//!   when it is a string or a number, else `null`;
//! - a message that is JSON-RPC but that rmcp cannot read (nested too deep, a malformed
//!   body of a known kind): `-32600` with its id, so the client is never left waiting.
//!
//! Answers are written here rather than through rmcp's types so that an id rmcp cannot
//! represent (an integer of 400 digits) still goes back to the client exactly as sent.

use serde::Deserialize;
use serde_json::value::RawValue;

/// Invalid JSON (JSON-RPC 2.0).
pub const PARSE_ERROR: i32 = -32700;
/// Not a valid request object (JSON-RPC 2.0).
pub const INVALID_REQUEST: i32 = -32600;
/// Implementation-defined server error (JSON-RPC 2.0 reserves -32000 to -32099): the
/// session limit or the session-creation rate limit.
pub const SERVER_ERROR: i32 = -32000;
/// The `Mcp-Session-Id` names no open session (unknown, closed or expired), as the
/// official TypeScript SDK answers it.
pub const SESSION_NOT_FOUND: i32 = -32001;

/// The kind of a well-formed JSON-RPC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    /// A response or an error response from the client.
    Response,
}

/// A JSON-RPC message as framed: its kind, method and id, borrowed from the text.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub kind: Kind,
    /// The method of a request or notification.
    pub method: &'a str,
    /// The id exactly as sent (a JSON string or integer), for requests and responses.
    pub id: Option<&'a str>,
    /// `params` as sent, if any (an object).
    pub params: Option<&'a RawValue>,
}

/// Why a message is refused, and the answer it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub code: i32,
    pub message: String,
    /// The id to answer with, as raw JSON (`None` answers `null`).
    pub id: Option<String>,
}

impl Reject {
    pub fn parse(message: impl Into<String>) -> Reject {
        Reject { code: PARSE_ERROR, message: message.into(), id: None }
    }

    pub fn invalid(message: impl Into<String>, id: Option<&str>) -> Reject {
        Reject { code: INVALID_REQUEST, message: message.into(), id: id.map(str::to_string) }
    }

    /// The JSON-RPC error response, without a line ending.
    pub fn to_json(&self) -> Vec<u8> {
        error_json(self.code, &self.message, self.id.as_deref(), None)
    }
}

/// `{"jsonrpc":"2.0","id":ID,"error":{"code":C,"message":M[,"data":D]}}` with `id` as raw
/// JSON (`null` when absent) and `data` as raw JSON.
pub fn error_json(code: i32, message: &str, id: Option<&str>, data: Option<&str>) -> Vec<u8> {
    let message = serde_json::to_string(message).unwrap_or_else(|_| "\"error\"".into());
    let mut out = Vec::with_capacity(64 + message.len() + id.map_or(4, str::len));
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.unwrap_or("null").as_bytes());
    out.extend_from_slice(b",\"error\":{\"code\":");
    out.extend_from_slice(code.to_string().as_bytes());
    out.extend_from_slice(b",\"message\":");
    out.extend_from_slice(message.as_bytes());
    if let Some(d) = data {
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(d.as_bytes());
    }
    out.extend_from_slice(b"}}");
    out
}

/// The top-level members rmcp and we look at. Every value is kept raw: serde_json skips
/// raw values and unknown members without recursion.
#[derive(Deserialize)]
struct Members<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<&'a RawValue>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
    #[serde(borrow)]
    result: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
}

/// What serde_json said, without its position when the input is one line.
fn why(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rsplit_once(" at line ") {
        Some((what, _)) => format!("{what} (column {})", e.column()),
        None => text,
    }
}

/// A JSON string or number literal can be sent back as the id; anything else cannot.
fn echoable(raw: &RawValue) -> Option<&str> {
    let t = raw.get();
    match t.as_bytes().first() {
        Some(b'"' | b'-' | b'0'..=b'9') => Some(t),
        _ => None,
    }
}

/// An id rmcp can hold: a string, or an integer within i64.
fn usable_id(raw: &RawValue) -> bool {
    let t = raw.get();
    t.starts_with('"') || t.parse::<i64>().is_ok()
}

/// Frames one message: `text` is a whole HTTP body or one stdio line.
pub fn frame(bytes: &[u8]) -> Result<Frame<'_>, Reject> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Reject::parse(format!(
            "Parse error: the message is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    let first = text.trim_start().as_bytes().first().copied();
    if first != Some(b'{') {
        // Valid JSON that is not an object is a JSON-RPC error of its own; anything else
        // is not JSON.
        return Err(match serde_json::from_str::<&RawValue>(text) {
            Ok(_) if first == Some(b'[') => Reject::invalid(
                "Invalid Request: batches are not supported; send one message at a time",
                None,
            ),
            Ok(_) => Reject::invalid("Invalid Request: a JSON-RPC message is a JSON object", None),
            Err(e) if first.is_none() => Reject::parse(format!("Parse error: empty message ({})", why(&e))),
            Err(e) => Reject::parse(format!("Parse error: not JSON: {}", why(&e))),
        });
    }
    let m: Members<'_> = serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Reject::invalid(format!("Invalid Request: {}", why(&e)), None),
        _ if e.to_string().starts_with("trailing characters") => Reject::parse(format!(
            "Parse error: more than one JSON value ({}); send one message per line",
            why(&e)
        )),
        _ => Reject::parse(format!("Parse error: not JSON: {}", why(&e))),
    })?;
    let id = m.id.and_then(echoable);
    if m.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Err(Reject::invalid("Invalid Request: \"jsonrpc\" must be \"2.0\"", id));
    }
    if let Some(raw) = m.id
        && !usable_id(raw)
    {
        return Err(Reject::invalid(
            "Invalid Request: \"id\" must be a string or an integer between -2^63 and 2^63-1",
            id,
        ));
    }
    let Some(method) = m.method else {
        return match (m.result.is_some(), m.error.is_some(), id) {
            (true, false, Some(_)) | (false, true, _) => {
                Ok(Frame { kind: Kind::Response, method: "", id, params: None })
            }
            _ => Err(Reject::invalid(
                "Invalid Request: a message needs \"method\" (a request or notification) or \"result\"/\"error\" (a response)",
                id,
            )),
        };
    };
    let method = match serde_json::from_str::<&str>(method.get()) {
        Ok(s) => s,
        // A string with escapes is still a string; methods never need them.
        Err(_) if method.get().starts_with('"') => "",
        Err(_) => return Err(Reject::invalid("Invalid Request: \"method\" must be a string", id)),
    };
    if m.result.is_some() || m.error.is_some() {
        return Err(Reject::invalid("Invalid Request: a request has no \"result\" or \"error\"", id));
    }
    if let Some(p) = m.params
        && !p.get().starts_with('{')
    {
        return Err(Reject::invalid("Invalid Request: \"params\" must be an object", id));
    }
    let kind = if m.id.is_some() { Kind::Request } else { Kind::Notification };
    Ok(Frame { kind, method, id, params: m.params })
}

/// The answer for a framed request that rmcp could not read (`error` is what it said).
pub fn unreadable(frame: &Frame<'_>, error: &serde_json::Error) -> Reject {
    let message = if error.to_string().starts_with("recursion limit exceeded") {
        "Invalid Request: nested more than 128 levels deep".to_string()
    } else {
        format!("Invalid Request: not a valid MCP {} message: {}", frame.method, why(error))
    };
    Reject::invalid(message, frame.id)
}

/// `params._meta["io.modelcontextprotocol/protocolVersion"]` of a request, if it has one:
/// a request that carries it is served statelessly (2026-07-28).
pub fn meta_protocol_version(frame: &Frame<'_>) -> Option<String> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "_meta", borrow)]
        meta: Option<Meta<'a>>,
    }
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow)]
        version: Option<std::borrow::Cow<'a, str>>,
    }
    let params: Params<'_> = serde_json::from_str(frame.params?.get()).ok()?;
    params.meta?.version.map(|v| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(bytes: &[u8]) -> (i32, Option<String>) {
        let r = frame(bytes).unwrap_err();
        (r.code, r.id)
    }

    #[test]
    fn unparsable_input_is_a_parse_error_without_id() {
        for bad in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":1,"[..],
            b"not json",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi\0ng\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}",
            b"",
        ] {
            assert_eq!(code(bad), (PARSE_ERROR, None), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn invalid_requests_keep_their_id() {
        assert_eq!(code(br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#), (INVALID_REQUEST, Some("7".into())));
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":"a","method":5}"#),
            (INVALID_REQUEST, Some("\"a\"".into()))
        );
        assert_eq!(
            code(br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":[1]}"#),
            (INVALID_REQUEST, Some("3".into()))
        );
        let big = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"ping"}}"#, "9".repeat(400));
        assert_eq!(code(big.as_bytes()), (INVALID_REQUEST, Some("9".repeat(400))));
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#), (INVALID_REQUEST, None));
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1}"#), (INVALID_REQUEST, Some("1".into())));
        assert_eq!(code(b"[1,2]"), (INVALID_REQUEST, None));
        assert_eq!(code(b"42"), (INVALID_REQUEST, None));
    }

    #[test]
    fn deep_nesting_frames_without_recursion() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}{}}}}}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let f = frame(deep.as_bytes()).unwrap();
        assert_eq!((f.kind, f.method, f.id), (Kind::Request, "tools/call", Some("4")));
        let e = serde_json::from_str::<serde_json::Value>(&deep).unwrap_err();
        assert_eq!(unreadable(&f, &e).code, INVALID_REQUEST);
        assert_eq!(unreadable(&f, &e).id.as_deref(), Some("4"));
    }

    #[test]
    fn kinds_and_meta() {
        let f = frame(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert_eq!((f.kind, f.id), (Kind::Notification, None));
        let f = frame(br#"{"jsonrpc":"2.0","id":"x","result":{}}"#).unwrap();
        assert_eq!(f.kind, Kind::Response);
        let f = frame(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
        )
        .unwrap();
        assert_eq!(meta_protocol_version(&f).as_deref(), Some("2026-07-28"));
        let f = frame(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap();
        assert_eq!(meta_protocol_version(&f), None);
    }

    #[test]
    fn error_json_is_json_rpc() {
        let v: serde_json::Value =
            serde_json::from_slice(&error_json(-32600, "bad \"x\"", Some("\"a\""), Some("{\"k\":1}")))
                .unwrap();
        assert_eq!(v["id"], "a");
        assert_eq!(v["error"]["code"], -32600);
        assert_eq!(v["error"]["message"], "bad \"x\"");
        assert_eq!(v["error"]["data"]["k"], 1);
    }
}
