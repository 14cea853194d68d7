//! Store-and-forward's way out: what the buffer holds goes out as historical DDATA while the
//! node is online, a chunk at a time within half the client's queue, and leaves the buffer
//! only once the MQTT client has written it (a value still queued in the client at `kill
//! -9` was never sent); removals are made durable every flush interval.

use super::*;

impl Node {
    /// Removes from the buffer the drained values the client has written.
    pub(super) fn remove_written(&mut self) {
        let mut keys = Vec::new();
        while self.unwritten.front().is_some_and(|(n, _)| *n <= self.written) {
            if let Some((_, k)) = self.unwritten.pop_front() {
                keys.extend(k);
            }
        }
        if !keys.is_empty()
            && let Err(error) = self.buffer.remove(&keys)
        {
            tracing::warn!(%error, "sparkplug buffer: sent values not removed; they may be sent again");
        }
        if self.unwritten.is_empty() {
            // Values skipped meanwhile (a device not born then) are the drain's again.
            self.drain_cursor = None;
        }
    }

    /// Writes the buffer when a flush interval has passed since the last write: what
    /// waits in memory, and the removals of what was sent (durable from then on).
    pub(super) fn flush_due(&mut self, now: i64) {
        if self.last_flush.elapsed() < self.flush_every {
            return;
        }
        self.last_flush = Instant::now();
        if let Err(error) = self.buffer.flush(now) {
            tracing::debug!(%error, "sparkplug buffer flush failed; values kept in memory");
        }
        self.written();
    }

    /// After a write to the buffer: its problem, if any, shown in health and metrics (the
    /// store logs the start and end of an outage once each).
    pub(super) fn written(&mut self) {
        *self.counters.buffer_problem.lock() = self.buffer.problem().map(|p| (p.reason, p.since));
    }

    /// The drain uses at most half of the room, so live data always finds the other half
    /// (otherwise live values would go to the buffer behind the drain and never catch up).
    pub(super) fn can_drain(&self) -> bool {
        self.phase == Phase::Online
            && !self.drain_idle
            && !self.buffer.is_empty()
            && self.queued + (DRAIN_CHUNK / PER_MESSAGE) as u64 + 1 < QUEUED_MAX / 2
            && !self.births_pending()
    }

    /// One step of the drain: the oldest values of born devices, as historical DDATA.
    pub(super) fn drain(&mut self) {
        let now = chrono::Utc::now().timestamp_millis();
        let (edge, registry) = (&self.edge, self.edge.registry_arc());
        let born = |id: &str| {
            id.parse().ok().and_then(|id| registry.sensor(&id)).is_some_and(|s| edge.is_born(s.place.device))
        };
        // Past what is handed over and not yet written (still in the file until it is).
        let after = if self.unwritten.is_empty() { None } else { self.drain_cursor };
        let taken = match self.buffer.oldest(DRAIN_CHUNK, now, after, born) {
            Ok(t) => t,
            Err(error) => {
                tracing::debug!(%error, "sparkplug buffer unreadable now; drain waits");
                self.drain_idle = true;
                return;
            }
        };
        if taken.is_empty() {
            self.drain_idle = true;
            return;
        }
        // A value its device's DBIRTH carried is not sent again: it leaves with the sent ones.
        let (repeats, taken): (Vec<_>, Vec<_>) =
            taken.into_iter().partition(|(_, r)| self.edge.carried_by_birth(&r.sensor, r.t));
        let repeats: Vec<_> = repeats.iter().map(|(k, r)| (*k, Buffer::size_of(r))).collect();
        if !repeats.is_empty()
            && let Err(error) = self.buffer.remove(&repeats)
        {
            tracing::warn!(%error, "sparkplug buffer: values a birth carried not removed; they may be sent");
        }
        let keys: Vec<_> = taken.iter().map(|(k, r)| (*k, Buffer::size_of(r))).collect();
        let recs: Vec<Rec> = taken.into_iter().map(|(_, r)| r).collect();
        let outs = self.edge.ddata(&recs, true, PER_MESSAGE);
        let per_out: Vec<Vec<(Key, u64)>> =
            outs.iter().map(|o| o.recs.iter().filter_map(|&j| keys.get(j).copied()).collect()).collect();
        let handed_before = self.written + self.queued;
        let unsent = self.hand_over(outs);
        if !unsent.is_empty() {
            self.drain_idle = true;
        }
        // What was handed over leaves the buffer once the client has written it (the
        // messages handed over are the first ones, in order); what was not stays for the
        // next step.
        let handed = (self.written + self.queued - handed_before) as usize;
        for (i, keys) in per_out.into_iter().take(handed).enumerate() {
            self.drain_cursor = keys.iter().map(|(k, _)| *k).chain(self.drain_cursor).max();
            self.unwritten.push_back((handed_before + i as u64 + 1, keys));
        }
        Counters::add(&self.counters.historical_sent, (recs.len() - unsent.len()) as u64);
        self.remove_written();
        // Removals are made durable every flush interval during a drain too (a durable
        // commit keeps the ones before it): after `kill -9` only that window is sent again.
        self.flush_due(now);
        if self.buffer.is_empty() {
            self.edge.forget_carried();
        }
        self.counters.buffered.store(self.buffer.len(), Ordering::Relaxed);
    }
}
