//! The alarms' states on the wire (`sparkplug/alarm.rs` has the convention): in every
//! NBIRTH, and an NDATA of those that changed, on the tick after they did.

use super::*;

impl Node {
    /// Every alarm as a birth carries it (none without an alarm engine).
    pub(super) fn alarm_metrics(&mut self) -> Vec<crate::spb::payload::Metric> {
        let Some(alarms) = self.alarms.clone() else { return Vec::new() };
        if let Some(rx) = self.alarm_changes.as_mut() {
            rx.borrow_and_update();
        }
        let listing = alarms.listing();
        self.alarm_sent.birth(self.edge.registry(), &listing)
    }

    /// The alarms that changed since they were last sent, as an NDATA (when online and
    /// born); an alarm the birth did not carry asks for a rebirth.
    pub(super) fn send_alarms(&mut self) {
        let Some(alarms) = self.alarms.clone() else { return };
        if self.phase != Phase::Online || self.births_pending() {
            return;
        }
        let Some(rx) = self.alarm_changes.as_mut() else { return };
        if !rx.has_changed().unwrap_or(false) {
            return;
        }
        rx.borrow_and_update();
        let listing = alarms.listing();
        match self.alarm_sent.changes(self.edge.registry(), &listing) {
            None => self.rebirth_pending = true,
            Some(metrics) if metrics.is_empty() => {}
            Some(metrics) => {
                let out = self.edge.ndata(metrics);
                self.send(out);
            }
        }
    }
}
