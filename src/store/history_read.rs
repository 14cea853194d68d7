//! Reading the history store: a sensor's points in a range, from the chunks on disk and
//! what memory holds newer (open, late and sealed chunks not yet written).

use redb::ReadableDatabase;

use super::{CHUNKS, HistoryStore, MAX_SPAN_MS, StoreError, db};
use crate::store::gorilla::{Point, decode};

impl HistoryStore {
    /// Every point of `sensor` with `from <= t < to`, in time order.
    pub fn points(&self, sensor: &str, from: i64, to: i64) -> Result<Vec<Point>, StoreError> {
        // What memory holds is newer than its snapshot on disk.
        let (mem_open, mem_sealed) = {
            let p = self.lock();
            let open: Vec<(i64, i64, Vec<u8>)> = [p.open.get(sensor), p.late.get(sensor)]
                .into_iter()
                .flatten()
                .map(|o| (o.writer.first_t(), o.id, o.writer.bytes()))
                .collect();
            let sealed: Vec<(i64, i64, Vec<u8>)> = p
                .sealed
                .iter()
                .filter(|c| c.sensor == sensor)
                .map(|c| (c.first, c.id, c.bytes.clone()))
                .collect();
            (open, sealed)
        };
        let in_memory: Vec<(i64, i64)> =
            mem_open.iter().chain(&mem_sealed).map(|(f, id, _)| (*f, *id)).collect();
        let mut chunks: Vec<(i64, Vec<u8>)> = match &self.remote {
            // The database, and what waits in the outbox to be written there.
            Some(_) => self.remote_chunks(sensor, from, to, &in_memory)?,
            None => self.db.read(|d| {
                let mut chunks = Vec::new();
                let tx = d.begin_read().map_err(db)?;
                let t = tx.open_table(CHUNKS).map_err(db)?;
                let start = from.saturating_sub(MAX_SPAN_MS);
                for item in t.range((sensor, start)..(sensor, to)).map_err(db)? {
                    let (k, v) = item.map_err(db)?;
                    let first = k.value().1;
                    if in_memory.iter().any(|(f, _)| *f == first) {
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
            })?,
        };
        let strip = |(f, _, b): (i64, i64, Vec<u8>)| (f, b);
        let (mem_open, mem_sealed): (Vec<_>, Vec<_>) =
            (mem_open.into_iter().map(strip).collect(), mem_sealed.into_iter().map(strip).collect());
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
        // Chunks of late points overlap others: merged in time order, one point per instant
        // (that of the chunk that starts first), so every query and every page sees the
        // same points.
        if overlapping {
            out.sort_by_key(|p| p.t);
            out.dedup_by_key(|p| p.t);
        }
        Ok(out)
    }
}
