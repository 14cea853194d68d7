//! Integration tests: one binary, modules per area.

mod agent_contract;
mod chaos;
mod cli;
mod docs_links;
mod fuzz;
mod hand_values;
mod history;
mod http;
mod list_sensors;
mod mcp;
mod mcp_faults;
mod modbus;
mod opcua;
mod raw_modbus;
mod registry;
mod schemas;
mod serve;
mod stall;
mod stdio_service;
mod storage;
mod support;
mod validation;
mod work_orders;
