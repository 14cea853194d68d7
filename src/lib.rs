//! fieldgate: field devices as safe, well-described tools for an AI reporting agent.
//!
//! See ARCHITECTURE.md for the codemap and the invariants.
//!
//! Public are the modules the binary (`main.rs`), the integration tests and the benches
//! use; the rest (`backoff`, `suggest`) are the crate's own, reached
//! from outside only through `app`, `tools` and `transport`.

pub mod alarms;
pub mod app;
pub(crate) mod backoff;
pub mod cli;
pub mod config;
pub mod console;
#[cfg(feature = "demo")]
pub mod demo;
pub mod driver;
pub mod hub;
pub mod ids;
pub mod kinds;
pub mod logs;
pub mod metrics;
pub mod plain;
pub mod poller;
pub mod reading;
pub mod registry;
pub mod resilience;
pub mod service;
pub mod sparkplug;
pub mod spb;
pub mod store;
pub(crate) mod suggest;
pub mod tls;
pub mod toml_reader;
pub mod tools;
pub mod transport;
pub mod work_orders;
