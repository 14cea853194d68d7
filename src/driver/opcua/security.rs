//! OPC UA security: which endpoint to ask for, who fieldgate is (its application
//! certificate and, per device, a user), and which servers it trusts.
//!
//! The PKI folder (`<data_dir>/pki`) has async-opcua's layout: `own/cert.der` and
//! `private/private.pem` (fieldgate's certificate, created on first start when a device
//! needs it), `trusted/` (server certificates an operator has accepted) and `rejected/`
//! (server certificates seen but not trusted; moving one to `trusted/` accepts it).

use std::path::{Path, PathBuf};

use opcua::client::{ClientBuilder, IdentityToken};
use opcua::crypto::{SecurityPolicy, X509};
use opcua::types::{ByteString, MessageSecurityMode, StatusCode};

use crate::driver::Refusal;
use crate::registry::OpcUaSettings;

/// What a device's `[opcua]` table asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Security {
    pub policy: SecurityPolicy,
    pub mode: MessageSecurityMode,
    pub identity: Identity,
}

/// Who fieldgate says it is to a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    Anonymous,
    /// A user name and password, read from these environment variables at connect time.
    User {
        user_env: String,
        password_env: String,
    },
}

impl Security {
    /// The security of a device file's settings (`None` when there is no `[opcua]`).
    /// The registry has checked the names; an unknown one reads as `Unknown` and no
    /// endpoint will match it.
    pub fn of(settings: Option<&OpcUaSettings>) -> Security {
        let Some(s) = settings else {
            return Security {
                policy: SecurityPolicy::None,
                mode: MessageSecurityMode::None,
                identity: Identity::Anonymous,
            };
        };
        let policy = match s.security_policy.as_str() {
            "None" => SecurityPolicy::None,
            "Basic256Sha256" => SecurityPolicy::Basic256Sha256,
            "Aes128_Sha256_RsaOaep" => SecurityPolicy::Aes128Sha256RsaOaep,
            "Aes256_Sha256_RsaPss" => SecurityPolicy::Aes256Sha256RsaPss,
            _ => SecurityPolicy::Unknown,
        };
        let mode = match s.security_mode.as_str() {
            "Sign" => MessageSecurityMode::Sign,
            "SignAndEncrypt" => MessageSecurityMode::SignAndEncrypt,
            _ => MessageSecurityMode::None,
        };
        let identity = match (&s.username_env, &s.password_env) {
            (Some(u), Some(p)) => Identity::User { user_env: u.clone(), password_env: p.clone() },
            _ => Identity::Anonymous,
        };
        Security { policy, mode, identity }
    }

    /// Whether messages are signed (and maybe encrypted): fieldgate needs its certificate.
    pub fn is_secured(&self) -> bool {
        self.policy != SecurityPolicy::None
    }

    /// The identity token to open a session with; credentials come from the environment.
    pub fn token(&self) -> Result<IdentityToken, Refusal> {
        match &self.identity {
            Identity::Anonymous => Ok(IdentityToken::Anonymous),
            Identity::User { user_env, password_env } => {
                let var = |name: &String| {
                    std::env::var(name)
                        .ok()
                        .filter(|v| !v.is_empty())
                        .ok_or_else(|| Refusal::CredentialsMissing { var: name.clone() })
                };
                Ok(IdentityToken::new_user_name(var(user_env)?, var(password_env)?))
            }
        }
    }

    /// The environment variables naming the user, for messages.
    pub fn user_vars(&self) -> Option<(String, String)> {
        match &self.identity {
            Identity::Anonymous => None,
            Identity::User { user_env, password_env } => Some((user_env.clone(), password_env.clone())),
        }
    }

    /// The names used in device files, for messages.
    pub fn names(&self) -> (String, String) {
        let policy = match self.policy {
            SecurityPolicy::Aes128Sha256RsaOaep => "Aes128_Sha256_RsaOaep".to_string(),
            SecurityPolicy::Aes256Sha256RsaPss => "Aes256_Sha256_RsaPss".to_string(),
            SecurityPolicy::Unknown => "unknown".to_string(),
            p => p.to_str().to_string(),
        };
        (policy, self.mode.to_string())
    }
}

/// What a person checking the device files should know about a device's OPC UA security
/// here (`fieldgate check`): where certificates go, and credentials this environment lacks.
pub fn notes(device: &crate::registry::Device, pki: &Pki) -> Vec<String> {
    let security = Security::of(device.opcua.as_ref());
    let mut out = Vec::new();
    if security.is_secured() {
        let (policy, mode) = security.names();
        out.push(format!(
            "note: {} uses {policy}/{mode}: fieldgate's certificate is {} (created on first start); put the server's certificate in {}",
            device.id,
            pki.own_certificate().display(),
            pki.trusted_dir().display()
        ));
        if let Some(until) = pki.own_expiry().filter(|t| *t < chrono::Utc::now() + chrono::Days::new(30)) {
            out.push(format!(
                "warning: fieldgate's OPC UA certificate expires {}; delete {} and its key to have a new one made, then give it to the servers' administrators",
                until.format("%Y-%m-%d"),
                pki.own_certificate().display()
            ));
        }
    }
    if let Some((user, password)) = security.user_vars() {
        for var in [user, password] {
            if std::env::var(&var).map_or(true, |v| v.is_empty()) {
                out.push(format!(
                    "warning: {}: environment variable {var} is not set here; the device cannot be read without it",
                    device.id
                ));
            }
        }
    }
    out
}

/// fieldgate's PKI folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(dir: impl Into<PathBuf>) -> Pki {
        Pki { dir: dir.into() }
    }

    pub fn own_certificate(&self) -> PathBuf {
        self.dir.join("own").join("cert.der")
    }

    pub fn trusted_dir(&self) -> PathBuf {
        self.dir.join("trusted")
    }

    pub fn rejected_dir(&self) -> PathBuf {
        self.dir.join("rejected")
    }

    /// When fieldgate's certificate stops being valid, if it exists and can be read.
    pub fn own_expiry(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let der = std::fs::read(self.own_certificate()).ok()?;
        X509::from_der(&der).ok()?.not_after().ok()
    }

    /// Creates the folders and fieldgate's application certificate and key unless they
    /// exist; returns the certificate's path (the file to give servers' administrators).
    pub fn ensure(&self) -> Result<PathBuf, String> {
        let cert = self.own_certificate();
        let key = self.dir.join("private").join("private.pem");
        if !(cert.is_file() && key.is_file()) {
            // async-opcua writes a self-signed certificate (RSA 2048, the host's names and
            // addresses, urn:fieldgate) when it finds none; it reports failure only in its log.
            let _ = client_builder(&self.dir, true).client();
        }
        if cert.is_file() && key.is_file() {
            Ok(cert)
        } else {
            Err(format!("cannot create fieldgate's OPC UA certificate in {}", self.dir.display()))
        }
    }

    /// Trusts the server certificate in `der` (what an operator does by moving its file to
    /// `trusted/`); returns where it was written.
    pub fn trust(&self, der: &[u8]) -> Result<PathBuf, String> {
        let cert = X509::from_der(der).map_err(|e| format!("not a DER certificate: {e}"))?;
        let dir = self.trusted_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {}", dir.display(), e.kind()))?;
        let path = dir.join(file_name_of(&cert));
        std::fs::write(&path, der).map_err(|e| format!("cannot write {}: {}", path.display(), e.kind()))?;
        Ok(path)
    }

    /// Why a secured connection failed with `status`, given the certificate the server
    /// presented: an untrusted server (its certificate is now in `rejected/`), or a server
    /// that did not accept fieldgate.
    pub fn refusal_for(&self, server_cert: &ByteString, status: StatusCode) -> Option<Refusal> {
        // A certificate that is trusted but does not fit (checked by async-opcua after trust).
        let unfit = match status {
            s if s == StatusCode::BadCertificateHostNameInvalid => {
                Some("its host names do not include the endpoint's host")
            }
            s if s == StatusCode::BadCertificateUriInvalid => Some("its application URI is not the server's"),
            s if s == StatusCode::BadCertificateTimeInvalid => Some("it has expired or is not valid yet"),
            s if s == StatusCode::BadCertificateRevoked => Some("it is revoked"),
            s if s == StatusCode::BadCertificateInvalid => {
                Some("it is malformed or its key does not fit the security policy")
            }
            _ => None,
        };
        let untrusted_status = [StatusCode::BadCertificateUntrusted, StatusCode::BadSecurityChecksFailed];
        if unfit.is_none() && !untrusted_status.contains(&status) {
            return None;
        }
        let cert = X509::from_byte_string(server_cert).ok()?;
        let thumbprint = cert.thumbprint().as_hex_string();
        let name = file_name_of(&cert);
        if !self.trusted_dir().join(&name).is_file() {
            // Make sure the file the message points at is there (async-opcua writes it when
            // it first sees the certificate; a copy that was deleted since is restored).
            let rejected = self.rejected_dir().join(&name);
            if !rejected.is_file() {
                let _ = std::fs::create_dir_all(self.rejected_dir());
                if let Ok(der) = cert.to_der() {
                    let _ = std::fs::write(&rejected, der);
                }
            }
            return Some(Refusal::UntrustedServer {
                thumbprint,
                rejected_dir: self.rejected_dir(),
                trusted_dir: self.trusted_dir(),
            });
        }
        if let Some(reason) = unfit {
            return Some(Refusal::UnfitServerCertificate { thumbprint, reason });
        }
        Some(Refusal::ClientNotTrusted { own_certificate: self.own_certificate() })
    }
}

impl Pki {
    /// Whether the server certificate in `der` is one an operator trusted.
    pub fn trusts(&self, der: &ByteString) -> bool {
        X509::from_byte_string(der).is_ok_and(|c| self.trusted_dir().join(file_name_of(&c)).is_file())
    }
}

/// Why a trusted server certificate does not fit the server at `host` whose application URI
/// is `application_uri`, at `now`; `None` when it fits. The checks async-opcua makes, but as
/// the specification has them: the URI and the host may be any of the certificate's
/// alternative names (async-opcua takes the first name for the URI and skips it for the host,
/// so it refuses node-opcua's certificates, which list the host names first).
pub fn unfit(
    der: &[u8],
    host: &str,
    application_uri: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<&'static str> {
    const MALFORMED: &str = "it is malformed or its key does not fit the security policy";
    let Ok(cert) = X509::from_der(der) else { return Some(MALFORMED) };
    if cert.is_time_valid(&now).is_err() {
        return Some("it has expired or is not valid yet");
    }
    let Some(facts) = crate::tls::CertFacts::of(der) else { return Some(MALFORMED) };
    if !facts.names_host(host) {
        return Some("its host names do not include the endpoint's host");
    }
    if !facts.names_uri(application_uri) {
        return Some("its application URI is not the server's");
    }
    None
}

/// The file name async-opcua's certificate store gives a certificate.
fn file_name_of(cert: &X509) -> String {
    opcua::crypto::CertificateStore::cert_file_name(cert)
}

/// The client set-up every connection shares.
pub fn client_builder(pki_dir: &Path, secured: bool) -> ClientBuilder {
    ClientBuilder::new()
        .application_name("fieldgate")
        .application_uri("urn:fieldgate")
        .product_uri("urn:fieldgate")
        // Security policy None needs no key pair; do not write one for it.
        .create_sample_keypair(secured)
        // Servers are trusted by an operator moving their certificate, never automatically
        // (async-opcua checks the trust list and the key length whatever the next setting
        // says); whether a trusted certificate fits the server is checked by `unfit` before
        // connecting, since async-opcua's own check refuses certificates the specification
        // allows.
        .trust_server_certs(false)
        .verify_server_certs(false)
        .pki_dir(pki_dir.to_path_buf())
        .session_retry_limit(0)
        // A session whose server stopped answering (powered off, cable pulled: no reset
        // reaches us) is closed after three failed keep-alives, so it can be reopened;
        // async-opcua's default keeps it forever.
        .keep_alive_interval(std::time::Duration::from_secs(5))
        .max_failed_keep_alive_count(3)
        // A string longer than async-opcua's limit fails its whole reply and closes the
        // connection (the device's fault for every sensor): strings are decoded up to a
        // reply's size, 16 MiB, and one longer than `driver::MAX_TEXT` fails only its own sensor.
        .max_string_length(MAX_MESSAGE)
        .max_byte_string_length(MAX_MESSAGE)
        .max_message_size(MAX_MESSAGE)
        .max_chunk_count(0)
}

/// The largest reply read (and so the longest string decoded).
const MAX_MESSAGE: usize = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::OpcUaMode;

    fn settings(policy: &str, mode: &str, user: bool) -> OpcUaSettings {
        OpcUaSettings {
            security_policy: policy.into(),
            security_mode: mode.into(),
            username_env: user.then(|| "FG_TEST_UNSET_USER_VAR_1".into()),
            password_env: user.then(|| "FG_TEST_UNSET_PASSWORD_VAR_1".into()),
            mode: OpcUaMode::Poll,
            alarms: false,
        }
    }

    #[test]
    fn device_file_names_map_to_policies_and_modes() {
        let s = Security::of(Some(&settings("Basic256Sha256", "SignAndEncrypt", false)));
        assert_eq!((s.policy, s.mode), (SecurityPolicy::Basic256Sha256, MessageSecurityMode::SignAndEncrypt));
        assert!(s.is_secured());
        let s = Security::of(Some(&settings("Aes256_Sha256_RsaPss", "Sign", false)));
        assert_eq!((s.policy, s.mode), (SecurityPolicy::Aes256Sha256RsaPss, MessageSecurityMode::Sign));
        assert_eq!(s.names(), ("Aes256_Sha256_RsaPss".to_string(), "Sign".to_string()));
        let s = Security::of(Some(&settings("Aes128_Sha256_RsaOaep", "Sign", false)));
        assert_eq!(s.policy, SecurityPolicy::Aes128Sha256RsaOaep);
        let s = Security::of(None);
        assert!(!s.is_secured());
        assert!(matches!(s.token(), Ok(IdentityToken::Anonymous)));
    }

    #[test]
    fn a_missing_credential_names_its_variable() {
        let s = Security::of(Some(&settings("None", "None", true)));
        assert_eq!(
            s.token().err(),
            Some(Refusal::CredentialsMissing { var: "FG_TEST_UNSET_USER_VAR_1".into() })
        );
    }

    /// A self-signed certificate with these alternative names, valid from `from` to `to`.
    fn cert(names: Vec<rcgen::SanType>, from: (i32, u8, u8), to: (i32, u8, u8)) -> Vec<u8> {
        let mut p = rcgen::CertificateParams::default();
        p.subject_alt_names = names;
        p.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
        p.not_after = rcgen::date_time_ymd(to.0, to.1, to.2);
        let key = rcgen::KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_fits_by_any_of_its_names_whatever_their_order() {
        use rcgen::SanType::{DnsName, IpAddress, URI};
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-02T00:00:00Z").unwrap().to_utc();
        let ip = |s: &str| IpAddress(s.parse().unwrap());
        let uri = |s: &str| URI(s.try_into().unwrap());
        let dns = |s: &str| DnsName(s.try_into().unwrap());
        let year = ((2026, 1, 1), (2027, 1, 1));
        // node-opcua's order: host names first, the URI last (async-opcua refused it).
        let node = cert(vec![dns("vm"), ip("127.0.0.1"), uri("urn:vm:Server")], year.0, year.1);
        assert_eq!(unfit(&node, "127.0.0.1", "urn:vm:Server", now), None);
        assert_eq!(unfit(&node, "VM", "urn:vm:Server", now), None);
        let v6 = cert(vec![uri("urn:x"), ip("::1")], year.0, year.1);
        assert_eq!(unfit(&v6, "[::1]", "urn:x", now), None);
        let host = Some("its host names do not include the endpoint's host");
        assert_eq!(unfit(&node, "10.0.0.9", "urn:vm:Server", now), host);
        assert_eq!(unfit(&node, "plc.local", "urn:vm:Server", now), host);
        assert_eq!(
            unfit(&node, "127.0.0.1", "urn:other", now),
            Some("its application URI is not the server's")
        );
        let old = cert(vec![ip("127.0.0.1"), uri("urn:x")], (2020, 1, 1), (2021, 1, 1));
        assert_eq!(unfit(&old, "127.0.0.1", "urn:x", now), Some("it has expired or is not valid yet"));
        let none = cert(vec![], year.0, year.1);
        assert_eq!(unfit(&none, "127.0.0.1", "urn:x", now), host);
        assert!(unfit(b"not a certificate", "127.0.0.1", "urn:x", now).is_some());
    }
}
