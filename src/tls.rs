//! TLS for fieldgate's clients: one rustls crypto provider (ring) for the whole process.
//!
//! Every client that speaks TLS (the work-order webhook today, an MQTT client later)
//! calls [`install_crypto_provider`] before it builds its configuration, so the process
//! uses ring everywhere and never links a second provider. (OPC UA's secure channels
//! use async-opcua's own cryptography, not TLS.)

/// Installs ring as the process's rustls provider, once; a provider installed before
/// (by an embedding program) is kept.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Err only when another thread installed one meanwhile: that one is used.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// What fieldgate reads of an X.509 certificate (DER): its alternative names and validity.
pub struct CertFacts {
    names: Vec<x509_cert::ext::pkix::name::GeneralName>,
    /// Seconds since the Unix epoch.
    pub not_before: i64,
    pub not_after: i64,
}

impl CertFacts {
    /// `None` when `der` is not a certificate.
    pub fn of(der: &[u8]) -> Option<CertFacts> {
        use x509_cert::der::Decode;
        use x509_cert::ext::pkix::SubjectAltName;
        let cert = x509_cert::Certificate::from_der(der).ok()?;
        let tbs = &cert.tbs_certificate;
        let names = match tbs.get::<SubjectAltName>() {
            Ok(Some((_, SubjectAltName(names)))) => names,
            _ => Vec::new(),
        };
        let secs = |t: x509_cert::time::Time| i64::try_from(t.to_unix_duration().as_secs()).ok();
        Some(CertFacts {
            names,
            not_before: secs(tbs.validity.not_before)?,
            not_after: secs(tbs.validity.not_after)?,
        })
    }

    /// Whether `host` (a DNS name or an IP address, brackets allowed) is one of the
    /// certificate's alternative names. A wildcard name (`*.plant`) covers one label.
    pub fn names_host(&self, host: &str) -> bool {
        use x509_cert::ext::pkix::name::GeneralName;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip: Option<std::net::IpAddr> = host.parse().ok();
        self.names.iter().any(|n| match n {
            GeneralName::DnsName(d) => {
                let d = d.as_str();
                d.eq_ignore_ascii_case(host)
                    || (ip.is_none()
                        && d.strip_prefix("*.").is_some_and(|rest| {
                            host.split_once('.').is_some_and(|(_, h)| h.eq_ignore_ascii_case(rest))
                        }))
            }
            GeneralName::IpAddress(o) => {
                let b = o.as_bytes();
                let named = match b.len() {
                    4 => <[u8; 4]>::try_from(b).ok().map(std::net::IpAddr::from),
                    16 => <[u8; 16]>::try_from(b).ok().map(std::net::IpAddr::from),
                    _ => None,
                };
                named.is_some() && named == ip
            }
            _ => false,
        })
    }

    /// Whether `uri` is one of the certificate's alternative names.
    pub fn names_uri(&self, uri: &str) -> bool {
        use x509_cert::ext::pkix::name::GeneralName;
        self.names.iter().any(|n| matches!(n, GeneralName::UniformResourceIdentifier(u) if u.as_str() == uri))
    }
}
