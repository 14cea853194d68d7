//! `get_sensor_history` over the store, and the poller filling it from the simulator.

use std::collections::BTreeMap;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, TimeZone, Utc};
use fieldgate::store::gorilla::{Point, Stored};
use fieldgate::tools::{ErrorCode, ToolService};
use fieldgate_sim::{Scenario, Wave};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::support::*;

fn iso(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms).unwrap().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Where the store keeps history: the query tests run on both (the same answers).
#[derive(Debug, Clone, Copy)]
enum Backend {
    Redb,
    Postgres,
}

const BACKENDS: [Backend; 2] = [Backend::Redb, Backend::Postgres];

/// A service over a store of one backend, with what that store needs kept alive.
struct Backed {
    svc: ToolService,
    _pg: Option<(super::pg::Postgres, tempfile::TempDir)>,
}

impl std::ops::Deref for Backed {
    type Target = ToolService;
    fn deref(&self) -> &ToolService {
        &self.svc
    }
}

/// A service whose store holds `points` of A_LINE1_001 (f32, no scaling), in redb.
fn with_points(points: &[(i64, f64)]) -> Backed {
    with_points_on(Backend::Redb, points)
}

/// The same in `backend`. With PostgreSQL the points are written by one store and read
/// through another over a fresh data directory: every read is the database's.
fn with_points_on(backend: Backend, points: &[(i64, f64)]) -> Backed {
    let fill = |store: &fieldgate::store::HistoryStore| {
        for (t, v) in points {
            store.append("A_LINE1_001", &Point { t: *t, value: Stored::Float(*v), quality: 0 });
        }
        store.flush_all().unwrap();
        store.ship().unwrap();
    };
    match backend {
        Backend::Redb => {
            let svc = service();
            fill(svc.history().unwrap());
            Backed { svc, _pg: None }
        }
        Backend::Postgres => {
            let pg = super::pg::Postgres::start();
            let (writer, reader) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let store = super::pg::pg_store(&pg, writer.path());
            fill(&store);
            assert_eq!(store.remote_stats().unwrap().waiting, 0, "all in the database");
            let store = super::pg::pg_store(&pg, reader.path());
            let svc = ToolService::with_history(
                Arc::new(demo_registry()),
                Default::default(),
                Some(Arc::new(store)),
            );
            Backed { svc, _pg: Some((pg, reader)) }
        }
    }
}

/// A cursor of the query `from` (sensor A_LINE1_001, no `to`, no bucket) whose pinned range
/// starts at `range_from`, with the right query fingerprint but no tag of this service: what
/// someone editing a cursor by hand could send.
fn forged_cursor(from: &str, range_from: i64) -> String {
    use base64::Engine;
    let query = format!("A_LINE1_001|{from}|None|None");
    let f =
        query.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let now = chrono::Utc::now().timestamp_millis();
    let json = json!({"f": f, "t": 0, "from": range_from, "to": now});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
}

async fn history(svc: &ToolService, args: Value) -> fieldgate::tools::Envelope {
    svc.call("get_sensor_history", args).await.unwrap()
}

const T0: i64 = 1_790_000_000_000; // 2026-09-21

#[tokio::test]
async fn arguments_are_checked_in_the_domain() {
    let svc = with_points(&[]);
    let base = json!({"sensor_id": "A_LINE1_001"});
    // Each refusal's exact message and `expected`: a fragment could match a message that
    // names the wrong problem.
    let instant = "an RFC 3339 instant with a zone (2026-11-29T08:00:00Z), now, or a duration before now (-15m, -2h, -7d, PT15M, P1D)";
    for (args, param, message, expected) in [
        (json!({"from": "yesterday"}), "from", "`from` is not an instant fieldgate understands.", instant),
        (
            json!({"from": "2026-02-30T00:00:00Z"}),
            "from",
            "`from` is not an instant fieldgate understands.",
            instant,
        ),
        (
            json!({"from": "2026-11-29T10:00:00Z", "to": "2026-11-29T09:00:00Z"}),
            "from",
            "`from` must be before `to`.",
            "an instant before `to`",
        ),
        (
            json!({"from": "2026-11-29T10:00:00Z", "to": "2099-01-01T00:00:00Z"}),
            "to",
            "`to` is in the future.",
            "an instant not in the future",
        ),
        (
            json!({"from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z"}),
            "to",
            "Raw points are limited to 7 days per call.",
            "at most 7 days after `from` for raw points",
        ),
        (
            json!({"from": "2000-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z", "bucket": "1s"}),
            "bucket",
            "This range has too many buckets of that width.",
            "a width giving at most 100000 buckets over the range",
        ),
        (
            json!({"from": "2026-11-29T00:00:00Z", "bucket": "5w"}),
            "bucket",
            "`bucket` is not in the expected format.",
            "a string matching ^[1-9][0-9]{0,3}[smhd]$",
        ),
        (json!({"from": "2026-11-29T00:00:00Z", "limit": 5001}), "limit", "`limit` is too large.", "<= 5000"),
        // Absurd instants: no wrap of `to - from` past the 7-day limit (it was bypassed).
        (
            json!({"from": "-9223372036854775807ms"}),
            "from",
            "`from` is before 1970-01-01T00:00:00Z.",
            "an instant from 1970-01-01T00:00:00Z to now",
        ),
        (
            json!({"from": "1601-01-01T00:00:00Z", "to": "1601-01-02T00:00:00Z"}),
            "from",
            "`from` is before 1970-01-01T00:00:00Z.",
            "an instant from 1970-01-01T00:00:00Z to now",
        ),
        (
            json!({"from": "2026-11-29T00:00:00Z", "cursor": forged_cursor("2026-11-29T00:00:00Z", i64::MIN + 1)}),
            "cursor",
            "`cursor` is not a cursor this service issued.",
            "the next_cursor of the previous page of this query",
        ),
        (
            json!({"from": "2026-11-29T00:00:00Z", "cursor": "nope"}),
            "cursor",
            "`cursor` is not a cursor this service issued.",
            "the next_cursor of the previous page of this query",
        ),
    ] {
        let mut a = base.clone();
        a.as_object_mut().unwrap().extend(args.as_object().unwrap().clone());
        let err = history(&svc, a.clone()).await.error.unwrap();
        assert_eq!(err.code, ErrorCode::InvalidArgument, "{a}");
        assert_eq!(err.parameter.as_deref(), Some(param), "{a}: {err:?}");
        assert_eq!(err.message, message, "{a}");
        assert_eq!(err.expected.as_deref(), Some(expected), "{a}");
    }
    // The 7-day limit points at buckets.
    let err = history(
        &svc,
        json!({"sensor_id": "A_LINE1_001", "from": "2026-01-01T00:00:00Z", "to": "2026-02-01T00:00:00Z"}),
    )
    .await
    .error
    .unwrap();
    assert!(err.hint.contains("bucket"));
    // Unknown sensors are layer 3.
    let err = history(&svc, json!({"sensor_id": "A_LINE1_099", "from": "2026-11-29T00:00:00Z"}))
        .await
        .error
        .unwrap();
    assert_eq!(err.code, ErrorCode::SensorNotFound);
}

#[tokio::test]
async fn an_empty_range_is_a_success_with_no_points() {
    for backend in BACKENDS {
        let svc = with_points_on(backend, &[(T0, 1.0)]);
        let e =
            history(&svc, json!({"sensor_id": "A_LINE1_001", "from": iso(T0 + 1000), "to": iso(T0 + 2000)}))
                .await;
        assert!(e.ok, "{:?}", e.error);
        let d = e.json();
        assert_eq!(d["points"].as_array().unwrap().len(), 0);
        assert_eq!(d["first_sample"], Value::Null);
        assert_eq!(d["complete"], true);
    }
}

fn series(n: usize, seed: u64) -> Vec<(i64, f64)> {
    let mut t = T0;
    let mut x = seed | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += 500 + (x % 3000) as i64;
            (t, ((i as f64) * 0.1).sin() * 10.0 + (x % 100) as f64 / 10.0)
        })
        .collect()
}

#[tokio::test]
async fn raw_paging_returns_every_point_exactly_once() {
    for backend in BACKENDS {
        let pts = series(2345, 7);
        let svc = with_points_on(backend, &pts);
        let (from, to) = (pts[100].0, pts[2000].0);
        let mut args = json!({"sensor_id": "A_LINE1_001", "from": iso(from), "to": iso(to), "limit": 333});
        let mut got = Vec::new();
        for page in 0.. {
            assert!(page < 100, "paging does not end");
            let d = history(&svc, args.clone()).await.json();
            got.extend(
                d["points"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p["t"].as_str().unwrap().to_string(), p["value"].as_f64().unwrap())),
            );
            match d["next_cursor"].as_str() {
                Some(c) => args["cursor"] = json!(c),
                None => break,
            }
        }
        let want: Vec<(String, f64)> =
            pts.iter().filter(|(t, _)| *t >= from && *t < to).map(|(t, v)| (iso(*t), *v)).collect();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.0, w.0);
            assert!((g.1 - w.1).abs() < 1e-6 * w.1.abs().max(1.0), "{g:?} {w:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn buckets_agree_with_a_naive_reference(n in 1usize..2000, seed in any::<u64>(), width in prop::sample::select(vec![("30s", 30_000i64), ("5m", 300_000), ("1h", 3_600_000)]), limit in 1u32..40) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let pts = series(n, seed);
        let svc = with_points(&pts);
        let (from, to) = (T0, pts.last().unwrap().0 + 1);
        // The reference: buckets aligned to the epoch, values as f32 (the sensor's type).
        let mut want: BTreeMap<i64, (u64, f64, f64, f64, f64, f64)> = BTreeMap::new();
        for (t, v) in &pts {
            let v = f64::from(*v as f32);
            let e = want.entry(t.div_euclid(width.1) * width.1).or_insert((0, f64::MAX, f64::MIN, 0.0, v, v));
            e.0 += 1;
            e.1 = e.1.min(v);
            e.2 = e.2.max(v);
            e.3 += v;
            e.5 = v;
        }
        let mut args = json!({"sensor_id": "A_LINE1_001", "from": iso(from), "to": iso(to), "bucket": width.0, "limit": limit});
        let mut got = Vec::new();
        for page in 0.. {
            prop_assert!(page <= want.len(), "paging does not end");
            let d = rt.block_on(history(&svc, args.clone())).json();
            got.extend(d["buckets"].as_array().unwrap().clone());
            match d["next_cursor"].as_str() {
                Some(c) => args["cursor"] = json!(c),
                None => break,
            }
        }
        prop_assert_eq!(got.len(), want.len());
        let close = |a: &Value, b: f64| (a.as_f64().unwrap() - b).abs() <= 1e-5 * b.abs().max(1.0);
        for (g, (start, w)) in got.iter().zip(&want) {
            prop_assert_eq!(g["start"].as_str().unwrap(), iso(*start));
            prop_assert_eq!(g["count"].as_u64().unwrap(), w.0);
            prop_assert!(close(&g["min"], w.1) && close(&g["max"], w.2), "{} {:?}", g, w);
            prop_assert!(close(&g["avg"], w.3 / w.0 as f64) && close(&g["first"], w.4) && close(&g["last"], w.5), "{} {:?}", g, w);
        }
    }
}

#[tokio::test]
async fn gaps_and_the_covered_range_are_reported() {
    for backend in BACKENDS {
        // Poll interval 1 s, max silence 60 s: a gap is over 63 s without points.
        let mut pts: Vec<(i64, f64)> = (0..10).map(|i| (T0 + i * 1000, 1.0)).collect();
        pts.extend((0..10).map(|i| (T0 + 200_000 + i * 1000, 2.0)));
        let svc = with_points_on(backend, &pts);
        let d = history(
            &svc,
            json!({"sensor_id": "A_LINE1_001", "from": iso(T0 - 5000), "to": iso(T0 + 300_000)}),
        )
        .await
        .json();
        assert_eq!(d["gaps"], json!([{"from": iso(T0 + 9000), "to": iso(T0 + 200_000)}]));
        assert_eq!(d["first_sample"], json!(iso(T0)));
        assert_eq!(d["last_sample"], json!(iso(T0 + 209_000)));
    }
}

#[tokio::test]
async fn scaled_sensors_are_stored_raw_and_read_in_units() {
    let svc = service();
    let store = svc.history().unwrap();
    // A_LINE1_003: i16 with scale 0.1; the register held 723.
    store.append("A_LINE1_003", &Point { t: T0, value: Stored::Int(723), quality: 0 });
    let d = history(&svc, json!({"sensor_id": "A_LINE1_003", "from": iso(T0 - 1), "to": iso(T0 + 1)}))
        .await
        .json();
    assert_eq!(d["points"][0]["value"], 72.3);
    assert_eq!(d["unit"], "degC");
}

#[test]
fn deadband_and_max_silence_decide_what_is_stored() {
    use fieldgate::reading::record::worth_storing;
    let r = demo_registry();
    let with_band = r.sensor(&"A_LINE1_007".parse().unwrap()).unwrap(); // deadband 0.5 %
    assert_eq!(with_band.deadband, Some(0.5));
    let v = |x: f64| Stored::Float(x);
    assert!(worth_storing(with_band, None, 0, &v(50.0), 0, 60_000), "the first point");
    assert!(
        !worth_storing(with_band, Some((0, &v(50.0), 0)), 1000, &v(50.3), 0, 60_000),
        "inside the deadband"
    );
    assert!(
        worth_storing(with_band, Some((0, &v(50.0), 0)), 1000, &v(50.5), 0, 60_000),
        "moved by the deadband"
    );
    assert!(worth_storing(with_band, Some((0, &v(50.0), 0)), 60_000, &v(50.0), 0, 60_000), "max silence");
    assert!(worth_storing(with_band, Some((0, &v(50.0), 0)), 1000, &v(50.0), 2, 60_000), "quality changed");
    let without = r.sensor(&"A_LINE1_004".parse().unwrap()).unwrap(); // no deadband: every sample
    assert!(worth_storing(without, Some((0, &Stored::Int(5), 0)), 1000, &Stored::Int(5), 0, 60_000));
    // Scaled: A_LINE1_003 (i16, scale 0.1, deadband 0.2 degC): 2 raw steps = 0.2.
    let scaled = r.sensor(&"A_LINE1_003".parse().unwrap()).unwrap();
    assert!(!worth_storing(scaled, Some((0, &Stored::Int(700), 0)), 1000, &Stored::Int(701), 0, 60_000));
    assert!(worth_storing(scaled, Some((0, &Stored::Int(700), 0)), 1000, &Stored::Int(702), 0, 60_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_fills_history_that_matches_the_simulator() {
    // The demo plant polled every 50 ms, with breakers that do not open: a starved 2-core
    // box misses a 50 ms round's deadline now and then, and an open breaker would stop
    // the polling this test watches.
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("poll_interval_ms = 1000", "poll_interval_ms = 50")
            .replace("poll_interval_ms = 2000", "poll_interval_ms = 50")
            .replace("failure_threshold = 3", "failure_threshold = 1000");
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    let mut scenario = Scenario::default();
    scenario.sensors.insert("A_LINE1_004".into(), Wave::Constant { value: 12.34 }); // u16 scale 0.01, no deadband
    scenario.sensors.insert("A_UTIL_001".into(), Wave::Constant { value: 230.5 }); // f32 CDAB, deadband 0.5
    scenario.sensors.insert("B_BOILER_011".into(), Wave::Constant { value: -7.5 }); // i32 DCBA
    let mut config = fieldgate::config::Config::default();
    config.breaker.failure_threshold = 1000;
    config.breaker.failure_rate_percent = 100;
    let plant = plant_with(dir.path(), scenario, config).await;
    plant.sim.freeze(Some(1.0));
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&plant.service.core(), stop.clone());
    let started = Utc::now().timestamp_millis();
    // Wait until the first values are stored (observed, not slept for).
    let store = plant.service.history().unwrap().clone();
    let count = |sensor: &str| store.points(sensor, started, i64::MAX).unwrap().len();
    let limit = Duration::from_secs(60);
    wait_until("the first meter, pump and boiler points", limit, || {
        ready(count("A_UTIL_001") >= 1 && count("A_LINE1_004") >= 5 && count("B_BOILER_011") >= 1)
    })
    .await;
    // The meter value changes by less than its deadband, then by more.
    plant.sim.set_wave("A_UTIL_001", Wave::Constant { value: 230.7 });
    let n_before = count("A_LINE1_004");
    wait_until("5 more pump points after a change inside the deadband", limit, || {
        ready(count("A_LINE1_004") >= n_before + 5)
    })
    .await;
    plant.sim.set_wave("A_UTIL_001", Wave::Constant { value: 231.5 });
    wait_until("a second meter point after a change beyond the deadband", limit, || {
        ready(count("A_UTIL_001") >= 2)
    })
    .await;
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
    let now = Utc::now().timestamp_millis() + 1;
    let read = |sensor: &'static str| {
        let svc = plant.service.clone();
        async move {
            svc.call(
                "get_sensor_history",
                json!({"sensor_id": sensor, "from": iso(started - 1000), "to": iso(now)}),
            )
            .await
            .unwrap()
            .json()
        }
    };
    let pump = read("A_LINE1_004").await;
    let values: Vec<f64> =
        pump["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect();
    assert!(values.len() >= 10 && values.iter().all(|v| *v == 12.34), "{values:?}");
    let meter = read("A_UTIL_001").await;
    let values: Vec<f64> =
        meter["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect();
    // 230.5 stored once; 230.7 was inside the 0.5 V deadband; 231.5 was not.
    assert_eq!(values, [230.5, 231.5]);
    let boiler = read("B_BOILER_011").await;
    let values: Vec<f64> =
        boiler["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect();
    // Waited for above, so never vacuous: an i32 DCBA register pair read as -7.5.
    assert!(!values.is_empty() && values.iter().all(|v| *v == -7.5), "{values:?}");
    // The poller also refreshed the reading cache.
    let cached = plant
        .service
        .call("get_sensor_reading", json!({"sensor_id": "B_BOILER_011", "max_age_ms": 60000}))
        .await
        .unwrap();
    assert_eq!(cached.json()["source"], "cache");
    // And the counters are exported.
    let metrics = plant.service.render_metrics();
    assert!(metrics.contains("fieldgate_points_stored_total"), "{metrics}");
}

#[tokio::test]
async fn history_over_http() {
    let (t, v) = (Utc::now().timestamp_millis() - 60_000, 4.5);
    let svc = with_points(&[(t, v)]);
    let server = Server::start(svc.svc.clone(), fieldgate::transport::auth::Tokens::default()).await;
    let mut c = server.client().await;
    let from = iso(t - 1000).replace(':', "%3A").replace('+', "%2B");
    let r = c.get(&format!("/v1/sensors/A_LINE1_001/history?from={from}&bucket=1h")).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["data"]["buckets"][0]["count"], 1);
    let r = c.get("/v1/sensors/A_LINE1_001/history?from=nope").await.unwrap();
    assert_eq!(r.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poller_does_not_poll_a_device_whose_breaker_is_open() {
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("poll_interval_ms = 1000", "poll_interval_ms = 50")
            .replace("poll_interval_ms = 2000", "poll_interval_ms = 50")
            .replace("timeout_ms = 500", "timeout_ms = 100");
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }
    let mut config = fieldgate::config::Config::default();
    config.breaker.open_ms = 60_000;
    config.breaker.max_open_ms = 60_000;
    let plant = plant_with(dir.path(), Scenario::default(), config).await;
    plant.faults("a-util-meter", fieldgate_sim::Faults { no_reply: 1.0, ..Default::default() });
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&plant.service.core(), stop.clone());
    let status = || async {
        plant.service.call("get_device_status", json!({"device_id": "a-util-meter"})).await.unwrap().json()["devices"][0]["breaker"]["state"].clone()
    };
    wait_until("the meter's breaker to open", Duration::from_secs(30), || async { status().await == "open" })
        .await;
    let requests = plant.sim.stats("a-util-meter").unwrap().requests;
    // Let the healthy devices be polled many more times, then look again.
    let polled = |m: String| {
        m.lines()
            .find_map(|l| l.strip_prefix("fieldgate_points_polled_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = polled(plant.service.render_metrics());
    wait_until("200 more points polled from the healthy devices", Duration::from_secs(60), || {
        ready(polled(plant.service.render_metrics()) >= before + 200)
    })
    .await;
    assert_eq!(plant.sim.stats("a-util-meter").unwrap().requests, requests, "the open device was polled");
    assert_eq!(status().await, "open");
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
}

/// Issue: leaving `to` out (it means "now") broke paging, since "now" moved between pages.
/// The cursor pins the first page's range: the same arguments plus `next_cursor` continue,
/// and every point comes exactly once, also while new points keep arriving.
#[tokio::test]
async fn paging_with_to_left_out_returns_every_point_exactly_once() {
    for backend in BACKENDS {
        let now = Utc::now().timestamp_millis();
        let pts: Vec<(i64, f64)> = (0..25).map(|i| (now - 60_000 + i * 1000, i as f64)).collect();
        let svc = with_points_on(backend, &pts);
        let mut args = json!({"sensor_id": "A_LINE1_001", "from": iso(now - 120_000), "limit": 2});
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let e = history(&svc, args.clone()).await;
            let d = e.json();
            assert!(e.ok, "{d}");
            if pages == 0 {
                // A point arriving between pages is after the pinned range: not in this query.
                let store = svc.history().unwrap();
                store.append(
                    "A_LINE1_001",
                    &Point { t: Utc::now().timestamp_millis() + 1, value: Stored::Float(99.0), quality: 0 },
                );
            }
            seen.extend(d["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()));
            pages += 1;
            match d["next_cursor"].as_str() {
                Some(c) => args["cursor"] = json!(c),
                None => break,
            }
            assert!(pages < 100);
        }
        assert_eq!(seen, (0..25).map(|i| i as f64).collect::<Vec<_>>());
    }
}

/// Agents rarely know the time: `from`/`to` take `now` and durations before now, and the
/// answer states the absolute range it resolved.
#[tokio::test]
async fn relative_ranges_resolve_against_now_and_are_stated() {
    for backend in BACKENDS {
        let now = Utc::now().timestamp_millis();
        let svc = with_points_on(
            backend,
            &[(now - 90 * 60_000, 1.0), (now - 30 * 60_000, 2.0), (now - 5 * 60_000, 3.0)],
        );
        for (from, to, want) in [
            ("-1h", None, vec![2.0, 3.0]),
            ("PT2H", Some("-10m"), vec![1.0, 2.0]),
            ("-2h", Some("now"), vec![1.0, 2.0, 3.0]),
        ] {
            let mut args = json!({"sensor_id": "A_LINE1_001", "from": from});
            if let Some(to) = to {
                args["to"] = json!(to);
            }
            let d = history(&svc, args).await.json();
            let got: Vec<f64> =
                d["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect();
            assert_eq!(got, want, "{from} {to:?}: {d}");
            let resolved =
                chrono::DateTime::parse_from_rfc3339(d["from"].as_str().unwrap()).unwrap().timestamp_millis();
            assert!(
                (resolved - (now - if from == "-1h" { 3_600_000 } else { 7_200_000 })).abs() < 5_000,
                "{d}"
            );
        }
        let err = history(&svc, json!({"sensor_id": "A_LINE1_001", "from": "P1M"})).await.error.unwrap();
        assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::InvalidArgument, Some("from")));
    }
}

/// History values are rounded like live readings: no 4.243816375732422 next to a live 4.243816.
#[tokio::test]
async fn history_values_and_bucket_statistics_are_rounded_like_readings() {
    for backend in BACKENDS {
        let f32_noise = f64::from(4.243_816_f32); // 4.243816375732422
        let svc = with_points_on(
            backend,
            &[(T0, f32_noise), (T0 + 1000, f64::from(84.8_f32)), (T0 + 2000, f64::from(0.1_f32))],
        );
        let d = history(&svc, json!({"sensor_id": "A_LINE1_001", "from": iso(T0), "to": iso(T0 + 10_000)}))
            .await
            .json();
        let values: Vec<f64> =
            d["points"].as_array().unwrap().iter().map(|p| p["value"].as_f64().unwrap()).collect();
        assert_eq!(values, vec![4.243816, 84.8, 0.1], "{d}");
        let d = history(
            &svc,
            json!({"sensor_id": "A_LINE1_001", "from": iso(T0), "to": iso(T0 + 10_000), "bucket": "10s"}),
        )
        .await
        .json();
        let b = &d["buckets"][0];
        assert_eq!((b["min"].as_f64(), b["max"].as_f64()), (Some(0.1), Some(84.8)), "{b}");
        assert_eq!(b["avg"].as_f64(), Some(29.71461), "{b}");
        assert_eq!(b["first"].as_f64(), Some(4.243816), "{b}");
    }
}
