//! Clients that hold connections without finishing a request (slow headers, an idle
//! kept-alive connection), against the real `fieldgate serve`.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    let mut served =
        serve_binary(devices.path(), data.path(), &[("FIELDGATE_SERVER_HEADER_TIMEOUT_MS", "300")]).await;
    let addr = served.addr;
    served.drain_stderr();

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
    let _ = served.child.kill().await;
}

#[tokio::test]
async fn a_client_still_sending_headers_does_not_hold_up_a_stop() {
    let devices = device_dir(&[("t.toml", GOOD)]);
    let data = tempfile::tempdir().unwrap();
    // A grace period and header timeout far longer than the wait below: a stop that
    // waited for the slow client would not be seen within it.
    let env =
        [("FIELDGATE_SERVER_SHUTDOWN_GRACE_MS", "120000"), ("FIELDGATE_SERVER_HEADER_TIMEOUT_MS", "120000")];
    let mut served = serve_binary(devices.path(), data.path(), &env).await;
    let (addr, logged) = (served.addr, served.drain_stderr());
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    let _idle = TcpStream::connect(addr).await.unwrap();
    // Both connections are accepted once a request on a third is answered.
    let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
    assert_eq!(c.get("/healthz").await.unwrap().status, 200);
    let pid = served.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(30), served.child.wait())
        .await
        .expect("the stop waited for a client that never finished its request")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let log = logged.await.unwrap();
    assert!(!log.contains("still running after the grace period"), "{log}");
}

/// A live stream that gives its place up (here: a viewer's oldest, past its share) has its
/// connection closed at once, even when its client stopped reading and the stream would
/// never be polled again.
#[tokio::test]
async fn a_live_stream_that_gives_its_place_up_is_disconnected() {
    let devices = device_dir(&[("t.toml", GOOD)]);
    let data = tempfile::tempdir().unwrap();
    let mut served = serve_binary(devices.path(), data.path(), &[]).await;
    served.drain_stderr();
    let open = |addr| async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /console/live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        let read = async {
            while !head.ends_with(b"\r\n\r\n") {
                assert_eq!(s.read(&mut byte).await.unwrap(), 1, "stream answered: {head:?}");
                head.push(byte[0]);
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read).await.expect("a live stream's headers");
        assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
        s
    };
    // Without tokens every browser is one viewer, whose share is 16 streams.
    let mut oldest = open(served.addr).await;
    let mut rest = Vec::new();
    for _ in 0..15 {
        rest.push(open(served.addr).await);
    }
    rest.push(open(served.addr).await);
    let after = closed_by_server(&mut oldest).await;
    assert!(!String::from_utf8_lossy(&after).contains("HTTP/1.1"), "no other answer on it");
}
