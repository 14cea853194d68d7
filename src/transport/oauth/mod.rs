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
    issuer_host: String,
    keys: jwks::Keys,
}

impl OAuth {
    pub fn new(cfg: &OAuthConfig, public_url: &str) -> Result<OAuth, OAuthError> {
        crate::tls::install_crypto_provider();
        ring_jwt::install();
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            // The provider's documents are where its metadata says; a redirect is a failure.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
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
            issuer_host,
            keys: jwks::Keys::new(
                &cfg.issuer,
                client,
                Duration::from_secs(cfg.jwks_min_refetch_s),
                Duration::from_secs(cfg.jwks_max_age_s),
            ),
        })
    }

    /// Fetches the provider's keys now (at start), so the first caller does not wait.
    pub async fn prefetch(&self) {
        let _ = self.keys.refresh().await;
    }

    /// The caller a presented access token stands for.
    pub async fn verify(&self, token: &str) -> Result<Caller, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(TokenError::Algorithm);
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
        Ok(Caller { id: format!("{who}@{}", self.issuer_host), scopes })
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
}
