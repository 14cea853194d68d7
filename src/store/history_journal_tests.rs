//! Unit tests of the history store's journal: what a flush writes, what a crash keeps.

use super::*;
use redb::ReadableTable;

fn journal_records(store: &HistoryStore) -> Vec<u64> {
    store
        .db
        .read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let j = tx.open_table(JOURNAL).map_err(db)?;
            j.iter().map_err(db)?.map(|r| r.map(|(k, _)| k.value()).map_err(db)).collect()
        })
        .unwrap()
}

/// `n` points for each of `sensors` sensors, before `T0`, not flushed.
fn prefill(store: &HistoryStore, sensors: usize, n: i64) {
    for s in 0..sensors {
        for k in 0..n {
            store.append(&format!("S{s}"), &p(T0 - (n - k) * 1000, (s as i64 + k / 20) as f64));
        }
    }
}

#[test]
fn a_flush_writes_its_turns_open_chunks_and_a_record_of_the_rest_kept_until_every_turn_came_round() {
    let store = HistoryStore::in_memory().unwrap();
    let sensors = 4 * TURNS as usize;
    // Open chunks of a hundred points: rewriting them all would cost more than the record.
    prefill(&store, sensors, 100);
    assert_eq!(store.flush_all().unwrap(), sensors, "flush 0: every open chunk");
    for k in 1..(2 * TURNS + 10) {
        for s in 0..sensors {
            assert!(store.append(&format!("S{s}"), &p(T0 + k as i64 * 1000, (s + k as usize / 20) as f64)));
        }
        // Four open chunks a turn, not every one of the sensors.
        assert_eq!(store.flush().unwrap(), 4, "flush {k}");
        let records = journal_records(&store);
        let first = (k + 1).saturating_sub(TURNS).max(1);
        assert_eq!(records, (first..=k).collect::<Vec<_>>(), "after flush {k}");
    }
    // Each open chunk was written at its own turn within the last TURNS flushes: on disk it
    // holds every point up to then (100 before, one a flush).
    let last = 2 * TURNS + 9;
    let counts: Vec<u64> = store
        .db
        .read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            t.iter()
                .map_err(db)?
                .map(|r| {
                    let (_, v) = r.map_err(db)?;
                    Ok(u64::from(
                        crate::store::gorilla::count_of(&v.value()[8..]).map_err(|_| StoreError::Corrupt)?,
                    ))
                })
                .collect::<Result<Vec<u64>, StoreError>>()
        })
        .unwrap();
    assert_eq!(counts.len(), sensors);
    assert!(counts.iter().all(|&n| n > 100 + last - TURNS), "{counts:?}");
    // A full flush writes every open chunk changed since its turn, and no record is kept.
    for s in 0..sensors {
        store.append(&format!("S{s}"), &p(T0 + 10_000_000, 1.0));
    }
    assert_eq!(store.flush_all().unwrap(), sensors);
    assert!(journal_records(&store).is_empty());
    // So does a flush whose record would be as large as the chunks it spares (a point or
    // more a sensor since the flush before, in chunks of a few points).
    let few = HistoryStore::in_memory().unwrap();
    for k in 0..3 {
        for s in 0..sensors {
            few.append(&format!("S{s}"), &p(T0 + k * 1000, 1.0));
        }
        assert_eq!(few.flush().unwrap(), sensors);
    }
    assert!(journal_records(&store).is_empty());
    assert_eq!(store.flush().unwrap(), 0, "nothing changed");
}

#[test]
fn after_a_crash_the_journal_gives_back_exactly_what_was_flushed_late_points_and_sealed_chunks_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.redb");
    let mut want: Vec<Point> = Vec::new();
    {
        let store = HistoryStore::open(&path).unwrap();
        // Noisy values: chunks are sealed by their byte bound while journaled.
        for k in 0..700i64 {
            let point = p(T0 + 10_000 + k * 1000, (k as f64 * 1.37).sin() * 1e6);
            assert!(store.append("A", &point));
            want.push(point);
            if k % 50 == 7 {
                // A late point, between two already stored.
                let late = p(T0 + 10_000 + (k - 5) * 1000 + 500, -1.0);
                assert!(store.append("A", &late));
                want.push(late);
            }
            if k % 3 == 0 {
                store.flush().unwrap();
            }
        }
        store.flush().unwrap();
        assert!(store.late_chunks() >= 1);
        // Appended after the last flush: lost in the crash.
        assert!(store.append("A", &p(T0 + 2_000_000, 0.0)));
    }
    want.sort_by_key(|p| p.t);
    // What the chunks on disk hold: the journal gives back exactly the rest.
    let on_disk = points_on_disk(&path);
    assert!(on_disk < want.len() as u64, "the last turns' points were only in the journal");
    let store = HistoryStore::open(&path).unwrap();
    assert_eq!(store.replayed_points(), want.len() as u64 - on_disk);
    assert_eq!(store.points("A", 0, i64::MAX).unwrap(), want);
    // Written again at the next flush (every changed open chunk), the journal emptied; a
    // second reopen replays nothing and reads the same.
    store.flush().unwrap();
    assert!(journal_records(&store).is_empty());
    drop(store);
    let store = HistoryStore::open(&path).unwrap();
    assert_eq!(store.replayed_points(), 0);
    assert_eq!(store.points("A", 0, i64::MAX).unwrap(), want);
}

/// Every point in the chunks on disk.
fn points_on_disk(path: &std::path::Path) -> u64 {
    let d = redb::Database::open(path).unwrap();
    let tx = d.begin_read().unwrap();
    let t = tx.open_table(CHUNKS).unwrap();
    t.iter()
        .unwrap()
        .map(|r| u64::from(crate::store::gorilla::count_of(&r.unwrap().1.value()[8..]).unwrap()))
        .sum()
}

#[test]
fn after_a_crash_what_a_chunk_on_disk_holds_is_not_given_back_again() {
    // Many sensors, each open chunk written at its own turn while the records of the
    // flushes before stay: at replay, those records name points the chunk holds.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.redb");
    let sensors = 2 * TURNS as usize;
    let mut appended = 0u64;
    {
        let store = HistoryStore::open(&path).unwrap();
        prefill(&store, sensors, 100);
        appended += 100 * sensors as u64;
        store.flush_all().unwrap();
        for k in 1..(TURNS + TURNS / 2) as i64 {
            for s in 0..sensors {
                assert!(store.append(&format!("S{s}"), &p(T0 + k * 1000, (s as i64 + k / 20) as f64)));
                appended += 1;
            }
            store.flush().unwrap();
        }
        assert!(journal_records(&store).len() > 1);
    }
    let on_disk = points_on_disk(&path);
    assert!(on_disk < appended, "some points only in the journal");
    let store = HistoryStore::open(&path).unwrap();
    assert_eq!(store.replayed_points(), appended - on_disk, "exactly the points no chunk holds");
    for s in [0, sensors / 2, sensors - 1] {
        let got = store.points(&format!("S{s}"), 0, i64::MAX).unwrap();
        assert_eq!(got.len() as i64, 100 + TURNS as i64 + TURNS as i64 / 2 - 1, "S{s}");
    }
}

#[test]
fn after_a_flush_that_could_not_write_the_next_writes_every_changed_open_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let all = Limits { reserve_bytes: u64::MAX, reserve_percent: 100, max_unflushed_bytes: 1 << 20 };
    let store = HistoryStore::open_in(dir.path()).unwrap().with_limits(all);
    let sensors = 2 * TURNS as usize;
    prefill(&store, sensors, 100);
    assert!(matches!(store.flush(), Err(StoreError::Reserve { .. })));
    // Nothing is journaled meanwhile: the next flush writes the chunks themselves.
    store.append("S0", &p(T0 + 200_000, 2.0));
    assert!(store.lock().journal.is_empty());
    let none = Limits { reserve_bytes: 0, reserve_percent: 0, max_unflushed_bytes: 1 << 20 };
    let store = store.with_limits(none);
    assert_eq!(store.flush().unwrap(), sensors);
    assert!(journal_records(&store).is_empty());
    // Then turns again.
    for s in 0..sensors {
        store.append(&format!("S{s}"), &p(T0 + 300_000, 3.0));
    }
    assert_eq!(store.flush().unwrap(), 2);
    assert_eq!(journal_records(&store).len(), 1);
}

#[test]
fn a_journal_record_that_does_not_decode_is_skipped_and_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.redb");
    {
        let store = HistoryStore::open(&path).unwrap();
        for k in 0..3 {
            store.append("A", &p(T0 + k * 1000, k as f64));
            store.append("B", &p(T0 + k * 1000, k as f64));
            store.flush().unwrap();
        }
        let damaged = store.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            tx.open_table(JOURNAL).map_err(db)?.insert(1, [1u8, 2, 3].as_slice()).map_err(db)?;
            tx.commit().map_err(db)
        });
        damaged.unwrap();
    }
    let store = HistoryStore::open(&path).unwrap();
    // The first and the last flush's points are back; those of the damaged record are not
    // (unless their chunk was written in its turn).
    let a: Vec<i64> = store.points("A", 0, i64::MAX).unwrap().iter().map(|p| p.t).collect();
    assert!(a.contains(&T0) && a.contains(&(T0 + 2000)), "{a:?}");
    store.flush().unwrap();
    assert!(journal_records(&store).is_empty());
}

#[test]
fn a_burst_larger_than_a_record_is_flushed_as_chunks_not_journaled() {
    let store = HistoryStore::in_memory().unwrap();
    let (sensors, per) = (100usize, 5_000i64);
    for k in 0..per {
        for s in 0..sensors {
            store.append(&format!("S{s:03}"), &p(T0 + k * 1000, (k % 10) as f64));
        }
    }
    assert!(store.lock().journal.is_empty(), "given up past {} bytes", journal::MAX_RECORD);
    let written = store.flush().unwrap();
    assert!(written >= sensors, "every open chunk written: {written}");
    assert!(journal_records(&store).is_empty());
}
