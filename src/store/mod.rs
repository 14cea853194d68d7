//! History storage: compressed chunks per sensor in redb.

pub mod db;
pub mod gorilla;
pub mod history;
pub mod work_orders;

pub use history::{HistoryStore, StoreError};
