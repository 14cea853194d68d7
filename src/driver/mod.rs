//! Device I/O. Only this module talks to field devices.
//!
//! [`Driver`] is transport-independent: the Modbus implementation lives in `modbus.rs`,
//! OPC UA will implement the same trait. Drivers return [`DriverError`]s that keep "the
//! device answered no" (`Rejected`, `Busy`) apart from "the device did not answer"
//! (`Timeout`, `Unavailable`), because only the second kind is a sign of a dead device.

pub mod codec;
pub mod plan;
