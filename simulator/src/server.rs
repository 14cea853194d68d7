//! One Modbus server per endpoint, on tokio-modbus's TCP and RTU-over-TCP servers.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_modbus::prelude::{ExceptionCode, Request, Response, SlaveRequest};
use tokio_modbus::server::Service;

use crate::State;
use crate::plant::Table;

/// How requests are framed on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framing {
    Tcp,
    RtuOverTcp,
    /// RTU on a serial line (a pseudo-terminal here).
    RtuSerial,
}

/// Counters of one endpoint, for tests and the control API.
#[derive(Debug, Default)]
pub struct Counters {
    pub accepted: AtomicU64,
    pub refused_over_limit: AtomicU64,
    pub open: AtomicU32,
    pub max_open: AtomicU32,
    pub requests: AtomicU64,
    pub stalls: AtomicU64,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted and served.
    pub accepted: u64,
    /// Connections closed at once because of `max_connections`.
    pub refused_over_limit: u64,
    pub open: u32,
    /// The most connections open at the same time.
    pub max_open: u32,
    pub requests: u64,
    /// Requests that got no reply because their connection stalled.
    pub stalls: u64,
}

impl Counters {
    pub fn snapshot(&self) -> Stats {
        Stats {
            accepted: self.accepted.load(Ordering::Relaxed),
            refused_over_limit: self.refused_over_limit.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Relaxed),
            max_open: self.max_open.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
        }
    }
}

/// One listening address (or serial line) and the devices (unit IDs) behind it.
pub struct Endpoint {
    /// The TCP address; for a serial line, unused.
    pub addr: SocketAddr,
    /// The path a master opens, for a serial line.
    pub serial_path: Option<String>,
    pub framing: Framing,
    pub devices: Vec<String>,
    pub counters: Counters,
}

/// Keeps the open-connection count right however the connection ends.
struct OpenGuard(Arc<Endpoint>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the service decided about one connection: reset it, or stall it.
#[derive(Default)]
pub struct ConnFate {
    reset: AtomicBool,
    /// The connection answers nothing before this instant.
    stalled_until: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// A stall just ended: what was sent during it is discarded, unanswered.
    drain: AtomicBool,
}

impl ConnFate {
    fn stalled_until(&self) -> Option<tokio::time::Instant> {
        *self.stalled_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stall(&self, until: tokio::time::Instant) {
        *self.stalled_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
    }
}

/// The socket of one connection; reads fail once the service decided to reset it.
pub struct SimStream {
    inner: TcpStream,
    fate: Arc<ConnFate>,
    _guard: OpenGuard,
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.fate.reset.load(Ordering::Acquire) {
            return Poll::Ready(Err(io::Error::from(io::ErrorKind::ConnectionReset)));
        }
        if self.fate.drain.load(Ordering::Acquire) {
            // Requests queued behind a stall are never answered: read and drop them.
            let mut scratch = [0u8; 1024];
            loop {
                let mut sink = ReadBuf::new(&mut scratch);
                match Pin::new(&mut self.inner).poll_read(cx, &mut sink) {
                    Poll::Ready(Ok(())) if !sink.filled().is_empty() => continue,
                    Poll::Ready(result) => return Poll::Ready(result),
                    Poll::Pending => {
                        self.fate.drain.store(false, Ordering::Release);
                        return Poll::Pending;
                    }
                }
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves the requests of one connection.
pub struct ConnService {
    state: Arc<State>,
    endpoint: Arc<Endpoint>,
    fate: Arc<ConnFate>,
}

type Reply = Result<Option<Response>, ExceptionCode>;

impl Service for ConnService {
    type Request = SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Pin<Box<dyn Future<Output = Reply> + Send>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        let state = self.state.clone();
        let endpoint = self.endpoint.clone();
        let fate = self.fate.clone();
        Box::pin(async move { answer(&state, &endpoint, &fate, req).await })
    }
}

async fn answer(state: &State, endpoint: &Endpoint, fate: &ConnFate, req: SlaveRequest<'static>) -> Reply {
    endpoint.counters.requests.fetch_add(1, Ordering::Relaxed);
    let Some(device) = endpoint.devices.iter().find(|id| state.unit_of(id) == Some(req.slave)) else {
        // Nobody on a serial bus answers for an absent unit; a TCP gateway says so.
        return match endpoint.framing {
            Framing::Tcp => Err(ExceptionCode::GatewayTargetDevice),
            Framing::RtuOverTcp | Framing::RtuSerial => Ok(None),
        };
    };
    let faults = state.faults(device);
    // A serial line has no connection to refuse or reset: a dead device is silent.
    if endpoint.framing == Framing::RtuSerial && (faults.down || state.chance(device, faults.reset)) {
        return Ok(None);
    }
    if state.chance(device, faults.reset) {
        fate.reset.store(true, Ordering::Release);
        return Ok(None);
    }
    let now = tokio::time::Instant::now();
    let stalled = match fate.stalled_until() {
        Some(until) if now < until => Some(until),
        _ if state.chance(device, faults.stall) => {
            let until = now + Duration::from_millis(faults.stall_ms);
            fate.stall(until);
            Some(until)
        }
        _ => None,
    };
    if let Some(until) = stalled {
        endpoint.counters.stalls.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep_until(until).await;
        fate.drain.store(true, Ordering::Release);
        return Ok(None);
    }
    if state.chance(device, faults.no_reply) {
        return Ok(None);
    }
    let mut delay = faults.latency_ms;
    if faults.jitter_ms > 0 {
        delay += state.uniform(device, faults.jitter_ms + 1);
    }
    if state.chance(device, faults.late_reply) {
        delay = delay.max(faults.late_reply_ms);
    }
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if let Some(code) = faults.exception_code
        && state.chance(device, faults.exception_rate)
    {
        return Err(exception(code));
    }
    let t = state.clock.now();
    let read = |table, addr, qty, bits| state.read(device, table, addr, qty, bits, t);
    Ok(Some(match req.request {
        Request::ReadCoils(a, q) => Response::ReadCoils(read(Table::Coil, a, q, true)?.1),
        Request::ReadDiscreteInputs(a, q) => {
            Response::ReadDiscreteInputs(read(Table::Discrete, a, q, true)?.1)
        }
        Request::ReadHoldingRegisters(a, q) => {
            Response::ReadHoldingRegisters(read(Table::Holding, a, q, false)?.0)
        }
        Request::ReadInputRegisters(a, q) => Response::ReadInputRegisters(read(Table::Input, a, q, false)?.0),
        _ => return Err(ExceptionCode::IllegalFunction),
    }))
}

fn exception(code: u8) -> ExceptionCode {
    match code {
        1 => ExceptionCode::IllegalFunction,
        2 => ExceptionCode::IllegalDataAddress,
        3 => ExceptionCode::IllegalDataValue,
        4 => ExceptionCode::ServerDeviceFailure,
        5 => ExceptionCode::Acknowledge,
        6 => ExceptionCode::ServerDeviceBusy,
        8 => ExceptionCode::MemoryParityError,
        0x0A => ExceptionCode::GatewayPathUnavailable,
        0x0B => ExceptionCode::GatewayTargetDevice,
        other => ExceptionCode::Custom(other),
    }
}

/// Accepts a connection unless the device's connection limit is reached.
fn on_connected(
    state: &Arc<State>,
    endpoint: &Arc<Endpoint>,
    stream: TcpStream,
) -> io::Result<Option<(ConnService, SimStream)>> {
    let limit = endpoint.devices.iter().filter_map(|d| state.faults(d).max_connections).min();
    let open = endpoint.counters.open.fetch_add(1, Ordering::AcqRel) + 1;
    let guard = OpenGuard(endpoint.clone());
    if limit.is_some_and(|max| open > max) {
        endpoint.counters.refused_over_limit.fetch_add(1, Ordering::Relaxed);
        return Ok(None); // the stream and the guard drop here: closed at once
    }
    endpoint.counters.accepted.fetch_add(1, Ordering::Relaxed);
    endpoint.counters.max_open.fetch_max(open, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    let fate = Arc::new(ConnFate::default());
    let service = ConnService { state: state.clone(), endpoint: endpoint.clone(), fate: fate.clone() };
    Ok(Some((service, SimStream { inner: stream, fate, _guard: guard })))
}

/// Serves `endpoint` until shutdown, closing the listener while any of its devices is
/// down (so connections are refused, not accepted and dropped).
pub async fn run(state: Arc<State>, endpoint: Arc<Endpoint>, first: TcpListener) {
    let mut listener = Some(first);
    let mut changes = state.subscribe();
    loop {
        if state.is_shut_down() {
            return;
        }
        if endpoint.devices.iter().any(|d| state.faults(d).down) {
            listener = None;
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match TcpListener::bind(endpoint.addr).await {
                Ok(l) => l,
                Err(error) => {
                    tracing::warn!(addr = %endpoint.addr, %error, "cannot listen again; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let mut watch = state.subscribe();
        let (st, ep) = (state.clone(), endpoint.clone());
        let abort = async move {
            loop {
                if watch.changed().await.is_err()
                    || st.is_shut_down()
                    || ep.devices.iter().any(|d| st.faults(d).down)
                {
                    return;
                }
            }
        };
        let (st, ep) = (state.clone(), endpoint.clone());
        let connected = move |stream: TcpStream, _peer: SocketAddr| {
            let r = on_connected(&st, &ep, stream);
            async move { r }
        };
        let on_error = |error: io::Error| tracing::debug!(%error, "connection ended");
        let result = match endpoint.framing {
            Framing::Tcp => {
                tokio_modbus::server::tcp::Server::new(l).serve_until(&connected, on_error, abort).await
            }
            Framing::RtuOverTcp | Framing::RtuSerial => {
                tokio_modbus::server::rtu_over_tcp::Server::new(l)
                    .serve_until(&connected, on_error, abort)
                    .await
            }
        };
        if let Err(error) = result {
            tracing::warn!(addr = %endpoint.addr, %error, "server stopped");
        }
        changes.borrow_and_update();
    }
}

/// Serves a serial endpoint on the master side of a pseudo-terminal until shutdown.
/// `slave` is kept open so the line stays up while masters open and close its path.
pub async fn run_serial(
    state: Arc<State>,
    endpoint: Arc<Endpoint>,
    master: tokio_serial::SerialStream,
    slave: tokio_serial::SerialStream,
) {
    let service = ConnService { state: state.clone(), endpoint, fate: Arc::new(ConnFate::default()) };
    let mut watch = state.subscribe();
    let st = state.clone();
    let abort = async move { while watch.changed().await.is_ok() && !st.is_shut_down() {} };
    if let Err(error) = tokio_modbus::server::rtu::Server::new(master).serve_until(service, abort).await {
        tracing::warn!(%error, "serial server stopped");
    }
    drop(slave);
}
