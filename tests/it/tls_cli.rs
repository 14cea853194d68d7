//! The command line against a service over HTTPS: `work-orders --url https://…`, `mcp
//! --url https://…` (the stdio relay) and `call` (finding the service by its owner file,
//! which names its public URL), trusting a private CA named in `FIELDGATE_CA_FILE`; without
//! it, the certificate is refused with a line saying what to set.

use super::support::{self, OutputWithin, serve_binary};
use super::tls::TestCa;

const TOKEN: &str = "operator:tls-cli-token-0123456789";

#[tokio::test]
async fn the_command_line_speaks_https_trusting_a_named_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let ca_file = ca.write(dir.path());
    let (cert, key) = ca.server(dir.path(), "server", &["localhost"], (-1, 90));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let public = format!("https://localhost:{port}");
    let listen = format!("127.0.0.1:{port}");
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let mut served = serve_binary(
        devices.path(),
        data.path(),
        &[
            ("FIELDGATE_SERVER_LISTEN", &listen),
            ("FIELDGATE_SERVER_PUBLIC_URL", &public),
            ("FIELDGATE_SERVER_TLS_CERT_FILE", cert.to_str().unwrap()),
            ("FIELDGATE_SERVER_TLS_KEY_FILE", key.to_str().unwrap()),
            ("FIELDGATE_TOKEN_CLI", TOKEN),
        ],
    )
    .await;
    let _log = served.drain_stderr();
    let secret = TOKEN.split_once(':').unwrap().1;
    let cli = |args: &[&str], trust: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"));
        cmd.args(args)
            .env_clear()
            .env("FIELDGATE_CLI_TOKEN", secret)
            .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
            .env("FIELDGATE_DEVICES_DIR", devices.path());
        if trust {
            cmd.env("FIELDGATE_CA_FILE", &ca_file);
        }
        cmd
    };

    let o = cli(&["work-orders", "list", "--url", &public], true).output_within().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "no work orders");

    // Without the CA: refused, saying what to set.
    let o = cli(&["work-orders", "list", "--url", &public], false).output_within().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("not trusted") && err.contains("FIELDGATE_CA_FILE"), "{err}");

    // `call` finds the running service by its owner file (its public URL) and asks it.
    let o = cli(&["call", "list_sensors", "{\"limit\": 1}"], true).output_within().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("\"ok\": true") || out.contains("\"ok\":true"), "{out}");

    // The stdio relay over HTTPS.
    let mut relay = tokio::process::Command::from(cli(&["mcp", "--url", &public], true));
    relay
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = relay.spawn().unwrap();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(format!("{init}\n").as_bytes()).await.unwrap();
    }
    let o = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the relay ends when its stdin closes")
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\"serverInfo\""), "{out}{}", String::from_utf8_lossy(&o.stderr));
}
