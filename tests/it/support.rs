//! Shared helpers: the demo plant, temporary device folders, the tool service.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::{Envelope, ToolService};
use fieldgate_sim::{Bind, Scenario, Simulator};
use serde_json::Value;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn demo_dir() -> PathBuf {
    root().join("devices")
}

pub fn demo_registry() -> Registry {
    Registry::load(&demo_dir()).expect("the demo plant is valid")
}

pub fn service() -> ToolService {
    ToolService::new(Arc::new(demo_registry()), Config::default())
}

/// The demo service over this work-order store (history in memory).
pub fn service_with_orders(orders: Arc<fieldgate::work_orders::WorkOrderStore>) -> ToolService {
    let stores =
        fieldgate::tools::Stores { work_orders: Some(orders), ..fieldgate::tools::Stores::in_memory() };
    ToolService::with_stores(Arc::new(demo_registry()), Config::default(), stores)
}

/// Calls a tool on the demo plant.
pub async fn call(tool: &str, args: Value) -> Envelope {
    service().call(tool, args).await.expect("tool is served")
}

/// A temporary folder holding the given device files.
pub fn device_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

/// Every problem reported for these files, as printed (`file:line: message`), with the
/// temporary folder removed from the file names.
pub fn problems(files: &[(&str, &str)]) -> Vec<String> {
    let dir = device_dir(files);
    problems_in(dir.path())
}

pub fn problems_in(dir: &Path) -> Vec<String> {
    match Registry::load(dir) {
        Ok(_) => Vec::new(),
        Err(e) => {
            let prefix = format!("{}/", dir.display());
            e.0.iter().map(|p| p.to_string().replace(&prefix, "")).collect()
        }
    }
}

/// A valid Modbus TCP device file for plant T, zone ZONE1; tests change one thing in it.
pub const GOOD: &str = r#"id = "t-plc"
plant = "T"
zone = "ZONE1"
description = "Test PLC"
protocol = "modbus-tcp"
endpoint = "127.0.0.1:5020"

[[sensors]]
id = "T_ZONE1_001"
description = "Pressure"
kind = "pressure"
unit = "bar"
table = "holding"
address = 0
type = "f32"
"#;

/// `GOOD` plus one more sensor whose body is `extra`.
pub fn with_sensor(extra: &str) -> String {
    format!(
        "{GOOD}\n[[sensors]]\nid = \"T_ZONE1_002\"\ndescription = \"Second\"\nkind = \"flow\"\nunit = \"m3/h\"\n{extra}\n"
    )
}

/// The simulator and a tool service pointed at it, both on loopback with free ports.
pub struct Plant {
    pub sim: Simulator,
    pub service: ToolService,
}

impl Plant {
    pub async fn call(&self, tool: &str, args: Value) -> Envelope {
        self.service.call(tool, args).await.expect("tool is served")
    }

    pub fn faults(&self, device: &str, f: fieldgate_sim::Faults) {
        self.sim.set_faults(device, f).unwrap();
    }
}

/// Starts the simulator on the device files of `dir` and a service reading from it.
pub async fn plant_from(dir: &Path, scenario: Scenario) -> Plant {
    plant_with(dir, scenario, Config::default()).await
}

/// As [`plant_from`], with a configuration.
pub async fn plant_with(dir: &Path, scenario: Scenario, config: Config) -> Plant {
    let devices = fieldgate_sim::plant::load_dir(dir).unwrap();
    let sim = Simulator::start(devices, scenario, Bind::Ephemeral).await.unwrap();
    let mut registry = Registry::load(dir).unwrap();
    registry.override_endpoints(sim.addrs(), sim.serial_paths());
    registry.override_opcua_endpoints(sim.opcua_urls());
    let service = ToolService::new(Arc::new(registry), config);
    Plant { sim, service }
}

/// The demo plant with the demo scenario's waveforms and no faults.
pub async fn demo_plant() -> Plant {
    let mut scenario = Scenario::load(&root().join("simulator/scenarios/demo.toml")).unwrap();
    scenario.faults.clear();
    plant_from(&demo_dir(), scenario).await
}

/// The demo plant with a configuration.
pub async fn demo_plant_with(config: Config) -> Plant {
    let mut scenario = Scenario::load(&root().join("simulator/scenarios/demo.toml")).unwrap();
    scenario.faults.clear();
    plant_with(&demo_dir(), scenario, config).await
}

/// The HTTP application of `service` served on a free loopback port.
pub struct Server {
    pub addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
}

impl Server {
    pub async fn start(service: ToolService, tokens: fieldgate::transport::auth::Tokens) -> Server {
        use fieldgate::transport::http;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let timeouts = http::Timeouts {
            header: std::time::Duration::from_secs(30),
            grace: std::time::Duration::from_secs(1),
        };
        fieldgate::app::serve_http(listener, &service, Arc::new(tokens), timeouts, &stop, None);
        Server { addr, stop }
    }

    pub async fn client(&self) -> fieldgate::transport::client::HttpClient {
        fieldgate::transport::client::HttpClient::connect(self.addr).await.unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The demo oven with other security settings (and a user named by two variables).
pub fn secured_oven(policy: &str, mode: &str, user: Option<(&str, &str)>) -> String {
    let mut security = format!("security_policy = \"{policy}\"\nsecurity_mode = \"{mode}\"");
    if let Some((u, p)) = user {
        security.push_str(&format!("\nusername_env = \"{u}\"\npassword_env = \"{p}\""));
    }
    std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml"))
        .unwrap()
        .replace("security_policy = \"None\"\nsecurity_mode = \"None\"", &security)
}

/// The simulator alone, serving the device files of `dir` on free ports.
pub async fn sim_for(dir: &Path) -> Simulator {
    Simulator::start(fieldgate_sim::plant::load_dir(dir).unwrap(), Scenario::default(), Bind::Ephemeral)
        .await
        .unwrap()
}

/// Reads a spawned `fieldgate serve`'s stderr until it says where it listens (bounded).
pub async fn listening_addr(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) -> std::net::SocketAddr {
    loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .expect("fieldgate says where it listens within 30 s")
            .expect("stderr readable")
            .expect("fieldgate exited before listening");
        // `fieldgate` or `fieldgate hub`.
        let said =
            line.strip_prefix("fieldgate hub ").or_else(|| line.strip_prefix("fieldgate ")).unwrap_or("");
        let rest = said.strip_prefix("listening on http://");
        if let Some(rest) = rest.or_else(|| said.strip_prefix("listening on https://")) {
            return rest.split_whitespace().next().and_then(|a| a.parse().ok()).expect("an address");
        }
    }
}

/// The formats JSON Schema 2020-12 defines (validation vocabulary, §7.3), written here
/// independently of the code that strips the others.
pub const STANDARD_FORMATS: [&str; 19] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// How often [`wait_for`] looks again. Not a synchronisation: the condition is re-checked,
/// and only the timeout decides failure.
const POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Waits until `check` yields a value and returns it; fails the test with `what` if it has
/// not within `timeout`. Every test that waits for something observed (a stored point, a
/// breaker state, a counter) waits through here, so a broken build fails instead of hanging.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // A check that itself never completes is bounded too.
        match tokio::time::timeout_at(deadline, check()).await {
            Ok(Some(v)) => return v,
            Ok(None) => {}
            Err(_) => panic!(
                "timed out after {timeout:?} waiting for {what} (a check was still running at the deadline)"
            ),
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_for`] a condition.
pub async fn wait_until<F, Fut>(what: &str, timeout: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for(what, timeout, || {
        let f = check();
        async move { f.await.then_some(()) }
    })
    .await
}

/// A loopback port that refuses connections for as long as this value lives: a TCP socket
/// bound to it that never listens. The kernel answers a SYN to a bound, non-listening
/// port with a reset, and the binding keeps anyone else from taking the port meanwhile
/// (unlike binding a listener and closing it, after which another test may get the port).
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        ClosedPort { _socket: socket, port }
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// The demo device files in a temporary folder, each `endpoint` replaced by what
/// `endpoint(device_id, declared)` gives (kept when it gives `None`).
pub fn demo_devices_with(endpoint: impl Fn(&str, &str) -> Option<String>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let mut text = std::fs::read_to_string(&path).unwrap();
        let id =
            text.lines().find_map(|l| l.strip_prefix("id = \"")).unwrap().trim_end_matches('"').to_string();
        let declared = text
            .lines()
            .find_map(|l| l.strip_prefix("endpoint = \""))
            .unwrap()
            .trim_end_matches('"')
            .to_string();
        if let Some(new) = endpoint(&id, &declared) {
            text = text.replace(&format!("endpoint = \"{declared}\""), &format!("endpoint = \"{new}\""));
        }
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    dir
}

/// The demo device files pointed at `sim` (Modbus addresses and OPC UA URLs), for a
/// spawned fieldgate: never the demo's fixed ports, where another test's or another
/// program's server may listen.
pub fn demo_devices_for(sim: &Simulator) -> tempfile::TempDir {
    let urls = sim.opcua_urls();
    demo_devices_with(|id, _| sim.addr(id).map(|a| a.to_string()).or_else(|| urls.get(id).cloned()))
}

/// The demo device files with every endpoint at `closed`, for a spawned fieldgate that
/// needs the demo's sensors but no device: its polls are refused at once.
pub fn demo_devices_unreachable(closed: &ClosedPort) -> tempfile::TempDir {
    demo_devices_with(|_, declared| {
        Some(if declared.starts_with("opc.tcp://") {
            format!("opc.tcp://{}/", closed.addr())
        } else {
            closed.addr().to_string()
        })
    })
}

/// A `fieldgate serve` process on `devices` and `data`, on a free loopback port, with a
/// cleared environment plus `env`; its address once it listens, and its stderr from then on.
pub struct Served {
    pub child: tokio::process::Child,
    pub addr: std::net::SocketAddr,
    pub stderr: Option<tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>>,
}

pub async fn serve_binary(devices: &Path, data: &Path, env: &[(&str, &str)]) -> Served {
    let args = [std::ffi::OsStr::new("serve"), std::ffi::OsStr::new("--devices"), devices.as_os_str()];
    spawn_listening(&args, data, env).await
}

/// `fieldgate <args>` with its data in `data` and `env`, on a free loopback port, once it
/// says where it listens.
async fn spawn_listening(args: &[&std::ffi::OsStr], data: &Path, env: &[(&str, &str)]) -> Served {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(args)
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data)
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("fieldgate starts");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let addr = listening_addr(&mut stderr).await;
    Served { child, addr, stderr: Some(stderr) }
}

/// `fieldgate hub` with its data in `data` and `env`, listening on a free loopback port.
pub async fn hub_binary(data: &Path, env: &[(&str, &str)]) -> Served {
    spawn_listening(&[std::ffi::OsStr::new("hub")], data, env).await
}

/// A tool called over `addr`'s HTTP API (no token: loopback), within 10 s.
/// `POST path` with `token` and a JSON `body`: the status and the envelope.
pub async fn post_as(addr: std::net::SocketAddr, path: &str, token: &str, body: Value) -> (u16, Value) {
    fieldgate::tls::install_crypto_provider();
    let res = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(std::time::Duration::from_secs(20))
        .send()
        .await
        .expect("the service answers");
    let status = res.status().as_u16();
    (status, serde_json::from_slice(&res.bytes().await.expect("a body")).expect("an envelope"))
}

pub async fn tool_over_http(addr: std::net::SocketAddr, tool: &str, args: Value) -> Value {
    fieldgate::tls::install_crypto_provider();
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/v1/tools/{tool}"))
        .header("content-type", "application/json")
        .body(args.to_string())
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .expect("the service answers");
    let body = res.bytes().await.expect("a body");
    serde_json::from_slice(&body).expect("an envelope")
}

impl Served {
    /// Reads the rest of stderr in the background (so the process never blocks on it);
    /// the text once the process has exited.
    pub fn drain_stderr(&mut self) -> tokio::task::JoinHandle<String> {
        let lines = self.stderr.take();
        tokio::spawn(async move {
            let mut all = String::new();
            if let Some(mut lines) = lines {
                while let Ok(Some(l)) = lines.next_line().await {
                    all.push_str(&l);
                    all.push('\n');
                }
            }
            all
        })
    }
}

/// A real small filesystem (`size`, e.g. "2m": a tmpfs) mounted on a temporary folder,
/// unmounted when the guard drops. Needs `mount` (root). When it cannot be made the test
/// is skipped with the reason printed, except in CI (`CI` set, as `.ci/run` does), where
/// that fails the test: a full-disk test never passes there without a full disk.
pub fn small_fs(size: &str) -> Option<(tempfile::TempDir, Unmount)> {
    let dir = tempfile::tempdir().unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir.path())
        .output();
    match &mounted {
        Ok(o) if o.status.success() => {
            let unmount = Unmount(dir.path().to_path_buf());
            Some((dir, unmount))
        }
        other => {
            let why = format!("cannot mount a {size} tmpfs here ({other:?})");
            assert!(std::env::var_os("CI").is_none(), "CI needs a real small filesystem: {why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}

pub struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the filesystem of `dir` with a file named `filler`.
pub fn fill(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![0xA5u8; 64 * 1024];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    filler
}

/// Log lines written while a test's subscriber is the default (`logs().0` is the guard).
#[derive(Clone, Default)]
pub struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Lines;
    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}

impl Lines {
    /// Captures this thread's logs (INFO and up) until the guard drops: a current-thread
    /// runtime's tasks log here.
    pub fn capture() -> (Lines, tracing::subscriber::DefaultGuard) {
        Lines::capture_at(tracing::Level::INFO)
    }

    /// The same at `level` and up.
    pub fn capture_at(level: tracing::Level) -> (Lines, tracing::subscriber::DefaultGuard) {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_max_level(level)
            .with_ansi(false)
            .finish();
        (lines.clone(), tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Where the log is now, for [`Lines::count_since`].
    pub fn mark(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Lines saying `what` about `about` (any line: ""), logged since `mark`.
    pub fn count_since(&self, mark: usize, about: &str, what: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()[mark..]).into_owned();
        text.lines().filter(|l| l.contains(about) && l.contains(what)).count()
    }
}

/// Whether committed generated files (schemas/, openapi.json, the route list) are to be
/// rewritten (`UPDATE_SCHEMA=1`); never in CI, where they are only compared.
pub fn updating() -> bool {
    let asked = std::env::var_os("UPDATE_SCHEMA").is_some();
    assert!(!(asked && std::env::var_os("CI").is_some()), "UPDATE_SCHEMA is refused in CI: commit the files");
    asked
}

/// How long a test waits for a child process to finish (it fails, naming the command).
pub const CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// `output()` bounded by [`CHILD_LIMIT`]: a command that hangs is killed and fails the
/// test with its name, instead of hanging CI.
pub trait OutputWithin {
    fn output_within(&mut self) -> std::io::Result<std::process::Output>;
}

impl OutputWithin for std::process::Command {
    fn output_within(&mut self) -> std::io::Result<std::process::Output> {
        use std::process::Stdio;
        let what = format!("{:?} {:?}", self.get_program(), self.get_args().collect::<Vec<_>>());
        let child = self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(CHILD_LIMIT) {
            Ok(out) => out,
            Err(_) => {
                let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                panic!("{what} did not finish within {CHILD_LIMIT:?}");
            }
        }
    }
}

/// The same for tokio's commands and children.
pub trait ChildWithin {
    fn output_within(&mut self) -> impl Future<Output = std::io::Result<std::process::Output>>;
}

impl ChildWithin for tokio::process::Command {
    async fn output_within(&mut self) -> std::io::Result<std::process::Output> {
        let what =
            format!("{:?} {:?}", self.as_std().get_program(), self.as_std().get_args().collect::<Vec<_>>());
        self.kill_on_drop(true);
        match tokio::time::timeout(CHILD_LIMIT, self.output()).await {
            Ok(out) => out,
            Err(_) => panic!("{what} did not finish within {CHILD_LIMIT:?}"),
        }
    }
}

/// Waits (bounded by [`CHILD_LIMIT`]) for `child` to exit; fails the test naming `what`.
pub async fn exited(child: &mut tokio::process::Child, what: &str) -> std::process::ExitStatus {
    match tokio::time::timeout(CHILD_LIMIT, child.wait()).await {
        Ok(status) => status.unwrap_or_else(|e| panic!("{what}: cannot wait for it: {e}")),
        Err(_) => panic!("{what} did not exit within {CHILD_LIMIT:?}"),
    }
}
