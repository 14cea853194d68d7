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
pub mod link;
pub mod metric;
pub mod node;
pub mod payload;
pub mod run;
pub mod topic;

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::tools::ToolService;
use link::Counters;

/// A running edge node.
pub struct Started {
    /// For the poller: where samples go.
    pub tap: run::Tap,
    pub task: JoinHandle<()>,
    pub counters: Arc<Counters>,
}

#[derive(Debug, thiserror::Error)]
pub enum SparkplugError {
    #[error("{0}")]
    Buffer(#[from] buffer::BufferError),
    #[error("mqtt: {0}")]
    Link(#[from] link::LinkError),
}

/// The group ID: configured, or the devices' plant (`fieldgate` when they span several).
pub fn group_id(tools: &ToolService) -> String {
    let c = &tools.config().mqtt;
    if !c.group_id.is_empty() {
        return c.group_id.clone();
    }
    let plants = tools.registry().plants();
    match plants.iter().next() {
        Some(p) if plants.len() == 1 => p.to_string(),
        _ => "fieldgate".into(),
    }
}

/// The edge node ID: configured, or the host name.
pub fn edge_node_id(tools: &ToolService) -> String {
    let c = &tools.config().mqtt;
    if c.edge_node_id.is_empty() { link::host_name() } else { c.edge_node_id.clone() }
}

/// Starts the edge node when `[mqtt] brokers` is set (`None` otherwise): opens its buffer
/// in the data directory, registers its counters for `/metrics`, and spawns its task.
pub fn start(
    tools: &ToolService,
    env: impl Fn(&str) -> Option<String>,
    stop: CancellationToken,
) -> Result<Option<Started>, SparkplugError> {
    let cfg = tools.config().mqtt.clone();
    if !cfg.enabled() {
        return Ok(None);
    }
    let (group, node_id) = (group_id(tools), edge_node_id(tools));
    let settings = link::Settings::of(&cfg, &node_id, env)?;
    let path = tools.config().storage.data_dir.join(buffer::FILE);
    let buffer = buffer::Buffer::open(
        &path,
        cfg.buffer_max_mb.saturating_mul(1 << 20),
        (cfg.buffer_max_age_h as i64).saturating_mul(3_600_000),
    )?;
    let max_silence = cfg.max_silence_s as i64 * 1000;
    let edge = node::Edge::new(topic::Topics::new(&group, &node_id), tools.registry_arc(), max_silence);
    let counters = Arc::new(Counters::default());
    register_metrics(tools, counters.clone());
    tracing::info!(group = %group, edge_node = %node_id, brokers = ?cfg.brokers, "sparkplug edge node starting");
    let node = run::Node::new(tools.clone(), cfg, edge, buffer, settings, counters.clone());
    let (tap, task) = node.start(stop);
    Ok(Some(Started { tap, task, counters }))
}

fn register_metrics(tools: &ToolService, c: Arc<Counters>) {
    tools.metrics().register(Box::new(move |out: &mut String| {
        use std::fmt::Write;
        let g = |v: &std::sync::atomic::AtomicU64| Counters::get(v);
        let flag =
            |v: &std::sync::atomic::AtomicBool| u64::from(v.load(std::sync::atomic::Ordering::Relaxed));
        let rows: [(&str, &str, &str, u64); 11] = [
            ("connected", "gauge", "1 while connected to an MQTT broker.", flag(&c.connected)),
            (
                "online",
                "gauge",
                "1 while births are sent and data flows (broker and primary host online).",
                flag(&c.online),
            ),
            ("connects_total", "counter", "Connections made to a broker.", g(&c.connects)),
            (
                "messages_sent_total",
                "counter",
                "Sparkplug messages written to the broker.",
                g(&c.messages_sent),
            ),
            (
                "metrics_sent_total",
                "counter",
                "Metric values handed to the broker (births, data, drained).",
                g(&c.metrics_sent),
            ),
            (
                "historical_sent_total",
                "counter",
                "Buffered metric values sent as historical.",
                g(&c.historical_sent),
            ),
            ("buffered", "gauge", "Metric values waiting in the store-and-forward buffer.", g(&c.buffered)),
            (
                "dropped_total",
                "counter",
                "Buffered values dropped, oldest first, for the size or age bound.",
                g(&c.dropped),
            ),
            (
                "commands_refused_total",
                "counter",
                "NCMD/DCMD commands refused (fieldgate never writes from the broker).",
                g(&c.commands_refused),
            ),
            ("rebirths_total", "counter", "Rebirths asked by NCMD and done.", g(&c.rebirths)),
            (
                "samples_lost_total",
                "counter",
                "Samples the poller could not hand to the edge node (its queue was full).",
                g(&c.samples_lost),
            ),
        ];
        for (name, kind, help, v) in rows {
            let _ = writeln!(
                out,
                "# HELP fieldgate_sparkplug_{name} {help}\n# TYPE fieldgate_sparkplug_{name} {kind}"
            );
            let _ = writeln!(out, "fieldgate_sparkplug_{name} {v}");
        }
    }));
}
