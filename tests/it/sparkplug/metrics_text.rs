//! `/metrics` read by the Prometheus project's own parser (its Python client, installed by
//! `scripts/test-deps` into `target/py`), with every metric fieldgate exports present: a
//! service with the edge node on a real Mosquitto and a subscribed OPC UA device, so each
//! room has reported.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use super::broker::{Broker, Host, counter};
use super::edge::rig;
use crate::support;

const T: Duration = Duration::from_secs(20);

/// Every sample family `/metrics` had before the exposition moved to `prometheus-client`.
const EVERY_METRIC: [&str; 30] = [
    "fieldgate_auth_scope_refusals_total",
    "fieldgate_tool_calls_total",
    "fieldgate_tool_call_seconds_bucket",
    "fieldgate_tool_call_seconds_sum",
    "fieldgate_tool_call_seconds_count",
    "fieldgate_device_read_seconds_bucket",
    "fieldgate_device_read_seconds_count",
    "fieldgate_breaker_state",
    "fieldgate_breaker_consecutive_failures",
    "fieldgate_storage_failing",
    "fieldgate_storage_free_bytes",
    "fieldgate_history_flush_failures_total",
    "fieldgate_history_points_dropped_total",
    "fieldgate_history_points_late_total",
    "fieldgate_history_points_repeated_total",
    "fieldgate_history_late_chunks_total",
    "fieldgate_points_polled_total",
    "fieldgate_points_stored_total",
    "fieldgate_opcua_sessions_total",
    "fieldgate_opcua_notifications_total",
    "fieldgate_sparkplug_connected",
    "fieldgate_sparkplug_online",
    "fieldgate_sparkplug_connects_total",
    "fieldgate_sparkplug_messages_sent_total",
    "fieldgate_sparkplug_metrics_sent_total",
    "fieldgate_sparkplug_historical_sent_total",
    "fieldgate_sparkplug_buffered",
    "fieldgate_sparkplug_dropped_total",
    "fieldgate_sparkplug_commands_refused_total",
    "fieldgate_sparkplug_rebirths_total",
];

/// The `(type, sample name)` pairs the Prometheus parser reads from `text`; it fails on
/// text that is not valid exposition format.
async fn parsed(text: &str) -> BTreeSet<(String, String)> {
    use tokio::io::AsyncWriteExt;
    let py = support::root().join("target/py");
    assert!(
        py.join("prometheus_client").is_dir(),
        "the Prometheus Python client is not installed: run scripts/test-deps"
    );
    let script = "import sys\nfrom prometheus_client.parser import text_string_to_metric_families\nfor f in text_string_to_metric_families(sys.stdin.read()):\n    for s in f.samples:\n        print(f.type, s.name)\n";
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", &py)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(T, child.wait_with_output())
        .await
        .expect("the Prometheus parser ends within 20 s")
        .unwrap();
    assert!(
        out.status.success(),
        "the parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(t, n)| (t.to_string(), n.to_string())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_with_the_prometheus_parser_and_every_metric_is_there() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let rig = rig(&broker, |_| {}).await;
    host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    let tools = &rig.running.tools;
    tools.call("get_sensor_reading", json!({"sensor_id": "A_LINE1_001"})).await.unwrap();
    counter(tools, "fieldgate_points_polled_total", T, |v| v > 0).await;
    counter(tools, "fieldgate_opcua_notifications_total{device=\"b-oven2-opcua\"}", T, |v| v > 0).await;
    counter(tools, "fieldgate_sparkplug_metrics_sent_total", T, |v| v > 0).await;

    let text = tools.render_metrics();
    let samples = parsed(&text).await;
    let names: BTreeSet<&str> = samples.iter().map(|(_, n)| n.as_str()).collect();
    let missing: Vec<&str> = EVERY_METRIC.iter().copied().filter(|m| !names.contains(m)).collect();
    assert!(missing.is_empty(), "missing from /metrics: {missing:?}\n{text}");
    for (kind, name) in [
        ("counter", "fieldgate_tool_calls_total"),
        ("histogram", "fieldgate_device_read_seconds_count"),
        ("gauge", "fieldgate_breaker_state"),
        ("counter", "fieldgate_sparkplug_rebirths_total"),
        ("gauge", "fieldgate_sparkplug_online"),
    ] {
        assert!(samples.contains(&(kind.to_string(), name.to_string())), "{name} is a {kind}: {samples:?}");
    }
    // Help texts end with one period, as before.
    assert!(
        text.contains("# HELP fieldgate_tool_calls_total Tool calls by tool and outcome code.\n"),
        "{text}"
    );
    assert!(!text.contains(".."), "{text}");
    rig.running.stop().await.unwrap();
}
