//! The `fieldgate` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::toml_reader::Problem;
use fieldgate::tools::ToolService;

#[derive(Parser)]
#[command(name = "fieldgate", version, about = "Field devices as safe tools for an AI reporting agent")]
struct Cli {
    /// Service configuration file (TOML); defaults are embedded, see config/default.toml.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Folder of device files; overrides devices.dir of the configuration.
    #[arg(long, global = true, value_name = "DIR")]
    devices: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and every device file; print a summary or every problem.
    Check,
    /// Print the definition of every served tool as JSON.
    Tools,
    /// Run one tool in-process and print its envelope (exit 0 if ok, 2 on a tool error).
    Call {
        /// Tool name, e.g. list_sensors.
        tool: String,
        /// Arguments as a JSON object, e.g. '{"zone":"LINE1"}'. Default: {}.
        args: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FIELDGATE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match cli.command {
        Command::Tools => {
            let defs: Vec<_> =
                fieldgate::tools::TOOLS.iter().filter(|t| t.served).map(|t| t.definition()).collect();
            out(&serde_json::to_string_pretty(&defs).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Command::Check => match load(&cli.config, &cli.devices) {
            Ok((config, registry)) => {
                out(&format!(
                    "ok: {} devices, {} sensors (devices from {})",
                    registry.devices().len(),
                    registry.sensors().len(),
                    config.devices.dir.display()
                ));
                for (protocol, devices, sensors) in registry.summary() {
                    out(&format!("  {:<20} {devices} device(s), {sensors} sensor(s)", protocol.name()));
                }
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Call { tool, args } => {
            let args = match args.as_deref().map(serde_json::from_str::<serde_json::Value>) {
                None => serde_json::Value::Object(Default::default()),
                Some(Ok(v)) => v,
                Some(Err(e)) => {
                    eprintln!(
                        "error: the arguments are not valid JSON ({e}); pass an object such as '{{\"zone\":\"LINE1\"}}'"
                    );
                    return ExitCode::from(2);
                }
            };
            let (config, registry) = match load(&cli.config, &cli.devices) {
                Ok(v) => v,
                Err(code) => return code,
            };
            let service = ToolService::new(Arc::new(registry), config);
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(service.call(&tool, args)) {
                Ok(envelope) => {
                    out(&serde_json::to_string_pretty(&envelope).unwrap_or_default());
                    if envelope.ok { ExitCode::SUCCESS } else { ExitCode::from(2) }
                }
                Err(e) => {
                    let served: Vec<_> = service.served().map(|t| t.name).collect();
                    eprintln!("error: {e}; tools served: {}", served.join(", "));
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// Configuration and registry, or every problem printed and exit code 1.
fn load(config: &Option<PathBuf>, devices: &Option<PathBuf>) -> Result<(Config, Registry), ExitCode> {
    let mut config = Config::load(config.as_deref(), std::env::vars()).map_err(|e| report(&e.0))?;
    if let Some(dir) = devices {
        config.devices.dir = dir.clone();
    }
    let registry = Registry::load(&config.devices.dir).map_err(|e| report(&e.0))?;
    Ok((config, registry))
}

fn report(problems: &[Problem]) -> ExitCode {
    for p in problems {
        eprintln!("{p}");
    }
    eprintln!("{} problem(s); fieldgate will not start until they are fixed.", problems.len());
    ExitCode::FAILURE
}

/// Prints a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn out(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}
