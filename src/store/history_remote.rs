//! History kept in PostgreSQL (`history.backend = "postgres"`, see `pg/`). The store
//! works as with redb alone (open chunks in memory, each flush durable in the data
//! directory's file with its journal), and every chunk a flush writes also waits in the
//! file's **outbox** until the database has it: [`HistoryStore::ship`] writes what waits,
//! in batches, and takes out of the outbox only what did not change meanwhile. The
//! database down or refusing: chunks wait in the outbox (on disk, so `kill -9` loses no
//! more than without a database), and go when it is back. Reads take the database, the
//! outbox and memory together (a snapshot in memory or the outbox is newer than the
//! database's). The file's own chunks are kept a day only (to tell a repeated point and
//! to replay the journal), the database's as long as retention says.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::{HistoryStore, MAX_SPAN_MS, StoreError, db};
use crate::store::db::Problem;
use crate::store::pg::{Chunk, Dropped, Pg, PgError};

/// Chunks waiting for the database: key `(sensor_id, first_t_ms)`, value `chunk_id (8 LE)
/// ++ last_t_ms (8 LE) ++ points (4 LE) ++ chunk`.
pub(super) const OUTBOX: TableDefinition<(&str, i64), &[u8]> = TableDefinition::new("outbox");

/// What the file knows of the database: `since`, when it first kept history in one (ms; its
/// own chunks from before went nowhere else, and are kept until `fieldgate history
/// migrate` copied them); `unmigrated`, 1 while it holds such chunks not copied yet.
pub(super) const REMOTE_META: TableDefinition<&str, i64> = TableDefinition::new("remote_meta");

/// Chunks (and bytes) one shipment holds at most.
const SHIP_CHUNKS: usize = 2_000;
const SHIP_BYTES: usize = 8 << 20;
/// Shipments one call of [`HistoryStore::ship`] makes at most (the rest waits for the next).
const SHIPMENTS: usize = 16;
/// How long the file keeps its own chunks when the database keeps history.
pub const LOCAL_KEEP_MS: i64 = 86_400_000;

pub(super) fn outbox_value(id: i64, last: i64, points: u32, bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + bytes.len());
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&last.to_le_bytes());
    v.extend_from_slice(&points.to_le_bytes());
    v.extend_from_slice(bytes);
    v
}

/// `(id, last, points, chunk)` of an outbox value.
fn outbox_parts(v: &[u8]) -> Option<(i64, i64, u32, &[u8])> {
    let id = i64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let last = i64::from_le_bytes(v.get(8..16)?.try_into().ok()?);
    let points = u32::from_le_bytes(v.get(16..20)?.try_into().ok()?);
    Some((id, last, points, v.get(20..)?))
}

/// The database history is kept in, and how writing to it goes.
pub struct Remote {
    pg: Pg,
    /// When the file first kept history in a database (ms): its chunks from before are
    /// not the database's until migrated, and retention keeps them.
    since: i64,
    shipped: AtomicU64,
    failures: AtomicU64,
    waiting: AtomicU64,
    problem: Mutex<Option<Problem>>,
}

/// What `/metrics` and `get_device_status` show of the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Chunks written to the database since start.
    pub shipped: u64,
    /// Shipments that failed since start.
    pub failures: u64,
    /// Chunks waiting in the outbox.
    pub waiting: u64,
}

impl Remote {
    pub(super) fn problem(&self) -> Option<Problem> {
        self.problem.lock().clone()
    }

    fn set_problem(&self, why: Option<&PgError>) {
        let mut p = self.problem.lock();
        match why {
            None => {
                if p.take().is_some() {
                    tracing::info!("history: the database takes history again");
                }
            }
            Some(e) => {
                let reason = format!("{e}; history waits in the data directory");
                if p.as_ref().is_none_or(|p| p.reason != reason) {
                    tracing::warn!(%reason, "history: the database does not take history");
                    *p = Some(Problem { since: chrono::Utc::now(), reason });
                }
            }
        }
    }
}

fn remote_err(e: PgError) -> StoreError {
    StoreError::Remote(e.to_string())
}

impl HistoryStore {
    /// This store keeping history in `pg` (`problem`: why it could not be reached at
    /// start, if it could not).
    pub fn with_remote(mut self, pg: Pg, problem: Option<PgError>) -> Result<HistoryStore, StoreError> {
        let now = chrono::Utc::now().timestamp_millis();
        let (since, unmigrated) = self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            tx.open_table(OUTBOX).map_err(db)?;
            let had_chunks = !tx.open_table(super::CHUNKS).map_err(db)?.is_empty().map_err(db)?;
            let out = {
                let mut meta = tx.open_table(REMOTE_META).map_err(db)?;
                let since = meta.get("since").map_err(db)?.map(|v| v.value());
                match since {
                    Some(since) => {
                        let unmigrated = meta.get("unmigrated").map_err(db)?.is_some_and(|v| v.value() == 1);
                        (since, unmigrated)
                    }
                    None => {
                        meta.insert("since", now).map_err(db)?;
                        meta.insert("unmigrated", i64::from(had_chunks)).map_err(db)?;
                        (now, had_chunks)
                    }
                }
            };
            tx.commit().map_err(db)?;
            Ok::<_, StoreError>(out)
        })?;
        if unmigrated {
            tracing::warn!(
                "history written to this data directory before it kept history in the database is not in the database: run `fieldgate history migrate --from redb --to postgres` (it is kept here until then)"
            );
        }
        let remote = Remote {
            pg,
            since,
            shipped: 0.into(),
            failures: 0.into(),
            waiting: 0.into(),
            problem: Mutex::new(None),
        };
        remote.set_problem(problem.as_ref());
        self.remote = Some(remote);
        self.count_waiting();
        Ok(self)
    }

    /// With a database: chunks of the file that begin before this are its own (written
    /// before it kept history in the database), kept until migrated.
    pub(super) fn own_before(&self) -> Option<i64> {
        self.remote.as_ref().map(|r| r.since)
    }

    /// Chunks waiting in the outbox for a database (also when this store keeps history in
    /// its file: a directory switched back from PostgreSQL).
    pub fn outbox_waiting(&self) -> u64 {
        self.db
            .read(|d| {
                let tx = d.begin_read().map_err(db)?;
                match tx.open_table(OUTBOX) {
                    Ok(t) => t.len().map_err(db),
                    Err(_) => Ok(0),
                }
            })
            .unwrap_or(0)
    }

    /// Whether history is kept in a database (not this store's file).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    pub fn remote_stats(&self) -> Option<RemoteStats> {
        let r = self.remote.as_ref()?;
        Some(RemoteStats {
            shipped: r.shipped.load(Ordering::Relaxed),
            failures: r.failures.load(Ordering::Relaxed),
            waiting: r.waiting.load(Ordering::Relaxed),
        })
    }

    fn count_waiting(&self) {
        let Some(r) = &self.remote else { return };
        let n = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            tx.open_table(OUTBOX).map_err(db)?.len().map_err(db)
        });
        if let Ok(n) = n {
            r.waiting.store(n, Ordering::Relaxed);
        }
    }

    /// Writes what waits in the outbox to the database, oldest keys first, in shipments
    /// of at most 2,000 chunks; a chunk leaves the outbox once the database has it and no
    /// flush changed it meanwhile. Returns the chunks written; on failure what was not
    /// written waits for the next call.
    pub fn ship(&self) -> Result<usize, StoreError> {
        let Some(remote) = &self.remote else { return Ok(0) };
        let mut total = 0;
        for _ in 0..SHIPMENTS {
            let batch = self.outbox_batch()?;
            if batch.is_empty() {
                break;
            }
            let n = batch.len();
            if let Err(e) = remote.pg.ship(batch.clone()) {
                remote.failures.fetch_add(1, Ordering::Relaxed);
                remote.set_problem(Some(&e));
                self.count_waiting();
                return Err(remote_err(e));
            }
            remote.set_problem(None);
            self.db.write(|d| {
                let tx = d.begin_write().map_err(db)?;
                {
                    let mut o = tx.open_table(OUTBOX).map_err(db)?;
                    let mut done = Vec::new();
                    for c in &batch {
                        let v = o.get((c.sensor.as_str(), c.first)).map_err(db)?;
                        let same = v.as_ref().and_then(|v| outbox_parts(v.value())).is_some_and(
                            |(id, last, points, _)| id == c.id && last == c.last && points == c.points,
                        );
                        if same {
                            done.push((c.sensor.as_str(), c.first));
                        }
                    }
                    for k in done {
                        o.remove(k).map_err(db)?;
                    }
                }
                tx.commit().map_err(db)
            })?;
            remote.shipped.fetch_add(n as u64, Ordering::Relaxed);
            total += n;
            if n < SHIP_CHUNKS {
                break;
            }
        }
        self.count_waiting();
        Ok(total)
    }

    /// The next shipment from the outbox.
    fn outbox_batch(&self) -> Result<Vec<Chunk>, StoreError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let o = tx.open_table(OUTBOX).map_err(db)?;
            let (mut out, mut bytes) = (Vec::new(), 0);
            for item in o.iter().map_err(db)? {
                let (k, v) = item.map_err(db)?;
                let (sensor, first) = k.value();
                let Some((id, last, points, chunk)) = outbox_parts(v.value()) else {
                    // Not ours to read: left where it is, counted as waiting.
                    continue;
                };
                bytes += chunk.len();
                out.push(Chunk {
                    sensor: sensor.to_string(),
                    first,
                    id,
                    last,
                    points,
                    bytes: chunk.to_vec(),
                });
                if out.len() >= SHIP_CHUNKS || bytes >= SHIP_BYTES {
                    break;
                }
            }
            Ok(out)
        })
    }

    /// The chunks of `sensor` that may hold points in `from..to`, from the database and
    /// the outbox, but those memory holds newer (`in_memory`: their first point and ID).
    pub(super) fn remote_chunks(
        &self,
        sensor: &str,
        from: i64,
        to: i64,
        in_memory: &[(i64, i64)],
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let Some(remote) = &self.remote else { return Ok(Vec::new()) };
        let waiting: Vec<(i64, i64, Vec<u8>)> = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let o = tx.open_table(OUTBOX).map_err(db)?;
            let mut out = Vec::new();
            for item in o.range((sensor, from.saturating_sub(MAX_SPAN_MS))..(sensor, to)).map_err(db)? {
                let (k, v) = item.map_err(db)?;
                let first = k.value().1;
                // One that does not read (no writer of ours makes one) is skipped here as
                // shipments skip it: it does not stop every read of the sensor.
                let Some((id, last, _, chunk)) = outbox_parts(v.value()) else { continue };
                if last >= from && !in_memory.iter().any(|(f, _)| *f == first) {
                    out.push((first, id, chunk.to_vec()));
                }
            }
            Ok(out)
        })?;
        // A read waits for the database (at most its timeout): on a runtime's worker, the
        // worker hands its other tasks on first, so readings, polling and the other tools
        // go on while a database hangs.
        let read = || remote.pg.range(sensor, from, to, MAX_SPAN_MS);
        let stored = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(read)
            }
            _ => read(),
        }
        .map_err(remote_err)?;
        let newer: std::collections::HashSet<(i64, i64)> =
            in_memory.iter().copied().chain(waiting.iter().map(|(f, i, _)| (*f, *i))).collect();
        let mut out: Vec<(i64, Vec<u8>)> = stored
            .into_iter()
            .filter(|c| !newer.contains(&(c.first, c.id)))
            .map(|c| (c.first, c.bytes))
            .collect();
        out.extend(waiting.into_iter().map(|(f, _, b)| (f, b)));
        Ok(out)
    }

    /// Retention in the database: the days that ended before `older_than` are dropped.
    pub fn prune_remote(&self, older_than: i64) -> Result<Dropped, StoreError> {
        let Some(remote) = &self.remote else { return Ok(Dropped::default()) };
        remote.pg.drop_before(older_than).map_err(remote_err)
    }
}
