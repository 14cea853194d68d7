//! The birth sequence: NBIRTH, then a DBIRTH for each device that is up once its sensors
//! have values (or `BIRTH_WAIT` passed), and no data message until it is over.

use super::*;

impl Node {
    /// NBIRTH, then DBIRTH for every device that is up; data flows from here.
    pub(super) fn birth(&mut self) {
        let alarms = self.alarm_metrics();
        let nbirth = self.edge.nbirth_with(self.bd_seq, alarms);
        let sent = nbirth.payload.clone();
        self.send(nbirth);
        self.online_at = Instant::now();
        for d in 0..self.edge.registry().devices().len() {
            if self.ready(d) {
                self.dbirth(d);
            }
        }
        self.phase = Phase::Online;
        self.drain_idle = false;
        // Online once the broker is seen to take the births (at once when not checked).
        self.echo_birth_sent(&sent);
    }

    pub(super) fn dbirth(&mut self, device: usize) {
        let reader = self.core.reader.clone();
        let out = self.edge.dbirth(device, |s| reader.cache().last(s));
        // With nothing buffered, no drained value can repeat this birth (or an earlier one).
        if self.buffer.is_empty() {
            self.edge.forget_carried();
        }
        if let Some(r) = self.returning.get_mut(device) {
            *r = None;
        }
        // Live values gathered before the birth that it carried (or older) are not sent.
        let edge = &self.edge;
        self.live.retain(|r| !edge.birth_covers(&r.sensor, r.t));
        self.send(out);
        if !self.echo_unconfirmed() {
            // On a connection the broker was seen to take (or not checked).
            self.edge.births_taken();
        }
        self.drain_idle = false;
    }

    /// A device up whose sensors all have a value to be born with (or that had
    /// `BIRTH_WAIT` since the node's birth to get them): a DBIRTH with no values would also
    /// leave an OPC UA node's datatype unknown.
    pub(super) fn ready(&self, device: usize) -> bool {
        if !self.device_up(device) {
            return false;
        }
        let registry = self.edge.registry();
        let reader = &self.core.reader;
        // Back from the dead: born with values read since it died, not the ones from before.
        let (since, waited) = match self.returning.get(device).copied().flatten() {
            Some((dead_ms, up_at)) => (dead_ms, up_at.is_some_and(|t| t.elapsed() >= BIRTH_WAIT)),
            None => (i64::MIN, self.online_at.elapsed() >= BIRTH_WAIT),
        };
        waited
            || registry
                .sensors_of_device(&registry.devices()[device].id)
                .all(|s| reader.cache().last(s).is_some_and(|x| x.at.timestamp_millis() > since))
    }

    /// A device with sensors and a driver whose breaker is not open.
    pub(super) fn device_up(&self, device: usize) -> bool {
        let d = &self.edge.registry().devices()[device];
        let reader = &self.core.reader;
        reader.has_driver(&d.id)
            && self.edge.registry().sensors_of_device(&d.id).next().is_some()
            && reader.guard(&d.id).is_none_or(|g| g.breaker.snapshot().state != SnapshotState::Open)
    }

    /// Whether the birth sequence is not over: a rebirth was asked, the broker is not yet
    /// seen to take the NBIRTH (`echo.rs`), or, within `BIRTH_WAIT` of
    /// the NBIRTH, a device that is up is not born yet. No data message goes out meanwhile
    /// (Sparkplug: a rebirth request stops data; every DBIRTH precedes any DDATA).
    pub(super) fn births_pending(&self) -> bool {
        self.rebirth_pending
            || self.echo_pending()
            || (self.online_at.elapsed() < BIRTH_WAIT
                && (0..self.edge.registry().devices().len())
                    .any(|d| !self.edge.is_born(d) && self.device_up(d)))
    }
}
