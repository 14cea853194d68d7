//! One MQTT connection to a broker (rumqttc): its options (clean session, keep-alive, the
//! NDEATH will with this connection's `bdSeq`, credentials, TLS with the process's rustls
//! provider), and the counters `/metrics` and `get_device_status` show.

use std::time::Duration;

use rumqttc::{AsyncClient, EventLoop, LastWill, MqttOptions, QoS, TlsConfiguration, Transport};

use super::node::Out;
use crate::config::mqtt::{Broker, MqttConfig};
use crate::metrics::sparkplug::Counters;

/// Requests rumqttc may hold for one connection; the edge node keeps what it hands over
/// below this, so a hand-over never fails for room (see `run.rs`).
pub const REQUESTS: usize = 512;

/// The largest message the node takes from the broker (commands and STATE are small).
pub const MAX_INCOMING: usize = 1 << 20;

/// What every connection of this edge node shares.
pub struct Settings {
    pub client_id: String,
    pub credentials: Option<(String, String)>,
    /// The CA and client certificate files, read again for every connection (a rotation
    /// needs no restart), and what they held when last read whole.
    tls_files: Option<TlsFiles>,
    last_tls: parking_lot::Mutex<Option<TlsConfiguration>>,
    pub keep_alive: Duration,
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
        Ok(TlsConfiguration::Simple { ca: read(&self.ca)?, alpn: None, client_auth })
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
    /// From the configuration: files read and variables looked up now.
    pub fn of(
        c: &MqttConfig,
        node_id: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, LinkError> {
        let tls_files = c.ca_file.as_ref().map(|ca| TlsFiles {
            ca: ca.clone(),
            client: c.client_cert_file.clone().zip(c.client_key_file.clone()),
        });
        // Read once now: a file that cannot be read stops the start.
        let tls = tls_files.as_ref().map(TlsFiles::read).transpose()?;
        let var = |name: &str| env(name).ok_or_else(|| LinkError::Env(name.to_string()));
        let credentials = match (c.username_env.as_str(), c.password_env.as_str()) {
            ("", _) => None,
            (u, "") => Some((var(u)?, String::new())),
            (u, p) => Some((var(u)?, var(p)?)),
        };
        let client_id =
            if c.client_id.is_empty() { format!("fieldgate-{node_id}") } else { c.client_id.clone() };
        Ok(Settings {
            client_id,
            credentials,
            tls_files,
            last_tls: parking_lot::Mutex::new(tls),
            keep_alive: Duration::from_secs(c.keep_alive_s),
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
                tracing::warn!(%error, "sparkplug: the TLS files cannot be read; connecting with what they held before");
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

/// A connection being made (or made) to `broker`, with `will` as its NDEATH.
pub fn open(s: &Settings, broker: &Broker, will: (String, Vec<u8>)) -> (AsyncClient, EventLoop) {
    let mut o = MqttOptions::new(s.client_id.clone(), broker.host.clone(), broker.port);
    o.set_keep_alive(s.keep_alive);
    // Sparkplug B on MQTT 3.1.1: a clean session on every connect.
    o.set_clean_session(true);
    o.set_last_will(LastWill::new(will.0, will.1, QoS::AtLeastOnce, false));
    // Births of large devices and drained chunks exceed rumqttc's 10 KiB default.
    o.set_max_packet_size(MAX_INCOMING, 64 << 20);
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
    AsyncClient::new(o, REQUESTS)
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

/// Hands `out` to the client (QoS 1 for data only when `data_qos = 1`); false when it
/// cannot take it now.
pub fn publish(
    client: Option<&AsyncClient>,
    data_qos: u8,
    queued: &mut u64,
    counters: &Counters,
    out: Out,
) -> bool {
    let Some(client) = client else { return false };
    let qos = if out.data && data_qos == 1 { QoS::AtLeastOnce } else { QoS::AtMostOnce };
    match client.try_publish(out.topic, qos, false, out.payload) {
        Ok(()) => {
            *queued += 1;
            Counters::add(&counters.metrics_sent, out.metrics as u64);
            true
        }
        Err(_) => false,
    }
}
