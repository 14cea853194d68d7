//! fieldgate as an OAuth 2.1 resource server (MCP's authorization specification):
//! access tokens of the plant's identity provider, JWTs checked against its published
//! keys; the Protected Resource Metadata (RFC 9728) that tells clients where to get one.
//!
//! A token passes when its header names an allowed public-key algorithm (never `none`,
//! never HMAC), a key of the provider's set fitting that algorithm signed it, `iss` is
//! the configured issuer exactly, `aud` names one of the accepted audiences (RFC 8707),
//! and `exp`/`nbf` hold with the leeway. Its scopes decide what the caller may do; its
//! `sub` (or `client_id`) and the issuer's host are who the caller is. The token is never
//! passed on.

mod jwks;
mod ring_jwt;

use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Value, json};

use crate::config::security::OAuthConfig;
use crate::tools::{Caller, Scope, Scopes};
pub use jwks::KeyError;

/// The algorithms a token may be signed with.
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Longest caller identity taken from a token.
const MAX_SUBJECT: usize = 200;

/// Tokens remembered as checked, at most (then all are forgotten at once).
const REMEMBERED: usize = 4096;

/// A token that passed, remembered by its SHA-256: who it stands for, until when, and
/// against which key set it was checked.
struct Passed {
    caller: Caller,
    exp: i64,
    nbf: Option<i64>,
    generation: u64,
}

/// Why an access token is refused (the `error_description` of the challenge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a signed JWT")]
    Malformed,
    #[error("the token's signing algorithm is not accepted")]
    Algorithm,
    #[error("{0}")]
    Key(#[from] KeyError),
    #[error("the token's signature is not valid")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token is from another issuer")]
    Issuer,
    #[error("the token is for another audience")]
    Audience,
    #[error("the token lacks a required claim")]
    Claims,
    #[error("the token is not an access token")]
    Type,
}

impl TokenError {
    /// A word for logs and metrics.
    pub fn reason(self) -> &'static str {
        match self {
            TokenError::Malformed => "malformed",
            TokenError::Algorithm => "algorithm",
            TokenError::Key(KeyError::Unknown) => "unknown_key",
            TokenError::Key(KeyError::Unavailable) => "keys_unavailable",
            TokenError::Signature => "signature",
            TokenError::Expired => "expired",
            TokenError::NotYetValid => "not_yet_valid",
            TokenError::Issuer => "issuer",
            TokenError::Audience => "audience",
            TokenError::Claims => "claims",
            TokenError::Type => "type",
        }
    }
}

/// Why the resource server cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("server.oauth.ca_file: {0}")]
    CaFile(String),
    #[error("server.oauth: cannot build the HTTP client: {0}")]
    Client(String),
}

/// The resource server of `[server.oauth]`.
pub struct OAuth {
    issuer: String,
    audiences: Vec<String>,
    public_url: String,
    scopes_claim: String,
    leeway_s: u64,
    require_at_jwt: bool,
    issuer_host: String,
    keys: std::sync::Arc<jwks::Keys>,
    /// Tokens that passed: an agent presents the same token on every call for its
    /// lifetime, and checking its signature each time would cost more than the call. A
    /// remembered token is taken while its `exp` (and `nbf`) hold and the key set it was
    /// checked against is still the one in use; a new key set checks every token again.
    passed: parking_lot::Mutex<std::collections::HashMap<[u8; 32], Passed>>,
}

impl OAuth {
    pub fn new(cfg: &OAuthConfig, public_url: &str) -> Result<OAuth, OAuthError> {
        crate::tls::install_crypto_provider();
        ring_jwt::install();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(5))
            // The provider's documents are where its metadata says; a redirect is a failure.
            // A proxy in HTTPS_PROXY / NO_PROXY is used (plants often reach cloud providers so).
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = &cfg.ca_file {
            let certs = crate::config::webhook::read_ca_file(path).map_err(OAuthError::CaFile)?;
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder.build().map_err(|e| OAuthError::Client(e.without_url().to_string()))?;
        let issuer_host = url::Url::parse(&cfg.issuer)
            .ok()
            .and_then(|u| {
                let host = u.host_str()?.to_string();
                Some(u.port().map_or_else(|| host.clone(), |p| format!("{host}:{p}")))
            })
            .unwrap_or_else(|| cfg.issuer.clone());
        Ok(OAuth {
            issuer: cfg.issuer.clone(),
            audiences: cfg.audiences_for(public_url),
            public_url: public_url.to_string(),
            scopes_claim: cfg.scopes_claim.clone(),
            leeway_s: cfg.leeway_s,
            require_at_jwt: cfg.require_at_jwt,
            issuer_host,
            keys: std::sync::Arc::new(jwks::Keys::new(
                &cfg.issuer,
                client,
                Duration::from_secs(cfg.jwks_min_refetch_s),
                Duration::from_secs(cfg.jwks_max_age_s),
            )),
            passed: parking_lot::Mutex::default(),
        })
    }

    /// Fetches the provider's keys now (at start), so the first caller does not wait.
    pub async fn prefetch(&self) {
        let _ = self.keys.refresh().await;
    }

    /// The caller a presented access token stands for.
    pub async fn verify(&self, token: &str) -> Result<Caller, TokenError> {
        let digest: [u8; 32] =
            match ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref().try_into() {
                Ok(d) => d,
                Err(_) => return Err(TokenError::Malformed),
            };
        let now = chrono::Utc::now().timestamp();
        let leeway = self.leeway_s as i64;
        if let Some(p) = self.passed.lock().get(&digest)
            && p.generation == self.keys.generation()
        {
            if now > p.exp + leeway {
                return Err(TokenError::Expired);
            }
            if p.nbf.is_some_and(|nbf| now + leeway < nbf) {
                return Err(TokenError::NotYetValid);
            }
            return Ok(p.caller.clone());
        }
        let generation = self.keys.generation();
        let (caller, exp, nbf) = self.check(token).await?;
        let mut passed = self.passed.lock();
        if passed.len() >= REMEMBERED {
            passed.clear();
        }
        // Checked against the set in use before the check began: a fetch meanwhile
        // (another token's unknown key) makes this one be checked again next time.
        passed.insert(digest, Passed { caller: caller.clone(), exp, nbf, generation });
        Ok(caller)
    }

    /// The full check of a token: its caller, `exp` and `nbf`.
    async fn check(&self, token: &str) -> Result<(Caller, i64, Option<i64>), TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(TokenError::Algorithm);
        }
        if !access_token_type(header.typ.as_deref(), self.require_at_jwt) {
            return Err(TokenError::Type);
        }
        let key = self.keys.key_for(header.kid.as_deref(), header.alg).await?;
        let mut v = Validation::new(header.alg);
        v.leeway = self.leeway_s;
        v.validate_nbf = true;
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&self.audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &v).map_err(|e| {
            match e.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                ErrorKind::ImmatureSignature => TokenError::NotYetValid,
                ErrorKind::InvalidIssuer => TokenError::Issuer,
                ErrorKind::InvalidAudience => TokenError::Audience,
                ErrorKind::InvalidSignature => TokenError::Signature,
                ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => TokenError::Algorithm,
                ErrorKind::MissingRequiredClaim(_) => TokenError::Claims,
                _ => TokenError::Malformed,
            }
        })?;
        let claims = data.claims;
        // Exactly the issuer, as a string (the library also takes a list holding it).
        if claims.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return Err(TokenError::Issuer);
        }
        let who = ["sub", "client_id", "azp"]
            .iter()
            .find_map(|c| claims.get(*c).and_then(Value::as_str).filter(|s| !s.is_empty()))
            .ok_or(TokenError::Claims)?;
        if who.len() > MAX_SUBJECT || who.chars().any(char::is_control) {
            return Err(TokenError::Claims);
        }
        let scopes = match claims.get(&self.scopes_claim) {
            Some(Value::String(s)) => Scopes::parse(s),
            Some(Value::Array(list)) => {
                Scopes::parse(&list.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "))
            }
            _ => Scopes::NONE,
        };
        let exp = claims.get("exp").and_then(Value::as_f64).ok_or(TokenError::Claims)? as i64;
        let nbf = claims.get("nbf").and_then(Value::as_f64).map(|f| f as i64);
        Ok((Caller { id: format!("{who}@{}", self.issuer_host), scopes, expires: Some(exp) }, exp, nbf))
    }

    /// The URL of the resource metadata of the MCP endpoint, named in every challenge.
    pub fn metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource/mcp", self.public_url)
    }

    /// The Protected Resource Metadata (RFC 9728) of `path` (`""` for the server's root,
    /// `"/mcp"` for the MCP endpoint).
    pub fn metadata(&self, path: &str) -> Value {
        use strum::IntoEnumIterator;
        json!({
            "resource": format!("{}{path}", self.public_url),
            "authorization_servers": [self.issuer],
            "scopes_supported": Scope::iter().map(Scope::name).collect::<Vec<_>>(),
            "bearer_methods_supported": ["header"],
            "resource_name": "fieldgate",
        })
    }

    pub fn report(&self, s: &mut crate::metrics::Sheet<'_>) {
        let f = &self.keys.fetches;
        s.counters(
            "fieldgate_oauth_key_fetches",
            "Fetches of the identity provider's signing keys, by outcome.",
            "outcome",
            [("success", f.ok.load(Ordering::Relaxed)), ("failure", f.failed.load(Ordering::Relaxed))],
        );
        s.gauge(
            "fieldgate_oauth_keys",
            "Signing keys of the identity provider held in the cache.",
            self.keys.count() as i64,
        );
    }
}

/// Whether a JWT's `typ` header fits an access token: `at+jwt` (RFC 9068), and unless
/// `strict` also none or `JWT` (how many providers type theirs). Any other type (an ID
/// token's provider may type it, a logout token is `logout+jwt`, a DPoP proof `dpop+jwt`) is
/// some other JWT presented as a bearer token.
fn access_token_type(typ: Option<&str>, strict: bool) -> bool {
    let Some(typ) = typ else { return !strict };
    let typ = typ.to_ascii_lowercase();
    let typ = typ.strip_prefix("application/").unwrap_or(&typ);
    typ == "at+jwt" || (!strict && typ == "jwt")
}

/// Who a refused access token claims to be, for the audit log: its `sub` (or `client_id`,
/// `azp`) and `iss`, unverified, each cut to 100 printable characters. Never the token.
pub fn claimed(token: &str) -> (Option<String>, Option<String>) {
    const MAX: usize = 100;
    let payload = token
        .split('.')
        .nth(1)
        .filter(|p| p.len() <= 16 * 1024)
        .and_then(|p| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p).ok())
        .and_then(|p| serde_json::from_slice::<serde_json::Map<String, Value>>(&p).ok());
    let Some(claims) = payload else { return (None, None) };
    let text = |name: &str| {
        let s = claims.get(name)?.as_str()?;
        let shown = s.chars().filter(|c| !crate::plain::is_hidden(*c)).take(MAX).collect::<String>();
        Some(shown).filter(|s| !s.is_empty())
    };
    (["sub", "client_id", "azp"].iter().find_map(|c| text(c)), text("iss"))
}

/// Whether a presented bearer token is a JWT (three base64url parts, the first a JSON
/// object) rather than a static token.
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = token.split('.');
    let (Some(head), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(head).is_ok_and(|h| h.first() == Some(&b'{'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwts_are_told_from_static_tokens() {
        assert!(looks_like_jwt("eyJhbGciOiJFUzI1NiJ9.e30.c2ln"));
        for other in ["a-very-long-agent-token", "a.b.c", "eyJhbGciOiJFUzI1NiJ9.e30", "x.eyJ9.e30.z"] {
            assert!(!looks_like_jwt(other), "{other}");
        }
    }

    #[test]
    fn only_access_tokens_are_taken() {
        for (typ, lenient, strict) in [
            (None, true, false),
            (Some("JWT"), true, false),
            (Some("at+jwt"), true, true),
            (Some("application/AT+JWT"), true, true),
            (Some("logout+jwt"), false, false),
            (Some("dpop+jwt"), false, false),
            (Some("secevent+jwt"), false, false),
            (Some(""), false, false),
        ] {
            assert_eq!(access_token_type(typ, false), lenient, "{typ:?}");
            assert_eq!(access_token_type(typ, true), strict, "{typ:?} strict");
        }
    }

    #[test]
    fn a_refused_tokens_claimed_caller_is_plain_short_text() {
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let token = |payload: &str| format!("{}.{}.sig", b64(r#"{"alg":"ES256"}"#), b64(payload));
        let long = "m".repeat(500);
        let hostile = format!(
            r#"{{"sub":"mallory\n\u001b[31mroot\u202eexe.txt\u200b\u2028\u00ad\ufeff","iss":"{long}"}}"#
        );
        let (sub, iss) = claimed(&token(&hostile));
        assert_eq!(sub.as_deref(), Some("mallory[31mrootexe.txt"));
        assert_eq!(iss.map(|s| s.len()), Some(100));
        assert_eq!(claimed(&token(r#"{"client_id":"agent","iss":7}"#)), (Some("agent".into()), None));
        assert_eq!(claimed("not.a-jwt.at-all"), (None, None));
        assert_eq!(claimed(&token("[1,2]")), (None, None));
        assert_eq!(claimed(&token(r#"{"sub":""}"#)), (None, None));
    }
}
