//! The history store's journal: the points appended since the flush before, one record
//! per flush, so that a flush writes what arrived rather than every open chunk again (a
//! hub holds an open chunk for each of 100,000 sensors).
//!
//! Open chunks are written in turns: each flush writes the changed open chunks of its
//! turn (one in [`TURNS`]), every sealed chunk, and the record of what was appended. Once
//! every turn has come round after a record, each of its points is in a chunk on disk and
//! the record is deleted. A flush after one that failed (and the first after a replay)
//! writes every changed open chunk and deletes every record.
//!
//! At open, records left by a crash are replayed: each entry names the chunk its point
//! went to and its place there, and a chunk grows only at its end, so the points a stored
//! chunk does not hold yet (a place at or after its stored count) are appended again, and
//! nothing is stored twice.
//!
//! Table `journal`: key the flush's number; value the entries, each: sensor (u32 LE length,
//! UTF-8), the chunk's first time (i64 LE), the point's place in it (u32 LE), the point's
//! time (i64 LE), quality (u8), value (a tag u8: 0 float, 1 int, 2 unsigned, 3 boolean,
//! 4 text; then 8 bytes LE, 1 byte, or a u32 LE length and UTF-8).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::{CHUNKS, HistoryStore, Lane, Pending, StoreError, db};
use crate::store::gorilla::{Corrupt, Point, Stored, count_of};

pub(super) const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("journal");

/// Open chunks are written once every this many flushes (each in its turn); a record is
/// kept until all of them have come round.
pub(super) const TURNS: u64 = 60;

/// A record larger than this is given up for a flush that writes every changed open chunk
/// (a burst, such as hours of an edge's buffered values replayed at once, costs less as
/// chunks than as journal entries of 40 bytes a point).
pub(super) const MAX_RECORD: usize = 16 << 20;

/// A point as the journal holds it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    pub sensor: String,
    /// The first time of the chunk the point went to (its key).
    pub chunk: i64,
    /// Its place in that chunk (0 for the first point).
    pub place: u32,
    pub point: Point,
}

/// Appends an entry to a record being built.
pub(super) fn put(buf: &mut Vec<u8>, sensor: &str, chunk: i64, place: u32, p: &Point) {
    let text = |buf: &mut Vec<u8>, s: &str| {
        buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
        buf.extend_from_slice(s.as_bytes());
    };
    text(buf, sensor);
    buf.extend_from_slice(&chunk.to_le_bytes());
    buf.extend_from_slice(&place.to_le_bytes());
    buf.extend_from_slice(&p.t.to_le_bytes());
    buf.push(p.quality);
    match &p.value {
        Stored::Float(v) => {
            buf.push(0);
            buf.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        Stored::Int(v) => {
            buf.push(1);
            buf.extend_from_slice(&v.to_le_bytes());
        }
        Stored::UInt(v) => {
            buf.push(2);
            buf.extend_from_slice(&v.to_le_bytes());
        }
        Stored::Bool(b) => {
            buf.push(3);
            buf.push(u8::from(*b));
        }
        Stored::Text(s) => {
            buf.push(4);
            text(buf, s);
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        if self.bytes.len() < n {
            return Err(Corrupt);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Corrupt> {
        self.take(N)?.try_into().map_err(|_| Corrupt)
    }
    fn text(&mut self) -> Result<String, Corrupt> {
        let n = u32::from_le_bytes(self.array()?) as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| Corrupt)
    }
}

/// Every entry of a record, in the order they were appended.
pub(super) fn entries(bytes: &[u8]) -> Result<Vec<Entry>, Corrupt> {
    let mut r = Reader { bytes };
    let mut out = Vec::new();
    while !r.bytes.is_empty() {
        let sensor = r.text()?;
        let chunk = i64::from_le_bytes(r.array()?);
        let place = u32::from_le_bytes(r.array()?);
        let t = i64::from_le_bytes(r.array()?);
        let [quality] = r.array()?;
        let [tag] = r.array()?;
        let value = match tag {
            0 => Stored::Float(f64::from_bits(u64::from_le_bytes(r.array()?))),
            1 => Stored::Int(i64::from_le_bytes(r.array()?)),
            2 => Stored::UInt(u64::from_le_bytes(r.array()?)),
            3 => match r.array()? {
                [0] => Stored::Bool(false),
                [1] => Stored::Bool(true),
                _ => return Err(Corrupt),
            },
            4 => Stored::Text(r.text()?),
            _ => return Err(Corrupt),
        };
        out.push(Entry { sensor, chunk, place, point: Point { t, value, quality } });
    }
    Ok(out)
}

impl Pending {
    /// Records in the journal that `p` went to the sensor's chunk in `lane`.
    pub(super) fn journal(&mut self, lane: Lane, sensor: &str, p: &Point) {
        let chunks = match lane {
            Lane::Newest => &self.open,
            Lane::Late => &self.late,
        };
        if let Some((chunk, place)) = chunks.get(sensor).map(|o| (o.writer.first_t(), o.writer.len() - 1)) {
            self.note(sensor, chunk, place, p);
        }
    }

    /// Records in the journal that `p` went to `place` in the sensor's chunk that starts at
    /// `chunk` (nothing while a full flush is due).
    pub(super) fn note(&mut self, sensor: &str, chunk: i64, place: u32, p: &Point) {
        if self.full_due {
            return;
        }
        put(&mut self.journal, sensor, chunk, place, p);
        if self.journal.len() > MAX_RECORD {
            self.give_up_journal();
        }
    }

    /// A flush could not write: the next one writes every changed open chunk, so what was
    /// journaled since is not needed.
    pub(super) fn give_up_journal(&mut self) {
        self.full_due = true;
        self.journal = Vec::new();
    }
}

impl HistoryStore {
    /// Points the journal gave back at open.
    pub fn replayed_points(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Appends again the journal's points that no stored chunk holds (a crash came before
    /// their chunk was written); the next flush writes them and every changed open chunk,
    /// and deletes the records.
    pub(super) fn replay(&self) -> Result<(), StoreError> {
        let records: Vec<u64> = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let j = tx.open_table(JOURNAL).map_err(db)?;
            j.iter().map_err(db)?.map(|r| r.map(|(k, _)| k.value()).map_err(db)).collect()
        })?;
        let Some(&last) = records.last() else { return Ok(()) };
        self.lock().give_up_journal();
        // How many points each stored chunk named by the journal holds.
        let mut stored: HashMap<String, HashMap<i64, u32>> = HashMap::new();
        let mut damaged = 0;
        for r in &records {
            let bytes = self.db.read(|d| {
                let tx = d.begin_read().map_err(db)?;
                let j = tx.open_table(JOURNAL).map_err(db)?;
                Ok::<_, StoreError>(j.get(*r).map_err(db)?.map(|v| v.value().to_vec()).unwrap_or_default())
            })?;
            let Ok(entries) = entries(&bytes) else {
                damaged += 1;
                continue;
            };
            for e in entries {
                let held = match stored.get(&e.sensor).and_then(|c| c.get(&e.chunk)) {
                    Some(&n) => n,
                    None => {
                        let n = self.stored_count(&e.sensor, e.chunk)?;
                        stored.entry(e.sensor.clone()).or_default().insert(e.chunk, n);
                        n
                    }
                };
                if e.place >= held && self.append(&e.sensor, &e.point) {
                    self.replayed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut flushes = self.flushing.lock();
        flushes.next = last + 1;
        flushes.on_disk = records.into();
        let points = self.replayed_points();
        if damaged > 0 {
            tracing::error!(
                records = damaged,
                "history: journal records that do not decode were skipped; their points are lost"
            );
        }
        if points > 0 {
            tracing::info!(
                points,
                "history: points appended before the last stop and in no stored chunk are back from the journal"
            );
        }
        Ok(())
    }

    /// How many points the stored chunk of `sensor` that starts at `first` holds (0: none).
    fn stored_count(&self, sensor: &str, first: i64) -> Result<u32, StoreError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            let Some(v) = t.get((sensor, first)).map_err(db)? else { return Ok(0) };
            // A damaged chunk holds nothing the journal could add to safely.
            Ok(v.value().get(8..).and_then(|b| count_of(b).ok()).unwrap_or(u32::MAX))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_as_written_and_a_damaged_record_is_refused() {
        let points = [
            Point { t: -5, value: Stored::Float(f64::NAN), quality: 2 },
            Point { t: 1_700_000_000_000, value: Stored::Int(i64::MIN), quality: 0 },
            Point { t: 7, value: Stored::UInt(u64::MAX), quality: 1 },
            Point { t: 8, value: Stored::Bool(true), quality: 0 },
            Point { t: 9, value: Stored::Text("päß\n".into()), quality: 0 },
        ];
        let mut buf = Vec::new();
        for (i, p) in points.iter().enumerate() {
            put(&mut buf, &format!("A_LINE1_00{i}"), 100 + i as i64, i as u32 * 3, p);
        }
        let back = entries(&buf).unwrap();
        assert_eq!(back.len(), points.len());
        for (i, (e, p)) in back.iter().zip(&points).enumerate() {
            assert_eq!(e.sensor, format!("A_LINE1_00{i}"));
            assert_eq!((e.chunk, e.place), (100 + i as i64, i as u32 * 3));
            assert_eq!((e.point.t, e.point.quality), (p.t, p.quality));
            match (&e.point.value, &p.value) {
                (Stored::Float(a), Stored::Float(b)) => assert_eq!(a.to_bits(), b.to_bits()),
                (a, b) => assert_eq!(a, b),
            }
        }
        assert_eq!(entries(&[]).unwrap(), Vec::new());
        // Cut anywhere inside an entry, or a tag that is no value: refused, never a panic.
        for cut in 1..buf.len() {
            let r = entries(&buf[..cut]);
            assert!(r.is_err() || r.is_ok_and(|e| e.len() < points.len()), "cut at {cut}");
        }
        let mut bad = Vec::new();
        put(&mut bad, "A_LINE1_001", 0, 0, &points[3]);
        let tag = bad.len() - 2;
        bad[tag] = 9;
        assert_eq!(entries(&bad), Err(Corrupt));
        let last = bad.len() - 1;
        bad[tag] = 3;
        bad[last] = 2;
        assert_eq!(entries(&bad), Err(Corrupt));
    }
}
