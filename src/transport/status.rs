//! The one mapping from an envelope's error code to an HTTP status (docs/tool-contract.md
//! §7), for the API, the refusals written before hyper parses a request, and the console.

use axum::http::StatusCode;

use crate::tools::{Envelope, ErrorCode};

/// The one mapping from an envelope to an HTTP status (docs/tool-contract.md §7).
pub fn status_of(e: &Envelope) -> StatusCode {
    e.error.as_ref().map_or(StatusCode::OK, |err| status_of_code(err.code))
}

/// The HTTP status of an error code (the table of the contract).
pub fn status_of_code(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorCode::SensorNotFound
        | ErrorCode::DeviceNotFound
        | ErrorCode::WorkOrderNotFound
        | ErrorCode::AlarmNotFound => StatusCode::NOT_FOUND,
        ErrorCode::IdempotencyConflict | ErrorCode::InvalidState => StatusCode::CONFLICT,
        ErrorCode::RateLimited | ErrorCode::RetryLimitReached => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::DeviceTimeout
        | ErrorCode::DeviceUnavailable
        | ErrorCode::DeviceBusy
        | ErrorCode::CircuitOpen
        | ErrorCode::DeviceProtocolError
        | ErrorCode::StorageUnavailable
        | ErrorCode::AuthUnavailable
        | ErrorCode::EdgeOffline => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::DeviceRejected => StatusCode::BAD_GATEWAY,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::UnknownTool | ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::MalformedRequest => StatusCode::BAD_REQUEST,
        ErrorCode::RequestHeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
