//! History kept in a real PostgreSQL (`history.backend = "postgres"`): the same answers as
//! redb, nothing lost while the database is down, a schema from the future refused,
//! retention by whole days, and the binary end to end.

mod server;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, TimeZone, Utc};
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::store::pg::{Pg, PgError};
use fieldgate::store::{HistoryStore, StoreError};
use fieldgate::tools::{Stores, ToolService};
use serde_json::{Value, json};
pub use server::Postgres;

use super::support;

const T0: i64 = 1_790_000_000_000; // 2026-09-21

/// A store in `dir` keeping history in `pg`.
pub fn pg_store(pg: &Postgres, dir: &Path) -> HistoryStore {
    let (db, problem) = Pg::start(&pg.url).expect("the database takes fieldgate");
    assert_eq!(problem, None, "reached at start");
    HistoryStore::open_in(dir).unwrap().with_remote(db, None).unwrap()
}

fn float(t: i64, v: f64) -> Point {
    Point { t, value: Stored::Float(v), quality: 0 }
}

/// What a sensor's history must hold: the first point appended at each instant.
type Expected = BTreeMap<(String, i64), f64>;

/// A stream of three sensors: 3,000 points each a second apart, then a replay of late
/// points between them (as an edge's buffer after an outage), repeats of stored instants,
/// and more on time; flushed (and shipped) every 250 points. Appended to every store.
fn feed(stores: &[&HistoryStore]) -> Expected {
    let mut want = Expected::new();
    let sensors = ["A_LINE1_001", "A_LINE1_002", "B_PRESS_001"];
    let mut n = 0;
    let mut put = |sensor: &str, p: Point| {
        let Stored::Float(v) = p.value else { unreachable!() };
        want.entry((sensor.to_string(), p.t)).or_insert(v);
        for s in stores {
            s.append(sensor, &p);
        }
        n += 1;
        if n % 250 == 0 {
            for s in stores {
                s.flush().unwrap();
                s.ship().unwrap();
            }
        }
    };
    for i in 0..3_000i64 {
        for (k, s) in sensors.iter().enumerate() {
            put(s, float(T0 + i * 1000, (i as f64 * 0.01 + k as f64).sin() * 100.0));
        }
    }
    // Late: half a second after each of 1,000 stored instants, and repeats of 200.
    for i in 500..1_500i64 {
        put(sensors[0], float(T0 + i * 1000 + 500, -(i as f64)));
    }
    for i in 100..300i64 {
        put(sensors[1], float(T0 + i * 1000, 12345.0));
    }
    for i in 3_000..3_600i64 {
        put(sensors[2], float(T0 + i * 1000, i as f64));
    }
    for s in stores {
        s.flush_all().unwrap();
        s.ship().unwrap();
    }
    want
}

fn values(points: &[Point]) -> Vec<(i64, f64)> {
    points
        .iter()
        .map(|p| match p.value {
            Stored::Float(v) => (p.t, v),
            ref other => panic!("{other:?}"),
        })
        .collect()
}

fn expected(want: &Expected, sensor: &str, from: i64, to: i64) -> Vec<(i64, f64)> {
    want.range((sensor.to_string(), from)..(sensor.to_string(), to)).map(|((_, t), v)| (*t, *v)).collect()
}

fn iso(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms).unwrap().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn service(store: HistoryStore) -> ToolService {
    let stores = Stores { history: Some(Arc::new(store)), ..Stores::in_memory() };
    ToolService::with_stores(Arc::new(support::demo_registry()), fieldgate::config::Config::default(), stores)
}

/// Every page of a `get_sensor_history` query, without the call's own meta.
async fn pages(svc: &ToolService, mut args: Value) -> Vec<Value> {
    let mut out = Vec::new();
    for _ in 0..100 {
        let d: Value =
            serde_json::from_slice(&svc.call("get_sensor_history", args.clone()).await.unwrap().to_json())
                .unwrap();
        assert_eq!(d["ok"], true, "{d}");
        let next = d["data"]["next_cursor"].as_str().map(str::to_string);
        let mut data = d["data"].clone();
        data.as_object_mut().unwrap().remove("next_cursor");
        out.push(data);
        match next {
            Some(c) => args["cursor"] = json!(c),
            None => return out,
        }
    }
    panic!("paging does not end")
}

/// The shared suite: the same stream into redb and into PostgreSQL gives the same points
/// for every range, as appended (late points in place, repeats dropped), and the tool
/// answers the same raw pages and buckets from both.
#[tokio::test(flavor = "multi_thread")]
async fn both_backends_answer_the_same_history() {
    let pg = Postgres::start();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let redb = HistoryStore::open_in(a.path()).unwrap();
    let postgres = pg_store(&pg, b.path());
    let want = feed(&[&redb, &postgres]);
    assert_eq!(postgres.remote_stats().unwrap().waiting, 0, "everything shipped");
    let rows: i64 =
        pg.client().await.query_one("SELECT count(*) FROM fieldgate_chunks", &[]).await.unwrap().get(0);
    assert!(rows > 10, "chunks, not a row per value: {rows}");
    for sensor in ["A_LINE1_001", "A_LINE1_002", "B_PRESS_001"] {
        for (from, to) in
            [(T0, T0 + 3_600_000), (T0 + 499_700, T0 + 1_500_300), (T0 + 2_999_000, T0 + 3_001_000), (0, T0)]
        {
            let r = values(&redb.points(sensor, from, to).unwrap());
            let p = values(&postgres.points(sensor, from, to).unwrap());
            // Where a sensor repeated instants inside stored chunks, the chunk that starts
            // first gives the point (both backends alike); elsewhere, what was appended.
            if sensor != "A_LINE1_002" {
                let want = expected(&want, sensor, from, to);
                assert!(
                    r == want,
                    "{sensor} {from}..{to} from redb: {} points, {} wanted",
                    r.len(),
                    want.len()
                );
            }
            assert!(
                p == r,
                "{sensor} {from}..{to}: {} points from PostgreSQL, {} from redb",
                p.len(),
                r.len()
            );
        }
    }
    // Through the tool: raw pages and buckets, the same from both.
    let (r, p) = (service(redb), service(postgres));
    for args in [
        json!({"sensor_id": "A_LINE1_001", "from": iso(T0), "to": iso(T0 + 3_600_000), "limit": 700}),
        json!({"sensor_id": "A_LINE1_001", "from": iso(T0), "to": iso(T0 + 3_600_000), "bucket": "5m"}),
        json!({"sensor_id": "A_LINE1_002", "from": iso(T0 + 60_000), "to": iso(T0 + 400_000), "limit": 50}),
    ] {
        assert_eq!(pages(&p, args.clone()).await, pages(&r, args.clone()).await, "{args}");
    }
}

/// The database stopped mid-ingest: flushes go on (the data directory keeps the chunks),
/// shipments fail and say so, reads answer a storage error; a restart of fieldgate
/// meanwhile keeps what waits; once the database is back everything is there.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_lost_while_postgres_is_down() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let store = pg_store(&pg, dir.path());
    for i in 0..1_000 {
        store.append("A_LINE1_001", &float(T0 + i * 1000, i as f64));
    }
    store.flush_all().unwrap();
    assert!(store.ship().unwrap() > 0);
    pg.down();
    for i in 1_000..2_000 {
        store.append("A_LINE1_001", &float(T0 + i * 1000, i as f64));
    }
    store.flush_all().expect("the data directory takes the flush");
    let shipped = store.ship();
    assert!(matches!(shipped, Err(StoreError::Remote(_))), "{shipped:?}");
    let waiting = store.remote_stats().unwrap();
    assert!(waiting.waiting > 0 && waiting.failures > 0, "{waiting:?}");
    assert_eq!(store.outbox_waiting(), waiting.waiting, "what waits, also as a redb store would see it");
    assert_eq!(store.problems().len(), 1, "the database's problem alone (the disk is fine)");
    let problem = store.problem().expect("the problem is said");
    assert!(problem.reason.contains("PostgreSQL") && problem.reason.contains("waits"), "{}", problem.reason);
    assert!(!problem.reason.contains(&pg.url), "no URL in {}", problem.reason);
    assert!(matches!(store.points("A_LINE1_001", T0, T0 + 10_000_000), Err(StoreError::Remote(_))));
    // Through the tool: a retryable storage error, short, without the URL.
    let svc = service(store);
    let e = svc.call(
        "get_sensor_history",
        json!({"sensor_id": "A_LINE1_001", "from": iso(T0), "to": iso(T0 + 10_000_000)}),
    );
    let e: Value = serde_json::from_slice(&e.await.unwrap().to_json()).unwrap();
    assert_eq!(e["error"]["code"], "STORAGE_UNAVAILABLE", "{e}");
    assert!(e["error"]["retry_after_ms"].as_u64().is_some(), "{e}");
    // fieldgate restarted while the database is down: what waits is on disk.
    drop(svc);
    let (db, problem) = Pg::start(&pg.url).expect("a database down is no reason not to start");
    assert!(matches!(problem, Some(PgError::Connect(_))), "{problem:?}");
    let store = HistoryStore::open_in(dir.path()).unwrap().with_remote(db, problem).unwrap();
    assert!(store.remote_stats().unwrap().waiting > 0);
    pg.up();
    // After a failed attempt the store waits a moment before it tries to connect again.
    let shipped =
        support::wait_for("the outbox shipped once the database is back", Duration::from_secs(30), || {
            std::future::ready(store.ship().ok().filter(|n| *n > 0))
        })
        .await;
    assert!(shipped > 0);
    assert_eq!(store.remote_stats().unwrap().waiting, 0);
    assert!(store.problem().is_none(), "{:?}", store.problem());
    let got = values(&store.points("A_LINE1_001", T0, T0 + 10_000_000).unwrap());
    assert_eq!(got, (0..2_000).map(|i| (T0 + i * 1000, i as f64)).collect::<Vec<_>>());
    // And a store in a fresh data directory reads it all from the database alone.
    let fresh = tempfile::tempdir().unwrap();
    let other = pg_store(&pg, fresh.path());
    assert_eq!(values(&other.points("A_LINE1_001", T0, T0 + 10_000_000).unwrap()), got);
}

/// A database whose history schema is newer than this fieldgate's is refused at start,
/// with a message that says what to do.
#[tokio::test(flavor = "multi_thread")]
async fn a_schema_from_the_future_is_refused() {
    let pg = Postgres::start();
    drop(Pg::start(&pg.url).unwrap());
    let c = pg.client().await;
    let v: i32 = c.query_one("SELECT version FROM fieldgate_schema", &[]).await.unwrap().get(0);
    assert_eq!(v, fieldgate::store::pg::SCHEMA_VERSION);
    c.execute("UPDATE fieldgate_schema SET version = 99", &[]).await.unwrap();
    let refused = Pg::start(&pg.url).err().expect("refused");
    assert_eq!(refused, PgError::Newer { found: 99, known: fieldgate::store::pg::SCHEMA_VERSION });
    assert!(refused.to_string().contains("newer than this fieldgate"), "{refused}");
    // A URL that is no URL says so without repeating it.
    let bad = Pg::start("postgres://user:secret@[::1").err().expect("refused");
    assert!(matches!(bad, PgError::Url) && !bad.to_string().contains("secret"), "{bad}");
}

/// Retention drops whole days (partitions) that ended before the cutoff; the others stay.
#[tokio::test(flavor = "multi_thread")]
async fn retention_drops_whole_days() {
    const DAY: i64 = 86_400_000;
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let store = pg_store(&pg, dir.path());
    let now = Utc::now().timestamp_millis();
    let old = (now - 10 * DAY).div_euclid(DAY) * DAY + 3_600_000;
    for i in 0..100 {
        store.append("A_LINE1_001", &float(old + i * 1000, 1.0));
        store.append("A_LINE1_001", &float(now - 60_000 + i * 100, 2.0));
    }
    store.flush_all().unwrap();
    store.ship().unwrap();
    let partitions = |c: tokio_postgres::Client| async move {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'fieldgate_chunks'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n
    };
    let before = partitions(pg.client().await).await;
    assert!(before >= 4, "the old day, today and two ahead: {before}");
    let dropped = store.prune_remote(now - 5 * DAY).unwrap();
    assert_eq!(dropped.partitions, 1, "{dropped:?}");
    assert_eq!(partitions(pg.client().await).await, before - 1);
    // The old points are gone from the database; memory and the outbox hold none of them.
    let fresh = tempfile::tempdir().unwrap();
    let other = pg_store(&pg, fresh.path());
    assert!(other.points("A_LINE1_001", old, old + DAY).unwrap().is_empty());
    assert_eq!(other.points("A_LINE1_001", now - DAY, now + DAY).unwrap().len(), 100);
}

/// `fieldgate serve` with `history.backend = "postgres"`: the poller's history lands in
/// the database; `kill -9` and a restart lose no more than a flush interval, and the
/// history answered before the kill is answered after it.
#[tokio::test(flavor = "multi_thread")]
async fn serve_keeps_history_in_postgres_across_kill_9() {
    let pg = Postgres::start();
    let sim = support::sim_for(&support::demo_dir()).await;
    let devices = support::demo_devices_for(&sim);
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("FIELDGATE_HISTORY_BACKEND", "postgres"),
        ("FIELDGATE_PG_URL", pg.url.as_str()),
        ("FIELDGATE_STORAGE_FLUSH_INTERVAL_MS", "200"),
        // A flat value is stored every second (not every minute).
        ("FIELDGATE_HISTORY_MAX_SILENCE_S", "1"),
    ];
    let history = |addr| async move {
        let e = support::tool_over_http(
            addr,
            "get_sensor_history",
            json!({"sensor_id": "A_LINE1_001", "from": "-1h", "limit": 5000}),
        )
        .await;
        e["data"]["points"].as_array().cloned().unwrap_or_default()
    };
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _log = served.drain_stderr();
    let c = pg.client().await;
    support::wait_until("chunks of the poller's history in PostgreSQL", Duration::from_secs(60), || async {
        let n: i64 = c.query_one("SELECT count(*) FROM fieldgate_chunks", &[]).await.unwrap().get(0);
        n > 0
    })
    .await;
    let before = support::wait_for("five points of history", Duration::from_secs(60), || async {
        let p = history(served.addr).await;
        (p.len() >= 5).then_some(p)
    })
    .await;
    let pid = served.child.id().expect("running").to_string();
    assert!(std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap().success());
    let _ = served.child.wait().await;
    let mut again = support::serve_binary(devices.path(), data.path(), &env).await;
    let _log = again.drain_stderr();
    let after = history(again.addr).await;
    let ts = |p: &[Value]| {
        p.iter()
            .filter_map(|x| chrono::DateTime::parse_from_rfc3339(x["t"].as_str()?).ok())
            .map(|t| t.timestamp_millis())
            .collect::<Vec<_>>()
    };
    let (b, a) = (ts(&before), ts(&after));
    // What the last flush interval held in memory may go with the process (as with redb).
    let newest = b.iter().copied().max().unwrap_or(0);
    let flushed: Vec<i64> = b.iter().copied().filter(|t| *t < newest - 2_000).collect();
    assert!(!flushed.is_empty());
    assert!(
        flushed.iter().all(|t| a.contains(t)),
        "every point answered before the kill is answered after it"
    );
}

/// A data directory that kept history in redb, switched to PostgreSQL: retention keeps its
/// own chunks (they are in no database yet); `fieldgate history migrate` copies them with
/// a progress line and a check; a migration cut off (the database gone mid-way) goes on
/// where it stopped; afterwards the database answers what redb did.
#[tokio::test(flavor = "multi_thread")]
async fn history_migrate_copies_redb_to_postgres_resumably() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let sensors: Vec<String> = (0..2_500).map(|i| format!("M_Z{:02}_{:03}", i / 1000, i % 1000)).collect();
    {
        let redb = HistoryStore::open_in(dir.path()).unwrap();
        for (i, s) in sensors.iter().enumerate() {
            redb.append(s, &float(T0, i as f64));
            redb.append(s, &float(T0 + 1000, i as f64 + 0.5));
        }
        redb.append("A_LINE1_001", &float(T0 + 5000, 42.0));
        redb.flush_all().unwrap();
    }
    let want = {
        let redb = HistoryStore::open_in(dir.path()).unwrap();
        let want: Vec<Vec<(i64, f64)>> =
            sensors.iter().map(|s| values(&redb.points(s, T0, T0 + 10_000).unwrap())).collect();
        // Switched to the database: the file's own chunks survive retention.
        let switched = redb.with_remote(Pg::start(&pg.url).unwrap().0, None).unwrap();
        let pruned = switched.prune(i64::MAX, 0).unwrap();
        assert_eq!(pruned.chunks, 0, "its own chunks are kept until migrated");
        // Cut off: the database goes away after the first batch.
        let (db, _) = Pg::start(&pg.url).unwrap();
        let mut batches = 0;
        let cut = switched.migrate_to(&db, |done, total| {
            assert!(done <= total);
            if done > 0 {
                batches += 1;
                if batches == 1 {
                    pg.down();
                }
            }
        });
        assert!(matches!(cut, Err(StoreError::Remote(_))), "{cut:?}");
        pg.up();
        want
    };
    // The binary goes on where it stopped.
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["history", "migrate", "--from", "redb", "--to", "postgres", "--data-dir"])
        .arg(dir.path())
        .env_clear()
        .env("FIELDGATE_PG_URL", &pg.url)
        .output();
    let o = tokio::time::timeout(Duration::from_secs(120), o).await.expect("migrate ends").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{stdout} {stderr}");
    assert!(stdout.contains("resumed after 2000") && stdout.contains("checked"), "{stdout}");
    assert!(stderr.contains("migrating history:") && stderr.contains("(100 %)"), "{stderr}");
    // The database alone answers what redb did.
    let fresh = tempfile::tempdir().unwrap();
    let other = pg_store(&pg, fresh.path());
    for (s, w) in sensors.iter().zip(&want).step_by(97) {
        assert_eq!(&values(&other.points(s, T0, T0 + 10_000).unwrap()), w, "{s}");
    }
    assert_eq!(values(&other.points("A_LINE1_001", T0, T0 + 10_000).unwrap()), [(T0 + 5000, 42.0)]);
    // Migrated: retention may have the file's chunks now.
    let done =
        HistoryStore::open_in(dir.path()).unwrap().with_remote(Pg::start(&pg.url).unwrap().0, None).unwrap();
    assert!(done.prune(i64::MAX, 0).unwrap().chunks > 0);
    // Bad requests say what is wrong.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["history", "migrate", "--from", "postgres", "--to", "redb", "--data-dir"])
        .arg(dir.path())
        .env_clear()
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--from redb --to postgres"));
}

/// Two hubs (two data directories) writing one database at once never clash: each reads
/// back its own sensors, and a sensor both wrote (a mistake of sharding) keeps both hubs'
/// points, one per instant.
#[tokio::test(flavor = "multi_thread")]
async fn two_hubs_share_one_database() {
    let pg = Postgres::start();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (hub_a, hub_b) = (pg_store(&pg, a.path()), pg_store(&pg, b.path()));
    for i in 0..3_000i64 {
        hub_a.append("A_LINE1_001", &float(T0 + i * 1000, 1.0));
        hub_b.append("B_PRESS_001", &float(T0 + i * 1000, 2.0));
        hub_a.append("C_SHARED_001", &float(T0 + i * 2000, 3.0));
        hub_b.append("C_SHARED_001", &float(T0 + i * 2000 + 1000, 4.0));
        if i % 500 == 0 {
            let (ra, rb) = std::thread::scope(|s| {
                let ta = s.spawn(|| hub_a.flush().and_then(|_| hub_a.ship()));
                let tb = s.spawn(|| hub_b.flush().and_then(|_| hub_b.ship()));
                (ta.join().unwrap(), tb.join().unwrap())
            });
            ra.unwrap();
            rb.unwrap();
        }
    }
    for h in [&hub_a, &hub_b] {
        h.flush_all().unwrap();
        h.ship().unwrap();
    }
    let fresh = tempfile::tempdir().unwrap();
    let reader = pg_store(&pg, fresh.path());
    let all = |s: &str| values(&reader.points(s, T0, T0 + 10_000_000).unwrap());
    assert_eq!(all("A_LINE1_001").len(), 3_000);
    assert_eq!(all("B_PRESS_001").len(), 3_000);
    let shared = all("C_SHARED_001");
    assert_eq!(shared.len(), 6_000, "both hubs' points");
    assert!(shared.windows(2).all(|w| w[0].0 < w[1].0), "one per instant, in order");
    let sensors: i64 =
        pg.client().await.query_one("SELECT count(*) FROM fieldgate_sensors", &[]).await.unwrap().get(0);
    assert_eq!(sensors, 3, "one catalogue entry per sensor");
}

/// `sslmode=require` in the URL: TLS to the database, its certificate checked against the
/// system's authorities and `history.postgres_ca_file`'s; not trusted, no connection (and
/// no URL in the message); without `sslmode`, a plain connection.
#[tokio::test(flavor = "multi_thread")]
async fn tls_to_postgres_when_the_url_requires_it() {
    let certs = tempfile::tempdir().unwrap();
    let ca = super::tls::TestCa::new();
    let (cert, key) = ca.server(certs.path(), "db", &["localhost", "127.0.0.1"], (-1, 30));
    let ca_file = ca.write(certs.path());
    let (pg, port) = Postgres::start_tls(&cert, &key);
    let plain_base = format!("host=127.0.0.1 port={port} user=fieldgate dbname=postgres");
    let url = format!("{plain_base} sslmode=require");
    let (db, problem) = Pg::start_with(&url, Some(&ca_file)).unwrap();
    assert_eq!(problem, None, "connected over TLS");
    let dir = tempfile::tempdir().unwrap();
    let store = HistoryStore::open_in(dir.path()).unwrap().with_remote(db, None).unwrap();
    store.append("A_LINE1_001", &float(T0, 1.0));
    store.flush_all().unwrap();
    assert_eq!(store.ship().unwrap(), 1);
    let tls: i64 = pg
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'fieldgate' AND s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(tls >= 1, "fieldgate's connection is TLS");
    // A CA that did not sign the server's certificate: refused, the reason short.
    let other_dir = tempfile::tempdir().unwrap();
    let other = super::tls::TestCa::new().write(other_dir.path());
    let (_, problem) = Pg::start_with(&url, Some(&other)).unwrap();
    let problem = problem.expect("not trusted");
    assert!(
        matches!(problem, PgError::Connect(_)) && !problem.to_string().contains("fieldgate dbname"),
        "{problem}"
    );
    // A mode fieldgate does not implement is refused, not taken for another.
    assert_eq!(Pg::start(&format!("{plain_base} sslmode=verify-full")).err(), Some(PgError::Url));
    // Without sslmode: plain.
    let plain = format!("host=127.0.0.1 port={port} user=fieldgate dbname=postgres");
    assert_eq!(Pg::start(&plain).unwrap().1, None);
}

/// Regression (the adversarial walk): a second data directory with the same sensors
/// migrated into the same database passes its check (each file's chunks have an ID of
/// their own); a migration cut off against one database starts over against another; a
/// file migrated before it was switched to the database is not taken for unmigrated.
#[tokio::test(flavor = "multi_thread")]
async fn migrations_of_two_directories_and_to_two_databases_are_each_their_own() {
    let (pg, other_pg) = (Postgres::start(), Postgres::start());
    let fill = |dir: &Path, base: f64| {
        let s = HistoryStore::open_in(dir).unwrap();
        for i in 0..50i64 {
            s.append("A_LINE1_001", &float(T0 + i * 1000, base + i as f64));
        }
        s.flush_all().unwrap();
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fill(a.path(), 0.0);
    fill(b.path(), 1000.0);
    let db = Pg::start(&pg.url).unwrap().0;
    let first = HistoryStore::open_in(a.path()).unwrap().migrate_to(&db, |_, _| {}).unwrap();
    let second = HistoryStore::open_in(b.path()).unwrap().migrate_to(&db, |_, _| {}).unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!((first.chunks, second.chunks, second.resumed_after), (1, 1, 0));
    // Both files' points are there, one per instant (the chunk that begins first, then by ID).
    let fresh = tempfile::tempdir().unwrap();
    assert_eq!(pg_store(&pg, fresh.path()).points("A_LINE1_001", T0, T0 + 100_000).unwrap().len(), 50);
    // The same file into another database: everything again, not "resumed".
    let db2 = Pg::start(&other_pg.url).unwrap().0;
    let again = HistoryStore::open_in(a.path()).unwrap().migrate_to(&db2, |_, _| {}).unwrap();
    assert_eq!((again.chunks, again.resumed_after), (1, 0));
    // Migrated, then switched: nothing is held back from retention as unmigrated.
    let switched =
        HistoryStore::open_in(a.path()).unwrap().with_remote(Pg::start(&pg.url).unwrap().0, None).unwrap();
    assert!(switched.prune(i64::MAX, 0).unwrap().chunks > 0);
}

/// Regression (the adversarial walk): a day's partition dropped behind fieldgate's back
/// failed every shipment until a reconnect; the next shipment makes it again.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_dropped_behind_its_back_is_made_again() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().unwrap();
    let store = pg_store(&pg, dir.path());
    store.append("A_LINE1_001", &float(T0, 1.0));
    store.flush_all().unwrap();
    store.ship().unwrap();
    let day = T0.div_euclid(86_400_000);
    pg.client().await.batch_execute(&format!("DROP TABLE fieldgate_chunks_d{day}")).await.unwrap();
    store.append("A_LINE1_001", &float(T0 + 1000, 2.0));
    store.flush_all().unwrap();
    let shipped = (0..2).find_map(|_| store.ship().ok().filter(|n| *n > 0));
    assert!(shipped.is_some(), "shipped again by the second attempt at most");
    // The open chunk's new snapshot holds both points: the dropped day is whole again.
    let fresh = tempfile::tempdir().unwrap();
    let got = values(&pg_store(&pg, fresh.path()).points("A_LINE1_001", T0, T0 + 10_000).unwrap());
    assert_eq!(got, [(T0, 1.0), (T0 + 1000, 2.0)]);
}
