//! A property test of the history store as a whole: four sensors of four value kinds,
//! flushes (each writing its turn's open chunks and a journal record), reopens of the
//! file, crashes and retention by age, against a list per sensor.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::store::gorilla::Stored;

/// One in-memory file shared by successive databases (a reopen finds what was written).
#[derive(Debug)]
struct Shared(Arc<redb::backends::InMemoryBackend>);

impl redb::StorageBackend for Shared {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, data)
    }
}

/// What the property test does next.
#[derive(Debug, Clone)]
enum Op {
    /// A point of sensor `s % 4`, `gap` ms after that sensor's last, with quality `q`.
    Append {
        s: usize,
        gap: i64,
        q: u8,
        x: i64,
    },
    Flush,
    /// Flush everything, close and open the file again.
    Reopen,
    /// Close without a last flush (what was appended since the last flush is lost) and
    /// open again: the journal gives back what was flushed and is in no stored chunk.
    Crash,
    /// Retention by age at this share (0-100 %) of the time covered so far.
    Prune(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        80 => (0usize..4, 1i64..400_000, 0u8..3, any::<i64>()).prop_map(|(s, gap, q, x)| Op::Append { s, gap, q, x }),
        2 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        1 => (0u8..=100).prop_map(Op::Prune),
    ]
}

/// Sensor `s`'s value kind: floats, integers, booleans, texts.
fn value(s: usize, x: i64) -> Stored {
    match s {
        0 => Stored::Float((x % 100_000) as f64 / 7.0),
        1 => Stored::Int(x >> 20),
        2 => Stored::Bool(x % 2 == 0),
        _ => Stored::Text(format!("state {}", x.rem_euclid(5))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Four sensors of four value kinds, flushes, reopens of the file and retention by
    /// age, against a list per sensor: every point appended is read back exactly until
    /// pruned, and retention drops only whole oldest runs of points older than its cut.
    #[test]
    fn sensors_kinds_reopens_and_retention_agree_with_a_naive_reference(
        ops in prop::collection::vec(op(), 1..1200),
    ) {
        // A file in memory that outlives each open (no fsync: cheap enough for many cases).
        let memory = Arc::new(redb::backends::InMemoryBackend::new());
        let open = || {
            let m = memory.clone();
            let opener: crate::store::db::Opener = Box::new(move || {
                redb::Database::builder().create_with_backend(Shared(m.clone())).map_err(|e| e.to_string())
            });
            HistoryStore::with_db(Db::open("history", Path::new("memory.redb"), opener).unwrap()).unwrap()
        };
        let mut store = open();
        let names = ["S0", "S1", "S2", "S3"];
        let mut want: Vec<Vec<Point>> = vec![Vec::new(); 4];
        let mut last = [0i64; 4];
        // Points of each sensor made durable by the last flush.
        let mut flushed = [0usize; 4];
        for op in ops {
            match op {
                Op::Append { s, gap, q, x } => {
                    last[s] += gap;
                    let point = Point { t: last[s], value: value(s, x), quality: q };
                    prop_assert!(store.append(names[s], &point));
                    want[s].push(point);
                }
                Op::Flush => {
                    store.flush().unwrap();
                    flushed = std::array::from_fn(|s| want[s].len());
                }
                Op::Reopen => {
                    store.flush_all().unwrap();
                    drop(store);
                    store = open();
                    flushed = std::array::from_fn(|s| want[s].len());
                }
                Op::Crash => {
                    drop(store);
                    store = open();
                    for (w, n) in want.iter_mut().zip(flushed) {
                        w.truncate(n);
                    }
                }
                Op::Prune(share) => {
                    store.flush_all().unwrap();
                    let cut = last.iter().max().unwrap() * i64::from(share) / 100;
                    store.prune(cut, u64::MAX).unwrap();
                    for (s, name) in names.iter().enumerate() {
                        let got = store.points(name, i64::MIN, i64::MAX).unwrap();
                        let dropped = want[s].len() - got.len();
                        // What is left is the reference without its oldest `dropped`.
                        prop_assert_eq!(&got[..], &want[s][dropped..], "{} after prune at {}", name, cut);
                        prop_assert!(want[s][..dropped].iter().all(|p| p.t < cut), "{} lost a point at or after {}", name, cut);
                        want[s].drain(..dropped);
                    }
                    flushed = std::array::from_fn(|s| want[s].len());
                }
            }
        }
        for (s, name) in names.iter().enumerate() {
            prop_assert_eq!(&store.points(name, i64::MIN, i64::MAX).unwrap(), &want[s], "{}", name);
        }
    }
}
