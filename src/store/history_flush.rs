//! The history store's flush: one durable redb transaction of the sealed chunks, the
//! changed open chunks of this flush's turn and the journal record of the rest (with a
//! database, each chunk also into the outbox).

use std::collections::HashSet;

use super::journal::{JOURNAL, TURNS};
use super::{CHUNKS, HistoryStore, Pending, Sealed, StoreError, age_late, db, remote};

impl HistoryStore {
    /// Makes every appended point durable: the sealed chunks, the changed open chunks of
    /// this flush's turn (all of them after a flush that failed) and the journal record of
    /// the rest. Returns the chunks written. On failure everything stays in memory for the
    /// next flush.
    pub fn flush(&self) -> Result<usize, StoreError> {
        let mut flushes = self.flushing.lock();
        let k = flushes.next;
        flushes.next += 1;
        if let Some((free, total)) = self.disk_space() {
            let share = total / 100 * u64::from(self.limits.reserve_percent);
            if free < self.limits.reserve_bytes.min(share) {
                self.lock().give_up_journal();
                self.db.set_problem(Some("the disk reserve is reached; history waits in memory"));
                return Err(StoreError::Reserve { free });
            }
        }
        // Copies: what was taken is removed only once it is durable.
        let (sealed, snapshots, record, full) = {
            let mut p = self.lock();
            // Every changed open chunk is written when that costs no more than the record
            // (many points a sensor since the flush before), or after a failure.
            let dirty: usize =
                p.open.values().chain(p.late.values()).filter(|o| o.dirty).map(|o| o.writer.byte_len()).sum();
            let full = std::mem::take(&mut p.full_due) || p.journal.len() >= dirty;
            let sealed: Vec<Sealed> = p.sealed.clone();
            let snapshots: Vec<Sealed> = p
                .open
                .iter()
                .chain(&p.late)
                .filter(|(_, o)| o.dirty && (full || o.turn == k % TURNS))
                .map(|(s, o)| Sealed {
                    sensor: s.clone(),
                    id: o.id,
                    first: o.writer.first_t(),
                    last: o.writer.last_t(),
                    points: o.writer.len(),
                    bytes: o.writer.bytes(),
                })
                .collect();
            // A full flush writes every point the record holds in a chunk.
            let record = std::mem::take(&mut p.journal);
            (sealed, snapshots, if full { Vec::new() } else { record }, full)
        };
        // Records every turn has come round since (all of them, when this flush is full).
        let done: Vec<u64> =
            flushes.on_disk.iter().copied().take_while(|&r| full || r + TURNS <= k).collect();
        if sealed.is_empty() && snapshots.is_empty() && record.is_empty() && done.is_empty() {
            age_late(&mut self.lock());
            return Ok(0);
        }
        let n = sealed.len() + snapshots.len();
        let written = self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            {
                let mut t = tx.open_table(CHUNKS).map_err(db)?;
                for w in sealed.iter().chain(&snapshots) {
                    let mut v = Vec::with_capacity(8 + w.bytes.len());
                    v.extend_from_slice(&w.last.to_le_bytes());
                    v.extend_from_slice(&w.bytes);
                    t.insert((w.sensor.as_str(), w.first), v.as_slice()).map_err(db)?;
                }
                // With a database: each chunk also waits in the outbox until it is there.
                if self.remote.is_some() {
                    let mut o = tx.open_table(remote::OUTBOX).map_err(db)?;
                    for w in sealed.iter().chain(&snapshots) {
                        let v = remote::outbox_value(w.id, w.last, w.points, &w.bytes);
                        o.insert((w.sensor.as_str(), w.first), v.as_slice()).map_err(db)?;
                    }
                }
                let mut j = tx.open_table(JOURNAL).map_err(db)?;
                if !record.is_empty() {
                    j.insert(k, record.as_slice()).map_err(db)?;
                }
                for r in &done {
                    j.remove(*r).map_err(db)?;
                }
            }
            tx.commit().map_err(db)
        });
        let mut p = self.lock();
        if let Err(e) = written {
            p.give_up_journal();
            return Err(e);
        }
        flushes.on_disk.drain(..done.len());
        if !record.is_empty() {
            flushes.on_disk.push_back(k);
        }
        // Written: the sealed chunks taken (new ones were appended behind them, and only
        // the bound can have dropped some of them meanwhile), and each open chunk that
        // has not moved on since its snapshot.
        let written: HashSet<(&str, i64)> = sealed.iter().map(|w| (w.sensor.as_str(), w.first)).collect();
        let mut freed = 0;
        p.sealed.retain(|c| {
            let keep = !written.contains(&(c.sensor.as_str(), c.first));
            freed += if keep { 0 } else { c.bytes.len() };
            keep
        });
        p.sealed_bytes -= freed;
        age_late(&mut p);
        let Pending { open, late, .. } = &mut *p;
        for w in &snapshots {
            for o in [open.get_mut(&w.sensor), late.get_mut(&w.sensor)].into_iter().flatten() {
                if o.writer.first_t() == w.first && o.writer.last_t() == w.last {
                    o.dirty = false;
                }
            }
        }
        Ok(n)
    }

    /// Flushes every changed open chunk, not only those of this flush's turn (at stop, so
    /// that a restart has nothing to replay).
    pub fn flush_all(&self) -> Result<usize, StoreError> {
        self.lock().give_up_journal();
        self.flush()
    }
}
