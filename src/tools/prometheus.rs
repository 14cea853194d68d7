//! `/metrics` text (Prometheus exposition format): the calls and latencies of
//! [`crate::metrics`], then each device's breaker, then storage and history.

use super::ToolService;

impl ToolService {
    /// `/metrics`: calls and latencies, then the state of every device's breaker.
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write;
        let mut out = self.inner.metrics.render();
        out.push_str(
            "# HELP fieldgate_breaker_state Circuit breaker per device: 0 closed, 1 half-open, 2 open.\n",
        );
        out.push_str("# TYPE fieldgate_breaker_state gauge\n");
        let mut failures = String::new();
        for d in self.inner.registry.devices() {
            if let Some(g) = self.inner.reader.guard(&d.id) {
                let s = g.breaker.snapshot();
                let v = match s.state {
                    crate::resilience::breaker::SnapshotState::Closed => 0,
                    crate::resilience::breaker::SnapshotState::HalfOpen => 1,
                    crate::resilience::breaker::SnapshotState::Open => 2,
                };
                let _ = writeln!(out, "fieldgate_breaker_state{{device=\"{}\"}} {v}", d.id);
                let _ = writeln!(
                    failures,
                    "fieldgate_breaker_consecutive_failures{{device=\"{}\"}} {}",
                    d.id, s.consecutive_failures
                );
            }
        }
        out.push_str(
            "# HELP fieldgate_breaker_consecutive_failures Transient failures in a row per device.\n",
        );
        out.push_str("# TYPE fieldgate_breaker_consecutive_failures gauge\n");
        out.push_str(&failures);
        let storage = self.storage();
        let history = self.inner.history.as_ref();
        out.push_str("# HELP fieldgate_storage_failing 1 while a store cannot write (history waits in memory, work orders are refused).\n# TYPE fieldgate_storage_failing gauge\n");
        let _ = writeln!(
            out,
            "fieldgate_storage_failing {}",
            u8::from(storage.state != super::defs::StorageState::Ok)
        );
        if let Some(free) = storage.free_bytes {
            out.push_str("# HELP fieldgate_storage_free_bytes Free space of the data directory's filesystem.\n# TYPE fieldgate_storage_free_bytes gauge\n");
            let _ = writeln!(out, "fieldgate_storage_free_bytes {free}");
        }
        out.push_str("# HELP fieldgate_history_flush_failures_total History writes that failed (their points were kept in memory).\n# TYPE fieldgate_history_flush_failures_total counter\n");
        let _ =
            writeln!(out, "fieldgate_history_flush_failures_total {}", history.map_or(0, |h| h.failures()));
        out.push_str("# HELP fieldgate_history_points_dropped_total History points dropped because writes failed for longer than memory could hold.\n# TYPE fieldgate_history_points_dropped_total counter\n");
        let _ = writeln!(
            out,
            "fieldgate_history_points_dropped_total {}",
            history.map_or(0, |h| h.dropped_points())
        );
        out.push_str("# HELP fieldgate_history_points_out_of_order_total History points dropped because a device sent them before (or at) the sensor's last one, by less than a minute.\n# TYPE fieldgate_history_points_out_of_order_total counter\n");
        let _ = writeln!(
            out,
            "fieldgate_history_points_out_of_order_total {}",
            history.map_or(0, |h| h.out_of_order_points())
        );
        out.push_str("# HELP fieldgate_history_clock_steps_total History points that came a minute or more before the sensor's last one (the clock stepped back); each started a new chunk.\n# TYPE fieldgate_history_clock_steps_total counter\n");
        let _ =
            writeln!(out, "fieldgate_history_clock_steps_total {}", history.map_or(0, |h| h.clock_steps()));
        out
    }
}
