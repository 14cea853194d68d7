//! Integration tests: one binary, modules per area (STYLE.md).

mod cli;
mod list_sensors;
mod registry;
mod schemas;
mod support;
mod validation;
