//! `fieldgate history migrate --from redb --to postgres`: the chunks a data directory's
//! file kept before history went to a database, copied there in batches, resumable (the
//! last key copied is kept in the file), then checked (chunks and points per sensor, in
//! the file and in the database) before the file lets retention have them.

use std::collections::BTreeMap;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::remote::REMOTE_META;
use super::{CHUNKS, HistoryStore, StoreError, db};
use crate::store::gorilla::count_of;
use crate::store::pg::{Chunk, Pg};

/// Where a migration to a database stopped (by the database's ID): the last
/// `(sensor, first_t)` copied.
const RESUME: TableDefinition<&str, (&str, i64)> = TableDefinition::new("migrate_resume");
const BATCH: usize = 2_000;

/// What a migration copied and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migrated {
    /// The chunk ID this file's chunks have in the database (one per data directory: two
    /// files' chunks never replace each other, and each is checked alone).
    pub id: i64,
    pub chunks: u64,
    pub points: u64,
    pub sensors: usize,
    /// Resumed after this many chunks copied by an earlier run.
    pub resumed_after: u64,
}

fn remote(e: crate::store::pg::PgError) -> StoreError {
    StoreError::Remote(e.to_string())
}

impl HistoryStore {
    /// Whether every chunk the file kept before history went to a database was copied.
    pub(super) fn migrated(&self) -> bool {
        let unmigrated = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let Ok(meta) = tx.open_table(REMOTE_META) else { return Ok(None) };
            Ok::<_, StoreError>(meta.get("unmigrated").map_err(db)?.map(|v| v.value()))
        });
        !matches!(unmigrated, Ok(Some(1)) | Err(_))
    }

    /// Copies the file's own chunks (those from before it kept history in a database, or
    /// all of them) to `pg`; `progress(done, total)` after each batch. Ends with a check
    /// per sensor; on success retention may have them.
    pub fn migrate_to(&self, pg: &Pg, mut progress: impl FnMut(u64, u64)) -> Result<Migrated, StoreError> {
        let before = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let since = match tx.open_table(REMOTE_META) {
                Ok(meta) => meta.get("since").map_err(db)?.map(|v| v.value()),
                Err(_) => None,
            };
            Ok::<_, StoreError>(since.unwrap_or(i64::MAX))
        })?;
        // Per sensor: chunks and points of the file's own (the check's other side).
        let mut mine: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            for item in tx.open_table(CHUNKS).map_err(db)?.iter().map_err(db)? {
                let (k, v) = item.map_err(db)?;
                let (sensor, first) = k.value();
                if first < before {
                    let points =
                        v.value().get(8..).and_then(|c| count_of(c).ok()).ok_or(StoreError::Corrupt)?;
                    let e = mine.entry(sensor.to_string()).or_default();
                    e.0 += 1;
                    e.1 += i64::from(points);
                }
            }
            Ok::<_, StoreError>(())
        })?;
        let total: u64 = mine.values().map(|v| v.0 as u64).sum();
        let target = pg.identity().map_err(remote)?;
        let id = self.migration_id()?;
        let resume = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let Ok(t) = tx.open_table(RESUME) else { return Ok(None) };
            Ok::<_, StoreError>(t.get(target.as_str()).map_err(db)?.map(|v| {
                let (s, f) = v.value();
                (s.to_string(), f)
            }))
        })?;
        let mut out = Migrated { id, sensors: mine.len(), ..Migrated::default() };
        if let Some((s, f)) = &resume {
            out.resumed_after = mine.range(..s.clone()).map(|(_, v)| v.0 as u64).sum::<u64>()
                + self.chunks_of_before(s, f, before)?;
        }
        let mut after = resume;
        let mut done = out.resumed_after;
        progress(done, total);
        loop {
            let batch = self.own_batch(after.as_ref(), before, id)?;
            let Some(last) = batch.last().map(|c| (c.sensor.clone(), c.first)) else { break };
            out.chunks += batch.len() as u64;
            out.points += batch.iter().map(|c| u64::from(c.points)).sum::<u64>();
            done += batch.len() as u64;
            pg.ship(batch).map_err(remote)?;
            self.db.write(|d| {
                let tx = d.begin_write().map_err(db)?;
                tx.open_table(RESUME)
                    .map_err(db)?
                    .insert(target.as_str(), (last.0.as_str(), last.1))
                    .map_err(db)?;
                tx.commit().map_err(db)
            })?;
            after = Some(last);
            progress(done, total);
        }
        // The check: every sensor's chunks and points, as the database holds them.
        let theirs: BTreeMap<String, (i64, i64)> =
            pg.counts(id).map_err(remote)?.into_iter().map(|(s, c, p)| (s, (c, p))).collect();
        for (sensor, want) in &mine {
            let got = theirs.get(sensor).copied().unwrap_or_default();
            if got != *want {
                return Err(StoreError::Remote(format!(
                    "migration check failed: sensor {sensor} has {} chunks ({} points) here, {} ({}) in the database",
                    want.0, want.1, got.0, got.1
                )));
            }
        }
        // Migrated: what the file holds now is in the database (a start with the database
        // backend finds nothing left to migrate).
        let now = chrono::Utc::now().timestamp_millis();
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            {
                let mut meta = tx.open_table(REMOTE_META).map_err(db)?;
                if meta.get("since").map_err(db)?.is_none() {
                    meta.insert("since", now).map_err(db)?;
                }
                meta.insert("unmigrated", 0).map_err(db)?;
            }
            tx.open_table(RESUME).map_err(db)?.remove(target.as_str()).map_err(db)?;
            tx.commit().map_err(db)
        })?;
        Ok(out)
    }

    /// Chunks of `sensor` up to `first` (a resumed run's count of what was copied).
    fn chunks_of_before(&self, sensor: &str, first: &i64, before: i64) -> Result<u64, StoreError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            let mut n = 0;
            for item in t.range((sensor, i64::MIN)..=(sensor, *first)).map_err(db)? {
                let (k, _) = item.map_err(db)?;
                n += u64::from(k.value().1 < before);
            }
            Ok(n)
        })
    }

    /// This file's migration ID: made at its first migration, negative (chunks shipped as
    /// they are written have positive IDs).
    fn migration_id(&self) -> Result<i64, StoreError> {
        let mut fresh = [0u8; 8];
        getrandom::fill(&mut fresh).map_err(|_| StoreError::Db("no randomness for a migration ID".into()))?;
        let candidate = -((i64::from_le_bytes(fresh) & i64::MAX).max(1));
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            let id = {
                let mut meta = tx.open_table(REMOTE_META).map_err(db)?;
                let known = meta.get("migration_id").map_err(db)?.map(|v| v.value());
                match known {
                    Some(id) => id,
                    None => {
                        meta.insert("migration_id", candidate).map_err(db)?;
                        candidate
                    }
                }
            };
            tx.commit().map_err(db)?;
            Ok(id)
        })
    }

    /// The next chunks to copy: after `after`, beginning before `before`.
    fn own_batch(
        &self,
        after: Option<&(String, i64)>,
        before: i64,
        id: i64,
    ) -> Result<Vec<Chunk>, StoreError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let t = tx.open_table(CHUNKS).map_err(db)?;
            let iter = match after {
                Some((s, f)) => t.range((s.as_str(), *f)..).map_err(db)?,
                None => t.iter().map_err(db)?,
            };
            let mut out = Vec::new();
            for item in iter {
                let (k, v) = item.map_err(db)?;
                let (sensor, first) = k.value();
                if after.is_some_and(|(s, f)| s == sensor && *f == first) || first >= before {
                    continue;
                }
                let v = v.value();
                let last = v
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(i64::from_le_bytes)
                    .ok_or(StoreError::Corrupt)?;
                let bytes = v.get(8..).ok_or(StoreError::Corrupt)?;
                let points = count_of(bytes).map_err(|_| StoreError::Corrupt)?;
                out.push(Chunk {
                    sensor: sensor.to_string(),
                    first,
                    id,
                    last,
                    points,
                    bytes: bytes.to_vec(),
                });
                if out.len() >= BATCH {
                    break;
                }
            }
            Ok(out)
        })
    }
}
