//! `fieldgate discover`: a device file skeleton from a live device, for a person to edit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use super::out;

#[derive(clap::Args)]
pub struct DiscoverArgs {
    /// modbus | opcua
    pub protocol: String,
    /// Modbus: the device's host:port, e.g. 192.168.10.21:502. OPC UA: the server's
    /// URL, e.g. opc.tcp://192.168.10.30:4840/path (browsed with security None).
    #[arg(long)]
    pub endpoint: String,
    /// Modbus unit ID, 1-247.
    #[arg(long, default_value_t = 1)]
    pub unit: u8,
    /// Plant code of the sensor IDs, e.g. A.
    #[arg(long)]
    pub plant: String,
    /// Zone code of the sensor IDs, e.g. LINE1.
    #[arg(long)]
    pub zone: String,
    /// Probe addresses 0 to this (exclusive) in each table.
    #[arg(long, default_value_t = 1000)]
    pub max_address: u16,
    /// Per-request timeout in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Write the file here (refused if it exists) instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `discover`: a device file skeleton from a live device, on stdout or into a new file.
pub fn discover(runtime: &tokio::runtime::Runtime, a: DiscoverArgs) -> ExitCode {
    use crate::driver::discover::{DiscoverError, ModbusProbe, check_modbus_args, discover_modbus, resolve};
    let timeout = std::time::Duration::from_millis(a.timeout_ms.max(1));
    let found = match a.protocol.as_str() {
        "modbus" => {
            if let Err(e) = check_modbus_args(&a.plant, &a.zone, a.unit) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            let addr = match runtime.block_on(resolve(&a.endpoint, timeout)) {
                Ok(addr) => addr,
                Err(e) => {
                    eprintln!("error: {e}");
                    let usage = matches!(e, DiscoverError::Invalid(_));
                    return if usage { ExitCode::from(2) } else { ExitCode::FAILURE };
                }
            };
            if a.endpoint.parse::<SocketAddr>().is_err() {
                eprintln!("note: {} answered at {addr}", a.endpoint);
            }
            let (unit, max_address) = (a.unit, a.max_address);
            let probe = ModbusProbe {
                addr,
                endpoint: a.endpoint,
                unit,
                plant: a.plant,
                zone: a.zone,
                max_address,
                timeout,
            };
            runtime.block_on(discover_modbus(&probe))
        }
        "opcua" => {
            let probe = crate::driver::opcua::browse::UaProbe {
                url: a.endpoint,
                plant: a.plant,
                zone: a.zone,
                timeout,
                max_depth: 8,
            };
            runtime.block_on(crate::driver::opcua::browse::discover_opcua(&probe))
        }
        other => {
            eprintln!("error: discover supports \"modbus\" and \"opcua\", found {other:?}");
            return ExitCode::from(2);
        }
    };
    let text = match found {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(path) = a.out else {
        out(text.trim_end());
        return ExitCode::SUCCESS;
    };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write {}: {}", path.display(), e.kind());
            ExitCode::FAILURE
        }
    }
}
