//! The Sparkplug edge node's counters: kept by `sparkplug/` as it works, shown by
//! `get_device_status` (its `northbound` part) and exported on `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::Sheet;

/// What the edge node shows of itself.
#[derive(Default)]
pub struct Counters {
    pub connected: AtomicBool,
    /// Births sent on this connection: data flows.
    pub online: AtomicBool,
    pub connects: AtomicU64,
    pub messages_sent: AtomicU64,
    pub metrics_sent: AtomicU64,
    pub historical_sent: AtomicU64,
    pub buffered: AtomicU64,
    pub dropped: AtomicU64,
    pub commands_refused: AtomicU64,
    pub rebirths: AtomicU64,
    /// Samples the poller could not hand over (the edge node's queue was full).
    pub samples_lost: std::sync::Arc<AtomicU64>,
    pub broker: Mutex<String>,
    /// Why the link is down (the last connection's failure), while it is.
    pub link_error: Mutex<Option<String>>,
    /// Why the store-and-forward buffer cannot be written, and since when (its values
    /// wait in memory meanwhile, within its size bound).
    pub buffer_problem: Mutex<Option<(String, chrono::DateTime<chrono::Utc>)>>,
}

impl Counters {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn broker(&self) -> String {
        self.broker.lock().clone()
    }

    /// The link in a word: `online`, `connected` (waiting for the primary host), `down`.
    pub fn state(&self) -> &'static str {
        match (self.connected.load(Ordering::Relaxed), self.online.load(Ordering::Relaxed)) {
            (true, true) => "online",
            (true, false) => "connected",
            _ => "down",
        }
    }
    /// Writes the counters on `/metrics` (`fieldgate_sparkplug_*`).
    pub fn report(&self, s: &mut Sheet<'_>) {
        let flag = |v: &AtomicBool| i64::from(v.load(Ordering::Relaxed));
        let n = |v: &AtomicU64| v.load(Ordering::Relaxed);
        s.gauge(
            "fieldgate_sparkplug_connected",
            "1 while connected to an MQTT broker.",
            flag(&self.connected),
        );
        s.gauge(
            "fieldgate_sparkplug_online",
            "1 while births are sent and data flows (broker and primary host online).",
            flag(&self.online),
        );
        let counters: [(&str, &str, u64); 8] = [
            ("connects", "Connections made to a broker.", n(&self.connects)),
            ("messages_sent", "Sparkplug messages written to the broker.", n(&self.messages_sent)),
            (
                "metrics_sent",
                "Metric values handed to the broker (births, data, drained).",
                n(&self.metrics_sent),
            ),
            ("historical_sent", "Buffered metric values sent as historical.", n(&self.historical_sent)),
            (
                "dropped",
                "Buffered values dropped, oldest first, for the size or age bound.",
                n(&self.dropped),
            ),
            (
                "commands_refused",
                "NCMD/DCMD commands refused (fieldgate never writes from the broker).",
                n(&self.commands_refused),
            ),
            (
                "rebirths",
                "Rebirths asked by NCMD (a node's) or DCMD (a device's) and done.",
                n(&self.rebirths),
            ),
            (
                "samples_lost",
                "Samples the poller could not hand to the edge node (its queue was full).",
                n(&self.samples_lost),
            ),
        ];
        s.gauge(
            "fieldgate_sparkplug_buffer_failing",
            "1 while the store-and-forward buffer cannot be written (its values wait in memory, within its size bound).",
            i64::from(self.buffer_problem.lock().is_some()),
        );
        s.gauge(
            "fieldgate_sparkplug_buffered",
            "Metric values waiting in the store-and-forward buffer.",
            n(&self.buffered) as i64,
        );
        for (name, help, v) in counters {
            s.counter(&format!("fieldgate_sparkplug_{name}"), help, v);
        }
    }
}
