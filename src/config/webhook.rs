//! The webhook's keys of `[work_orders]`: read and checked when the configuration is
//! loaded, so `fieldgate check` and every start report a bad webhook with the key to fix.
//! `work_orders/webhook.rs` builds the webhook from them with the same checks.

use std::path::{Path, PathBuf};

use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use url::Url;

use super::WorkOrdersConfig;
use crate::toml_reader::Table;

/// Why an authorization header cannot be built. Neither text contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum AuthProblem {
    #[error("work_orders.webhook_auth_header: {0}")]
    Header(String),
    #[error("work_orders.webhook_auth_env: {0}")]
    Secret(String),
}

/// `header: secret`, or `Authorization: Bearer secret`, its value marked sensitive.
pub fn auth_header(header: &str, secret: &str) -> Result<(HeaderName, HeaderValue), AuthProblem> {
    let header = check_header_name(header).map_err(AuthProblem::Header)?;
    let text = if header == AUTHORIZATION { format!("Bearer {secret}") } else { secret.to_string() };
    let mut value = HeaderValue::from_str(&text).map_err(|_| {
        AuthProblem::Secret(
            "the secret holds characters an HTTP header cannot carry (a line break or a control character; its value is not shown)".into(),
        )
    })?;
    value.set_sensitive(true);
    Ok((header, value))
}

/// Reads the webhook's keys of `[work_orders]` from `s` into `w`, each problem at its key
/// (`config/read.rs` reads the table's other keys).
pub fn read_keys(s: &Table<'_, '_>, w: &mut WorkOrdersConfig) {
    let checked = |key: &'static str, check: fn(&str) -> Result<(), String>| {
        let v = s.str(key)?;
        match check(v) {
            Ok(()) => Some(v.to_string()),
            Err(why) => {
                s.problem(key, why);
                None
            }
        }
    };
    if let Some(v) = checked("webhook_url", |u| if u.is_empty() { Ok(()) } else { check_url(u).map(drop) }) {
        w.webhook_url = v;
    }
    if let Some(v) =
        checked(
            "webhook_ca_file",
            |f| if f.is_empty() { Ok(()) } else { read_ca_file(Path::new(f)).map(drop) },
        )
    {
        w.webhook_ca_file = (!v.is_empty()).then(|| PathBuf::from(v));
    }
    if let Some(v) = checked("webhook_auth_header", |h| check_header_name(h).map(drop)) {
        w.webhook_auth_header = v;
    }
    if let Some(v) = checked("webhook_auth_env", |n| if n.is_empty() { Ok(()) } else { check_env_name(n) }) {
        w.webhook_auth_env = v;
    }
}

/// What is wrong with the webhook's secret, if anything: its variable must be set, and its
/// value sendable in its header. The message never contains the secret.
pub fn secret_problem(w: &WorkOrdersConfig, env: impl Fn(&str) -> Option<String>) -> Option<String> {
    if w.webhook_auth_env.is_empty() || check_header_name(&w.webhook_auth_header).is_err() {
        return None;
    }
    if w.webhook_url.is_empty() {
        return Some("work_orders.webhook_auth_env is set but work_orders.webhook_url is empty: there is no webhook to send the secret to".into());
    }
    match env(&w.webhook_auth_env).filter(|v| !v.is_empty()) {
        None => Some(format!(
            "work_orders.webhook_auth_env names the environment variable {}, which is not set (or empty): set it to the webhook's secret",
            w.webhook_auth_env
        )),
        Some(secret) => auth_header(&w.webhook_auth_header, &secret)
            .err()
            .map(|e| format!("{e} (the environment variable {})", w.webhook_auth_env)),
    }
}

/// A webhook URL: `http://` or `https://`, a host, no credentials. The error quotes the
/// URL only when it has none.
pub fn check_url(text: &str) -> Result<Url, String> {
    const WANT: &str =
        "must be empty or an http:// or https:// URL such as https://cmms.example.com/api/work-orders";
    let url = Url::parse(text).map_err(|e| format!("{WANT}, found {text:?} ({e})"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not carry credentials (user:password@): name the environment variable that holds the secret in webhook_auth_env instead"
                .into(),
        );
    }
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(format!("{WANT}, found {text:?}"));
    }
    if url.fragment().is_some() {
        return Err(format!("must not have a #fragment, found {text:?}"));
    }
    Ok(url)
}

/// A header name for the webhook's secret, e.g. `Authorization` or `X-API-Key`.
pub fn check_header_name(name: &str) -> Result<HeaderName, String> {
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        format!("must be an HTTP header name such as Authorization or X-API-Key, found {name:?}")
    })?;
    let reserved =
        ["host", "content-type", "content-length", "transfer-encoding", "connection", "idempotency-key"];
    if reserved.contains(&header.as_str()) {
        return Err(format!(
            "{name:?} is set by fieldgate itself; use Authorization or the header your maintenance system reads its key from"
        ));
    }
    Ok(header)
}

/// The name of the environment variable that holds the secret (not the secret itself).
pub fn check_env_name(name: &str) -> Result<(), String> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        // Not quoted: someone may have put the secret itself here.
        Err("must be the name of an environment variable (letters, digits and _, e.g. FIELDGATE_WEBHOOK_TOKEN), not the secret itself".into())
    }
}

/// The certificates of a PEM file; at least one.
pub fn read_ca_file(path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let pem = crate::toml_reader::read_text_file(path).map_err(|why| format!("{}: {why}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
        .map_err(|_| format!("{} is not a PEM file of certificates", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate (-----BEGIN CERTIFICATE-----)", path.display()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert!(check_url("http://127.0.0.1:9/cmms").is_ok());
        assert!(check_url("https://cmms.example.com/api/work-orders?site=A").is_ok());
        for bad in ["", "cmms.example.com/x", "ftp://cmms/x", "http://", "http://h/x#f"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        let e = check_url("https://maint:hunter2@cmms.example.com/x").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn env_names() {
        assert!(check_env_name("FIELDGATE_WEBHOOK_TOKEN").is_ok());
        let e = check_env_name("Bearer abc.def").unwrap_err();
        assert!(!e.contains("abc.def"), "{e}");
    }
}
