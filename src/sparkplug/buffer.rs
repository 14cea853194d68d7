//! Store-and-forward: metric values that could not be sent, in redb, in timestamp order.
//!
//! Values are appended in memory and written by [`Buffer::flush`] in one durable
//! transaction every `storage.flush_interval_ms`, as history is: a power cut loses at most
//! one flush interval. The buffer is bounded by size and by age; beyond either, the oldest
//! values are dropped, counted and logged. What waits in memory while writes fail (a full
//! disk) is bounded by the same size. A damaged file is refused at start with what to do
//! (see [`crate::store::db`]), like history's. The edge node's `bdSeq` is kept here too,
//! so a restart sends a new one.
//!
//! Table `values`: key `(t_ms, n)` (n: an insertion counter), value
//! `quality (1) ++ id length (1) ++ sensor ID ++ tag (1) ++ value`.

use std::collections::VecDeque;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::store::db::{Db, Problem, StorageFailure};
use crate::store::gorilla::Stored;

const VALUES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("values");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The file in the data directory.
pub const FILE: &str = "sparkplug.redb";

#[derive(Debug, thiserror::Error)]
pub enum BufferError {
    #[error("sparkplug buffer: {0}")]
    Db(String),
    #[error("sparkplug buffer: a stored value is corrupt")]
    Corrupt,
}

impl StorageFailure for BufferError {
    fn storage(reason: String) -> Self {
        BufferError::Db(reason)
    }
    fn is_storage(&self) -> bool {
        matches!(self, BufferError::Db(_))
    }
}

fn db_err(e: impl std::fmt::Display) -> BufferError {
    BufferError::Db(e.to_string())
}

/// One metric value waiting to be sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub sensor: String,
    pub t: i64,
    pub value: Stored,
    pub quality: u8,
}

impl Rec {
    fn encode(&self) -> Vec<u8> {
        let id = &self.sensor.as_bytes()[..self.sensor.len().min(255)];
        let mut out = Vec::with_capacity(12 + id.len());
        out.push(self.quality);
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        match &self.value {
            Stored::Float(f) => {
                out.push(0);
                out.extend_from_slice(&f.to_le_bytes());
            }
            Stored::Int(i) => {
                out.push(1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Stored::UInt(u) => {
                out.push(4);
                out.extend_from_slice(&u.to_le_bytes());
            }
            Stored::Bool(b) => out.extend([2, u8::from(*b)]),
            Stored::Text(s) => {
                out.push(3);
                out.extend_from_slice(s.as_bytes());
            }
        }
        out
    }

    fn decode(t: u64, b: &[u8]) -> Result<Rec, BufferError> {
        let (&quality, rest) = b.split_first().ok_or(BufferError::Corrupt)?;
        let (&len, rest) = rest.split_first().ok_or(BufferError::Corrupt)?;
        let (id, rest) = rest.split_at_checked(usize::from(len)).ok_or(BufferError::Corrupt)?;
        let sensor = std::str::from_utf8(id).map_err(|_| BufferError::Corrupt)?.to_string();
        let (&tag, data) = rest.split_first().ok_or(BufferError::Corrupt)?;
        let eight = || <[u8; 8]>::try_from(data).map_err(|_| BufferError::Corrupt);
        let value = match tag {
            0 => Stored::Float(f64::from_le_bytes(eight()?)),
            1 => Stored::Int(i64::from_le_bytes(eight()?)),
            4 => Stored::UInt(u64::from_le_bytes(eight()?)),
            2 if data.len() == 1 => Stored::Bool(data[0] != 0),
            3 => Stored::Text(std::str::from_utf8(data).map_err(|_| BufferError::Corrupt)?.to_string()),
            _ => return Err(BufferError::Corrupt),
        };
        Ok(Rec { sensor, t: t as i64, value, quality })
    }

    /// What it costs in the file, roughly: key and value.
    fn size(&self) -> u64 {
        16 + 12
            + self.sensor.len() as u64
            + if let Stored::Text(s) = &self.value { s.len() as u64 } else { 0 }
    }
}

/// Where a value taken from the buffer is, to remove it once it is sent.
pub type Key = (u64, u64);

/// The store-and-forward buffer.
pub struct Buffer {
    db: Db,
    /// Appended since the last flush.
    pending: VecDeque<Rec>,
    pending_bytes: u64,
    /// In the file: values and their bytes.
    stored: u64,
    stored_bytes: u64,
    next: u64,
    max_bytes: u64,
    max_age_ms: i64,
    dropped: u64,
    /// Removals committed without durability since the last flush: the next flush writes
    /// a mark so its durable commit is never an empty one (which may persist nothing).
    removed_since_flush: u64,
}

/// What one flush did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    pub written: usize,
    /// Dropped for the size or age bound.
    pub dropped: u64,
}

impl Buffer {
    /// Opens (or creates) the buffer at `path`; a damaged file is refused.
    pub fn open(path: &Path, max_bytes: u64, max_age_ms: i64) -> Result<Buffer, BufferError> {
        Buffer::with_db(
            Db::open_file("sparkplug buffer", path).map_err(BufferError::Db)?,
            max_bytes,
            max_age_ms,
        )
    }

    /// A buffer in memory (tests, benchmarks).
    pub fn memory(max_bytes: u64, max_age_ms: i64) -> Result<Buffer, BufferError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(db_err)?;
        Buffer::with_db(Db::memory("sparkplug buffer", db), max_bytes, max_age_ms)
    }

    fn with_db(db: Db, max_bytes: u64, max_age_ms: i64) -> Result<Buffer, BufferError> {
        let (stored, stored_bytes, next) = db.write(|d| {
            let tx = d.begin_write().map_err(db_err)?;
            let out = {
                let mut values = tx.open_table(VALUES).map_err(db_err)?;
                let _ = tx.open_table(META).map_err(db_err)?;
                let mut bytes = 0u64;
                let mut next = 0u64;
                let mut bad = Vec::new();
                for row in values.iter().map_err(db_err)? {
                    let (k, v) = row.map_err(db_err)?;
                    let (t, n) = k.value();
                    next = next.max(n + 1);
                    match Rec::decode(t, v.value()) {
                        Ok(r) => bytes += r.size(),
                        Err(_) => bad.push((t, n)),
                    }
                }
                // A value that does not decode cannot be sent: it goes, with a line saying so.
                if !bad.is_empty() {
                    tracing::error!(values = bad.len(), "sparkplug buffer: corrupt values dropped");
                }
                for k in &bad {
                    values.remove(k).map_err(db_err)?;
                }
                (values.len().map_err(db_err)?, bytes, next)
            };
            tx.commit().map_err(db_err)?;
            Ok::<_, BufferError>(out)
        })?;
        let pending = VecDeque::new();
        Ok(Buffer {
            db,
            pending,
            pending_bytes: 0,
            stored,
            stored_bytes,
            next,
            max_bytes,
            max_age_ms,
            dropped: 0,
            removed_since_flush: 0,
        })
    }

    /// Values waiting (in the file and in memory).
    pub fn len(&self) -> u64 {
        self.stored + self.pending.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes waiting, roughly.
    pub fn bytes(&self) -> u64 {
        self.stored_bytes + self.pending_bytes
    }

    /// Values dropped for the bounds since start.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// What is wrong with the file now, if anything, and since when.
    pub fn problem(&self) -> Option<Problem> {
        self.db.problem()
    }

    /// Adds a value; it is written by the next [`flush`](Self::flush). While flushes fail,
    /// what waits in memory stays within the size bound (the oldest go).
    pub fn push(&mut self, rec: Rec) {
        self.pending_bytes += rec.size();
        self.pending.push_back(rec);
        while self.pending_bytes > self.max_bytes {
            let Some(old) = self.pending.pop_front() else { break };
            self.pending_bytes -= old.size();
            self.dropped += 1;
        }
    }

    /// Writes what is pending in one durable transaction, then applies the bounds (age
    /// against `now_ms`, then size), oldest first. On failure the pending values stay.
    pub fn flush(&mut self, now_ms: i64) -> Result<Flushed, BufferError> {
        let written = self.pending.len();
        let oldest_allowed = (now_ms - self.max_age_ms).max(0) as u64;
        let over = (self.stored_bytes + self.pending_bytes).saturating_sub(self.max_bytes);
        let pending = &self.pending;
        let removed_since_flush = self.removed_since_flush;
        let mut next = self.next;
        let (removed, removed_bytes) = self.db.write(|d| {
            let tx = d.begin_write().map_err(db_err)?;
            let out = {
                let mut values = tx.open_table(VALUES).map_err(db_err)?;
                for r in pending {
                    values.insert((r.t.max(0) as u64, next), r.encode().as_slice()).map_err(db_err)?;
                    next += 1;
                }
                let (mut removed, mut bytes) = (0u64, 0u64);
                loop {
                    let first = values.first().map_err(db_err)?.map(|(k, v)| (k.value(), v.value().to_vec()));
                    let Some((k, v)) = first else { break };
                    let size = Rec::decode(k.0, &v).map_or(16, |r| r.size());
                    if k.0 >= oldest_allowed && bytes >= over {
                        break;
                    }
                    values.remove(k).map_err(db_err)?;
                    removed += 1;
                    bytes += size;
                }
                (removed, bytes)
            };
            if removed_since_flush > 0 {
                tx.open_table(META)
                    .map_err(db_err)?
                    .insert("removed", removed_since_flush)
                    .map_err(db_err)?;
            }
            tx.commit().map_err(db_err)?;
            Ok::<_, BufferError>(out)
        })?;
        self.next = next;
        self.removed_since_flush = 0;
        self.stored = self.stored + written as u64 - removed;
        self.stored_bytes = (self.stored_bytes + self.pending_bytes).saturating_sub(removed_bytes);
        self.pending.clear();
        self.pending_bytes = 0;
        if removed > 0 {
            self.dropped += removed;
            tracing::warn!(
                dropped = removed,
                total_dropped = self.dropped,
                "sparkplug buffer full or too old: oldest values dropped"
            );
        }
        Ok(Flushed { written, dropped: removed })
    }

    /// Up to `n` of the oldest values after `after` (all, for `None`), in timestamp order,
    /// whose sensor `wanted` accepts (a sensor of a device not born now waits). Flushes
    /// first, so the file has all.
    pub fn oldest(
        &mut self,
        n: usize,
        now_ms: i64,
        after: Option<Key>,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<Vec<(Key, Rec)>, BufferError> {
        if !self.pending.is_empty() {
            self.flush(now_ms)?;
        }
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db_err)?;
            let values = tx.open_table(VALUES).map_err(db_err)?;
            let mut out = Vec::with_capacity(n.min(65_536));
            // Bounded scan: values of devices that wait do not make a drain slow.
            let rows = match after {
                None => values.iter().map_err(db_err)?,
                Some(k) => values
                    .range::<Key>((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded))
                    .map_err(db_err)?,
            };
            for row in rows.take(n.saturating_mul(4)) {
                let (k, v) = row.map_err(db_err)?;
                let k = k.value();
                let r = Rec::decode(k.0, v.value())?;
                if wanted(&r.sensor) {
                    out.push((k, r));
                    if out.len() == n {
                        break;
                    }
                }
            }
            Ok(out)
        })
    }

    /// Removes values that were sent. Not made durable by itself (the next flush is): after a
    /// power cut they may be sent again, which QoS 1 allows anyway.
    pub fn remove(&mut self, keys: &[(Key, u64)]) -> Result<(), BufferError> {
        self.db.write(|d| {
            let mut tx = d.begin_write().map_err(db_err)?;
            tx.set_durability(redb::Durability::None).map_err(db_err)?;
            {
                let mut values = tx.open_table(VALUES).map_err(db_err)?;
                for (k, _) in keys {
                    values.remove(k).map_err(db_err)?;
                }
            }
            tx.commit().map_err(db_err)
        })?;
        self.stored = self.stored.saturating_sub(keys.len() as u64);
        self.stored_bytes = self.stored_bytes.saturating_sub(keys.iter().map(|(_, s)| s).sum());
        self.removed_since_flush += keys.len() as u64;
        Ok(())
    }

    /// Removes the values of these (sensor, timestamp) pairs, wherever they are (flushing
    /// first); how many went.
    pub fn remove_each(&mut self, values: &[(String, i64)], now_ms: i64) -> Result<usize, BufferError> {
        if !self.pending.is_empty() {
            self.flush(now_ms)?;
        }
        let keys = self.db.read(|d| {
            let tx = d.begin_read().map_err(db_err)?;
            let table = tx.open_table(VALUES).map_err(db_err)?;
            let mut keys = Vec::new();
            for (sensor, t) in values {
                let t = (*t).max(0) as u64;
                for row in table.range((t, 0)..=(t, u64::MAX)).map_err(db_err)? {
                    let (k, v) = row.map_err(db_err)?;
                    let r = Rec::decode(k.value().0, v.value())?;
                    if r.sensor == *sensor {
                        keys.push((k.value(), r.size()));
                    }
                }
            }
            Ok::<_, BufferError>(keys)
        })?;
        self.remove(&keys)?;
        Ok(keys.len())
    }

    /// The size [`remove`](Self::remove) takes off for `rec`.
    pub fn size_of(rec: &Rec) -> u64 {
        rec.size()
    }

    /// The last `bdSeq` used, if any.
    pub fn bd_seq(&self) -> Option<u64> {
        let read = self.db.read(|d| {
            let tx = d.begin_read().map_err(db_err)?;
            let meta = tx.open_table(META).map_err(db_err)?;
            Ok::<_, BufferError>(meta.get("bd_seq").map_err(db_err)?.map(|v| v.value()))
        });
        read.ok().flatten()
    }

    /// Records the `bdSeq` of the connection being made, durably.
    pub fn set_bd_seq(&self, bd_seq: u64) -> Result<(), BufferError> {
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db_err)?;
            tx.open_table(META).map_err(db_err)?.insert("bd_seq", bd_seq).map_err(db_err)?;
            tx.commit().map_err(db_err)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: i64, v: f64) -> Rec {
        Rec { sensor: "A_LINE1_001".into(), t, value: Stored::Float(v), quality: 0 }
    }

    #[test]
    fn records_round_trip_and_corrupt_ones_are_errors() {
        for r in [
            rec(5, 1.5),
            Rec { sensor: "X".into(), t: 1, value: Stored::Text("é".into()), quality: 2 },
            Rec { sensor: "X".into(), t: 1, value: Stored::Bool(true), quality: 1 },
            Rec { sensor: "X".into(), t: 1, value: Stored::Int(-4), quality: 0 },
            Rec { sensor: "X".into(), t: 1, value: Stored::UInt(u64::MAX), quality: 0 },
        ] {
            assert_eq!(Rec::decode(r.t as u64, &r.encode()).unwrap(), r);
        }
        for junk in [
            &b""[..],
            b"\x00",
            b"\x00\x05ab",
            b"\x00\x01a\x09",
            b"\x00\x01a\x00\x01",
            b"\x00\x01a\x03\xff",
            b"\x00\x01a\x02",
            b"\x00\x01a\x02\x01\x01",
        ] {
            assert!(Rec::decode(0, junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn oldest_first_survives_reopen_and_keeps_bd_seq() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        {
            let mut b = Buffer::open(&path, 1 << 20, 3_600_000).unwrap();
            for (t, v) in [(30, 3.0), (10, 1.0), (20, 2.0)] {
                b.push(rec(t, v));
            }
            assert_eq!(b.flush(40).unwrap().written, 3);
            b.set_bd_seq(7).unwrap();
        }
        let mut b = Buffer::open(&path, 1 << 20, 3_600_000).unwrap();
        assert_eq!((b.len(), b.bd_seq()), (3, Some(7)));
        let got = b.oldest(2, 40, None, |_| true).unwrap();
        assert_eq!(got.iter().map(|(_, r)| r.t).collect::<Vec<_>>(), [10, 20]);
        let keys: Vec<_> = got.iter().map(|(k, r)| (*k, Buffer::size_of(r))).collect();
        b.remove(&keys).unwrap();
        assert_eq!(b.oldest(10, 40, None, |_| true).unwrap().len(), 1);
        assert!(b.oldest(10, 40, None, |s| s != "A_LINE1_001").unwrap().is_empty());
    }

    #[test]
    fn remove_each_takes_only_the_named_values_stored_or_pending() {
        let mut b = Buffer::memory(1 << 20, 3_600_000).unwrap();
        b.push(rec(10, 1.0));
        b.push(Rec { sensor: "B_LINE1_001".into(), ..rec(10, 9.0) });
        b.flush(40).unwrap();
        b.push(rec(20, 2.0));
        let gone = b.remove_each(&[("A_LINE1_001".into(), 10), ("A_LINE1_001".into(), 20)], 40).unwrap();
        assert_eq!((gone, b.len()), (2, 1));
        assert_eq!(b.oldest(10, 40, None, |_| true).unwrap()[0].1.sensor, "B_LINE1_001");
    }

    #[test]
    fn bounds_drop_the_oldest_and_count_them() {
        let one = rec(0, 0.0).size();
        let mut b = Buffer::memory(one * 10, 1000).unwrap();
        for t in 0..25 {
            b.push(rec(5000 + t, t as f64));
        }
        // Memory alone keeps within the size bound.
        assert_eq!((b.len(), b.dropped()), (10, 15));
        b.flush(5030).unwrap();
        for t in 25..30 {
            b.push(rec(5000 + t, t as f64));
        }
        let f = b.flush(5030).unwrap();
        assert_eq!((f.written, f.dropped, b.len(), b.dropped()), (5, 5, 10, 20));
        let first = b.oldest(1, 5030, None, |_| true).unwrap();
        assert_eq!(first[0].1.t, 5020);
        // Age: everything older than 1 s before now goes.
        let f = b.flush(6025).unwrap();
        assert_eq!((f.dropped, b.len()), (5, 5));
    }

    #[test]
    fn storage_failures_are_told_from_corrupt_values() {
        assert!(BufferError::Db("disk full".into()).is_storage());
        assert!(!BufferError::Corrupt.is_storage());
    }

    #[test]
    fn what_waits_is_counted_in_values_and_bytes() {
        let mut b = Buffer::memory(1 << 20, 3_600_000).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.bytes(), 0);
        let text = Rec { value: Stored::Text("a longer text value".into()), ..rec(2, 0.0) };
        let (a, t) = (Buffer::size_of(&rec(1, 1.0)), Buffer::size_of(&text));
        // A value costs its key and value: more for a longer sensor ID or text.
        assert!(a > Buffer::size_of(&Rec { sensor: "A".into(), ..rec(1, 1.0) }));
        assert_eq!(t, a + "a longer text value".len() as u64);
        b.push(rec(1, 1.0));
        b.push(text.clone());
        b.flush(10).unwrap();
        b.push(rec(3, 3.0));
        assert!(!b.is_empty());
        assert_eq!((b.len(), b.bytes()), (3, 2 * a + t), "stored and pending alike");
        // Pending values are flushed before the oldest are read.
        let got = b.oldest(10, 10, None, |_| true).unwrap();
        assert_eq!(got.iter().map(|(_, r)| r.t).collect::<Vec<_>>(), [1, 2, 3]);
        let keys: Vec<_> = got[..2].iter().map(|(k, r)| (*k, Buffer::size_of(r))).collect();
        b.remove(&keys).unwrap();
        assert_eq!((b.len(), b.bytes()), (1, a));
    }

    /// What the size bound counts for a value is what it takes in the file, roughly: its
    /// key (16 bytes) and its record, plus a few bytes of the table's own.
    #[test]
    fn a_values_cost_is_close_to_what_it_takes_in_the_file() {
        for r in [
            rec(1, 1.0),
            Rec { sensor: "A".into(), ..rec(1, 1.0) },
            Rec { sensor: "B_OVEN2_001".into(), value: Stored::Text("x".repeat(300)), ..rec(1, 0.0) },
            Rec { value: Stored::Bool(true), ..rec(1, 0.0) },
        ] {
            let stored = 16 + r.encode().len() as u64;
            let cost = Buffer::size_of(&r);
            assert!((stored..=stored + 12).contains(&cost), "{r:?}: costs {cost}, takes {stored}");
        }
    }

    #[test]
    fn the_size_bound_counts_what_each_value_costs() {
        let one = Buffer::size_of(&rec(0, 0.0));
        let mut b = Buffer::memory(2 * one + one / 2, 3_600_000).unwrap();
        for t in 0..3 {
            b.push(rec(t, 0.0));
        }
        assert_eq!((b.len(), b.dropped()), (2, 1));
        // A text longer than the bound alone cannot wait at all.
        b.push(Rec { value: Stored::Text("x".repeat(3 * one as usize)), ..rec(9, 0.0) });
        assert_eq!((b.len(), b.dropped()), (0, 4));
    }

    #[test]
    fn a_reopened_buffer_keeps_its_counts_and_never_reuses_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let bytes = {
            let mut b = Buffer::open(&path, 1 << 20, 3_600_000).unwrap();
            for v in 0..3 {
                b.push(rec(10, v as f64));
            }
            b.flush(20).unwrap();
            b.bytes()
        };
        let mut b = Buffer::open(&path, 1 << 20, 3_600_000).unwrap();
        assert_eq!((b.len(), b.bytes()), (3, bytes));
        // Same timestamp as those stored: a new key, not one of theirs.
        b.push(rec(10, 9.0));
        b.flush(20).unwrap();
        let values: Vec<f64> = b
            .oldest(10, 20, None, |_| true)
            .unwrap()
            .into_iter()
            .map(|(_, r)| if let Stored::Float(f) = r.value { f } else { f64::NAN })
            .collect();
        assert_eq!(values, [0.0, 1.0, 2.0, 9.0]);
    }

    #[test]
    fn a_flush_after_removals_writes_a_mark_so_its_durable_commit_carries_them() {
        let mut b = Buffer::memory(1 << 20, 3_600_000).unwrap();
        let removed = |b: &Buffer| {
            b.db.read(|d| {
                let tx = d.begin_read().map_err(db_err)?;
                let meta = tx.open_table(META).map_err(db_err)?;
                Ok::<_, BufferError>(meta.get("removed").map_err(db_err)?.map(|v| v.value()))
            })
            .unwrap()
        };
        for t in 0..3 {
            b.push(rec(t, 0.0));
        }
        b.flush(10).unwrap();
        assert_eq!(removed(&b), None, "no removal yet");
        let keys: Vec<_> =
            b.oldest(3, 10, None, |_| true).unwrap().iter().map(|(k, r)| (*k, r.size())).collect();
        b.remove(&keys[..1]).unwrap();
        b.remove(&keys[1..]).unwrap();
        b.flush(10).unwrap();
        assert_eq!(removed(&b), Some(3), "both removals counted in the mark");
    }

    #[test]
    fn values_past_the_age_bound_are_dropped_and_counted() {
        let mut b = Buffer::memory(1 << 20, 1000).unwrap();
        b.push(rec(100, 0.0));
        b.push(rec(5000, 0.0));
        let f = b.flush(5500).unwrap();
        assert_eq!((f.dropped, b.len(), b.dropped()), (1, 1, 1));
    }
}
