//! A real PostgreSQL (Debian's package, installed by `scripts/test-deps`) for one test:
//! `initdb` into a temporary directory, listening on a Unix socket there only (no port is
//! taken), torn down when dropped. As root (CI) it runs as the `postgres` user, since
//! PostgreSQL refuses to run as root. No PostgreSQL here is a failure, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// More server options (`-c ...`), e.g. TLS on a loopback port.
    extra: String,
    /// The URL fieldgate takes (key=value form), as the variable would hold it.
    pub url: String,
}

/// The newest PostgreSQL installed (`/usr/lib/postgresql/<version>/bin`).
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: run scripts/test-deps (Debian's postgresql package)")
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p)| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .expect("no PostgreSQL server under /usr/lib/postgresql: run scripts/test-deps")
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// `program args`, as the `postgres` user when this is root.
fn run(program: &Path, args: &[&str]) -> std::process::Output {
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    c.args(args).env_remove("PGDATA").output().unwrap_or_else(|e| panic!("{}: {e}", program.display()))
}

impl Postgres {
    pub fn start() -> Postgres {
        Postgres::start_with(|_| String::new())
    }

    /// Also listening on a free loopback port with TLS (`cert` and `key`, PEM, copied in
    /// for the server's user); the URL (`url`) stays the Unix socket's. The port is
    /// returned.
    #[allow(dead_code)]
    pub fn start_tls(cert: &Path, key: &Path) -> (Postgres, u16) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
        let pg = Postgres::start_with(move |dir| {
            use std::os::unix::fs::PermissionsExt;
            let (c, k) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::copy(&cert, &c).unwrap();
            std::fs::copy(&key, &k).unwrap();
            std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
            if is_root() {
                let o = Command::new("chown").arg("postgres").arg(&c).arg(&k).output().unwrap();
                assert!(o.status.success());
            }
            format!(
                " -c listen_addresses=127.0.0.1 -c port={port} -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                c.display(),
                k.display()
            )
        });
        (pg, port)
    }

    fn start_with(extra: impl FnOnce(&Path) -> String) -> Postgres {
        let bin = bin_dir();
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let data = dir.path().join("data");
        let initdb = run(
            &bin.join("initdb"),
            &["-D", data.to_str().unwrap(), "-A", "trust", "-U", "fieldgate", "--no-sync", "-E", "UTF8"],
        );
        assert!(initdb.status.success(), "initdb: {}", String::from_utf8_lossy(&initdb.stderr));
        let extra = extra(dir.path());
        let port =
            extra.split("port=").nth(1).and_then(|p| p.split(' ').next()).unwrap_or("5432").to_string();
        let pg = Postgres {
            url: format!("host={} port={port} user=fieldgate dbname=postgres", dir.path().display()),
            dir,
            bin,
            extra,
        };
        pg.up();
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Started (again), waiting until it takes connections.
    pub fn up(&self) {
        let opts = if self.extra.is_empty() {
            format!("-c listen_addresses='' -k {} -p 5432 -c fsync=off", self.dir.path().display())
        } else {
            format!("-k {} -c fsync=off{}", self.dir.path().display(), self.extra)
        };
        let log = self.dir.path().join("log").display().to_string();
        let o = run(
            &self.bin.join("pg_ctl"),
            &["-D", &self.data(), "-o", &opts, "-l", &log, "-w", "-t", "60", "start"],
        );
        assert!(
            o.status.success(),
            "pg_ctl start: {} {}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
        );
    }

    /// Stopped at once (as a crash or a pulled cable would: no clean shutdown).
    pub fn down(&self) {
        let o =
            run(&self.bin.join("pg_ctl"), &["-D", &self.data(), "-m", "immediate", "-w", "-t", "60", "stop"]);
        assert!(o.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// The server's main process (its `postmaster.pid`).
    #[allow(dead_code)]
    pub fn postmaster_pid(&self) -> String {
        let pid = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid")).unwrap_or_default();
        pid.lines().next().unwrap_or_default().trim().to_string()
    }

    /// A client of the test's own, to look at what fieldgate wrote.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) =
            self.url.parse::<tokio_postgres::Config>().unwrap().connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = run(&self.bin.join("pg_ctl"), &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
    }
}
