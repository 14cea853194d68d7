//! The `fieldgate-sim` binary: serves the demo plant until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use fieldgate_sim::{Bind, Scenario, Simulator};

#[derive(Parser)]
#[command(name = "fieldgate-sim", version, about = "Simulated field devices with fault injection")]
struct Args {
    /// Folder of device files (the same as the service's).
    #[arg(long, default_value = "devices")]
    devices: PathBuf,
    /// Scenario: waveforms per sensor and faults per device.
    #[arg(long, default_value = "simulator/scenarios/demo.toml")]
    scenario: PathBuf,
    /// Serve the HTTP control API on this address, e.g. 127.0.0.1:7070.
    #[arg(long, value_name = "ADDR")]
    control: Option<SocketAddr>,
    /// Listen on free ports of 127.0.0.1 instead of the endpoints of the device files.
    #[arg(long)]
    ephemeral: bool,
    /// Keep the OPC UA servers' certificates here (one folder per device), so that a
    /// client trusts them once; by default a temporary folder per run.
    #[arg(long, value_name = "DIR")]
    pki_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Colour only for a person at a terminal, and never when NO_COLOR is set.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FIELDGATE_LOG").unwrap_or_else(|_| {
            "info,opcua_server=error,opcua_crypto=off,opcua_core::comms::secure_channel=off".into()
        }))
        .init();
    let devices = match fieldgate_sim::plant::load_dir(&args.devices) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let scenario = match Scenario::load(&args.scenario) {
        Ok(s) => Scenario { opcua_pki_dir: args.pki_dir.clone().or(s.opcua_pki_dir.clone()), ..s },
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bind = if args.ephemeral { Bind::Ephemeral } else { Bind::Declared };
    let sim = match Simulator::start(devices, scenario, bind).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (id, addr) in sim.addrs() {
        println!("{id:<20} modbus on {addr}");
    }
    for (id, path) in sim.serial_paths() {
        println!("{id:<20} modbus RTU on serial line {path}");
    }
    for (id, url) in sim.opcua_urls() {
        println!("{id:<20} opcua on {url}");
        if let Some(cert) = sim.opcua_certificate(&id) {
            println!("{:<20} server certificate {}", "", cert.display());
        }
    }
    for id in sim.skipped() {
        println!("{id:<20} not simulated");
    }
    if let Some(addr) = args.control {
        match fieldgate_sim::control::serve(sim.clone(), addr).await {
            Ok((bound, _)) => println!("control API on http://{bound}"),
            Err(e) => {
                eprintln!("error: cannot serve the control API on {addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
