//! Integration tests: one binary, modules per area.

mod agent_contract;
mod chaos;
mod cli;
mod crash_window;
mod docs_links;
mod fuzz;
mod history;
mod http;
mod line_stall;
mod list_sensors;
mod mcp;
mod mcp_faults;
mod modbus;
mod opcua;
mod raw_modbus;
mod registry;
mod schemas;
mod serve;
mod slow_clients;
mod stall;
mod stdio_service;
mod storage;
mod support;
mod validation;
mod webhook;
mod work_orders;
