//! Faults of the box itself: storage that fails to write (an injected I/O-error layer that
//! always runs, and a real 2 MB filesystem filled up where the test may mount one), damaged
//! store files, an emptied work-order store. What must hold: nothing acknowledged is lost,
//! nothing panics, and everything recovers by itself when the storage does.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fieldgate::store::HistoryStore;
use fieldgate::store::db::Db;
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::store::history::Limits;
use fieldgate::tools::ErrorCode;
use fieldgate::work_orders::WorkOrderStore;
use redb::StorageBackend;
use redb::backends::InMemoryBackend;
use serde_json::json;

use super::support::*;

/// A storage backend whose writes and syncs fail while `fail` is set, over memory that
/// outlives each `Database` (so a reopen finds what was committed).
#[derive(Debug)]
struct Flaky {
    inner: Arc<InMemoryBackend>,
    fail: Arc<AtomicBool>,
    /// Reads return garbage (a damaged medium) while set.
    garbage: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        }
        Ok(())
    }
}

impl StorageBackend for Flaky {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)?;
        if self.garbage.load(Ordering::SeqCst) {
            out.iter_mut().enumerate().for_each(|(i, b)| *b = (i as u8).wrapping_mul(151) ^ 0x5A);
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
}

/// A store database over one flaky memory, and the switches that make its writes fail
/// and its reads return garbage.
fn flaky_db_with(what: &'static str) -> (Db, Arc<AtomicBool>, Arc<AtomicBool>) {
    let memory = Arc::new(InMemoryBackend::new());
    let (fail, garbage) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (m, f, g) = (memory.clone(), fail.clone(), garbage.clone());
    let opener = Box::new(move || {
        let backend = Flaky { inner: m.clone(), fail: f.clone(), garbage: g.clone() };
        redb::Database::builder().create_with_backend(backend).map_err(|e| e.to_string())
    });
    (Db::open(what, Path::new("flaky.redb"), opener).unwrap(), fail, garbage)
}

fn flaky_db(what: &'static str) -> (Db, Arc<AtomicBool>) {
    let (db, fail, _) = flaky_db_with(what);
    (db, fail)
}

fn p(t: i64) -> Point {
    Point { t, value: Stored::Float(t as f64 / 7.0), quality: 0 }
}

#[test]
fn a_failed_history_flush_keeps_every_point_and_the_store_recovers_by_itself() {
    let (db, fail) = flaky_db("history");
    let store = HistoryStore::with_db(db).unwrap();
    let mut t = 0;
    let mut append = |n: usize| {
        for _ in 0..n {
            t += 1000;
            assert!(store.append("A_LINE1_001", &p(t)));
        }
    };
    append(1500);
    store.flush().unwrap();
    fail.store(true, Ordering::SeqCst);
    // Sealed chunks and the open chunk's new points, through several failed flushes.
    for _ in 0..3 {
        append(700);
        assert!(store.flush().is_err());
        assert!(store.problem().is_some());
    }
    // While the disk fails, what was flushed and what waits are both still readable or
    // the read fails cleanly; nothing panics.
    let _ = store.points("A_LINE1_001", 0, i64::MAX);
    fail.store(false, Ordering::SeqCst);
    append(10);
    store.flush().unwrap();
    assert!(store.problem().is_none(), "a successful write clears the problem");
    assert!(store.failures() >= 3);
    let all = store.points("A_LINE1_001", 0, i64::MAX).unwrap();
    assert_eq!(all.len(), 1500 + 3 * 700 + 10, "every acknowledged point survived the episode");
    assert!(all.windows(2).all(|w| w[0].t < w[1].t));
    assert_eq!(store.dropped_points(), 0);
}

#[test]
fn garbage_from_the_medium_is_a_storage_failure_never_a_panic_and_passes() {
    let (db, fail, garbage) = flaky_db_with("history");
    let store = HistoryStore::with_db(db).unwrap();
    for i in 1..=3000 {
        store.append("S", &p(i * 1000));
    }
    store.flush().unwrap();
    // A failed write drops the handle; the reopen then reads the medium, which now
    // returns garbage (redb would otherwise answer from its cache).
    fail.store(true, Ordering::SeqCst);
    store.append("S", &p(3_001_000));
    assert!(store.flush().is_err());
    fail.store(false, Ordering::SeqCst);
    garbage.store(true, Ordering::SeqCst);
    for i in 3002..=3100 {
        store.append("S", &p(i * 1000));
    }
    // Whatever redb makes of the garbage (an error, or a panic inside it), fieldgate gets
    // an error from the store, and the store is marked failing.
    assert!(store.flush().is_err(), "garbage went unnoticed");
    assert!(store.points("S", 0, i64::MAX).is_err());
    assert!(store.problem().is_some());
    garbage.store(false, Ordering::SeqCst);
    store.flush().unwrap();
    assert_eq!(store.points("S", 0, i64::MAX).unwrap().len(), 3100);
}

#[test]
fn history_waiting_in_memory_is_bounded_and_what_it_drops_is_counted() {
    let (db, fail) = flaky_db("history");
    let limits = Limits { reserve_bytes: 0, reserve_percent: 0, max_unflushed_bytes: 4096 };
    let store = HistoryStore::with_db(db).unwrap().with_limits(limits);
    fail.store(true, Ordering::SeqCst);
    for i in 1..=20_000 {
        store.append("S", &p(i * 1000));
    }
    assert!(store.flush().is_err());
    let dropped = store.dropped_points();
    assert!(dropped > 0, "the bound dropped some");
    fail.store(false, Ordering::SeqCst);
    store.flush().unwrap();
    let left = store.points("S", 0, i64::MAX).unwrap();
    assert_eq!(left.len() as u64 + dropped, 20_000);
    assert_eq!(left.last().unwrap().t, 20_000 * 1000, "the newest points are kept");
    // Whole chunks, oldest first: what is left is every point after the dropped ones.
    assert_eq!(left.first().unwrap().t, (dropped as i64 + 1) * 1000, "the oldest went first");
}

fn order(key: &str) -> serde_json::Value {
    json!({"sensor_id": "A_LINE1_001", "type": "inspection", "priority": "medium",
           "summary": "Discharge pressure above range for an hour; inspect the pump.", "idempotency_key": key})
}

#[tokio::test]
async fn work_orders_answer_storage_unavailable_while_writes_fail_and_recover() {
    let (db, fail) = flaky_db("work orders");
    let orders = Arc::new(WorkOrderStore::init(db).unwrap());
    let svc = service_with_orders(orders.clone());
    fail.store(true, Ordering::SeqCst);
    let e = svc.call("create_work_order", order("disk-full-0001")).await.unwrap();
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::StorageUnavailable);
    assert!(err.retryable && err.retry_after_ms.is_some(), "{err:?}");
    let status = svc.call("get_device_status", json!({})).await.unwrap().json();
    assert_eq!(status["storage"]["state"], "failing", "{status}");
    assert!(status["storage"]["problems"][0].as_str().unwrap().starts_with("work orders:"), "{status}");
    // A read while the store cannot be reopened is refused the same way, never INTERNAL.
    let e = svc.call("list_work_orders", json!({})).await.unwrap();
    assert!(e.ok || e.error.as_ref().unwrap().code == ErrorCode::StorageUnavailable, "{:?}", e.error);
    assert!(!orders.recheck(), "still failing: not fine");
    assert!(orders.problem().is_some());
    fail.store(false, Ordering::SeqCst);
    // The storage is back: the store finds out by itself (the delivery task's recheck),
    // without waiting for the next order.
    assert!(orders.recheck(), "fine again once a write commits");
    assert!(orders.problem().is_none());
    let status = svc.call("get_device_status", json!({})).await.unwrap().json();
    assert_eq!(status["storage"]["state"], "ok", "{status}");
    let e = svc.call("create_work_order", order("disk-full-0001")).await.unwrap();
    assert!(e.ok, "{:?}", e.error);
    assert_eq!(e.json()["work_order"]["id"], "WO-000001", "the refused call created nothing");
    let status = svc.call("get_device_status", json!({})).await.unwrap().json();
    assert_eq!(status["storage"]["state"], "ok", "{status}");
}

/// A pending inspection of `sensor`, as the tool would hand it to the store.
fn draft(sensor: &str) -> fieldgate::work_orders::WorkOrder {
    serde_json::from_value(json!({
        "id": "", "sensor_id": sensor, "equipment": null, "type": "inspection", "priority": "low",
        "summary": "x", "status": "pending_approval", "created_at": "2026-12-01T00:00:00Z",
        "updated_at": "2026-12-01T00:00:00Z", "created_by": "t", "evidence": null, "history": [],
        "delivery": null
    }))
    .unwrap()
}

/// Writes two orders and some history into `dir`, as a service would have.
fn filled_data_dir(dir: &Path) {
    let orders = WorkOrderStore::open_in(dir).unwrap();
    for n in 1..=2 {
        orders.create(&format!("k{n}"), "f", draft(&format!("A_LINE1_00{n}")), false).unwrap();
    }
    drop(orders);
    let history = HistoryStore::open_in(dir).unwrap();
    for i in 1..=5000 {
        history.append("A_LINE1_001", &p(i * 1000));
    }
    history.flush().unwrap();
}

fn zero(path: &Path, from: SeekFrom, len: usize) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(from).unwrap();
    f.write_all(&vec![0u8; len]).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn damaged_store_files_are_refused_with_their_name_never_a_panic() {
    for (file, damage) in [
        ("history.redb", "tail"),
        ("work_orders.redb", "tail"),
        ("history.redb", "all but the first 4 KiB"),
        ("work_orders.redb", "all but the first 4 KiB"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        filled_data_dir(dir.path());
        let path = dir.path().join(file);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        match damage {
            "tail" => zero(&path, SeekFrom::End(-4096), 4096),
            _ => zero(&path, SeekFrom::Start(4096), len - 4096),
        }
        let err = match file {
            "history.redb" => HistoryStore::open_in(dir.path()).err().map(|e| e.to_string()),
            _ => WorkOrderStore::open_in(dir.path()).err().map(|e| e.to_string()),
        };
        let Some(err) = err else {
            // Only an unused region was zeroed: then everything must still be there.
            assert_eq!(damage, "tail", "{file} with {damage} zeroed was opened");
            match file {
                "history.redb" => {
                    let h = HistoryStore::open_in(dir.path()).unwrap();
                    assert_eq!(h.points("A_LINE1_001", 0, i64::MAX).unwrap().len(), 5000);
                }
                _ => assert_eq!(WorkOrderStore::open_in(dir.path()).unwrap().list().unwrap().len(), 2),
            }
            continue;
        };
        assert!(err.contains(path.to_str().unwrap()) && err.contains("damaged"), "{err}");
        if file == "history.redb" {
            assert!(err.contains("move it aside"), "{err}");
        } else {
            // Moving the store alone would be refused beside its marker: the advice names both.
            assert!(err.contains("move it and") && err.contains("work_orders.last_id aside"), "{err}");
        }
    }
}

#[test]
fn an_emptied_work_order_store_is_refused_since_its_ids_would_be_reused() {
    let dir = tempfile::tempdir().unwrap();
    filled_data_dir(dir.path());
    let marker = dir.path().join("work_orders.last_id");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "WO-000002");
    std::fs::File::create(dir.path().join("work_orders.redb")).unwrap(); // truncated to 0 bytes
    let err = WorkOrderStore::open_in(dir.path()).err().expect("an empty store is refused").to_string();
    assert!(err.contains("work_orders.redb") && err.contains("work_orders.last_id"), "{err}");
    assert!(err.contains("WO-000002"), "{err}");
    // Both moved aside: a fresh start, which is the operator's decision.
    std::fs::remove_file(dir.path().join("work_orders.redb")).unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert!(WorkOrderStore::open_in(dir.path()).is_ok());
}

/// An ID marker that cannot be written leaves the order acknowledged (it is committed)
/// but makes the store report a problem until the marker has caught up.
#[test]
fn a_marker_that_cannot_be_written_is_a_storage_problem_until_it_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let orders = WorkOrderStore::open_in(dir.path()).unwrap();
    // The marker is replaced through `work_orders.tmp`: a folder there makes it fail.
    let blocker = dir.path().join("work_orders.tmp");
    std::fs::create_dir(&blocker).unwrap();
    orders.create("k1", "f", draft("A_LINE1_001"), false).unwrap();
    let problem = orders.problem().expect("a problem");
    assert!(problem.reason.contains("marker"), "{}", problem.reason);
    assert!(!orders.recheck());
    std::fs::remove_dir(&blocker).unwrap();
    assert!(orders.recheck());
    assert!(orders.problem().is_none());
    let marker = std::fs::read_to_string(dir.path().join("work_orders.last_id")).unwrap();
    assert_eq!(marker, "WO-000001");
}

/// A marker that is not a regular file (a link to a device that never ends) is refused
/// at once, naming it, not read into memory.
#[test]
fn a_marker_that_is_not_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    filled_data_dir(dir.path());
    let marker = dir.path().join("work_orders.last_id");
    std::fs::remove_file(&marker).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &marker).unwrap();
    let err = WorkOrderStore::open_in(dir.path()).err().expect("refused").to_string();
    assert!(err.contains("work_orders.last_id") && err.contains("not a regular file"), "{err}");
}

#[test]
fn a_store_from_before_the_marker_gets_one() {
    let dir = tempfile::tempdir().unwrap();
    filled_data_dir(dir.path());
    let marker = dir.path().join("work_orders.last_id");
    std::fs::remove_file(&marker).unwrap();
    drop(WorkOrderStore::open_in(dir.path()).unwrap());
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "WO-000002");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_damaged_store_with_a_message_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    filled_data_dir(dir.path());
    let path = dir.path().join("history.redb");
    zero(&path, SeekFrom::End(-4096), 4096);
    let closed = ClosedPort::new();
    let devices = demo_devices_unreachable(&closed);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices", devices.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_STORAGE_DATA_DIR", dir.path())
        .output_within()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("history.redb is damaged") && !stderr.contains("panicked"), "{stderr}");
}

/// A store created on a full disk fails to open, and leaves no half-written file behind
/// to be refused as damaged at every later start: once space returns, it opens.
#[test]
fn a_store_created_on_a_full_disk_opens_once_space_returns() {
    let Some((dir, _unmount)) = small_fs("1m") else { return };
    let filler = fill(dir.path());
    assert!(HistoryStore::open_in(dir.path()).is_err(), "created on a full disk");
    assert!(WorkOrderStore::open_in(dir.path()).is_err(), "created on a full disk");
    std::fs::remove_file(&filler).unwrap();
    let store = HistoryStore::open_in(dir.path()).expect("opens once space returns");
    assert!(store.append("A_LINE1_001", &p(1000)));
    store.flush().unwrap();
    WorkOrderStore::open_in(dir.path()).expect("opens once space returns");
}

/// A real 2 MB filesystem, filled up and freed again. Needs `mount` (root); skipped with
/// the reason otherwise.
#[test]
fn a_full_disk_loses_no_acknowledged_history_and_recovers_when_space_returns() {
    let Some((dir, _unmount)) = small_fs("2m") else { return };
    let limits = Limits { reserve_bytes: 0, reserve_percent: 0, max_unflushed_bytes: 64 << 20 };
    let store = HistoryStore::open_in(dir.path()).unwrap().with_limits(limits);
    let orders = WorkOrderStore::open_in(dir.path()).unwrap();
    let mut t = 0;
    let mut append = |n: usize| {
        for _ in 0..n {
            t += 1000;
            store.append("A_LINE1_001", &p(t));
        }
    };
    append(3000);
    store.flush().unwrap();
    let filler = fill(dir.path());
    let mut failed = 0;
    for _ in 0..5 {
        append(2000);
        failed += usize::from(store.flush().is_err());
    }
    assert!(failed > 0, "the full disk never failed a flush");
    assert!(store.problem().is_some());
    assert!(store.disk_space().is_some_and(|(free, _)| free < 64 * 1024));
    let draft = draft("A_LINE1_001");
    let refused = orders.create("full-1", "f", draft.clone(), false);
    assert!(refused.is_err(), "an order acknowledged on a full disk");
    assert!(orders.problem().is_some());
    assert!(!orders.recheck(), "still full");
    // Space returns: everything is written, with no restart, and the work-order store says
    // so before its next order.
    std::fs::remove_file(&filler).unwrap();
    assert!(orders.recheck());
    assert!(orders.problem().is_none());
    store.flush().unwrap();
    assert!(store.problem().is_none());
    let all = store.points("A_LINE1_001", 0, i64::MAX).unwrap();
    assert_eq!(all.len(), 3000 + 5 * 2000, "history lost across the full-disk episode");
    let created = orders.create("full-1", "f", draft, false).unwrap();
    assert!(created.created);
    drop((store, orders));
    // And it is on disk: a restart finds it.
    let again = HistoryStore::open_in(dir.path()).unwrap();
    assert_eq!(again.points("A_LINE1_001", 0, i64::MAX).unwrap().len(), 13_000);
}
