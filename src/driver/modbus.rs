//! Modbus TCP, RTU over TCP and RTU on a serial line, on tokio-modbus.
//!
//! One [`Link`] per endpoint owns the only connection to it and serves a queue of reads
//! for every unit ID behind it, one at a time: a device that accepts one connection is
//! never offered two. Identical reads that are queued or in flight are shared (single
//! flight). After a timeout the connection is dropped and reopened: tokio-modbus matches
//! replies by order, so a late reply left on the socket would otherwise become the answer
//! to the next request (slowtec/tokio-modbus#324).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_modbus::client::{Context, Reader};
use tokio_modbus::prelude::{ExceptionCode, Slave, SlaveContext};

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
    ctx: Option<Context>,
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
            ctx: None,
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
                        Ok(Ok(if *rtu {
                            tokio_modbus::client::rtu::attach(stream)
                        } else {
                            tokio_modbus::client::tcp::attach(stream)
                        }))
                    }
                    Ok(Err(e)) => Ok(Err(e)),
                    Err(elapsed) => Err(elapsed),
                }
            }
            Target::Serial { path, baud_rate, parity, data_bits, stop_bits } => {
                Ok(open_serial(path, *baud_rate, *parity, *data_bits, *stop_bits)
                    .map(tokio_modbus::client::rtu::attach))
            }
        };
        match opened {
            Ok(Ok(ctx)) => {
                self.ctx = Some(ctx);
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
        if self.ctx.is_none() {
            self.connect(job.timeout, job.deadline, job.probe).await?;
        }
        let Some(ctx) = self.ctx.as_mut() else { return Err(DriverError::Unavailable { retry_after: None }) };
        ctx.set_slave(Slave(job.key.unit));
        let (start, count) = (job.key.start, job.key.count);
        let read = async {
            match job.key.table {
                RegisterTable::Holding => {
                    ctx.read_holding_registers(start, count).await.map(|r| r.map(Words::Registers))
                }
                RegisterTable::Input => {
                    ctx.read_input_registers(start, count).await.map(|r| r.map(Words::Registers))
                }
                RegisterTable::Coil => ctx.read_coils(start, count).await.map(|r| r.map(Words::Bits)),
                RegisterTable::Discrete => {
                    ctx.read_discrete_inputs(start, count).await.map(|r| r.map(Words::Bits))
                }
            }
        };
        let outcome = tokio::time::timeout(limit(job), read).await;
        let result = match outcome {
            // No reply in time: the reply may still come, so this connection is finished.
            Err(_) => Err(DriverError::Timeout),
            Ok(Err(tokio_modbus::Error::Transport(_))) => Err(DriverError::Unavailable { retry_after: None }),
            Ok(Err(tokio_modbus::Error::Protocol(_))) => Err(DriverError::Malformed),
            Ok(Ok(Err(exception))) => return Err(from_exception(exception)),
            Ok(Ok(Ok(words))) => {
                let n = match &words {
                    Words::Registers(r) => r.len(),
                    // Bits come back padded to whole bytes.
                    Words::Bits(b) => b.len().min(count as usize),
                };
                if n == count as usize {
                    return Ok(match words {
                        Words::Bits(mut b) => {
                            b.truncate(count as usize);
                            Words::Bits(b)
                        }
                        w => w,
                    });
                }
                Err(DriverError::Malformed)
            }
        };
        // Any failure but an exception reply leaves the connection in an unknown state.
        self.ctx = None;
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

/// A number in [0, 1) that differs between calls, for backoff jitter.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one(std::time::SystemTime::now());
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// Exception replies mean the device is alive and said no.
fn from_exception(e: ExceptionCode) -> DriverError {
    let code = u8::from(e);
    match e {
        ExceptionCode::ServerDeviceBusy | ExceptionCode::Acknowledge => DriverError::Busy,
        ExceptionCode::GatewayTargetDevice => DriverError::Timeout,
        ExceptionCode::GatewayPathUnavailable => DriverError::Unavailable { retry_after: None },
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
