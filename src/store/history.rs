//! The history store: compressed chunks per sensor in redb.
//!
//! Each sensor has one open chunk in memory; [`HistoryStore::flush`] writes every changed
//! open chunk (overwriting its earlier snapshot) and every sealed chunk in one durable
//! redb transaction. At most one flush interval (plus the time a flush takes) of points can
//! be lost on power failure. A restart replays nothing: new points start new chunks.
//!
//! A flush that fails (a full disk, a failed file) keeps everything it was to write in
//! memory and the next flush writes it again, after the store reopened its file (see
//! [`super::db`]). What waits in memory is bounded (`max_unflushed_bytes`): beyond it the
//! oldest sealed chunks are dropped and counted. History also stops writing while the
//! filesystem's free space is below a reserve, so that work orders keep room.
//!
//! Table `chunks`: key `(sensor_id, first_t_ms)`, value `last_t_ms (8 bytes LE) ++ chunk`.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::db::{Db, Problem, StorageFailure, disk_space};
use super::gorilla::{ChunkWriter, Kind, Point, decode};

const CHUNKS: TableDefinition<(&str, i64), &[u8]> = TableDefinition::new("chunks");

/// A chunk is sealed at this many points ...
pub const MAX_POINTS: u32 = 1024;
/// ... or when it would span longer than this.
pub const MAX_SPAN_MS: i64 = 6 * 3_600_000;
/// A point this far (or further) before its sensor's last one is taken as a step back of
/// the clock, not as a sample out of order.
pub const CLOCK_STEP_MS: i64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("history store: {0}")]
    Db(String),
    #[error("history store: a stored chunk is corrupt")]
    Corrupt,
    #[error("history store: the disk reserve is reached ({free} bytes free); points wait in memory")]
    Reserve { free: u64 },
}

impl StorageFailure for StoreError {
    fn storage(reason: String) -> Self {
        StoreError::Db(reason)
    }
    fn is_storage(&self) -> bool {
        matches!(self, StoreError::Db(_))
    }
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

struct Open {
    writer: ChunkWriter,
    dirty: bool,
}

/// A sealed chunk not yet written.
struct Sealed {
    sensor: String,
    first: i64,
    last: i64,
    points: u32,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct Pending {
    open: HashMap<String, Open>,
    /// Sealed chunks not yet written, oldest first.
    sealed: Vec<Sealed>,
    sealed_bytes: usize,
}

/// What retention removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub chunks: usize,
    pub bytes: u64,
}

/// Limits of what history may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// History is not written while the filesystem has less free space than this.
    pub reserve_bytes: u64,
    /// ... or less than this share of its size (percent); the smaller of the two applies.
    pub reserve_percent: u8,
    /// Sealed chunks waiting in memory for a flush that can write them, at most.
    pub max_unflushed_bytes: usize,
}

impl Limits {
    pub fn of(c: &crate::config::StorageConfig) -> Limits {
        Limits {
            reserve_bytes: c.reserve_mb.saturating_mul(1 << 20),
            reserve_percent: c.reserve_percent,
            max_unflushed_bytes: usize::try_from(c.unflushed_max_mb.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits { reserve_bytes: 100 << 20, reserve_percent: 5, max_unflushed_bytes: 64 << 20 }
    }
}

pub struct HistoryStore {
    db: Db,
    pending: Mutex<Pending>,
    /// One flush at a time: a flush removes from `pending` only what it wrote.
    flushing: Mutex<()>,
    limits: Limits,
    dropped: AtomicU64,
    /// Points refused because they were not after their sensor's last one by less than
    /// [`CLOCK_STEP_MS`] (a device sent samples out of order).
    out_of_order: AtomicU64,
    /// Points that came [`CLOCK_STEP_MS`] or more before their sensor's last one (the
    /// clock stepped back): each started a new chunk.
    clock_steps: AtomicU64,
    /// When a step back was last logged (ms since the epoch), so one step is one line.
    step_logged: std::sync::atomic::AtomicI64,
}

impl HistoryStore {
    /// Opens (or creates) the store file, its integrity checked.
    pub fn open(path: &Path) -> Result<HistoryStore, StoreError> {
        HistoryStore::with_db(Db::open_file("history", path).map_err(StoreError::Db)?)
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
        HistoryStore::with_db(Db::memory("history", database))
    }

    /// A store over `db` (tests open one with an injected storage backend).
    pub fn with_db(db: Db) -> Result<HistoryStore, StoreError> {
        db.write(|d| {
            let tx = d.begin_write().map_err(self::db)?;
            tx.open_table(CHUNKS).map_err(self::db)?;
            tx.commit().map_err(self::db)
        })?;
        Ok(HistoryStore {
            db,
            pending: Mutex::new(Pending::default()),
            flushing: Mutex::new(()),
            limits: Limits::default(),
            dropped: AtomicU64::new(0),
            out_of_order: AtomicU64::new(0),
            clock_steps: AtomicU64::new(0),
            step_logged: std::sync::atomic::AtomicI64::new(i64::MIN),
        })
    }

    /// The same store with these limits.
    pub fn with_limits(mut self, limits: Limits) -> HistoryStore {
        self.limits = limits;
        self
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// Appends a point. A chunk's points only move forward in time. A point up to
    /// [`CLOCK_STEP_MS`] before (or at) the sensor's last one is a sample a device sent out
    /// of order: dropped and counted (returns false). One further back means the clock
    /// stepped back (an NTP correction, a box that booted in the future): it starts a new
    /// chunk, stored with its own time, and queries merge overlapping chunks in time order,
    /// so history goes on at once. A forward jump is just a long silence: a gap in the
    /// history, never invented data.
    pub fn append(&self, sensor: &str, p: &Point) -> bool {
        let mut pending = self.lock();
        let Pending { open, sealed, sealed_bytes } = &mut *pending;
        let kind = Kind::of(&p.value);
        if let Some(o) = open.get_mut(sensor) {
            let stepped_back = p.t <= o.writer.last_t() - CLOCK_STEP_MS;
            if p.t <= o.writer.last_t() && !stepped_back {
                self.out_of_order.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            if stepped_back {
                self.note_step_back(sensor, o.writer.last_t(), p.t);
            }
            let full = stepped_back
                || o.writer.len() >= MAX_POINTS
                || p.t - o.writer.first_t() > MAX_SPAN_MS
                || o.writer.kind() != kind;
            if full {
                let w = &o.writer;
                let chunk = Sealed {
                    sensor: sensor.to_string(),
                    first: w.first_t(),
                    last: w.last_t(),
                    points: w.len(),
                    bytes: w.bytes(),
                };
                *sealed_bytes += chunk.bytes.len();
                sealed.push(chunk);
                o.writer = ChunkWriter::new(kind);
                // Bounded while flushes fail: the oldest waiting chunks go first.
                while *sealed_bytes > self.limits.max_unflushed_bytes && !sealed.is_empty() {
                    let gone = sealed.remove(0);
                    *sealed_bytes -= gone.bytes.len();
                    self.dropped.fetch_add(u64::from(gone.points), Ordering::Relaxed);
                }
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

    /// Counts a step back of the clock, logging it at most once a minute.
    fn note_step_back(&self, sensor: &str, last: i64, now: i64) {
        self.clock_steps.fetch_add(1, Ordering::Relaxed);
        let logged = self.step_logged.load(Ordering::Relaxed);
        if (logged == i64::MIN || (now - logged).abs() >= 60_000)
            && self.step_logged.compare_exchange(logged, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(
                sensor,
                back_ms = last - now,
                "the clock stepped back: history goes on in new chunks, merged in time order when read"
            );
        }
    }

    /// Points that came a clock step back (each started a new chunk).
    pub fn clock_steps(&self) -> u64 {
        self.clock_steps.load(Ordering::Relaxed)
    }

    /// Points dropped because flushes failed for so long that waiting chunks passed the
    /// memory bound.
    pub fn dropped_points(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Points dropped as a device's samples out of order.
    pub fn out_of_order_points(&self) -> u64 {
        self.out_of_order.load(Ordering::Relaxed)
    }

    /// What is wrong with the store now (a failed flush, the reserve reached), if anything.
    pub fn problem(&self) -> Option<Problem> {
        self.db.problem()
    }

    /// Flushes that failed since start.
    pub fn failures(&self) -> u64 {
        self.db.failures()
    }

    /// Free and total bytes of the filesystem of the store's file.
    pub fn disk_space(&self) -> Option<(u64, u64)> {
        self.db.file().and_then(|f| disk_space(f.parent().unwrap_or(f)))
    }

    /// Makes every appended point durable. Returns the chunks written. On failure
    /// everything stays in memory for the next flush.
    pub fn flush(&self) -> Result<usize, StoreError> {
        let _one = self.flushing.lock();
        if let Some((free, total)) = self.disk_space() {
            let share = total / 100 * u64::from(self.limits.reserve_percent);
            if free < self.limits.reserve_bytes.min(share) {
                self.db.set_problem(Some("the disk reserve is reached; history waits in memory"));
                return Err(StoreError::Reserve { free });
            }
        }
        // Copies: what was taken is removed only once it is durable.
        let (sealed, snapshots) = {
            let p = self.lock();
            let sealed: Vec<(String, i64, i64, Vec<u8>)> =
                p.sealed.iter().map(|c| (c.sensor.clone(), c.first, c.last, c.bytes.clone())).collect();
            let snapshots: Vec<(String, i64, i64, Vec<u8>)> = p
                .open
                .iter()
                .filter(|(_, o)| o.dirty)
                .map(|(s, o)| (s.clone(), o.writer.first_t(), o.writer.last_t(), o.writer.bytes()))
                .collect();
            (sealed, snapshots)
        };
        if sealed.is_empty() && snapshots.is_empty() {
            return Ok(0);
        }
        let n = sealed.len() + snapshots.len();
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            {
                let mut t = tx.open_table(CHUNKS).map_err(db)?;
                for (sensor, first, last, bytes) in sealed.iter().chain(&snapshots) {
                    let mut v = Vec::with_capacity(8 + bytes.len());
                    v.extend_from_slice(&last.to_le_bytes());
                    v.extend_from_slice(bytes);
                    t.insert((sensor.as_str(), *first), v.as_slice()).map_err(db)?;
                }
            }
            tx.commit().map_err(db)
        })?;
        let mut p = self.lock();
        // Written: the sealed chunks taken (new ones were appended behind them, and only
        // the bound can have dropped some of them meanwhile), and each open chunk that
        // has not moved on since its snapshot.
        for (sensor, first, ..) in &sealed {
            if let Some(i) = p.sealed.iter().position(|c| c.sensor == *sensor && c.first == *first) {
                let c = p.sealed.remove(i);
                p.sealed_bytes -= c.bytes.len();
            }
        }
        for (sensor, first, last, _) in &snapshots {
            if let Some(o) = p.open.get_mut(sensor)
                && o.writer.first_t() == *first
                && o.writer.last_t() == *last
            {
                o.dirty = false;
            }
        }
        Ok(n)
    }

    /// Every point of `sensor` with `from <= t < to`, in time order.
    pub fn points(&self, sensor: &str, from: i64, to: i64) -> Result<Vec<Point>, StoreError> {
        // What memory holds is newer than its snapshot on disk.
        let (mem_open, mem_sealed) = {
            let p = self.lock();
            let open = p.open.get(sensor).map(|o| (o.writer.first_t(), o.writer.bytes()));
            let sealed: Vec<(i64, Vec<u8>)> =
                p.sealed.iter().filter(|c| c.sensor == sensor).map(|c| (c.first, c.bytes.clone())).collect();
            (open, sealed)
        };
        let mut chunks: Vec<(i64, Vec<u8>)> = self.db.read(|d| {
            let mut chunks = Vec::new();
            let tx = d.begin_read().map_err(db)?;
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
            Ok(chunks)
        })?;
        chunks.extend(mem_sealed);
        chunks.extend(mem_open);
        chunks.sort_by_key(|(first, _)| *first);
        let mut out = Vec::new();
        let mut overlapping = false;
        for (_, bytes) in chunks {
            let pts = decode(&bytes).map_err(|_| StoreError::Corrupt)?;
            let before = out.last().map(|p: &Point| p.t);
            let start = out.len();
            out.extend(pts.into_iter().filter(|p| p.t >= from && p.t < to));
            overlapping |= out.get(start).is_some_and(|p| before.is_some_and(|b| p.t <= b));
        }
        // Chunks written after a clock step back overlap older ones: merged in time order,
        // one point per instant (that of the chunk that starts first), so every query and
        // every page sees the same points.
        if overlapping {
            out.sort_by_key(|p| p.t);
            out.dedup_by_key(|p| p.t);
        }
        Ok(out)
    }

    /// Whether the store answers reads (for `/readyz`).
    pub fn is_open(&self) -> bool {
        self.db.read(|d| d.begin_read().map_err(db)?.open_table(CHUNKS).map(|_| ()).map_err(db)).is_ok()
    }

    /// Bytes and chunks on disk.
    pub fn size(&self) -> Result<(u64, usize), StoreError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            let mut bytes = 0u64;
            let mut n = 0;
            for item in t.iter().map_err(db)? {
                let (k, v) = item.map_err(db)?;
                bytes += (k.value().0.len() + 8 + v.value().len()) as u64;
                n += 1;
            }
            Ok((bytes, n))
        })
    }

    /// Drops chunks that ended before `older_than`, then the oldest until at most
    /// `max_bytes` remain.
    pub fn prune(&self, older_than: i64, max_bytes: u64) -> Result<Pruned, StoreError> {
        let all: Vec<(String, i64, i64, u64)> = self.db.read(|d| {
            let mut all = Vec::new();
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            for item in t.iter().map_err(db)? {
                let (k, v) = item.map_err(db)?;
                let (sensor, first) = k.value();
                let v = v.value();
                let last =
                    v.get(..8).and_then(|b| b.try_into().ok()).map(i64::from_le_bytes).unwrap_or(i64::MIN);
                all.push((sensor.to_string(), first, last, (sensor.len() + 8 + v.len()) as u64));
            }
            Ok(all)
        })?;
        let mut all = all;
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
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            {
                let mut t = tx.open_table(CHUNKS).map_err(db)?;
                for c in &doomed {
                    t.remove((c.0.as_str(), c.1)).map_err(db)?;
                }
            }
            tx.commit().map_err(db)
        })?;
        Ok(Pruned { chunks: doomed.len(), bytes: total - remaining })
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "history_props.rs"]
mod props;
