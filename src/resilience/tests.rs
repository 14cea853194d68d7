//! The read loop with a scripted driver and paused time: attempts, breaker verdicts,
//! health and probes for each kind of failure (no sockets: paused time would auto-advance
//! while tasks wait on real I/O).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::driver::RawValue;
use crate::driver::{BoxFuture, SampleQuality};
use crate::registry::{Place, SensorSource};
use breaker::SnapshotState;

/// One scripted device answer: how long it takes, then the result for every sensor asked.
struct Step {
    takes: Duration,
    result: Result<f64, DriverError>,
}

/// A driver that answers from a script (then "ok" for ever) and counts reads.
#[derive(Default)]
struct Script {
    steps: Mutex<VecDeque<Step>>,
    reads: AtomicU32,
    probes: AtomicU32,
}

impl Script {
    fn of(steps: impl IntoIterator<Item = Result<f64, DriverError>>) -> Script {
        let steps =
            steps.into_iter().map(|result| Step { takes: Duration::from_millis(10), result }).collect();
        Script { steps: Mutex::new(steps), ..Default::default() }
    }

    fn slow(steps: impl IntoIterator<Item = (u64, Result<f64, DriverError>)>) -> Script {
        let steps =
            steps.into_iter().map(|(ms, result)| Step { takes: Duration::from_millis(ms), result }).collect();
        Script { steps: Mutex::new(steps), ..Default::default() }
    }

    fn reads(&self) -> u32 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Driver for Script {
    fn read<'a>(
        &'a self,
        sensors: &'a [&'a Sensor],
        options: ReadOptions,
    ) -> BoxFuture<'a, Vec<Result<Sample, DriverError>>> {
        Box::pin(async move {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if options.probe {
                self.probes.fetch_add(1, Ordering::SeqCst);
            }
            let step = self.steps.lock().unwrap().pop_front();
            let step = step.unwrap_or(Step { takes: Duration::from_millis(10), result: Ok(1.0) });
            // Like the real drivers: never beyond the deadline.
            if tokio::time::timeout_at(options.deadline, tokio::time::sleep(step.takes)).await.is_err() {
                return vec![Err(DriverError::Timeout); sensors.len()];
            }
            let one = step.result.map(|v| Sample {
                value: RawValue::Float(v),
                at: chrono::Utc::now(),
                quality: SampleQuality::Good,
            });
            vec![one; sensors.len()]
        })
    }
}

fn device() -> DeviceId {
    "d1".parse().unwrap()
}

fn sensor() -> Sensor {
    Sensor {
        id: "A_LINE1_001".parse().unwrap(),
        device: device(),
        place: Place::UNPLACED,
        description: String::new(),
        kind: "pressure".into(),
        unit: "bar".into(),
        equipment: None,
        source: SensorSource::OpcUa { node_id: "ns=2;s=x".into() },
        range: None,
        deadband: None,
        alarms: Vec::new(),
    }
}

fn resilience(max_retries: u32) -> Resilience {
    let mut config = Config::default();
    config.calls.max_retries = max_retries;
    config.breaker.report_down_after_s = 60;
    let settings = BreakerSettings {
        failure_threshold: 5,
        failure_rate_percent: 50,
        window_size: 20,
        min_calls: 10,
        open: Duration::from_secs(5),
        max_open: Duration::from_secs(60),
    };
    Resilience::for_devices(&[device()], settings, &config)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

fn breaker(r: &Resilience) -> breaker::Snapshot {
    r.guard(&device()).unwrap().breaker.snapshot()
}

const TIMEOUT: Result<f64, DriverError> = Err(DriverError::Timeout);
const QUEUED: Result<f64, DriverError> = Err(DriverError::Queued);

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_and_the_retry_answers() {
    let r = resilience(2);
    let driver = Script::of([TIMEOUT]);
    let s = sensor();
    let (results, attempts) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert!(results[0].is_ok());
    assert_eq!((attempts, driver.reads()), (2, 2));
    assert_eq!(breaker(&r).consecutive_failures, 0, "the success ended the run of failures");
    let health = r.guard(&device()).unwrap().health.snapshot();
    assert!(health.last_success.is_some() && health.failing_since.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_call_makes_at_most_one_plus_max_retries_attempts_each_judged_once() {
    let r = resilience(2);
    let driver = Script::of([TIMEOUT; 5]);
    let s = sensor();
    let (results, attempts) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert_eq!(results[0], Err(ReadError::Driver(DriverError::Timeout)));
    assert_eq!((attempts, driver.reads()), (3, 3));
    assert_eq!(breaker(&r).consecutive_failures, 3);
    assert!(r.guard(&device()).unwrap().health.failing_since().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_request_that_never_had_its_turn_is_retried_and_blames_nobody() {
    let r = resilience(2);
    let s = sensor();
    let driver = Script::of([QUEUED, QUEUED]);
    let (results, attempts) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert!(results[0].is_ok());
    assert_eq!(attempts, 3);
    let driver = Script::of([QUEUED; 3]);
    let (results, _) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert_eq!(results[0], Err(ReadError::Driver(DriverError::Queued)));
    let b = breaker(&r);
    assert_eq!((b.consecutive_failures, b.window_failures), (0, 0), "queued requests never count");
    let health = r.guard(&device()).unwrap().health.snapshot();
    assert!(health.last_error.is_none() && health.failing_since.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_rejection_is_not_retried_and_keeps_the_breaker_closed() {
    let r = resilience(2);
    let driver = Script::of(vec![Err(DriverError::Rejected { code: 2 }); 3]);
    let s = sensor();
    let (results, attempts) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert_eq!(results[0], Err(ReadError::Driver(DriverError::Rejected { code: 2 })));
    assert_eq!((attempts, driver.reads()), (1, 1));
    assert_eq!(breaker(&r).consecutive_failures, 0);
    assert!(r.guard(&device()).unwrap().health.failing_since().is_none(), "a device that says no is alive");
}

#[tokio::test(start_paused = true)]
async fn retries_never_outlive_the_deadline() {
    let r = resilience(5);
    let s = sensor();
    for first_ms in [0u64, 30, 90, 150, 299] {
        let driver = Script::slow([(first_ms, TIMEOUT), (100, TIMEOUT), (100, TIMEOUT), (100, TIMEOUT)]);
        let until = Instant::now() + Duration::from_millis(300);
        let (results, attempts) = r.read(&device(), &driver, &[&s], until).await;
        assert!(Instant::now() <= until, "ended {:?} after the deadline", Instant::now() - until);
        assert!(results[0].is_err());
        assert_eq!(attempts, driver.reads());
        assert!((1..=6).contains(&attempts));
        // A healthy breaker for the next round.
        r.guard(&device()).unwrap().breaker.force_probe().unwrap().record(breaker::Outcome::Success);
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_answers_at_once_without_the_device_and_says_when_to_report() {
    let r = resilience(0);
    let s = sensor();
    let driver = Script::of([TIMEOUT; 5]);
    for _ in 0..5 {
        r.read(&device(), &driver, &[&s], deadline()).await;
    }
    assert_eq!(breaker(&r).state, SnapshotState::Open);
    let before = driver.reads();
    let started = Instant::now();
    let (results, attempts) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert_eq!((attempts, driver.reads(), Instant::now()), (0, before, started), "no device I/O, no wait");
    let Err(ReadError::CircuitOpen { retry_after, down_since, report }) = &results[0] else {
        panic!("{:?}", results[0])
    };
    assert_eq!(*retry_after, Duration::from_secs(5));
    assert!(down_since.is_some() && !report);
    // Down for longer than report_down_after_s (60 s): the answer says to tell a person.
    for _ in 0..12 {
        tokio::time::advance(Duration::from_secs(5)).await;
        let _ = r.probe(&device(), &Script::of([TIMEOUT]), &s, false).await;
    }
    let (results, _) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert!(matches!(results[0], Err(ReadError::CircuitOpen { report: true, .. })), "{:?}", results[0]);
}

#[tokio::test(start_paused = true)]
async fn probes_follow_the_breaker_schedule_and_the_first_answer_closes_it() {
    let r = resilience(0);
    let s = sensor();
    let dead = Script::of([TIMEOUT; 5]);
    for _ in 0..5 {
        r.read(&device(), &dead, &[&s], deadline()).await;
    }
    let driver = Script::of([TIMEOUT]);
    assert_eq!(
        r.probe(&device(), &driver, &s, false).await,
        ProbeOutcome::NotNow { retry_after: Duration::from_secs(5) }
    );
    assert_eq!(driver.reads(), 0);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(r.probe(&device(), &driver, &s, false).await, ProbeOutcome::Failed(DriverError::Timeout));
    assert_eq!(driver.probes.load(Ordering::SeqCst), 1, "the read went out as the breaker's probe");
    assert_eq!(breaker(&r).retry_after, Some(Duration::from_secs(10)), "reopened for twice as long");
    // An operator does not wait for the period.
    assert_eq!(r.probe(&device(), &driver, &s, true).await, ProbeOutcome::Answered);
    assert_eq!(breaker(&r).state, SnapshotState::Closed);
    let health = r.guard(&device()).unwrap().health.snapshot();
    assert!(health.failing_since.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_had_its_turn_frees_the_slot_for_the_next() {
    let r = resilience(0);
    let s = sensor();
    let dead = Script::of([TIMEOUT; 5]);
    for _ in 0..5 {
        r.read(&device(), &dead, &[&s], deadline()).await;
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    let outcome = r.probe(&device(), &Script::of([QUEUED]), &s, false).await;
    assert_eq!(outcome, ProbeOutcome::Failed(DriverError::Queued));
    assert_eq!(breaker(&r).state, SnapshotState::HalfOpen);
    assert_eq!(r.probe(&device(), &Script::of([]), &s, false).await, ProbeOutcome::Answered);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_arrives_during_a_probe_gets_the_probes_verdict() {
    let r = Arc::new(resilience(0));
    let s = sensor();
    let dead = Script::of([TIMEOUT; 5]);
    for _ in 0..5 {
        r.read(&device(), &dead, &[&s], deadline()).await;
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    // fieldgate's probe takes 300 ms and succeeds; a call arrives meanwhile.
    let probing = {
        let r = r.clone();
        tokio::spawn(async move {
            let slow = Script::slow([(300, Ok(1.0))]);
            r.probe(&device(), &slow, &sensor(), false).await
        })
    };
    tokio::task::yield_now().await;
    assert_eq!(breaker(&r).state, SnapshotState::HalfOpen);
    let driver = Script::of([]);
    let started = Instant::now();
    let (results, attempts) = r.read(&device(), &driver, &[&s], deadline()).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert_eq!((attempts, driver.reads()), (1, 1));
    // The probe's 300 ms, then its own 10 ms read.
    assert!(Instant::now() - started <= Duration::from_millis(310), "it waited for the probe only");
    assert_eq!(probing.await.unwrap(), ProbeOutcome::Answered);
}

/// INFO lines logged on this thread (a paused current-thread test runs every task on it).
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

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

#[tokio::test(start_paused = true)]
async fn calls_failing_together_log_the_device_down_once_and_up_once() {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt().with_writer(lines.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let r = resilience(0);
    // Eight callers fail at the same moment, past the threshold of five.
    let driver = Script::of([TIMEOUT; 8]);
    let (s, id) = (sensor(), device());
    let group = [&s];
    let calls = (0..8).map(|_| r.read(&id, &driver, &group, deadline()));
    futures_util::future::join_all(calls).await;
    assert_eq!(breaker(&r).state, SnapshotState::Open);
    // The device answers fieldgate's probe after the open period.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(r.probe(&id, &driver, &s, false).await, ProbeOutcome::Answered);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("device down").count(), 1, "{text}");
    assert_eq!(text.matches("device up again").count(), 1, "{text}");
}
