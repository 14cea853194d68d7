//! One MQTT connection to a broker (rumqttc), as both Sparkplug sides make it: its options
//! (clean session, keep-alive, the will: an edge node's NDEATH with this connection's
//! `bdSeq`, a host application's STATE offline), credentials, TLS with the process's
//! rustls provider, the certificate files read again for every connection.

use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, LastWill, MqttOptions, QoS, TlsConfiguration, Transport,
};
use tokio::sync::mpsc;

use crate::config::mqtt::{Broker, MqttConfig};

/// Requests rumqttc may hold for one connection; the edge node keeps what it hands over
/// below this, so a hand-over never fails for room (see `sparkplug/run.rs`).
pub const REQUESTS: usize = 512;

/// The largest message the node takes from the broker (commands and STATE are small).
pub const MAX_INCOMING: usize = 1 << 20;

/// The configuration keys a connection is made from (`[mqtt]` for the edge node, `[hub]`
/// for the host application: the same keys, the same rules).
pub struct Connection<'a> {
    pub ca_file: Option<&'a std::path::Path>,
    pub client_cert_file: Option<&'a std::path::Path>,
    pub client_key_file: Option<&'a std::path::Path>,
    /// Empty: the default client ID the caller gives.
    pub client_id: &'a str,
    pub username_env: &'a str,
    pub password_env: &'a str,
    pub keep_alive_s: u64,
}

impl<'a> From<&'a MqttConfig> for Connection<'a> {
    fn from(c: &'a MqttConfig) -> Connection<'a> {
        Connection {
            ca_file: c.ca_file.as_deref(),
            client_cert_file: c.client_cert_file.as_deref(),
            client_key_file: c.client_key_file.as_deref(),
            client_id: &c.client_id,
            username_env: &c.username_env,
            password_env: &c.password_env,
            keep_alive_s: c.keep_alive_s,
        }
    }
}

/// A connection's last will: published by the broker when the connection dies.
pub struct Will {
    pub topic: String,
    pub payload: Vec<u8>,
    /// Retained (a host application's STATE), or not (an edge node's NDEATH).
    pub retain: bool,
}

/// What every connection of one client shares.
pub struct Settings {
    pub client_id: String,
    pub credentials: Option<(String, String)>,
    /// The CA and client certificate files, read again for every connection (a rotation
    /// needs no restart), and what they held when last read whole.
    tls_files: Option<TlsFiles>,
    last_tls: parking_lot::Mutex<Option<TlsConfiguration>>,
    pub keep_alive: Duration,
    /// The largest message taken from the broker: a larger one drops the connection
    /// (rumqttc cannot skip it). [`MAX_INCOMING`] unless the owner sets another.
    pub max_incoming: usize,
}

struct TlsFiles {
    ca: std::path::PathBuf,
    client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl TlsFiles {
    fn read(&self) -> Result<TlsConfiguration, LinkError> {
        let read = |p: &std::path::Path| {
            crate::toml_reader::read_text_file(p)
                .map(String::into_bytes)
                .map_err(|why| LinkError::File { file: p.display().to_string(), why })
        };
        let client_auth = match &self.client {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        let ca = read(&self.ca)?;
        self.usable(&ca, client_auth.as_ref())?;
        Ok(TlsConfiguration::Simple { ca, alpn: None, client_auth })
    }

    /// Whether the files hold what a connection needs: the CA certificates, and the client
    /// certificate with its own key. A file half written (a rotation caught in the middle)
    /// or a key of another certificate is refused here, so the last good files are used.
    fn usable(&self, ca: &[u8], client: Option<&(Vec<u8>, Vec<u8>)>) -> Result<(), LinkError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let invalid = |p: &std::path::Path, why: &str| LinkError::File {
            file: p.display().to_string(),
            why: why.into(),
        };
        let certs = |pem: &[u8], p: &std::path::Path| {
            let list: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(|_| invalid(p, "a certificate in it is not valid PEM"))?;
            if list.is_empty() { Err(invalid(p, "it holds no certificate")) } else { Ok(list) }
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca, &self.ca)? {
            roots.add(c).map_err(|_| invalid(&self.ca, "a certificate in it cannot be read"))?;
        }
        let (Some((cert, key)), Some((cert_path, key_path))) = (client, &self.client) else { return Ok(()) };
        let chain = certs(cert, cert_path)?;
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|_| invalid(key_path, "it holds no private key"))?;
        crate::tls::install_crypto_provider();
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|_| invalid(key_path, "no TLS version to use"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map(drop)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                invalid(key_path, "it is not the key of the client certificate")
            }
            _ => invalid(key_path, "the key cannot be used"),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot read {file}: {why}")]
    File { file: String, why: String },
    #[error("the environment variable {0} is not set")]
    Env(String),
}

impl Settings {
    /// From the configuration: files read and variables looked up now; `default_client_id`
    /// when the configuration names none.
    pub fn of(
        c: &Connection<'_>,
        default_client_id: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, LinkError> {
        let tls_files = c.ca_file.map(|ca| TlsFiles {
            ca: ca.to_path_buf(),
            client: c
                .client_cert_file
                .map(|p| p.to_path_buf())
                .zip(c.client_key_file.map(|p| p.to_path_buf())),
        });
        // Read once now: a file that cannot be read stops the start.
        let tls = tls_files.as_ref().map(TlsFiles::read).transpose()?;
        let var = |name: &str| env(name).ok_or_else(|| LinkError::Env(name.to_string()));
        let credentials = match (c.username_env, c.password_env) {
            ("", _) => None,
            (u, "") => Some((var(u)?, String::new())),
            (u, p) => Some((var(u)?, var(p)?)),
        };
        let client_id =
            if c.client_id.is_empty() { default_client_id.to_string() } else { c.client_id.to_string() };
        Ok(Settings {
            client_id,
            credentials,
            tls_files,
            last_tls: parking_lot::Mutex::new(tls),
            keep_alive: Duration::from_secs(c.keep_alive_s),
            max_incoming: MAX_INCOMING,
        })
    }

    /// The TLS files as they are now; what they held last when they cannot be read whole
    /// (a rotation half done), with a log line.
    fn tls(&self) -> Option<TlsConfiguration> {
        let files = self.tls_files.as_ref()?;
        match files.read() {
            Ok(t) => {
                *self.last_tls.lock() = Some(t.clone());
                Some(t)
            }
            Err(error) => {
                tracing::warn!(%error, "mqtt: the TLS files cannot be read; connecting with what they held before");
                self.last_tls.lock().clone()
            }
        }
    }
}

/// Why a connection failed, in a few words (never the broker's or the library's text).
pub fn reason(e: &rumqttc::ConnectionError) -> String {
    use rumqttc::{ConnectReturnCode as Code, ConnectionError as E};
    match e {
        E::ConnectionRefused(Code::BadUserNamePassword) => {
            "the broker refused the user name or password".into()
        }
        // Mosquitto answers a wrong password so on MQTT 3.1.1.
        E::ConnectionRefused(Code::NotAuthorized) => {
            "the broker refused this client: not authorized (its user name, password or client ID)".into()
        }
        E::ConnectionRefused(code) => format!("the broker refused the connection ({code:?})"),
        E::Tls(_) => "the TLS handshake with the broker failed (its certificate, or ours)".into(),
        E::Io(io) => format!("cannot reach the broker ({})", io.kind()),
        E::NetworkTimeout | E::FlushTimeout => "the broker did not answer in time".into(),
        _ => "the connection to the broker broke".into(),
    }
}

/// A connection being made (or made) to `broker`, with `will` as its last will (QoS 1).
pub fn open(s: &Settings, broker: &Broker, will: Will) -> (AsyncClient, EventLoop) {
    let mut o = MqttOptions::new(s.client_id.clone(), broker.host.clone(), broker.port);
    o.set_keep_alive(s.keep_alive);
    // Sparkplug B on MQTT 3.1.1: a clean session on every connect.
    o.set_clean_session(true);
    o.set_last_will(LastWill::new(will.topic, will.payload, QoS::AtLeastOnce, will.retain));
    // Births of large devices and drained chunks exceed rumqttc's 10 KiB default.
    o.set_max_packet_size(s.max_incoming, 64 << 20);
    o.set_inflight(256);
    if let Some((u, p)) = &s.credentials {
        o.set_credentials(u.clone(), p.clone());
    }
    if broker.tls {
        crate::tls::install_crypto_provider();
        if let Some(t) = s.tls() {
            o.set_transport(Transport::Tls(t));
        }
    }
    let (client, mut events) = AsyncClient::new(o, REQUESTS);
    // A value (or a rebirth request) goes out when it is published, not when the broker
    // acknowledged the message before it (Nagle's wait can reach its delayed ACK, 40 ms).
    let mut network = events.network_options();
    network.set_tcp_nodelay(true);
    events.set_network_options(network);
    (client, events)
}

/// One connection: the client, and its events from a task of their own. rumqttc's
/// `EventLoop::poll` is not cancel safe (dropped while connecting, the half-made connection
/// closes and the broker publishes the will: an NDEATH before the NBIRTH it belongs to; dropped
/// while writing, a request is lost), so it is never raced in a `select!`.
pub struct Link {
    pub client: AsyncClient,
    pub events: mpsc::Receiver<Result<Event, ConnectionError>>,
    /// Dropping the link ends the task, which drops the connection.
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Link {
    pub fn new(client: AsyncClient, mut events: EventLoop) -> Link {
        // Bounded: a client that falls behind slows the connection down rather than queueing.
        let (tx, rx) = mpsc::channel(REQUESTS);
        let task = tokio::spawn(async move {
            loop {
                let ev = events.poll().await;
                let end = ev.is_err();
                // After an error the owner drops the link; the next connection is a new one.
                if tx.send(ev).await.is_err() || end {
                    break;
                }
            }
        });
        Link { client, events: rx, _task: AbortOnDrop(task) }
    }
}

/// The host name, as an edge node ID can hold it.
pub fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '-' })
        .collect();
    if clean.is_empty() { "edge".into() } else { clean }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

    /// A CA, and a client certificate with its key, as PEM.
    fn files() -> (String, String, String) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["edge".into()]).unwrap().signed_by(&key, &ca).unwrap();
        (ca.pem(), cert.pem(), key.serialize_pem())
    }

    fn client_cert(t: &TlsConfiguration) -> Vec<u8> {
        match t {
            TlsConfiguration::Simple { client_auth: Some((cert, _)), .. } => cert.clone(),
            _ => Vec::new(),
        }
    }

    /// A rotation caught half way (a file cut short, a key that is not the certificate's)
    /// is not used: the connection is made with what the files held when last whole.
    #[test]
    fn half_written_or_mismatched_files_fall_back_to_the_last_good_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = files();
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("ca.pem"), &ca).unwrap();
        std::fs::write(p("c.pem"), &cert).unwrap();
        std::fs::write(p("c.key"), &key).unwrap();
        let cfg = MqttConfig {
            ca_file: Some(p("ca.pem")),
            client_cert_file: Some(p("c.pem")),
            client_key_file: Some(p("c.key")),
            ..MqttConfig::default()
        };
        let s = Settings::of(&(&cfg).into(), "fieldgate-gw", |_| None).unwrap();
        let good = client_cert(&s.tls().unwrap());
        assert_eq!(good, cert.as_bytes());

        std::fs::write(p("c.pem"), &cert[..300]).unwrap();
        assert_eq!(client_cert(&s.tls().unwrap()), good, "a certificate cut short");
        std::fs::write(p("c.pem"), &cert).unwrap();
        let (_, _, other_key) = files();
        std::fs::write(p("c.key"), &other_key).unwrap();
        assert_eq!(client_cert(&s.tls().unwrap()), good, "another certificate's key");
        std::fs::write(p("c.key"), &key[..100]).unwrap();
        assert_eq!(client_cert(&s.tls().unwrap()), good, "a key cut short");
        std::fs::write(p("ca.pem"), "not a certificate").unwrap();
        assert_eq!(client_cert(&s.tls().unwrap()), good, "a CA file without a certificate");

        // A new whole pair is taken.
        let (ca2, cert2, key2) = files();
        for (n, text) in [("ca.pem", &ca2), ("c.pem", &cert2), ("c.key", &key2)] {
            std::fs::write(p(n), text).unwrap();
        }
        assert_eq!(client_cert(&s.tls().unwrap()), cert2.as_bytes());

        // At start, files that cannot be used stop the start, naming the file.
        std::fs::write(p("c.key"), &other_key).unwrap();
        let e = Settings::of(&(&cfg).into(), "fieldgate-gw", |_| None).err().expect("refused").to_string();
        assert!(e.contains("c.key") && e.contains("not the key of the client certificate"), "{e}");
    }
}
