//! Alarms: the limit alarms of the device files evaluated over every sample (`limit.rs`,
//! a state machine without I/O: which sample activates an alarm and which clears it), the
//! engine that runs them over the sample feed and journals each transition and each
//! operator's act (`engine.rs`), and the alarm-management figures over a journal
//! (`summary.rs`).

pub mod conditions;
pub mod engine;
pub mod entry;
pub mod limit;
pub mod remote;
pub mod summary;
mod table;

pub use engine::{ActError, Alarms};
pub use entry::{Entry, Remote, Watch};
