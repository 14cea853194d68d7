//! History storage: compressed chunks per sensor in redb, and `Db`, the redb database that
//! outlives its own failures (the work orders' store uses it too).

pub mod alarm_journal;
pub mod db;
pub mod gorilla;
pub mod history;
pub mod pg;

pub use history::{HistoryStore, StoreError};
