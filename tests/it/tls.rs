//! HTTPS on the listener, through the real binary: a test CA's certificate served, reloaded
//! on SIGHUP (a bad new pair refused, the old one serving on), handshakes that never finish
//! dropped on time, console cookies marked for HTTPS, and `fieldgate check` on bad pairs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::support::{self, serve_binary, wait_for, wait_until};

const T: Duration = Duration::from_secs(30);
const TOKEN: &str = "agent:tls-test-token-0123456789";

/// A certificate authority of the test's own, signing server certificates.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub pem: String,
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "fieldgate test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa { issuer: rcgen::Issuer::new(params, key), pem }
    }

    /// A server certificate for `hosts`, valid from `days.0` to `days.1` days from now,
    /// written as `name.pem` and `name.key` in `dir`.
    pub fn server(&self, dir: &Path, name: &str, hosts: &[&str], days: (i64, i64)) -> (PathBuf, PathBuf) {
        let mut params =
            rcgen::CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(days.0);
        params.not_after = now + time::Duration::days(days.1);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub fn write(&self, dir: &Path) -> PathBuf {
        let p = dir.join("ca.pem");
        std::fs::write(&p, &self.pem).unwrap();
        p
    }

    fn client(&self) -> tokio_rustls::TlsConnector {
        fieldgate::tls::install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::pem::PemObject::pem_slice_iter(self.pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// One request over a new TLS connection: the answer's text and the served certificate.
pub async fn https(
    ca: &TestCa,
    addr: std::net::SocketAddr,
    request: &str,
) -> (String, CertificateDer<'static>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls =
        tokio::time::timeout(T, ca.client().connect(ServerName::try_from("localhost").unwrap(), tcp))
            .await
            .expect("handshake within 30 s")
            .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let cert = tls.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(T, tls.read_to_string(&mut text)).await.expect("answer within 30 s").unwrap();
    (text, cert)
}

fn not_after(der: &CertificateDer<'_>) -> i64 {
    fieldgate::tls::CertFacts::of(der).unwrap().not_after
}

fn get(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer tls-test-token-0123456789\r\nConnection: close\r\n\r\n"
    )
}

#[tokio::test]
async fn https_is_served_and_a_new_pair_is_taken_on_sighup_while_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.server(dir.path(), "server", &["localhost", "127.0.0.1"], (-1, 90));
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let mut served = serve_binary(
        devices.path(),
        data.path(),
        &[
            ("FIELDGATE_SERVER_TLS_CERT_FILE", c),
            ("FIELDGATE_SERVER_TLS_KEY_FILE", k),
            // Only SIGHUP reloads in this test: the files are not looked at in between.
            ("FIELDGATE_SERVER_TLS_WATCH_S", "86400"),
            ("FIELDGATE_TOKEN_BOT", TOKEN),
        ],
    )
    .await;
    let stderr = served.drain_stderr();
    let addr = served.addr;
    let (answer, first) = https(&ca, addr, &get("/healthz")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (answer, _) = https(&ca, addr, &get("/metrics")).await;
    let expiry = format!("fieldgate_tls_certificate_expiry_timestamp_seconds {}", not_after(&first));
    assert!(answer.contains(&expiry), "{answer}");

    // Console cookies under TLS: Secure, and the __Host- prefix.
    let (answer, _) =
        https(&ca, addr, "GET /console/login HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await;
    let cookie =
        answer.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:")).expect("a cookie");
    assert!(
        cookie.contains("__Host-fieldgate_login=")
            && cookie.contains("; Secure")
            && cookie.contains("Path=/;"),
        "{cookie}"
    );

    // A pair whose key is another certificate's: refused, the old pair serves on.
    let (_, other_key) = ca.server(dir.path(), "other", &["localhost"], (-1, 30));
    let (new_cert, _) = ca.server(dir.path(), "next", &["localhost"], (-1, 30));
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&other_key, &key).unwrap();
    let pid = served.child.id().unwrap().to_string();
    let hup = || assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    hup();
    wait_until("the refused reload counted", T, || async {
        https(&ca, addr, &get("/metrics"))
            .await
            .0
            .contains("fieldgate_tls_certificate_reloads_total{outcome=\"refused\"} 1")
    })
    .await;
    let (answer, still) = https(&ca, addr, &get("/healthz")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(still, first, "the old pair serves on");

    // The right pair: new connections get it, without a restart.
    let (_, next_key) = (new_cert.clone(), dir.path().join("next.key"));
    std::fs::copy(&next_key, &key).unwrap();
    hup();
    let now = wait_for("the new certificate served", T, || async {
        let (_, c) = https(&ca, addr, &get("/healthz")).await;
        (c != first).then_some(c)
    })
    .await;
    assert!(not_after(&now) < not_after(&first), "the 30-day certificate");
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    support::exited(&mut served.child, "fieldgate").await;
    let log = stderr.await.unwrap();
    assert!(log.contains("new server certificate refused") && log.contains("does not belong"), "{log}");
    assert!(!log.contains("PRIVATE KEY"), "no key material in the log");
}

/// Connections that open TCP and never say hello cost nothing lasting: each is closed at
/// the handshake timeout, and a real client is served meanwhile.
#[tokio::test]
async fn handshakes_that_never_finish_are_dropped_and_hold_up_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.server(dir.path(), "server", &["localhost"], (-1, 90));
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let mut served = serve_binary(
        devices.path(),
        data.path(),
        &[
            ("FIELDGATE_SERVER_TLS_CERT_FILE", cert.to_str().unwrap()),
            ("FIELDGATE_SERVER_TLS_KEY_FILE", key.to_str().unwrap()),
            ("FIELDGATE_SERVER_TLS_HANDSHAKE_TIMEOUT_MS", "500"),
            ("FIELDGATE_TOKEN_BOT", TOKEN),
        ],
    )
    .await;
    let _log = served.drain_stderr();
    let addr = served.addr;
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let (answer, _) = https(&ca, addr, &get("/healthz")).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "served while 200 handshakes wait: {answer}");
    // Plain HTTP to the TLS port is a failed handshake, not a crash.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(get("/healthz").as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(T, plain.read_to_end(&mut rest)).await.expect("closed within 30 s");
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 400") && rest.contains("use https://"), "{rest}");
    for mut s in silent {
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(T, s.read(&mut buf)).await.expect("closed by the server within 30 s");
        assert!(matches!(n, Ok(0) | Err(_)), "closed without a byte");
    }
    let (metrics, _) = https(&ca, addr, &get("/metrics")).await;
    let failures = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fieldgate_tls_handshake_failures_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("the failure counter");
    assert!(failures >= 201, "{failures}");
}

/// `fieldgate check` refuses an expired pair, a key that is not the certificate's, and a
/// certificate that does not name the public URL's host, each in a sentence.
#[tokio::test]
async fn check_refuses_bad_pairs_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (good, good_key) = ca.server(dir.path(), "good", &["edge01.plant"], (-1, 90));
    let (old, old_key) = ca.server(dir.path(), "old", &["edge01.plant"], (-30, -1));
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let check = |cert: &Path, key: &Path, public: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .args(["check", "--devices"])
            .arg(devices.path())
            .env_clear()
            .env("FIELDGATE_SERVER_TLS_CERT_FILE", cert)
            .env("FIELDGATE_SERVER_TLS_KEY_FILE", key)
            .env("FIELDGATE_SERVER_PUBLIC_URL", public)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, _, out) = check(&good, &good_key, "https://edge01.plant:8443");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("tls: ") && out.contains("valid until"), "{out}");
    let (code, err, _) = check(&old, &old_key, "https://edge01.plant:8443");
    assert_eq!(code, Some(1));
    assert!(err.contains("error: server.tls: the certificate expired at"), "{err}");
    let (code, err, _) = check(&good, &old_key, "https://edge01.plant:8443");
    assert_eq!(code, Some(1));
    assert!(err.contains("the private key does not belong to the certificate"), "{err}");
    let (code, err, _) = check(&good, &good_key, "https://edge02.plant:8443");
    assert_eq!(code, Some(1));
    assert!(err.contains("do not include edge02.plant"), "{err}");
    // `check` refuses what `serve` would: plain HTTP off loopback.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["check", "--devices"])
        .arg(devices.path())
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "0.0.0.0:8080")
        .env("FIELDGATE_TOKEN_BOT", TOKEN)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("without TLS"), "{err}");
}

/// SIGHUP without `[server.tls]` reloads nothing and ends nothing (its default action
/// would end the process).
#[tokio::test]
async fn sighup_without_tls_leaves_the_service_running() {
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let mut served = serve_binary(devices.path(), data.path(), &[]).await;
    let mut lines = served.stderr.take().unwrap();
    let pid = served.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    tokio::time::timeout(T, async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("SIGHUP: nothing to reload") {
                return;
            }
        }
        panic!("fieldgate ended on SIGHUP");
    })
    .await
    .expect("the SIGHUP logged within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let mut c = fieldgate::transport::client::HttpClient::connect(served.addr).await.unwrap();
    assert_eq!(c.get("/healthz").await.unwrap().status, 200);
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = support::exited(&mut served.child, "fieldgate").await;
    assert!(status.success(), "a clean stop after SIGHUP: {status:?}");
}

/// Off loopback, plain HTTP is refused unless the configuration allows it explicitly.
#[tokio::test]
async fn a_network_address_without_tls_is_refused_at_start() {
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices"])
        .arg(devices.path())
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "0.0.0.0:0")
        .env("FIELDGATE_TOKEN_BOT", TOKEN)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).await.unwrap();
    let status = support::exited(&mut child, "fieldgate").await;
    assert_eq!(status.code(), Some(1));
    assert!(err.contains("without TLS: set [server.tls]") && err.contains("allow_plaintext"), "{err}");
}
