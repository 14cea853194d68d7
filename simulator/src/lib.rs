//! fieldgate-sim: serves the devices of `devices/*.toml` over real Modbus TCP and
//! RTU-over-TCP, with waveforms from a scenario and fault injection that can be changed
//! while it runs (from code, or over the HTTP control API).
//!
//! Tests start it on port 0 ([`Bind::Ephemeral`]), learn each device's address with
//! [`Simulator::addr`], and compare what the service reads with [`Simulator::expected`].

pub mod control;
pub mod encode;
pub mod faults;
pub mod opcua;
pub mod plant;
mod server;
pub mod wave;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_modbus::prelude::ExceptionCode;

pub use faults::Faults;
pub use plant::Device;
pub use server::{Framing, Stats};
pub use wave::{Scenario, SimValue, Wave};

use plant::{Protocol, Table};
use server::Endpoint;

/// Where the simulated devices listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// On the endpoints the device files declare.
    Declared,
    /// On 127.0.0.1, each endpoint on a free port chosen by the OS.
    Ephemeral,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot listen on {addr} for {device}: {source}")]
    Bind { device: String, addr: String, source: std::io::Error },
    #[error("device {0}: endpoint is not host:port")]
    Endpoint(String),
    #[error("no simulated device {0}")]
    UnknownDevice(String),
    #[error("invalid faults: {0}")]
    Faults(String),
    #[error("OPC UA server: {0}")]
    OpcUa(String),
}

/// The port of an `opc.tcp://host:port/path` URL.
fn declared_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("opc.tcp://")?;
    let authority = rest.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

/// Simulation time: seconds since start, or a frozen instant.
pub struct Clock {
    start: Instant,
    frozen: Mutex<Option<f64>>,
}

impl Clock {
    pub fn now(&self) -> f64 {
        match *self.frozen.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(t) => t,
            None => self.start.elapsed().as_secs_f64(),
        }
    }
}

/// The points of one table of a device in address order, and where the table ends.
#[derive(Default)]
struct TableMap {
    /// One past the highest register (or bit) a point occupies: 0 for a table with none.
    size: u32,
    /// The widest point: the points a read reaches start at most this far before it.
    widest: u32,
    /// (first address, width, index in the device's sensors), by first address.
    points: Vec<(u32, u32, usize)>,
}

impl TableMap {
    /// The four tables of a device, indexed by `Table as usize`.
    fn of(device: &Device) -> [TableMap; 4] {
        let mut maps: [TableMap; 4] = Default::default();
        for (i, p) in device.sensors.iter().enumerate() {
            let (Some(table), Some(a)) = (p.table, p.address) else { continue };
            let (a, w) = (u32::from(a), u32::from(p.width()));
            let m = &mut maps[table as usize];
            m.size = m.size.max(a + w);
            m.widest = m.widest.max(w);
            m.points.push((a, w, i));
        }
        for m in &mut maps {
            m.points.sort_unstable();
        }
        maps
    }

    /// The points that overlap `start..end`, in address order.
    fn within(&self, start: u32, end: u32) -> impl Iterator<Item = (u32, usize)> + '_ {
        let from = self.points.partition_point(|(a, _, _)| *a + self.widest <= start);
        self.points[from..]
            .iter()
            .take_while(move |(a, _, _)| *a < end)
            .filter(move |(a, w, _)| a + w > start)
            .map(|(a, _, i)| (*a, *i))
    }
}

/// The signals, by sensor ID and resolved per point.
struct Waves {
    /// As the scenario and `set_wave` name them.
    named: foldhash::HashMap<String, Wave>,
    /// Each device's points' signals, in the order of its sensors: a read looks up no names.
    of_device: BTreeMap<String, Vec<Wave>>,
}

impl Waves {
    fn new(named: foldhash::HashMap<String, Wave>, devices: &BTreeMap<String, Device>) -> Waves {
        let mut waves = Waves { named, of_device: BTreeMap::new() };
        for (id, d) in devices {
            let resolved = d.sensors.iter().map(|p| waves.of(p)).collect();
            waves.of_device.insert(id.clone(), resolved);
        }
        waves
    }

    /// The signal of a sensor: its scenario wave, or the default for its point.
    fn of(&self, p: &plant::Point) -> Wave {
        self.named.get(&p.id).cloned().unwrap_or_else(|| default_wave(p))
    }

    fn set(&mut self, devices: &BTreeMap<String, Device>, sensor: &str, wave: Wave) {
        // OPC UA nodes look their signal up by name; Modbus points by position.
        self.named.insert(sensor.to_string(), wave.clone());
        for (id, d) in devices {
            let Some(resolved) = self.of_device.get_mut(id) else { continue };
            for (w, p) in resolved.iter_mut().zip(&d.sensors) {
                if p.id == sensor {
                    *w = wave.clone();
                }
            }
        }
        self.named.insert(sensor.to_string(), wave);
    }
}

/// Everything the servers share.
pub struct State {
    devices: BTreeMap<String, Device>,
    /// Each device's tables, built once from `devices`.
    tables: BTreeMap<String, [TableMap; 4]>,
    waves: RwLock<Waves>,
    faults: RwLock<BTreeMap<String, Faults>>,
    seed: u64,
    draws: AtomicU64,
    pub clock: Clock,
    changes: watch::Sender<u64>,
    shut: AtomicBool,
    /// Reads answered by the OPC UA devices (for tests).
    pub opcua_reads: AtomicU64,
}

impl State {
    fn unit_of(&self, device: &str) -> Option<u8> {
        self.devices.get(device).map(Device::unit)
    }

    pub fn faults(&self, device: &str) -> Faults {
        self.faults.read().unwrap_or_else(|e| e.into_inner()).get(device).cloned().unwrap_or_default()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn is_shut_down(&self) -> bool {
        self.shut.load(Ordering::Acquire)
    }

    fn notify(&self) {
        self.changes.send_modify(|g| *g += 1);
    }

    /// A reproducible draw in `0..n`.
    pub(crate) fn uniform(&self, device: &str, n: u64) -> u64 {
        let k = self.draws.fetch_add(1, Ordering::Relaxed);
        let h = device.bytes().fold(self.seed, |h, b| wave::splitmix(h ^ u64::from(b)));
        wave::splitmix(h ^ k) % n.max(1)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&self, device: &str, p: f64) -> bool {
        p >= 1.0 || (p > 0.0 && (self.uniform(device, 1 << 24) as f64) < p * f64::from(1u32 << 24))
    }

    /// The signal of a sensor: its scenario wave, or a constant in the middle of its range.
    pub(crate) fn wave_of(&self, p: &plant::Point) -> Wave {
        self.waves.read().unwrap_or_else(|e| e.into_inner()).of(p)
    }

    /// The registers (or bits) `addr..addr+qty` of a table of a device at time `t`.
    #[allow(clippy::type_complexity)]
    fn read(
        &self,
        device: &str,
        table: Table,
        addr: u16,
        qty: u16,
        bits: bool,
        t: f64,
    ) -> Result<(Vec<u16>, Vec<bool>), ExceptionCode> {
        let max = if bits { 2000 } else { 125 };
        if qty == 0 || qty > max {
            return Err(ExceptionCode::IllegalDataValue);
        }
        if u32::from(addr) + u32::from(qty) > 65536 {
            return Err(ExceptionCode::IllegalDataAddress);
        }
        let (Some(dev), Some(tables)) = (self.devices.get(device), self.tables.get(device)) else {
            return Err(ExceptionCode::GatewayTargetDevice);
        };
        let map = &tables[table as usize];
        let (start, end) = (u32::from(addr), u32::from(addr) + u32::from(qty));
        // Like a PLC's configured data area: a table ends after its highest declared point
        // (a table with none is empty); reads past the end are refused.
        if end > map.size {
            return Err(ExceptionCode::IllegalDataAddress);
        }
        let mut words = vec![0u16; if bits { 0 } else { qty as usize }];
        let mut flags = vec![false; if bits { qty as usize } else { 0 }];
        let waves = self.waves.read().unwrap_or_else(|e| e.into_inner());
        let Some(signals) = waves.of_device.get(device) else {
            return Err(ExceptionCode::GatewayTargetDevice);
        };
        for (a, i) in map.within(start, end) {
            let (Some(p), Some(wave)) = (dev.sensors.get(i), signals.get(i)) else { continue };
            let value = wave.at(t);
            // A bit or a bit of a register is at its point's first address; a point declared
            // wider that starts before the read is left out rather than misplaced.
            let at = a.checked_sub(start).map(|k| k as usize);
            if bits {
                if let (SimValue::Bool(b), Some(f)) =
                    (encode::expected(p, &value), at.and_then(|k| flags.get_mut(k)))
                {
                    *f = b;
                }
            } else if let Some(bit) = p.bit {
                let on = matches!(encode::expected(p, &value), SimValue::Bool(true));
                // A bit beyond 15 (the lenient plant reader lets it through) sets nothing.
                let mask = 1u16.checked_shl(u32::from(bit)).unwrap_or(0);
                if let Some(w) = at.and_then(|k| words.get_mut(k)) {
                    *w = if on { *w | mask } else { *w & !mask };
                }
            } else {
                let order = dev.order_of(p);
                let (number, string);
                let regs = match p.kind {
                    Some(plant::Kind::String) => {
                        string = encode::encode(p, order, &value);
                        &string[..]
                    }
                    _ => {
                        number = encode::encode_number(p, order, &value);
                        &number.0[..number.1]
                    }
                };
                for (k, r) in regs.iter().enumerate() {
                    let at = a + k as u32;
                    if (start..end).contains(&at) {
                        words[(at - start) as usize] = *r;
                    }
                }
            }
        }
        Ok((words, flags))
    }
}

/// The signal of a sensor the scenario leaves out: a constant in the middle of its range.
fn default_wave(p: &plant::Point) -> Wave {
    match (p.kind, &p.range) {
        (Some(plant::Kind::String), _) => Wave::Text { text: "SIM".into() },
        (_, Some(r)) => Wave::Constant { value: (r.min + r.max) / 2.0 },
        _ => Wave::Constant { value: 0.0 },
    }
}

/// A running simulator.
pub struct Simulator {
    state: Arc<State>,
    endpoints: Vec<Arc<Endpoint>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    opcua: Vec<opcua::OpcUaDevice>,
    /// How each OPC UA device's server is set up (kept for restarts).
    ua_setups: BTreeMap<String, opcua::Setup>,
    /// The OPC UA servers' PKI folders when the scenario names none.
    _pki_temp: Option<tempfile::TempDir>,
}

impl Simulator {
    /// Starts a server for every Modbus endpoint of `devices`: TCP and RTU-over-TCP on
    /// sockets, serial RTU on a pseudo-terminal. Devices behind the same endpoint share one
    /// server, told apart by unit ID. OPC UA devices get one server each (see [`opcua`]).
    pub async fn start(
        devices: BTreeMap<String, Device>,
        mut scenario: Scenario,
        bind: Bind,
    ) -> Result<Simulator, SimError> {
        for f in scenario.faults.values() {
            f.validate().map_err(SimError::Faults)?;
        }
        let ua_users = std::mem::take(&mut scenario.opcua_users);
        let pki_dir = scenario.opcua_pki_dir.take();
        let (changes, _) = watch::channel(0);
        let state = Arc::new(State {
            tables: devices.iter().map(|(id, d)| (id.clone(), TableMap::of(d))).collect(),
            waves: RwLock::new(Waves::new(scenario.sensors.into_iter().collect(), &devices)),
            faults: RwLock::new(scenario.faults),
            seed: scenario.seed,
            draws: AtomicU64::new(0),
            clock: Clock { start: Instant::now(), frozen: Mutex::new(None) },
            changes,
            shut: AtomicBool::new(false),
            opcua_reads: AtomicU64::new(0),
            devices,
        });
        let mut groups: BTreeMap<(String, Framing), Vec<String>> = BTreeMap::new();
        for d in state.devices.values() {
            let framing = match d.protocol {
                Protocol::ModbusTcp => Framing::Tcp,
                Protocol::ModbusRtuOverTcp => Framing::RtuOverTcp,
                Protocol::ModbusRtu => Framing::RtuSerial,
                Protocol::Opcua => continue,
            };
            groups.entry((d.endpoint.clone(), framing)).or_default().push(d.id.clone());
        }
        let mut endpoints = Vec::new();
        let mut tasks = Vec::new();
        for ((declared, framing), ids) in groups {
            if framing == Framing::RtuSerial {
                // Serial devices get a pseudo-terminal; masters open the path it reports.
                let err = |source| SimError::Bind { device: ids.join(", "), addr: declared.clone(), source };
                let (master, slave) = tokio_serial::SerialStream::pair().map_err(|e| err(e.into()))?;
                let path = tokio_serial::SerialPort::name(&slave);
                let ep = Arc::new(Endpoint {
                    addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                    serial_path: path,
                    framing,
                    devices: ids,
                    counters: Default::default(),
                });
                tasks.push(tokio::spawn(server::run_serial(state.clone(), ep.clone(), master, slave)));
                endpoints.push(ep);
                continue;
            }
            let target = match bind {
                Bind::Declared => declared.clone(),
                Bind::Ephemeral => "127.0.0.1:0".to_string(),
            };
            let listener = TcpListener::bind(&target).await.map_err(|source| SimError::Bind {
                device: ids.join(", "),
                addr: target.clone(),
                source,
            })?;
            let addr = listener.local_addr().map_err(|source| SimError::Bind {
                device: ids.join(", "),
                addr: target,
                source,
            })?;
            let ep = Arc::new(Endpoint {
                addr,
                serial_path: None,
                framing,
                devices: ids,
                counters: Default::default(),
            });
            tasks.push(tokio::spawn(server::run(state.clone(), ep.clone(), listener)));
            endpoints.push(ep);
        }
        let mut ua = Vec::new();
        let mut ua_setups = BTreeMap::new();
        let mut pki_temp = None;
        for d in state.devices.values().filter(|d| d.protocol == Protocol::Opcua) {
            let root = match (&pki_dir, &pki_temp) {
                (Some(dir), _) => dir.clone(),
                (None, Some(t)) => tempfile::TempDir::path(t).to_path_buf(),
                (None, None) => {
                    let t = tempfile::Builder::new().prefix("fieldgate-sim-pki").tempdir().map_err(|e| {
                        SimError::OpcUa(format!("cannot create a folder for certificates: {e}"))
                    })?;
                    let p = t.path().to_path_buf();
                    pki_temp = Some(t);
                    p
                }
            };
            let setup =
                opcua::Setup { pki_dir: root.join(&d.id), user: opcua::user_of(d, ua_users.get(&d.id))? };
            let port = match bind {
                Bind::Declared => {
                    declared_port(&d.endpoint).ok_or_else(|| SimError::Endpoint(d.id.clone()))?
                }
                Bind::Ephemeral => 0,
            };
            ua.push(opcua::start(state.clone(), d, port, &setup).await?);
            ua_setups.insert(d.id.clone(), setup);
        }
        Ok(Simulator { state, endpoints, tasks, opcua: ua, ua_setups, _pki_temp: pki_temp })
    }

    fn endpoint(&self, device: &str) -> Option<&Arc<Endpoint>> {
        self.endpoints.iter().find(|e| e.devices.iter().any(|d| d == device))
    }

    /// The TCP address a device is served on.
    pub fn addr(&self, device: &str) -> Option<SocketAddr> {
        self.endpoint(device).filter(|e| e.serial_path.is_none()).map(|e| e.addr)
    }

    /// The serial line (pseudo-terminal path) a serial RTU device is served on.
    pub fn serial_path(&self, device: &str) -> Option<String> {
        self.endpoint(device).and_then(|e| e.serial_path.clone())
    }

    /// Devices served over TCP and their addresses.
    pub fn addrs(&self) -> BTreeMap<String, SocketAddr> {
        self.endpoints
            .iter()
            .filter(|e| e.serial_path.is_none())
            .flat_map(|e| e.devices.iter().map(move |d| (d.clone(), e.addr)))
            .collect()
    }

    /// Serial RTU devices and the pseudo-terminal paths they are served on.
    pub fn serial_paths(&self) -> BTreeMap<String, String> {
        self.endpoints
            .iter()
            .filter_map(|e| e.serial_path.as_ref().map(|p| (e, p)))
            .flat_map(|(e, p)| e.devices.iter().map(move |d| (d.clone(), p.clone())))
            .collect()
    }

    /// Devices of the plant that this simulator does not serve.
    pub fn skipped(&self) -> Vec<String> {
        self.state
            .devices
            .keys()
            .filter(|d| self.endpoint(d).is_none() && !self.opcua.iter().any(|o| o.device == **d))
            .cloned()
            .collect()
    }

    /// OPC UA devices and their endpoint URLs.
    pub fn opcua_urls(&self) -> BTreeMap<String, String> {
        self.opcua.iter().map(|o| (o.device.clone(), o.url.clone())).collect()
    }

    /// Stops an OPC UA device's server and starts a fresh one on the same port, as a
    /// device reboot does: every session and subscription on it is gone.
    pub async fn restart_opcua(&mut self, device: &str) -> Result<(), SimError> {
        let unknown = || SimError::OpcUa(format!("no OPC UA device {device}"));
        let i = self.opcua.iter().position(|o| o.device == device).ok_or_else(unknown)?;
        let old = self.opcua.remove(i);
        let port = old.port;
        old.stop().await;
        let d = self.state.devices.get(device).ok_or_else(unknown)?;
        let setup = self.ua_setups.get(device).ok_or_else(unknown)?;
        let fresh = opcua::start(self.state.clone(), d, port, setup).await?;
        self.opcua.insert(i, fresh);
        Ok(())
    }

    /// The certificate (DER file) of a secured OPC UA device's server: what a client
    /// must trust.
    pub fn opcua_certificate(&self, device: &str) -> Option<std::path::PathBuf> {
        self.opcua.iter().find(|o| o.device == device).and_then(|o| o.certificate.clone())
    }

    /// Reads answered by the OPC UA devices so far.
    pub fn opcua_reads(&self) -> u64 {
        self.state.opcua_reads.load(Ordering::Relaxed)
    }

    pub fn devices(&self) -> &BTreeMap<String, Device> {
        &self.state.devices
    }

    pub fn faults(&self, device: &str) -> Option<Faults> {
        self.state.devices.contains_key(device).then(|| self.state.faults(device))
    }

    /// Replaces a device's faults; takes effect for the next request or connection.
    pub fn set_faults(&self, device: &str, faults: Faults) -> Result<(), SimError> {
        if !self.state.devices.contains_key(device) {
            return Err(SimError::UnknownDevice(device.to_string()));
        }
        faults.validate().map_err(SimError::Faults)?;
        self.state.faults.write().unwrap_or_else(|e| e.into_inner()).insert(device.to_string(), faults);
        self.state.notify();
        Ok(())
    }

    /// Changes the fault fields `patch` names (a JSON object) and keeps the others; `null`
    /// sets a field back to healthy. Returns the device's faults after the change.
    pub fn update_faults(&self, device: &str, patch: &serde_json::Value) -> Result<Faults, SimError> {
        let current = self.faults(device).ok_or_else(|| SimError::UnknownDevice(device.to_string()))?;
        let next = faults::merged(&current, patch).map_err(SimError::Faults)?;
        self.set_faults(device, next.clone())?;
        Ok(next)
    }

    pub fn stats(&self, device: &str) -> Option<Stats> {
        self.endpoint(device).map(|e| e.counters.snapshot())
    }

    /// Pins simulation time (`Some(seconds)`) so values stop changing, or lets it run.
    pub fn freeze(&self, at: Option<f64>) {
        *self.state.clock.frozen.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    pub fn now(&self) -> f64 {
        self.state.clock.now()
    }

    pub fn set_wave(&self, sensor: &str, wave: Wave) {
        let mut waves = self.state.waves.write().unwrap_or_else(|e| e.into_inner());
        waves.set(&self.state.devices, sensor, wave);
    }

    /// What a correct master reads for `sensor` at time `t` (after scaling).
    pub fn expected_at(&self, sensor: &str, t: f64) -> Option<SimValue> {
        let p = self.state.devices.values().flat_map(|d| d.sensors.iter()).find(|p| p.id == sensor)?;
        Some(encode::expected(p, &self.state.wave_of(p).at(t)))
    }

    /// What a correct master reads for `sensor` now.
    pub fn expected(&self, sensor: &str) -> Option<SimValue> {
        self.expected_at(sensor, self.now())
    }

    /// Stops every server.
    pub async fn shutdown(self) {
        self.state.shut.store(true, Ordering::Release);
        self.state.notify();
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        for o in self.opcua {
            o.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_reaches_the_points_it_overlaps() {
        let device: Device = toml::from_str(
            r#"
            id = "t"
            protocol = "modbus-tcp"
            endpoint = "127.0.0.1:1502"
            [[sensors]]
            id = "T_Z_003"
            table = "holding"
            address = 10
            [[sensors]]
            id = "T_Z_001"
            table = "holding"
            address = 0
            type = "f32"
            [[sensors]]
            id = "T_Z_002"
            table = "holding"
            address = 2
            type = "string"
            length = 4
            [[sensors]]
            id = "T_Z_004"
            table = "input"
            address = 7
            "#,
        )
        .unwrap();
        let maps = TableMap::of(&device);
        let holding = &maps[Table::Holding as usize];
        assert_eq!((holding.size, holding.widest), (11, 4));
        let within = |start, end| holding.within(start, end).collect::<Vec<_>>();
        // (first address, index in the file)
        assert_eq!(within(0, 11), [(0, 1), (2, 2), (10, 0)]);
        assert_eq!(within(1, 2), [(0, 1)]);
        assert_eq!(within(5, 6), [(2, 2)]);
        assert_eq!(within(6, 10), []);
        assert_eq!(within(3, 11), [(2, 2), (10, 0)]);
        assert_eq!(maps[Table::Input as usize].size, 8);
        assert_eq!(maps[Table::Coil as usize].size, 0);
    }
}
