//! The fleet hub: a Sparkplug B primary host application over the brokers the edges
//! already publish to, serving the same tools for every edge node of the fleet.
//!
//! `fleet.rs` the fleet as the host sees it, without I/O (births, deaths, `seq`, aliases,
//! latest values, rebirth requests); `metric.rs` what a metric says (properties, quality,
//! its value as its datatype says).

pub mod catalogue;
pub mod fleet;
pub mod metric;
pub mod source;
