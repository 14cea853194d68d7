//! `Wire::read` over a loopback socket against a peer that frames its bytes by hand: how
//! replies are put together, and what is dropped before a request.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::driver::modbus::Words;

const HOLD: ReadKey = ReadKey { unit: 1, table: RegisterTable::Holding, start: 0, count: 2 };
const OTHER: ReadKey = ReadKey { unit: 1, table: RegisterTable::Holding, start: 10, count: 3 };
const WAIT: Duration = Duration::from_secs(5);

/// A wire (`rtu`: RTU framing over TCP) and the peer's end of its socket.
async fn pair(rtu: bool) -> (Wire, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let (peer, _) = accepted.unwrap();
    peer.set_nodelay(true).unwrap();
    (Wire::new(Io::tcp(client.unwrap()).unwrap(), rtu), peer)
}

/// The reply to `key` with registers `1, 2, …`: MBAP with `tid`, or RTU with its CRC.
fn reply(rtu: bool, tid: u16, key: &ReadKey) -> Vec<u8> {
    let mut pdu = vec![3, 2 * key.count as u8];
    (1..=key.count).for_each(|r| pdu.extend_from_slice(&r.to_be_bytes()));
    if rtu {
        let mut f = vec![key.unit];
        f.extend_from_slice(&pdu);
        let crc = crc16(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        f
    } else {
        let mut f = tid.to_be_bytes().to_vec();
        f.extend_from_slice(&[0, 0, 0, 1 + pdu.len() as u8, key.unit]);
        f.extend_from_slice(&pdu);
        f
    }
}

fn registers(key: &ReadKey) -> Reply {
    Reply::Words(Words::Registers((1..=key.count).collect()))
}

/// Reads one request of `len` bytes on the peer's side.
async fn request(peer: &mut TcpStream, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    tokio::time::timeout(WAIT, peer.read_exact(&mut buf)).await.expect("a request").unwrap();
    buf
}

async fn read(wire: &mut Wire, key: &ReadKey) -> Result<Reply, WireError> {
    tokio::time::timeout(WAIT, wire.read(key)).await.expect("the read ends")
}

/// Waits until `n` bytes the peer sent are in the wire's socket, not yet read.
async fn arrived(wire: &Wire, n: usize) {
    let Io::Tcp { unread, .. } = &wire.io else { unreachable!() };
    let mut scratch = vec![0; n];
    let deadline = tokio::time::Instant::now() + WAIT;
    while unread.peek(&mut scratch).unwrap_or(0) < n {
        assert!(tokio::time::Instant::now() < deadline, "{n} bytes did not arrive");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_reply_that_comes_a_byte_at_a_time_is_put_together() {
    for rtu in [false, true] {
        let (mut wire, mut peer) = pair(rtu).await;
        let peer = tokio::spawn(async move {
            let req = request(&mut peer, if rtu { 8 } else { 12 }).await;
            let tid = u16::from_be_bytes([req[0], req[1]]);
            for b in reply(rtu, tid, &HOLD) {
                peer.write_all(&[b]).await.unwrap();
                peer.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
            peer
        });
        assert_eq!(read(&mut wire, &HOLD).await, Ok(registers(&HOLD)), "rtu: {rtu}");
        drop(peer.await.unwrap());
        // The peer closed: the next read fails on the stream, not as a mismatch.
        assert_eq!(read(&mut wire, &HOLD).await, Err(WireError::Io), "rtu: {rtu}");
    }
}

#[tokio::test]
async fn bytes_the_device_sent_unasked_are_dropped_before_the_next_request() {
    let (mut wire, mut peer) = pair(false).await;
    let req = request_frame(false, 1, &HOLD);
    let (got, ()) = tokio::join!(read(&mut wire, &HOLD), async {
        assert_eq!(request(&mut peer, 12).await, req);
        peer.write_all(&reply(false, 1, &HOLD)).await.unwrap();
    });
    assert_eq!(got, Ok(registers(&HOLD)));
    // A chatty device: the same reply again and 4 KiB of noise, after the read was done.
    let mut unasked = reply(false, 1, &HOLD);
    unasked.extend(std::iter::repeat_n(0xEE, 4096));
    peer.write_all(&unasked).await.unwrap();
    arrived(&wire, unasked.len()).await;
    let (got, ()) = tokio::join!(read(&mut wire, &OTHER), async {
        assert_eq!(request(&mut peer, 12).await, request_frame(false, 2, &OTHER));
        peer.write_all(&reply(false, 2, &OTHER)).await.unwrap();
    });
    assert_eq!(got, Ok(registers(&OTHER)), "the unasked bytes were not taken as the reply");
}

#[tokio::test]
async fn a_flood_of_unasked_bytes_costs_at_most_64_kib_of_reading_per_request() {
    let (mut wire, mut peer) = pair(false).await;
    let flood = vec![b'H'; 80 * 1024];
    peer.write_all(&flood).await.unwrap();
    arrived(&wire, flood.len()).await;
    let (got, _) = tokio::join!(read(&mut wire, &HOLD), async {
        let req = request(&mut peer, 12).await;
        peer.write_all(&reply(false, u16::from_be_bytes([req[0], req[1]]), &HOLD)).await.unwrap();
    });
    // 64 KiB were dropped; the rest of the flood came before the reply.
    assert_eq!(got, Err(WireError::Mismatch("protocol identifier")));
}

/// RTU frames carry no transaction ID: a second reply to one request that comes within
/// `RTU_GUARD` of the first is dropped, not taken as the next request's answer.
#[tokio::test(start_paused = true)]
async fn rtu_waits_out_the_guard_so_a_late_second_reply_is_not_taken_for_the_next() {
    let (mut wire, mut peer) = pair(true).await;
    let peer = tokio::spawn(async move {
        request(&mut peer, 8).await;
        let first = reply(true, 0, &HOLD);
        peer.write_all(&first).await.unwrap();
        tokio::time::sleep(RTU_GUARD / 4).await;
        peer.write_all(&first).await.unwrap();
        assert_eq!(request(&mut peer, 8).await, request_frame(true, 0, &OTHER));
        peer.write_all(&reply(true, 0, &OTHER)).await.unwrap();
        peer
    });
    assert_eq!(read(&mut wire, &HOLD).await, Ok(registers(&HOLD)));
    assert_eq!(read(&mut wire, &OTHER).await, Ok(registers(&OTHER)));
    drop(peer.await.unwrap());
}

#[test]
fn lengths_and_bits_at_their_limits() {
    // The longest MBAP length a reply may have (a 253-byte PDU), and one more.
    assert_eq!(frame_len(false, &[0, 7, 0, 0, 0, 254]), Ok(Some(260)));
    assert_eq!(frame_len(false, &[0, 7, 0, 0, 0, 255]), Err("MBAP length"));
    // Three registers: six bytes.
    let frame = reply(false, 7, &OTHER);
    assert_eq!(check(false, 7, &OTHER, &frame), Ok(registers(&OTHER)));
    // Coils 0..12 from bytes 0b1010_0100, 0b0000_1001: bits read from the least
    // significant bit of each byte.
    let coils = ReadKey { unit: 1, table: RegisterTable::Coil, start: 0, count: 12 };
    let frame = [0, 7, 0, 0, 0, 5, 1, 1, 2, 0b1010_0100, 0b0000_1001];
    let bits: Vec<bool> = [0, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1].iter().map(|&b| b == 1).collect();
    assert_eq!(check(false, 7, &coils, &frame), Ok(Reply::Words(Words::Bits(bits))));
}
