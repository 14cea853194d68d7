//! The Modbus link's queue: reads beyond what one endpoint may have waiting are refused as
//! busy at once, not queued forever.

use std::time::Duration;

use fieldgate::driver::modbus::{Link, ReadKey, Target};
use fieldgate::driver::{DriverError, ReadOptions};
use fieldgate::registry::RegisterTable;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

/// Reads one endpoint may have waiting (`QUEUE` in `driver/modbus.rs`), written out here.
const QUEUE: usize = 256;

/// A device that takes every connection and every request and never answers.
async fn silent_device() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            });
        }
    });
    port
}

/// 300 different reads at once on one link (the test's runtime has one thread, so all are
/// offered before the connection task takes the first): the queue holds 256, and the 44
/// after them are answered `Busy` without waiting. The rest run into the silent device
/// (paused time: no real wait) and are never `Busy`.
#[tokio::test(start_paused = true)]
async fn reads_beyond_the_queue_are_refused_busy_at_once() {
    let port = silent_device().await;
    let link = Link::new(Target::Tcp { host: "127.0.0.1".into(), port, rtu: false });
    let options = ReadOptions { deadline: Instant::now() + Duration::from_secs(3600), probe: false };
    let total = 300u16;
    let reads = (0..total).map(|start| {
        let key = ReadKey { unit: 1, table: RegisterTable::Holding, start, count: 1 };
        link.read(key, Duration::from_millis(100), options)
    });
    let results = futures_util::future::join_all(reads).await;
    let busy: Vec<usize> =
        results.iter().enumerate().filter(|(_, r)| **r == Err(DriverError::Busy)).map(|(i, _)| i).collect();
    assert_eq!(busy, (QUEUE..usize::from(total)).collect::<Vec<_>>(), "the reads after the queue's 256");
    for (i, r) in results[..QUEUE].iter().enumerate() {
        assert!(matches!(r, Err(DriverError::Timeout)), "read {i}: {r:?}");
    }
}

/// Once the queue has room again, a read is taken (not refused): busy is a moment's
/// answer, not a state.
#[tokio::test(start_paused = true)]
async fn a_read_after_the_queue_drained_is_not_busy() {
    let port = silent_device().await;
    let link = Link::new(Target::Tcp { host: "127.0.0.1".into(), port, rtu: false });
    let options = ReadOptions { deadline: Instant::now() + Duration::from_secs(3600), probe: false };
    let key = |start| ReadKey { unit: 1, table: RegisterTable::Holding, start, count: 1 };
    let first = (0..QUEUE as u16 + 10).map(|s| link.read(key(s), Duration::from_millis(10), options));
    let results = futures_util::future::join_all(first).await;
    assert_eq!(results.iter().filter(|r| **r == Err(DriverError::Busy)).count(), 10);
    let later = link.read(key(9999), Duration::from_millis(10), options).await;
    assert!(matches!(later, Err(DriverError::Timeout)), "{later:?}");
}
