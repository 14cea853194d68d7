//! History in PostgreSQL against redb, in one run (issue 36): a fleet's ingest of 100,000
//! values a second for 60 s into each backend (the store flushed every second and, with
//! PostgreSQL, shipped after each flush, as the poller does), and the usual queries.
//!
//! Reported: fieldgate's CPU, PostgreSQL's CPU (its server processes), bytes written (the
//! redb file; PostgreSQL's WAL and its table), chunk rows inserted per second, the outbox
//! backlog at the end of each second (it must not grow), and query times from both.
//! Targets: queries from PostgreSQL ≤ 2× redb's; ingest keeps up with no backlog growth.
//! PostgreSQL is started in a temporary directory, as the tests start it.

#[path = "../tests/it/pg/server.rs"]
#[allow(dead_code)]
mod server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::store::HistoryStore;
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::store::pg::Pg;
use fieldgate::tools::ToolService;
use serde_json::json;

const T0: i64 = 1_790_000_000_000;
const SENSORS: usize = 100_000;
const SECONDS: i64 = 60;

/// utime + stime of process `pid` (`self` for this one), in seconds.
fn cpu_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds of every PostgreSQL server process (the postmaster and its children).
fn postgres_cpu(postmaster: &str) -> f64 {
    let mut total = cpu_of(postmaster);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit(')').next().unwrap_or("").split_whitespace().nth(1).unwrap_or("");
        if ppid == postmaster {
            total += cpu_of(&pid);
        }
    }
    total
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

/// PostgreSQL's WAL position (bytes) and chunk rows inserted or updated so far.
async fn wal(c: &tokio_postgres::Client) -> (u64, i64) {
    let r = c
        .query_one(
            "SELECT pg_current_wal_lsn()::text, (SELECT tup_inserted + tup_updated FROM pg_stat_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap();
    let lsn: String = r.get(0);
    let (hi, lo) = lsn.split_once('/').unwrap();
    let lsn = (u64::from_str_radix(hi, 16).unwrap() << 32) + u64::from_str_radix(lo, 16).unwrap();
    (lsn, r.get::<_, i64>(1))
}

struct Ingest {
    cpu_self: f64,
    cpu_pg: f64,
    bytes: u64,
    rows_per_s: f64,
    backlog: Vec<u64>,
    wall: f64,
}

/// 100,000 sensors, one value each a second for `SECONDS` s, paced in real time; a flush
/// (and a shipment) every second on a blocking thread.
async fn ingest(store: Arc<HistoryStore>, pg: Option<(&server::Postgres, &str)>) -> Ingest {
    let names: Vec<String> =
        (0..SENSORS).map(|i| format!("P{:02}_Z{:03}_{:03}", i / 1000, (i / 100) % 10, i % 100)).collect();
    let client = match pg {
        Some((p, _)) => Some(p.client().await),
        None => None,
    };
    let before_pg = match &client {
        Some(c) => Some(wal(c).await),
        None => None,
    };
    let (cpu0, pg0) = (cpu_of("self"), pg.map_or(0.0, |(_, pm)| postgres_cpu(pm)));
    let started = Instant::now();
    let mut backlog = Vec::new();
    for s in 0..SECONDS {
        let t = T0 + s * 1000;
        let points = names.iter().enumerate().map(|(i, n)| {
            let v = ((s as f64 + i as f64) * 0.05).sin() * 100.0 + (i % 7) as f64 * 0.01;
            (n.as_str(), Point { t, value: Stored::Float(v), quality: 0 })
        });
        store.append_all(points);
        let st = store.clone();
        tokio::task::spawn_blocking(move || {
            let _ = st.flush();
            let _ = st.ship();
        })
        .await
        .unwrap();
        backlog.push(store.remote_stats().map_or(0, |r| r.waiting));
        let due = started + Duration::from_secs(s as u64 + 1);
        tokio::time::sleep_until(due.into()).await;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu_self = cpu_of("self") - cpu0;
    let cpu_pg = pg.map_or(0.0, |(_, pm)| postgres_cpu(pm)) - pg0;
    let (bytes, rows_per_s) = match (&client, before_pg) {
        (Some(c), Some((lsn0, rows0))) => {
            let (lsn1, rows1) = wal(c).await;
            (lsn1 - lsn0, (rows1 - rows0) as f64 / wall)
        }
        _ => (0, 0.0),
    };
    Ingest { cpu_self, cpu_pg, bytes, rows_per_s, backlog, wall }
}

/// p50 and p99 of `n` runs of `f`, in ms.
async fn timed<F, Fut>(n: usize, mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut d = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        d.push(t.elapsed().as_secs_f64() * 1e3);
    }
    d.sort_by(f64::total_cmp);
    (d[n / 2], d[n * 99 / 100])
}

async fn run() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let pg = server::Postgres::start();
    let postmaster = pg.postmaster_pid();
    let dir = tempfile::tempdir().unwrap();

    // 1. Ingest into redb, then into PostgreSQL.
    let redb = Arc::new(HistoryStore::open_in(&dir.path().join("redb")).unwrap());
    let r = ingest(redb.clone(), None).await;
    let redb_bytes = std::fs::metadata(dir.path().join("redb/history.redb")).map_or(0, |m| m.len());
    drop(redb);
    let (db, problem) = Pg::start(&pg.url).unwrap();
    assert!(problem.is_none());
    let postgres =
        Arc::new(HistoryStore::open_in(&dir.path().join("pg")).unwrap().with_remote(db, None).unwrap());
    let p = ingest(postgres.clone(), Some((&pg, &postmaster))).await;
    let c = pg.client().await;
    let table: i64 = c
        .query_one(
            "SELECT sum(pg_total_relation_size(i.inhrelid))::bigint FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'fieldgate_chunks'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, Option<i64>>(0)
        .unwrap_or(0);
    drop(postgres);

    // 2. Queries: a day of one sensor at 1 s in each backend; 10,000 raw points from the
    // store, a 5,000-point page and the day in hourly buckets through the tool.
    let registry = Arc::new(Registry::load(&root.join("devices")).unwrap());
    let day = |store: &HistoryStore| {
        for k in 0..86_400i64 {
            let v = ((k as f64) * 0.001).sin() * 10.0;
            store.append("A_LINE1_001", &Point { t: T0 + k * 1000, value: Stored::Float(v), quality: 0 });
        }
        store.flush_all().unwrap();
        store.ship().unwrap();
    };
    let q_redb = HistoryStore::open_in(&dir.path().join("q-redb")).unwrap();
    day(&q_redb);
    let (db, _) = Pg::start(&pg.url).unwrap();
    let q_pg = HistoryStore::open_in(&dir.path().join("q-pg")).unwrap().with_remote(db, None).unwrap();
    day(&q_pg);
    let mut rows = Vec::new();
    for (name, store) in [("redb", q_redb), ("PostgreSQL", q_pg)] {
        let store = Arc::new(store);
        let raw = timed(100, || {
            let s = store.clone();
            async move {
                assert_eq!(s.points("A_LINE1_001", T0, T0 + 10_000_000).unwrap().len(), 10_000);
            }
        })
        .await;
        let svc = ToolService::with_history(registry.clone(), Config::default(), Some(store.clone()));
        let page = json!({"sensor_id": "A_LINE1_001", "from": "2026-09-21T14:13:20Z", "to": "2026-09-21T15:36:40Z", "limit": 5000});
        let tool_raw = timed(50, || {
            let (svc, page) = (svc.clone(), page.clone());
            async move { assert!(svc.call("get_sensor_history", page).await.unwrap().ok) }
        })
        .await;
        let whole = json!({"sensor_id": "A_LINE1_001", "from": "2026-09-21T14:13:20Z", "to": "2026-09-22T14:13:20Z", "bucket": "1h"});
        let buckets = timed(30, || {
            let (svc, whole) = (svc.clone(), whole.clone());
            async move { assert!(svc.call("get_sensor_history", whole).await.unwrap().ok) }
        })
        .await;
        rows.push((name, raw, tool_raw, buckets));
    }

    println!(
        "history in PostgreSQL against redb (release build; PostgreSQL with fsync off in a temporary directory)"
    );
    for (name, i) in [("redb", &r), ("PostgreSQL", &p)] {
        let grew = i.backlog.windows(2).filter(|w| w[1] > w[0]).count();
        println!(
            "ingest into {name}: {} values/s offered for {:.0} s; fieldgate CPU {:.0}% of one core, PostgreSQL CPU {:.0}%; backlog at the end {} chunks (grew in {grew} of {} seconds, max {})",
            SENSORS,
            i.wall,
            100.0 * i.cpu_self / i.wall,
            100.0 * i.cpu_pg / i.wall,
            i.backlog.last().copied().unwrap_or(0),
            i.backlog.len(),
            i.backlog.iter().max().copied().unwrap_or(0),
        );
    }
    let values = (SENSORS as i64 * SECONDS) as f64;
    println!(
        "bytes: redb file {:.2} bytes/value; PostgreSQL WAL {:.2} bytes/value ({:.1} MB/s), its table {:.2} bytes/value; chunk rows inserted or updated {:.0}/s",
        redb_bytes as f64 / values,
        p.bytes as f64 / values,
        p.bytes as f64 / p.wall / 1e6,
        table as f64 / values,
        p.rows_per_s
    );
    let (_, r_raw, r_tool, r_b) = rows[0];
    for (name, raw, tool, b) in &rows {
        println!(
            "{name}: 10,000 raw points p50 {:.2} ms (p99 {:.2}); a 5,000-point page p50 {:.2} ms; a day in hourly buckets p50 {:.2} ms (p99 {:.2})",
            raw.0, raw.1, tool.0, b.0, b.1
        );
    }
    let (_, p_raw, p_tool, p_b) = rows[1];
    let worst = (p_raw.0 / r_raw.0).max(p_tool.0 / r_tool.0).max(p_b.0 / r_b.0);
    println!(
        "PostgreSQL / redb: raw {:.2}x, page {:.2}x, buckets {:.2}x   target <= 2x: {}",
        p_raw.0 / r_raw.0,
        p_tool.0 / r_tool.0,
        p_b.0 / r_b.0,
        if worst <= 2.0 { "met" } else { "NOT met" }
    );
}
