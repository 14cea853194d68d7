//! HTTPS on the listener: the certificate chain and key of `[server.tls]` (and the
//! client CAs, for mutual TLS), TLS 1.2 and 1.3 only, ALPN `http/1.1`.
//!
//! The pair is loaded at start and again on SIGHUP or when the files change (looked at
//! every `watch_s`): a new pair that does not load (unreadable, the key not the
//! certificate's, expired) is refused with a log line and the old one keeps serving.
//! New connections get the newest pair; open ones keep theirs.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::config::security::TlsConfig;
use crate::tls::CertFacts;

/// Why a certificate pair does not load.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TlsError {
    #[error("{0}: {1}")]
    File(String, String),
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    #[error("{0} holds no private key")]
    NoKey(String),
    #[error("the certificate in {0} cannot be read")]
    BadCertificate(String),
    #[error("the private key does not belong to the certificate")]
    KeyMismatch,
    #[error("the private key cannot be used: {0}")]
    BadKey(String),
    #[error("the certificate expired at {0}")]
    Expired(String),
    #[error("the certificate is not valid before {0}")]
    NotYetValid(String),
    #[error("the client certificate authorities cannot be used: {0}")]
    ClientCa(String),
}

/// A loaded pair: what new connections are offered, and what the certificate says.
struct Loaded {
    config: Arc<rustls::ServerConfig>,
    facts: CertFacts,
    /// The files' sizes and change times when they were read.
    stamp: Stamp,
}

/// The certificate being served, reloaded in place.
pub struct TlsListener {
    cfg: TlsConfig,
    current: RwLock<Arc<rustls::ServerConfig>>,
    stamp: Mutex<Stamp>,
    not_after: AtomicI64,
    reloads: AtomicU64,
    refused: AtomicU64,
    handshake_failures: AtomicU64,
}

/// Size and modification time of each file, to notice a change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Stamp(Vec<Option<(u64, std::time::SystemTime)>>);

impl Stamp {
    fn of(cfg: &TlsConfig) -> Stamp {
        let files = [Some(&cfg.cert_file), Some(&cfg.key_file), cfg.client_ca_file.as_ref()];
        Stamp(
            files
                .into_iter()
                .flatten()
                .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.len(), m.modified().ok()?))))
                .collect(),
        )
    }
}

fn read_pem(path: &Path) -> Result<String, TlsError> {
    crate::toml_reader::read_text_file(path).map_err(|why| TlsError::File(path.display().to_string(), why))
}

fn utc(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0).map_or_else(|| secs.to_string(), |t| t.to_rfc3339())
}

/// Loads the pair of `cfg` as it is on disk, checked at `now` (Unix seconds).
fn load(cfg: &TlsConfig, now: i64) -> Result<Loaded, TlsError> {
    crate::tls::install_crypto_provider();
    let stamp = Stamp::of(cfg);
    let cert_name = cfg.cert_file.display().to_string();
    let key_name = cfg.key_file.display().to_string();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(read_pem(&cfg.cert_file)?.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|_| TlsError::BadCertificate(cert_name.clone()))?;
    let Some(leaf) = chain.first() else { return Err(TlsError::NoCertificate(cert_name)) };
    let facts = CertFacts::of(leaf).ok_or_else(|| TlsError::BadCertificate(cert_name.clone()))?;
    if now > facts.not_after {
        return Err(TlsError::Expired(utc(facts.not_after)));
    }
    if now < facts.not_before {
        return Err(TlsError::NotYetValid(utc(facts.not_before)));
    }
    let key = PrivateKeyDer::from_pem_slice(read_pem(&cfg.key_file)?.as_bytes())
        .map_err(|_| TlsError::NoKey(key_name))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::BadKey(e.to_string()))?;
    let builder = match &cfg.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(read_pem(path)?.as_bytes()) {
                let c = c.map_err(|_| TlsError::ClientCa(format!("{} is not PEM", path.display())))?;
                roots.add(c).map_err(|e| TlsError::ClientCa(e.to_string()))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch,
        // ring takes RSA keys of 2048 bits or more, ECDSA P-256/P-384 and Ed25519.
        _ => TlsError::BadKey(
            "use an RSA key of 2048 bits or more, an ECDSA P-256 or P-384 key, or an Ed25519 key".into(),
        ),
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Loaded { config: Arc::new(config), facts, stamp })
}

fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl TlsListener {
    /// The pair of `cfg`, loaded now.
    pub fn load(cfg: &TlsConfig) -> Result<TlsListener, TlsError> {
        let loaded = load(cfg, unix_now())?;
        Ok(TlsListener {
            cfg: cfg.clone(),
            current: RwLock::new(loaded.config),
            stamp: Mutex::new(loaded.stamp),
            not_after: AtomicI64::new(loaded.facts.not_after),
            reloads: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
        })
    }

    /// What a new connection is offered.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().clone())
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.handshake_timeout_ms)
    }

    /// Loads the files again; on success new connections get the new pair. `why` is
    /// what asked (`"SIGHUP"`, `"files changed"`), for the audit log.
    pub fn reload(&self, why: &'static str) -> Result<(), TlsError> {
        match load(&self.cfg, unix_now()) {
            Ok(loaded) => {
                *self.current.write() = loaded.config;
                *self.stamp.lock() = loaded.stamp;
                self.not_after.store(loaded.facts.not_after, Ordering::Relaxed);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    target: "audit",
                    event = "certificate_reload",
                    outcome = "success",
                    trigger = why,
                    not_after = %utc(loaded.facts.not_after),
                    "server certificate reloaded"
                );
                Ok(())
            }
            Err(e) => {
                // The files are not looked at again until they change once more.
                *self.stamp.lock() = Stamp::of(&self.cfg);
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    target: "audit",
                    event = "certificate_reload",
                    outcome = "refused",
                    trigger = why,
                    error = %e,
                    "new server certificate refused; the old one keeps serving"
                );
                Err(e)
            }
        }
    }

    /// A handshake that failed or timed out.
    pub fn handshake_failed(&self) {
        self.handshake_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// When the served certificate expires (Unix seconds).
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::Relaxed)
    }

    pub fn report(&self, s: &mut crate::metrics::Sheet<'_>) {
        s.gauge(
            "fieldgate_tls_certificate_expiry_timestamp_seconds",
            "When the served certificate expires, in Unix seconds.",
            self.not_after(),
        );
        s.counters(
            "fieldgate_tls_certificate_reloads",
            "Certificate reloads, by outcome (a refused one leaves the old pair serving).",
            "outcome",
            [
                ("success", self.reloads.load(Ordering::Relaxed)),
                ("refused", self.refused.load(Ordering::Relaxed)),
            ],
        );
        s.counter(
            "fieldgate_tls_handshake_failures",
            "TLS handshakes that failed or did not finish in time.",
            self.handshake_failures.load(Ordering::Relaxed),
        );
    }

    /// Reloads on SIGHUP and when the files change, until `stop`.
    pub fn watch(self: Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(Duration::from_secs(self.cfg.watch_s));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hup.as_mut() {
                        Some(h) => {
                            h.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<()>();
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = hangup => {
                        let _ = self.reload("SIGHUP");
                    }
                    _ = tick.tick() => {
                        let now = Stamp::of(&self.cfg);
                        if now != *self.stamp.lock() {
                            let _ = self.reload("files changed");
                        }
                    }
                }
            }
        })
    }
}

/// What `fieldgate check` says of the pair.
#[derive(Debug, PartialEq, Eq)]
pub enum Finding {
    /// The pair would not serve, or clients of `public_url` would refuse it.
    Error(String),
    Warning(String),
    /// All is well: what is served and until when.
    Fine(String),
}

/// `fieldgate check`: the pair of `cfg` for clients of `public_url`.
pub fn check(cfg: &TlsConfig, public_url: &str) -> Vec<Finding> {
    let loaded = match load(cfg, unix_now()) {
        Ok(l) => l,
        Err(e) => return vec![Finding::Error(format!("server.tls: {e}"))],
    };
    let mut out = Vec::new();
    if let Some(host) = url::Url::parse(public_url).ok().and_then(|u| u.host_str().map(str::to_string))
        && !loaded.facts.names_host(&host)
    {
        out.push(Finding::Error(format!(
            "server.tls: the certificate's alternative names do not include {host}, the host of server.public_url"
        )));
    }
    // Whole days left, rounded up: a certificate valid 2.5 more days "expires in 3 days".
    let days = (loaded.facts.not_after - unix_now() + 86_399) / 86_400;
    if days < 14 {
        out.push(Finding::Warning(format!(
            "server.tls: the certificate expires in {days} days ({})",
            utc(loaded.facts.not_after)
        )));
    }
    if out.is_empty() {
        out.push(Finding::Fine(format!(
            "tls: {} with its key, valid until {}",
            cfg.cert_file.display(),
            utc(loaded.facts.not_after)
        )));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(
        dir: &Path,
        name: &str,
        hosts: &[&str],
        days: (i64, i64),
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let mut params =
            rcgen::CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
                .expect("params");
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(days.0);
        params.not_after = now + time::Duration::days(days.1);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let (c, k) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert.pem()).expect("write");
        std::fs::write(&k, key.serialize_pem()).expect("write");
        (c, k)
    }

    fn cfg(cert: &Path, key: &Path) -> TlsConfig {
        TlsConfig {
            cert_file: cert.into(),
            key_file: key.into(),
            client_ca_file: None,
            watch_s: 10,
            handshake_timeout_ms: 1000,
        }
    }

    #[test]
    fn a_pair_loads_and_check_finds_a_wrong_host() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pair(dir.path(), "a", &["edge01.plant"], (-1, 90));
        let l = TlsListener::load(&cfg(&c, &k)).unwrap();
        assert!(l.not_after() > unix_now() + 89 * 86_400);
        assert!(matches!(check(&cfg(&c, &k), "https://edge01.plant:8443")[..], [Finding::Fine(_)]));
        assert_eq!(
            check(&cfg(&c, &k), "https://edge02.plant:8443"),
            [Finding::Error("server.tls: the certificate's alternative names do not include edge02.plant, the host of server.public_url".into())]
        );
        let (c, k) = pair(dir.path(), "b", &["edge01.plant"], (-1, 5));
        assert!(matches!(check(&cfg(&c, &k), "https://edge01.plant")[..], [Finding::Warning(_)]));
    }

    #[test]
    fn mismatched_expired_and_future_pairs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (c1, _) = pair(dir.path(), "a", &["h"], (-1, 90));
        let (_, k2) = pair(dir.path(), "b", &["h"], (-1, 90));
        assert_eq!(TlsListener::load(&cfg(&c1, &k2)).err(), Some(TlsError::KeyMismatch));
        let (c, k) = pair(dir.path(), "old", &["h"], (-30, -1));
        assert!(matches!(TlsListener::load(&cfg(&c, &k)).err(), Some(TlsError::Expired(_))));
        let (c, k) = pair(dir.path(), "new", &["h"], (2, 30));
        assert!(matches!(TlsListener::load(&cfg(&c, &k)).err(), Some(TlsError::NotYetValid(_))));
        std::fs::write(&c, "not pem").unwrap();
        assert!(matches!(TlsListener::load(&cfg(&c, &k)).err(), Some(TlsError::NoCertificate(_))));
    }

    #[test]
    fn a_bad_reload_keeps_the_old_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pair(dir.path(), "a", &["h"], (-1, 90));
        let l = TlsListener::load(&cfg(&c, &k)).unwrap();
        let before = l.not_after();
        let (_, other_key) = pair(dir.path(), "b", &["h"], (-1, 10));
        std::fs::copy(&other_key, &k).unwrap();
        assert_eq!(l.reload("test"), Err(TlsError::KeyMismatch));
        assert_eq!(l.not_after(), before);
        let (c3, k3) = pair(dir.path(), "c", &["h"], (-1, 10));
        std::fs::copy(&c3, &c).unwrap();
        std::fs::copy(&k3, &k).unwrap();
        l.reload("test").unwrap();
        assert!(l.not_after() < before, "the new pair (10 days) is served");
    }
}
