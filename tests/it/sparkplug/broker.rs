//! A real Mosquitto per test, on a free port with its own configuration file, and a test
//! host application: a rumqttc subscriber that decodes what arrives.

use std::path::PathBuf;
use std::time::Duration;

use fieldgate::spb::payload::Payload;
use rumqttc::{AsyncClient, Event, Incoming, MqttOptions, QoS};
use tokio::sync::mpsc;

use crate::support::wait_for;

fn mosquitto() -> PathBuf {
    ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("Mosquitto is installed (apt-get install mosquitto; scripts/test-deps does)")
}

/// A Mosquitto broker on loopback.
pub struct Broker {
    pub port: u16,
    /// A second listener over TLS that asks for a client certificate, when started so.
    pub tls: Option<TlsListener>,
    /// A third listener that takes only the user names and passwords of its password file.
    pub auth: Option<AuthListener>,
    dir: tempfile::TempDir,
    child: Option<tokio::process::Child>,
}

/// A listener with `allow_anonymous false` and a password file (`mosquitto_passwd`).
pub struct AuthListener {
    pub port: u16,
    passwords: PathBuf,
    /// Mosquitto's ACL file for the listener, when `set_acl` wrote one.
    acl: Option<PathBuf>,
}

/// The TLS listener's port and its files: the CA that signed the broker's certificate (and
/// the client certificate it accepts), and a client certificate and key signed by it.
pub struct TlsListener {
    pub port: u16,
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, written to `dir`.
fn tls_files(dir: &std::path::Path) -> TlsListener {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "Plant broker CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let leaf = |names: Vec<String>, cn: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        (p.signed_by(&key, &ca).unwrap().pem(), key.serialize_pem())
    };
    let (server, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()], "broker");
    let (client, client_key) = leaf(Vec::new(), "edge-gw");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    TlsListener {
        port: 0,
        ca: write("ca.pem", &ca.pem()),
        server_cert: write("server.pem", &server),
        server_key: write("server.key", &server_key),
        client_cert: write("client.pem", &client),
        client_key: write("client.key", &client_key),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Broker {
    /// Picks a free port (Mosquitto cannot report an ephemeral one) and starts on it,
    /// trying another port when the bind fails.
    pub async fn start() -> Broker {
        Broker::start_with(false).await
    }

    /// A broker with a second listener over TLS that requires a client certificate.
    pub async fn start_tls() -> Broker {
        Broker::start_with(true).await
    }

    /// A broker with a second listener that takes only `user` with `password`.
    pub async fn start_auth(user: &str, password: &str) -> Broker {
        let mut b = Broker { port: 0, tls: None, auth: None, dir: tempfile::tempdir().unwrap(), child: None };
        let passwords = b.dir.path().join("passwords");
        b.auth = Some(AuthListener { port: 0, passwords, acl: None });
        b.set_password(user, password);
        b.start_on_free_ports().await;
        b
    }

    /// Makes `user`'s password `password` from the next (re)start on.
    pub fn set_password(&self, user: &str, password: &str) {
        let Some(a) = &self.auth else { panic!("a broker started with start_auth") };
        let _ = std::fs::remove_file(&a.passwords);
        let status = std::process::Command::new("mosquitto_passwd")
            .args(["-c", "-b"])
            .arg(&a.passwords)
            .args([user, password])
            .status()
            .expect("mosquitto_passwd runs");
        assert!(status.success(), "mosquitto_passwd");
    }

    /// Makes the auth listener's ACL `text` (Mosquitto's `acl_file` format) from the next
    /// (re)start on.
    pub fn set_acl(&mut self, text: &str) {
        let path = self.dir.path().join("acl");
        std::fs::write(&path, text).unwrap();
        let Some(a) = &mut self.auth else { panic!("a broker started with start_auth") };
        a.acl = Some(path);
    }

    /// New TLS files (a new CA, its server and client certificates) in the same places,
    /// taken by the broker at its next (re)start.
    pub fn rotate_tls(&mut self) {
        let port = self.tls.as_ref().map(|t| t.port).expect("a broker started with start_tls");
        let mut files = tls_files(self.dir.path());
        files.port = port;
        self.tls = Some(files);
    }

    async fn start_with(tls: bool) -> Broker {
        let mut b = Broker { port: 0, tls: None, auth: None, dir: tempfile::tempdir().unwrap(), child: None };
        if tls {
            b.tls = Some(tls_files(b.dir.path()));
        }
        b.start_on_free_ports().await;
        b
    }

    async fn start_on_free_ports(&mut self) {
        let b = self;
        for _ in 0..10 {
            b.port = free_port();
            if let Some(t) = &mut b.tls {
                t.port = free_port();
            }
            if let Some(a) = &mut b.auth {
                a.port = free_port();
            }
            if b.run().await {
                return;
            }
        }
        panic!("Mosquitto did not start on any of 10 free ports");
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Starts the process on `self.port`; false when it exited (the port was taken).
    async fn run(&mut self) -> bool {
        let conf = self.dir.path().join("mosquitto.conf");
        // Its log (every CONNECT with its flags and will, every PUBLISH, SUBSCRIBE and
        // DISCONNECT) goes to a file: the conformance test reads the packets from it.
        let mut text = format!(
            "listener {} 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\nlog_type all\n",
            self.port
        );
        if let Some(a) = &self.auth {
            text = format!(
                "per_listener_settings true\n{text}listener {} 127.0.0.1\nallow_anonymous false\npassword_file {}\n",
                a.port,
                a.passwords.display()
            );
            if let Some(acl) = &a.acl {
                text += &format!("acl_file {}\n", acl.display());
            }
        }
        if let Some(t) = &self.tls {
            text += &format!(
                "listener {} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n",
                t.port,
                t.ca.display(),
                t.server_cert.display(),
                t.server_key.display()
            );
        }
        std::fs::write(&conf, text).unwrap();
        let mut child = tokio::process::Command::new(mosquitto())
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(self.log_file())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            let tls_port = self.tls.as_ref().map_or(self.port, |t| t.port);
            let auth_port = self.auth.as_ref().map_or(self.port, |a| a.port);
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok()
                && tokio::net::TcpStream::connect(("127.0.0.1", tls_port)).await.is_ok()
                && tokio::net::TcpStream::connect(("127.0.0.1", auth_port)).await.is_ok()
            {
                self.child = Some(child);
                return true;
            }
            assert!(tokio::time::Instant::now() < deadline, "Mosquitto did not listen within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the broker (every client sees its connection close).
    fn log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("mosquitto.log"))
            .expect("the broker's log file opens")
    }

    /// What the broker logged so far (`log_type all`), across restarts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
            let _ = crate::support::exited(&mut c, "c").await;
        }
    }

    /// Starts it again on the same port.
    pub async fn restart(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.run().await {
            assert!(tokio::time::Instant::now() < deadline, "Mosquitto did not restart on its port");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One message the test host received.
#[derive(Debug, Clone)]
pub struct Msg {
    pub topic: String,
    pub payload: Payload,
    /// The QoS it arrived with (the host subscribes with 1, so it is the publisher's).
    pub qos: u8,
    /// The bytes as they arrived (STATE is JSON).
    pub raw: Vec<u8>,
}

impl Msg {
    pub fn kind(&self) -> &str {
        self.topic.split('/').nth(2).unwrap_or("")
    }

    pub fn device(&self) -> Option<&str> {
        self.topic.split('/').nth(4)
    }
}

/// The test host application: subscribed to `spBv1.0/#` (again after each reconnect).
pub struct Host {
    pub client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Msg>,
    pub seen: Vec<Msg>,
    task: tokio::task::JoinHandle<()>,
}

impl Host {
    pub async fn connect(port: u16) -> Host {
        Host::connect_as(port, None).await
    }

    /// A primary host application `id`: its STATE will says offline, and after each
    /// (re)subscription it says online (Sparkplug 3.0 STATE, retained).
    pub async fn connect_as(port: u16, id: Option<&str>) -> Host {
        let mut o = MqttOptions::new(format!("test-host-{port}-{}", std::process::id()), "127.0.0.1", port);
        o.set_max_packet_size(64 << 20, 1 << 20);
        o.set_keep_alive(Duration::from_secs(5));
        let state_topic = id.map(|id| format!("spBv1.0/STATE/{id}"));
        if let Some(t) = &state_topic {
            o.set_last_will(rumqttc::LastWill::new(t, state(false), QoS::AtLeastOnce, true));
        }
        let (client, mut events) = AsyncClient::new(o, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready) = mpsc::unbounded_channel();
        let c = client.clone();
        let mut tahu = super::tahu::Tahu::start();
        let task = tokio::spawn(async move {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Incoming::ConnAck(_))) => {
                        let _ = c.try_subscribe("spBv1.0/#", QoS::AtLeastOnce);
                    }
                    Ok(Event::Incoming(Incoming::SubAck(_))) => {
                        if let Some(t) = &state_topic {
                            let _ = c.try_publish(t, QoS::AtLeastOnce, true, state(true));
                        }
                        let _ = ready_tx.send(());
                    }
                    Ok(Event::Incoming(Incoming::Publish(p))) => {
                        let topic = p.topic.clone();
                        // What the edge node publishes is read by Tahu, and must decode (a
                        // payload that does not fails the test, named); STATE is JSON, and
                        // commands are the tests' own (some deliberately not Sparkplug).
                        let kind = topic.split('/').nth(2).unwrap_or("");
                        let edge = ["NBIRTH", "DBIRTH", "NDATA", "DDATA", "NDEATH", "DDEATH"].contains(&kind);
                        let payload = if edge {
                            match tahu.decode(&p.payload).await {
                                Ok(payload) => payload,
                                Err(e) => panic!("{topic}: {e}"),
                            }
                        } else {
                            Payload::decode_bytes(&p.payload).unwrap_or_default()
                        };
                        let raw = p.payload.to_vec();
                        let _ = tx.send(Msg { topic, payload, qos: p.qos as u8, raw });
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready.recv()).await.expect("test host subscribed");
        Host { client, rx, seen: Vec::new(), task }
    }

    /// Waits (bounded) for a message `pred` accepts, keeping everything received in `seen`.
    pub async fn until(&mut self, what: &str, timeout: Duration, pred: impl Fn(&Msg) -> bool) -> Msg {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) => {
                    self.seen.push(m.clone());
                    if pred(&m) {
                        return m;
                    }
                }
                Ok(None) => panic!("test host stopped while waiting for {what}"),
                Err(_) => panic!("timed out after {timeout:?} waiting for {what}"),
            }
        }
    }

    /// Takes whatever arrived by now into `seen`.
    pub fn take(&mut self) {
        while let Ok(m) = self.rx.try_recv() {
            self.seen.push(m);
        }
    }

    /// Publishes (QoS 1) and waits until the broker has it.
    pub async fn publish(&self, topic: &str, payload: Vec<u8>, retain: bool) {
        self.client.publish(topic, QoS::AtLeastOnce, retain, payload).await.unwrap();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A STATE payload (Sparkplug 3.0) with the time now.
pub fn state(online: bool) -> Vec<u8> {
    let ts = chrono::Utc::now().timestamp_millis();
    format!("{{\"online\":{online},\"timestamp\":{ts}}}").into_bytes()
}

/// Waits (bounded) for `/metrics`-style counter `name` of `tools` to satisfy `ok`.
pub async fn counter(
    tools: &fieldgate::tools::ToolService,
    name: &str,
    timeout: Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    wait_for(&format!("{name} as expected"), timeout, || {
        let v = metric(tools, name).filter(|v| ok(*v));
        async move { v }
    })
    .await
}

/// The value of one line of `/metrics`.
pub fn metric(tools: &fieldgate::tools::ToolService, name: &str) -> Option<u64> {
    let text = tools.metrics().render();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}
