//! Integration tests: one binary, modules per area (STYLE.md).

mod cli;
mod list_sensors;
mod modbus;
mod registry;
mod schemas;
mod support;
mod validation;
