//! The history store: compressed chunks per sensor in redb.
//!
//! Each sensor has one open chunk in memory; [`HistoryStore::flush`] writes every changed
//! open chunk (overwriting its earlier snapshot) and every sealed chunk in one durable
//! redb transaction. At most `flush_interval` of points can be lost on power failure.
//! A restart replays nothing: new points start new chunks.
//!
//! Table `chunks`: key `(sensor_id, first_t_ms)`, value `last_t_ms (8 bytes LE) ++ chunk`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::gorilla::{ChunkWriter, Kind, Point, decode};

const CHUNKS: TableDefinition<(&str, i64), &[u8]> = TableDefinition::new("chunks");

/// A chunk is sealed at this many points ...
pub const MAX_POINTS: u32 = 1024;
/// ... or when it would span longer than this.
pub const MAX_SPAN_MS: i64 = 6 * 3_600_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("history store: {0}")]
    Db(String),
    #[error("history store: a stored chunk is corrupt")]
    Corrupt,
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

struct Open {
    writer: ChunkWriter,
    dirty: bool,
}

#[derive(Default)]
struct Pending {
    open: HashMap<String, Open>,
    /// Sealed chunks not yet written: (sensor, first_t, last_t, bytes).
    sealed: Vec<(String, i64, i64, Vec<u8>)>,
}

/// What retention removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub chunks: usize,
    pub bytes: u64,
}

pub struct HistoryStore {
    db: Database,
    pending: Mutex<Pending>,
}

impl HistoryStore {
    /// Opens (or creates) the store file.
    pub fn open(path: &Path) -> Result<HistoryStore, StoreError> {
        HistoryStore::with_db(Database::create(path).map_err(db)?)
    }

    /// Opens `history.redb` in a data directory, creating the directory.
    pub fn open_in(dir: &Path) -> Result<HistoryStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Db(format!("cannot create the data directory {}: {}", dir.display(), e.kind()))
        })?;
        HistoryStore::open(&dir.join("history.redb"))
    }

    /// A store in memory (tests, one-shot commands).
    pub fn in_memory() -> Result<HistoryStore, StoreError> {
        let database =
            Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(db)?;
        HistoryStore::with_db(database)
    }

    fn with_db(database: Database) -> Result<HistoryStore, StoreError> {
        let tx = database.begin_write().map_err(db)?;
        tx.open_table(CHUNKS).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(HistoryStore { db: database, pending: Mutex::new(Pending::default()) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a point. Points not after the sensor's last one are dropped (returns false).
    pub fn append(&self, sensor: &str, p: &Point) -> bool {
        let mut pending = self.lock();
        let Pending { open, sealed } = &mut *pending;
        let kind = Kind::of(&p.value);
        if let Some(o) = open.get_mut(sensor) {
            if p.t <= o.writer.last_t() {
                return false;
            }
            let full = o.writer.len() >= MAX_POINTS
                || p.t - o.writer.first_t() > MAX_SPAN_MS
                || o.writer.kind() != kind;
            if full {
                let w = &o.writer;
                sealed.push((sensor.to_string(), w.first_t(), w.last_t(), w.bytes()));
                o.writer = ChunkWriter::new(kind);
            }
            o.writer.push(p);
            o.dirty = true;
        } else {
            let mut writer = ChunkWriter::new(kind);
            writer.push(p);
            open.insert(sensor.to_string(), Open { writer, dirty: true });
        }
        true
    }

    /// Makes every appended point durable. Returns the chunks written.
    pub fn flush(&self) -> Result<usize, StoreError> {
        let (sealed, snapshots) = {
            let mut p = self.lock();
            let sealed = std::mem::take(&mut p.sealed);
            let snapshots: Vec<(String, i64, i64, Vec<u8>)> = p
                .open
                .iter_mut()
                .filter(|(_, o)| o.dirty)
                .map(|(s, o)| {
                    o.dirty = false;
                    (s.clone(), o.writer.first_t(), o.writer.last_t(), o.writer.bytes())
                })
                .collect();
            (sealed, snapshots)
        };
        if sealed.is_empty() && snapshots.is_empty() {
            return Ok(0);
        }
        let tx = self.db.begin_write().map_err(db)?;
        let n = sealed.len() + snapshots.len();
        {
            let mut t = tx.open_table(CHUNKS).map_err(db)?;
            for (sensor, first, last, bytes) in sealed.iter().chain(&snapshots) {
                let mut v = Vec::with_capacity(8 + bytes.len());
                v.extend_from_slice(&last.to_le_bytes());
                v.extend_from_slice(bytes);
                t.insert((sensor.as_str(), *first), v.as_slice()).map_err(db)?;
            }
        }
        tx.commit().map_err(db)?;
        Ok(n)
    }

    /// Every point of `sensor` with `from <= t < to`, in time order.
    pub fn points(&self, sensor: &str, from: i64, to: i64) -> Result<Vec<Point>, StoreError> {
        // What memory holds is newer than its snapshot on disk.
        let (mem_open, mem_sealed) = {
            let p = self.lock();
            let open = p.open.get(sensor).map(|o| (o.writer.first_t(), o.writer.bytes()));
            let sealed: Vec<(i64, Vec<u8>)> =
                p.sealed.iter().filter(|s| s.0 == sensor).map(|s| (s.1, s.3.clone())).collect();
            (open, sealed)
        };
        let mut chunks: Vec<(i64, Vec<u8>)> = Vec::new();
        let tx = self.db.begin_read().map_err(db)?;
        let t = tx.open_table(CHUNKS).map_err(db)?;
        let start = from.saturating_sub(MAX_SPAN_MS);
        for item in t.range((sensor, start)..(sensor, to)).map_err(db)? {
            let (k, v) = item.map_err(db)?;
            let first = k.value().1;
            if mem_open.as_ref().is_some_and(|(f, _)| *f == first)
                || mem_sealed.iter().any(|(f, _)| *f == first)
            {
                continue;
            }
            let v = v.value();
            if v.len() < 8 {
                return Err(StoreError::Corrupt);
            }
            let last = i64::from_le_bytes(v[..8].try_into().map_err(|_| StoreError::Corrupt)?);
            if last < from {
                continue;
            }
            chunks.push((first, v[8..].to_vec()));
        }
        chunks.extend(mem_sealed);
        chunks.extend(mem_open);
        chunks.sort_by_key(|(first, _)| *first);
        let mut out = Vec::new();
        for (_, bytes) in chunks {
            let pts = decode(&bytes).map_err(|_| StoreError::Corrupt)?;
            out.extend(pts.into_iter().filter(|p| p.t >= from && p.t < to));
        }
        Ok(out)
    }

    /// Whether the store answers reads (for `/readyz`).
    pub fn is_open(&self) -> bool {
        self.db.begin_read().is_ok_and(|tx| tx.open_table(CHUNKS).is_ok())
    }

    /// Bytes and chunks on disk.
    pub fn size(&self) -> Result<(u64, usize), StoreError> {
        let tx = self.db.begin_read().map_err(db)?;
        let t = tx.open_table(CHUNKS).map_err(db)?;
        let mut bytes = 0u64;
        let mut n = 0;
        for item in t.iter().map_err(db)? {
            let (k, v) = item.map_err(db)?;
            bytes += (k.value().0.len() + 8 + v.value().len()) as u64;
            n += 1;
        }
        Ok((bytes, n))
    }

    /// Drops chunks that ended before `older_than`, then the oldest until at most
    /// `max_bytes` remain.
    pub fn prune(&self, older_than: i64, max_bytes: u64) -> Result<Pruned, StoreError> {
        let mut all: Vec<(String, i64, i64, u64)> = Vec::new();
        {
            let tx = self.db.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            for item in t.iter().map_err(db)? {
                let (k, v) = item.map_err(db)?;
                let (sensor, first) = k.value();
                let v = v.value();
                let last =
                    v.get(..8).and_then(|b| b.try_into().ok()).map(i64::from_le_bytes).unwrap_or(i64::MIN);
                all.push((sensor.to_string(), first, last, (sensor.len() + 8 + v.len()) as u64));
            }
        }
        all.sort_by_key(|c| c.2);
        let total: u64 = all.iter().map(|c| c.3).sum();
        let open: Vec<(String, i64)> =
            self.lock().open.iter().map(|(s, o)| (s.clone(), o.writer.first_t())).collect();
        let mut remaining = total;
        let mut doomed = Vec::new();
        for c in &all {
            let is_open = open.iter().any(|(s, f)| *s == c.0 && *f == c.1);
            if !is_open && (c.2 < older_than || remaining > max_bytes) {
                remaining -= c.3;
                doomed.push(c);
            }
        }
        if doomed.is_empty() {
            return Ok(Pruned::default());
        }
        let tx = self.db.begin_write().map_err(db)?;
        {
            let mut t = tx.open_table(CHUNKS).map_err(db)?;
            for c in &doomed {
                t.remove((c.0.as_str(), c.1)).map_err(db)?;
            }
        }
        tx.commit().map_err(db)?;
        Ok(Pruned { chunks: doomed.len(), bytes: total - remaining })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::gorilla::Stored;
    use proptest::prelude::*;

    fn p(t: i64, v: f64) -> Point {
        Point { t, value: Stored::Float(v), quality: 0 }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn ranges_agree_with_a_naive_reference(
            gaps in prop::collection::vec(1i64..120_000, 1..3000),
            flush_every in 1usize..700,
            ranges in prop::collection::vec((0i64..400_000_000, 1i64..200_000_000), 5),
        ) {
            let store = HistoryStore::in_memory().unwrap();
            let mut t = 0;
            let mut all = Vec::new();
            for (i, g) in gaps.iter().enumerate() {
                t += g;
                let point = p(t, (i as f64).sin());
                prop_assert!(store.append("S", &point));
                all.push(point);
                if i % flush_every == 0 {
                    store.flush().unwrap();
                }
            }
            for (from, len) in ranges {
                let to = from + len;
                let want: Vec<&Point> = all.iter().filter(|q| q.t >= from && q.t < to).collect();
                let got = store.points("S", from, to).unwrap();
                prop_assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(want) {
                    prop_assert_eq!(g, w);
                }
            }
        }
    }

    #[test]
    fn out_of_order_points_are_dropped_and_sensors_are_apart() {
        let store = HistoryStore::in_memory().unwrap();
        assert!(store.append("A", &p(10, 1.0)));
        assert!(!store.append("A", &p(10, 2.0)));
        assert!(!store.append("A", &p(5, 2.0)));
        assert!(store.append("B", &p(5, 3.0)));
        assert_eq!(store.points("A", 0, 100).unwrap(), vec![p(10, 1.0)]);
        assert_eq!(store.points("B", 0, 100).unwrap(), vec![p(5, 3.0)]);
    }

    #[test]
    fn a_restart_keeps_what_was_flushed_and_replays_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.redb");
        {
            let store = HistoryStore::open(&path).unwrap();
            for i in 0..3000 {
                store.append("A_LINE1_001", &p(i * 1000, i as f64));
            }
            store.flush().unwrap();
            store.append("A_LINE1_001", &p(5_000_000, -1.0)); // never flushed: may be lost
        }
        let store = HistoryStore::open(&path).unwrap();
        let pts = store.points("A_LINE1_001", 0, i64::MAX).unwrap();
        assert_eq!(pts.len(), 3000);
        assert_eq!(pts[2999], p(2_999_000, 2999.0));
        // Appending continues in a new chunk.
        store.append("A_LINE1_001", &p(6_000_000, 7.0));
        store.flush().unwrap();
        assert_eq!(store.points("A_LINE1_001", 0, i64::MAX).unwrap().len(), 3001);
    }

    #[test]
    fn retention_drops_the_oldest_chunks_first() {
        let store = HistoryStore::in_memory().unwrap();
        for i in 0..(MAX_POINTS as i64 * 5) {
            store.append("S", &p(i * 1000, (i % 7) as f64));
        }
        store.flush().unwrap();
        let (bytes, chunks) = store.size().unwrap();
        assert_eq!(chunks, 5);
        // By age: the first two chunks end before 2 * 1024 s.
        let pruned = store.prune(2 * MAX_POINTS as i64 * 1000, u64::MAX).unwrap();
        assert_eq!(pruned.chunks, 2);
        let left = store.points("S", 0, i64::MAX).unwrap();
        assert_eq!(left.first().unwrap().t, 2 * MAX_POINTS as i64 * 1000);
        // By size: keep under a third of the original; the open chunk is never dropped.
        let pruned = store.prune(i64::MIN, bytes / 3).unwrap();
        assert!(pruned.chunks >= 1);
        let left = store.points("S", 0, i64::MAX).unwrap();
        assert_eq!(left.last().unwrap().t, (MAX_POINTS as i64 * 5 - 1) * 1000);
        assert!(left.first().unwrap().t > 2 * MAX_POINTS as i64 * 1000);
    }
}
