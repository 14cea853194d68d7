//! PostgreSQL as history's durable store: fieldgate's own compressed chunks (the Gorilla
//! format of `gorilla.rs`), not a row per value, in a table partitioned by day.
//!
//! Schema (created and migrated here at start, its version in `fieldgate_schema`; a version
//! newer than this binary knows is refused):
//! - `fieldgate_sensors (id, name)`: the sensor catalogue, a small integer per sensor ID;
//! - `fieldgate_chunks (sensor, first_t, chunk, last_t, points, data)`, primary key
//!   `(sensor, first_t, chunk)`, partitioned by range of `first_t` (ms), one partition a
//!   day (`fieldgate_chunks_d<day>`, created ahead and on demand; retention drops whole
//!   partitions). `chunk` is the chunk's own ID: a later snapshot of the same chunk replaces
//!   the earlier one (when it holds at least as many points), two chunks never replace each
//!   other.
//!
//! The connection lives on a thread of its own (its own runtime): the store is synchronous
//! and is called from the runtime's workers, so each call sends a job and waits for its
//! answer with a timeout. Errors name what failed in a few words: never the URL, never the
//! server's own text.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{Client, NoTls};

/// The schema this binary writes.
pub const SCHEMA_VERSION: i32 = 1;
const DAY_MS: i64 = 86_400_000;
/// Days of partitions created ahead of today.
const AHEAD_DAYS: i64 = 2;
/// A connection attempt gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A read waits this long for its answer (a tool call is waiting for it).
const READ_TIMEOUT: Duration = Duration::from_secs(8);
/// After a failed connection attempt, jobs fail at once for this long (doubling to
/// [`DOWN_MAX`]): a database that is down does not hold every read for a connect timeout.
const DOWN_MIN: Duration = Duration::from_secs(1);
const DOWN_MAX: Duration = Duration::from_secs(5);
/// A shipment waits this long for its answer (a normal one takes well under a second).
const SHIP_TIMEOUT: Duration = Duration::from_secs(15);
/// Jobs waiting for the connection's thread, at most.
const QUEUE: usize = 64;
/// The advisory lock that serialises schema changes of several fieldgates on one database.
const SCHEMA_LOCK: i64 = 0x6669_656c_6467_6174;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgError {
    #[error("PostgreSQL: the URL could not be read (check the variable history.postgres_url_env names)")]
    Url,
    #[error("PostgreSQL: {0}")]
    Trust(String),
    #[error("PostgreSQL: cannot connect ({0})")]
    Connect(String),
    #[error("PostgreSQL: {0}")]
    Db(String),
    #[error(
        "PostgreSQL: the database's history schema is version {found}, newer than this fieldgate knows ({known}): run a newer fieldgate, or use another database"
    )]
    Newer { found: i32, known: i32 },
    #[error("PostgreSQL: no answer within {0} s")]
    Timeout(u64),
    #[error("PostgreSQL: too many requests waiting")]
    Busy,
    #[error("PostgreSQL: the connection's thread is gone")]
    Gone,
}

/// A chunk as the database keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub sensor: String,
    pub first: i64,
    pub id: i64,
    pub last: i64,
    pub points: u32,
    pub bytes: Vec<u8>,
}

/// A stored chunk of one sensor, as a range read gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub first: i64,
    pub id: i64,
    pub bytes: Vec<u8>,
}

/// What dropping old partitions removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    pub partitions: usize,
    pub bytes: u64,
}

type Reply<T> = std_mpsc::Sender<Result<T, PgError>>;

enum Job {
    Ship(Vec<Chunk>, Reply<()>),
    Range { sensor: String, from: i64, to: i64, span: i64, reply: Reply<Vec<Stored>> },
    DropBefore(i64, Reply<Dropped>),
    Counts(i64, Reply<Vec<(String, i64, i64)>>),
    Identity(Reply<String>),
    Ready(Reply<()>),
}

/// The database, through its connection's thread.
pub struct Pg {
    jobs: mpsc::Sender<Job>,
}

impl Pg {
    /// Starts the connection's thread over `url`, and connects once: a database whose
    /// schema is newer than this binary's is refused here; one that cannot be reached is
    /// not (history waits locally until it can), and `Ok` carries why.
    pub fn start(url: &str) -> Result<(Pg, Option<PgError>), PgError> {
        Pg::start_with(url, None)
    }

    /// [`Pg::start`], trusting the certificate authorities of `ca_file` (PEM) besides the
    /// system's when the URL asks for TLS (`sslmode=require`).
    pub fn start_with(
        url: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<(Pg, Option<PgError>), PgError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|_| PgError::Url)?;
        // TLS when the URL requires it, the server's certificate checked (`prefer`, the
        // default, is plain: checking a certificate nobody asked for would refuse a
        // server's self-signed one that a plain connection accepts).
        let tls = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => Some(tls_connector(ca_file)?),
            _ => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                None
            }
        };
        config.connect_timeout(CONNECT_TIMEOUT);
        // A connection that went silent (a cable, a firewall dropping packets) fails in
        // seconds, not at the operating system's two hours.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .tcp_user_timeout(Duration::from_secs(15));
        config.application_name("fieldgate");
        // The server's notices ("relation already exists, skipping") are no news.
        config.options("-c client_min_messages=warning");
        let (jobs, rx) = mpsc::channel(QUEUE);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PgError::Connect(format!("cannot start its thread: {}", e.kind())))?;
        std::thread::Builder::new()
            .name("history-pg".into())
            .spawn(move || runtime.block_on(Conn::new(config, tls).serve(rx)))
            .map_err(|e| PgError::Connect(format!("cannot start its thread: {}", e.kind())))?;
        let pg = Pg { jobs };
        match pg.ask(Job::Ready, CONNECT_TIMEOUT * 3) {
            Ok(()) => Ok((pg, None)),
            Err(e @ PgError::Newer { .. }) => Err(e),
            Err(e) => Ok((pg, Some(e))),
        }
    }

    fn ask<T>(&self, job: impl FnOnce(Reply<T>) -> Job, timeout: Duration) -> Result<T, PgError> {
        let (tx, rx) = std_mpsc::channel();
        self.jobs.try_send(job(tx)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => PgError::Busy,
            mpsc::error::TrySendError::Closed(_) => PgError::Gone,
        })?;
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(std_mpsc::RecvTimeoutError::Timeout) => Err(PgError::Timeout(timeout.as_secs())),
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(PgError::Gone),
        }
    }

    /// Writes `chunks` in one transaction (each replaces an earlier snapshot of itself).
    pub fn ship(&self, chunks: Vec<Chunk>) -> Result<(), PgError> {
        self.ask(|r| Job::Ship(chunks, r), SHIP_TIMEOUT)
    }

    /// The chunks of `sensor` that may hold points in `from..to` (a chunk spans at most
    /// `span` ms), by first point then ID.
    pub fn range(&self, sensor: &str, from: i64, to: i64, span: i64) -> Result<Vec<Stored>, PgError> {
        let sensor = sensor.to_string();
        self.ask(|reply| Job::Range { sensor, from, to, span, reply }, READ_TIMEOUT)
    }

    /// Drops the partitions whose days ended before `older_than` (ms).
    pub fn drop_before(&self, older_than: i64) -> Result<Dropped, PgError> {
        self.ask(|r| Job::DropBefore(older_than, r), Duration::from_secs(60))
    }

    /// Per sensor, the chunks of ID `id` and their points (a migration's check).
    pub fn counts(&self, id: i64) -> Result<Vec<(String, i64, i64)>, PgError> {
        self.ask(|r| Job::Counts(id, r), Duration::from_secs(600))
    }

    /// The database's own ID (made with its schema): a migration's progress is kept per
    /// database.
    pub fn identity(&self) -> Result<String, PgError> {
        self.ask(Job::Identity, READ_TIMEOUT)
    }

    /// Connected, with the schema in place (connecting now if it was not).
    pub fn ready(&self) -> Result<(), PgError> {
        self.ask(Job::Ready, CONNECT_TIMEOUT * 3)
    }
}

/// The connection, on its thread.
struct Conn {
    config: tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    client: Option<Client>,
    cache: Cache,
    /// The last connection attempt failed: why, and until when jobs fail at once.
    down: Option<(PgError, tokio::time::Instant, Duration)>,
    /// The schema found newer: nothing is written.
    newer: Option<i32>,
}

/// What the connection remembers of the database (forgotten with the connection).
#[derive(Default)]
struct Cache {
    /// Sensor IDs by name, as the catalogue gave them.
    sensors: HashMap<String, i32>,
    /// Days whose partition exists.
    days: HashSet<i64>,
    /// The range read, prepared once (a tool's read pays no parse and plan).
    range: Option<tokio_postgres::Statement>,
}

impl Conn {
    fn new(config: tokio_postgres::Config, tls: Option<tokio_postgres_rustls::MakeRustlsConnect>) -> Conn {
        Conn { config, tls, client: None, cache: Cache::default(), down: None, newer: None }
    }

    /// A new connection (TLS when the URL requires it), its task spawned.
    async fn connect(&self) -> Result<Client, PgError> {
        let fail = |e: tokio_postgres::Error| PgError::Connect(short(&e));
        let attempt = async {
            match &self.tls {
                Some(tls) => {
                    let (client, connection) = self.config.connect(tls.clone()).await.map_err(fail)?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    Ok(client)
                }
                None => {
                    let (client, connection) = self.config.connect(NoTls).await.map_err(fail)?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    Ok(client)
                }
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, attempt)
            .await
            .map_err(|_| PgError::Connect("no answer".into()))?
    }

    async fn serve(mut self, mut jobs: mpsc::Receiver<Job>) {
        while let Some(job) = jobs.recv().await {
            match job {
                Job::Ship(chunks, reply) => {
                    let r = match self.take().await {
                        Ok(mut c) => {
                            let r = ship(&mut c, &mut self.cache, &chunks).await;
                            if r.is_err() {
                                // A partition or a catalogue row dropped behind fieldgate's
                                // back: made again on the next shipment.
                                self.cache = Cache::default();
                            }
                            self.put(c);
                            r
                        }
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                }
                Job::Range { sensor, from, to, span, reply } => {
                    let r = match self.take().await {
                        Ok(c) => {
                            let r = range(&c, &mut self.cache, &sensor, from, to, span).await;
                            self.put(c);
                            r
                        }
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                }
                Job::DropBefore(t, reply) => {
                    let r = match self.take().await {
                        Ok(c) => {
                            let r = drop_before(&c, &mut self.cache, t).await;
                            self.put(c);
                            r
                        }
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                }
                Job::Counts(id, reply) => {
                    let r = match self.take().await {
                        Ok(c) => {
                            let r = counts(&c, id).await;
                            self.put(c);
                            r
                        }
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                }
                Job::Identity(reply) => {
                    let r = match self.take().await {
                        Ok(c) => {
                            let r = c
                                .query_one("SELECT value FROM fieldgate_meta WHERE key = 'database_id'", &[])
                                .await
                                .map(|row| row.get::<_, String>(0))
                                .map_err(db);
                            self.put(c);
                            r
                        }
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                }
                Job::Ready(reply) => {
                    let r = self.take().await.map(|c| self.put(c));
                    let _ = reply.send(r);
                }
            }
        }
    }

    /// The client, connecting (and checking the schema) when there is none.
    async fn take(&mut self) -> Result<Client, PgError> {
        if let Some(v) = self.newer {
            return Err(PgError::Newer { found: v, known: SCHEMA_VERSION });
        }
        if let Some(c) = self.client.take().filter(|c| !c.is_closed()) {
            return Ok(c);
        }
        let now = tokio::time::Instant::now();
        if let Some((e, until, _)) = &self.down
            && now < *until
        {
            return Err(e.clone());
        }
        let mut client = match self.connect().await {
            Ok(c) => {
                self.down = None;
                c
            }
            Err(e) => {
                let wait = self.down.as_ref().map_or(DOWN_MIN, |(_, _, w)| (*w * 2).min(DOWN_MAX));
                self.down = Some((e.clone(), tokio::time::Instant::now() + wait, wait));
                return Err(e);
            }
        };
        if let Err(e) = migrate(&mut client).await {
            if let PgError::Newer { found, .. } = e {
                self.newer = Some(found);
            }
            return Err(e);
        }
        self.cache = Cache::default();
        Ok(client)
    }

    /// The client back, unless its connection broke (the next job connects again).
    fn put(&mut self, client: Client) {
        if !client.is_closed() {
            self.client = Some(client);
        }
    }
}

/// The TLS connector: the system's certificate authorities and those of `ca_file`.
fn tls_connector(
    ca_file: Option<&std::path::Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let extra: Vec<CertificateDer<'static>> = match ca_file {
        Some(p) => {
            let pem =
                std::fs::read(p).map_err(|e| PgError::Trust(format!("{}: {}", p.display(), e.kind())))?;
            CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|_| PgError::Trust(format!("{} is not a PEM file of certificates", p.display())))?
        }
        None => Vec::new(),
    };
    crate::tls::install_crypto_provider();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(extra, provider.clone())
        .map_err(|_| PgError::Trust("no certificate authorities to check the database with".into()))?;
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| PgError::Trust("no TLS version to use".into()))?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// A database error in a few words: its SQLSTATE class, never the server's text (which
/// may quote data or names).
fn short(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let what = match &code[..2.min(code.len())] {
            "28" => "authentication failed",
            "3D" => "no such database",
            "42" if code == "42501" => "permission denied (the user needs CREATE on the database's schema)",
            "42" if code == "42P01" => "a table of fieldgate's is missing",
            "42" => "the schema is not as expected",
            "53" => "the server is out of resources (disk, memory or connections)",
            "57" => "the server is shutting down or was restarted",
            "08" => "the connection failed",
            "23" => "a constraint was violated",
            _ => "the server refused",
        };
        return format!("{what}, SQLSTATE {code}");
    }
    if e.is_closed() {
        return "the connection was closed".into();
    }
    match std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>()) {
        Some(io) => format!("the connection failed: {}", io.kind()),
        None => "the connection failed".into(),
    }
}

fn db(e: tokio_postgres::Error) -> PgError {
    if e.as_db_error().is_none() && (e.is_closed() || std::error::Error::source(&e).is_some()) {
        PgError::Connect(short(&e))
    } else {
        PgError::Db(short(&e))
    }
}

mod sql;
use sql::{counts, drop_before, migrate, range, ship};
