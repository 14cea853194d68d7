//! Service configuration: embedded defaults, an optional `--config` file, then
//! `FIELDGATE_<SECTION>_<KEY>` environment variables. Every problem in every source
//! is reported at once, with its file and line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::toml_reader::{Doc, Problem, Table};

/// The embedded defaults, the same text as `config/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Environment variables with the `FIELDGATE_` prefix that are not configuration keys.
/// Variables of fieldgate's that are not configuration keys: the log filter, and the
/// command line's own token (`--token`).
const NON_CONFIG_ENV: [&str; 2] = ["FIELDGATE_LOG", "FIELDGATE_CLI_TOKEN"];
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
    /// The Sparkplug B edge node (`crate::sparkplug::config`).
    pub mqtt: crate::sparkplug::config::MqttConfig,
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
            history: HistoryConfig { max_silence_s: 60 },
            work_orders: WorkOrdersConfig {
                pending_ttl_hours: 72,
                auto_approve: Vec::new(),
                webhook_url: String::new(),
                webhook_ca_file: None,
                webhook_auth_env: String::new(),
                webhook_auth_header: "Authorization".into(),
            },
            mqtt: crate::sparkplug::config::MqttConfig::default(),
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
        let mqtt_vars = crate::sparkplug::config::secret_vars(&cfg.mqtt, &config_env);
        for (key, value) in config_env {
            if NON_CONFIG_ENV.contains(&key.as_str())
                || key.starts_with(TOKEN_ENV_PREFIX)
                || *key == secret_var
                || mqtt_vars.contains(key)
            {
                continue;
            }
            problems.extend(apply_env(&mut cfg, key, value));
        }
        problems.extend(cfg.validate());
        let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let cross = crate::work_orders::webhook::secret_problem(&cfg.work_orders, var)
            .into_iter()
            .chain(crate::sparkplug::config::problems(&cfg.mqtt, var));
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

/// `FIELDGATE_SERVER_LISTEN=...` becomes `[server] listen = ...` and is applied.
fn apply_env(cfg: &mut Config, key: &str, value: &str) -> Vec<Problem> {
    let name = format!("environment variable {key}");
    let rest = &key["FIELDGATE_".len()..];
    let lower = rest.to_ascii_lowercase();
    let section = SECTIONS.iter().find(|s| lower.starts_with(&format!("{s}_")));
    let Some(section) = section else {
        return vec![Problem {
            source: name,
            line: 0,
            message: format!(
                "not a configuration key: the name must be FIELDGATE_<SECTION>_<KEY> with SECTION one of {}",
                SECTIONS.join(", ").to_ascii_uppercase()
            ),
        }];
    };
    let field = &lower[section.len() + 1..];
    // A value that is valid TOML (a number, a boolean, a quoted string) is taken as
    // such; anything else is a plain string.
    let is_toml = toml::de::DeValue::parse(value).is_ok();
    let literal =
        if is_toml { value.to_string() } else { toml::Value::String(value.to_string()).to_string() };
    let text = format!("[{section}]\n{field} = {literal}\n");
    let mut problems = apply_text(cfg, &name, &text);
    for p in &mut problems {
        p.line = 0;
    }
    problems
}

const SECTIONS: [&str; 9] =
    ["devices", "server", "auth", "storage", "calls", "breaker", "history", "work_orders", "mqtt"];

fn apply_text(cfg: &mut Config, name: &str, text: &str) -> Vec<Problem> {
    let doc = Doc::new(name, text);
    if let Some(root) = doc.parse(text) {
        apply(&Table::root(&doc, &root), cfg);
    }
    doc.into_problems()
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

fn apply(t: &Table<'_, '_>, c: &mut Config) {
    const DAY_MS: i64 = 86_400_000;
    if let Some(s) = t.table("devices") {
        set(&mut c.devices.dir, s.str("dir").filter(|d| !d.is_empty()).map(PathBuf::from));
        s.finish();
    }
    if let Some(s) = t.table("server") {
        let listen = s.str("listen").and_then(|v| match v.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                s.problem("listen", format!("must be ip:port, e.g. \"127.0.0.1:8080\", found {v:?}"));
                None
            }
        });
        set(&mut c.server.listen, listen);
        set(&mut c.server.request_timeout_ms, s.int("request_timeout_ms", 100..=600_000).map(|v| v as u64));
        set(&mut c.server.max_body_bytes, s.int("max_body_bytes", 1024..=16 << 20).map(|v| v as u64));
        set(
            &mut c.server.rate_limit_per_minute,
            s.int("rate_limit_per_minute", 1..=1_000_000).map(|v| v as u64),
        );
        set(&mut c.server.allowed_hosts, s.strings("allowed_hosts"));
        let origins = s.strings("allowed_origins").filter(|list| {
            let bad: Vec<&String> =
                list.iter().filter(|o| !(o.starts_with("http://") || o.starts_with("https://"))).collect();
            if !bad.is_empty() {
                s.problem(
                    "allowed_origins",
                    format!("origins start with http:// or https://, found {bad:?}"),
                );
            }
            bad.is_empty()
        });
        set(&mut c.server.allowed_origins, origins);
        set(&mut c.server.shutdown_grace_ms, s.int("shutdown_grace_ms", 0..=600_000).map(|v| v as u64));
        set(&mut c.server.header_timeout_ms, s.int("header_timeout_ms", 100..=600_000).map(|v| v as u64));
        set(&mut c.server.mcp_max_sessions, s.int("mcp_max_sessions", 1..=100_000).map(|v| v as u64));
        set(&mut c.server.mcp_session_idle_s, s.int("mcp_session_idle_s", 1..=86_400).map(|v| v as u64));
        s.finish();
    }
    if let Some(s) = t.table("auth") {
        if let Some(f) = s.str("tokens_file") {
            c.auth.tokens_file = (!f.is_empty()).then(|| PathBuf::from(f));
        }
        s.finish();
    }
    if let Some(s) = t.table("storage") {
        set(&mut c.storage.data_dir, s.str("data_dir").filter(|d| !d.is_empty()).map(PathBuf::from));
        set(&mut c.storage.flush_interval_ms, s.int("flush_interval_ms", 10..=60_000).map(|v| v as u64));
        set(&mut c.storage.retention_days, s.int("retention_days", 1..=3650).map(|v| v as u64));
        set(&mut c.storage.retention_max_mb, s.int("retention_max_mb", 1..=1 << 20).map(|v| v as u64));
        set(&mut c.storage.reserve_mb, s.int("reserve_mb", 0..=1 << 20).map(|v| v as u64));
        set(&mut c.storage.reserve_percent, s.int("reserve_percent", 0..=50).map(|v| v as u8));
        set(&mut c.storage.unflushed_max_mb, s.int("unflushed_max_mb", 1..=4096).map(|v| v as u64));
        s.finish();
    }
    if let Some(s) = t.table("calls") {
        set(&mut c.calls.deadline_ms, s.int("deadline_ms", 10..=60_000).map(|v| v as u64));
        set(&mut c.calls.max_retries, s.int("max_retries", 0..=5).map(|v| v as u32));
        set(&mut c.calls.retry_backoff_ms, s.int("retry_backoff_ms", 1..=10_000).map(|v| v as u64));
        set(&mut c.calls.repeat_failure_limit, s.int("repeat_failure_limit", 1..=100).map(|v| v as u32));
        set(
            &mut c.calls.repeat_failure_window_s,
            s.int("repeat_failure_window_s", 1..=86_400).map(|v| v as u64),
        );
        s.finish();
    }
    if let Some(s) = t.table("breaker") {
        set(&mut c.breaker.failure_threshold, s.int("failure_threshold", 1..=1000).map(|v| v as u32));
        set(&mut c.breaker.failure_rate_percent, s.int("failure_rate_percent", 1..=100).map(|v| v as u32));
        set(&mut c.breaker.window_size, s.int("window_size", 1..=1000).map(|v| v as u32));
        set(&mut c.breaker.min_calls, s.int("min_calls", 1..=1000).map(|v| v as u32));
        set(&mut c.breaker.open_ms, s.int("open_ms", 10..=DAY_MS).map(|v| v as u64));
        set(&mut c.breaker.max_open_ms, s.int("max_open_ms", 10..=DAY_MS).map(|v| v as u64));
        set(
            &mut c.breaker.report_down_after_s,
            s.int("report_down_after_s", 1..=30 * 86_400).map(|v| v as u64),
        );
        s.finish();
    }
    if let Some(s) = t.table("history") {
        set(&mut c.history.max_silence_s, s.int("max_silence_s", 1..=86_400).map(|v| v as u64));
        s.finish();
    }
    if let Some(s) = t.table("work_orders") {
        set(&mut c.work_orders.pending_ttl_hours, s.int("pending_ttl_hours", 1..=8760).map(|v| v as u64));
        let pairs = s.strings("auto_approve").filter(|list| {
            use crate::work_orders::{Priority, WorkOrderType};
            let known = |t: &str, q: &str| {
                WorkOrderType::ALL.iter().any(|x| x.as_str() == t)
                    && Priority::ALL.iter().any(|x| x.as_str() == q)
            };
            let bad: Vec<&String> =
                list.iter().filter(|p| !p.split_once(':').is_some_and(|(t, q)| known(t, q))).collect();
            if !bad.is_empty() {
                s.problem(
                    "auto_approve",
                    format!("entries are \"type:priority\" such as \"inspection:low\", found {bad:?}"),
                );
            }
            bad.is_empty()
        });
        set(&mut c.work_orders.auto_approve, pairs);
        crate::work_orders::webhook::read_keys(&s, &mut c.work_orders);
        s.finish();
    }
    if let Some(s) = t.table("mqtt") {
        crate::sparkplug::config::read_keys(&s, &mut c.mqtt);
        s.finish();
    }
    t.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_equals_code_defaults() {
        // The embedded file is the documentation of every key; it must not drift.
        let cfg = Config::load(None, []).unwrap();
        assert_eq!(cfg, Config::default());
    }

    #[test]
    fn default_file_sets_every_key() {
        // Change every default in code; applying the file must restore all of them.
        let mut c = Config::default();
        c.devices.dir = "x".into();
        c.server = ServerConfig {
            listen: "1.2.3.4:1".parse().unwrap(),
            request_timeout_ms: 1,
            header_timeout_ms: 1,
            max_body_bytes: 1,
            rate_limit_per_minute: 1,
            allowed_hosts: vec!["x".into()],
            allowed_origins: vec!["http://x".into()],
            shutdown_grace_ms: 1,
            mcp_max_sessions: 1,
            mcp_session_idle_s: 1,
        };
        c.auth.tokens_file = Some("x".into());
        c.storage = StorageConfig {
            data_dir: "x".into(),
            flush_interval_ms: 1,
            retention_days: 1,
            retention_max_mb: 1,
            reserve_mb: 1,
            reserve_percent: 1,
            unflushed_max_mb: 1,
        };
        c.calls = CallsConfig {
            deadline_ms: 1,
            max_retries: 9,
            retry_backoff_ms: 1,
            repeat_failure_limit: 1,
            repeat_failure_window_s: 1,
        };
        c.breaker = BreakerConfig {
            failure_threshold: 1,
            failure_rate_percent: 1,
            window_size: 1,
            min_calls: 1,
            open_ms: 1,
            max_open_ms: 1,
            report_down_after_s: 1,
        };
        c.history.max_silence_s = 1;
        c.work_orders.pending_ttl_hours = 1;
        c.work_orders.auto_approve = vec!["x".into()];
        c.work_orders.webhook_url = "x".into();
        c.work_orders.webhook_ca_file = Some("x".into());
        c.work_orders.webhook_auth_env = "X".into();
        c.work_orders.webhook_auth_header = "X".into();
        c.mqtt = crate::sparkplug::config::MqttConfig::every_key_changed();
        assert!(apply_text(&mut c, "d", DEFAULT_TOML).is_empty());
        assert_eq!(c, Config::default());
    }

    #[test]
    fn env_overrides_file() {
        let env = [
            ("FIELDGATE_SERVER_LISTEN".to_string(), "127.0.0.1:9999".to_string()),
            ("FIELDGATE_CALLS_DEADLINE_MS".to_string(), "3000".to_string()),
            ("FIELDGATE_LOG".to_string(), "debug".to_string()),
            ("FIELDGATE_CLI_TOKEN".to_string(), "abcdefghijklmnop1234".to_string()),
            ("PATH".to_string(), "/bin".to_string()),
        ];
        let cfg = Config::load(None, env).unwrap();
        assert_eq!(cfg.server.listen.port(), 9999);
        assert_eq!(cfg.calls.deadline_ms, 3000);
    }

    #[test]
    fn reports_every_problem_with_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(
            &path,
            "[server]\nlisten = \"localhost\"\nmax_body_bytes = \"big\"\n\n[breaker]\nopen_ms = 5\nfailur_threshold = 3\n[nope]\n",
        )
        .unwrap();
        let env = [
            ("FIELDGATE_CALLS_DEADLINE_MS".to_string(), "soon".to_string()),
            ("FIELDGATE_SEVER_LISTEN".to_string(), "x".to_string()),
        ];
        let err = Config::load(Some(&path), env).unwrap_err();
        let prefix = format!("{}/", dir.path().display());
        let text: Vec<String> = err.0.iter().map(|p| p.to_string().replace(&prefix, "")).collect();
        assert_eq!(
            text,
            [
                r#"bad.toml:2: `listen` in [server]: must be ip:port, e.g. "127.0.0.1:8080", found "localhost""#,
                "bad.toml:3: `max_body_bytes` in [server]: must be an integer, found a string",
                "bad.toml:6: `open_ms` in [breaker]: must be between 10 and 86400000, found 5",
                "bad.toml:7: unknown key `failur_threshold` in [breaker]; did you mean `failure_threshold`?",
                "bad.toml:8: unknown key `nope`",
                "environment variable FIELDGATE_CALLS_DEADLINE_MS: `deadline_ms` in [calls]: must be an integer, found a string",
                "environment variable FIELDGATE_SEVER_LISTEN: not a configuration key: the name must be \
                 FIELDGATE_<SECTION>_<KEY> with SECTION one of DEVICES, SERVER, AUTH, STORAGE, CALLS, BREAKER, \
                 HISTORY, WORK_ORDERS, MQTT",
            ]
        );
    }

    #[test]
    fn mcp_session_keys_are_checked() {
        let env = [
            ("FIELDGATE_SERVER_MCP_MAX_SESSIONS".to_string(), "10000".to_string()),
            ("FIELDGATE_SERVER_MCP_SESSION_IDLE_S".to_string(), "60".to_string()),
        ];
        let cfg = Config::load(None, env).unwrap();
        assert_eq!((cfg.server.mcp_max_sessions, cfg.server.mcp_session_idle_s), (10_000, 60));
        let env = [
            ("FIELDGATE_SERVER_MCP_MAX_SESSIONS".to_string(), "0".to_string()),
            ("FIELDGATE_SERVER_MCP_SESSION_IDLE_S".to_string(), "forever".to_string()),
        ];
        let text: Vec<String> =
            Config::load(None, env).unwrap_err().0.iter().map(|p| p.to_string()).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[0].contains("`mcp_max_sessions` in [server]: must be between 1 and 100000"), "{text:?}");
        assert!(text[1].contains("`mcp_session_idle_s` in [server]: must be an integer"), "{text:?}");
    }

    #[test]
    fn cross_key_rules() {
        let env = [
            ("FIELDGATE_BREAKER_MIN_CALLS".to_string(), "30".to_string()),
            ("FIELDGATE_BREAKER_OPEN_MS".to_string(), "70000".to_string()),
        ];
        let err = Config::load(None, env).unwrap_err();
        let text: Vec<String> = err.0.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            text,
            [
                "configuration: breaker.min_calls (30) must not exceed breaker.window_size (20)",
                "configuration: breaker.open_ms (70000) must not exceed breaker.max_open_ms (60000)",
            ]
        );
        // Each rule alone, and its boundary: equal is allowed.
        let load = |pairs: &[(&str, &str)]| {
            Config::load(None, pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
                .map(|_| ())
                .map_err(|e| e.0.iter().map(|p| p.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(load(&[("FIELDGATE_BREAKER_MIN_CALLS", "20")]), Ok(()));
        assert_eq!(load(&[("FIELDGATE_BREAKER_OPEN_MS", "60000")]), Ok(()));
        assert_eq!(
            load(&[("FIELDGATE_BREAKER_WINDOW_SIZE", "5")]),
            Err(vec![
                "configuration: breaker.min_calls (10) must not exceed breaker.window_size (5)".to_string()
            ])
        );
        assert_eq!(
            load(&[("FIELDGATE_BREAKER_MAX_OPEN_MS", "100")]),
            Err(vec![
                "configuration: breaker.open_ms (5000) must not exceed breaker.max_open_ms (100)".to_string()
            ])
        );
    }
}
