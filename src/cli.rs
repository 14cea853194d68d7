//! The operators' commands `fieldgate work-orders` and `fieldgate devices`: against the
//! data directory when no service holds it, or through a running service (`--url`), with
//! one output either way (a table or a block for people, `--json` for machines).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use crate::tools::defs::WorkOrder;
use crate::tools::work_orders::render;
use crate::transport::client::{HttpClient, HttpResponse};
use crate::work_orders::{Action, WorkOrderError, WorkOrderStatus, WorkOrderStore};

/// Where a command runs.
pub enum Target {
    /// The data directory, opened by this process.
    Local { data_dir: PathBuf, webhook_configured: bool },
    /// A running service.
    Remote { url: String, token: Option<String> },
}

/// What a work-order command asks.
pub struct WorkOrderCommand {
    pub action: String,
    pub id: Option<String>,
    pub note: Option<String>,
    pub by: Option<String>,
    pub json: bool,
}

enum Answer {
    List(Vec<WorkOrder>),
    One(Box<WorkOrder>),
}

/// Prints a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn out(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn fail(code: u8, message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(code)
}

fn transition_of(action: &str) -> Result<Option<WorkOrderStatus>, String> {
    if matches!(action, "list" | "show") {
        return Ok(None);
    }
    Action::named(action)
        .map(|a| Some(a.target()))
        .ok_or_else(|| format!("unknown action {action:?}; use list, show, {}", Action::NAMES))
}

/// `fieldgate work-orders ACTION [ID]`.
pub async fn work_orders(target: Target, cmd: WorkOrderCommand) -> ExitCode {
    let to = match transition_of(&cmd.action) {
        Ok(t) => t,
        Err(e) => return fail(2, &e),
    };
    if cmd.action != "list" && cmd.id.is_none() {
        return fail(2, &format!("{} needs a work order ID, e.g. WO-000001", cmd.action));
    }
    let answer = match target {
        Target::Local { data_dir, webhook_configured } => local(&data_dir, &cmd, to, webhook_configured),
        Target::Remote { url, token } => remote_work_orders(&url, token, &cmd).await,
    };
    match answer {
        Ok(a) => {
            print_answer(&a, cmd.json);
            ExitCode::SUCCESS
        }
        Err((code, message)) => fail(code, &message),
    }
}

fn local(
    data_dir: &Path,
    cmd: &WorkOrderCommand,
    to: Option<WorkOrderStatus>,
    webhook_configured: bool,
) -> Result<Answer, (u8, String)> {
    let file = data_dir.join("work_orders.redb");
    // Reading never creates a data directory or a store.
    if to.is_none() && !file.exists() {
        return match cmd.action.as_str() {
            "list" => Ok(Answer::List(Vec::new())),
            _ => Err((
                2,
                format!("no work order {} (no store at {})", cmd.id.as_deref().unwrap_or(""), file.display()),
            )),
        };
    }
    let store = WorkOrderStore::open_in(data_dir).map_err(|e| match &e {
        WorkOrderError::Refused(m) if m.contains("in use by another fieldgate process") => {
            let id = cmd.id.as_deref().map(|i| format!(" {i}")).unwrap_or_default();
            let hint = match crate::app::owner_of(data_dir).and_then(|o| o.url) {
                Some(url) => format!(
                    "ask it instead: fieldgate work-orders {}{id} --url {url} (deciding needs an operator token in FIELDGATE_CLI_TOKEN)",
                    cmd.action
                ),
                None => "ask it with --url http://HOST:PORT (where it listens), or stop it".to_string(),
            };
            (1, format!("{} is held by a running fieldgate; {hint}", file.display()))
        }
        _ => (1, e.to_string()),
    })?;
    let id = cmd.id.clone().unwrap_or_default();
    let by = cmd.by.clone().or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "operator".into());
    // Shown as the tools show it (with no webhook configured, delivery says so).
    let one = |o| Answer::One(Box::new(render(o, webhook_configured)));
    let result = match (cmd.action.as_str(), to) {
        ("list", _) => {
            store.list().map(|l| Answer::List(l.into_iter().map(|o| render(o, webhook_configured)).collect()))
        }
        (_, None) => store.get(&id).map(one),
        (_, Some(to)) => store.transition(&id, to, &by, cmd.note.clone()).map(one),
    };
    result.map_err(|e| (2, e.to_string()))
}

/// A client of the running service at `url`.
pub async fn connect(url: &str, token: Option<String>) -> Result<HttpClient, (u8, String)> {
    let Some(authority) = url.strip_prefix("http://").map(|r| r.trim_end_matches('/')) else {
        return Err((2, "--url must be http://host:port".into()));
    };
    let Some(addr) = tokio::net::lookup_host(authority).await.ok().and_then(|mut a| a.next()) else {
        return Err((1, format!("cannot resolve {authority}")));
    };
    let client = HttpClient::connect(addr).await.map_err(|e| (1, format!("cannot reach {url}: {e}")))?;
    Ok(match &token {
        Some(t) => client.with_token(t),
        None => client,
    })
}

/// The data of an envelope, or its error as one line for a person.
fn data_of(r: std::io::Result<HttpResponse>) -> Result<Value, (u8, String)> {
    let r = r.map_err(|e| (1, e.to_string()))?;
    let v = r.json();
    if v["ok"] == true {
        return Ok(v["data"].clone());
    }
    let e = &v["error"];
    match (e["code"].as_str(), e["message"].as_str()) {
        (Some(code), Some(message)) => {
            let hint = match code {
                // The agent's words are not the right ones for a person at the command line.
                "UNAUTHORIZED" | "FORBIDDEN" => " This needs an operator token: pass it with --token or FIELDGATE_CLI_TOKEN (the service knows it from FIELDGATE_TOKEN_<NAME>=operator:<token> or its tokens file).".to_string(),
                _ => e["hint"].as_str().map(|h| format!(" {h}")).unwrap_or_default(),
            };
            Err((2, format!("{message} ({code}).{hint}")))
        }
        _ => Err((1, format!("unexpected answer (HTTP {})", r.status))),
    }
}

async fn remote_work_orders(
    url: &str,
    token: Option<String>,
    cmd: &WorkOrderCommand,
) -> Result<Answer, (u8, String)> {
    let mut client = connect(url, token).await?;
    let id = cmd.id.clone().unwrap_or_default();
    let data = match cmd.action.as_str() {
        "list" => data_of(client.get("/v1/work-orders?limit=500").await)?,
        "show" => data_of(client.get(&format!("/v1/work-orders/{id}")).await)?,
        action => {
            let body = serde_json::to_vec(&serde_json::json!({ "note": cmd.note })).unwrap_or_default();
            data_of(client.post(&format!("/v1/work-orders/{id}/{action}"), &body).await)?
        }
    };
    let bad = |_| (1, "the service answered work orders in an unexpected shape".to_string());
    match cmd.action.as_str() {
        "list" => serde_json::from_value(data["work_orders"].clone()).map(Answer::List).map_err(bad),
        _ => {
            serde_json::from_value(data["work_order"].clone()).map(|o| Answer::One(Box::new(o))).map_err(bad)
        }
    }
}

fn print_answer(a: &Answer, json: bool) {
    match (a, json) {
        (Answer::List(list), true) => out(&serde_json::to_string_pretty(list).unwrap_or_default()),
        (Answer::One(o), true) => out(&serde_json::to_string_pretty(o).unwrap_or_default()),
        (Answer::List(list), false) if list.is_empty() => out("no work orders"),
        (Answer::List(list), false) => {
            out(&format!(
                "{:<9}  {:<16} {:<12} {:<7} {:<24}  summary",
                "id", "status", "sensor", "priority", "created"
            ));
            for o in list {
                out(&format!(
                    "{:<9}  {:<16} {:<12} {:<7} {:<24}  {}",
                    o.id,
                    o.status.as_str(),
                    o.sensor_id,
                    o.priority.as_str(),
                    o.created_at,
                    o.summary
                ));
            }
        }
        (Answer::One(o), false) => {
            out(&format!(
                "{}  {}  {} {} on {}",
                o.id,
                o.status.as_str(),
                o.priority.as_str(),
                o.work_type.as_str(),
                o.sensor_id
            ));
            out(&format!("  {}", o.summary));
            out(&format!("  created {} by {}", o.created_at, o.created_by));
            for t in &o.history {
                let note = t.note.as_deref().map(|n| format!(": {n}")).unwrap_or_default();
                out(&format!("  {}  {} by {}{note}", t.at, t.to.as_str(), t.by));
            }
            if let Some(d) = &o.delivery {
                out(&format!("  delivery {} ({} attempts)", d.state, d.attempts));
            }
        }
    }
}

/// `fieldgate devices status|probe ... --url`: a running service's device status and an
/// operator's probe; prints the envelope's data as JSON.
pub async fn devices_remote(url: &str, token: Option<String>, action: &str, id: Option<String>) -> ExitCode {
    let mut client = match connect(url, token).await {
        Ok(c) => c,
        Err((code, message)) => return fail(code, &message),
    };
    let response = match (action, id) {
        ("status", None) => client.get("/v1/devices").await,
        ("status", Some(id)) => client.get(&format!("/v1/devices/{id}")).await,
        ("probe", Some(id)) => client.post(&format!("/v1/devices/{id}/probe"), b"").await,
        _ => return fail(2, "use `devices status [ID]` or `devices probe ID`"),
    };
    match data_of(response) {
        Ok(data) => {
            out(&serde_json::to_string_pretty(&data).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err((code, message)) => fail(code, &message),
    }
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
        return exit_of(bridge::bridge_stdio(&url, token, max_line).await);
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

/// `fieldgate call TOOL ARGS`: one tool call over the data directory's stores, or through
/// the running fieldgate that holds them (or `--url`). Never an answer made up from a store
/// that could not be opened: a held directory with no reachable owner is a structured,
/// retryable error saying which process holds it.
pub async fn call(
    config: crate::config::Config,
    registry: crate::registry::Registry,
    tool: &str,
    args: Value,
    url: Option<String>,
    token: Option<String>,
) -> ExitCode {
    use crate::app::StartError;
    let url = match url {
        Some(u) => Some(u),
        None => {
            let dir = crate::app::absolute(&config.storage.data_dir);
            match crate::app::open_stores(&config, &dir) {
                Ok((history, orders)) => {
                    let stores = crate::tools::Stores {
                        history: Some(std::sync::Arc::new(history)),
                        work_orders: Some(std::sync::Arc::new(orders)),
                    };
                    let service =
                        crate::tools::ToolService::with_stores(std::sync::Arc::new(registry), config, stores);
                    let answered = service.call(tool, args).await;
                    // The server frees an OPC UA session now, not at its timeout.
                    service.reader().close().await;
                    return match answered {
                        Ok(envelope) => print_envelope(&serde_json::to_value(&envelope).unwrap_or_default()),
                        Err(e) => {
                            let served: Vec<_> = service.served().map(|t| t.name()).collect();
                            fail(2, &format!("{e}; tools served: {}", served.join(", ")))
                        }
                    };
                }
                Err(StartError::Held { owner: Some(crate::app::Owner { url: Some(url), .. }), .. }) => {
                    Some(url)
                }
                Err(e @ StartError::Held { .. }) => {
                    let mut err = crate::tools::ToolError::storage_unavailable();
                    err.message = format!("{}.", e.to_string().split(';').next().unwrap_or_default());
                    err.hint = "Run this call against that service with --url http://HOST:PORT, or stop it and call again.".into();
                    let meta = crate::tools::Meta {
                        call_id: String::new(),
                        tool: tool.to_string(),
                        duration_ms: 0.0,
                        attempts: 0,
                    };
                    let envelope = crate::tools::Envelope::failure(err, meta);
                    return print_envelope(&serde_json::to_value(&envelope).unwrap_or_default());
                }
                Err(e) => return fail(1, &e.to_string()),
            }
        }
    };
    let Some(url) = url else { return fail(1, "no service to ask") };
    let mut client = match connect(&url, token).await {
        Ok(c) => c,
        Err((code, message)) => return fail(code, &message),
    };
    let body = serde_json::to_vec(&args).unwrap_or_default();
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
