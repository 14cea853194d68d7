//! Every number fieldgate exports and the one Prometheus exposition of them (`GET
//! /metrics`), through the Prometheus project's `prometheus-client`: no room writes
//! `# HELP`/`# TYPE` lines of its own.
//!
//! Two kinds of metric: those counted here as things happen (tool calls and their
//! latency, device reads' latency), and those a room keeps itself and reports when
//! `/metrics` is read ([`Metrics::collect`]: a breaker's state, the store's counters,
//! the Sparkplug link's counters of [`sparkplug::Counters`]), each through a [`Sheet`].

pub mod sparkplug;

use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Histogram bucket bounds, in seconds.
const BOUNDS: [f64; 14] =
    [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabel {
    device: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BOUNDS)
}

/// Process-wide metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// The rooms' reports by name, in the order first given; one collector writes them all.
    reports: std::sync::Arc<Mutex<Vec<(&'static str, ReportFn)>>>,
    calls: Family<CallLabels, Counter>,
    call_latency: Histograms<ToolLabel>,
    device_latency: Histograms<DeviceLabel>,
}

impl Default for Metrics {
    fn default() -> Self {
        let calls = Family::<CallLabels, Counter>::default();
        let call_latency: Histograms<ToolLabel> = Family::new_with_constructor(histogram);
        let device_latency: Histograms<DeviceLabel> = Family::new_with_constructor(histogram);
        let mut registry = Registry::default();
        let reports = std::sync::Arc::new(Mutex::new(Vec::new()));
        registry.register_collector(Box::new(Reports(reports.clone())));
        // `register` adds the period at the end of a help text; `Sheet` texts carry their own.
        registry.register("fieldgate_tool_calls", "Tool calls by tool and outcome code", calls.clone());
        registry.register("fieldgate_tool_call_seconds", "Tool call latency", call_latency.clone());
        registry.register(
            "fieldgate_device_read_seconds",
            "Device read latency, failures included",
            device_latency.clone(),
        );
        Metrics { registry: Mutex::new(registry), reports, calls, call_latency, device_latency }
    }
}

impl Metrics {
    /// One tool call and its outcome code (`OK` for success).
    pub fn call(&self, tool: &'static str, code: &'static str, took: Duration) {
        self.calls.get_or_create(&CallLabels { tool, code }).inc();
        self.call_latency.get_or_create(&ToolLabel { tool }).observe(took.as_secs_f64());
    }

    /// The read-latency histogram of `device`, to observe each read with (the reading
    /// core takes one per device when it starts, so a read never looks it up).
    pub fn device_reads(&self, device: &str) -> Histogram {
        self.device_latency.get_or_create(&DeviceLabel { device: device.to_string() }).clone()
    }

    /// Adds `report`, called on every render to write what a room keeps itself. A report
    /// given again under the same name replaces the earlier one (a room built anew over the
    /// same metrics, as tests do), so no metric is written twice.
    pub fn collect(&self, what: &'static str, report: impl Fn(&mut Sheet<'_>) + Send + Sync + 'static) {
        let mut reports = self.reports.lock();
        match reports.iter_mut().find(|(w, _)| *w == what) {
            Some(slot) => slot.1 = Box::new(report),
            None => reports.push((what, Box::new(report))),
        }
    }

    /// Calls counted for one tool and code.
    pub fn calls_of(&self, tool: &'static str, code: &'static str) -> u64 {
        self.calls.get(&CallLabels { tool, code }).map_or(0, |c| c.get())
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
        if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(%error, "metrics could not be rendered");
        }
        out
    }
}

type ReportFn = Box<dyn Fn(&mut Sheet<'_>) + Send + Sync>;

/// The rooms' numbers, reported when `/metrics` is read.
struct Reports(std::sync::Arc<Mutex<Vec<(&'static str, ReportFn)>>>);

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.lock().iter().map(|(w, _)| *w).collect();
        write!(f, "Reports({names:?})")
    }
}

impl Collector for Reports {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut sheet = Sheet { encoder, failed: None };
        for (_, report) in self.0.lock().iter() {
            report(&mut sheet);
        }
        sheet.failed.map_or(Ok(()), Err)
    }
}

/// Where a room writes its numbers. Names are the metric's without `_total` (the
/// exposition adds it to counters); help texts are full sentences.
pub struct Sheet<'a> {
    encoder: DescriptorEncoder<'a>,
    failed: Option<std::fmt::Error>,
}

impl Sheet<'_> {
    /// One counter without labels.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.write(name, help, MetricType::Counter, |e| ConstCounter::new(value).encode(e));
    }

    /// One gauge without labels.
    pub fn gauge(&mut self, name: &str, help: &str, value: i64) {
        self.write(name, help, MetricType::Gauge, |e| ConstGauge::new(value).encode(e));
    }

    /// A counter with one label, a row per value of it.
    pub fn counters<'r>(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        rows: impl IntoIterator<Item = (&'r str, u64)>,
    ) {
        self.rows(name, help, MetricType::Counter, label, rows, |v, e| ConstCounter::new(v).encode(e));
    }

    /// A gauge with one label, a row per value of it.
    pub fn gauges<'r>(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        rows: impl IntoIterator<Item = (&'r str, i64)>,
    ) {
        self.rows(name, help, MetricType::Gauge, label, rows, |v, e| ConstGauge::new(v).encode(e));
    }

    fn write(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        value: impl FnOnce(prometheus_client::encoding::MetricEncoder<'_>) -> Result<(), std::fmt::Error>,
    ) {
        if self.failed.is_some() {
            return;
        }
        let done = self.encoder.encode_descriptor(name, help, None, kind).and_then(value);
        if let Err(e) = done {
            self.failed = Some(e);
        }
    }

    fn rows<'r, V>(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        label: &str,
        rows: impl IntoIterator<Item = (&'r str, V)>,
        value: impl Fn(V, prometheus_client::encoding::MetricEncoder<'_>) -> Result<(), std::fmt::Error>,
    ) {
        if self.failed.is_some() {
            return;
        }
        let done = self.encoder.encode_descriptor(name, help, None, kind).and_then(|mut family| {
            for (l, v) in rows {
                let labels = [(label, l)];
                value(v, family.encode_family(&labels)?)?;
            }
            Ok(())
        });
        if let Err(e) = done {
            self.failed = Some(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        m.call("list_sensors", "OK", Duration::from_micros(300));
        m.call("list_sensors", "OK", Duration::from_millis(20));
        m.call("get_sensor_reading", "DEVICE_TIMEOUT", Duration::from_millis(500));
        m.device_reads("a-line1-plc").observe(0.003);
        let text = m.render();
        assert!(text.contains("fieldgate_tool_calls_total{tool=\"list_sensors\",code=\"OK\"} 2"), "{text}");
        assert!(
            text.contains(
                "fieldgate_tool_calls_total{tool=\"get_sensor_reading\",code=\"DEVICE_TIMEOUT\"} 1"
            )
        );
        assert!(text.contains("# HELP fieldgate_tool_calls_total Tool calls by tool and outcome code.\n"));
        assert!(text.contains("fieldgate_tool_call_seconds_bucket{tool=\"list_sensors\",le=\"0.0005\"} 1"));
        assert!(text.contains("fieldgate_tool_call_seconds_bucket{tool=\"list_sensors\",le=\"0.025\"} 2"));
        assert!(text.contains("fieldgate_tool_call_seconds_count{tool=\"list_sensors\"} 2"));
        assert!(text.contains("fieldgate_device_read_seconds_count{device=\"a-line1-plc\"} 1"));
        assert_eq!(m.calls_of("list_sensors", "OK"), 2);
    }

    #[test]
    fn a_room_reports_through_a_sheet() {
        let m = Metrics::default();
        m.collect("test", |s| {
            s.counter("fieldgate_things", "Things seen.", 7);
            s.gauge("fieldgate_level", "A level.", -2);
            s.gauges("fieldgate_state", "State per device.", "device", [("a", 1), ("b", 2)]);
        });
        m.collect("again", |s| s.counter("fieldgate_again", "Old.", 1));
        m.collect("again", |s| s.counter("fieldgate_again", "New.", 2));
        let text = m.render();
        for want in [
            "# HELP fieldgate_things_total Things seen.\n# TYPE fieldgate_things_total counter\nfieldgate_things_total 7\n",
            "# TYPE fieldgate_level gauge\nfieldgate_level -2\n",
            "fieldgate_state{device=\"a\"} 1\nfieldgate_state{device=\"b\"} 2\n",
            "# HELP fieldgate_again_total New.\n# TYPE fieldgate_again_total counter\nfieldgate_again_total 2\n",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        assert_eq!(
            text.matches("fieldgate_again_total").count(),
            3,
            "a report given again replaces the first"
        );
    }
}
