//! The identity provider's signing keys: found through its metadata (OpenID Connect
//! discovery, else RFC 8414), fetched, cached, and fetched again when a token names a key
//! the cache does not have (at most once per `min_refetch`) or the cache is older than
//! `max_age`. A failed fetch keeps the cached keys: the provider being down does not lock
//! out tokens signed with keys already known. A key never seen is never trusted.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::RwLock;
use tokio::time::Instant;

/// Largest metadata or key-set document read.
const MAX_DOCUMENT: usize = 1 << 20;

/// Why a token's key is not at hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the token's signing key is not one of the identity provider's")]
    Unknown,
    #[error("the identity provider's keys cannot be fetched")]
    Unavailable,
}

#[derive(Clone)]
struct Key {
    kid: Option<String>,
    alg: Option<Algorithm>,
    curve: Option<EllipticCurve>,
    key: DecodingKey,
}

#[derive(Default)]
struct Cache {
    keys: Vec<Key>,
    jwks_uri: Option<String>,
    /// Last successful fetch, and last attempt.
    fetched: Option<Instant>,
    tried: Option<Instant>,
    /// The last attempt failed.
    failing: bool,
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Fetches {
    pub ok: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
}

/// The keys come over HTTPS, or plain HTTP from a loopback host only (whatever the
/// issuer's own scheme).
fn fit_jwks_uri(uri: &str) -> bool {
    url::Url::parse(uri).is_ok_and(|u| {
        u.scheme() == "https" || (u.scheme() == "http" && crate::config::security::loopback_host(&u))
    })
}

/// How long a request waits for the keys to be fetched (a key the cache lacks).
const WAIT_FOR_KEYS: Duration = Duration::from_secs(4);

pub struct Keys {
    issuer: String,
    client: reqwest::Client,
    cache: RwLock<Cache>,
    /// One fetch at a time; the others wait for it and look again.
    fetching: tokio::sync::Mutex<()>,
    min_refetch: Duration,
    max_age: Duration,
    pub fetches: Fetches,
    /// Counts the key sets fetched: tokens checked against an older set are checked again.
    generation: std::sync::atomic::AtomicU64,
    /// A refresh of a stale cache runs in the background (one at a time).
    refreshing: std::sync::atomic::AtomicBool,
}

impl Keys {
    pub fn new(issuer: &str, client: reqwest::Client, min_refetch: Duration, max_age: Duration) -> Keys {
        Keys {
            issuer: issuer.to_string(),
            client,
            cache: RwLock::default(),
            fetching: tokio::sync::Mutex::new(()),
            min_refetch,
            max_age,
            fetches: Fetches::default(),
            generation: std::sync::atomic::AtomicU64::new(0),
            refreshing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Which key set is in use (it changes with every fetch).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Keys in the cache.
    pub fn count(&self) -> usize {
        self.cache.read().keys.len()
    }

    /// The key that signed a token with header `kid` and `alg`. A cached key is used at
    /// once, even from a stale cache (which is then refreshed in the background): the
    /// provider being slow or down never holds up a token of a known key. Only a key the
    /// cache lacks waits for a fetch.
    pub async fn key_for(
        self: &Arc<Self>,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<DecodingKey, KeyError> {
        let (found, stale) = {
            let c = self.cache.read();
            (pick(&c.keys, kid, alg), c.fetched.is_none_or(|t| t.elapsed() >= self.max_age))
        };
        if let Some(k) = found {
            if stale && !self.refreshing.swap(true, std::sync::atomic::Ordering::AcqRel) {
                let me = self.clone();
                tokio::spawn(async move {
                    let _ = me.refresh().await;
                    me.refreshing.store(false, std::sync::atomic::Ordering::Release);
                });
            }
            return Ok(k);
        }
        // The fetch runs in a task of its own: a request waits for it `WAIT_FOR_KEYS` at most
        // (then the token cannot be checked now: 503, not the request's own timeout), and
        // the fetch goes on for the next one.
        let me = self.clone();
        let fetch = tokio::spawn(async move {
            let _ = me.refresh().await;
        });
        if tokio::time::timeout(WAIT_FOR_KEYS, fetch).await.is_err() {
            return Err(KeyError::Unavailable);
        }
        let c = self.cache.read();
        match pick(&c.keys, kid, alg) {
            Some(k) => Ok(k),
            None if c.keys.is_empty() && c.failing => Err(KeyError::Unavailable),
            None => Err(KeyError::Unknown),
        }
    }

    /// Fetches the keys unless another fetch is running or one was tried within
    /// `min_refetch`; `Ok` when the cache is fresh after it.
    pub async fn refresh(&self) -> Result<(), String> {
        let _one = self.fetching.lock().await;
        if self.cache.read().tried.is_some_and(|t| t.elapsed() < self.min_refetch) {
            return Ok(());
        }
        self.cache.write().tried = Some(Instant::now());
        match self.fetch().await {
            Ok((uri, keys)) => {
                let mut c = self.cache.write();
                c.jwks_uri = Some(uri);
                c.keys = keys;
                c.fetched = Some(Instant::now());
                c.failing = false;
                self.generation.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                self.fetches.ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(why) => {
                self.cache.write().failing = true;
                self.fetches.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    target: "audit",
                    event = "jwks_fetch",
                    outcome = "failure",
                    issuer = self.issuer.as_str(),
                    error = why.as_str(),
                    "cannot fetch the identity provider's keys; the cached ones stay in use"
                );
                Err(why)
            }
        }
    }

    async fn fetch(&self) -> Result<(String, Vec<Key>), String> {
        let known = self.cache.read().jwks_uri.clone();
        let uri = match known {
            Some(u) => u,
            None => self.discover().await?,
        };
        let set: serde_json::Value = self.get_json(&uri).await?;
        let Some(list) = set.get("keys").and_then(|k| k.as_array()) else {
            return Err("the key set has no \"keys\" array".into());
        };
        // A key fieldgate cannot use (an encryption key, an unknown type) is skipped.
        let keys: Vec<Key> = list.iter().filter_map(usable).collect();
        Ok((uri, keys))
    }

    /// The `jwks_uri` of the issuer's metadata.
    async fn discover(&self) -> Result<String, String> {
        let base = self.issuer.trim_end_matches('/');
        let mut tried = Vec::new();
        for url in metadata_urls(&self.issuer) {
            match self.get_json(&url).await {
                Ok(doc) => {
                    let issuer = doc.get("issuer").and_then(|v| v.as_str()).unwrap_or("");
                    if issuer.trim_end_matches('/') != base {
                        return Err(format!("the metadata at {url} names another issuer"));
                    }
                    if issuer != self.issuer {
                        // Tokens carry the provider's own spelling: none would pass.
                        tracing::error!(
                            target: "audit",
                            event = "jwks_fetch",
                            outcome = "misconfigured",
                            configured = self.issuer.as_str(),
                            provider = issuer,
                            "server.oauth.issuer must be exactly the issuer the provider names: its tokens carry that `iss`"
                        );
                    }
                    let Some(uri) = doc.get("jwks_uri").and_then(|v| v.as_str()) else {
                        return Err(format!("the metadata at {url} has no jwks_uri"));
                    };
                    if !fit_jwks_uri(uri) {
                        return Err(format!("the metadata at {url} names a jwks_uri that is not https"));
                    }
                    return Ok(uri.to_string());
                }
                Err(why) => tried.push(why),
            }
        }
        Err(tried.join("; "))
    }

    async fn get_json(&self, url: &str) -> Result<serde_json::Value, String> {
        let mut res = self.client.get(url).send().await.map_err(|e| format!("{url}: {}", short(&e)))?;
        if !res.status().is_success() {
            return Err(format!("{url}: HTTP {}", res.status().as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = res.chunk().await.map_err(|e| format!("{url}: {}", short(&e)))? {
            if body.len() + chunk.len() > MAX_DOCUMENT {
                return Err(format!("{url}: the document is larger than 1 MiB"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|_| format!("{url}: not JSON"))
    }
}

/// Short words for a client error (never the server's text).
fn short(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    }
}

/// Where the issuer's metadata may be: OpenID Connect discovery, then RFC 8414.
fn metadata_urls(issuer: &str) -> Vec<String> {
    let base = issuer.trim_end_matches('/');
    let mut out = vec![format!("{base}/.well-known/openid-configuration")];
    if let Ok(u) = url::Url::parse(issuer) {
        let path = u.path().trim_end_matches('/');
        let origin = u.origin().ascii_serialization();
        out.push(format!("{origin}/.well-known/oauth-authorization-server{path}"));
    }
    out
}

/// A key of the set fieldgate can verify signatures with.
fn usable(v: &serde_json::Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(v.clone()).ok()?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(a) => Some(signing(a)?),
    };
    let curve = match &jwk.algorithm {
        AlgorithmParameters::EllipticCurve(p) => Some(p.curve.clone()),
        AlgorithmParameters::OctetKeyPair(p) => Some(p.curve.clone()),
        AlgorithmParameters::RSA(_) => None,
        // A shared secret in a public key set is never used.
        _ => return None,
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key { kid: jwk.common.key_id, alg, curve, key })
}

/// The signature algorithm a JWK's `alg` names; `None` for anything else.
fn signing(a: KeyAlgorithm) -> Option<Algorithm> {
    Some(match a {
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return None,
    })
}

/// Whether `key` may check a signature made with `alg`.
fn fits(key: &Key, alg: Algorithm) -> bool {
    if key.key.family() != alg.family() || key.alg.is_some_and(|a| a != alg) {
        return false;
    }
    match (alg, &key.curve) {
        (Algorithm::ES256, Some(c)) => *c == EllipticCurve::P256,
        (Algorithm::ES384, Some(c)) => *c == EllipticCurve::P384,
        (Algorithm::EdDSA, Some(c)) => *c == EllipticCurve::Ed25519,
        (Algorithm::ES256 | Algorithm::ES384 | Algorithm::EdDSA, None) => false,
        _ => true,
    }
}

/// The key for `kid` (or, without one, the only key that fits `alg`).
fn pick(keys: &[Key], kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
    let mut candidates = keys.iter().filter(|k| fits(k, alg));
    match kid {
        Some(kid) => candidates.find(|k| k.kid.as_deref() == Some(kid)).map(|k| k.key.clone()),
        None => {
            let first = candidates.next()?;
            candidates.next().is_none().then(|| first.key.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_for_as_oidc_then_rfc_8414() {
        assert_eq!(
            metadata_urls("https://idp.plant/realms/plant"),
            [
                "https://idp.plant/realms/plant/.well-known/openid-configuration",
                "https://idp.plant/.well-known/oauth-authorization-server/realms/plant"
            ]
        );
        assert_eq!(
            metadata_urls("http://127.0.0.1:9000/"),
            [
                "http://127.0.0.1:9000/.well-known/openid-configuration",
                "http://127.0.0.1:9000/.well-known/oauth-authorization-server"
            ]
        );
    }

    #[test]
    fn only_signing_keys_that_fit_the_algorithm_are_picked() {
        let ec = serde_json::json!({"kty":"EC","crv":"P-256","kid":"a","use":"sig","alg":"ES256",
            "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        let enc = serde_json::json!({"kty":"RSA","kid":"e","use":"enc","n":"AQAB","e":"AQAB"});
        let secret = serde_json::json!({"kty":"oct","kid":"s","k":"c2VjcmV0"});
        let keys: Vec<Key> = [ec, enc, secret].iter().filter_map(usable).collect();
        assert_eq!(keys.len(), 1);
        assert!(pick(&keys, Some("a"), Algorithm::ES256).is_some());
        assert!(pick(&keys, None, Algorithm::ES256).is_some(), "the only fitting key");
        assert!(pick(&keys, Some("a"), Algorithm::ES384).is_none(), "another curve");
        assert!(pick(&keys, Some("a"), Algorithm::RS256).is_none(), "another family");
        assert!(pick(&keys, Some("b"), Algorithm::ES256).is_none(), "another kid");
    }

    #[test]
    fn keys_come_over_https_or_from_loopback() {
        for fit in ["https://idp.plant/keys", "http://127.0.0.1:9000/jwks", "http://localhost/jwks"] {
            assert!(fit_jwks_uri(fit), "{fit}");
        }
        for unfit in ["http://192.0.2.2:18600/jwks", "http://idp.plant/jwks", "ftp://h/k", "jwks"] {
            assert!(!fit_jwks_uri(unfit), "{unfit}");
        }
    }

    /// A provider that hangs from the start: a request waits `WAIT_FOR_KEYS` for the keys,
    /// then the token cannot be checked now (not after every discovery URL's timeout).
    #[tokio::test(start_paused = true)]
    async fn a_provider_that_hangs_from_the_start_costs_a_request_four_seconds() {
        crate::tls::install_crypto_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s); // never answered
            }
        });
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
        let keys = Arc::new(Keys::new(&issuer, client, Duration::ZERO, Duration::from_secs(3600)));
        let started = tokio::time::Instant::now();
        let got = keys.key_for(Some("a"), Algorithm::ES256).await;
        assert!(matches!(got, Err(KeyError::Unavailable)));
        assert_eq!(started.elapsed(), WAIT_FOR_KEYS, "paused time: exactly the wait");
    }

    /// A provider that answered once and now hangs: a token of a cached key is checked at
    /// once from the stale cache (its refresh runs in the background), not after the
    /// provider's timeout.
    #[tokio::test]
    async fn a_stale_cache_answers_at_once_while_the_provider_hangs() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        crate::tls::install_crypto_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let key = serde_json::json!({"keys": [{"kty":"EC","crv":"P-256","kid":"a","alg":"ES256",
            "x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]});
        let meta = serde_json::json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")});
        tokio::spawn(async move {
            let mut answered = 0;
            let mut held = Vec::new();
            while let Ok((mut s, _)) = listener.accept().await {
                if answered == 2 {
                    held.push(s); // never answered
                    continue;
                }
                answered += 1;
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let body = if String::from_utf8_lossy(&buf[..n]).contains("/jwks") { &key } else { &meta };
                let body = body.to_string();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
            }
        });
        let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
        let keys = Arc::new(Keys::new(&issuer, client, Duration::ZERO, Duration::ZERO));
        keys.key_for(Some("a"), Algorithm::ES256).await.expect("fetched");
        let again =
            tokio::time::timeout(Duration::from_secs(2), keys.key_for(Some("a"), Algorithm::ES256)).await;
        assert!(again.expect("answered from the cache at once, not after the provider's timeout").is_ok());
    }
}
