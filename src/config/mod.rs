//! Service configuration: embedded defaults, an optional `--config` file, then
//! `FIELDGATE_<SECTION>_<KEY>` environment variables. Every problem in every source
//! is reported at once, with its file and line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::toml_reader::Problem;

pub mod hub;
pub mod mqtt;
mod read;
pub mod security;
pub mod webhook;
use read::{apply_env, apply_text};

/// The embedded defaults, the same text as `config/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Environment variables with the `FIELDGATE_` prefix that are not configuration keys.
/// Variables of fieldgate's that are not configuration keys: the log filter, and the
/// command line's own token (`--token`).
const NON_CONFIG_ENV: [&str; 5] = [
    "FIELDGATE_LOG",
    "FIELDGATE_CLI_TOKEN",
    // The command line's HTTPS client (`transport/service_url.rs`).
    "FIELDGATE_CA_FILE",
    "FIELDGATE_CLIENT_CERT_FILE",
    "FIELDGATE_CLIENT_KEY_FILE",
];
/// Prefix of environment variables that carry bearer tokens (see `transport::auth`).
pub const TOKEN_ENV_PREFIX: &str = "FIELDGATE_TOKEN_";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub devices: DevicesConfig,
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub storage: StorageConfig,
    pub calls: CallsConfig,
    pub breaker: BreakerConfig,
    pub history: HistoryConfig,
    pub work_orders: WorkOrdersConfig,
    pub alarms: AlarmsConfig,
    /// The Sparkplug B edge node (`mqtt.rs`).
    pub mqtt: mqtt::MqttConfig,
    /// The fleet hub, a Sparkplug B host application (`hub.rs`; `fieldgate hub`).
    pub hub: hub::HubConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DevicesConfig {
    /// Folder of device files.
    pub dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Address of the HTTP API and MCP over HTTP.
    pub listen: SocketAddr,
    /// Server-side limit on one HTTP request.
    pub request_timeout_ms: u64,
    /// A connection whose next request's headers are not complete this long after it
    /// began (or, on a kept-alive connection, after the last answer) is closed.
    pub header_timeout_ms: u64,
    /// Largest accepted request body.
    pub max_body_bytes: u64,
    /// Tool calls per minute per caller.
    pub rate_limit_per_minute: u64,
    /// Extra names accepted in the `Host` header.
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call the server.
    pub allowed_origins: Vec<String>,
    /// How long in-flight requests may take to finish on shutdown.
    pub shutdown_grace_ms: u64,
    /// MCP sessions (Streamable HTTP, protocols before 2026-07-28) open at once, at most.
    pub mcp_max_sessions: u64,
    /// An MCP session unused for this long is closed.
    pub mcp_session_idle_s: u64,
    /// The URL clients use (`https://host:port`); empty: none given.
    pub public_url: String,
    /// Plain HTTP on a non-loopback address, allowed only when this says so.
    pub allow_plaintext: bool,
    /// HTTPS on the listener (`security.rs`).
    pub tls: Option<security::TlsConfig>,
    /// Access tokens of an identity provider (`security.rs`).
    pub oauth: Option<security::OAuthConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// TOML file of `[[tokens]]`; empty for none.
    pub tokens_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StorageConfig {
    /// Where history and work orders are stored.
    pub data_dir: PathBuf,
    /// Longest time a history point may stay only in memory.
    pub flush_interval_ms: u64,
    /// Age after which history is dropped.
    pub retention_days: u64,
    /// Size cap of the history store.
    pub retention_max_mb: u64,
    /// History stops writing while the data directory's filesystem has less free space
    /// than the smaller of these two (work orders keep the room).
    pub reserve_mb: u64,
    pub reserve_percent: u8,
    /// History waiting in memory for a flush that can write it, at most (MB).
    pub unflushed_max_mb: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CallsConfig {
    /// Deadline of one tool call, retries included.
    pub deadline_ms: u64,
    /// Retries of a transient device failure inside one call.
    pub max_retries: u32,
    /// First backoff between retries.
    pub retry_backoff_ms: u64,
    /// Identical retryable failures in a row before `RETRY_LIMIT_REACHED`.
    pub repeat_failure_limit: u32,
    /// The window those failures are counted in.
    pub repeat_failure_window_s: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive transient failures that open the breaker.
    pub failure_threshold: u32,
    /// Failure share (percent) of the window that opens the breaker.
    pub failure_rate_percent: u32,
    /// Calls in the sliding window.
    pub window_size: u32,
    /// Calls needed in the window before the rate counts.
    pub min_calls: u32,
    /// First open period.
    pub open_ms: u64,
    /// Longest open period after repeated reopenings.
    pub max_open_ms: u64,
    /// A device down for longer than this: `CIRCUIT_OPEN` answers tell the agent to report it.
    pub report_down_after_s: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HistoryConfig {
    /// A flat value is still stored at least this often.
    pub max_silence_s: u64,
    pub backend: HistoryBackend,
    /// The environment variable holding the PostgreSQL URL (a secret, never a key).
    pub postgres_url_env: String,
    /// Certificate authorities (PEM) trusted for PostgreSQL's certificate besides the
    /// system's, with `sslmode=require` in the URL.
    pub postgres_ca_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlarmsConfig {
    /// Alarm journal entries (transitions) older than this many days are removed, once an
    /// hour; each alarm's current state is kept whatever its age.
    pub journal_days: u64,
    /// A device with alarms that has answered nothing for this long is its communication
    /// alarm (`DEVICE_ID.COMM`); 0: no communication alarms.
    pub comm_delay_s: u64,
}

impl Default for AlarmsConfig {
    fn default() -> Self {
        AlarmsConfig { journal_days: 365, comm_delay_s: 60 }
    }
}

/// Where history is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryBackend {
    /// The data directory's `history.redb`.
    Redb,
    /// A PostgreSQL database (the data directory keeps what waits to be written).
    Postgres,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WorkOrdersConfig {
    /// Pending work orders expire after this long.
    pub pending_ttl_hours: u64,
    /// `type:priority` pairs approved without a person.
    pub auto_approve: Vec<String>,
    /// Where approved orders are delivered (`http://` or `https://`); empty for none.
    pub webhook_url: String,
    /// Certificate authorities (PEM) trusted for an `https://` webhook besides the
    /// system's.
    pub webhook_ca_file: Option<PathBuf>,
    /// The environment variable that holds the webhook's secret; empty for none.
    pub webhook_auth_env: String,
    /// The header that carries the secret (`Authorization`: `Bearer <secret>`).
    pub webhook_auth_header: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            devices: DevicesConfig { dir: PathBuf::from("devices") },
            server: ServerConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
                request_timeout_ms: 10_000,
                header_timeout_ms: 30_000,
                max_body_bytes: 65_536,
                rate_limit_per_minute: 600,
                allowed_hosts: Vec::new(),
                allowed_origins: Vec::new(),
                shutdown_grace_ms: 10_000,
                mcp_max_sessions: 256,
                mcp_session_idle_s: 300,
                public_url: String::new(),
                allow_plaintext: false,
                tls: None,
                oauth: None,
            },
            auth: AuthConfig { tokens_file: None },
            storage: StorageConfig {
                data_dir: PathBuf::from("data"),
                flush_interval_ms: 1000,
                retention_days: 30,
                retention_max_mb: 1024,
                reserve_mb: 100,
                reserve_percent: 5,
                unflushed_max_mb: 64,
            },
            calls: CallsConfig {
                deadline_ms: 2000,
                max_retries: 2,
                retry_backoff_ms: 50,
                repeat_failure_limit: 3,
                repeat_failure_window_s: 300,
            },
            breaker: BreakerConfig {
                failure_threshold: 5,
                failure_rate_percent: 50,
                window_size: 20,
                min_calls: 10,
                open_ms: 5000,
                max_open_ms: 60_000,
                report_down_after_s: 600,
            },
            history: HistoryConfig {
                max_silence_s: 60,
                backend: HistoryBackend::Redb,
                postgres_url_env: "FIELDGATE_PG_URL".into(),
                postgres_ca_file: None,
            },
            alarms: AlarmsConfig::default(),
            work_orders: WorkOrdersConfig {
                pending_ttl_hours: 72,
                auto_approve: Vec::new(),
                webhook_url: String::new(),
                webhook_ca_file: None,
                webhook_auth_env: String::new(),
                webhook_auth_header: "Authorization".into(),
            },
            mqtt: mqtt::MqttConfig::default(),
            hub: hub::HubConfig::default(),
        }
    }
}

/// Configuration could not be loaded: every problem found.
#[derive(Debug, thiserror::Error)]
#[error("{} problem(s) in the configuration", .0.len())]
pub struct ConfigError(pub Vec<Problem>);

impl Config {
    /// Defaults, then `file` if given, then the environment variables in `env`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        let mut problems = Vec::new();
        problems.extend(apply_text(&mut cfg, "config/default.toml (embedded)", DEFAULT_TOML));
        if let Some(path) = file {
            let name = path.display().to_string();
            match crate::toml_reader::read_text_file(path) {
                Ok(text) => problems.extend(apply_text(&mut cfg, &name, &text)),
                Err(why) => problems.push(Problem {
                    source: name,
                    line: 0,
                    message: format!("cannot read the configuration file: {why}"),
                }),
            }
        }
        let env: Vec<(String, String)> = env.into_iter().collect();
        let mut config_env: Vec<_> = env.iter().filter(|(k, _)| k.starts_with("FIELDGATE_")).collect();
        config_env.sort();
        // The variable holding the webhook's secret may be named FIELDGATE_...: it is not
        // a configuration key, and its value must never reach a problem's message.
        let secret_var = config_env
            .iter()
            .find(|(k, _)| k == "FIELDGATE_WORK_ORDERS_WEBHOOK_AUTH_ENV")
            .map_or_else(|| cfg.work_orders.webhook_auth_env.clone(), |(_, v)| v.clone());
        // So may the variables holding the broker's user name and password.
        let mqtt_vars = mqtt::secret_vars("MQTT", &cfg.mqtt, &config_env);
        let hub_vars = mqtt::secret_vars("HUB", &cfg.hub.link, &config_env);
        // And the one holding the PostgreSQL URL.
        let pg_var = config_env
            .iter()
            .find(|(k, _)| k == "FIELDGATE_HISTORY_POSTGRES_URL_ENV")
            .map_or_else(|| cfg.history.postgres_url_env.clone(), |(_, v)| v.clone());
        for (key, value) in config_env {
            if NON_CONFIG_ENV.contains(&key.as_str())
                || key.starts_with(TOKEN_ENV_PREFIX)
                || *key == secret_var
                || mqtt_vars.contains(key)
                || hub_vars.contains(key)
                || *key == pg_var
            {
                continue;
            }
            problems.extend(apply_env(&mut cfg, key, value));
        }
        problems.extend(cfg.validate());
        let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let cross = webhook::secret_problem(&cfg.work_orders, var)
            .into_iter()
            .chain(mqtt::problems("mqtt", &cfg.mqtt, var))
            .chain(mqtt::problems("hub", &cfg.hub.link, var))
            .chain(history_problem(&cfg.history, var))
            .chain(security::problems(&cfg.server));
        problems.extend(cross.map(|message| Problem { source: "configuration".into(), line: 0, message }));
        if problems.is_empty() { Ok(cfg) } else { Err(ConfigError(problems)) }
    }

    /// Checks that hold across keys.
    fn validate(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let mut bad =
            |message: String| out.push(Problem { source: "configuration".into(), line: 0, message });
        let b = &self.breaker;
        if b.min_calls > b.window_size {
            bad(format!(
                "breaker.min_calls ({}) must not exceed breaker.window_size ({})",
                b.min_calls, b.window_size
            ));
        }
        if b.open_ms > b.max_open_ms {
            bad(format!(
                "breaker.open_ms ({}) must not exceed breaker.max_open_ms ({})",
                b.open_ms, b.max_open_ms
            ));
        }
        if self.calls.retry_backoff_ms >= self.calls.deadline_ms {
            bad(format!(
                "calls.retry_backoff_ms ({}) must be less than calls.deadline_ms ({})",
                self.calls.retry_backoff_ms, self.calls.deadline_ms
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests;

/// With `backend = "postgres"`, the variable `postgres_url_env` names must be set, to a
/// URL that reads (its value is never repeated: it holds a password).
fn history_problem(h: &HistoryConfig, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    if h.backend != HistoryBackend::Postgres {
        return None;
    }
    let var = &h.postgres_url_env;
    match env(var).filter(|v| !v.trim().is_empty()) {
        None => Some(format!(
            "history.backend is \"postgres\" but the environment variable {var} (history.postgres_url_env) is not set: set it to the database's URL, e.g. postgres://fieldgate@db.plant/fieldgate"
        )),
        Some(url) if url.parse::<tokio_postgres::Config>().is_err() => Some(format!(
            "the environment variable {var} (history.postgres_url_env) holds no PostgreSQL URL fieldgate can read (postgres://user@host:port/database, or host=... user=... dbname=...; sslmode disable, prefer or require)"
        )),
        Some(_) => None,
    }
}
