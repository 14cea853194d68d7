//! Modbus TCP, RTU over TCP and RTU on a serial line.
//!
//! One [`Link`] per endpoint owns the only connection to it and serves a queue of reads
//! for every unit ID behind it, one at a time: a device that accepts one connection is
//! never offered two. Identical reads that are queued or in flight are shared (single
//! flight).
//!
//! The four read functions are framed here, by hand, so that every reply is checked
//! against its request before any of it is used (`check`): transaction ID and MBAP
//! header (TCP) or CRC (RTU), unit ID, function code, byte count and length must all be
//! exactly what was asked. A reply that fails any check is a protocol error
//! (`DriverError::Malformed`), never a value. (tokio-modbus's client is not used for
//! reads: it takes a coil reply with too many bytes and truncates it, ignores bytes
//! after a register reply's data, `debug_assert`s on short replies, and skips ahead
//! after a bad RTU CRC looking for another frame.) After a timeout or a protocol error
//! the connection is dropped and reopened, so a late reply can never become the answer
//! to another request; and bytes the device sent unasked are discarded before each
//! request, so a second reply to one request is not taken as the answer to the next (RTU
//! has no transaction ID to tell them apart).

mod link;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use super::codec::{RawValue, decode_registers};
use super::plan::{Block, plan};
use super::{BoxFuture, Driver, DriverError, ReadOptions, Sample};
use crate::registry::{
    Device, Endpoint, ModbusPoint, Parity, Protocol, RegisterTable, Sensor, SensorSource, SerialSettings,
};
pub use link::{Link, Target};

/// Reconnect backoff after a failed connect: doubles from the first to the last, with
/// jitter, and resets on success.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Reads waiting for one endpoint; more are refused as busy rather than queued forever.
const QUEUE: usize = 256;
/// How long a caller that shared a request answered "busy" waits before sending its own.
const BUSY_PAUSE: Duration = Duration::from_millis(50);

/// One read request on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadKey {
    pub unit: u8,
    pub table: RegisterTable,
    pub start: u16,
    pub count: u16,
}

/// What a read returns: registers or bits.
#[derive(Debug, Clone, PartialEq)]
pub enum Words {
    Registers(Vec<u16>),
    Bits(Vec<bool>),
}

/// Exception replies mean the device is alive and said no.
fn from_exception(code: u8) -> DriverError {
    match code {
        // Acknowledge (working on it), server device busy.
        5 | 6 => DriverError::Busy,
        // Gateway path unavailable.
        0x0A => DriverError::Unavailable { retry_after: None },
        // Gateway target device failed to respond.
        0x0B => DriverError::Timeout,
        _ => DriverError::Rejected { code },
    }
}

/// One Modbus device: its settings and the link to its endpoint.
pub struct ModbusDriver {
    device: Device,
    link: Arc<Link>,
}

impl ModbusDriver {
    pub fn new(device: Device, link: Arc<Link>) -> ModbusDriver {
        ModbusDriver { device, link }
    }

    /// The link target of a Modbus device, or `None` for other protocols.
    pub fn target(device: &Device) -> Option<Target> {
        match (&device.endpoint, device.protocol) {
            (Endpoint::Tcp { host, port }, Protocol::ModbusTcp | Protocol::ModbusRtuOverTcp) => {
                Some(Target::Tcp {
                    host: host.clone(),
                    port: *port,
                    rtu: device.protocol == Protocol::ModbusRtuOverTcp,
                })
            }
            (Endpoint::Serial { path }, Protocol::ModbusRtu) => {
                let s = device.serial.clone().unwrap_or(SerialSettings {
                    baud_rate: 19200,
                    parity: Parity::Even,
                    data_bits: 8,
                    stop_bits: 1,
                });
                Some(Target::Serial {
                    path: path.clone(),
                    baud_rate: s.baud_rate,
                    parity: s.parity,
                    data_bits: s.data_bits,
                    stop_bits: s.stop_bits,
                })
            }
            _ => None,
        }
    }

    async fn read_block(&self, b: &Block, options: ReadOptions) -> Result<Words, DriverError> {
        let key = ReadKey { unit: self.device.unit_id, table: b.table, start: b.start, count: b.count };
        self.link.read(key, self.device.timeout, options).await
    }
}

#[inline]
fn slice(words: &Words, block: &Block, p: &ModbusPoint) -> Result<RawValue, DriverError> {
    let from = (p.address - block.start) as usize;
    let to = from + p.count as usize;
    match words {
        Words::Bits(bits) => bits.get(from).map(|b| RawValue::Bool(*b)).ok_or(DriverError::Malformed),
        Words::Registers(regs) => {
            let regs = regs.get(from..to).ok_or(DriverError::Malformed)?;
            decode_registers(p, regs).map_err(|_| DriverError::Malformed)
        }
    }
}

impl Driver for ModbusDriver {
    fn read<'a>(
        &'a self,
        sensors: &'a [&'a Sensor],
        options: ReadOptions,
    ) -> BoxFuture<'a, Vec<Result<Sample, DriverError>>> {
        Box::pin(async move {
            let mut points = Vec::with_capacity(sensors.len());
            // For each sensor: its point's index in `points`, if it has a Modbus point.
            let mut point_of = Vec::with_capacity(sensors.len());
            for s in sensors {
                match &s.source {
                    SensorSource::Modbus(p) => {
                        point_of.push(Some(points.len()));
                        points.push(p);
                    }
                    SensorSource::OpcUa { .. } | SensorSource::Edge(_) => point_of.push(None),
                }
            }
            let blocks = plan(&points, self.device.max_registers_per_read, self.device.max_gap);
            // For each point: its block.
            let mut block_of = vec![0; points.len()];
            for (b, block) in blocks.iter().enumerate() {
                for &m in &block.members {
                    block_of[m] = b;
                }
            }
            let reads =
                futures_util::future::join_all(blocks.iter().map(|b| self.read_block(b, options))).await;
            let at = chrono::Utc::now();
            // In sensor order, each result built once.
            point_of
                .iter()
                .map(|p| {
                    let m = p.ok_or(DriverError::NotSupported)?;
                    let b = block_of[m];
                    match &reads[b] {
                        Ok(words) => slice(words, &blocks[b], points[m]).map(|value| Sample {
                            value,
                            at,
                            quality: Default::default(),
                        }),
                        Err(e) => Err(e.clone()),
                    }
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{Reply, check, crc16, frame_len, request_frame};
    use super::*;

    const HOLD: ReadKey = ReadKey { unit: 1, table: RegisterTable::Holding, start: 0, count: 2 };
    const COILS: ReadKey = ReadKey { unit: 1, table: RegisterTable::Coil, start: 3, count: 10 };

    /// A Modbus TCP reply: MBAP header with transaction ID 7 and the right length.
    fn tcp(unit: u8, pdu: &[u8]) -> Vec<u8> {
        let mut f = vec![0, 7, 0, 0, 0, 1 + pdu.len() as u8, unit];
        f.extend_from_slice(pdu);
        f
    }

    /// An RTU reply with its CRC.
    fn rtu(unit: u8, pdu: &[u8]) -> Vec<u8> {
        let mut f = vec![unit];
        f.extend_from_slice(pdu);
        let crc = crc16(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        f
    }

    /// What `check` makes of a frame.
    type Checked = Result<Reply, &'static str>;

    /// A whole frame through `frame_len` and `check`, as `Wire::read` takes it.
    fn reply(rtu: bool, key: &ReadKey, frame: &[u8]) -> Checked {
        match frame_len(rtu, frame)? {
            Some(n) if n == frame.len() => check(rtu, 7, key, frame),
            other => panic!("frame length {other:?} for {} bytes", frame.len()),
        }
    }

    #[test]
    fn crc_and_requests_are_framed_by_the_book() {
        // The specification's example: 01 03 00 00 00 0A, CRC C5 CD.
        assert_eq!(crc16(&[0x01, 0x03, 0x00, 0x00, 0x00, 0x0A]).to_le_bytes(), [0xC5, 0xCD]);
        assert_eq!(request_frame(false, 7, &HOLD), [0, 7, 0, 0, 0, 6, 1, 3, 0, 0, 0, 2]);
        let key = ReadKey { count: 10, ..HOLD };
        assert_eq!(request_frame(true, 7, &key), [1, 3, 0, 0, 0, 0x0A, 0xC5, 0xCD]);
        assert_eq!(request_frame(false, 0x1234, &COILS), [0x12, 0x34, 0, 0, 0, 6, 1, 1, 0, 3, 0, 10]);
    }

    #[test]
    fn a_reply_is_taken_only_when_it_matches_its_request_exactly() {
        let good_regs = Ok(Reply::Words(Words::Registers(vec![0x4148, 0x0000])));
        // Coils 3..13: 3 and 11 set (bits 0 and 8).
        let good_bits = {
            let mut b = vec![false; 10];
            b[0] = true;
            b[8] = true;
            Ok(Reply::Words(Words::Bits(b)))
        };
        let regs = [3, 4, 0x41, 0x48, 0, 0];
        for framing in [false, true] {
            let f = |unit: u8, pdu: &[u8]| if framing { rtu(unit, pdu) } else { tcp(unit, pdu) };
            let cases: Vec<(&str, &ReadKey, Vec<u8>, Checked)> = vec![
                ("good registers", &HOLD, f(1, &regs), good_regs.clone()),
                ("good coils", &COILS, f(1, &[1, 2, 0x01, 0x01]), good_bits.clone()),
                // Padding bits past the count are not looked at.
                ("good coils, padding set", &COILS, f(1, &[1, 2, 0x01, 0xFD]), good_bits.clone()),
                ("wrong unit", &HOLD, f(2, &regs), Err("unit ID")),
                ("wrong function", &HOLD, f(1, &[4, 4, 0x41, 0x48, 0, 0]), Err("function code")),
                ("coils answered as discrete inputs", &COILS, f(1, &[2, 2, 1, 1]), Err("function code")),
                ("exception", &HOLD, f(1, &[0x83, 2]), Ok(Reply::Exception(2))),
                ("exception to another function", &HOLD, f(1, &[0x84, 2]), Err("function code")),
                ("coil byte count larger", &COILS, f(1, &[1, 3, 0xFF, 1, 1]), Err("byte count")),
                ("coil byte count smaller", &COILS, f(1, &[1, 1, 1]), Err("byte count")),
                ("register count larger", &HOLD, f(1, &[3, 6, 0x41, 0x48, 0, 0, 0, 0]), Err("byte count")),
                ("register count smaller", &HOLD, f(1, &[3, 2, 0x41, 0x48]), Err("byte count")),
                ("odd byte count", &HOLD, f(1, &[3, 3, 0x41, 0x48, 0]), Err("byte count")),
            ];
            for (what, key, frame, expected) in cases {
                assert_eq!(reply(framing, key, &frame), expected, "{what} (rtu: {framing})");
            }
        }
    }

    #[test]
    fn tcp_headers_and_lengths_are_checked() {
        let good = tcp(1, &[3, 4, 0x41, 0x48, 0, 0]);
        let mut wrong_tid = good.clone();
        wrong_tid[1] = 8;
        assert_eq!(reply(false, &HOLD, &wrong_tid), Err("transaction ID"));
        // The byte count says 4, the data holds 4, but the MBAP length cuts the PDU short
        // or adds bytes after it.
        let mut short = good.clone();
        short[5] -= 2;
        assert_eq!(check(false, 7, &HOLD, &short[..short.len() - 2]), Err("length"));
        let long = tcp(1, &[3, 4, 0x41, 0x48, 0, 0, 0xAA]);
        assert_eq!(reply(false, &HOLD, &long), Err("length"));
        // Byte count fields that disagree with data of the asked size.
        assert_eq!(reply(false, &HOLD, &tcp(1, &[3, 6, 0x41, 0x48, 0, 0])), Err("byte count"));
        assert_eq!(reply(false, &COILS, &tcp(1, &[1, 3, 1, 1])), Err("byte count"));
        assert_eq!(reply(false, &HOLD, &tcp(1, &[0x83, 2, 0])), Err("length"));
        // Headers no reply can have fail before the rest arrives.
        assert_eq!(frame_len(false, b"HTTP"), Err("protocol identifier"));
        assert_eq!(frame_len(false, &[0, 7, 0, 0, 0, 0]), Err("MBAP length"));
        assert_eq!(frame_len(false, &[0, 7, 0, 0, 0, 2]), Err("MBAP length"));
        assert_eq!(frame_len(false, &[0, 7, 0, 0, 1, 0]), Err("MBAP length"));
        // A frame that says it is longer than what has come is waited for.
        assert_eq!(frame_len(false, &[0, 7, 0]), Ok(None));
        assert_eq!(frame_len(false, &good[..9]), Ok(Some(13)));
    }

    #[test]
    fn rtu_frames_are_checked_by_crc() {
        let mut bad = rtu(1, &[3, 4, 0x41, 0x48, 0, 0]);
        *bad.last_mut().unwrap() ^= 0x55;
        assert_eq!(reply(true, &HOLD, &bad), Err("CRC"));
        // A byte count smaller than the data: the CRC is not where the sender put it.
        let mut f = vec![1, 3, 2, 0x41, 0x48, 0, 0];
        let crc = crc16(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(frame_len(true, &f), Ok(Some(7)));
        assert_eq!(check(true, 0, &HOLD, &f[..7]), Err("CRC"));
        // The length comes from the function code and byte count.
        assert_eq!(frame_len(true, &[1]), Ok(None));
        assert_eq!(frame_len(true, &[1, 3]), Ok(None));
        assert_eq!(frame_len(true, &[1, 3, 4]), Ok(Some(9)));
        assert_eq!(frame_len(true, &[1, 0x83]), Ok(Some(5)));
        assert_eq!(frame_len(true, b"HTTP"), Err("function code"));
    }

    #[test]
    fn exceptions_map_to_what_the_device_meant() {
        assert_eq!(from_exception(2), DriverError::Rejected { code: 2 });
        assert_eq!(from_exception(5), DriverError::Busy);
        assert_eq!(from_exception(6), DriverError::Busy);
        assert_eq!(from_exception(0x0A), DriverError::Unavailable { retry_after: None });
        assert_eq!(from_exception(0x0B), DriverError::Timeout);
        assert_eq!(from_exception(0x42), DriverError::Rejected { code: 0x42 });
    }
}
