//! The maintenance system's webhook: where approved work orders are POSTed, over
//! `http://` or `https://` (reqwest with rustls), with an optional authorization header
//! whose secret comes from the environment.
//!
//! Configuration (`[work_orders]`): `webhook_url`; `webhook_ca_file`, a PEM file of
//! certificate authorities trusted beside the system's (a plant's own CA, or a
//! maintenance system's self-signed certificate); `webhook_auth_env`, the name of the
//! environment variable holding the secret, and `webhook_auth_header`, the header that
//! carries it (`Authorization` sends `Bearer <secret>`, any other header the secret as it
//! is). Those keys are checked when the configuration is loaded (`config/webhook.rs`), so
//! `fieldgate check` and every start report a bad webhook with the key to fix.
//!
//! The secret is never logged and never part of an error: it lives only in a header
//! value marked sensitive, and errors are written without the URL (whose query could
//! carry a key). The URL may not carry credentials itself (`user:password@`).

use std::path::Path;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use url::Url;

use crate::config::WorkOrdersConfig;
use crate::config::webhook::{AuthProblem, auth_header, check_url, read_ca_file};

/// How long to wait for a connection (name resolution and TLS included).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one delivery may take in all.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A webhook that cannot be used as configured.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("work_orders.webhook_url: {0}")]
    Url(String),
    #[error("work_orders.webhook_ca_file: {0}")]
    CaFile(String),
    #[error("work_orders.webhook_auth_header: {0}")]
    Header(String),
    #[error("work_orders.webhook_auth_env: {0}")]
    Secret(String),
    #[error("the webhook's HTTP client cannot be built: {0}")]
    Client(String),
}

/// An authorization header and its secret value (never shown).
#[derive(Clone)]
pub struct Auth {
    header: HeaderName,
    value: HeaderValue,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({}: [redacted])", self.header)
    }
}

impl Auth {
    /// `header: secret`, or `Authorization: Bearer secret`. The error never contains the
    /// secret.
    pub fn new(header: &str, secret: &str) -> Result<Auth, WebhookError> {
        let (header, value) = auth_header(header, secret).map_err(|e| match e {
            AuthProblem::Header(why) => WebhookError::Header(why),
            AuthProblem::Secret(why) => WebhookError::Secret(why),
        })?;
        Ok(Auth { header, value })
    }
}

/// Where approved work orders go, and how.
pub struct Webhook {
    url: Url,
    client: reqwest::Client,
    auth: Option<Auth>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Without the query, which could carry a key.
        let url = &self.url[..url::Position::AfterPath];
        f.debug_struct("Webhook").field("url", &url).field("auth", &self.auth).finish()
    }
}

/// Why one delivery failed, for the log: never the secret, never the URL.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("the webhook answered HTTP {0}")]
    Status(u16),
    #[error("no answer within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
    #[error("{0}")]
    Send(String),
}

impl Webhook {
    /// A webhook at `url` with the system's trusted certificates and no authorization.
    pub fn parse(url: &str) -> Result<Webhook, WebhookError> {
        Webhook::new(url, None, None)
    }

    /// A webhook at `url`, trusting the certificate authorities in `ca_file` besides the
    /// system's, sending `auth` with every delivery.
    pub fn new(url: &str, ca_file: Option<&Path>, auth: Option<Auth>) -> Result<Webhook, WebhookError> {
        let url = check_url(url).map_err(WebhookError::Url)?;
        crate::tls::install_crypto_provider();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            // A maintenance system answers where it was asked: a redirect is a failure
            // (and never carries the secret elsewhere), as is a proxy nobody configured.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            // Deliveries are seconds apart at the least: a fresh connection each time
            // rather than one the receiver may have closed meanwhile.
            .pool_max_idle_per_host(0);
        if let Some(path) = ca_file {
            builder = builder.tls_certs_merge(read_ca_file(path).map_err(WebhookError::CaFile)?);
        }
        let client = builder.build().map_err(|e| WebhookError::Client(e.without_url().to_string()))?;
        Ok(Webhook { url, client, auth })
    }

    /// The webhook `config` describes, with the secret looked up by `env`; `None` when no
    /// URL is configured.
    pub fn from_config(
        config: &WorkOrdersConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Webhook>, WebhookError> {
        if config.webhook_url.is_empty() {
            return Ok(None);
        }
        let auth = match config.webhook_auth_env.as_str() {
            "" => None,
            name => {
                let secret = env(name).filter(|s| !s.is_empty()).ok_or_else(|| {
                    WebhookError::Secret(format!("the environment variable {name} is not set (or empty)"))
                })?;
                Some(Auth::new(&config.webhook_auth_header, &secret)?)
            }
        };
        let ca_file = config.webhook_ca_file.as_deref();
        let webhook = Webhook::new(&config.webhook_url, ca_file, auth)?;
        if webhook.auth.is_some() && webhook.url.scheme() == "http" && !is_loopback(&webhook.url) {
            tracing::warn!(
                host = webhook.url.host_str().unwrap_or(""),
                "the webhook's secret is sent over plain http; use https:// unless the network is trusted"
            );
        }
        Ok(Some(webhook))
    }

    pub fn url(&self) -> &Url {
        &self.url
    }

    /// POSTs one work order (`body`, JSON) with its ID as the `Idempotency-Key`; a 2xx
    /// answer is a delivery.
    pub async fn post(&self, id: &str, body: Vec<u8>) -> Result<(), Failure> {
        let mut request = self
            .client
            .post(self.url.clone())
            .header("idempotency-key", id)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(a) = &self.auth {
            request = request.header(a.header.clone(), a.value.clone());
        }
        match request.send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(Failure::Status(r.status().as_u16())),
            Err(e) if e.is_timeout() => Err(Failure::Timeout),
            Err(e) => Err(Failure::Send(chain(&e.without_url()))),
        }
    }
}

/// An error and its causes on one line ("error sending request: ...: invalid peer
/// certificate: UnknownIssuer"): the cause is what an operator can act on.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_not_shown() {
        let a = Auth::new("Authorization", "s3cret-t0ken").unwrap();
        assert_eq!(a.value.to_str().unwrap(), "Bearer s3cret-t0ken");
        assert!(!format!("{a:?}").contains("s3cret"));
        let a = Auth::new("X-API-Key", "s3cret-t0ken").unwrap();
        assert_eq!((a.header.as_str(), a.value.to_str().unwrap()), ("x-api-key", "s3cret-t0ken"));
        let e = Auth::new("Authorization", "s3cret\nt0ken").unwrap_err().to_string();
        assert!(!e.contains("s3cret"), "{e}");
        assert!(Auth::new("Bad Header", "x").is_err());
        assert!(Auth::new("Host", "x").is_err());
    }

    #[test]
    fn a_webhook_shows_no_secret() {
        let config = WorkOrdersConfig {
            webhook_url: "https://cmms.example.com/x".into(),
            webhook_auth_env: "TOKEN_VAR".into(),
            webhook_auth_header: "Authorization".into(),
            ..crate::config::Config::default().work_orders
        };
        let w = Webhook::from_config(&config, |_| Some("s3cret-t0ken".into())).unwrap().unwrap();
        assert!(!format!("{w:?}").contains("s3cret"), "{w:?}");
        let e = Webhook::from_config(&config, |_| None).unwrap_err().to_string();
        assert!(e.contains("TOKEN_VAR is not set"), "{e}");
        let none = crate::config::Config::default().work_orders;
        assert!(Webhook::from_config(&none, |_| None).unwrap().is_none());
    }
}
