//! Modbus framing by hand: requests, and replies checked against them (see the module above).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{ReadKey, Words};
use crate::registry::RegisterTable;

/// The byte stream to an endpoint.
pub(super) enum Io {
    Tcp {
        stream: TcpStream,
        /// The same socket, read without the runtime (non-blocking) to find bytes the
        /// device sent unasked: the runtime only learns of them when it next polls.
        unread: std::net::TcpStream,
    },
    Serial(tokio_serial::SerialStream),
}

impl Io {
    pub(super) fn tcp(stream: TcpStream) -> std::io::Result<Io> {
        let stream = stream.into_std()?;
        let unread = stream.try_clone()?;
        Ok(Io::Tcp { stream: TcpStream::from_std(stream)?, unread })
    }

    pub(super) async fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        match self {
            Io::Tcp { stream, .. } => stream.write_all(frame).await,
            Io::Serial(port) => {
                port.write_all(frame).await?;
                port.flush().await
            }
        }
    }

    /// Reads what has arrived (at least one byte; 0 when the stream is closed).
    pub(super) async fn receive(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        buf.reserve(256);
        match self {
            Io::Tcp { stream, .. } => stream.read_buf(buf).await,
            Io::Serial(port) => port.read_buf(buf).await,
        }
    }

    /// Drops whatever the device sent that no request asked for (a second reply, a late
    /// one, noise); how many bytes that was.
    pub(super) fn discard_unread(&mut self) -> usize {
        match self {
            Io::Tcp { unread, .. } => {
                use std::io::Read;
                let mut scratch = [0u8; 512];
                let mut total = 0;
                // A peer that floods the socket is stopped by the read's own checks.
                while total < 64 * 1024 {
                    match (&*unread).read(&mut scratch) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n,
                    }
                }
                total
            }
            Io::Serial(port) => {
                use tokio_serial::{ClearBuffer, SerialPort};
                let n = port.bytes_to_read().unwrap_or(0) as usize;
                let _ = port.clear(ClearBuffer::Input);
                n
            }
        }
    }
}

/// Why a read on the wire failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WireError {
    /// The stream failed or was closed.
    Io,
    /// The reply does not match the request; the check that failed.
    Mismatch(&'static str),
}

/// What the device answered to one request.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reply {
    Words(Words),
    Exception(u8),
}

/// How long an RTU line must have been left alone after a reply before the next request.
/// RTU frames carry no transaction ID: a late second reply to one request that arrived
/// after the next request went out would be taken as that request's answer. Whatever
/// arrives within this time is discarded before the request is sent. (The serial line's
/// own minimum, 3.5 characters, is 4 ms at 9600 baud; gateways answering twice do so
/// within a few milliseconds.)
pub(super) const RTU_GUARD: std::time::Duration = std::time::Duration::from_millis(20);

/// One open connection, framed as Modbus TCP or RTU.
pub(super) struct Wire {
    io: Io,
    rtu: bool,
    /// The transaction ID of the last request (Modbus TCP).
    tid: u16,
    buf: Vec<u8>,
    /// When the last reply was complete (RTU: the guard runs from there).
    last_reply: Option<tokio::time::Instant>,
}

impl Wire {
    pub(super) fn new(io: Io, rtu: bool) -> Wire {
        Wire { io, rtu, tid: 0, buf: Vec::with_capacity(MAX_FRAME), last_reply: None }
    }

    /// Sends one read and waits for its reply: a complete frame, checked against the
    /// request. A frame that never completes is left to the caller's timeout.
    pub(super) async fn read(&mut self, key: &ReadKey) -> Result<Reply, WireError> {
        if self.rtu
            && let Some(at) = self.last_reply
        {
            tokio::time::sleep_until(at + RTU_GUARD).await;
        }
        let unread = self.io.discard_unread();
        if unread > 0 {
            tracing::debug!(bytes = unread, "Modbus: discarded bytes the device sent unasked");
        }
        self.tid = self.tid.wrapping_add(1);
        self.io.send(&request_frame(self.rtu, self.tid, key)).await.map_err(|_| WireError::Io)?;
        self.buf.clear();
        let len = loop {
            if let Some(n) = frame_len(self.rtu, &self.buf).map_err(WireError::Mismatch)?
                && self.buf.len() >= n
            {
                break n;
            }
            if self.io.receive(&mut self.buf).await.map_err(|_| WireError::Io)? == 0 {
                return Err(WireError::Io);
            }
        };
        // Bytes after the frame were not asked for: they go with the buffer, and whatever
        // follows them is discarded before the next request.
        self.last_reply = Some(tokio::time::Instant::now());
        check(self.rtu, self.tid, key, &self.buf[..len]).map_err(WireError::Mismatch)
    }
}

/// The longest frame of either framing: MBAP header (7) + PDU (253); RTU is shorter.
pub(super) const MAX_FRAME: usize = 260;

/// The function code that reads `table`.
pub(super) fn function(table: RegisterTable) -> u8 {
    match table {
        RegisterTable::Coil => 0x01,
        RegisterTable::Discrete => 0x02,
        RegisterTable::Holding => 0x03,
        RegisterTable::Input => 0x04,
    }
}

/// The request for `key`: an MBAP header with `tid`, or RTU with its CRC.
pub(super) fn request_frame(rtu: bool, tid: u16, key: &ReadKey) -> Vec<u8> {
    let [start_hi, start_lo] = key.start.to_be_bytes();
    let [count_hi, count_lo] = key.count.to_be_bytes();
    let pdu = [function(key.table), start_hi, start_lo, count_hi, count_lo];
    let mut frame = Vec::with_capacity(12);
    if rtu {
        frame.push(key.unit);
        frame.extend_from_slice(&pdu);
        frame.extend_from_slice(&crc16(&frame).to_le_bytes());
    } else {
        frame.extend_from_slice(&tid.to_be_bytes());
        // Protocol identifier 0; length: unit ID and PDU.
        frame.extend_from_slice(&[0, 0, 0, 1 + pdu.len() as u8, key.unit]);
        frame.extend_from_slice(&pdu);
    }
    frame
}

/// The length of the reply frame at the start of `buf`, as its own header tells it, or
/// `None` until enough has arrived to tell. A header that no reply to a read can have is a
/// mismatch at once; a frame that says it is longer than what follows is waited for.
pub(super) fn frame_len(rtu: bool, buf: &[u8]) -> Result<Option<usize>, &'static str> {
    if rtu {
        // Unit, function, [byte count, data], CRC.
        match buf.get(1) {
            None => Ok(None),
            Some(0x01..=0x04) => Ok(buf.get(2).map(|&n| 5 + usize::from(n))),
            Some(0x80..) => Ok(Some(5)),
            Some(_) => Err("function code"),
        }
    } else {
        if buf.len() >= 4 && buf[2..4] != [0, 0] {
            return Err("protocol identifier");
        }
        if buf.len() < 6 {
            return Ok(None);
        }
        // Unit ID, function and at least one byte more.
        let len = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
        if !(3..=MAX_FRAME - 6).contains(&len) {
            return Err("MBAP length");
        }
        Ok(Some(6 + len))
    }
}

/// Checks one complete reply frame against its request: everything must be exactly what
/// was asked. Returns the failed check's name otherwise.
pub(super) fn check(rtu: bool, tid: u16, key: &ReadKey, frame: &[u8]) -> Result<Reply, &'static str> {
    let (unit, pdu) = if rtu {
        let (adu, crc) = frame.split_at(frame.len() - 2);
        if crc16(adu).to_le_bytes() != crc {
            return Err("CRC");
        }
        (adu[0], &adu[1..])
    } else {
        if frame[..2] != tid.to_be_bytes() {
            return Err("transaction ID");
        }
        (frame[6], &frame[7..])
    };
    if unit != key.unit {
        return Err("unit ID");
    }
    let fc = function(key.table);
    if pdu[0] == fc | 0x80 {
        return if pdu.len() == 2 { Ok(Reply::Exception(pdu[1])) } else { Err("length") };
    }
    if pdu[0] != fc {
        return Err("function code");
    }
    let count = usize::from(key.count);
    let bits = key.table.is_bits();
    let expected = if bits { count.div_ceil(8) } else { 2 * count };
    if usize::from(pdu[1]) != expected {
        return Err("byte count");
    }
    let data = &pdu[2..];
    if data.len() != expected {
        return Err("length");
    }
    Ok(Reply::Words(if bits {
        // Packed from the least significant bit of the first byte.
        Words::Bits((0..count).map(|i| data[i / 8] >> (i % 8) & 1 == 1).collect())
    } else {
        Words::Registers(data.chunks_exact(2).map(|w| u16::from_be_bytes([w[0], w[1]])).collect())
    }))
}

/// CRC-16/MODBUS (reflected polynomial 0xA001, initial value 0xFFFF); sent low byte first.
pub(super) fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0xFFFFu16;
    for &b in bytes {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
        }
    }
    crc
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
