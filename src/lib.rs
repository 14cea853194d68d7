//! fieldgate: field devices as safe, well-described tools for an AI reporting agent.
//!
//! See ARCHITECTURE.md for the codemap and the invariants.

pub mod app;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod console;
#[cfg(feature = "demo")]
pub mod demo;
pub mod driver;
pub mod ids;
pub mod logs;
pub mod metrics;
pub mod poller;
pub mod reading;
pub mod registry;
pub mod resilience;
pub mod store;
pub mod suggest;
pub mod tls;
pub mod toml_reader;
pub mod tools;
pub mod transport;
pub mod work_orders;
