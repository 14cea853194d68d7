//! Northbound: a Sparkplug B edge node over MQTT, with store-and-forward.
//!
//! The wire it shares with the fleet hub (payload, topics) is `crate::spb`. `metric.rs` the sensor → metric mapping, `node.rs` the
//! edge node's state without I/O (births, deaths, `seq`, report by exception), `buffer.rs`
//! the durable store-and-forward buffer (redb), and `run.rs` the task that connects (rumqttc), sends, buffers and drains. Off unless
//! `[mqtt] brokers` lists a URL. docs/sparkplug.md has the mapping and the guarantees.

pub mod alarm;
pub mod buffer;
pub mod metric;
pub mod node;
pub mod run;

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::sparkplug::Counters;
use crate::service::Core;
use crate::spb::topic::Topics;

/// Batches of samples the edge node's queue holds, at most, before the feed counts the
/// rest as lost.
const QUEUE: usize = 4096;

/// A running edge node.
pub struct Started {
    pub task: JoinHandle<()>,
    pub counters: Arc<Counters>,
}

#[derive(Debug, thiserror::Error)]
pub enum SparkplugError {
    #[error("{0}")]
    Buffer(#[from] buffer::BufferError),
    #[error("mqtt: {0}")]
    Link(#[from] crate::spb::link::LinkError),
}

/// The group ID: configured, or the devices' plant (`fieldgate` when they span several).
pub fn group_id(core: &Core) -> String {
    let c = &core.config.mqtt;
    if !c.group_id.is_empty() {
        return c.group_id.clone();
    }
    let plants = core.registry.plants();
    match plants.iter().next() {
        Some(p) if plants.len() == 1 => p.to_string(),
        _ => "fieldgate".into(),
    }
}

/// The edge node ID: configured, or the host name.
pub fn edge_node_id(core: &Core) -> String {
    let c = &core.config.mqtt;
    if c.edge_node_id.is_empty() { crate::spb::link::host_name() } else { c.edge_node_id.clone() }
}

/// Starts the edge node when `[mqtt] brokers` is set (`None` otherwise): opens its buffer
/// in the data directory, subscribes to the core's sample feed (before the poller starts),
/// reports its counters on `/metrics` and in the core, and spawns its task.
pub fn start(
    core: &Core,
    env: impl Fn(&str) -> Option<String>,
    stop: CancellationToken,
) -> Result<Option<Started>, SparkplugError> {
    let cfg = core.config.mqtt.clone();
    if !cfg.enabled() {
        return Ok(None);
    }
    let (group, node_id) = (group_id(core), edge_node_id(core));
    let settings = crate::spb::link::Settings::of(&(&cfg).into(), &format!("fieldgate-{node_id}"), env)?;
    let path = core.config.storage.data_dir.join(buffer::FILE);
    let buffer = buffer::Buffer::open(
        &path,
        cfg.buffer_max_mb.saturating_mul(1 << 20),
        (cfg.buffer_max_age_h as i64).saturating_mul(3_600_000),
    )?;
    let max_silence = (cfg.max_silence_s as i64).saturating_mul(1000);
    let edge = node::Edge::new(Topics::new(&group, &node_id), core.registry.clone(), max_silence);
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    core.metrics.collect("sparkplug", move |s| c.report(s));
    let _ = core.sparkplug.set(counters.clone());
    let samples = core.feed.subscribe(QUEUE, counters.samples_lost.clone());
    tracing::info!(group = %group, edge_node = %node_id, brokers = ?cfg.brokers, "sparkplug edge node starting");
    let node = run::Node::new(core.clone(), cfg, edge, buffer, settings, counters.clone());
    let task = node.start(samples, stop);
    Ok(Some(Started { task, counters }))
}
