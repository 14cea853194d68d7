//! Running the service (`serve`, `mcp`, `demo`, all through [`crate::app::start`]) and
//! one tool call (`call`).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::Value;

use super::{connect, fail, out};
use crate::config::Config;
use crate::registry::Registry;
use crate::transport::auth::Tokens;

/// `fieldgate serve`: the service until SIGTERM or Ctrl-C, then a clean stop.
pub async fn serve(config: Config, registry: Registry, tokens: Arc<Tokens>) -> ExitCode {
    serve_until_stopped(config, Some(registry), tokens).await
}

/// `fieldgate hub`: the fleet hub until SIGTERM or Ctrl-C.
pub async fn hub(config: Config, tokens: Arc<Tokens>) -> ExitCode {
    serve_until_stopped(config, None, tokens).await
}

/// Serves the devices of `registry`, or the fleet (`None`), until a signal.
async fn serve_until_stopped(config: Config, registry: Option<Registry>, tokens: Arc<Tokens>) -> ExitCode {
    let mode = if registry.is_some() { "serve" } else { "hub" };
    let options =
        crate::app::Options { listen: Some(config.server.listen), listen_required: true, tokens, mode };
    let mut signals = super::StopSignal::listen();
    let scheme = if config.server.tls.is_some() { "https" } else { "http" };
    let started = match registry {
        Some(r) => crate::app::start(config, r, options).await,
        None => crate::app::start_hub(config, options).await,
    };
    let running = match started {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = running.addr.map(|a| a.to_string()).unwrap_or_default();
    tracing::info!(%addr, mode, "serving the HTTP API and MCP at /mcp");
    let what = if mode == "hub" { "fieldgate hub" } else { "fieldgate" };
    eprintln!("{what} listening on {scheme}://{addr} (MCP at /mcp)");
    let stopped = running.shutdown();
    tokio::select! {
        () = signals.received() => {}
        () = stopped.cancelled() => {}
    }
    // Stop accepting, let requests finish, and make the last history points durable.
    match running.stop().await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "demo")]
/// `fieldgate demo`: the simulated plant and the service over it, or its scripted tour.
pub async fn demo(
    config: Config,
    registry: Registry,
    tokens: std::sync::Arc<crate::transport::auth::Tokens>,
    listen: std::net::SocketAddr,
    data_dir: Option<std::path::PathBuf>,
    tour: bool,
) -> ExitCode {
    let mut signals = super::StopSignal::listen();
    let demo = match crate::demo::Demo::start_with(config, registry, listen, data_dir, tokens).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if tour {
        out(&format!("fieldgate demo tour against {}", demo.url()));
        let ok = crate::demo::tour(&demo, &mut |line: &str| out(line)).await;
        demo.stop().await;
        out(if ok { "\ntour complete" } else { "\ntour finished with unexpected answers" });
        return if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    out(&demo.banner());
    out("Ctrl-C stops the demo.");
    signals.received().await;
    demo.stop().await;
    ExitCode::SUCCESS
}

/// `fieldgate mcp`: the whole service with MCP on stdio, or a relay to the running
/// fieldgate that holds the data directory (or to `--url`), or, when neither can be had,
/// a JSON-RPC error for every request saying which process holds the directory and what
/// to run instead.
pub async fn mcp(
    config: crate::config::Config,
    registry: crate::registry::Registry,
    tokens: std::sync::Arc<crate::transport::auth::Tokens>,
    url: Option<String>,
    token: Option<String>,
) -> ExitCode {
    use crate::app::{Options, StartError};
    use crate::transport::bridge;
    let max_line = usize::try_from(config.server.max_body_bytes).unwrap_or(usize::MAX);
    if let Some(url) = url {
        return mcp_relay(&config, &url, token).await;
    }
    let options = Options { listen: Some(config.server.listen), listen_required: false, tokens, mode: "mcp" };
    let mut signals = StopSignal::listen();
    match crate::app::start(config, registry, options).await {
        Ok(running) => {
            match running.addr {
                Some(a) => tracing::info!(addr = %a, "also serving the HTTP API and MCP at /mcp"),
                None => tracing::info!("serving MCP over stdio only"),
            }
            let served = tokio::select! {
                r = crate::transport::mcp::serve_stdio(running.tools.clone()) => r,
                () = signals.received() => Ok(()),
            };
            let _ = running.stop().await;
            tracing::info!("stopped");
            exit_of(served)
        }
        Err(StartError::Held { owner: Some(crate::app::Owner { url: Some(url), .. }), .. }) => {
            exit_of(bridge::bridge_stdio(&url, token, max_line).await)
        }
        // Started at the same moment as the owner: its owner file follows within moments.
        Err(StartError::Held { dir, owner: None }) if let Some(url) = await_owner_url(&dir).await => {
            exit_of(bridge::bridge_stdio(&url, token, max_line).await)
        }
        Err(e @ StartError::Held { .. }) => {
            let message = e.to_string();
            tracing::error!(error = %message, "cannot serve MCP");
            exit_of(bridge::refuse_stdio(&message).await)
        }
        Err(e) => fail(1, &e.to_string()),
    }
}

/// `fieldgate mcp --url`: MCP on stdio relayed to a running service (no device files
/// needed here).
pub async fn mcp_relay(config: &Config, url: &str, token: Option<String>) -> ExitCode {
    let max_line = usize::try_from(config.server.max_body_bytes).unwrap_or(usize::MAX);
    exit_of(crate::transport::bridge::bridge_stdio(url, token, max_line).await)
}

/// The URL of the process holding `dir`, waiting a few seconds for its owner file (a
/// process that won the race to the data directory writes it once it listens).
async fn await_owner_url(dir: &Path) -> Option<String> {
    for _ in 0..30 {
        if let Some(o) = crate::app::owner_of(dir) {
            return o.url;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    None
}

fn exit_of(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(1, &format!("MCP over stdio stopped: {e}")),
    }
}

/// SIGTERM or SIGINT (Ctrl-C), listened for from the moment this is made. Make it before
/// the service starts: a stop sent as soon as the service says it is ready must be a
/// clean stop, not the signal's default action (an exit without the last flush).
pub struct StopSignal {
    #[cfg(unix)]
    unix: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl StopSignal {
    pub fn listen() -> StopSignal {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let unix = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(term), Ok(int)) => Some((term, int)),
                _ => None,
            };
            StopSignal { unix }
        }
        #[cfg(not(unix))]
        StopSignal {}
    }

    /// Waits for the signal.
    pub async fn received(&mut self) {
        #[cfg(unix)]
        if let Some((term, int)) = &mut self.unix {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `fieldgate call TOOL ARGS` when no running fieldgate answered for the data directory
/// ([`super::running_service`], asked first): one tool call over its stores in this
/// process, or through the owner they name. Never an answer made up from a store that
/// could not be opened: a held directory with no reachable owner is a structured,
/// retryable error saying which process holds it.
pub async fn call(
    config: crate::config::Config,
    registry: crate::registry::Registry,
    tool: &str,
    args: Value,
    token: Option<String>,
) -> ExitCode {
    use crate::app::StartError;
    let dir = crate::app::absolute(&config.storage.data_dir);
    if !dir.exists() {
        tracing::warn!(data_dir = %dir.display(), "no running fieldgate found: calling in this process, with a new data directory");
    }
    match crate::app::open_stores(&config, &dir) {
        Ok(stores) => {
            let service =
                crate::tools::ToolService::with_stores(std::sync::Arc::new(registry), config, stores);
            let answered = service.call(tool, args).await;
            // The server frees an OPC UA session now, not at its timeout.
            service.reader().close().await;
            match answered {
                Ok(envelope) => print_envelope(&serde_json::to_value(&envelope).unwrap_or_default()),
                Err(e) => {
                    let served: Vec<_> = service.served().map(|t| t.name()).collect();
                    fail(2, &format!("{e}; tools served: {}", served.join(", ")))
                }
            }
        }
        Err(StartError::Held { owner: Some(crate::app::Owner { url: Some(url), .. }), .. }) => {
            call_remote(&url, token, tool, &args).await
        }
        Err(e @ StartError::Held { .. }) => {
            let mut err = crate::tools::ToolError::storage_unavailable();
            err.message = format!("{}.", e.to_string().split(';').next().unwrap_or_default());
            err.hint =
                "Run this call against that service with --url http://HOST:PORT, or stop it and call again."
                    .into();
            let envelope = crate::tools::Envelope::failure(err, crate::tools::Meta::refusal(tool));
            print_envelope(&serde_json::to_value(&envelope).unwrap_or_default())
        }
        Err(e) => fail(1, &e.to_string()),
    }
}

/// `fieldgate call --url`: one tool call through a running service (no device files or
/// data directory needed here).
pub async fn call_remote(url: &str, token: Option<String>, tool: &str, args: &Value) -> ExitCode {
    let mut client = match connect(url, token).await {
        Ok(c) => c,
        Err((code, message)) => return fail(code, &message),
    };
    let body = serde_json::to_vec(args).unwrap_or_default();
    // Bounded: a hung service must not hold a script forever.
    let wait = std::time::Duration::from_secs(60);
    match tokio::time::timeout(wait, client.post(&format!("/v1/tools/{tool}"), &body)).await {
        Ok(Ok(r)) if r.json().get("ok").is_some() => print_envelope(&r.json()),
        Ok(Ok(r)) => fail(2, &format!("{url} answered HTTP {} without an envelope", r.status)),
        Ok(Err(e)) => fail(1, &format!("cannot reach {url}: {e}")),
        Err(_) => fail(1, &format!("{url} did not answer within {} s", wait.as_secs())),
    }
}

fn print_envelope(v: &Value) -> ExitCode {
    out(&serde_json::to_string_pretty(v).unwrap_or_default());
    if v["ok"] == true { ExitCode::SUCCESS } else { ExitCode::from(2) }
}
