//! The listener's security keys: `server.public_url`, `server.allow_plaintext`,
//! `[server.tls]` (certificate, key, client CAs) and `[server.oauth]` (the identity
//! provider whose access tokens fieldgate accepts).

use std::path::{Path, PathBuf};

use super::ServerConfig;
use crate::toml_reader::Table;

/// `[server.tls]`: the listener speaks HTTPS with this certificate chain and key.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    /// The certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// Certificate authorities (PEM) a client certificate must chain to; none: no client
    /// certificates asked for.
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are looked at for a change (a reload on SIGHUP is at once).
    pub watch_s: u64,
    /// A TLS handshake not finished this long after the connection opened closes it.
    pub handshake_timeout_ms: u64,
}

/// `[server.oauth]`: fieldgate as an OAuth 2.1 resource server of `issuer`.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthConfig {
    /// The issuer exactly as its tokens name it (`iss`), e.g. `https://idp.plant/realms/plant`.
    pub issuer: String,
    /// Accepted `aud` values; empty: `public_url + "/mcp"` and `public_url` (the resources
    /// of the two metadata documents).
    pub audiences: Vec<String>,
    /// The claim holding the granted scopes: a space-separated string or an array.
    pub scopes_claim: String,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_s: u64,
    /// The identity provider's keys are fetched again for an unknown key ID at most this
    /// often (and at the latest after `jwks_max_age_s`).
    pub jwks_min_refetch_s: u64,
    pub jwks_max_age_s: u64,
    /// Certificate authorities (PEM) trusted for the identity provider besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Accept only tokens typed `at+jwt` (RFC 9068 access tokens); otherwise a token may
    /// also be untyped or typed `JWT`, as many providers issue them.
    pub require_at_jwt: bool,
}

impl OAuthConfig {
    /// The audiences tokens must name: as configured, else the two resources fieldgate's
    /// metadata names (the MCP endpoint, and the server's root for `/v1`).
    pub fn audiences_for(&self, public_url: &str) -> Vec<String> {
        if self.audiences.is_empty() {
            vec![format!("{public_url}/mcp"), public_url.to_string()]
        } else {
            self.audiences.clone()
        }
    }
}

/// Reads `public_url`, `allow_plaintext`, `[server.tls]` and `[server.oauth]`.
pub(super) fn read_keys(s: &Table<'_, '_>, c: &mut ServerConfig) {
    if let Some(v) = s.str("public_url") {
        match check_public_url(v) {
            Ok(u) => c.public_url = u,
            Err(why) => s.problem("public_url", why),
        }
    }
    if let Some(b) = s.bool("allow_plaintext") {
        c.allow_plaintext = b;
    }
    if let Some(t) = s.table("tls") {
        // Merged over what an earlier source set (a file, then the environment).
        let mut tls = c.tls.clone().unwrap_or(TlsConfig {
            cert_file: PathBuf::new(),
            key_file: PathBuf::new(),
            client_ca_file: None,
            watch_s: 10,
            handshake_timeout_ms: 10_000,
        });
        pem_key(&t, "cert_file", "CERTIFICATE", |p| tls.cert_file = p.unwrap_or_default());
        pem_key(&t, "key_file", "PRIVATE KEY", |p| tls.key_file = p.unwrap_or_default());
        pem_key(&t, "client_ca_file", "CERTIFICATE", |p| tls.client_ca_file = p);
        if let Some(v) = t.int("watch_s", 1..=86_400) {
            tls.watch_s = v as u64;
        }
        if let Some(v) = t.int("handshake_timeout_ms", 100..=600_000) {
            tls.handshake_timeout_ms = v as u64;
        }
        t.finish();
        // Whether both files are named is a rule across sources (`problems`).
        c.tls = Some(tls);
    }
    if let Some(o) = s.table("oauth") {
        let mut oauth = c.oauth.clone().unwrap_or(OAuthConfig {
            issuer: String::new(),
            audiences: Vec::new(),
            scopes_claim: "scope".into(),
            leeway_s: 30,
            jwks_min_refetch_s: 10,
            jwks_max_age_s: 3600,
            ca_file: None,
            require_at_jwt: false,
        });
        if let Some(v) = o.str("issuer") {
            if let Err(why) = check_issuer(v) {
                o.problem("issuer", why);
            }
            // Named either way: "needs issuer" is for an issuer not named at all.
            oauth.issuer = v.to_string();
        }
        if let Some(v) = o.strings("audiences") {
            if v.iter().any(|a| a.trim().is_empty()) {
                o.problem(
                    "audiences",
                    "must not hold an empty audience (a token with an empty `aud` would pass)",
                );
            } else {
                oauth.audiences = v;
            }
        }
        if let Some(v) = o.str("scopes_claim") {
            if v.is_empty() {
                o.problem("scopes_claim", "must name a claim, e.g. \"scope\" or \"scp\"");
            } else {
                oauth.scopes_claim = v.to_string();
            }
        }
        if let Some(v) = o.int("leeway_s", 0..=600) {
            oauth.leeway_s = v as u64;
        }
        if let Some(v) = o.int("jwks_min_refetch_s", 0..=3600) {
            oauth.jwks_min_refetch_s = v as u64;
        }
        if let Some(v) = o.int("jwks_max_age_s", 60..=7 * 86_400) {
            oauth.jwks_max_age_s = v as u64;
        }
        if let Some(v) = o.bool("require_at_jwt") {
            oauth.require_at_jwt = v;
        }
        pem_key(&o, "ca_file", "CERTIFICATE", |p| oauth.ca_file = p);
        o.finish();
        c.oauth = Some(oauth);
    }
}

/// A key naming a PEM file with a `label` block: `set(None)` for an empty value.
fn pem_key(t: &Table<'_, '_>, key: &'static str, label: &str, set: impl FnOnce(Option<PathBuf>)) {
    match t.str(key) {
        None => {}
        Some("") => set(None),
        Some(v) => {
            if let Err(why) = pem_file(Path::new(v), label) {
                t.problem(key, why);
            }
            // Named either way: the rules across keys ("needs both files") hold.
            set(Some(PathBuf::from(v)))
        }
    }
}

/// Cross-key rules of the listener's security.
pub fn problems(c: &ServerConfig) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(t) = &c.tls
        && (t.cert_file.as_os_str().is_empty() || t.key_file.as_os_str().is_empty())
    {
        out.push("[server.tls] needs cert_file and key_file (PEM files)".into());
    }
    if c.tls.is_some() && c.public_url.starts_with("http://") {
        out.push(
            "server.public_url must start with https:// when [server.tls] is set: clients use that URL"
                .into(),
        );
    }
    if c.oauth.as_ref().is_some_and(|o| o.issuer.is_empty()) {
        out.push(
            "[server.oauth] needs issuer: the identity provider's URL, exactly as its tokens name it".into(),
        );
    }
    if c.oauth.is_some() && c.public_url.is_empty() {
        out.push("server.oauth needs server.public_url: the URL clients use, e.g. \"https://edge01.plant:8443\" (the metadata and the default audience are made from it)".into());
    }
    out
}

/// `public_url`: `http(s)://host[:port]` with no path, query or credentials; empty: none.
fn check_public_url(v: &str) -> Result<String, String> {
    if v.is_empty() {
        return Ok(String::new());
    }
    let u = url::Url::parse(v)
        .map_err(|_| format!("must be a URL such as \"https://edge01.plant:8443\", found {v:?}"))?;
    if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
        return Err(format!("must start with https:// (or http://) and name a host, found {v:?}"));
    }
    if !u.username().is_empty() || u.password().is_some() || u.query().is_some() || u.fragment().is_some() {
        return Err("must be scheme://host[:port] only".into());
    }
    if u.path() != "/" {
        return Err(format!(
            "must have no path (fieldgate serves /mcp and /v1 under it), found {:?}",
            u.path()
        ));
    }
    Ok(v.trim_end_matches('/').to_string())
}

/// An issuer is `https://…`; `http://` only on a loopback host (a provider on the same box).
/// Whether `u` names a loopback host (`localhost`, 127.0.0.0/8, ::1).
pub fn loopback_host(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    }
}

fn check_issuer(v: &str) -> Result<(), String> {
    let u = url::Url::parse(v).map_err(|_| format!("must be the issuer's URL, found {v:?}"))?;
    match u.scheme() {
        "https" => {}
        "http" if loopback_host(&u) => {}
        _ => return Err(format!("must be an https:// URL (http:// only on a loopback host), found {v:?}")),
    }
    if !u.username().is_empty() || u.password().is_some() || u.query().is_some() || u.fragment().is_some() {
        return Err("must have no credentials, query or fragment".into());
    }
    Ok(())
}

/// Whether the PEM file at `path` holds a block whose label ends with `label` (a regular
/// file of bounded size only: a FIFO would block, a link to /dev/zero never end).
pub(super) fn pem_file(path: &Path, label: &str) -> Result<(), String> {
    let text =
        crate::toml_reader::read_text_file(path).map_err(|why| format!("{}: {why}", path.display()))?;
    let found = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")));
    if found { Ok(()) } else { Err(format!("{} holds no PEM {label} block", path.display())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_urls() {
        assert_eq!(check_public_url("https://edge01.plant:8443/").unwrap(), "https://edge01.plant:8443");
        assert_eq!(check_public_url("").unwrap(), "");
        for bad in ["edge01", "ftp://h", "https://u:p@h", "https://h/x", "https://h?q=1"] {
            assert!(check_public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn issuers() {
        assert!(check_issuer("https://idp.plant/realms/plant").is_ok());
        assert!(check_issuer("http://127.0.0.1:9000").is_ok());
        assert!(check_issuer("http://localhost:9000/").is_ok());
        for bad in ["http://idp.plant", "idp", "https://idp.plant/#x", "https://a:b@idp.plant"] {
            assert!(check_issuer(bad).is_err(), "{bad}");
        }
    }
}
