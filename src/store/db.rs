//! A redb database that outlives its own failures.
//!
//! redb refuses every later operation after one failed write ("Previous I/O error occurred.
//! Please close and re-open the database"), and may panic on a file damaged outside redb. So
//! each store goes through [`Db`]: an operation that fails on storage (or panics inside
//! redb) drops the handle, records the problem, and the next operation reopens the file
//! (checking its integrity) once every other user of the old handle is done. A store in
//! memory is never reopened. Nothing a file contains can panic fieldgate: a panic inside
//! redb is caught here and becomes a storage failure.
//!
//! Opening at start checks the whole file ([`redb::Builder::set_check_integrity_on_open`]):
//! a damaged file is refused with its path and what to do, never half-trusted.

use parking_lot::{Mutex, RwLock};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use redb::Database;

/// How a store's database is (re)opened.
pub type Opener = Box<dyn Fn() -> Result<Database, String> + Send + Sync>;

/// Errors of a store's own that say whether its storage failed (as opposed to "not found",
/// "conflict" and other answers about the data).
pub trait StorageFailure {
    fn storage(reason: String) -> Self;
    fn is_storage(&self) -> bool;
}

/// What is wrong with a store now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub since: DateTime<Utc>,
    pub reason: String,
}

pub struct Db {
    /// "history" or "work orders", for messages.
    what: &'static str,
    file: Option<PathBuf>,
    opener: Option<Opener>,
    handle: RwLock<Option<Arc<Database>>>,
    problem: Mutex<Option<Problem>>,
    failures: AtomicU64,
}

/// The page cache of each store file, read cache and write buffer together (redb's
/// default, 1 GiB, is more than an edge box has to spare; reads of history touch a
/// sensor's chunks, a few hundred KiB; a hub's flush of 100,000 sensors writes about 10 MB).
pub const CACHE_BYTES: usize = 16 << 20;

/// Opens `path` with its integrity checked; the error names the file and what to do.
pub fn open_checked(path: &Path) -> Result<Database, String> {
    // A file this call creates and cannot finish (a full disk) is removed again: left
    // behind, half written, it would be refused as damaged at every later start.
    let existed = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
    let opened = catch_unwind(|| {
        Database::builder().set_check_integrity_on_open(true).set_cache_size(CACHE_BYTES).create(path)
    });
    let failed = |message: String| {
        if !existed {
            let _ = std::fs::remove_file(path);
        }
        Err(message)
    };
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            Err(format!("{} is in use by another fieldgate process", path.display()))
        }
        // Not a redb file at all (its header makes no sense): damaged, like any other.
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))))
            if e.kind() == std::io::ErrorKind::InvalidData =>
        {
            failed(damaged(path, "it is not a database file fieldgate can read"))
        }
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))) => {
            failed(format!("{} cannot be opened: {}", path.display(), e.kind()))
        }
        Ok(Err(e)) => failed(damaged(path, &e.to_string())),
        Err(_) => failed(damaged(path, "its contents make the storage library fail")),
    }
}

fn damaged(path: &Path, why: &str) -> String {
    let why: String = why.chars().take(120).collect();
    let events = path.with_extension("last_event");
    if events.exists() {
        // The alarm journal: an empty one beside its marker is refused (event IDs must not
        // be given twice), so moving the journal alone would not start.
        return format!(
            "{} is damaged ({why}); restore it from a backup, or move it and {} aside to start a new journal (event IDs then start again at 1)",
            path.display(),
            events.display()
        );
    }
    let marker = path.with_extension("last_id");
    if marker.exists() {
        // The work-order store: an empty store beside its marker is refused (IDs must not
        // be reused), so moving the store alone would not start.
        return format!(
            "{} is damaged ({why}); restore it from a backup, or move it and {} aside to start with no orders (IDs then start again at WO-000001)",
            path.display(),
            marker.display()
        );
    }
    format!(
        "{} is damaged ({why}); move it aside (fieldgate then starts an empty one) or restore it from a backup",
        path.display()
    )
}

impl Db {
    /// A file-backed store, opened now by `opener` (reopened by it after a failure).
    pub fn open(what: &'static str, file: &Path, opener: Opener) -> Result<Db, String> {
        let database = opener()?;
        Ok(Db {
            what,
            file: Some(file.to_path_buf()),
            opener: Some(opener),
            handle: RwLock::new(Some(Arc::new(database))),
            problem: Mutex::new(None),
            failures: AtomicU64::new(0),
        })
    }

    /// A file-backed store at `path`, opened with its integrity checked.
    pub fn open_file(what: &'static str, path: &Path) -> Result<Db, String> {
        let p = path.to_path_buf();
        Db::open(what, path, Box::new(move || open_checked(&p)))
    }

    /// A store in memory: never reopened.
    pub fn memory(what: &'static str, database: Database) -> Db {
        Db {
            what,
            file: None,
            opener: None,
            handle: RwLock::new(Some(Arc::new(database))),
            problem: Mutex::new(None),
            failures: AtomicU64::new(0),
        }
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// What is wrong now, if anything: set by a failed operation, cleared by a write that
    /// succeeded.
    pub fn problem(&self) -> Option<Problem> {
        self.problem.lock().clone()
    }

    /// Operations that failed on storage since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Runs a read.
    pub fn read<T, E: StorageFailure>(&self, f: impl FnOnce(&Database) -> Result<T, E>) -> Result<T, E> {
        self.run(false, f)
    }

    /// Runs a write; its success clears the store's problem.
    pub fn write<T, E: StorageFailure>(&self, f: impl FnOnce(&Database) -> Result<T, E>) -> Result<T, E> {
        self.run(true, f)
    }

    fn run<T, E: StorageFailure>(
        &self,
        write: bool,
        f: impl FnOnce(&Database) -> Result<T, E>,
    ) -> Result<T, E> {
        let db = self.handle().map_err(E::storage)?;
        match catch_unwind(AssertUnwindSafe(|| f(&db))) {
            Ok(Ok(v)) => {
                if write && self.problem.lock().is_some() && self.has_room() {
                    *self.problem.lock() = None;
                    tracing::info!(store = self.what, "storage writes again");
                }
                Ok(v)
            }
            Ok(Err(e)) if e.is_storage() => {
                drop(db);
                self.failed("a write or read failed");
                Err(e)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                drop(db);
                self.failed("the storage library failed on the file's contents");
                Err(E::storage(format!("{} store: its file is damaged", self.what)))
            }
        }
    }

    /// Whether a failing store's disk has room again. On a full disk a write that fits in
    /// the file's free pages succeeds while the next that must grow it fails: the problem
    /// stays until [`RECOVERED`] bytes are free, so a full disk is one outage, not a flap.
    fn has_room(&self) -> bool {
        let Some(dir) = self.file.as_deref().and_then(Path::parent) else { return true };
        disk_space(dir).is_none_or(|(free, _)| free >= RECOVERED)
    }

    /// The open handle, reopening the file when the last one failed.
    fn handle(&self) -> Result<Arc<Database>, String> {
        if let Some(db) = self.handle.read().as_ref() {
            return Ok(db.clone());
        }
        let Some(opener) = &self.opener else {
            return Err(format!("{} store is unavailable", self.what));
        };
        let mut slot = self.handle.write();
        if let Some(db) = slot.as_ref() {
            return Ok(db.clone());
        }
        let opened = catch_unwind(AssertUnwindSafe(opener))
            .unwrap_or_else(|_| Err("the storage library failed on the file's contents".into()));
        match opened {
            Ok(db) => {
                // Quietly: while the disk stays full this happens on every attempt; the
                // line that matters is "storage writes again".
                tracing::debug!(store = self.what, "storage reopened");
                let db = Arc::new(db);
                *slot = Some(db.clone());
                Ok(db)
            }
            Err(reason) => {
                drop(slot);
                self.failures.fetch_add(1, Ordering::Relaxed);
                self.note(&reason);
                Err(format!("{} store is unavailable: {reason}", self.what))
            }
        }
    }

    /// Drops the handle (a file-backed one is reopened on next use) and records why.
    fn failed(&self, reason: &str) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if self.opener.is_some() {
            *self.handle.write() = None;
        }
        self.note(reason);
    }

    /// Records a problem found outside the database (e.g. a file kept beside it that
    /// cannot be written); cleared by the next write that succeeds.
    pub fn note(&self, reason: &str) {
        let mut p = self.problem.lock();
        if p.as_ref().is_none_or(|p| p.reason != reason) {
            tracing::error!(store = self.what, file = ?self.file, reason, "storage is failing");
        }
        let since = p.as_ref().map_or_else(Utc::now, |p| p.since);
        *p = Some(Problem { since, reason: reason.to_string() });
    }

    /// Records a problem found outside an operation (e.g. the disk reserve reached).
    pub fn set_problem(&self, reason: Option<&str>) {
        match reason {
            Some(r) => self.note(r),
            None => *self.problem.lock() = None,
        }
    }
}

/// Free bytes a failing store's disk needs before a write counts as its recovery.
const RECOVERED: u64 = 1 << 20;

/// Free and total bytes of the filesystem holding `path`.
pub fn disk_space(path: &Path) -> Option<(u64, u64)> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some((s.f_bavail.saturating_mul(s.f_frsize), s.f_blocks.saturating_mul(s.f_frsize)))
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content.
pub fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
