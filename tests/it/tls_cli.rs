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
    assert!(
        err.contains("not signed by a CA this command trusts") && err.contains("FIELDGATE_CA_FILE"),
        "{err}"
    );

    // Plain HTTP to the HTTPS port: the server's own words reach the person.
    let plain = public.replacen("https://", "http://", 1);
    let o = cli(&["work-orders", "list", "--url", &plain], true).output_within().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("HTTP 400") && err.contains("https://"), "{err}");
    // A token that cannot be a header value says so.
    let o = cli(&["work-orders", "list", "--url", &public], true)
        .env("FIELDGATE_CLI_TOKEN", "two\nlines-of-token-0123456789")
        .output_within()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the token cannot be sent"), "{err}");

    // `call` finds the running service by its owner file (its public URL) and asks it.
    let o = cli(&["call", "list_sensors", "{\"limit\": 1}"], true).output_within().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("\"ok\": true") || out.contains("\"ok\":true"), "{out}");

    // The stdio relay without trust in the CA: the request's error says what to set.
    let mut untrusted = tokio::process::Command::from(cli(&["mcp", "--url", &public], false));
    untrusted
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut child = untrusted.spawn().unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n").await.unwrap();
    }
    let o = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the relay ends when its stdin closes")
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FIELDGATE_CA_FILE") && out.contains("\"id\":1"), "{out}");

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

/// The stdio relay outlives a restart of the service it relays to: the service no longer
/// knows the session, and the relay opens a new one with the client's own `initialize`
/// (a stdio client cannot). Without trust in the server's CA, the relay's answer says why.
#[tokio::test]
async fn the_relay_opens_a_new_session_when_the_service_restarted() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let env = [("FIELDGATE_SERVER_LISTEN", listen.as_str())];
    let mut served = serve_binary(devices.path(), data.path(), &env).await;
    let mut relay = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["mcp", "--url", &format!("http://{listen}")])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = relay.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(relay.stdout.take().unwrap()).lines();
    let mut ask = async |line: &str, id: u64| {
        stdin.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        loop {
            let l = tokio::time::timeout(std::time::Duration::from_secs(30), stdout.next_line())
                .await
                .unwrap_or_else(|_| panic!("no answer to request {id} within 30 s"))
                .unwrap()
                .expect("the relay is running");
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    assert!(ask(init, 1).await["result"]["serverInfo"].is_object());
    let call = |id: u64| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"list_sensors","arguments":{{"limit":1}}}}}}"#
        )
    };
    let before = ask(&call(2), 2).await;
    assert_eq!(before["result"]["isError"], false, "{before}");

    // The service restarts on the same address: its sessions are gone.
    let pid = served.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    support::exited(&mut served.child, "fieldgate").await;
    let _again = serve_binary(devices.path(), data.path(), &env).await;
    let after = ask(&call(3), 3).await;
    assert_eq!(after["result"]["isError"], false, "the relay opened a new session: {after}");
}
