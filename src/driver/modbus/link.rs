//! The one connection to an endpoint and its queue of reads (see the module above).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::wire::{Io, Reply, Wire, WireError, function};
use super::{BACKOFF_FIRST, BACKOFF_MAX, BUSY_PAUSE, QUEUE, ReadKey, Words, from_exception};
use crate::backoff::{Backoff, jittered};
use crate::driver::{DriverError, ReadOptions};
use crate::registry::Parity;

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
                        let pause = jittered(BUSY_PAUSE);
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
            let mut map = self.inflight.lock();
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
            let waiters = self.inflight.lock().remove(&key);
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
    /// Waits between failed connects; reset by a successful one.
    backoff: Backoff,
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
            backoff: Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
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
            let waiters = self.inflight.lock().remove(&job.key);
            for w in waiters.into_iter().flatten() {
                let _ = w.send(result.clone());
            }
        }
    }

    fn connect_failed(&mut self) -> Duration {
        let wait = self.backoff.next_wait();
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
                self.backoff.reset();
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
        .parity(line_parity(parity))
        .data_bits(line_data_bits(data_bits))
        .stop_bits(line_stop_bits(stop_bits));
    let port = tokio_serial::SerialStream::open(&builder)?;
    let _ = port.clear(ClearBuffer::All);
    Ok(port)
}

// The line's settings (the device file allows 5 to 8 data bits, 1 or 2 stop bits). A
// pseudo-terminal keeps none of them, so they are checked here rather than read back.
fn line_parity(parity: Parity) -> tokio_serial::Parity {
    match parity {
        Parity::None => tokio_serial::Parity::None,
        Parity::Even => tokio_serial::Parity::Even,
        Parity::Odd => tokio_serial::Parity::Odd,
    }
}

fn line_data_bits(bits: u8) -> tokio_serial::DataBits {
    match bits {
        5 => tokio_serial::DataBits::Five,
        6 => tokio_serial::DataBits::Six,
        7 => tokio_serial::DataBits::Seven,
        _ => tokio_serial::DataBits::Eight,
    }
}

fn line_stop_bits(bits: u8) -> tokio_serial::StopBits {
    if bits == 2 { tokio_serial::StopBits::Two } else { tokio_serial::StopBits::One }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
