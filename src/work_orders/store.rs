//! Work orders in redb: created, deduplicated and moved through their lifecycle in single
//! durable transactions, with an outbox for delivery to the maintenance system.
//!
//! Tables: `orders` (number → JSON), `keys` (idempotency key → number and a fingerprint of
//! the arguments), `open` ((sensor, type) → number of the open order), `meta` (next
//! number), `outbox` (number → delivery state). Every change is one write transaction with
//! `Durability::Immediate` (redb's default): when a call answers, the change is on disk.

use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::model::{
    Delivery, DeliveryState, Transition, WorkOrder, WorkOrderStatus, allowed, id_of, number_of,
};
use crate::store::db::{Db, StorageFailure};

const ORDERS: TableDefinition<u64, &[u8]> = TableDefinition::new("orders");
const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
const OPEN: TableDefinition<(&str, &str), u64> = TableDefinition::new("open");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");

#[derive(Debug, thiserror::Error)]
pub enum WorkOrderError {
    #[error("work order store: {0}")]
    Db(String),
    #[error("work order store: a stored record does not decode")]
    Corrupt,
    #[error("{0}")]
    Refused(String),
    #[error("no work order {0}")]
    NotFound(String),
    #[error("idempotency key reused with other arguments")]
    Conflict { existing: String },
    #[error("a work order in state {} cannot move to {}", from.as_str(), to.as_str())]
    Transition { id: String, from: WorkOrderStatus, to: WorkOrderStatus },
    #[error("no work order was created with this idempotency key")]
    UnknownKey,
}

fn db<E: std::fmt::Display>(e: E) -> WorkOrderError {
    WorkOrderError::Db(e.to_string())
}

fn corrupt<E>(_: E) -> WorkOrderError {
    WorkOrderError::Corrupt
}

impl StorageFailure for WorkOrderError {
    fn storage(reason: String) -> Self {
        WorkOrderError::Db(reason)
    }
    fn is_storage(&self) -> bool {
        matches!(self, WorkOrderError::Db(_))
    }
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[derive(Serialize, Deserialize)]
struct KeyEntry {
    number: u64,
    fingerprint: String,
    /// The key's first call found an open duplicate: a replay answers the same.
    #[serde(default)]
    duplicate: bool,
}

/// Delivery state kept in the outbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutboxEntry {
    pub attempts: u32,
    pub next_attempt_ms: i64,
    pub delivered: bool,
    pub last_attempt_at: Option<String>,
}

/// What `create` did.
pub struct Created {
    pub order: WorkOrder,
    pub created: bool,
    pub duplicate_of: Option<String>,
}

pub struct WorkOrderStore {
    db: Db,
    /// `work_orders.last_id` beside a file-backed store: the highest ID ever issued.
    marker: Option<PathBuf>,
}

impl WorkOrderStore {
    /// Opens (or creates) the store file, its integrity checked, and holds it against its
    /// marker of issued IDs: a store with fewer orders than were issued is refused.
    pub fn open(path: &Path) -> Result<WorkOrderStore, WorkOrderError> {
        let store =
            WorkOrderStore::init(Db::open_file("work orders", path).map_err(WorkOrderError::Refused)?)?;
        let marker = path.with_extension("last_id");
        let issued = read_marker(&marker)?;
        let held = store.highest()?;
        if issued > held {
            return Err(WorkOrderError::Refused(format!(
                "{} holds work orders up to {} but {} says {} was issued: the store was replaced, emptied or damaged; restore it from a backup, or move both files aside to start with no work orders (IDs would then be reused)",
                path.display(),
                if held == 0 { "none".to_string() } else { id_of(held) },
                marker.display(),
                id_of(issued)
            )));
        }
        let store = WorkOrderStore { marker: Some(marker), ..store };
        if held > issued {
            // A store from before the marker existed, or a crash between commit and marker.
            store.mark_issued(&id_of(held));
        }
        Ok(store)
    }

    pub fn open_in(dir: &Path) -> Result<WorkOrderStore, WorkOrderError> {
        std::fs::create_dir_all(dir).map_err(db)?;
        WorkOrderStore::open(&dir.join("work_orders.redb"))
    }

    pub fn in_memory() -> Result<WorkOrderStore, WorkOrderError> {
        let database =
            Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(db)?;
        WorkOrderStore::init(Db::memory("work orders", database))
    }

    /// A store over `db` (tests open one with an injected storage backend).
    pub fn init(db: Db) -> Result<WorkOrderStore, WorkOrderError> {
        db.write(|d| {
            let tx = d.begin_write().map_err(self::db)?;
            tx.open_table(ORDERS).map_err(self::db)?;
            tx.open_table(KEYS).map_err(self::db)?;
            tx.open_table(OPEN).map_err(self::db)?;
            tx.open_table(META).map_err(self::db)?;
            tx.open_table(OUTBOX).map_err(self::db)?;
            tx.commit().map_err(self::db)
        })?;
        Ok(WorkOrderStore { db, marker: None })
    }

    /// What is wrong with the store now, if anything.
    pub fn problem(&self) -> Option<crate::store::db::Problem> {
        self.db.problem()
    }

    /// While the store has a problem, and its filesystem has room again (a megabyte at
    /// least), tries an empty write: when it commits, the problem is cleared, so `/readyz`
    /// and `/metrics` recover without waiting for the next order. Returns whether the
    /// store is fine now.
    pub fn recheck(&self) -> bool {
        if self.db.problem().is_none() {
            return true;
        }
        let room =
            self.db.file().and_then(crate::store::db::disk_space).is_none_or(|(free, _)| free >= 1 << 20);
        let written = room
            && self
                .db
                .write(|d| {
                    let tx = d.begin_write().map_err(db)?;
                    tx.open_table(META).map_err(db)?;
                    tx.commit().map_err(db)
                })
                .is_ok();
        // The marker must catch up too (it may have been what failed).
        match (written, self.highest()) {
            (true, Ok(n)) if n > 0 => {
                self.mark_issued(&id_of(n));
                self.db.problem().is_none()
            }
            (true, Ok(_)) => true,
            _ => false,
        }
    }

    /// The highest order number in the store (0 for none).
    fn highest(&self) -> Result<u64, WorkOrderError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let orders = tx.open_table(ORDERS).map_err(db)?;
            let last = orders.last().map_err(db)?.map_or(0, |(k, _)| k.value());
            let next = tx.open_table(META).map_err(db)?.get("next").map_err(db)?.map_or(1, |v| v.value());
            Ok(last.max(next.saturating_sub(1)))
        })
    }

    /// Records durably that `id` was issued (after its order was committed: the marker
    /// may lag the store after a crash, never lead it).
    fn mark_issued(&self, id: &str) {
        let Some(path) = &self.marker else { return };
        if let Err(error) = crate::store::db::write_durably(path, id.as_bytes()) {
            tracing::error!(file = %path.display(), error = %error.kind(), "cannot record the highest work order ID issued");
            self.db.note("the work-order ID marker cannot be written");
        }
    }

    /// Creates `draft` unless its key or an open order of the same type for the same sensor
    /// already exists; one durable transaction. `fingerprint` identifies the arguments.
    pub fn create(
        &self,
        key: &str,
        fingerprint: &str,
        draft: WorkOrder,
        auto_approve: bool,
    ) -> Result<Created, WorkOrderError> {
        let created = self.db.write(|d| create_in(d, key, fingerprint, draft, auto_approve))?;
        if created.created {
            self.mark_issued(&created.order.id);
        }
        Ok(created)
    }
}

fn create_in(
    d: &Database,
    key: &str,
    fingerprint: &str,
    mut draft: WorkOrder,
    auto_approve: bool,
) -> Result<Created, WorkOrderError> {
    let tx = d.begin_write().map_err(db)?;
    let result = {
        let mut orders = tx.open_table(ORDERS).map_err(db)?;
        let mut keys = tx.open_table(KEYS).map_err(db)?;
        let mut open = tx.open_table(OPEN).map_err(db)?;
        let mut meta = tx.open_table(META).map_err(db)?;
        let existing_key: Option<KeyEntry> =
            keys.get(key).map_err(db)?.and_then(|v| serde_json::from_slice(v.value()).ok());
        if let Some(k) = existing_key {
            let order = read(&orders, k.number)?;
            if k.fingerprint != fingerprint {
                return Err(WorkOrderError::Conflict { existing: order.id });
            }
            let duplicate_of = k.duplicate.then(|| order.id.clone());
            return Ok(Created { order, created: false, duplicate_of });
        }
        let kind = draft.work_type.as_str();
        let open_number = open.get((draft.sensor_id.as_str(), kind)).map_err(db)?.map(|v| v.value());
        let duplicate = match open_number {
            Some(n) => Some(read(&orders, n)?).filter(|o| o.status.is_open()),
            None => None,
        };
        if let Some(order) = duplicate {
            // Replaying this key later returns the same open order.
            let entry = serde_json::to_vec(&KeyEntry {
                number: number_of(&order.id).unwrap_or(0),
                fingerprint: fingerprint.into(),
                duplicate: true,
            })
            .map_err(db)?;
            keys.insert(key, entry.as_slice()).map_err(db)?;
            let id = order.id.clone();
            Created { order, created: false, duplicate_of: Some(id) }
        } else {
            let n = meta.get("next").map_err(db)?.map_or(1, |v| v.value());
            meta.insert("next", n + 1).map_err(db)?;
            draft.id = id_of(n);
            if auto_approve {
                let at = now();
                draft.status = WorkOrderStatus::Approved;
                draft.history.push(Transition {
                    from: Some(WorkOrderStatus::PendingApproval),
                    to: WorkOrderStatus::Approved,
                    at,
                    by: "system".into(),
                    note: Some("auto-approved by policy (work_orders.auto_approve)".into()),
                });
                let mut outbox = tx.open_table(OUTBOX).map_err(db)?;
                let entry =
                    OutboxEntry { attempts: 0, next_attempt_ms: 0, delivered: false, last_attempt_at: None };
                outbox.insert(n, serde_json::to_vec(&entry).map_err(db)?.as_slice()).map_err(db)?;
            }
            orders.insert(n, serde_json::to_vec(&draft).map_err(db)?.as_slice()).map_err(db)?;
            let entry = serde_json::to_vec(&KeyEntry {
                number: n,
                fingerprint: fingerprint.into(),
                duplicate: false,
            })
            .map_err(db)?;
            keys.insert(key, entry.as_slice()).map_err(db)?;
            open.insert((draft.sensor_id.as_str(), kind), n).map_err(db)?;
            Created { order: draft, created: true, duplicate_of: None }
        }
    };
    tx.commit().map_err(db)?;
    Ok(result)
}

impl WorkOrderStore {
    /// The order an idempotency key created (or found as a duplicate).
    pub fn by_key(&self, key: &str) -> Result<WorkOrder, WorkOrderError> {
        let number = self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let keys = tx.open_table(KEYS).map_err(db)?;
            let entry = keys.get(key).map_err(db)?.ok_or(WorkOrderError::UnknownKey)?;
            let k: KeyEntry = serde_json::from_slice(entry.value()).map_err(corrupt)?;
            Ok(k.number)
        })?;
        self.get(&id_of(number))
    }

    pub fn get(&self, id: &str) -> Result<WorkOrder, WorkOrderError> {
        let n = number_of(id).ok_or_else(|| WorkOrderError::NotFound(id.into()))?;
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let orders = tx.open_table(ORDERS).map_err(db)?;
            let mut order = read(&orders, n)?;
            let outbox = tx.open_table(OUTBOX).map_err(db)?;
            if let Some(v) = outbox.get(n).map_err(db)?
                && let Ok(e) = serde_json::from_slice::<OutboxEntry>(v.value())
            {
                order.delivery = Some(delivery(&e));
            }
            Ok(order)
        })
    }

    /// Every order, newest first.
    pub fn list(&self) -> Result<Vec<WorkOrder>, WorkOrderError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let orders = tx.open_table(ORDERS).map_err(db)?;
            let outbox = tx.open_table(OUTBOX).map_err(db)?;
            let mut out = Vec::new();
            for item in orders.iter().map_err(db)?.rev() {
                let (k, v) = item.map_err(db)?;
                let mut o: WorkOrder = serde_json::from_slice(v.value()).map_err(corrupt)?;
                if let Some(e) = outbox
                    .get(k.value())
                    .map_err(db)?
                    .and_then(|e| serde_json::from_slice::<OutboxEntry>(e.value()).ok())
                {
                    o.delivery = Some(delivery(&e));
                }
                out.push(o);
            }
            Ok(out)
        })
    }

    /// Moves an order to `to`, recording who and why; approval queues delivery in the same
    /// transaction.
    pub fn transition(
        &self,
        id: &str,
        to: WorkOrderStatus,
        by: &str,
        note: Option<String>,
    ) -> Result<WorkOrder, WorkOrderError> {
        let n = number_of(id).ok_or_else(|| WorkOrderError::NotFound(id.into()))?;
        let order = self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            let order = {
                let mut orders = tx.open_table(ORDERS).map_err(db)?;
                let mut order = read(&orders, n)?;
                if !allowed(order.status, to) {
                    return Err(WorkOrderError::Transition { id: order.id.clone(), from: order.status, to });
                }
                let at = now();
                order.history.push(Transition {
                    from: Some(order.status),
                    to,
                    at: at.clone(),
                    by: by.into(),
                    note,
                });
                order.status = to;
                order.updated_at = at;
                orders.insert(n, serde_json::to_vec(&order).map_err(db)?.as_slice()).map_err(db)?;
                if !to.is_open() {
                    let mut open = tx.open_table(OPEN).map_err(db)?;
                    let key = (order.sensor_id.as_str(), order.work_type.as_str());
                    if open.get(key).map_err(db)?.map(|v| v.value()) == Some(n) {
                        open.remove(key).map_err(db)?;
                    }
                }
                if to == WorkOrderStatus::Approved {
                    let mut outbox = tx.open_table(OUTBOX).map_err(db)?;
                    let entry = OutboxEntry {
                        attempts: 0,
                        next_attempt_ms: 0,
                        delivered: false,
                        last_attempt_at: None,
                    };
                    outbox.insert(n, serde_json::to_vec(&entry).map_err(db)?.as_slice()).map_err(db)?;
                }
                order
            };
            tx.commit().map_err(db)?;
            Ok(order)
        })?;
        self.get(&order.id)
    }

    /// Expires pending orders created before `cutoff`; returns their IDs.
    pub fn expire(&self, cutoff: DateTime<Utc>) -> Result<Vec<String>, WorkOrderError> {
        let due: Vec<String> = self
            .list()?
            .into_iter()
            .filter(|o| o.status == WorkOrderStatus::PendingApproval)
            .filter(|o| DateTime::parse_from_rfc3339(&o.created_at).is_ok_and(|c| c < cutoff))
            .map(|o| o.id)
            .collect();
        for id in &due {
            self.transition(id, WorkOrderStatus::Expired, "system", Some("not approved in time".into()))?;
        }
        Ok(due)
    }

    /// Deliveries due at `now_ms`.
    pub fn due(&self, now_ms: i64) -> Result<Vec<(WorkOrder, OutboxEntry)>, WorkOrderError> {
        self.db.read(|d| {
            let tx = d.begin_read().map_err(db)?;
            let outbox = tx.open_table(OUTBOX).map_err(db)?;
            let orders = tx.open_table(ORDERS).map_err(db)?;
            let mut out = Vec::new();
            for item in outbox.iter().map_err(db)? {
                let (k, v) = item.map_err(db)?;
                let e: OutboxEntry = serde_json::from_slice(v.value()).map_err(corrupt)?;
                if !e.delivered && e.next_attempt_ms <= now_ms {
                    out.push((read(&orders, k.value())?, e));
                }
            }
            Ok(out)
        })
    }

    /// Records a delivery attempt.
    pub fn delivered(&self, id: &str, ok: bool, next_attempt_ms: i64) -> Result<(), WorkOrderError> {
        let n = number_of(id).ok_or_else(|| WorkOrderError::NotFound(id.into()))?;
        self.db.write(|d| {
            let tx = d.begin_write().map_err(db)?;
            {
                let mut outbox = tx.open_table(OUTBOX).map_err(db)?;
                let mut e: OutboxEntry = match outbox.get(n).map_err(db)? {
                    Some(v) => serde_json::from_slice(v.value()).map_err(corrupt)?,
                    None => return Err(WorkOrderError::NotFound(id.into())),
                };
                e.attempts += 1;
                e.delivered = ok;
                e.next_attempt_ms = next_attempt_ms;
                e.last_attempt_at = Some(now());
                outbox.insert(n, serde_json::to_vec(&e).map_err(db)?.as_slice()).map_err(db)?;
            }
            tx.commit().map_err(db)?;
            Ok(())
        })
    }
}

fn delivery(e: &OutboxEntry) -> Delivery {
    Delivery {
        state: if e.delivered {
            DeliveryState::Delivered
        } else if e.attempts == 0 {
            DeliveryState::Pending
        } else {
            DeliveryState::Failing
        },
        attempts: e.attempts,
        last_attempt_at: e.last_attempt_at.clone(),
    }
}

fn read(orders: &impl ReadableTable<u64, &'static [u8]>, n: u64) -> Result<WorkOrder, WorkOrderError> {
    match orders.get(n).map_err(db)? {
        Some(v) => serde_json::from_slice(v.value()).map_err(corrupt),
        None => Err(WorkOrderError::NotFound(id_of(n))),
    }
}

/// The highest ID a marker file says was issued (0 when there is no marker).
fn read_marker(path: &Path) -> Result<u64, WorkOrderError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        _ => {}
    }
    // Only a regular file of bounded size (a link to /dev/zero never ends).
    match crate::toml_reader::read_text_file(path) {
        Ok(text) => number_of(text.trim()).ok_or_else(|| {
            WorkOrderError::Refused(format!(
                "{} does not hold a work order ID (WO-nnnnnn); restore it or remove it",
                path.display()
            ))
        }),
        Err(why) => Err(WorkOrderError::Refused(format!("{} cannot be read: {why}", path.display()))),
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
