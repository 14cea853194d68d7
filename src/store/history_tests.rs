//! Unit tests of the history store (its property tests are in `history_props.rs`).

use super::*;
use crate::store::gorilla::Stored;
use proptest::prelude::*;

fn p(t: i64, v: f64) -> Point {
    Point { t, value: Stored::Float(v), quality: 0 }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
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
                store.flush_all().unwrap();
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
fn late_points_are_stored_repeats_dropped_and_sensors_are_apart() {
    let store = HistoryStore::in_memory().unwrap();
    assert!(store.append("A", &p(10, 1.0)));
    assert!(!store.append("A", &p(10, 2.0)), "the same instant again");
    assert!(store.append("A", &p(5, 2.0)), "before the newest: late");
    assert!(!store.append("A", &p(5, 3.0)), "the late one again");
    assert!(store.append("B", &p(5, 3.0)));
    assert_eq!(store.points("A", 0, 100).unwrap(), vec![p(5, 2.0), p(10, 1.0)]);
    assert_eq!(store.points("B", 0, 100).unwrap(), vec![p(5, 3.0)]);
    assert_eq!((store.late_points(), store.repeated_points(), store.late_chunks()), (1, 2, 1));
}

/// What an edge node buffered through a broker outage arrives after it is back, while its
/// live values flow again: both land in place, the late ones in one chunk of their own.
#[test]
fn a_replay_interleaved_with_live_values_lands_in_place() {
    let store = HistoryStore::in_memory().unwrap();
    for t in 0..100 {
        assert!(store.append("S", &p(t * 1000, t as f64)));
    }
    for (i, t) in (100..200).enumerate() {
        assert!(store.append("S", &p((t + 100) * 1000, (t + 100) as f64)), "live {t}");
        assert!(store.append("S", &p(t * 1000, t as f64)), "replayed {t}");
        if i % 30 == 0 {
            store.flush_all().unwrap();
        }
    }
    let want: Vec<Point> = (0..300).map(|t| p(t * 1000, t as f64)).collect();
    assert_eq!(store.points("S", 0, i64::MAX).unwrap(), want);
    store.flush_all().unwrap();
    assert_eq!(store.points("S", 0, i64::MAX).unwrap(), want, "the same once written");
    assert_eq!(store.points("S", 150_000, 160_000).unwrap(), want[150..160].to_vec());
    assert_eq!((store.late_points(), store.late_chunks(), store.repeated_points()), (100, 1, 0));
}

/// A chunk is keyed by its first point's time: a late chunk (or the first after a restart)
/// that would start where a stored one starts would replace it. That point is stored
/// already; it is dropped, and what is stored stays.
#[test]
fn a_new_chunk_never_replaces_a_stored_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.redb");
    let first: Vec<Point> = (0..10).map(|t| p(t * 1000, 1.0)).collect();
    {
        let store = HistoryStore::open(&path).unwrap();
        for q in &first {
            assert!(store.append("S", q));
        }
        store.flush_all().unwrap();
    }
    let store = HistoryStore::open(&path).unwrap();
    assert!(!store.append("S", &p(0, 9.0)), "where the stored chunk starts, after a restart");
    assert!(store.append("S", &p(20_000, 2.0)));
    assert!(!store.append("S", &p(0, 9.0)), "late, where the stored chunk starts");
    assert!(store.append("S", &p(500, 3.0)), "late, between stored points");
    store.flush_all().unwrap();
    let mut want = first.clone();
    want.insert(1, p(500, 3.0));
    want.push(p(20_000, 2.0));
    assert_eq!(store.points("S", 0, i64::MAX).unwrap(), want);
    assert_eq!(store.repeated_points(), 2);
}

/// A chunk of late points stays in memory while points come, and is let go once written
/// and unchanged for a while; a late point after that begins another.
#[test]
fn a_late_chunk_is_let_go_once_written_and_idle() {
    let store = HistoryStore::in_memory().unwrap();
    assert!(store.append("S", &p(100_000, 1.0)));
    assert!(store.append("S", &p(1000, 2.0)));
    assert!(store.append("S", &p(2000, 2.0)));
    for _ in 0..LATE_IDLE_FLUSHES {
        store.flush_all().unwrap();
        assert_eq!(store.lock().late.len(), 1, "written, kept while it may go on");
    }
    store.flush_all().unwrap();
    assert!(store.lock().late.is_empty(), "idle since: let go");
    assert!(store.append("S", &p(3000, 2.0)));
    assert_eq!(store.late_chunks(), 2);
    store.flush_all().unwrap();
    let got: Vec<i64> = store.points("S", 0, i64::MAX).unwrap().iter().map(|q| q.t).collect();
    assert_eq!(got, vec![1000, 2000, 3000, 100_000]);
}

/// A device whose every other sample comes a little late (its clock jitters), flushed
/// between each: the late ones go on in one chunk, not one chunk each.
#[test]
fn late_points_that_keep_coming_stay_in_one_chunk_across_flushes() {
    let store = HistoryStore::in_memory().unwrap();
    for k in 0..100i64 {
        assert!(store.append("S", &p(k * 2000 + 3000, 1.0)));
        assert!(store.append("S", &p(k * 2000 + 500, 2.0)), "late by 2.5 s");
        store.flush_all().unwrap();
        store.flush_all().unwrap();
    }
    assert_eq!((store.late_points(), store.late_chunks()), (100, 1));
    assert_eq!(store.points("S", 0, i64::MAX).unwrap().len(), 200);
}

/// An edge box without a battery clock: it runs an hour ahead, NTP steps it back, and
/// later a jump forward by a day. History goes on at once after the step back, chunks
/// stay in order inside, and range queries merge the overlap in time order.
#[test]
fn a_clock_that_steps_back_and_forward_never_corrupts_a_chunk_or_a_query() {
    let store = HistoryStore::in_memory().unwrap();
    let hour = 3_600_000;
    let ahead: Vec<i64> = (0..100).map(|i| 10 * hour + i * 1000).collect();
    for &t in &ahead {
        assert!(store.append("S", &p(t, 1.0)));
    }
    store.flush_all().unwrap();
    // Stepped back by an hour: stored at once, in a chunk of late points, all but the
    // point at the instant of the newest (a repeat).
    let mut t = 9 * hour;
    let mut refused = Vec::new();
    while t <= ahead[99] + 5000 {
        if !store.append("S", &p(t, 2.0)) {
            refused.push(t);
        }
        t += 1000;
    }
    assert_eq!(refused, vec![ahead[99]]);
    // 3,699 late points, at most 1,024 to a chunk.
    assert_eq!((store.late_points(), store.late_chunks()), (3699, 4));
    // A device's sample 30.5 s out of order: late, stored, in a chunk of its own.
    assert!(store.append("S", &p(t - 30_500, 9.0)));
    assert_eq!(store.late_chunks(), 5);
    // A jump forward by a day starts a new chunk; the silence is a gap, not data.
    assert!(store.append("S", &p(t + 24 * hour, 3.0)));
    store.flush_all().unwrap();
    let all = store.points("S", 0, i64::MAX).unwrap();
    assert!(all.windows(2).all(|w| w[0].t < w[1].t), "merged in time order, one point per instant");
    // Every second from 9 h to the last point + 5 s (the hour ahead's instants among
    // them), the sample out of order, and the point after the jump.
    assert_eq!(all.len(), 3600 + 100 + 5 + 1 + 1);
    assert!(
        store.points("S", ahead[99] + 6000, t + 24 * hour).unwrap().is_empty(),
        "no invented data in the jump"
    );
    assert_eq!(store.points("S", 9 * hour, 10 * hour).unwrap().len(), 3600);
    let overlap = store.points("S", ahead[10], ahead[20]).unwrap();
    assert_eq!(overlap.iter().map(|q| q.t).collect::<Vec<_>>(), ahead[10..20].to_vec());
}

/// A restart forgets each sensor's last point: points written then may overlap chunks
/// on disk, and queries still see each instant once, in order.
#[test]
fn overlapping_chunks_across_a_restart_read_in_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.redb");
    {
        let store = HistoryStore::open(&path).unwrap();
        for i in 0..50 {
            assert!(store.append("S", &p(100_000 + i * 1000, 1.0)));
        }
        store.flush_all().unwrap();
    }
    let store = HistoryStore::open(&path).unwrap();
    for i in 0..50 {
        assert!(store.append("S", &p(90_000 + i * 1000 + 500, 2.0)));
    }
    store.flush_all().unwrap();
    let all = store.points("S", 0, i64::MAX).unwrap();
    assert_eq!(all.len(), 100);
    assert!(all.windows(2).all(|w| w[0].t < w[1].t), "{:?}", &all[..5]);
    let page = store.points("S", 100_000, 101_600).unwrap();
    assert_eq!(page.iter().map(|q| q.t).collect::<Vec<_>>(), vec![100_000, 100_500, 101_000, 101_500]);
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
        store.flush_all().unwrap();
        store.append("A_LINE1_001", &p(5_000_000, -1.0)); // never flushed: may be lost
    }
    let store = HistoryStore::open(&path).unwrap();
    let pts = store.points("A_LINE1_001", 0, i64::MAX).unwrap();
    assert_eq!(pts.len(), 3000);
    assert_eq!(pts[2999], p(2_999_000, 2999.0));
    // Appending continues in a new chunk.
    store.append("A_LINE1_001", &p(6_000_000, 7.0));
    store.flush_all().unwrap();
    assert_eq!(store.points("A_LINE1_001", 0, i64::MAX).unwrap().len(), 3001);
}

#[test]
fn retention_drops_the_oldest_chunks_first() {
    let store = HistoryStore::in_memory().unwrap();
    // Values that change every 100 points: chunks end at MAX_POINTS, not at their byte bound.
    for i in 0..(MAX_POINTS as i64 * 5) {
        store.append("S", &p(i * 1000, (i / 100 % 7) as f64));
    }
    store.flush_all().unwrap();
    let (bytes, chunks) = store.size().unwrap();
    assert_eq!(chunks, 5);
    // By age: the first two chunks end before 2 * 1024 s.
    let pruned = store.prune(2 * MAX_POINTS as i64 * 1000, u64::MAX).unwrap();
    assert_eq!(pruned.chunks, 2);
    let left = store.points("S", 0, i64::MAX).unwrap();
    assert_eq!(left.first().unwrap().t, 2 * MAX_POINTS as i64 * 1000);
    let (after_age, _) = store.size().unwrap();
    assert_eq!(pruned.bytes, bytes - after_age, "the bytes it reports are the bytes it freed");
    // By size: keep under a third of the original. Three chunks of about a fifth each
    // are left, so the two oldest go and exactly the newest (the open one) stays.
    let max_bytes = bytes / 3;
    let pruned = store.prune(i64::MIN, max_bytes).unwrap();
    let (remaining, chunks) = store.size().unwrap();
    assert!(remaining <= max_bytes, "{remaining} bytes left, more than {max_bytes}");
    assert_eq!((pruned.chunks, chunks), (2, 1));
    assert_eq!(pruned.bytes, after_age - remaining);
    let left = store.points("S", 0, i64::MAX).unwrap();
    assert_eq!(left.first().unwrap().t, 4 * MAX_POINTS as i64 * 1000, "the oldest went first");
    assert_eq!(left.last().unwrap().t, (MAX_POINTS as i64 * 5 - 1) * 1000);
    assert_eq!(left.len(), MAX_POINTS as usize);
    // Not more than needed: a limit the remaining chunk fits drops nothing.
    assert_eq!(store.prune(i64::MIN, remaining).unwrap().chunks, 0);
}

/// The open chunk is never dropped, even when it alone is over the size limit; every
/// sealed chunk is, oldest first, whichever sensor it belongs to.
#[test]
fn size_pruning_keeps_only_open_chunks_when_the_limit_is_below_them() {
    let store = HistoryStore::in_memory().unwrap();
    // Values that compress well: chunks end at MAX_POINTS, not at their byte bound.
    for i in 0..(MAX_POINTS as i64 * 3) {
        store.append("A", &p(i * 1000, (i / 100) as f64));
    }
    for i in 0..(MAX_POINTS as i64 + 10) {
        store.append("B", &p(i * 1000 + 500, -((i / 100) as f64)));
    }
    store.flush_all().unwrap();
    assert_eq!(store.size().unwrap().1, 5);
    let pruned = store.prune(i64::MIN, 0).unwrap();
    assert_eq!(pruned.chunks, 3, "the sealed chunks: two of A, one of B");
    let a = store.points("A", 0, i64::MAX).unwrap();
    assert_eq!(a.first().unwrap().t, 2 * MAX_POINTS as i64 * 1000);
    let b = store.points("B", 0, i64::MAX).unwrap();
    assert_eq!(b.len(), 10);
    assert_eq!(store.size().unwrap().1, 2);
}

/// A realistic base time: arithmetic on `first` shows (a chunk starting at 0 hides it).
const T0: i64 = 1_750_000_000_000;
const HOUR: i64 = 3_600_000;

#[test]
fn a_chunk_spans_six_hours_at_most_counted_from_its_first_point() {
    let store = HistoryStore::in_memory().unwrap();
    // 0 h and exactly 6 h: one chunk.
    assert!(store.append("S", &p(T0, 1.0)) && store.append("S", &p(T0 + 6 * HOUR, 1.0)));
    assert_eq!(store.flush_all().unwrap(), 1);
    // One millisecond past six hours from the first: a new chunk, plus the open one.
    for h in [1, 2, 3, 4, 5] {
        assert!(store.append("T", &p(T0 + h * HOUR, 1.0)));
    }
    assert!(store.append("T", &p(T0 + 7 * HOUR, 1.0)));
    assert!(store.append("T", &p(T0 + 7 * HOUR + 1, 1.0)));
    assert_eq!(store.flush_all().unwrap(), 2, "[1 h .. 5 h] sealed, [7 h ..] open");
    // Nothing changed since: nothing is written again.
    assert_eq!(store.flush_all().unwrap(), 0);
    assert_eq!(store.points("T", 0, i64::MAX).unwrap().len(), 7);
}

/// The bytes of one sealed chunk of `MAX_POINTS` constant points.
fn chunk_bytes() -> usize {
    let mut w = ChunkWriter::new(Kind::of(&Stored::Float(0.0)));
    (0..MAX_POINTS as i64).for_each(|i| w.push(&p(T0 + i, 1.0)));
    w.bytes().len()
}

/// Seals `n` chunks of `sensor` (its points from `from` on, 1 ms apart); returns the next t.
fn seal(store: &HistoryStore, sensor: &str, from: i64, n: usize) -> i64 {
    let mut t = from;
    for _ in 0..n * MAX_POINTS as usize {
        assert!(store.append(sensor, &p(t, 1.0)));
        t += 1;
    }
    t
}

#[test]
fn chunks_waiting_for_a_flush_are_bounded_in_bytes_oldest_dropped_first() {
    let b = chunk_bytes();
    let limits = Limits { reserve_bytes: 0, reserve_percent: 0, max_unflushed_bytes: 2 * b };
    let store = HistoryStore::in_memory().unwrap().with_limits(limits);
    // A chunk is sealed by the point after its last: 2 × 1024 points seal one, the second
    // stays open.
    let t = seal(&store, "S", T0, 2);
    assert_eq!(store.dropped_points(), 0);
    // Written: the two waiting chunks leave memory, and their bytes with them.
    store.flush_all().unwrap();
    let t = seal(&store, "S", t, 2);
    assert_eq!(store.dropped_points(), 0, "two more fit again after the flush");
    let t = seal(&store, "S", t, 3);
    // Five sealed since the flush, two bytes-worth kept: the three oldest went.
    assert_eq!(store.dropped_points(), 3 * u64::from(MAX_POINTS));
    let kept = store.points("S", 0, i64::MAX).unwrap();
    assert_eq!(kept.last().map(|q| q.t), Some(t - 1));
}

#[test]
fn late_chunks_far_back_are_counted_each() {
    let store = HistoryStore::in_memory().unwrap();
    assert!(store.append("S", &p(T0, 1.0)));
    assert!(store.append("S", &p(T0 - CLOCK_STEP_MS, 1.0)));
    assert!(store.append("S", &p(T0 - 3 * CLOCK_STEP_MS, 1.0)));
    assert_eq!(store.late_chunks(), 2);
}

#[test]
fn a_range_starting_at_a_flushed_chunks_last_point_includes_it() {
    let store = HistoryStore::in_memory().unwrap();
    let t = seal(&store, "S", T0, 1);
    assert!(store.append("S", &p(t + 10, 2.0)));
    store.flush_all().unwrap();
    let last_sealed = t - 1;
    let got = store.points("S", last_sealed, last_sealed + 1).unwrap();
    assert_eq!(got.iter().map(|q| q.t).collect::<Vec<_>>(), [last_sealed]);
}

#[test]
fn the_disk_reserve_holds_history_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    // The whole filesystem as the reserve: never reached by a real disk's free space.
    let all = Limits { reserve_bytes: u64::MAX, reserve_percent: 100, max_unflushed_bytes: 1 << 20 };
    let store = HistoryStore::open_in(dir.path()).unwrap().with_limits(all);
    assert!(store.append("S", &p(T0, 1.0)));
    assert!(matches!(store.flush_all(), Err(StoreError::Reserve { .. })));
    assert!(store.problem().is_some());
    assert_eq!(store.points("S", 0, i64::MAX).unwrap().len(), 1, "kept in memory");
    // No reserve: written.
    let none = Limits { reserve_bytes: 0, reserve_percent: 0, max_unflushed_bytes: 1 << 20 };
    let store = store.with_limits(none);
    assert_eq!(store.flush_all().unwrap(), 1);
    let (free, total) = store.disk_space().expect("a file on a filesystem");
    assert!(free > 0 && free <= total);
}

#[test]
fn limits_come_from_the_storage_configuration_in_mebibytes() {
    let c = crate::config::StorageConfig {
        reserve_mb: 3,
        reserve_percent: 7,
        unflushed_max_mb: 5,
        ..crate::config::Config::default().storage
    };
    let l = Limits::of(&c);
    assert_eq!((l.reserve_bytes, l.reserve_percent, l.max_unflushed_bytes), (3 << 20, 7, 5 << 20));
}

#[test]
fn storage_failures_are_told_from_corrupt_chunks() {
    assert!(StoreError::Db("disk full".into()).is_storage());
    assert!(!StoreError::Corrupt.is_storage());
    assert!(!StoreError::Reserve { free: 1 }.is_storage());
}

#[test]
fn the_store_answers_reads_when_open() {
    assert!(HistoryStore::in_memory().unwrap().is_open());
}

#[test]
fn retention_keeps_a_chunk_with_a_point_at_the_cutoff_and_a_store_at_its_size_limit() {
    let store = HistoryStore::in_memory().unwrap();
    let t = seal(&store, "S", T0, 2);
    store.flush_all().unwrap();
    let (bytes, chunks) = store.size().unwrap();
    assert_eq!(chunks, 2, "one sealed, one open");
    // Exactly at the size limit: nothing goes.
    assert_eq!(store.prune(i64::MIN, bytes).unwrap().chunks, 0);
    // The sealed chunk's last point is at the cutoff: it is still within retention.
    let last_sealed = T0 + i64::from(MAX_POINTS) - 1;
    assert_eq!(store.prune(last_sealed, u64::MAX).unwrap().chunks, 0);
    assert_eq!(store.prune(last_sealed + 1, u64::MAX).unwrap().chunks, 1);
    assert_eq!(store.points("S", 0, i64::MAX).unwrap().first().map(|q| q.t), Some(last_sealed + 1));
    assert!(t > last_sealed);
}

/// A damaged file: a chunk whose value is too short to hold even its last time (cut by a
/// broken disk or a foreign writer) is reported as corrupt, never read past its end.
#[test]
fn a_chunk_too_short_to_hold_its_last_time_is_corrupt() {
    for len in [0usize, 3, 7] {
        let store = HistoryStore::in_memory().unwrap();
        store
            .db
            .write(|d| {
                let tx = d.begin_write().map_err(db)?;
                tx.open_table(CHUNKS)
                    .map_err(db)?
                    .insert(("S", 1000i64), vec![0u8; len].as_slice())
                    .map_err(db)?;
                tx.commit().map_err(db)
            })
            .unwrap();
        assert!(matches!(store.points("S", 0, 10_000), Err(StoreError::Corrupt)), "{len} bytes");
    }
}

#[test]
fn a_chunk_of_values_that_compress_badly_is_sealed_at_its_byte_bound() {
    let store = HistoryStore::in_memory().unwrap();
    for k in 0..1000 {
        store.append("N", &p(T0 + k * 1000, (k as f64 * 1.37).sin() * 1e6));
    }
    assert!(store.lock().open["N"].writer.byte_len() < MAX_CHUNK_BYTES + 32);
    store.flush_all().unwrap();
    let (bytes, chunks) = store.size().unwrap();
    assert!(
        chunks >= 4 && bytes as usize <= chunks * (MAX_CHUNK_BYTES + 64),
        "{chunks} chunks, {bytes} bytes"
    );
    assert_eq!(store.points("N", 0, i64::MAX).unwrap().len(), 1000);
}

/// With more sensors than the open chunks' memory holds at full size, each chunk is sealed
/// at its share of it (a hub of 100,000 sensors stays within its memory).
#[test]
fn with_many_sensors_open_chunks_are_sealed_at_their_share_of_memory() {
    assert_eq!(chunk_bound(1), MAX_CHUNK_BYTES);
    assert_eq!(chunk_bound(100_000), OPEN_BUDGET_BYTES / 100_000);
    assert_eq!(chunk_bound(10_000_000), MIN_CHUNK_BYTES);
    let store = HistoryStore::in_memory().unwrap();
    let sensors = 2 * OPEN_BUDGET_BYTES / MAX_CHUNK_BYTES;
    let names: Vec<String> = (0..sensors).map(|k| format!("S{k}")).collect();
    assert_eq!(store.append_all(names.iter().map(|n| (n.as_str(), p(T0, 1.0)))), sensors);
    assert_eq!(store.append_all(names.iter().take(3).map(|n| (n.as_str(), p(T0, 1.0)))), 0, "stored already");
    for k in 1..400 {
        store.append("S0", &p(T0 + k * 1000, (k as f64 * 1.37).sin() * 1e6));
    }
    let share = OPEN_BUDGET_BYTES / sensors;
    let pending = store.lock();
    assert!(pending.open["S0"].writer.byte_len() < share + 32);
    assert!(!pending.sealed.is_empty(), "S0's chunks sealed at its share");
    assert!(pending.sealed.iter().all(|c| c.bytes.len() < share + 32));
}

#[path = "history_journal_tests.rs"]
mod journal_tests;
