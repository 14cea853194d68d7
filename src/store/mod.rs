//! History storage: compressed chunks per sensor in redb.

pub mod gorilla;
