//! The `fieldgate` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use fieldgate::cli;
use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::toml_reader::Problem;
use fieldgate::transport::auth::Tokens;

// Measured (benches/transport.rs): the tool path allocates many small, short-lived
// buffers; mimalloc keeps them off glibc's consolidation path.
// `--features system-alloc` leaves the system's allocator in place, for heap profilers
// that see only malloc (heaptrack: `HUB_BENCH_WRAP` in benches/hub.rs).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "fieldgate", version, about = "Field devices as safe tools for an AI reporting agent")]
struct Cli {
    /// Service configuration file (TOML); defaults are embedded, see config/default.toml.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Folder of device files; overrides devices.dir of the configuration.
    #[arg(long, global = true, value_name = "DIR")]
    devices: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and every device file; print a summary or every problem.
    Check {
        /// Check it as `fieldgate hub` runs it: no device files; `[hub]` names a broker.
        #[arg(long)]
        hub: bool,
    },
    /// Print the definition of every served tool as JSON.
    Tools,
    /// Run one tool and print its envelope (exit 0 if ok, 2 on a tool error): through the
    /// running fieldgate next to it (the data directory's holder, or one on server.listen),
    /// else in this process.
    Call {
        /// Tool name, e.g. list_sensors.
        tool: String,
        /// Arguments as a JSON object, e.g. '{"zone":"LINE1"}'. Default: {}.
        args: Option<String>,
        /// Ask this running service, e.g. http://127.0.0.1:8080 (default: the one holding
        /// the data directory, or one answering on server.listen, if any).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// The data directory (default: storage.data_dir).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Bearer token for --url (or FIELDGATE_CLI_TOKEN).
        #[arg(long, env = "FIELDGATE_CLI_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Serve the HTTP API and MCP over Streamable HTTP (at /mcp) until SIGTERM or Ctrl-C.
    Serve {
        /// Where the HTTP API listens (default: server.listen).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// The data directory (default: storage.data_dir).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// The fleet hub: a Sparkplug B host application on [hub] brokers serving the same tools
    /// (HTTP API, MCP at /mcp, the console) for every edge node publishing there.
    Hub {
        /// Where the HTTP API listens (default: server.listen).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// The data directory: the hub's history and work orders (default: storage.data_dir).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Serve MCP on stdin/stdout (logs go to stderr): the whole service (data directory,
    /// polling, history, work orders, and the HTTP API on loopback when the port is free),
    /// or, when a running fieldgate holds the data directory, a relay to its /mcp.
    Mcp {
        /// Where this process's HTTP API listens when it owns the data directory (default:
        /// server.listen).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// The data directory (default: storage.data_dir).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Relay to this running service instead, e.g. http://127.0.0.1:8080.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Bearer token for --url (or FIELDGATE_CLI_TOKEN).
        #[arg(long, env = "FIELDGATE_CLI_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Work orders in the data directory (when no service holds it): list, show, and the
    /// operator's decisions approve, reject, start, complete, cancel.
    WorkOrders {
        /// list | show | approve | reject | start | complete | cancel
        action: String,
        /// The work order, e.g. WO-000001 (all but list).
        id: Option<String>,
        /// A note recorded with the decision.
        #[arg(long)]
        note: Option<String>,
        /// Who decides (recorded in the history). Default: $USER. With --url, the token's name.
        #[arg(long)]
        by: Option<String>,
        /// Talk to a running service instead, e.g. http://127.0.0.1:8080.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Bearer token for the running service (or FIELDGATE_CLI_TOKEN); an operator's to probe.
        #[arg(long, env = "FIELDGATE_CLI_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// The data directory (default: storage.data_dir of the configuration).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Alarms: `list` (`--state active|unacknowledged|not_normal|...`), and the operator's
    /// acts `ack`, `shelve` (`--duration 2h --comment WHY`), `unshelve`, `out-of-service`
    /// (`--comment WHY`), `in-service`, through the running fieldgate (or in this process).
    Alarms {
        /// list | ack | shelve | unshelve | out-of-service | in-service
        action: String,
        /// The alarm, SENSOR_ID.NAME or DEVICE_ID.NAME, e.g. B_BOILER_001.HI (all but list).
        id: Option<String>,
        /// Why (shelve and out-of-service need one; recorded in the journal).
        #[arg(long)]
        comment: Option<String>,
        /// Shelve: for how long, e.g. 30m, 2h, 1d (at most 7 days).
        #[arg(long)]
        duration: Option<String>,
        /// Acknowledge: the event seen (refused when a newer activation came).
        #[arg(long)]
        event_id: Option<u64>,
        /// List: only alarms in this state (active, unacknowledged, not_normal, shelved, ...).
        #[arg(long)]
        state: Option<String>,
        /// The data directory (default: storage.data_dir), when no service runs.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Talk to this running service, e.g. http://127.0.0.1:8080.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Bearer token for the running service (or FIELDGATE_CLI_TOKEN); an operator's to act.
        #[arg(long, env = "FIELDGATE_CLI_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// History: `migrate --from redb --to postgres` copies a data directory's history to the
    /// PostgreSQL database history.postgres_url_env names (stop the service first).
    History {
        /// migrate
        action: String,
        /// Where history is now: redb.
        #[arg(long)]
        from: String,
        /// Where it goes: postgres.
        #[arg(long)]
        to: String,
        /// The data directory (default: storage.data_dir of the configuration).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Devices: `status` (every device, or one) and `probe ID`, an operator's probe of a
    /// device at once, whatever its circuit breaker says; the outcome and its state.
    Devices {
        /// status | probe
        action: String,
        /// The device, e.g. a-line1-plc (probe; optional for status).
        id: Option<String>,
        /// Ask a running service instead (its breakers, its probe), e.g. http://127.0.0.1:8080.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// Bearer token for the running service (or FIELDGATE_CLI_TOKEN); an operator's to probe.
        #[arg(long, env = "FIELDGATE_CLI_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Run the simulated demo plant and the service against it until Ctrl-C.
    #[cfg(feature = "demo")]
    Demo {
        /// Instead, run a short scripted session through the HTTP API and exit.
        #[arg(long)]
        tour: bool,
        /// Keep data here instead of in a temporary directory.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Where the HTTP API listens (default: server.listen; the tour uses a free port).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Also publish the plant as a Sparkplug B edge node to this broker
        /// (e.g. mqtt://127.0.0.1:1883; sets [mqtt] brokers).
        #[arg(long, value_name = "URL")]
        mqtt: Option<String>,
        /// Serve one plant's devices only (A or B): two demos, one a plant, are two edge
        /// nodes for a fleet hub (docs/hub.md).
        #[arg(long, value_name = "PLANT")]
        plant: Option<String>,
    },
    /// Probe a Modbus device or browse an OPC UA server and print a device file skeleton for
    /// a person to edit: one sensor per readable Modbus address, or per OPC UA variable.
    Discover(cli::discover::DiscoverArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Cli { config, devices, command, .. } = cli;
    // A service's configuration load is an audit event; a one-shot command's is not.
    #[cfg(feature = "demo")]
    let starts_service = matches!(
        command,
        Command::Serve { .. } | Command::Mcp { .. } | Command::Demo { .. } | Command::Hub { .. }
    );
    #[cfg(not(feature = "demo"))]
    let starts_service = matches!(command, Command::Serve { .. } | Command::Mcp { .. } | Command::Hub { .. });
    let load = || load(&config, &devices, starts_service);
    match command {
        Command::Discover(args) => cli::discover::discover(&runtime, args),
        Command::Tools => {
            let defs: Vec<_> =
                fieldgate::tools::TOOLS.iter().filter(|t| t.served).map(|t| t.definition()).collect();
            cli::out(&serde_json::to_string_pretty(&defs).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Command::Check { hub: false } => match load().and_then(with_tokens) {
            Ok((config, registry, tokens)) => cli::devices::check(&config, &registry, &tokens),
            Err(code) => code,
        },
        Command::Check { hub: true } => match load_hub(&config, false).and_then(with_tokens) {
            Ok((config, _, tokens)) => cli::devices::check_hub(&config, &tokens),
            Err(code) => code,
        },
        Command::Call { tool, args, url, data_dir, token } => {
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
            if let Some(url) = url {
                return runtime.block_on(cli::run::call_remote(&url, token, &tool, &args));
            }
            // The running fieldgate first (a hub has no device files to load), then this
            // process over the device files.
            let named_dir = data_dir.is_some();
            if let Ok(c) = Config::load(config.as_deref(), std::env::vars()) {
                let c = with_overrides(c, None, data_dir.clone());
                if let Some(url) = runtime.block_on(cli::running_service(&c, named_dir)) {
                    tracing::info!(url = %url, "asking the running fieldgate");
                    return runtime.block_on(cli::run::call_remote(&url, token, &tool, &args));
                }
            }
            // A data directory named, no service answering for it, and no device files to
            // call in this process (a hub's box has none): say who should answer.
            if let Some(dir) = &data_dir {
                let files = Config::load(config.as_deref(), std::env::vars())
                    .map(|c| devices.clone().unwrap_or(c.devices.dir))
                    .unwrap_or_else(|_| PathBuf::from("devices"));
                if !files.is_dir() {
                    eprintln!(
                        "error: no running fieldgate answers for {} and there are no device files here ({}) to call in this process: start the service that keeps it (fieldgate hub, or serve) and call again, or pass --url or --devices DIR",
                        dir.display(),
                        files.display()
                    );
                    return ExitCode::from(1);
                }
            }
            match load() {
                Ok((c, registry)) => {
                    let c = with_overrides(c, None, data_dir);
                    runtime.block_on(cli::run::call(c, registry, &tool, args, token))
                }
                Err(code) => code,
            }
        }
        Command::Mcp { url: Some(url), token, .. } => match Config::load(config.as_deref(), std::env::vars())
        {
            Ok(c) => runtime.block_on(cli::run::mcp_relay(&c, &url, token)),
            Err(e) => report(&e.0),
        },
        Command::Mcp { url, token, listen, data_dir } => match load().and_then(with_tokens) {
            Ok((c, registry, tokens)) => {
                let c = with_overrides(c, listen, data_dir);
                runtime.block_on(cli::run::mcp(c, registry, tokens, url, token))
            }
            Err(code) => code,
        },
        Command::Hub { listen, data_dir } => match load_hub(&config, true).and_then(with_tokens) {
            Ok((c, _, tokens)) => {
                runtime.block_on(cli::run::hub(with_overrides(c, listen, data_dir), tokens))
            }
            Err(code) => code,
        },
        Command::Serve { listen, data_dir } => match load().and_then(with_tokens) {
            Ok((c, registry, tokens)) => {
                runtime.block_on(cli::run::serve(with_overrides(c, listen, data_dir), registry, tokens))
            }
            Err(code) => code,
        },
        Command::History { action, from, to, data_dir } => {
            if action != "migrate" {
                eprintln!("error: history takes one action: migrate");
                return ExitCode::from(2);
            }
            match Config::load(config.as_deref(), std::env::vars()) {
                Ok(c) => {
                    let dir = data_dir.unwrap_or_else(|| c.storage.data_dir.clone());
                    cli::history::migrate(&c, &dir, &from, &to)
                }
                Err(e) => report(&e.0),
            }
        }
        Command::WorkOrders { action, id, note, by, url, token, data_dir, json } => {
            let target = match url {
                Some(url) => cli::Target::Remote { url, token },
                None => match Config::load(config.as_deref(), std::env::vars()) {
                    Ok(c) => cli::Target::Local {
                        data_dir: data_dir.unwrap_or(c.storage.data_dir),
                        webhook_configured: !c.work_orders.webhook_url.is_empty(),
                    },
                    Err(e) => return report(&e.0),
                },
            };
            let cmd = cli::WorkOrderCommand { action, id, note, by, json };
            runtime.block_on(cli::work_orders::work_orders(target, cmd))
        }
        Command::Alarms { action, id, comment, duration, event_id, state, data_dir, url, token, json } => {
            let cmd = cli::alarms::AlarmCommand { action, id, comment, duration, event_id, state, json };
            match url {
                Some(url) => runtime.block_on(cli::alarms::alarms_remote(&url, token, &cmd)),
                None => match load() {
                    Ok((mut c, registry)) => {
                        if let Some(d) = data_dir {
                            c.storage.data_dir = d;
                        }
                        runtime.block_on(cli::alarms::alarms(c, registry, cmd, token))
                    }
                    Err(code) => code,
                },
            }
        }
        Command::Devices { action, id, url: Some(url), token } => {
            runtime.block_on(cli::devices::devices_remote(&url, token, &action, id))
        }
        Command::Devices { action, id, url: None, token } => match load() {
            Ok((c, registry)) => runtime.block_on(cli::devices::devices(c, registry, &action, id, token)),
            Err(code) => code,
        },
        #[cfg(feature = "demo")]
        Command::Demo { tour, data_dir, listen, mqtt, plant } => match load().and_then(with_tokens) {
            Ok((mut c, registry, tokens)) => {
                let registry = match plant.as_deref() {
                    None => registry,
                    Some(p) => match registry.of_plant(p) {
                        Some(r) => r,
                        None => {
                            let plants: Vec<&str> = registry.plants().iter().map(String::as_str).collect();
                            eprintln!(
                                "error: --plant {p}: no device of that plant (the demo's plants: {})",
                                plants.join(", ")
                            );
                            return ExitCode::from(2);
                        }
                    },
                };
                if let Some(url) = mqtt {
                    if let Err(why) = fieldgate::config::mqtt::parse_broker(&url) {
                        eprintln!("error: --mqtt {url}: {why}");
                        return ExitCode::from(2);
                    }
                    c.mqtt.brokers = vec![url];
                }
                let free = SocketAddr::from(([127, 0, 0, 1], 0));
                let listen = listen.unwrap_or(if tour { free } else { c.server.listen });
                runtime.block_on(cli::run::demo(c, registry, tokens, listen, data_dir, tour))
            }
            Err(code) => code,
        },
    }
}

/// Logs on stderr: one event per tool call while serving and for `call`, warnings only for
/// the other one-shot commands; `FIELDGATE_LOG` overrides.
fn init_logs(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("FIELDGATE_LOG").unwrap_or_else(|_| {
        let serving = match &cli.command {
            Command::Serve { .. } | Command::Mcp { .. } | Command::Call { .. } | Command::Hub { .. } => true,
            #[cfg(feature = "demo")]
            Command::Demo { tour, .. } => !tour,
            _ => false,
        };
        let level = if serving { "info" } else { "warn" };
        // async-opcua logs every session at info, an error for the certificate it looks for
        // even under security policy None (which needs none), and errors with the server's
        // own text for refusals fieldgate reports itself (untrusted certificate, user
        // refused); FIELDGATE_LOG=opcua_client=debug,opcua_types=debug brings them back.
        // Audit events (operator decisions at the command line among them) always.
        tracing_subscriber::EnvFilter::new(format!(
            "{level},audit=info,rmcp=warn,opcua_server=error,opcua_client=off,opcua_crypto=off,opcua_types=off,opcua_core::comms::secure_channel=off"
        ))
    });
    // Colour only for a person at a terminal, and never when NO_COLOR is set.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(ansi).with_env_filter(filter);
    match cli.log_format {
        LogFormat::Json => logs.event_format(fieldgate::logs::JsonEvents).init(),
        LogFormat::Text => logs.init(),
    }
}

/// The bearer tokens of the configuration (static ones, and the identity provider's
/// when `[server.oauth]` is set), or every problem printed.
fn with_tokens((config, registry): (Config, Registry)) -> Result<(Config, Registry, Arc<Tokens>), ExitCode> {
    let oauth = match &config.server.oauth {
        None => None,
        Some(o) => match fieldgate::transport::oauth::OAuth::new(o, &config.server.public_url) {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                eprintln!("error: {e}");
                return Err(ExitCode::FAILURE);
            }
        },
    };
    match Tokens::load(config.auth.tokens_file.as_deref(), std::env::vars()) {
        Ok(t) => Ok((config, registry, Arc::new(t.with_oauth(oauth)))),
        Err(problems) => Err(report(&problems)),
    }
}

/// The command line's `--listen` and `--data-dir` over the configuration.
fn with_overrides(mut config: Config, listen: Option<SocketAddr>, data_dir: Option<PathBuf>) -> Config {
    if let Some(l) = listen {
        config.server.listen = l;
    }
    if let Some(d) = data_dir {
        config.storage.data_dir = d;
    }
    config
}

/// Configuration and registry, or every problem printed and exit code 1.
fn load(
    file: &Option<PathBuf>,
    devices: &Option<PathBuf>,
    starts_service: bool,
) -> Result<(Config, Registry), ExitCode> {
    load_with(file, Some(devices.as_ref()), starts_service)
}

/// [`load`], and the device files unless `devices` is `None` (the hub reads none: its
/// catalogue comes from the edges' births).
/// The configuration as `fieldgate hub` takes it: no device files, and a broker to read.
fn load_hub(file: &Option<PathBuf>, starts_service: bool) -> Result<(Config, Registry), ExitCode> {
    if let Ok(c) = Config::load(file.as_deref(), std::env::vars())
        && let Some(why) = fieldgate::config::hub::start_problem(&c.hub)
    {
        let source = file.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "(defaults)".into());
        return Err(report(&[Problem { source, line: 0, message: why.to_string() }]));
    }
    load_with(file, None, starts_service)
}

fn load_with(
    file: &Option<PathBuf>,
    devices: Option<Option<&PathBuf>>,
    starts_service: bool,
) -> Result<(Config, Registry), ExitCode> {
    let name = || file.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "(defaults)".into());
    let refused = |problems: &[Problem]| {
        tracing::warn!(
            target: "audit",
            event = "configuration_load",
            outcome = "refused",
            file = name(),
            problems = problems.len(),
            "configuration refused"
        );
        report(problems)
    };
    let mut config = Config::load(file.as_deref(), std::env::vars()).map_err(|e| refused(&e.0))?;
    if let Some(Some(dir)) = devices {
        config.devices.dir = dir.clone();
    }
    let registry = match devices {
        Some(_) => Registry::load(&config.devices.dir),
        None => Registry::from_texts(&[]),
    }
    .map_err(|e| refused(&e.0))?;
    if !starts_service {
        return Ok((config, registry));
    }
    tracing::info!(
        target: "audit",
        event = "configuration_load",
        outcome = "success",
        file = name(),
        devices = registry.devices().len(),
        tls = config.server.tls.is_some(),
        oauth = config.server.oauth.is_some(),
        "configuration loaded"
    );
    Ok((config, registry))
}

fn report(problems: &[Problem]) -> ExitCode {
    for p in problems {
        eprintln!("{p}");
    }
    eprintln!("{} problem(s); fieldgate will not start until they are fixed.", problems.len());
    ExitCode::FAILURE
}
