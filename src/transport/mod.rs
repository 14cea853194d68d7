//! The wires: MCP (stdio and Streamable HTTP) and the plain HTTP API, both over one
//! [`ToolService`](crate::tools::ToolService).
//!
//! **Only this module knows MCP or HTTP exist.** Each transport maps the envelope to its
//! wire in exactly one place: `mcp::to_result` and `status::status_of`.

pub mod auth;
pub mod bridge;
pub(crate) mod challenge;
pub mod client;
mod head_refusal;
pub mod http;
mod json_body;
pub mod mcp;
pub mod oauth;
pub mod openapi;
mod pacing;
pub mod routes;
mod server;
pub mod service_url;
pub mod status;
pub mod tls_listener;
pub use server::{Hangup, Peer};
