//! A device that stalls (a request gets no reply and the connection goes silent behind
//! it), answers busy, or dies and comes back, against the simulator over real sockets.
//! What must hold: a stall is one event for the breaker, not a failure of every call
//! queued behind it; the retry limit counts what a caller did; fieldgate sees recovery by
//! probing the device itself. Counts and outcomes only: latency is for the benches.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::registry::{DataType, Registry, SensorSource};
use fieldgate::tools::{ErrorCode, ToolService};
use fieldgate_sim::{Faults, Scenario, SimValue, Wave};
use serde_json::{Value, json};

use super::support::*;

/// The demo plant with `timeout_ms` on every device, nothing polled (so every device
/// request in a test is a call's or a probe's), and a distinct constant per sensor (so a
/// reply meant for another request shows as a wrong value).
fn quiet_plant_dir(timeout_ms: u64) -> (tempfile::TempDir, Scenario) {
    let dir = tempfile::tempdir().unwrap();
    for path in fieldgate::registry::device_files(&demo_dir()).unwrap() {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out = String::new();
        for line in text.lines() {
            if line.starts_with("timeout_ms") {
                out.push_str(&format!("timeout_ms = {timeout_ms}\n"));
            } else if line.starts_with("poll_interval_ms") {
                out.push_str("poll_interval_ms = 0\n");
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        std::fs::write(dir.path().join(path.file_name().unwrap()), out).unwrap();
    }
    let registry = Registry::load(dir.path()).unwrap();
    let mut scenario = Scenario::default();
    for (i, s) in registry.sensors().iter().enumerate() {
        let wave = match &s.source {
            SensorSource::Modbus(p) if p.data_type == DataType::String => {
                Wave::Text { text: format!("S{i:03}") }
            }
            _ => Wave::Constant { value: 1.5 + i as f64 * 2.0 },
        };
        scenario.sensors.insert(s.id.to_string(), wave);
    }
    (dir, scenario)
}

pub struct Quiet {
    pub plant: Plant,
    _dir: tempfile::TempDir,
    /// The numeric sensors of a-line1-plc and the value each must read.
    pub line1: Vec<(String, SimValue)>,
}

pub async fn quiet_plant(timeout_ms: u64, config: Config) -> Quiet {
    let (dir, scenario) = quiet_plant_dir(timeout_ms);
    let plant = plant_with(dir.path(), scenario, config).await;
    plant.sim.freeze(Some(100.0));
    let line1 = plant
        .service
        .registry()
        .sensors_of_device(&"a-line1-plc".parse().unwrap())
        .map(|s| s.id.to_string())
        .filter_map(|id| plant.sim.expected(&id).map(|v| (id, v)))
        .filter(|(_, v)| matches!(v, SimValue::Num(_)))
        .collect();
    Quiet { plant, _dir: dir, line1 }
}

pub fn is_right(reading: &Value, want: &SimValue) -> bool {
    match want {
        SimValue::Num(w) => {
            reading["value"].as_f64().is_some_and(|g| (g - w).abs() <= 1e-6 * w.abs().max(1.0))
        }
        SimValue::Bool(w) => reading["value"].as_bool() == Some(*w),
        SimValue::Text(w) => reading["value"].as_str() == Some(w.as_str()),
    }
}

async fn status(service: &ToolService, device: &str) -> Value {
    let args = json!({ "device_id": device });
    service.call("get_device_status", args).await.unwrap().json()["devices"][0].clone()
}

/// Waits (bounded) until `check` holds: [`wait_until`] with the arguments in this file's order.
async fn eventually<F, Fut>(within: Duration, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until(what, within, check).await;
}

#[derive(Default, Debug)]
struct Outcomes {
    ok: usize,
    wrong: Vec<String>,
    codes: HashMap<String, usize>,
    /// Errors that are not retryable structured answers with `retry_after_ms`.
    unusable: Vec<String>,
}

/// `callers` concurrent callers, each making `calls` `get_sensor_reading` calls on a-line1-plc's
/// sensors (a fixed pseudo-random order per caller); every other caller asks only for
/// one of two sensors, so calls often share one request.
async fn hammer(q: &Quiet, callers: usize, calls: usize) -> Outcomes {
    let line1 = Arc::new(q.line1.clone());
    let mut tasks = Vec::new();
    for c in 0..callers {
        let (service, line1) = (q.plant.service.clone(), line1.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Outcomes::default();
            let mut seed = 0x2545_F491_u64.wrapping_mul(c as u64 + 7);
            for _ in 0..calls {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let choices = if c % 2 == 0 { 2 } else { line1.len() as u64 };
                let (id, want) = &line1[(seed % choices) as usize];
                let e = service.call("get_sensor_reading", json!({ "sensor_id": id })).await.unwrap();
                match &e.error {
                    None => {
                        let reading = e.json();
                        if is_right(&reading, want) {
                            out.ok += 1;
                        } else {
                            out.wrong.push(format!("{id}: {} not {want:?}", reading["value"]));
                        }
                    }
                    Some(err) => {
                        *out.codes.entry(err.code.as_str().to_string()).or_default() += 1;
                        if !err.retryable || err.retry_after_ms.is_none() {
                            out.unusable.push(format!("{id}: {err:?}"));
                        }
                    }
                }
            }
            out
        }));
    }
    let mut all = Outcomes::default();
    for t in tasks {
        let o = t.await.unwrap();
        all.ok += o.ok;
        all.wrong.extend(o.wrong);
        all.unusable.extend(o.unusable);
        for (k, v) in o.codes {
            *all.codes.entry(k).or_default() += v;
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_with_eight_concurrent_callers_fails_none_of_them_and_opens_no_breaker() {
    // A generous deadline: a 2-core box running other tests can starve a caller's own
    // turn; what is tested is that the stall itself fails nobody. Stalls are random (8 %
    // of requests): a call whose own request stalls on every attempt fails honestly, and
    // with the default three attempts that is about 0.08^3 per call, a few percent of
    // runs of 200 calls. Six attempts (the most a config allows) make that about 4e-5 per
    // run, so a failure here is a stall charged to a call that only waited behind it. (A
    // caller that joined a stalled request resends it without spending an attempt; see
    // `modbus::link`.)
    let mut config = Config::default();
    config.calls.deadline_ms = 6000;
    config.calls.max_retries = 5;
    let q = quiet_plant(150, config).await;
    q.plant.faults("a-line1-plc", Faults { stall: 0.08, stall_ms: 30_000, ..Default::default() });
    let out = hammer(&q, 8, 25).await;
    let stalls = q.plant.sim.stats("a-line1-plc").unwrap().stalls;
    assert!(stalls >= 1, "the device never stalled");
    assert!(out.wrong.is_empty(), "{:?}", out.wrong);
    assert_eq!(out.ok, 200, "{stalls} stalls: {:?}", out.codes);
    let d = status(&q.plant.service, "a-line1-plc").await;
    assert_eq!(d["breaker"]["state"], "closed", "{d}");
    // One stalled request is one failure, however many calls waited on it.
    let failures = d["failures"].as_u64().unwrap();
    assert!(failures <= stalls, "{failures} failures recorded for {stalls} stalls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_answers_are_retried_inside_the_call() {
    let q = quiet_plant(150, Config::default()).await;
    q.plant
        .faults("a-line1-plc", Faults { exception_code: Some(6), exception_rate: 0.2, ..Default::default() });
    let mut ok = 0;
    let mut retried = 0;
    for (id, _) in q.line1.iter().cycle().take(60) {
        let e = q.plant.call("get_sensor_reading", json!({ "sensor_id": id })).await;
        if e.ok {
            ok += 1;
            retried += usize::from(e.meta.attempts > 1);
        }
    }
    // A call fails only when all three attempts are answered busy (0.8 % each).
    assert!(ok >= 57, "{ok} of 60");
    assert!(retried >= 1, "no call needed a retry");
    assert_eq!(status(&q.plant.service, "a-line1-plc").await["breaker"]["state"], "closed");
}

/// A caller that ignores `retry_after_ms` is blocked after the limit; once the device is
/// back, fieldgate's own probe (no agent traffic at all) closes the breaker and lifts
/// the block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_caller_is_unblocked_by_the_background_probe_after_the_device_returns() {
    let mut config = Config::default();
    config.breaker.open_ms = 500;
    config.breaker.max_open_ms = 2000;
    let q = quiet_plant(150, config).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let tasks = fieldgate::poller::start(&q.plant.service.core(), stop.clone());
    let call = json!({ "sensor_id": "A_UTIL_001" });
    assert!(q.plant.call("get_sensor_reading", call.clone()).await.ok);
    q.plant.faults("a-util-meter", Faults { down: true, ..Default::default() });
    let mut codes = Vec::new();
    for _ in 0..10 {
        let e = q.plant.call("get_sensor_reading", call.clone()).await;
        let code = e.error.unwrap().code;
        codes.push(code);
        if code == ErrorCode::RetryLimitReached {
            break;
        }
    }
    assert_eq!(codes.last(), Some(&ErrorCode::RetryLimitReached), "{codes:?}");
    // Another caller that waits as told is never blocked by fieldgate's own fail-fast.
    let patient = json!({ "sensor_id": "A_UTIL_002" });
    for _ in 0..4 {
        let e = q.plant.call("get_sensor_reading", patient.clone()).await;
        let err = e.error.unwrap();
        assert_ne!(err.code, ErrorCode::RetryLimitReached, "{err:?}");
        tokio::time::sleep(Duration::from_millis(err.retry_after_ms.unwrap())).await;
    }
    let d = status(&q.plant.service, "a-util-meter").await;
    assert_eq!(d["state"], "down", "{d}");
    assert!(d["down_since"].is_string() && d["breaker"]["next_probe_at"].is_string(), "{d}");
    let requests = q.plant.sim.stats("a-util-meter").unwrap().requests;
    q.plant.faults("a-util-meter", Faults::default());
    // No call at all until the breaker closed: only fieldgate's probe can have done it.
    eventually(Duration::from_secs(5), "the breaker to close", || async {
        status(&q.plant.service, "a-util-meter").await["breaker"]["state"] == "closed"
    })
    .await;
    let probes = q.plant.sim.stats("a-util-meter").unwrap().requests - requests;
    assert!((1..=2).contains(&probes), "{probes} probe requests");
    let e = q.plant.call("get_sensor_reading", call).await;
    assert!(e.ok, "the block was lifted: {:?}", e.error);
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Killed and brought back on the same port: the breaker opens within its threshold,
/// refusals make no device attempt, and a caller that waits what `retry_after_ms` says
/// reads the device again within three calls of its return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_device_fails_fast_and_is_read_again_within_three_patient_calls_of_its_return() {
    let mut config = Config::default();
    config.breaker.open_ms = 1000;
    config.breaker.max_open_ms = 4000;
    let q = quiet_plant(150, config).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let tasks = fieldgate::poller::start(&q.plant.service.core(), stop.clone());
    q.plant.faults("a-util-meter", Faults { down: true, ..Default::default() });
    // Different sensors, so the retry limit plays no part: the breaker opens on the
    // device's failures, at most failure_threshold (5) of them.
    let mut reached = 0;
    for id in ["A_UTIL_001", "A_UTIL_002", "A_UTIL_003", "A_UTIL_004", "A_UTIL_005", "A_UTIL_006"] {
        let e = q.plant.call("get_sensor_reading", json!({ "sensor_id": id })).await;
        reached += e.meta.attempts;
    }
    assert!(reached <= 5, "{reached} device attempts before the breaker opened");
    let e = q.plant.call("get_sensor_reading", json!({ "sensor_id": "A_UTIL_007" })).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, e.meta.attempts), (ErrorCode::CircuitOpen, 0));
    assert!(err.retry_after_ms.is_some_and(|ms| ms <= 4000));
    let d = status(&q.plant.service, "a-util-meter").await;
    assert_eq!(d["last_error"]["code"], "DEVICE_UNAVAILABLE", "{d}");
    // Down until a probe has failed (observed: the failures count on), then back.
    let opened_with = d["breaker"]["consecutive_failures"].as_u64().unwrap();
    eventually(Duration::from_secs(30), "a probe to fail while the device is down", || async {
        status(&q.plant.service, "a-util-meter").await["breaker"]["consecutive_failures"]
            .as_u64()
            .is_some_and(|n| n > opened_with)
    })
    .await;
    q.plant.faults("a-util-meter", Faults::default());
    // As a well-behaved agent: call, and when refused wait what retry_after_ms says. The
    // device is read again within three such calls (the current open period, then one
    // probe): counted, not timed.
    let mut first_good = None;
    for calls in 1..=3 {
        let e = q.plant.call("get_sensor_reading", json!({ "sensor_id": "A_UTIL_001" })).await;
        if e.ok {
            first_good = Some(calls);
            break;
        }
        let err = e.error.unwrap();
        assert!(err.retryable, "{err:?}");
        tokio::time::sleep(Duration::from_millis(err.retry_after_ms.unwrap_or(100))).await;
    }
    assert!(first_good.is_some(), "not read again within three calls that waited as told");
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
}
