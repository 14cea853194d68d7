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

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::codec::{RawValue, decode_registers};
use super::plan::{Block, plan};
use super::{BoxFuture, Driver, DriverError, ReadOptions, Sample};
use crate::registry::{
    Device, Endpoint, ModbusPoint, Parity, Protocol, RegisterTable, Sensor, SensorSource, SerialSettings,
};

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

type Waiters = Vec<oneshot::Sender<Result<Words, DriverError>>>;

struct Job {
    key: ReadKey,
    timeout: Duration,
    deadline: Instant,
    /// A breaker probe: connect now even while backing off.
    probe: bool,
}

/// How to reach an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Tcp {
        host: String,
        port: u16,
        /// RTU framing over the TCP stream (a serial gateway) instead of Modbus TCP.
        rtu: bool,
    },
    Serial {
        path: String,
        baud_rate: u32,
        parity: Parity,
        data_bits: u8,
        stop_bits: u8,
    },
}

/// The one connection to an endpoint and its queue.
pub struct Link {
    target: Target,
    queue: OnceLock<mpsc::Sender<Job>>,
    inflight: Arc<Mutex<HashMap<ReadKey, Waiters>>>,
}

impl Link {
    pub fn new(target: Target) -> Link {
        Link { target, queue: OnceLock::new(), inflight: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// The queue, with its connection task started on first use (inside the runtime).
    fn queue(&self) -> &mpsc::Sender<Job> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            let conn = Connection::new(self.target.clone(), self.inflight.clone());
            tokio::spawn(conn.run(rx));
            tx
        })
    }

    /// Reads one block, sharing an identical read already queued or in flight.
    ///
    /// A caller that joined another caller's request did not fail at the device when that
    /// request failed: it sends its own on the (fresh) connection while its deadline
    /// allows, and otherwise ends with `Queued`, which blames nobody. So one stalled
    /// request is one failure, the owner's, however many calls were waiting on it.
    pub async fn read(
        &self,
        key: ReadKey,
        timeout: Duration,
        options: ReadOptions,
    ) -> Result<Words, DriverError> {
        let deadline = options.deadline;
        loop {
            let (first, result) = self.read_once(key, timeout, options).await;
            match result {
                Err(e) if !first && e.is_transient() => {
                    if e == DriverError::Busy {
                        // The device asked to be left alone for a moment.
                        let pause = BUSY_PAUSE.mul_f64(0.5 + 0.5 * jitter());
                        if Instant::now() + pause >= deadline {
                            return Err(DriverError::Queued);
                        }
                        tokio::time::sleep(pause).await;
                    }
                    if Instant::now() >= deadline {
                        return Err(DriverError::Queued);
                    }
                }
                other => return other,
            }
        }
    }

    /// One request, or a share of an identical one: whether this caller sent it, and how
    /// it went.
    async fn read_once(
        &self,
        key: ReadKey,
        timeout: Duration,
        options: ReadOptions,
    ) -> (bool, Result<Words, DriverError>) {
        let deadline = options.deadline;
        let (tx, rx) = oneshot::channel();
        let first = {
            let mut map = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            match map.entry(key) {
                Entry::Occupied(mut e) => {
                    e.get_mut().push(tx);
                    false
                }
                Entry::Vacant(e) => {
                    e.insert(vec![tx]);
                    true
                }
            }
        };
        if first && self.queue().try_send(Job { key, timeout, deadline, probe: options.probe }).is_err() {
            // The queue is full (or the task is gone): answer everyone waiting on this key.
            let waiters = self.inflight.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            for w in waiters.into_iter().flatten() {
                let _ = w.send(Err(DriverError::Busy));
            }
        }
        // The connection task always answers; the margin only guards against a bug there.
        let result = match tokio::time::timeout_at(deadline + Duration::from_millis(50), rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(DriverError::Unavailable { retry_after: None }),
            Err(_) => Err(DriverError::Queued),
        };
        (first, result)
    }
}

/// The connection task's state.
struct Connection {
    target: Target,
    inflight: Arc<Mutex<HashMap<ReadKey, Waiters>>>,
    wire: Option<Wire>,
    failures: u32,
    next_connect: Instant,
    /// After a timeout on a serial line: the line is not used again before this instant,
    /// so a late reply has finished arriving before the buffer is cleared.
    quiet_until: Option<Instant>,
}

impl Connection {
    fn new(target: Target, inflight: Arc<Mutex<HashMap<ReadKey, Waiters>>>) -> Connection {
        Connection {
            target,
            inflight,
            wire: None,
            failures: 0,
            next_connect: Instant::now(),
            quiet_until: None,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        while let Some(job) = rx.recv().await {
            let result = if Instant::now() >= job.deadline {
                // Its turn came too late: the device was never asked.
                Err(DriverError::Queued)
            } else {
                self.execute(&job).await
            };
            let waiters = self.inflight.lock().unwrap_or_else(|e| e.into_inner()).remove(&job.key);
            for w in waiters.into_iter().flatten() {
                let _ = w.send(result.clone());
            }
        }
    }

    fn connect_failed(&mut self) -> Duration {
        let exp = BACKOFF_FIRST.saturating_mul(1 << self.failures.min(8)).min(BACKOFF_MAX);
        self.failures += 1;
        // Jitter in [50%, 100%] so endpoints that failed together do not retry together.
        let wait = exp.mul_f64(0.5 + 0.5 * jitter());
        self.next_connect = Instant::now() + wait;
        wait
    }

    async fn connect(&mut self, limit: Duration, deadline: Instant, probe: bool) -> Result<(), DriverError> {
        let now = Instant::now();
        if now < self.next_connect && !probe {
            // Backing off: wait for it when that still leaves time to connect (a breaker
            // probe must reach the device), otherwise fail at once.
            if self.next_connect + limit.min(Duration::from_millis(50)) >= deadline {
                return Err(DriverError::Unavailable { retry_after: Some(self.next_connect - now) });
            }
            tokio::time::sleep_until(self.next_connect).await;
        }
        let limit = limit.min(deadline.saturating_duration_since(Instant::now()));
        let opened = match &self.target {
            Target::Tcp { host, port, rtu } => {
                match tokio::time::timeout(limit, TcpStream::connect((host.as_str(), *port))).await {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        Ok(Io::tcp(stream).map(|io| Wire::new(io, *rtu)))
                    }
                    Ok(Err(e)) => Ok(Err(e)),
                    Err(elapsed) => Err(elapsed),
                }
            }
            Target::Serial { path, baud_rate, parity, data_bits, stop_bits } => {
                Ok(open_serial(path, *baud_rate, *parity, *data_bits, *stop_bits)
                    .map(|port| Wire::new(Io::Serial(port), true)))
            }
        };
        match opened {
            Ok(Ok(wire)) => {
                self.wire = Some(wire);
                self.failures = 0;
                Ok(())
            }
            Ok(Err(_)) => {
                let wait = self.connect_failed();
                Err(DriverError::Unavailable { retry_after: Some(wait) })
            }
            Err(_) => {
                self.connect_failed();
                Err(DriverError::Timeout)
            }
        }
    }

    async fn execute(&mut self, job: &Job) -> Result<Words, DriverError> {
        let limit = |job: &Job| job.timeout.min(job.deadline.saturating_duration_since(Instant::now()));
        if let Some(quiet) = self.quiet_until.take() {
            if quiet > job.deadline {
                // The line must stay quiet beyond this call's deadline: the call waits for
                // it as long as it may, and the device is not to blame.
                tokio::time::sleep_until(job.deadline).await;
                self.quiet_until = Some(quiet);
                return Err(DriverError::Queued);
            }
            tokio::time::sleep_until(quiet).await;
        }
        if self.wire.is_none() {
            self.connect(job.timeout, job.deadline, job.probe).await?;
        }
        let Some(wire) = self.wire.as_mut() else {
            return Err(DriverError::Unavailable { retry_after: None });
        };
        let outcome = tokio::time::timeout(limit(job), wire.read(&job.key)).await;
        let result = match outcome {
            // No reply in time: the reply may still come, so this connection is finished.
            Err(_) => Err(DriverError::Timeout),
            Ok(Err(WireError::Io)) => Err(DriverError::Unavailable { retry_after: None }),
            Ok(Err(WireError::Mismatch(check))) => {
                tracing::warn!(
                    endpoint = ?self.target,
                    unit = job.key.unit,
                    function = function(job.key.table),
                    start = job.key.start,
                    count = job.key.count,
                    check,
                    "Modbus: the reply does not match its request; the connection is dropped"
                );
                Err(DriverError::Malformed)
            }
            Ok(Ok(Reply::Exception(code))) => return Err(from_exception(code)),
            Ok(Ok(Reply::Words(words))) => return Ok(words),
        };
        // Any failure but an exception reply leaves the connection in an unknown state.
        self.wire = None;
        if result == Err(DriverError::Timeout) && matches!(self.target, Target::Serial { .. }) {
            self.quiet_until = Some(Instant::now() + job.timeout);
        }
        result
    }
}

/// Opens a serial line for RTU, discarding whatever is still buffered on it (a late
/// reply to a request that already timed out must not be read as the next answer).
fn open_serial(
    path: &str,
    baud: u32,
    parity: Parity,
    data_bits: u8,
    stop_bits: u8,
) -> std::io::Result<tokio_serial::SerialStream> {
    use tokio_serial::{ClearBuffer, SerialPort};
    let builder = tokio_serial::new(path, baud)
        .parity(match parity {
            Parity::None => tokio_serial::Parity::None,
            Parity::Even => tokio_serial::Parity::Even,
            Parity::Odd => tokio_serial::Parity::Odd,
        })
        .data_bits(match data_bits {
            5 => tokio_serial::DataBits::Five,
            6 => tokio_serial::DataBits::Six,
            7 => tokio_serial::DataBits::Seven,
            _ => tokio_serial::DataBits::Eight,
        })
        .stop_bits(if stop_bits == 2 { tokio_serial::StopBits::Two } else { tokio_serial::StopBits::One });
    let port = tokio_serial::SerialStream::open(&builder)?;
    let _ = port.clear(ClearBuffer::All);
    Ok(port)
}

/// The byte stream to an endpoint.
enum Io {
    Tcp {
        stream: TcpStream,
        /// The same socket, read without the runtime (non-blocking) to find bytes the
        /// device sent unasked: the runtime only learns of them when it next polls.
        unread: std::net::TcpStream,
    },
    Serial(tokio_serial::SerialStream),
}

impl Io {
    fn tcp(stream: TcpStream) -> std::io::Result<Io> {
        let stream = stream.into_std()?;
        let unread = stream.try_clone()?;
        Ok(Io::Tcp { stream: TcpStream::from_std(stream)?, unread })
    }

    async fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        match self {
            Io::Tcp { stream, .. } => stream.write_all(frame).await,
            Io::Serial(port) => {
                port.write_all(frame).await?;
                port.flush().await
            }
        }
    }

    /// Reads what has arrived (at least one byte; 0 when the stream is closed).
    async fn receive(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        buf.reserve(256);
        match self {
            Io::Tcp { stream, .. } => stream.read_buf(buf).await,
            Io::Serial(port) => port.read_buf(buf).await,
        }
    }

    /// Drops whatever the device sent that no request asked for (a second reply, a late
    /// one, noise); how many bytes that was.
    fn discard_unread(&mut self) -> usize {
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
enum WireError {
    /// The stream failed or was closed.
    Io,
    /// The reply does not match the request; the check that failed.
    Mismatch(&'static str),
}

/// What the device answered to one request.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Words(Words),
    Exception(u8),
}

/// One open connection, framed as Modbus TCP or RTU.
struct Wire {
    io: Io,
    rtu: bool,
    /// The transaction ID of the last request (Modbus TCP).
    tid: u16,
    buf: Vec<u8>,
}

impl Wire {
    fn new(io: Io, rtu: bool) -> Wire {
        Wire { io, rtu, tid: 0, buf: Vec::with_capacity(MAX_FRAME) }
    }

    /// Sends one read and waits for its reply: a complete frame, checked against the
    /// request. A frame that never completes is left to the caller's timeout.
    async fn read(&mut self, key: &ReadKey) -> Result<Reply, WireError> {
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
        check(self.rtu, self.tid, key, &self.buf[..len]).map_err(WireError::Mismatch)
    }
}

/// The longest frame of either framing: MBAP header (7) + PDU (253); RTU is shorter.
const MAX_FRAME: usize = 260;

/// The function code that reads `table`.
fn function(table: RegisterTable) -> u8 {
    match table {
        RegisterTable::Coil => 0x01,
        RegisterTable::Discrete => 0x02,
        RegisterTable::Holding => 0x03,
        RegisterTable::Input => 0x04,
    }
}

/// The request for `key`: an MBAP header with `tid`, or RTU with its CRC.
fn request_frame(rtu: bool, tid: u16, key: &ReadKey) -> Vec<u8> {
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
fn frame_len(rtu: bool, buf: &[u8]) -> Result<Option<usize>, &'static str> {
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
fn check(rtu: bool, tid: u16, key: &ReadKey, frame: &[u8]) -> Result<Reply, &'static str> {
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
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0xFFFFu16;
    for &b in bytes {
        crc ^= u16::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xA001 } else { crc >> 1 };
        }
    }
    crc
}

/// A number in [0, 1) that differs between calls, for backoff jitter.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one(std::time::SystemTime::now());
    (n >> 11) as f64 / (1u64 << 53) as f64
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
                    SensorSource::OpcUa { .. } => point_of.push(None),
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
