//! Alarms: the limit alarms of the device files evaluated over every sample (`limit.rs`,
//! a state machine without I/O: which sample activates an alarm and which clears it).
//! The journal of transitions, the ISA-18.2 states (acknowledged, shelved, out of
//! service), OPC UA Alarms & Conditions and the tools build on it (issue 37).

pub mod limit;
