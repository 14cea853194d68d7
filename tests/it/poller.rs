//! The poller's schedule, in paused time against a hand-written Modbus TCP peer: one round
//! per `poll_interval_ms`, never two rounds of one device at once, nothing after stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::support::*;

/// Counts of what the peer saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// A Modbus TCP device answering every register read with 7s, after `delay`.
async fn device(delay: Duration) -> (u16, Arc<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let mut req = [0u8; 12];
                while stream.read_exact(&mut req).await.is_ok() {
                    s.requests.fetch_add(1, Ordering::SeqCst);
                    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    let count = u16::from_be_bytes([req[10], req[11]]);
                    let mut frame = vec![req[0], req[1], 0, 0];
                    frame.extend_from_slice(&(3 + 2 * count).to_be_bytes());
                    frame.extend_from_slice(&[req[6], req[7], (2 * count) as u8]);
                    for _ in 0..count {
                        frame.extend_from_slice(&7u16.to_be_bytes());
                    }
                    s.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if stream.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// A service reading one u16 every `interval_ms` from the peer on `port`.
fn polled_service(port: u16, interval_ms: u64) -> (ToolService, tempfile::TempDir) {
    let file = GOOD
        .replace("127.0.0.1:5020", &format!("127.0.0.1:{port}"))
        .replace("type = \"f32\"", "type = \"u16\"")
        .replace("endpoint =", &format!("poll_interval_ms = {interval_ms}\ntimeout_ms = 5000\nendpoint ="));
    let dir = device_dir(&[("t.toml", &file)]);
    let registry = Registry::load(dir.path()).unwrap();
    (ToolService::new(Arc::new(registry), Config::default()), dir)
}

fn polled_total(svc: &ToolService) -> usize {
    svc.render_metrics()
        .lines()
        .find_map(|l| l.strip_prefix("fieldgate_points_polled_total "))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Over ten and a half intervals (the first round starts within the first interval, at
/// a random offset): ten or eleven rounds, one request each, one at a time even when the
/// device takes most of an interval to answer; after stop, none.
#[tokio::test(start_paused = true)]
async fn a_device_is_polled_once_per_interval_one_round_at_a_time() {
    for delay_ms in [0, 900] {
        let (port, seen) = device(Duration::from_millis(delay_ms)).await;
        let (svc, _dir) = polled_service(port, 1000);
        let stop = tokio_util::sync::CancellationToken::new();
        let tasks = fieldgate::poller::start(&svc.core(), stop.clone());
        // Paused time: this advances the clock, it does not wait.
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        let rounds = seen.requests.load(Ordering::SeqCst);
        assert!((10..=11).contains(&rounds), "delay {delay_ms} ms: {rounds} rounds in 10.5 intervals");
        assert_eq!(seen.max_in_flight.load(Ordering::SeqCst), 1, "delay {delay_ms} ms");
        stop.cancel();
        for t in tasks {
            t.await.unwrap();
        }
        // Every answered round was recorded (the last may still have been in flight).
        let polled = polled_total(&svc);
        assert!(polled == rounds || polled + 1 == rounds, "{polled} recorded of {rounds}");
        let after = seen.requests.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(seen.requests.load(Ordering::SeqCst), after, "polled after stop");
    }
}
