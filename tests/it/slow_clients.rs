//! Clients that hold connections without finishing a request (slow headers, an idle
//! kept-alive connection), against the real `fieldgate serve`.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

use super::support::*;

/// Reads until the server closes the connection (end of stream or reset); fails after 10 s.
async fn closed_by_server(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(10), read).await.is_ok(),
        "the server kept the connection open (read so far: {:?})",
        String::from_utf8_lossy(&got)
    );
    got
}

#[tokio::test]
async fn slow_request_headers_and_idle_connections_are_closed_after_the_header_timeout() {
    let devices = device_dir(&[("t.toml", GOOD)]);
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices", devices.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_SERVER_HEADER_TIMEOUT_MS", "300")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = listening_addr(&mut lines).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // Headers begun and never finished (a slow-loris client).
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1").await.unwrap();
    closed_by_server(&mut slow).await;

    // A connection opened and never used.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    closed_by_server(&mut silent).await;

    // A kept-alive connection is answered, then closed once it idles past the timeout.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let answered = closed_by_server(&mut kept).await;
    let text = String::from_utf8_lossy(&answered);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");

    // The service itself is unaffected.
    let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
    assert_eq!(c.get("/healthz").await.unwrap().status, 200);
    let _ = child.kill().await;
}
