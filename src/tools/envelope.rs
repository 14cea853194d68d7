//! The envelope every tool returns over every transport (docs/tool-contract.md §1-2).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The stable error codes. Whether a code is retryable is decided here and nowhere else.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidArgument,
    SensorNotFound,
    DeviceNotFound,
    WorkOrderNotFound,
    /// No alarm of that ID is configured.
    AlarmNotFound,
    IdempotencyConflict,
    /// The work order's state does not allow this change (not retryable: the state must
    /// change first).
    InvalidState,
    DeviceTimeout,
    DeviceUnavailable,
    DeviceBusy,
    CircuitOpen,
    DeviceRejected,
    /// The device's reply did not match the request (function, unit, counts, framing).
    DeviceProtocolError,
    /// fieldgate's own storage cannot write now (a full disk, a failed file): retry later.
    StorageUnavailable,
    RateLimited,
    RetryLimitReached,
    Unauthorized,
    /// The identity provider's keys cannot be fetched, so an access token cannot be
    /// checked now (HTTP only): retry later with the same token.
    AuthUnavailable,
    /// A known caller without the role for this, or a refused `Host`/`Origin`.
    Forbidden,
    /// No tool of that name is served.
    UnknownTool,
    /// No such route (HTTP).
    NotFound,
    /// The HTTP method is not served on this route.
    MethodNotAllowed,
    /// The request did not complete within the server's time limit.
    RequestTimeout,
    /// The request body is over the server's limit.
    PayloadTooLarge,
    /// The request is not valid HTTP/1.1 (HTTP only).
    MalformedRequest,
    /// The request line or headers are over the server's limit (HTTP only).
    RequestHeadTooLarge,
    /// Fleet hub only: the edge node or device that owns the sensor is offline (its death
    /// certificate, or the hub lost the broker); says since when.
    EdgeOffline,
    Internal,
}

impl ErrorCode {
    /// True only if the very same call can succeed later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::DeviceTimeout
                | ErrorCode::DeviceUnavailable
                | ErrorCode::DeviceBusy
                | ErrorCode::CircuitOpen
                | ErrorCode::DeviceProtocolError
                | ErrorCode::StorageUnavailable
                | ErrorCode::RateLimited
                | ErrorCode::AuthUnavailable
                | ErrorCode::EdgeOffline
        )
    }

    /// The name on every wire (serde's; a test holds the two equal).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One of several argument problems reported together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Detail {
    /// The argument, as a path: `sensor_id`, `sensor_ids/3`.
    pub parameter: String,
    /// What came, cut to 100 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<String>,
    /// What is allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    pub message: String,
    /// Close valid values, when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<String>,
}

/// A failed call, as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolError {
    pub code: ErrorCode,
    /// One short factual sentence.
    pub message: String,
    /// True only if the very same call can succeed later.
    pub retryable: bool,
    /// The earliest time a retry is useful.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The next action for the agent.
    pub hint: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Up to three close valid values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Every problem, when there were several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<Detail>,
    /// Not on the wire: the failure was caused by another call (this call's request never
    /// had its turn), so it does not count toward the caller's retry limit.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) blameless: bool,
}

/// Cuts what a caller sent to 100 characters for echoing it back.
pub use crate::plain::{is_bidi, is_control, is_hidden, is_invisible};

/// `s` with every control and bidirectional formatting character written as `\u{..}`:
/// what a caller sent, safe to echo to the agent, the log and the console.
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What a caller sent, to echo in a message: hidden characters escaped ([`visible`]), at
/// most 100 characters.
pub fn cut(s: &str) -> String {
    let s = visible(s);
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl ToolError {
    pub fn new(code: ErrorCode, message: impl Into<String>, hint: impl Into<String>) -> ToolError {
        ToolError {
            code,
            message: message.into(),
            retryable: code.is_retryable(),
            retry_after_ms: None,
            hint: hint.into(),
            parameter: None,
            received: None,
            expected: None,
            suggestions: Vec::new(),
            device_id: None,
            details: Vec::new(),
            blameless: false,
        }
    }

    /// An `INVALID_ARGUMENT` about one parameter.
    pub fn invalid(
        parameter: impl Into<String>,
        received: Option<&str>,
        expected: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> ToolError {
        let mut e = ToolError::new(ErrorCode::InvalidArgument, message, hint);
        e.parameter = Some(visible(&parameter.into()).into_owned());
        e.received = received.map(cut);
        e.expected = Some(expected.into());
        e
    }

    /// fieldgate's storage failed to write (or is being reopened after a failure).
    pub fn storage_unavailable() -> ToolError {
        ToolError::new(
            ErrorCode::StorageUnavailable,
            "fieldgate's storage cannot write now; nothing was stored.",
            "Retry after retry_after_ms; if it persists, tell an operator to check the data directory's disk (get_device_status shows free space).",
        )
        .with_retry_after(5000)
    }

    pub fn internal() -> ToolError {
        ToolError::new(
            ErrorCode::Internal,
            "Internal error; it has been logged with this call's call_id.",
            "Report the call_id to an operator; do not retry.",
        )
    }

    pub fn with_suggestions(mut self, s: Vec<String>) -> Self {
        self.suggestions = s;
        self
    }

    pub fn with_retry_after(mut self, ms: u64) -> Self {
        if self.retryable {
            self.retry_after_ms = Some(ms);
        }
        self
    }

    pub fn with_device(mut self, id: impl Into<String>) -> Self {
        self.device_id = Some(id.into());
        self
    }
}

/// Facts about the call itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Meta {
    /// Unique per call; quote it when reporting a problem.
    pub call_id: String,
    pub tool: String,
    pub duration_ms: f64,
    /// Device attempts made (0 when no device was asked).
    pub attempts: u32,
}

impl Meta {
    /// The meta of call `call_id` of `tool`, started at `started`, that made `attempts`
    /// device attempts (its duration to the microsecond).
    pub fn timed(call_id: String, tool: &str, started: std::time::Instant, attempts: u32) -> Meta {
        let duration_ms = (started.elapsed().as_secs_f64() * 1_000_000.0).round() / 1000.0;
        Meta { call_id, tool: tool.to_string(), duration_ms, attempts }
    }

    /// The meta of an answer refused before any tool ran (`tool` says what refused it): a
    /// new call ID, no time, no device attempts.
    pub fn refusal(tool: &str) -> Meta {
        Meta { call_id: super::new_call_id(), tool: tool.to_string(), duration_ms: 0.0, attempts: 0 }
    }
}

/// Tool data as JSON text: written once by the tool and spliced as is into every
/// transport's envelope ([`Envelope::to_json`]).
///
/// Only fieldgate's own writers make one: serde for every tool, and the hand-written
/// readings of a batch, which a test keeps byte for byte equal to serde's.
///
/// The text keeps the buffer it was written in: shrinking it would copy the whole text
/// (19 KB for a 100-sensor batch) to save memory that lives only until the reply is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data(String);

impl Data {
    pub(crate) fn of<T: Serialize>(value: &T) -> Result<Data, serde_json::Error> {
        serde_json::to_string(value).map(Data)
    }

    /// JSON text written by `tools::json`.
    pub(crate) fn written(json: String) -> Data {
        Data(json)
    }

    pub fn get(&self) -> &str {
        &self.0
    }
}

impl Serialize for Data {
    /// Embeds the text as JSON. Transports use [`Envelope::to_json`], which splices it in
    /// without this check; this is for everything else (the command line, tests).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw =
            serde_json::value::RawValue::from_string(self.0.clone()).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

/// `{"ok": true, "data": …, "meta": …}` or `{"ok": false, "error": …, "meta": …}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Envelope<T = Data> {
    pub ok: bool,
    /// Present when `ok` is true.
    #[serde(default, skip_serializing_if = "is_none")]
    pub data: Option<T>,
    /// Present when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
    pub meta: Meta,
}

fn is_none<T>(o: &Option<T>) -> bool {
    o.is_none()
}

impl Envelope {
    /// `data` as a JSON value (null when the call failed).
    pub fn json(&self) -> serde_json::Value {
        self.data.as_ref().and_then(|d| serde_json::from_str(d.get()).ok()).unwrap_or_default()
    }

    /// The envelope as JSON: the bytes serde writes for it, with `data` spliced in as
    /// written instead of checked again.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.as_ref().map_or(0, |d| d.get().len()) + 512);
        out.extend_from_slice(if self.ok { b"{\"ok\":true" } else { b"{\"ok\":false" });
        if let Some(data) = &self.data {
            out.extend_from_slice(b",\"data\":");
            out.extend_from_slice(data.get().as_bytes());
        }
        // Our own types: serializing them into a Vec cannot fail.
        if let Some(error) = &self.error {
            out.extend_from_slice(b",\"error\":");
            let _ = serde_json::to_writer(&mut out, error);
        }
        out.extend_from_slice(b",\"meta\":");
        let _ = serde_json::to_writer(&mut out, &self.meta);
        out.push(b'}');
        out
    }

    pub fn success(data: Data, meta: Meta) -> Envelope {
        Envelope { ok: true, data: Some(data), error: None, meta }
    }

    pub fn failure(error: ToolError, meta: Meta) -> Envelope {
        Envelope { ok: false, data: None, error: Some(error), meta }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn code_names_are_serdes() {
        for code in <super::ErrorCode as strum::VariantArray>::VARIANTS {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }

    use super::*;

    fn meta() -> Meta {
        Meta { call_id: "c_1".into(), tool: "get_sensor_reading".into(), duration_ms: 0.125, attempts: 2 }
    }

    #[test]
    fn to_json_writes_what_serde_writes() {
        let data = Data::of(&serde_json::json!({"readings": [{"value": 1.5, "unit": "°C \"x\""}]})).unwrap();
        let ok = Envelope::success(data, meta());
        assert_eq!(ok.to_json(), serde_json::to_vec(&ok).unwrap());
        let mut error = ToolError::invalid("sensor_id", Some("a\nb"), "an ID", "Bad.", "Fix it.");
        error.suggestions = vec!["A_LINE1_001".into()];
        let failed = Envelope::failure(error.with_device("d"), meta());
        assert_eq!(failed.to_json(), serde_json::to_vec(&failed).unwrap());
        // And back: the text a transport sends parses into the same envelope.
        let back: serde_json::Value = serde_json::from_slice(&ok.to_json()).unwrap();
        assert_eq!(back["data"], ok.json());
    }
}
