//! Counters and histograms, rendered in the Prometheus text format for `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket bounds, in seconds.
const BOUNDS: [f64; 14] =
    [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BOUNDS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (i, b) in BOUNDS.iter().enumerate() {
            if seconds <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, label: &str, value: &str) {
        for (i, b) in BOUNDS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{label}=\"{value}\",le=\"{b}\"}} {}", self.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{{label}=\"{value}\",le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{label}=\"{value}\"}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{label}=\"{value}\"}} {}", self.count);
    }
}

/// A gauge or counter that another layer reports when metrics are rendered.
pub type Collector = Box<dyn Fn(&mut String) + Send + Sync>;

/// Process-wide metrics.
#[derive(Default)]
pub struct Metrics {
    calls: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    call_latency: Mutex<BTreeMap<&'static str, Histogram>>,
    device_latency: Mutex<BTreeMap<String, Histogram>>,
    collectors: Mutex<Vec<Collector>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// One tool call and its outcome code (`OK` for success).
    pub fn call(&self, tool: &'static str, code: &'static str, took: Duration) {
        *lock(&self.calls).entry((tool, code)).or_default() += 1;
        lock(&self.call_latency).entry(tool).or_default().observe(took.as_secs_f64());
    }

    /// One read from a device, successful or not.
    pub fn device_read(&self, device: &str, took: Duration) {
        let mut map = lock(&self.device_latency);
        match map.get_mut(device) {
            Some(h) => h.observe(took.as_secs_f64()),
            None => {
                let mut h = Histogram::default();
                h.observe(took.as_secs_f64());
                map.insert(device.to_string(), h);
            }
        }
    }

    /// Adds a collector called on every render (breaker states, poller counters, ...).
    pub fn register(&self, collector: Collector) {
        lock(&self.collectors).push(collector);
    }

    /// Calls counted for one tool and code.
    pub fn calls_of(&self, tool: &str, code: &str) -> u64 {
        lock(&self.calls).iter().filter(|((t, c), _)| *t == tool && *c == code).map(|(_, n)| n).sum()
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP fieldgate_tool_calls_total Tool calls by tool and outcome code.\n");
        out.push_str("# TYPE fieldgate_tool_calls_total counter\n");
        for ((tool, code), n) in lock(&self.calls).iter() {
            let _ = writeln!(out, "fieldgate_tool_calls_total{{tool=\"{tool}\",code=\"{code}\"}} {n}");
        }
        out.push_str("# HELP fieldgate_tool_call_seconds Tool call latency.\n");
        out.push_str("# TYPE fieldgate_tool_call_seconds histogram\n");
        for (tool, h) in lock(&self.call_latency).iter() {
            h.render(&mut out, "fieldgate_tool_call_seconds", "tool", tool);
        }
        out.push_str("# HELP fieldgate_device_read_seconds Device read latency, failures included.\n");
        out.push_str("# TYPE fieldgate_device_read_seconds histogram\n");
        for (device, h) in lock(&self.device_latency).iter() {
            h.render(&mut out, "fieldgate_device_read_seconds", "device", device);
        }
        for c in lock(&self.collectors).iter() {
            c(&mut out);
        }
        out
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
        m.device_read("a-line1-plc", Duration::from_millis(3));
        let text = m.render();
        assert!(text.contains("fieldgate_tool_calls_total{tool=\"list_sensors\",code=\"OK\"} 2"), "{text}");
        assert!(
            text.contains(
                "fieldgate_tool_calls_total{tool=\"get_sensor_reading\",code=\"DEVICE_TIMEOUT\"} 1"
            )
        );
        assert!(text.contains("fieldgate_tool_call_seconds_bucket{tool=\"list_sensors\",le=\"0.0005\"} 1"));
        assert!(text.contains("fieldgate_tool_call_seconds_bucket{tool=\"list_sensors\",le=\"0.025\"} 2"));
        assert!(text.contains("fieldgate_tool_call_seconds_count{tool=\"list_sensors\"} 2"));
        assert!(text.contains("fieldgate_device_read_seconds_count{device=\"a-line1-plc\"} 1"));
        assert_eq!(m.calls_of("list_sensors", "OK"), 2);
    }
}
