//! History flushes and prunes killed midway, at every write they make.
//!
//! The store runs on a storage backend that counts its writes, length changes and syncs,
//! and "dies" at a chosen one: that operation and every later one fail. Two images are
//! then reopened: the file as written so far (the process was killed: the OS keeps every
//! completed write) and the file as of its last sync (the power was cut: only synced data
//! survives). Whatever the crash point, each image opens, and holds either all of the
//! interrupted flush (or prune) or none of it; a flush that returned `Ok` is in both.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fieldgate::store::HistoryStore;
use fieldgate::store::db::Db;
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::store::history::MAX_POINTS;
use redb::StorageBackend;

#[derive(Debug, Default)]
struct Disk {
    file: Vec<u8>,
    synced: Vec<u8>,
}

/// Memory that dies at operation `crash_at` (counted from 0 over writes, length changes
/// and syncs).
#[derive(Debug, Clone)]
struct Crashable {
    disk: Arc<Mutex<Disk>>,
    ops: Arc<AtomicUsize>,
    crash_at: Arc<AtomicUsize>,
}

impl Crashable {
    fn new(image: Vec<u8>) -> Crashable {
        Crashable {
            disk: Arc::new(Mutex::new(Disk { synced: image.clone(), file: image })),
            ops: Arc::default(),
            crash_at: Arc::new(AtomicUsize::new(usize::MAX)),
        }
    }

    fn op(&self) -> std::io::Result<()> {
        if self.ops.fetch_add(1, Ordering::SeqCst) >= self.crash_at.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the process died"));
        }
        Ok(())
    }

    fn ops(&self) -> usize {
        self.ops.load(Ordering::SeqCst)
    }

    fn die_at(&self, op: usize) {
        self.crash_at.store(op, Ordering::SeqCst);
    }

    /// (what a killed process leaves, what a power cut leaves)
    fn images(&self) -> [(&'static str, Vec<u8>); 2] {
        let d = self.disk.lock().unwrap();
        [("killed", d.file.clone()), ("power cut", d.synced.clone())]
    }
}

impl StorageBackend for Crashable {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.disk.lock().unwrap().file.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let d = self.disk.lock().unwrap();
        let at = offset as usize;
        let end = (at + out.len()).min(d.file.len());
        out.fill(0);
        if at < end {
            out[..end - at].copy_from_slice(&d.file[at..end]);
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.op()?;
        self.disk.lock().unwrap().file.resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.op()?;
        let mut d = self.disk.lock().unwrap();
        d.synced = d.file.clone();
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.op()?;
        let mut d = self.disk.lock().unwrap();
        let end = offset as usize + data.len();
        if d.file.len() < end {
            d.file.resize(end, 0);
        }
        d.file[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
}

fn history_on(disk: &Crashable) -> HistoryStore {
    let d = disk.clone();
    let opener =
        Box::new(move || redb::Database::builder().create_with_backend(d.clone()).map_err(|e| e.to_string()));
    HistoryStore::with_db(Db::open("history", Path::new("crash.redb"), opener).unwrap()).unwrap()
}

fn p(i: i64) -> Point {
    Point { t: i * 1000, value: Stored::Float(i as f64 / 3.0), quality: 0 }
}

fn append(store: &HistoryStore, range: std::ops::Range<i64>) {
    for i in range {
        assert!(store.append("S", &p(i)));
    }
}

/// The points an image holds; an image that does not open or read is a failure.
fn points_of(image: Vec<u8>, what: &str) -> Vec<Point> {
    history_on(&Crashable::new(image))
        .points("S", 0, i64::MAX)
        .unwrap_or_else(|e| panic!("{what}: the reopened store cannot be read: {e:?}"))
}

#[test]
fn a_history_flush_killed_at_any_write_leaves_all_of_it_or_none() {
    let before: Vec<Point> = (0..1500).map(p).collect();
    let after: Vec<Point> = (0..3000).map(p).collect();
    let mut crash_points = 0;
    for k in 0.. {
        assert!(k < 10_000, "the flush never completes");
        let disk = Crashable::new(Vec::new());
        let store = history_on(&disk);
        append(&store, 0..1500);
        store.flush().unwrap();
        // Sealed chunks and a grown open chunk: several rows in one transaction.
        append(&store, 1500..3000);
        disk.die_at(disk.ops() + k);
        let finished = store.flush().is_ok();
        for (what, image) in disk.images() {
            let what = format!("{what} at write {k} of the flush");
            let got = points_of(image, &what);
            if finished {
                assert_eq!(got, after, "{what}: an acknowledged flush is durable");
            } else {
                assert!(got == before || got == after, "{what}: {} points, a partial flush", got.len());
            }
        }
        if finished {
            break;
        }
        crash_points += 1;
    }
    assert!(crash_points >= 3, "only {crash_points} crash points: the flush made almost no writes");
}

#[test]
fn a_prune_killed_at_any_write_leaves_all_of_it_or_none() {
    let all: Vec<Point> = (0..5 * i64::from(MAX_POINTS)).map(p).collect();
    let mut crash_points = 0;
    for k in 0.. {
        assert!(k < 10_000, "the prune never completes");
        let disk = Crashable::new(Vec::new());
        let store = history_on(&disk);
        append(&store, 0..5 * i64::from(MAX_POINTS));
        store.flush().unwrap();
        // By age: the first three chunks (they end before 3 * MAX_POINTS s).
        let cut = 3 * i64::from(MAX_POINTS) * 1000;
        disk.die_at(disk.ops() + k);
        let finished = store.prune(cut, u64::MAX).is_ok();
        let pruned: Vec<Point> = all.iter().filter(|q| q.t >= cut).cloned().collect();
        for (what, image) in disk.images() {
            let what = format!("{what} at write {k} of the prune");
            let got = points_of(image, &what);
            if finished {
                assert_eq!(got, pruned, "{what}: a finished prune is durable");
            } else {
                assert!(got == all || got == pruned, "{what}: {} points, a partial prune", got.len());
            }
        }
        if finished {
            break;
        }
        crash_points += 1;
    }
    assert!(crash_points >= 2, "only {crash_points} crash points");
}
