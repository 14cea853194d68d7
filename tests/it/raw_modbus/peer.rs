//! The raw-socket Modbus peer: it reads each request frame itself (MBAP for Modbus TCP;
//! unit, PDU and CRC-16/MODBUS for RTU over TCP or over a serial line, a pseudo-terminal
//! pair) and answers with the reply [`Shape`] the test scripted, built byte by byte here,
//! without tokio-modbus or fieldgate's framing.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

/// How the peer frames requests and replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Modbus TCP: MBAP header, no checksum.
    Tcp,
    /// Modbus RTU over a TCP stream (a serial gateway): unit, PDU, CRC.
    Rtu,
}

/// How the peer answers one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The right reply.
    Good,
    /// The right reply with the next transaction ID (TCP).
    WrongTid,
    /// The right reply from the next unit ID.
    WrongUnit,
    /// The right data under a neighbouring read function (3 ↔ 4, 1 ↔ 2).
    WrongFunction,
    /// An exception reply with this code.
    Exception(u8),
    /// The byte count field off by this much; the data (and the MBAP length, or the CRC
    /// after it) as for the right reply.
    ByteCountField(i8),
    /// A reply that is well formed in itself but carries this many more (fewer) registers
    /// or, for bits, bytes: byte count, data and length agree. Extra ones come first.
    Items(i8),
    /// The right reply with its MBAP length field off by this much (TCP).
    MbapLength(i8),
    /// The right reply but for its last 3 bytes, then silence.
    Truncated,
    /// The right reply with its last CRC byte flipped (RTU).
    BadCrc,
    /// The right reply, then at once a second reply with other values for the same
    /// request (they may arrive together).
    Twice,
    /// The right reply; the second reply with other values follows when the test calls
    /// [`Peer::repeat`], after the first was taken.
    Repeat,
    /// These bytes instead of a reply.
    Garbage(&'static [u8]),
    /// No reply: the connection is closed.
    Close,
    /// No reply at all.
    Silence,
}

/// A request as the peer read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub tid: u16,
    pub unit: u8,
    pub function: u8,
    pub start: u16,
    pub count: u16,
}

/// The peer's tables: holding registers (address, value) and the coils that are on.
/// Holding 0-1 hold the f32 12.5 (0x41480000), big-endian words.
/// Holding registers: an f32 of 12.5 at 0–1; 64-bit integers at 10, 20, 30 and 40 (u64::MAX,
/// the i64 1234567890123, 2^63 as u64, the i64 2^53 + 1) and the i32 -7 at 50.
const HOLDING: &[(u16, u16)] = &[
    (0, 0x4148),
    (1, 0x0000),
    (10, 0xFFFF),
    (11, 0xFFFF),
    (12, 0xFFFF),
    (13, 0xFFFF),
    (20, 0x0000),
    (21, 0x011F),
    (22, 0x71FB),
    (23, 0x04CB),
    (30, 0x8000),
    (40, 0x0020),
    (43, 0x0001),
    (50, 0xFFFF),
    (51, 0xFFF9),
];
const COILS_ON: [u16; 2] = [3, 11];

/// A scripted raw-socket Modbus server on 127.0.0.1, on a free port.
pub struct Peer {
    pub port: u16,
    script: Arc<Mutex<VecDeque<Shape>>>,
    /// Releases a `Repeat` reply's second reply; answered once it is written.
    repeat: mpsc::UnboundedSender<oneshot::Sender<()>>,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<Request>>>,
    /// When each request arrived and when each reply was written, in order.
    events: Events,
    /// Holding and input registers by address (both tables hold the same).
    registers: Registers,
    /// On a serial line: the path a master opens, and that end kept open (a pseudo-terminal
    /// whose other end is closed hangs up).
    serial: Option<(String, Arc<tokio_serial::SerialStream>)>,
}

type Registers = Arc<Mutex<HashMap<u16, u16>>>;

/// When each request arrived (`true`) and each reply was written (`false`).
type Events = Arc<Mutex<Vec<(bool, std::time::Instant)>>>;

/// Releases of `Repeat` replies' second replies.
type Released = Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<oneshot::Sender<()>>>>;

impl Peer {
    fn new(port: u16) -> (Peer, Released) {
        let (repeat, released) = mpsc::unbounded_channel();
        let peer = Peer {
            port,
            script: Arc::default(),
            repeat,
            connections: Arc::default(),
            requests: Arc::default(),
            events: Arc::default(),
            registers: Arc::new(Mutex::new(HOLDING.iter().copied().collect())),
            serial: None,
        };
        (peer, Arc::new(tokio::sync::Mutex::new(released)))
    }

    /// Serves `stream` (one connection, or the serial line).
    fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        framing: Framing,
        stream: S,
        released: Released,
    ) {
        self.connections.fetch_add(1, Ordering::SeqCst);
        let log = (self.requests.clone(), self.events.clone());
        tokio::spawn(serve(framing, stream, self.script.clone(), log, released, self.registers.clone()));
    }

    pub async fn start(framing: Framing) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (peer, released) = Peer::new(listener.local_addr().unwrap().port());
        let server = Peer { serial: None, ..peer.handle() };
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                server.serve(framing, stream, released.clone());
            }
        });
        peer
    }

    /// RTU on a serial line: a pseudo-terminal pair, the peer on one end; a master opens
    /// [`Peer::serial_path`].
    pub fn start_serial() -> Peer {
        let (master, slave) = tokio_serial::SerialStream::pair().expect("a pseudo-terminal pair");
        let path = tokio_serial::SerialPort::name(&slave).expect("the pseudo-terminal's path");
        let (mut peer, released) = Peer::new(0);
        peer.serve(Framing::Rtu, master, released);
        peer.serial = Some((path, Arc::new(slave)));
        peer
    }

    /// The serial line's path, for a peer made by [`Peer::start_serial`].
    pub fn serial_path(&self) -> Option<&str> {
        self.serial.as_ref().map(|(p, _)| p.as_str())
    }

    /// Another handle on the same peer's state.
    fn handle(&self) -> Peer {
        Peer {
            port: self.port,
            script: self.script.clone(),
            repeat: self.repeat.clone(),
            connections: self.connections.clone(),
            requests: self.requests.clone(),
            events: self.events.clone(),
            registers: self.registers.clone(),
            serial: self.serial.clone(),
        }
    }

    /// Serves these registers (address, value) instead of the built-in ones.
    pub fn set_registers(&self, registers: &[(u16, u16)]) {
        *self.registers.lock().unwrap() = registers.iter().copied().collect();
    }

    /// The shape of the next reply; replies after the scripted ones are right.
    pub fn next(&self, shape: Shape) {
        self.script.lock().unwrap().push_back(shape);
    }

    /// Sends the second reply of a `Repeat` and returns once it is written.
    pub async fn repeat(&self) {
        let (written, done) = oneshot::channel();
        self.repeat.send(written).unwrap();
        done.await.unwrap();
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// For each request that came after a reply, how long after it.
    pub fn quiet_before_requests(&self) -> Vec<std::time::Duration> {
        let events = self.events.lock().unwrap();
        events.windows(2).filter(|w| !w[0].0 && w[1].0).map(|w| w[1].1 - w[0].1).collect()
    }

    /// The last request read.
    pub fn last_request(&self) -> Option<Request> {
        self.requests.lock().unwrap().last().copied()
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    framing: Framing,
    mut stream: S,
    script: Arc<Mutex<VecDeque<Shape>>>,
    (requests, events): (Arc<Mutex<Vec<Request>>>, Events),
    released: Released,
    registers: Registers,
) {
    while let Some(req) = read_request(framing, &mut stream).await {
        let reply =
            |framing, req, shape, other| reply(framing, req, shape, other, &registers.lock().unwrap());
        events.lock().unwrap().push((true, std::time::Instant::now()));
        requests.lock().unwrap().push(req);
        let shape = script.lock().unwrap().pop_front().unwrap_or(Shape::Good);
        let ok = match shape {
            Shape::Close => return,
            Shape::Silence => true,
            Shape::Twice => {
                let other = reply(framing, req, Shape::Good, true);
                stream.write_all(&reply(framing, req, Shape::Good, false)).await.is_ok()
                    && stream.write_all(&other).await.is_ok()
            }
            Shape::Repeat => {
                if stream.write_all(&reply(framing, req, Shape::Good, false)).await.is_err() {
                    return;
                }
                let Some(written) = released.lock().await.recv().await else { return };
                let ok = stream.write_all(&reply(framing, req, Shape::Good, true)).await.is_ok();
                let _ = written.send(());
                ok
            }
            shape => stream.write_all(&reply(framing, req, shape, false)).await.is_ok(),
        };
        events.lock().unwrap().push((false, std::time::Instant::now()));
        if !ok {
            return;
        }
    }
}

/// One request frame, or `None` when the connection ends.
async fn read_request<S: AsyncRead + Unpin>(framing: Framing, stream: &mut S) -> Option<Request> {
    match framing {
        Framing::Tcp => {
            let mut head = [0u8; 7];
            stream.read_exact(&mut head).await.ok()?;
            assert_eq!(&head[2..4], &[0, 0], "protocol identifier");
            let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
            assert_eq!(len, 6, "a read request is unit ID and 5 bytes of PDU");
            let mut pdu = [0u8; 5];
            stream.read_exact(&mut pdu).await.ok()?;
            Some(request(u16::from_be_bytes([head[0], head[1]]), head[6], &pdu))
        }
        Framing::Rtu => {
            let mut frame = [0u8; 8];
            stream.read_exact(&mut frame).await.ok()?;
            assert_eq!(crc16(&frame[..6]).to_le_bytes(), [frame[6], frame[7]], "request CRC");
            Some(request(0, frame[0], &frame[1..6]))
        }
    }
}

fn request(tid: u16, unit: u8, pdu: &[u8]) -> Request {
    Request {
        tid,
        unit,
        function: pdu[0],
        start: u16::from_be_bytes([pdu[1], pdu[2]]),
        count: u16::from_be_bytes([pdu[3], pdu[4]]),
    }
}

/// The data bytes of the right reply to `req`: registers big-endian, bits packed from
/// the least significant bit of the first byte. `other` inverts every bit.
fn data(req: Request, other: bool, registers: &HashMap<u16, u16>) -> Vec<u8> {
    let flip = if other { 0xFF } else { 0 };
    match req.function {
        1 | 2 => {
            let mut bytes = vec![0u8; usize::from(req.count).div_ceil(8)];
            for i in 0..req.count {
                if COILS_ON.contains(&(req.start + i)) {
                    bytes[usize::from(i / 8)] |= 1 << (i % 8);
                }
            }
            bytes.iter().map(|b| b ^ flip).collect()
        }
        _ => (req.start..req.start + req.count)
            .flat_map(|a| registers.get(&a).copied().unwrap_or(0).to_be_bytes())
            .map(|b| b ^ flip)
            .collect(),
    }
}

/// The reply frame of `shape` to `req`.
fn reply(
    framing: Framing,
    req: Request,
    shape: Shape,
    other: bool,
    registers: &HashMap<u16, u16>,
) -> Vec<u8> {
    let (mut tid, mut unit, mut function) = (req.tid, req.unit, req.function);
    let mut data = data(req, other, registers);
    // The size of one register, or one byte of bits.
    let item = if req.function <= 2 { 1 } else { 2 };
    let mut byte_count_delta = 0i8;
    let mut length_delta = 0i8;
    match shape {
        Shape::Garbage(bytes) => return bytes.to_vec(),
        Shape::WrongTid => tid = tid.wrapping_add(1),
        Shape::WrongUnit => unit = unit.wrapping_add(1),
        Shape::WrongFunction => function = [0, 2, 1, 4, 3][usize::from(function)],
        Shape::ByteCountField(n) => byte_count_delta = n,
        Shape::MbapLength(n) => length_delta = n,
        Shape::Items(n) if n > 0 => {
            let mut more = vec![0xFF; item * n as usize];
            more.extend_from_slice(&data);
            data = more;
        }
        Shape::Items(n) => data.truncate(data.len() - item * usize::from(n.unsigned_abs())),
        _ => {}
    }
    let pdu = match shape {
        Shape::Exception(code) => vec![function | 0x80, code],
        _ => {
            let mut pdu = vec![function, (data.len() as i16 + i16::from(byte_count_delta)) as u8];
            pdu.extend_from_slice(&data);
            pdu
        }
    };
    let mut frame = match framing {
        Framing::Tcp => {
            let len = (1 + pdu.len() as i16 + i16::from(length_delta)) as u16;
            let mut f = tid.to_be_bytes().to_vec();
            f.extend_from_slice(&[0, 0]);
            f.extend_from_slice(&len.to_be_bytes());
            f.push(unit);
            f.extend_from_slice(&pdu);
            f
        }
        Framing::Rtu => {
            let mut f = vec![unit];
            f.extend_from_slice(&pdu);
            let crc = crc16(&f);
            f.extend_from_slice(&crc.to_le_bytes());
            f
        }
    };
    match shape {
        Shape::Truncated => frame.truncate(frame.len() - 3),
        Shape::BadCrc => *frame.last_mut().unwrap() ^= 0xFF,
        _ => {}
    }
    frame
}

/// CRC-16/MODBUS, written out here so the peer does not share the driver's.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for b in bytes {
        crc ^= u16::from(*b);
        for _ in 0..8 {
            let lsb = crc & 1;
            crc >>= 1;
            if lsb == 1 {
                crc ^= 0xA001;
            }
        }
    }
    crc
}
