//! Integration tests: one binary, modules per area (STYLE.md).

mod chaos;
mod cli;
mod history;
mod http;
mod list_sensors;
mod mcp;
mod modbus;
mod opcua;
mod registry;
mod schemas;
mod serve;
mod support;
mod validation;
mod work_orders;
