//! The history store: compressed chunks per sensor in redb.
//!
//! Each sensor has one open chunk in memory, and a second one for late points (before the
//! sensor's newest: a replay of what an edge buffered, a clock that stepped back), so a
//! chunk's points always move forward in time; reads merge overlapping chunks in time order,
//! one point per instant. [`HistoryStore::flush`] writes, in one durable redb transaction,
//! every sealed chunk, the changed open chunks of its turn (overwriting their earlier
//! snapshot) and a journal record of every point appended since the flush before (see
//! `history_journal.rs`): what a flush writes grows with what arrived, not with the number of
//! sensors. A chunk never replaces another: one that would start at the instant a stored
//! chunk starts holds a point already stored, which is dropped as a repeat. A chunk is
//! sealed at [`MAX_POINTS`] points, [`MAX_CHUNK_BYTES`] bytes (less with more sensors than
//! [`OPEN_BUDGET_BYTES`] holds at that size) or [`MAX_SPAN_MS`]. At most one
//! flush interval (plus the time a flush takes) of points can be lost on power failure; a
//! restart replays the journal's points that no stored chunk holds, into new chunks.
//!
//! A flush that fails (a full disk, a failed file) keeps everything it was to write in
//! memory and the next flush writes it again, after the store reopened its file (see
//! [`super::db`]). What waits in memory is bounded (`max_unflushed_bytes`): beyond it the
//! oldest sealed chunks are dropped and counted. History also stops writing while the
//! filesystem's free space is below a reserve, so that work orders keep room.
//!
//! Table `chunks`: key `(sensor_id, first_t_ms)`, value `last_t_ms (8 bytes LE) ++ chunk`.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, ReadableDatabase, TableDefinition};

use super::db::{Db, Problem, StorageFailure, disk_space};
use super::gorilla::{ChunkWriter, Kind, Point};
use journal::{JOURNAL, TURNS};

#[path = "history_flush.rs"]
mod flush;
#[path = "history_journal.rs"]
mod journal;
#[path = "history_migrate.rs"]
mod migrate;
#[path = "history_read.rs"]
mod read;
#[path = "history_remote.rs"]
mod remote;
pub use migrate::Migrated;
#[path = "history_retention.rs"]
mod retention;
pub use remote::{LOCAL_KEEP_MS, Remote, RemoteStats};
pub use retention::{Limits, Pruned};

const CHUNKS: TableDefinition<(&str, i64), &[u8]> = TableDefinition::new("chunks");

/// A chunk is sealed at this many points ...
pub const MAX_POINTS: u32 = super::gorilla::MAX_COUNT;
/// ... or when it holds this many bytes (an open chunk is held in memory: noisy values take
/// up to 8 bytes a point) ...
pub const MAX_CHUNK_BYTES: usize = 1536;
/// ... or when it would span longer than this.
pub const MAX_SPAN_MS: i64 = 6 * 3_600_000;
/// Open chunks share this much memory: with more sensors than it holds at
/// [`MAX_CHUNK_BYTES`] each (over 21,000), a sensor's chunk is sealed at its share, never
/// under [`MIN_CHUNK_BYTES`] (a hub of 100,000 sensors: about 330 bytes, 35 noisy points).
pub const OPEN_BUDGET_BYTES: usize = 32 << 20;
pub const MIN_CHUNK_BYTES: usize = 256;

/// The byte bound of each open chunk when `open` chunks are open.
fn chunk_bound(open: usize) -> usize {
    (OPEN_BUDGET_BYTES / open.max(1)).clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES)
}
/// A chunk of late points begun this far (or further) before its sensor's newest point is
/// logged (a replay after an outage, or a clock that stepped back).
pub const CLOCK_STEP_MS: i64 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("history store: {0}")]
    Db(String),
    #[error("history store: a stored chunk is corrupt")]
    Corrupt,
    #[error("history store: the disk reserve is reached ({free} bytes free); points wait in memory")]
    Reserve { free: u64 },
    /// The database history is kept in (PostgreSQL) failed; what it holds is not readable.
    #[error("history store: {0}")]
    Remote(String),
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
    /// The chunk's own ID (a database keeps its snapshots under it).
    id: i64,
    /// Changed since it was last written.
    dirty: bool,
    /// The flushes that write it (`flush number % TURNS`).
    turn: u64,
    /// Flushes in a row that found it unchanged (a chunk of late points is let go after
    /// [`LATE_IDLE_FLUSHES`]).
    idle: u32,
}

/// A chunk of late points unchanged for this many flushes is let go (it is on disk as it
/// is): late points that keep coming (a device's clock a little behind, a long replay)
/// stay in one chunk, and a sensor's late points cost memory only while they come.
const LATE_IDLE_FLUSHES: u32 = 60;

/// A sealed chunk not yet written, or any chunk a flush writes.
#[derive(Clone)]
struct Sealed {
    sensor: String,
    id: i64,
    first: i64,
    last: i64,
    points: u32,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct Pending {
    open: HashMap<String, Open>,
    /// Each sensor's chunk of late points, while some arrive (dropped once written and
    /// unchanged for a flush).
    late: HashMap<String, Open>,
    /// Sealed chunks not yet written, oldest first.
    sealed: Vec<Sealed>,
    sealed_bytes: usize,
    /// The journal record of what was appended since the last flush took one.
    journal: Vec<u8>,
    /// The next flush writes every changed open chunk (after a flush that failed, or a
    /// replay): until then nothing is journaled.
    full_due: bool,
    /// Open chunks begun, for their turns.
    begun: u64,
    /// The next chunk's ID.
    next_id: i64,
}

/// The first chunk ID of a store opened now: the clock in microseconds times 1,024 (IDs
/// only grow, and a store restarted later starts above every ID it gave before unless it
/// began over 1,024 chunks a microsecond).
fn first_id() -> i64 {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX >> 10));
    micros.saturating_mul(1024)
}

/// The journal's records on disk, and the next flush's number.
#[derive(Default)]
struct Flushes {
    next: u64,
    on_disk: VecDeque<u64>,
}

/// Counts a flush for each chunk of late points: one unchanged (on disk as it is) for
/// [`LATE_IDLE_FLUSHES`] flushes is let go.
fn age_late(p: &mut Pending) {
    p.late.retain(|_, o| {
        if o.dirty {
            o.idle = 0;
            return true;
        }
        o.idle += 1;
        o.idle < LATE_IDLE_FLUSHES
    });
}

/// Whether `p` goes on at the end of the chunk `w` writes, when chunks are sealed at `bound`
/// bytes.
fn fits(w: &ChunkWriter, p: &Point, bound: usize) -> bool {
    p.t > w.last_t()
        && w.len() < MAX_POINTS
        && w.byte_len() < bound
        && p.t - w.first_t() <= MAX_SPAN_MS
        && w.kind() == Kind::of(&p.value)
}

/// Which of a sensor's open chunks a point goes to.
#[derive(Clone, Copy)]
enum Lane {
    Newest,
    Late,
}

pub struct HistoryStore {
    db: Db,
    pending: Mutex<Pending>,
    /// One flush at a time: a flush removes from `pending` only what it wrote.
    flushing: Mutex<Flushes>,
    limits: Limits,
    dropped: AtomicU64,
    /// Points stored before their sensor's newest one (late).
    late: AtomicU64,
    /// Points dropped because their sensor already has a point at that instant.
    repeated: AtomicU64,
    /// Chunks begun for late points.
    late_chunks: AtomicU64,
    /// When late points far back were last logged (ms since the epoch): one line a minute.
    step_logged: std::sync::atomic::AtomicI64,
    /// Points the journal gave back at open (appended before a crash, in no stored chunk).
    replayed: AtomicU64,
    /// The database history is kept in, when not this store's file (the file then keeps
    /// what waits to be written there).
    remote: Option<Remote>,
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
            tx.open_table(JOURNAL).map_err(self::db)?;
            tx.commit().map_err(self::db)
        })?;
        let store = HistoryStore {
            db,
            pending: Mutex::new(Pending { next_id: first_id(), ..Pending::default() }),
            flushing: Mutex::new(Flushes::default()),
            limits: Limits::default(),
            dropped: AtomicU64::new(0),
            late: AtomicU64::new(0),
            repeated: AtomicU64::new(0),
            late_chunks: AtomicU64::new(0),
            step_logged: std::sync::atomic::AtomicI64::new(i64::MIN),
            replayed: AtomicU64::new(0),
            remote: None,
        };
        store.replay()?;
        Ok(store)
    }

    /// The same store with these limits.
    pub fn with_limits(mut self, limits: Limits) -> HistoryStore {
        self.limits = limits;
        self
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// Appends a point. A point after its sensor's newest one goes to the sensor's open
    /// chunk; one before it (a replay of buffered values, a device's sample out of order, a
    /// clock that stepped back) to the sensor's chunk of late points, or a new one when it
    /// is not after that chunk's last point either. A point at an instant the sensor
    /// already has (its newest, the last late one, or where a stored chunk starts) is a
    /// repeat: dropped and counted (returns false). A forward jump is just a long silence:
    /// a gap in the history, never invented data.
    pub fn append(&self, sensor: &str, p: &Point) -> bool {
        self.append_to(&mut self.lock(), sensor, p)
    }

    /// Appends points of any sensors, as [`HistoryStore::append`] does, taking the lock once
    /// (a hub applies a message of a hundred values at a time). Returns how many were stored.
    pub fn append_all<'a>(&self, points: impl IntoIterator<Item = (&'a str, Point)>) -> usize {
        let mut pending = self.lock();
        points.into_iter().filter(|(sensor, p)| self.append_to(&mut pending, sensor, p)).count()
    }

    fn append_to(&self, pending: &mut Pending, sensor: &str, p: &Point) -> bool {
        // The common case first, one lookup: the next point of the sensor's open chunk.
        let bound = chunk_bound(pending.open.len() + pending.late.len());
        if let Some(o) = pending.open.get_mut(sensor)
            && fits(&o.writer, p, bound)
        {
            o.writer.push(p);
            o.dirty = true;
            let (chunk, place) = (o.writer.first_t(), o.writer.len() - 1);
            pending.note(sensor, chunk, place, p);
            return true;
        }
        let newest = pending.open.get(sensor).map(|o| o.writer.last_t());
        let lane = if newest.is_some_and(|last| p.t < last) { Lane::Late } else { Lane::Newest };
        let pushed = match newest {
            Some(last) if p.t > last => self.push(pending, Lane::Newest, sensor, p),
            Some(last) if p.t < last => {
                let pushed = self.push(pending, Lane::Late, sensor, p);
                if pushed.is_some() {
                    self.late.fetch_add(1, Ordering::Relaxed);
                }
                if pushed == Some(true) {
                    self.late_chunks.fetch_add(1, Ordering::Relaxed);
                    if p.t <= last - CLOCK_STEP_MS {
                        self.note_far_back(sensor, last, p.t);
                    }
                }
                pushed
            }
            Some(_) => None,
            None => self.push(pending, Lane::Newest, sensor, p),
        };
        match pushed {
            Some(_) => pending.journal(lane, sensor, p),
            None => {
                self.repeated.fetch_add(1, Ordering::Relaxed);
            }
        }
        pushed.is_some()
    }

    /// Pushes `p` onto the sensor's chunk in `lane`, sealing that chunk and starting a new
    /// one when `p` does not fit: whether it did. `None` when `p` repeats an instant
    /// already stored.
    fn push(&self, pending: &mut Pending, lane: Lane, sensor: &str, p: &Point) -> Option<bool> {
        let kind = Kind::of(&p.value);
        let Pending { open, late, sealed, sealed_bytes, begun, next_id, .. } = pending;
        let bound = chunk_bound(open.len() + late.len());
        let chunks = match lane {
            Lane::Newest => &mut *open,
            Lane::Late => &mut *late,
        };
        let fits = chunks.get(sensor).map(|o| (p.t != o.writer.last_t()).then(|| fits(&o.writer, p, bound)));
        match fits {
            Some(None) => return None,
            Some(Some(true)) => {
                if let Some(o) = chunks.get_mut(sensor) {
                    o.writer.push(p);
                    o.dirty = true;
                }
                return Some(false);
            }
            Some(Some(false)) | None => {}
        }
        // A new chunk, keyed by its first point's time: where a chunk already starts,
        // that point is stored.
        let starts = |(_, o): (&String, &Open)| o.writer.first_t() == p.t;
        // Only a late point can: a point after the sensor's newest is after every point
        // of its chunks in memory (late ones are before the newest when they come).
        let in_memory = matches!(lane, Lane::Late)
            && (open.get_key_value(sensor).is_some_and(starts)
                || late.get_key_value(sensor).is_some_and(starts)
                || sealed.iter().any(|c| c.sensor == sensor && c.first == p.t));
        // Nor can a chunk on disk start after the sensor's newest chunk in memory (each
        // chunk the store wrote began before it): the disk is asked only for a late point,
        // or a sensor with no chunk open (a store just opened), not on every seal.
        let after_newest = matches!(lane, Lane::Newest) && fits.is_some();
        if in_memory || !after_newest && self.stored_chunk_starts(sensor, p.t) {
            return None;
        }
        let chunks = match lane {
            Lane::Newest => open,
            Lane::Late => late,
        };
        let mut writer = ChunkWriter::new(kind);
        writer.push(p);
        let turn = *begun % TURNS;
        *begun += 1;
        let id = *next_id;
        *next_id += 1;
        if let Some(old) = chunks.insert(sensor.to_string(), Open { writer, id, dirty: true, turn, idle: 0 })
        {
            let w = &old.writer;
            let chunk = Sealed {
                sensor: sensor.to_string(),
                id: old.id,
                first: w.first_t(),
                last: w.last_t(),
                points: w.len(),
                bytes: w.bytes(),
            };
            *sealed_bytes += chunk.bytes.len();
            sealed.push(chunk);
            // Bounded while flushes fail: the oldest waiting chunks go first.
            while *sealed_bytes > self.limits.max_unflushed_bytes && !sealed.is_empty() {
                let gone = sealed.remove(0);
                *sealed_bytes -= gone.bytes.len();
                self.dropped.fetch_add(u64::from(gone.points), Ordering::Relaxed);
            }
        }
        Some(true)
    }

    /// Whether a chunk of `sensor` starting at `t` is on disk (a store that cannot be
    /// read has none: its chunks are written again when it can).
    fn stored_chunk_starts(&self, sensor: &str, t: i64) -> bool {
        self.db
            .read(|d| {
                let tx = d.begin_read().map_err(db)?;
                let table = tx.open_table(CHUNKS).map_err(db)?;
                Ok::<_, StoreError>(table.get((sensor, t)).map_err(db)?.is_some())
            })
            .unwrap_or(false)
    }

    /// Logs, at most once a minute, late points that began a chunk far back.
    fn note_far_back(&self, sensor: &str, newest: i64, t: i64) {
        let logged = self.step_logged.load(Ordering::Relaxed);
        if (logged == i64::MIN || (t - logged).abs() >= 60_000)
            && self.step_logged.compare_exchange(logged, t, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::info!(
                sensor,
                back_ms = newest - t,
                "history points far before their sensor's newest (a replay, or the clock stepped back): stored in chunks of their own, merged in time order when read"
            );
        }
    }

    /// Chunks begun for late points.
    pub fn late_chunks(&self) -> u64 {
        self.late_chunks.load(Ordering::Relaxed)
    }

    /// Points dropped because flushes failed for so long that waiting chunks passed the
    /// memory bound.
    pub fn dropped_points(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Points stored before their sensor's newest one.
    pub fn late_points(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// Points dropped because their sensor had a point at that instant already.
    pub fn repeated_points(&self) -> u64 {
        self.repeated.load(Ordering::Relaxed)
    }

    /// What is wrong with the store now (a failed flush, the reserve reached, the
    /// database history is kept in unreachable), if anything.
    pub fn problem(&self) -> Option<Problem> {
        self.db.problem().or_else(|| self.remote.as_ref().and_then(Remote::problem))
    }

    /// Every problem of the store now: its file's, and the database's (both can hold at
    /// once: a full disk while the database is down).
    pub fn problems(&self) -> Vec<Problem> {
        self.db.problem().into_iter().chain(self.remote.as_ref().and_then(Remote::problem)).collect()
    }

    /// Flushes that failed since start.
    pub fn failures(&self) -> u64 {
        self.db.failures()
    }

    /// Free and total bytes of the filesystem of the store's file.
    pub fn disk_space(&self) -> Option<(u64, u64)> {
        self.db.file().and_then(|f| disk_space(f.parent().unwrap_or(f)))
    }

    /// Whether the store answers reads (for `/readyz`).
    pub fn is_open(&self) -> bool {
        self.db.read(|d| d.begin_read().map_err(db)?.open_table(CHUNKS).map(|_| ()).map_err(db)).is_ok()
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "history_props.rs"]
mod props;
