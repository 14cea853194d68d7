//! `Link::read` against peers that frame their bytes by hand (a loopback socket, a
//! pseudo-terminal): who is answered what when a shared request fails, the connect backoff
//! and the breaker's probe, a stalled request, and the quiet a serial line keeps after a
//! timeout. Bounds on real time here are lower bounds only (load cannot break them).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::super::wire::crc16;
use super::*;
use crate::registry::RegisterTable;

const KEY: ReadKey = ReadKey { unit: 1, table: RegisterTable::Holding, start: 0, count: 2 };
const OTHER: ReadKey = ReadKey { unit: 1, table: RegisterTable::Holding, start: 10, count: 2 };
const WAIT: Duration = Duration::from_secs(5);
const SECOND: Duration = Duration::from_secs(1);

fn tcp(port: u16) -> Link {
    Link::new(Target::Tcp { host: "127.0.0.1".into(), port, rtu: false })
}

fn until(ms: u64) -> ReadOptions {
    ReadOptions::until(Instant::now() + Duration::from_millis(ms))
}

fn probe(ms: u64) -> ReadOptions {
    ReadOptions { probe: true, ..until(ms) }
}

fn registers() -> Result<Words, DriverError> {
    Ok(Words::Registers(vec![1, 2]))
}

async fn read(link: &Link, timeout: Duration, options: ReadOptions) -> Result<Words, DriverError> {
    tokio::time::timeout(WAIT, link.read(KEY, timeout, options)).await.expect("the read ends")
}

/// A read of `KEY` on its own task.
fn spawn_read(link: &Arc<Link>, options: ReadOptions) -> tokio::task::JoinHandle<Result<Words, DriverError>> {
    let link = link.clone();
    tokio::spawn(async move { read(&link, 2 * SECOND, options).await })
}

async fn accept(listener: &TcpListener) -> TcpStream {
    let (s, _) = tokio::time::timeout(WAIT, listener.accept()).await.expect("a connection").unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// One request of `len` bytes on the peer's side.
async fn request(peer: &mut (impl AsyncRead + Unpin), len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    tokio::time::timeout(WAIT, peer.read_exact(&mut buf)).await.expect("a request").unwrap();
    buf
}

/// The Modbus TCP answer to `request`: registers `1, 2`, or the exception `code`.
fn answer(request: &[u8], exception: Option<u8>) -> Vec<u8> {
    let pdu = match exception {
        Some(code) => vec![0x83, code],
        None => vec![3, 4, 0, 1, 0, 2],
    };
    let mut f = request[..4].to_vec();
    f.extend_from_slice(&(1 + pdu.len() as u16).to_be_bytes());
    f.push(request[6]);
    f.extend_from_slice(&pdu);
    f
}

async fn send(peer: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) {
    tokio::time::timeout(WAIT, peer.write_all(bytes)).await.expect("the peer writes").unwrap();
}

/// Waits until `n` callers wait on `KEY`'s request.
async fn joined(link: &Link, n: usize) {
    let waited = tokio::time::timeout(WAIT, async {
        while link.inflight.lock().get(&KEY).map_or(0, Vec::len) < n {
            tokio::task::yield_now().await;
        }
    });
    waited.await.unwrap_or_else(|_| panic!("waited 5 s for {n} callers on one request"));
}

/// A port nothing listens on (bound, then let go: connects are refused).
async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// A peer on `listener` that answers every request on every connection.
fn serve(listener: TcpListener) {
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0; 12];
                while s.read_exact(&mut buf).await.is_ok() {
                    if s.write_all(&answer(&buf, None)).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

#[tokio::test]
async fn a_caller_that_shared_a_failed_request_sends_its_own_and_the_owner_keeps_the_failure() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Arc::new(tcp(listener.local_addr().unwrap().port()));
    let owner = spawn_read(&link, until(4000));
    let mut first = accept(&listener).await;
    request(&mut first, 12).await;
    let sharer = spawn_read(&link, until(4000));
    joined(&link, 2).await;
    // The connection closes without a reply: the owner's failure; the sharer was not
    // answered by the device, so it asks again on a fresh connection.
    drop(first);
    let mut second = accept(&listener).await;
    let req = request(&mut second, 12).await;
    send(&mut second, &answer(&req, None)).await;
    assert_eq!(owner.await.unwrap(), Err(DriverError::Unavailable { retry_after: None }));
    assert_eq!(sharer.await.unwrap(), registers());
}

#[tokio::test]
async fn a_caller_that_shared_a_busy_answer_pauses_then_sends_its_own() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Arc::new(tcp(listener.local_addr().unwrap().port()));
    let owner = spawn_read(&link, until(4000));
    let mut peer = accept(&listener).await;
    let req = request(&mut peer, 12).await;
    let sharer = spawn_read(&link, until(4000));
    joined(&link, 2).await;
    send(&mut peer, &answer(&req, Some(6))).await;
    let busy_at = Instant::now();
    // An exception reply keeps the connection: the sharer's own request comes on it,
    // after a pause (at least half of BUSY_PAUSE, its jitter).
    let req = request(&mut peer, 12).await;
    let paused = busy_at.elapsed();
    send(&mut peer, &answer(&req, None)).await;
    assert_eq!(owner.await.unwrap(), Err(DriverError::Busy));
    assert_eq!(sharer.await.unwrap(), registers());
    assert!(paused >= BUSY_PAUSE / 2, "the sharer asked again after {paused:?}");
}

#[tokio::test]
async fn a_request_never_answered_is_the_devices_timeout_at_the_deadline_not_queued() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Arc::new(tcp(listener.local_addr().unwrap().port()));
    // The deadline comes before the device's timeout: the connection task answers
    // `Timeout` at the deadline, and the caller waits for that answer.
    let call = spawn_read(&link, until(300));
    let mut peer = accept(&listener).await;
    request(&mut peer, 12).await;
    assert_eq!(call.await.unwrap(), Err(DriverError::Timeout));
}

#[tokio::test]
async fn after_a_timeout_on_tcp_the_next_read_goes_out_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let link = Arc::new(tcp(listener.local_addr().unwrap().port()));
    let call = spawn_read(&link, until(200));
    let mut stalled = accept(&listener).await;
    request(&mut stalled, 12).await;
    assert_eq!(call.await.unwrap(), Err(DriverError::Timeout));
    // Only a serial line keeps quiet after a timeout (a late reply on a socket is gone
    // with its connection): a read with less time than the timeout is answered.
    serve(listener);
    assert_eq!(read(&link, 2 * SECOND, until(1000)).await, registers());
}

#[tokio::test]
async fn refused_connects_back_off_and_a_read_waits_for_the_backoff_only_if_it_has_time() {
    let port = closed_port().await;
    let link = tcp(port);
    // Three refused connects (probes do not wait for the backoff): the next wait is
    // 200 to 400 ms.
    for _ in 0..3 {
        let r = read(&link, SECOND, probe(2000)).await;
        assert!(
            matches!(r, Err(DriverError::Unavailable { retry_after: Some(w) }) if w >= BACKOFF_FIRST / 2),
            "{r:?}"
        );
    }
    serve(TcpListener::bind(("127.0.0.1", port)).await.unwrap());
    // Within the backoff, a read whose deadline comes first fails at once, saying when
    // to try again; the device is not asked.
    let r = read(&link, SECOND, until(100)).await;
    let Err(DriverError::Unavailable { retry_after: Some(left) }) = r else { panic!("{r:?}") };
    assert!(left > Duration::ZERO);
    // Nor one whose deadline leaves less than 50 ms after the backoff ends (a connect
    // must have time to succeed).
    let r = read(&link, SECOND, until(left.as_millis() as u64 + 10)).await;
    assert!(matches!(r, Err(DriverError::Unavailable { .. })), "{r:?}");
    // A read with time left waits for the backoff and connects.
    assert_eq!(read(&link, SECOND, until(3000)).await, registers());
}

#[tokio::test]
async fn a_breaker_probe_connects_while_the_link_backs_off() {
    let port = closed_port().await;
    let link = tcp(port);
    for _ in 0..3 {
        assert!(read(&link, SECOND, probe(2000)).await.is_err());
    }
    serve(TcpListener::bind(("127.0.0.1", port)).await.unwrap());
    assert_eq!(read(&link, SECOND, probe(100)).await, registers());
}

/// A serial link on one end of a pseudo-terminal pair; the other end, the peer.
fn serial() -> (Link, tokio_serial::SerialStream, tokio_serial::SerialStream) {
    use tokio_serial::SerialPort;
    let (master, slave) = tokio_serial::SerialStream::pair().expect("a pseudo-terminal pair");
    let path = slave.name().expect("the pseudo-terminal's path");
    let target = Target::Serial { path, baud_rate: 19200, parity: Parity::None, data_bits: 8, stop_bits: 1 };
    (Link::new(target), master, slave)
}

fn rtu_answer(request: &[u8]) -> Vec<u8> {
    let mut f = vec![request[0], 3, 4, 0, 1, 0, 2];
    let crc = crc16(&f);
    f.extend_from_slice(&crc.to_le_bytes());
    f
}

#[tokio::test]
async fn a_serial_line_stays_quiet_for_a_timeout_after_a_timeout() {
    let (link, mut peer, _slave) = serial();
    let link = Arc::new(link);
    let quiet = Duration::from_millis(300);
    let call = tokio::spawn({
        let link = link.clone();
        async move { read(&link, quiet, until(2000)).await }
    });
    request(&mut peer, 8).await;
    assert_eq!(call.await.unwrap(), Err(DriverError::Timeout));
    let timed_out = Instant::now();
    // A read whose deadline comes before the line may be used again: queued, not sent.
    assert_eq!(read(&link, quiet, until(50)).await, Err(DriverError::Queued));
    let mut byte = [0; 1];
    assert!(peer.read(&mut byte).now_or_never().is_none(), "nothing was sent on the quiet line");
    // One with time left waits for the quiet to end, then is sent and answered.
    let call = tokio::spawn({
        let link = link.clone();
        async move {
            tokio::time::timeout(WAIT, link.read(OTHER, quiet, until(3000))).await.expect("the read ends")
        }
    });
    // The first request on the line after the quiet is this one (the queued one was
    // never sent).
    let req = request(&mut peer, 8).await;
    assert_eq!(u16::from_be_bytes([req[2], req[3]]), OTHER.start, "{req:?}");
    let sent_after = timed_out.elapsed();
    send(&mut peer, &rtu_answer(&req)).await;
    assert_eq!(call.await.unwrap(), registers());
    assert!(sent_after >= quiet / 2, "sent {sent_after:?} after the timeout");
}

#[test]
fn a_serial_lines_settings_are_the_device_files() {
    use tokio_serial::{DataBits, StopBits};
    let bits = [(5, DataBits::Five), (6, DataBits::Six), (7, DataBits::Seven), (8, DataBits::Eight)];
    for (n, want) in bits {
        assert_eq!(line_data_bits(n), want, "{n} data bits");
    }
    assert_eq!(line_stop_bits(1), StopBits::One);
    assert_eq!(line_stop_bits(2), StopBits::Two);
    assert_eq!(line_parity(Parity::None), tokio_serial::Parity::None);
    assert_eq!(line_parity(Parity::Even), tokio_serial::Parity::Even);
    assert_eq!(line_parity(Parity::Odd), tokio_serial::Parity::Odd);
}
