//! Sparkplug B on the wire, as both of its sides speak it: the edge node (`sparkplug/`)
//! and the fleet hub, a host application (`hub/`). `payload.rs` the protobuf messages
//! (prost, from the specification's field numbers), `topic.rs` the topic namespace,
//! `link.rs` one MQTT connection (options, will, credentials, TLS files).
//! Nothing here knows a sensor, a device file or a tool.

pub mod link;

/// The name of an alarm's node metric is this and its alarm ID (fieldgate's convention,
/// docs/sparkplug.md "Alarms"): the edge node writes them, the hub reads them.
pub const ALARM_PREFIX: &str = "Alarms/";

pub mod payload;
pub mod topic;
