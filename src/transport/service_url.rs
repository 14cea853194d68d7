//! Where a running fieldgate is, as the command line names it (`http://host:port` or
//! `https://host:port`), and a connection to it: plain, or over TLS for `https`, checking
//! the server's certificate against the system's certificate authorities and those of the
//! PEM file `FIELDGATE_CA_FILE` names (a plant's own CA). With `FIELDGATE_CLIENT_CERT_FILE`
//! and `FIELDGATE_CLIENT_KEY_FILE` set, that certificate is presented (a listener with
//! `client_ca_file` asks for one).

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::client::HttpClient;

/// A running fieldgate's address, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    pub https: bool,
    /// As the URL names it: what the certificate must name, and the `Host` header.
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for ServiceUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", if self.https { "https" } else { "http" }, self.authority())
    }
}

/// Why no connection was made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("--url must be http://host:port or https://host:port")]
    Url,
    #[error("cannot resolve {0}")]
    Resolve(String),
    #[error("{0}")]
    Trust(String),
    #[error("cannot reach {url}: {why}")]
    Io { url: String, why: String, refused: bool },
}

impl ServiceUrl {
    /// `http://host:port` or `https://host:port` (a trailing `/` allowed; the port defaults
    /// to the scheme's).
    pub fn parse(text: &str) -> Result<ServiceUrl, ConnectError> {
        let u = url::Url::parse(text.trim()).map_err(|_| ConnectError::Url)?;
        let https = match u.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(ConnectError::Url),
        };
        let plain = u.username().is_empty() && u.password().is_none() && u.query().is_none();
        if !plain || u.fragment().is_some() || !matches!(u.path(), "" | "/") {
            return Err(ConnectError::Url);
        }
        let host = u.host_str().ok_or(ConnectError::Url)?.to_string();
        let port = u.port_or_known_default().ok_or(ConnectError::Url)?;
        Ok(ServiceUrl { https, host, port })
    }

    /// `host:port`, an IPv6 host in brackets (as `url` gives it).
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Connects to the first address the host resolves to that takes the connection (a
    /// name may resolve to `::1` and `127.0.0.1` with the service on one of them).
    pub async fn connect(&self) -> Result<HttpClient, ConnectError> {
        let authority = self.authority();
        let addrs: Vec<SocketAddr> =
            tokio::net::lookup_host(&authority).await.map(Iterator::collect).unwrap_or_default();
        self.connect_any(addrs).await
    }

    /// Connects to the first of `addrs` that takes the connection.
    async fn connect_any(&self, addrs: Vec<SocketAddr>) -> Result<HttpClient, ConnectError> {
        let mut last = ConnectError::Resolve(self.authority());
        for addr in addrs {
            match self.connect_to(addr).await {
                Ok(c) => return Ok(c),
                // Refused or unreachable there: the next address may answer. A TLS failure
                // is the service's own answer: no other address is tried.
                Err(e @ ConnectError::Io { refused: true, .. }) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Connects to `addr`, speaking to it as this URL's host (TLS checks its name).
    pub async fn connect_to(&self, addr: SocketAddr) -> Result<HttpClient, ConnectError> {
        let io = |e: std::io::Error| ConnectError::Io {
            url: self.to_string(),
            why: e.to_string(),
            refused: false,
        };
        let tcp_failed =
            |e: std::io::Error| ConnectError::Io { url: self.to_string(), why: e.to_string(), refused: true };
        if !self.https {
            return HttpClient::connect(addr).await.map_err(tcp_failed);
        }
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config()?));
        let name = ServerName::try_from(self.host.trim_start_matches('[').trim_end_matches(']').to_string())
            .map_err(|_| ConnectError::Url)?;
        let tcp = tokio::time::timeout(super::client::TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| tcp_failed(std::io::ErrorKind::TimedOut.into()))?
            .map_err(tcp_failed)?;
        tcp.set_nodelay(true).map_err(io)?;
        let tls = tokio::time::timeout(std::time::Duration::from_secs(10), connector.connect(name, tcp))
            .await
            .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
            .map_err(|e| ConnectError::Io { url: self.to_string(), why: self.short(&e), refused: false })?;
        HttpClient::over(tls, self.authority()).await.map_err(io)
    }
}

impl ServiceUrl {
    /// A TLS failure in a few words, with what to do about it.
    fn short(&self, e: &std::io::Error) -> String {
        use rustls::CertificateError as C;
        let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
            return e.to_string();
        };
        match tls {
            rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
                "its certificate is not signed by a CA this command trusts; name the CA's PEM file in FIELDGATE_CA_FILE".into()
            }
            rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
                "its certificate has expired".into()
            }
            rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
                "its certificate is not valid yet".into()
            }
            rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                format!("its certificate does not name {}", self.host)
            }
            rustls::Error::InvalidCertificate(_) => "its certificate is refused".into(),
            rustls::Error::AlertReceived(_) => {
                "it refused the TLS handshake (a listener that asks for a client certificate: set FIELDGATE_CLIENT_CERT_FILE and FIELDGATE_CLIENT_KEY_FILE)".into()
            }
            _ => "the TLS handshake failed".into(),
        }
    }
}

/// The client side of TLS: the system's CAs and `FIELDGATE_CA_FILE`'s, and a client
/// certificate when one is named.
fn client_config() -> Result<rustls::ClientConfig, ConnectError> {
    crate::tls::install_crypto_provider();
    let read = |var: &str| -> Result<Option<(String, Vec<u8>)>, ConnectError> {
        let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) else { return Ok(None) };
        let path = std::path::PathBuf::from(path);
        crate::toml_reader::read_text_file(&path)
            .map(|t| Some((path.display().to_string(), t.into_bytes())))
            .map_err(|why| ConnectError::Trust(format!("{var}: {}: {why}", path.display())))
    };
    let certs = |name: &str, pem: &[u8]| {
        let list: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|_| ConnectError::Trust(format!("{name} is not a PEM file of certificates")))?;
        if list.is_empty() {
            Err(ConnectError::Trust(format!("{name} holds no certificate")))
        } else {
            Ok(list)
        }
    };
    let extra = match read("FIELDGATE_CA_FILE")? {
        Some((name, pem)) => certs(&name, &pem)?,
        None => Vec::new(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
        .map_err(|e| {
            ConnectError::Trust(format!("no certificate authorities to check the server with ({e})"))
        })?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::Trust(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match (read("FIELDGATE_CLIENT_CERT_FILE")?, read("FIELDGATE_CLIENT_KEY_FILE")?) {
        (Some((name, cert)), Some((key_name, key))) => {
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|_| ConnectError::Trust(format!("{key_name} holds no private key")))?;
            builder
                .with_client_auth_cert(certs(&name, &cert)?, key)
                .map_err(|_| ConnectError::Trust(format!("{key_name} is not the key of {name}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(ConnectError::Trust(
                "FIELDGATE_CLIENT_CERT_FILE and FIELDGATE_CLIENT_KEY_FILE go together".into(),
            ));
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that resolves to several addresses: the first refusing, the next taken.
    #[tokio::test]
    async fn the_next_address_is_tried_when_one_refuses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let url = ServiceUrl { https: false, host: "both.test".into(), port: open.port() };
        assert!(url.connect_any(vec![closed, open]).await.is_ok());
        let e = url.connect_any(vec![closed]).await.err().expect("refused").to_string();
        assert!(e.starts_with("cannot reach http://both.test:"), "{e}");
        assert!(matches!(url.connect_any(Vec::new()).await, Err(ConnectError::Resolve(_))));
    }

    #[test]
    fn urls_are_parsed_once() {
        let u = ServiceUrl::parse("https://edge01.plant:8443/").unwrap();
        assert_eq!((u.https, u.host.as_str(), u.port), (true, "edge01.plant", 8443));
        assert_eq!(u.to_string(), "https://edge01.plant:8443");
        assert_eq!(ServiceUrl::parse("http://127.0.0.1:8080").unwrap().to_string(), "http://127.0.0.1:8080");
        assert_eq!(ServiceUrl::parse("https://edge01").unwrap().port, 443);
        assert_eq!(ServiceUrl::parse("http://[::1]:8080").unwrap().authority(), "[::1]:8080");
        for bad in ["edge01:8080", "ftp://h:1", "https://u:p@h:1", "http://h:1/v1", "http://h:1?x=1", ""] {
            assert!(ServiceUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
