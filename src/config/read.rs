//! Reading configuration text (the embedded defaults, a file, environment variables)
//! over a [`Config`], each section by its own function; every problem is collected.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::Config;
use crate::toml_reader::{Doc, Problem, Table};

/// `FIELDGATE_SERVER_LISTEN=...` becomes `[server] listen = ...` and is applied.
pub(super) fn apply_env(cfg: &mut Config, key: &str, value: &str) -> Vec<Problem> {
    let name = format!("environment variable {key}");
    let rest = &key["FIELDGATE_".len()..];
    let lower = rest.to_ascii_lowercase();
    let section = SECTIONS.iter().map(|(s, _)| *s).find(|s| lower.starts_with(&format!("{s}_")));
    let Some(section) = section else {
        return vec![Problem {
            source: name,
            line: 0,
            message: format!(
                "not a configuration key: the name must be FIELDGATE_<SECTION>_<KEY> with SECTION one of {}",
                SECTIONS.map(|(s, _)| s).join(", ").to_ascii_uppercase()
            ),
        }];
    };
    let field = &lower[section.len() + 1..];
    // A value that is valid TOML (a number, a boolean, a quoted string) is taken as
    // such; anything else is a plain string.
    let is_toml = toml::de::DeValue::parse(value).is_ok();
    let literal =
        if is_toml { value.to_string() } else { toml::Value::String(value.to_string()).to_string() };
    // FIELDGATE_SERVER_TLS_CERT_FILE is `[server.tls] cert_file`.
    let nested = NESTED.iter().find_map(|(outer, inner)| {
        let rest = field.strip_prefix(inner)?.strip_prefix('_')?;
        (*outer == section).then(|| format!("[{section}.{inner}]\n{rest} = {literal}\n"))
    });
    let text = nested.unwrap_or_else(|| format!("[{section}]\n{field} = {literal}\n"));
    let mut problems = apply_text(cfg, &name, &text);
    for p in &mut problems {
        p.line = 0;
    }
    problems
}

/// Tables inside sections that environment variables reach (`FIELDGATE_SERVER_TLS_...`).
const NESTED: [(&str, &str); 2] = [("server", "tls"), ("server", "oauth")];

type Section = fn(&Table<'_, '_>, &mut Config);

/// The sections of the configuration and the function reading each.
const SECTIONS: [(&str, Section); 11] = [
    ("devices", devices),
    ("server", server),
    ("auth", auth),
    ("storage", storage),
    ("calls", calls),
    ("breaker", breaker),
    ("history", history),
    ("work_orders", work_orders),
    ("alarms", alarms),
    ("mqtt", mqtt),
    ("hub", hub),
];

pub(super) fn apply_text(cfg: &mut Config, name: &str, text: &str) -> Vec<Problem> {
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

/// Every section of a document over `c`.
fn apply(t: &Table<'_, '_>, c: &mut Config) {
    for (name, read) in SECTIONS {
        if let Some(s) = t.table(name) {
            read(&s, c);
            s.finish();
        }
    }
    t.finish();
}

fn devices(s: &Table<'_, '_>, c: &mut Config) {
    set(&mut c.devices.dir, s.str("dir").filter(|d| !d.is_empty()).map(PathBuf::from));
}

fn server(s: &Table<'_, '_>, c: &mut Config) {
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
    set(&mut c.server.rate_limit_per_minute, s.int("rate_limit_per_minute", 1..=1_000_000).map(|v| v as u64));
    set(&mut c.server.allowed_hosts, s.strings("allowed_hosts"));
    let origins = s.strings("allowed_origins").filter(|list| {
        let bad: Vec<&String> =
            list.iter().filter(|o| !(o.starts_with("http://") || o.starts_with("https://"))).collect();
        if !bad.is_empty() {
            s.problem("allowed_origins", format!("origins start with http:// or https://, found {bad:?}"));
        }
        bad.is_empty()
    });
    set(&mut c.server.allowed_origins, origins);
    set(&mut c.server.shutdown_grace_ms, s.int("shutdown_grace_ms", 0..=600_000).map(|v| v as u64));
    set(&mut c.server.header_timeout_ms, s.int("header_timeout_ms", 100..=600_000).map(|v| v as u64));
    set(&mut c.server.mcp_max_sessions, s.int("mcp_max_sessions", 1..=100_000).map(|v| v as u64));
    set(&mut c.server.mcp_session_idle_s, s.int("mcp_session_idle_s", 1..=86_400).map(|v| v as u64));
    super::security::read_keys(s, &mut c.server);
}

fn auth(s: &Table<'_, '_>, c: &mut Config) {
    if let Some(f) = s.str("tokens_file") {
        c.auth.tokens_file = (!f.is_empty()).then(|| PathBuf::from(f));
    }
}

fn storage(s: &Table<'_, '_>, c: &mut Config) {
    set(&mut c.storage.data_dir, s.str("data_dir").filter(|d| !d.is_empty()).map(PathBuf::from));
    set(&mut c.storage.flush_interval_ms, s.int("flush_interval_ms", 10..=60_000).map(|v| v as u64));
    set(&mut c.storage.retention_days, s.int("retention_days", 1..=3650).map(|v| v as u64));
    set(&mut c.storage.retention_max_mb, s.int("retention_max_mb", 1..=1 << 20).map(|v| v as u64));
    set(&mut c.storage.reserve_mb, s.int("reserve_mb", 0..=1 << 20).map(|v| v as u64));
    set(&mut c.storage.reserve_percent, s.int("reserve_percent", 0..=50).map(|v| v as u8));
    set(&mut c.storage.unflushed_max_mb, s.int("unflushed_max_mb", 1..=4096).map(|v| v as u64));
}

fn calls(s: &Table<'_, '_>, c: &mut Config) {
    set(&mut c.calls.deadline_ms, s.int("deadline_ms", 10..=60_000).map(|v| v as u64));
    set(&mut c.calls.max_retries, s.int("max_retries", 0..=5).map(|v| v as u32));
    set(&mut c.calls.retry_backoff_ms, s.int("retry_backoff_ms", 1..=10_000).map(|v| v as u64));
    set(&mut c.calls.repeat_failure_limit, s.int("repeat_failure_limit", 1..=100).map(|v| v as u32));
    set(&mut c.calls.repeat_failure_window_s, s.int("repeat_failure_window_s", 1..=86_400).map(|v| v as u64));
}

fn breaker(s: &Table<'_, '_>, c: &mut Config) {
    const DAY_MS: i64 = 86_400_000;
    set(&mut c.breaker.failure_threshold, s.int("failure_threshold", 1..=1000).map(|v| v as u32));
    set(&mut c.breaker.failure_rate_percent, s.int("failure_rate_percent", 1..=100).map(|v| v as u32));
    set(&mut c.breaker.window_size, s.int("window_size", 1..=1000).map(|v| v as u32));
    set(&mut c.breaker.min_calls, s.int("min_calls", 1..=1000).map(|v| v as u32));
    set(&mut c.breaker.open_ms, s.int("open_ms", 10..=DAY_MS).map(|v| v as u64));
    set(&mut c.breaker.max_open_ms, s.int("max_open_ms", 10..=DAY_MS).map(|v| v as u64));
    set(&mut c.breaker.report_down_after_s, s.int("report_down_after_s", 1..=30 * 86_400).map(|v| v as u64));
}

fn history(s: &Table<'_, '_>, c: &mut Config) {
    set(&mut c.history.max_silence_s, s.int("max_silence_s", 1..=86_400).map(|v| v as u64));
    match s.str("backend") {
        Some("redb") => c.history.backend = super::HistoryBackend::Redb,
        Some("postgres") => c.history.backend = super::HistoryBackend::Postgres,
        Some(other) => s.problem("backend", format!("is \"redb\" or \"postgres\", not {other:?}")),
        None => {}
    }
    if let Some(v) = s.str("postgres_ca_file") {
        if v.is_empty() {
            c.history.postgres_ca_file = None;
        } else {
            match super::security::pem_file(std::path::Path::new(v), "CERTIFICATE") {
                Ok(()) => c.history.postgres_ca_file = Some(v.into()),
                Err(why) => s.problem("postgres_ca_file", why),
            }
        }
    }
    if let Some(v) = s.str("postgres_url_env") {
        match super::webhook::check_env_name(v) {
            Err(why) => s.problem("postgres_url_env", why),
            Ok(_) => c.history.postgres_url_env = v.to_string(),
        }
    }
}

fn alarms(s: &Table<'_, '_>, c: &mut Config) {
    set(&mut c.alarms.journal_days, s.int("journal_days", 1..=3650).map(|v| v as u64));
    set(&mut c.alarms.comm_delay_s, s.int("comm_delay_s", 0..=86_400).map(|v| v as u64));
}

fn work_orders(s: &Table<'_, '_>, c: &mut Config) {
    set(&mut c.work_orders.pending_ttl_hours, s.int("pending_ttl_hours", 1..=8760).map(|v| v as u64));
    let pairs = s.strings("auto_approve").filter(|list| {
        use crate::kinds::{Priority, WorkOrderType};
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
    super::webhook::read_keys(s, &mut c.work_orders);
}

fn mqtt(s: &Table<'_, '_>, c: &mut Config) {
    super::mqtt::read_keys(s, &mut c.mqtt);
}

fn hub(s: &Table<'_, '_>, c: &mut Config) {
    super::hub::read_keys(s, &mut c.hub);
}
