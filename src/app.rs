//! The one wiring point of a running fieldgate: `serve`, `mcp` and `demo` start here.
//!
//! [`start`] opens the data directory (history and work orders; only one process may hold
//! it), builds the tool service over them, starts polling, fieldgate's own probes, the
//! flush task and webhook delivery, serves the HTTP API (with MCP at `/mcp`) when asked,
//! and writes an owner file into the data directory saying which process holds it and
//! where it listens, so that other commands (`mcp`, `call`) can go through it instead.
//! [`Running::stop`] undoes it in order: stop accepting, let requests finish, stop the
//! tasks (the last history flush included) and remove the owner file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::registry::Registry;
use crate::store::HistoryStore;
use crate::store::alarm_journal::AlarmJournal;
use crate::store::history::Limits;
use crate::tools::ToolService;
use crate::transport::auth::Tokens;
use crate::transport::http;
use crate::transport::service_url::ServiceUrl;
use crate::transport::tls_listener::TlsListener;
use crate::work_orders::webhook::{Webhook, WebhookError};
use crate::work_orders::{WorkOrderError, WorkOrderStore};

/// The file a running fieldgate writes into its data directory.
pub const OWNER_FILE: &str = "fieldgate.owner.json";

/// Who holds a data directory, as its owner file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// `serve`, `mcp`, `demo` or `hub`.
    pub mode: String,
    /// Where its HTTP API (and `/mcp`) listens, if it does.
    pub url: Option<String>,
    pub started_at: String,
}

/// How to start.
pub struct Options {
    /// Serve the HTTP API and MCP at `/mcp` here; `None`: no listener.
    pub listen: Option<SocketAddr>,
    /// A listener that cannot bind stops the start (`serve`, `demo`), or is only logged
    /// (`mcp`, whose clients talk over stdio anyway).
    pub listen_required: bool,
    pub tokens: Arc<Tokens>,
    /// What the owner file says this process is.
    pub mode: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another fieldgate holds the data directory.
    #[error("{}", held_message(.dir, .owner.as_ref()))]
    Held { dir: PathBuf, owner: Option<Owner> },
    #[error("{0}")]
    Store(String),
    #[error("{0}")]
    Serve(#[from] http::ServeError),
    #[error("server.tls: {0}")]
    Tls(#[from] crate::transport::tls_listener::TlsError),
    #[error("{0}")]
    Webhook(#[from] WebhookError),
    #[error("{0}")]
    Sparkplug(#[from] crate::sparkplug::SparkplugError),
    #[error("{0}")]
    Hub(#[from] crate::hub::HubError),
}

/// Says who holds `dir` and what to run instead.
pub fn held_message(dir: &Path, owner: Option<&Owner>) -> String {
    match owner {
        Some(Owner { pid, mode, url: Some(url), .. }) => format!(
            "the data directory {} is held by a running fieldgate ({mode}, process {pid}) at {url}; ask it instead (--url {url}), or stop it",
            dir.display()
        ),
        Some(Owner { pid, mode, url: None, .. }) => format!(
            "the data directory {} is held by a running fieldgate ({mode}, process {pid}) that serves no HTTP; stop it, or give this command another data directory",
            dir.display()
        ),
        None => format!(
            "the data directory {} is held by another fieldgate process; stop it, pass --url of a running service, or give this command another data directory",
            dir.display()
        ),
    }
}

/// A running fieldgate.
pub struct Running {
    pub tools: ToolService,
    /// Where the HTTP API listens, when it does.
    pub addr: Option<SocketAddr>,
    pub data_dir: PathBuf,
    shutdown: CancellationToken,
    server: Option<JoinHandle<std::io::Result<()>>>,
    tasks: Vec<JoinHandle<()>>,
    owner_file: PathBuf,
}

/// The owner file of `dir`, if a process left one that parses.
pub fn owner_of(dir: &Path) -> Option<Owner> {
    let text = crate::toml_reader::read_text_file(&dir.join(OWNER_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// `dir` made absolute (clients start `fieldgate mcp` in folders of their choosing).
pub fn absolute(dir: &Path) -> PathBuf {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// The history and work-order stores of `dir`, or who holds them.
pub fn open_stores(config: &Config, dir: &Path) -> Result<crate::service::Stores, StartError> {
    let held = |e: &str| e.contains("in use by another fieldgate process");
    // A store held by another process names it; any other failure is the store's own.
    let refused = |e: String| {
        if held(&e) {
            StartError::Held { dir: dir.to_path_buf(), owner: owner_of(dir) }
        } else {
            StartError::Store(e)
        }
    };
    let history = HistoryStore::open_in(dir).map_err(|e| refused(e.to_string()))?;
    let orders = WorkOrderStore::open_in(dir).map_err(|e| match e {
        WorkOrderError::Refused(m) if held(&m) => {
            StartError::Held { dir: dir.to_path_buf(), owner: owner_of(dir) }
        }
        e => StartError::Store(e.to_string()),
    })?;
    let history = history.with_limits(Limits::of(&config.storage));
    let history = match config.history.backend {
        crate::config::HistoryBackend::Redb => {
            let waiting = history.outbox_waiting();
            if waiting > 0 {
                tracing::warn!(
                    chunks = waiting,
                    "history: chunks of this data directory wait for the PostgreSQL database it kept history in; with history.backend = \"redb\" they are not sent, and history written there is not read here"
                );
            }
            history
        }
        crate::config::HistoryBackend::Postgres => {
            // The loader checked that the variable is set; its value is a secret, read here.
            let url = std::env::var(&config.history.postgres_url_env).unwrap_or_default();
            let (pg, problem) =
                crate::store::pg::Pg::start(&url).map_err(|e| StartError::Store(e.to_string()))?;
            history.with_remote(pg, problem).map_err(|e| StartError::Store(e.to_string()))?
        }
    };
    // The alarm journal is read whole at start (every instance): one that does not read is
    // refused here, with the file named, not found out later.
    let alarms = AlarmJournal::open_in(dir)
        .and_then(|j| j.instances().map(|_| j))
        .map_err(|e| refused(e.to_string()))?;
    Ok(crate::service::Stores {
        history: Some(Arc::new(history)),
        work_orders: Some(Arc::new(orders)),
        alarms: Some(Arc::new(alarms)),
    })
}

/// The URL a command on this box reaches the service of `server` with: `public_url` when
/// it is served over TLS (its certificate names that host), else the listen address
/// (loopback for an unspecified one).
pub fn own_url(server: &crate::config::ServerConfig) -> ServiceUrl {
    if server.tls.is_some()
        && let Ok(u) = ServiceUrl::parse(&server.public_url)
    {
        return u;
    }
    let l = server.listen;
    let ip = match l.ip() {
        std::net::IpAddr::V4(a) if a.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(a) if a.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let host = match ip {
        std::net::IpAddr::V6(a) => format!("[{a}]"),
        v4 => v4.to_string(),
    };
    ServiceUrl { https: server.tls.is_some(), host, port: l.port() }
}

/// Starts fieldgate over `registry` as `config` and `options` say.
pub async fn start(config: Config, registry: Registry, options: Options) -> Result<Running, StartError> {
    start_with(config, registry, options, None).await
}

/// Starts the fleet hub (`fieldgate hub`): the same service, over the fleet's catalogue
/// (empty until the first births) instead of device files, its values from the broker.
pub async fn start_hub(config: Config, options: Options) -> Result<Running, StartError> {
    let empty = Registry::from_texts(&[]).map_err(|e| StartError::Store(e.to_string()))?;
    let hub = crate::hub::Hub::new(&config.hub);
    start_with(config, empty, options, Some(hub)).await
}

async fn start_with(
    mut config: Config,
    registry: Registry,
    options: Options,
    hub: Option<crate::hub::Hub>,
) -> Result<Running, StartError> {
    let data_dir = absolute(&config.storage.data_dir);
    if data_dir != config.storage.data_dir {
        tracing::info!(data_dir = %data_dir.display(), "data directory (resolved from a relative path)");
    }
    config.storage.data_dir = data_dir.clone();
    let webhook = Webhook::from_config(&config.work_orders, |name| std::env::var(name).ok())?;
    let stores = open_stores(&config, &data_dir)?;
    let orders = stores.work_orders.clone().ok_or_else(|| StartError::Store("work orders".into()))?;
    let tls = config.server.tls.as_ref().map(TlsListener::load).transpose()?.map(Arc::new);
    let exposure = http::Exposure {
        authenticated: !options.tokens.is_empty(),
        tls: tls.is_some(),
        allow_plaintext: config.server.allow_plaintext,
    };
    let listener = match options.listen {
        Some(addr) => match http::bind(addr, exposure).await {
            Ok(l) => Some(l),
            Err(e) if options.listen_required => return Err(e.into()),
            Err(error) => {
                tracing::warn!(%error, "no HTTP API in this process (MCP over stdio only)");
                None
            }
        },
        None => None,
    };
    let addr = listener.as_ref().and_then(|l| l.local_addr().ok());
    if let Some(a) = addr {
        config.server.listen = a;
    }
    let ttl = config.work_orders.pending_ttl_hours;
    let timeouts = http::Timeouts::of(&config.server);
    let registry = Arc::new(registry);
    let core = match &hub {
        Some(h) => crate::service::Core::fleet(registry.clone(), config, stores, h.drivers(&registry)),
        None => crate::service::Core::new(registry, config, stores),
    };
    let shutdown = CancellationToken::new();
    // The feed's consumers subscribe before its producers start; then it is sealed, so
    // their queues end when the producers stop. (The hub has no edge node of its own, and
    // nothing to poll: the poller keeps its history's flush and retention.)
    let sparkplug = match hub {
        Some(_) => None,
        None => crate::sparkplug::start(&core, |name| std::env::var(name).ok(), shutdown.clone())?,
    };
    let alarms = core.alarms.clone().filter(|a| a.any()).map(|a| {
        let rx = core.feed.subscribe(ALARM_QUEUE, a.lost.clone());
        tokio::spawn(a.run(core.reader.clone(), rx))
    });
    let mut tasks = crate::poller::start(&core, shutdown.clone());
    core.feed.seal();
    tasks.extend(alarms);
    tasks.extend(sparkplug.map(|s| s.task));
    let tools = ToolService::over(core);
    if let Some(h) = hub {
        let (task, _) = crate::hub::start(h, &tools, |name| std::env::var(name).ok(), shutdown.clone())?;
        tasks.push(task);
    }
    tasks.push(crate::work_orders::delivery::start(orders, webhook, ttl, shutdown.clone()));
    let counted = options.tokens.clone();
    tools.core().metrics.collect("auth", move |s| counted.report(s));
    if let Some(oauth) = options.tokens.oauth() {
        let (reported, fetching) = (oauth.clone(), oauth.clone());
        tools.core().metrics.collect("oauth", move |s| reported.report(s));
        tasks.push(tokio::spawn(async move { fetching.prefetch().await }));
    }
    let tls = tls.filter(|_| listener.is_some());
    if let Some(t) = &tls {
        let watched = t.clone();
        tools.core().metrics.collect("tls", move |s| watched.report(s));
        tasks.push(t.clone().watch(shutdown.clone()));
    } else {
        // SIGHUP reloads the certificate when there is one; without, it must not end the
        // process (its default action), whatever a service manager sends.
        tasks.push(ignore_sighup(shutdown.clone()));
    }
    let server = listener.map(|l| serve_http(l, &tools, options.tokens.clone(), timeouts, &shutdown, tls));
    let owner = Owner {
        pid: std::process::id(),
        mode: options.mode.to_string(),
        url: addr.map(|_| own_url(&tools.config().server).to_string()),
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    };
    let owner_file = data_dir.join(OWNER_FILE);
    if let Err(error) = std::fs::write(&owner_file, serde_json::to_vec_pretty(&owner).unwrap_or_default()) {
        tracing::warn!(file = %owner_file.display(), error = %error.kind(), "cannot write the owner file; other commands will not find this process");
    }
    Ok(Running { tools, addr, data_dir, shutdown, server, tasks, owner_file })
}

/// Batches of samples the alarm engine's queue holds (a poll of a device is one batch;
/// evaluating one takes microseconds, so it fills only when the journal's disk stalls).
const ALARM_QUEUE: usize = 4096;

/// Takes SIGHUP with nothing to reload: a log line, the process goes on.
fn ignore_sighup(stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        #[cfg(unix)]
        if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = hup.recv() => tracing::info!("SIGHUP: nothing to reload (no [server.tls])"),
                }
            }
        }
        #[cfg(not(unix))]
        stop.cancelled().await;
    })
}

/// Serves the HTTP API of `tools` (MCP at `/mcp`, the console at `/console`) on
/// `listener` until `shutdown` is cancelled: the one place the server is assembled, used
/// by [`start`] and by the tests and benches that serve a tool service of their own.
pub fn serve_http(
    listener: tokio::net::TcpListener,
    tools: &ToolService,
    tokens: Arc<Tokens>,
    timeouts: http::Timeouts,
    shutdown: &CancellationToken,
    tls: Option<Arc<TlsListener>>,
) -> JoinHandle<std::io::Result<()>> {
    let app = router(tools, tokens, shutdown);
    let stop = shutdown.clone();
    tokio::spawn(http::serve(
        listener,
        app,
        async move { stop.cancelled().await },
        timeouts,
        shutdown.clone(),
        tls,
    ))
}

/// The HTTP application of `tools`: the API and MCP (`transport/`) with the console's pages
/// mounted at `/console`.
pub fn router(tools: &ToolService, tokens: Arc<Tokens>, shutdown: &CancellationToken) -> axum::Router {
    let console = crate::console::Console::new(tools.clone(), tokens.clone(), shutdown.clone());
    let pages = http::Pages { prefix: "/console", refusal: crate::console::refusal_page };
    http::app(tools.clone(), tokens, shutdown.clone(), Some((pages, console.router())))
}

impl Running {
    /// Cancelled when the service stops (also by a request's failure to serve).
    pub fn shutdown(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops accepting, lets requests in flight finish (within the grace period), stops
    /// polling and delivery after a last history flush, and removes the owner file.
    /// Returns the HTTP server's outcome.
    pub async fn stop(self) -> std::io::Result<()> {
        self.shutdown.cancel();
        let served = match self.server {
            Some(s) => s.await.unwrap_or(Ok(())),
            None => Ok(()),
        };
        for t in self.tasks {
            let _ = t.await;
        }
        self.tools.reader().close().await;
        // Only our own: a later owner may have replaced it.
        if owner_of(&self.data_dir).is_some_and(|o| o.pid == std::process::id()) {
            let _ = std::fs::remove_file(&self.owner_file);
        }
        served
    }
}
