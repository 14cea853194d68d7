//! Retention of the history store: the oldest chunks go first, by age and by size; an
//! open chunk stays (its sensor is still writing it). And the limits of what history may
//! use.

use std::collections::HashSet;

use redb::{ReadableDatabase, ReadableTable};

use super::{CHUNKS, HistoryStore, StoreError, db};

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

impl HistoryStore {
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
        let open: HashSet<(String, i64)> = {
            let p = self.lock();
            p.open.iter().chain(&p.late).map(|(s, o)| (s.clone(), o.writer.first_t())).collect()
        };
        let mut remaining = total;
        let mut doomed = Vec::new();
        // With a database: chunks from before the file kept history there are in no
        // database until migrated; they stay.
        let own_before = self.own_before().filter(|_| !self.migrated()).unwrap_or(i64::MIN);
        for c in &all {
            let is_open = open.contains(&(c.0.clone(), c.1));
            if !is_open && c.1 >= own_before && (c.2 < older_than || remaining > max_bytes) {
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
