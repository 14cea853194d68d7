//! Northbound: a Sparkplug B edge node over MQTT, with store-and-forward.
//!
//! `payload.rs` the protobuf messages (prost, from the specification's field numbers),
//! `topic.rs` the topic namespace, `metric.rs` the sensor → metric mapping, `node.rs` the
//! edge node's state without I/O (births, deaths, `seq`, report by exception), `buffer.rs`
//! the durable store-and-forward buffer (redb), `config.rs` the `[mqtt]` section, and
//! `run.rs` the task that connects (rumqttc), sends, buffers and drains. Off unless
//! `[mqtt] brokers` lists a URL. docs/sparkplug.md has the mapping and the guarantees.

pub mod buffer;
pub mod config;
pub mod metric;
pub mod node;
pub mod payload;
pub mod topic;
