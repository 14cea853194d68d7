//! The envelope every tool returns over every transport (TOOL-CONTRACT.md §1-2).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The stable error codes. Whether a code is retryable is decided here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidArgument,
    SensorNotFound,
    DeviceNotFound,
    WorkOrderNotFound,
    IdempotencyConflict,
    DeviceTimeout,
    DeviceUnavailable,
    DeviceBusy,
    CircuitOpen,
    DeviceRejected,
    RateLimited,
    RetryLimitReached,
    Unauthorized,
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
                | ErrorCode::RateLimited
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::SensorNotFound => "SENSOR_NOT_FOUND",
            ErrorCode::DeviceNotFound => "DEVICE_NOT_FOUND",
            ErrorCode::WorkOrderNotFound => "WORK_ORDER_NOT_FOUND",
            ErrorCode::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
            ErrorCode::DeviceTimeout => "DEVICE_TIMEOUT",
            ErrorCode::DeviceUnavailable => "DEVICE_UNAVAILABLE",
            ErrorCode::DeviceBusy => "DEVICE_BUSY",
            ErrorCode::CircuitOpen => "CIRCUIT_OPEN",
            ErrorCode::DeviceRejected => "DEVICE_REJECTED",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::RetryLimitReached => "RETRY_LIMIT_REACHED",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Internal => "INTERNAL",
        }
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
}

/// Cuts what a caller sent to 100 characters for echoing it back.
pub fn cut(s: &str) -> String {
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
        e.parameter = Some(parameter.into());
        e.received = received.map(cut);
        e.expected = Some(expected.into());
        e
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

/// Tool data, serialized once by the tool and embedded as is by every transport.
pub type Data = Box<serde_json::value::RawValue>;

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

    pub fn success(data: Data, meta: Meta) -> Envelope {
        Envelope { ok: true, data: Some(data), error: None, meta }
    }

    pub fn failure(error: ToolError, meta: Meta) -> Envelope {
        Envelope { ok: false, data: None, error: Some(error), meta }
    }
}
