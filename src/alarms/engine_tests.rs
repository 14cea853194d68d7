use super::*;
use crate::registry::AlarmPriority;
use crate::store::alarm_journal::{AlarmState, EventKind};

const DEVICE: &str = r#"
id = "t-plc"
plant = "T"
zone = "ZONE1"
description = "test"
protocol = "modbus-tcp"
endpoint = "127.0.0.1:502"

[[sensors]]
id = "T_ZONE1_001"
description = "a temperature, in tenths"
kind = "temperature"
unit = "degC"
table = "holding"
address = 0
type = "i16"
scale = 0.1

[[sensors.alarms]]
name = "HI"
type = "high"
limit = 100.0
deadband = 2.0
on_delay_s = 5
off_delay_s = 3
priority = "high"
message = "too hot"
"#;

fn config() -> AlarmsConfig {
    AlarmsConfig { journal_days: 3650, comm_delay_s: 60 }
}

fn reader(registry: &Arc<Registry>) -> Arc<Reader> {
    let config = crate::config::Config::default();
    Arc::new(Reader::new(registry.clone(), &config, &crate::metrics::Metrics::default()))
}

fn registry() -> Registry {
    Registry::from_texts(&[("t.toml".to_string(), DEVICE.to_string())]).unwrap()
}

/// A batch of the sensor's raw register value (tenths) at `t_s` seconds.
fn batch(t_s: i64, tenths: i64, quality: SampleQuality) -> Batch {
    let at = chrono::DateTime::from_timestamp(1_700_000_000 + t_s, 0).unwrap();
    Batch { device: 0, samples: vec![(0, Sample { value: RawValue::Int(tenths), at, quality })] }
}

fn ms(t_s: i64) -> i64 {
    (1_700_000_000 + t_s) * 1000
}

/// Runs the engine over `batches` to the end of its feed.
async fn run(alarms: &Arc<Alarms>, registry: &Arc<Registry>, batches: Vec<Batch>) {
    let (tx, rx) = mpsc::channel(batches.len() + 1);
    for b in batches {
        tx.send(Arc::new(b)).await.unwrap();
    }
    drop(tx);
    tokio::time::timeout(Duration::from_secs(10), alarms.clone().run(reader(registry), rx))
        .await
        .expect("the engine ends with its feed");
}

#[tokio::test]
async fn the_engine_journals_the_exact_transitions_in_engineering_units_and_a_restart_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Arc::new(registry());
    let alarms = Arc::new(
        Alarms::new(&registry, Arc::new(AlarmJournal::open_in(dir.path()).unwrap()), &config()).unwrap(),
    );
    assert_eq!(alarms.ids()[0], "T_ZONE1_001.HI");
    // 1010 tenths is 101.0 degC: beyond 100 from t=10, activating at t=15; 97.9 from t=40
    // clears at t=43. Bad quality at t=20 forgets nothing of the state.
    let mut batches: Vec<Batch> =
        (0..40).map(|t| batch(t, if t >= 10 { 1010 } else { 990 }, SampleQuality::Good)).collect();
    batches[20] = batch(20, 0, SampleQuality::Bad);
    batches.extend((40..50).map(|t| batch(t, 979, SampleQuality::Good)));
    run(&alarms, &registry, batches).await;
    let events = alarms.journal().events(0, i64::MAX, None, 100).unwrap();
    let got: Vec<(EventKind, i64, Option<f64>)> = events.iter().map(|e| (e.kind, e.at_ms, e.value)).collect();
    assert_eq!(got, [(EventKind::Activated, ms(15), Some(101.0)), (EventKind::Cleared, ms(43), Some(97.9))]);
    assert_eq!(events[0].priority, Some(AlarmPriority::High));
    assert_eq!(alarms.instances()[0].state, AlarmState::ReturnedUnacknowledged);

    // Active again, then a restart: the same event, nothing activated twice.
    run(&alarms, &registry, (60..70).map(|t| batch(t, 1010, SampleQuality::Good)).collect()).await;
    let event = alarms.instances()[0].event_id;
    drop(alarms);
    let alarms = Arc::new(
        Alarms::new(&registry, Arc::new(AlarmJournal::open_in(dir.path()).unwrap()), &config()).unwrap(),
    );
    assert_eq!(
        (alarms.instances()[0].state, alarms.instances()[0].event_id),
        (AlarmState::ActiveUnacknowledged, event)
    );
    run(&alarms, &registry, (70..80).map(|t| batch(t, 1010, SampleQuality::Good)).collect()).await;
    assert_eq!(alarms.journal().events(0, i64::MAX, None, 100).unwrap().len(), 3, "no second activation");
}

#[tokio::test]
async fn operators_act_through_the_engine_and_out_of_service_is_not_evaluated() {
    let registry = Arc::new(registry());
    let alarms =
        Arc::new(Alarms::new(&registry, Arc::new(AlarmJournal::in_memory().unwrap()), &config()).unwrap());
    assert!(matches!(
        alarms.operate("T_ZONE1_001.LO", &Act::Unshelve, 0, None, None),
        Err(ActError::NotFound(_))
    ));
    alarms.operate("T_ZONE1_001.HI", &Act::OutOfService, ms(0), Some("op"), Some("calibrating")).unwrap();
    run(&alarms, &registry, (0..20).map(|t| batch(t, 1500, SampleQuality::Good)).collect()).await;
    assert_eq!(alarms.instances()[0].state, AlarmState::Normal, "out of service: not evaluated");
    alarms.operate("T_ZONE1_001.HI", &Act::InService, ms(20), Some("op"), None).unwrap();
    run(&alarms, &registry, (21..30).map(|t| batch(t, 1500, SampleQuality::Good)).collect()).await;
    let i = &alarms.instances()[0];
    assert_eq!(
        (i.state, i.activated_ms),
        (AlarmState::ActiveUnacknowledged, Some(ms(26))),
        "a new delay from t=21"
    );
    // A shelving whose time ended is undone by the engine's clock.
    alarms
        .operate("T_ZONE1_001.HI", &Act::Shelve { until_ms: ms(31) }, ms(30), Some("op"), Some("known"))
        .unwrap();
    alarms.unshelve_ended(ms(30));
    assert!(alarms.instances()[0].shelved_until_ms.is_some(), "not before its time");
    alarms.unshelve_ended(ms(31));
    assert_eq!(alarms.instances()[0].shelved_until_ms, None);
    let last = alarms.journal().events(0, i64::MAX, None, 100).unwrap().pop().unwrap();
    assert_eq!((last.kind, last.by), (EventKind::Unshelved, None));
}

/// Out of service and straight back, with no sample between, while the value stays beyond
/// the limit: a new event after the on-delay (the evaluation starts again from normal).
#[tokio::test]
async fn back_in_service_at_once_beyond_the_limit_activates_again() {
    let registry = Arc::new(registry());
    let alarms =
        Arc::new(Alarms::new(&registry, Arc::new(AlarmJournal::in_memory().unwrap()), &config()).unwrap());
    let (tx, rx) = mpsc::channel(64);
    let engine = tokio::spawn(alarms.clone().run(reader(&registry), rx));
    for t in 0..10 {
        tx.send(Arc::new(batch(t, 1500, SampleQuality::Good))).await.unwrap();
    }
    let active = async {
        while alarms.instances()[0].state != AlarmState::ActiveUnacknowledged
            || alarms.counters.evaluated.load(Ordering::Relaxed) < 10
        {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), active).await.expect("the first activation within 10 s");
    let first = alarms.instances()[0].clone();
    alarms.operate("T_ZONE1_001.HI", &Act::OutOfService, ms(10), Some("op"), Some("wrong")).unwrap();
    alarms.operate("T_ZONE1_001.HI", &Act::InService, ms(10), Some("op"), None).unwrap();
    assert_eq!(alarms.instances()[0].state, AlarmState::Normal);
    for t in 11..20 {
        tx.send(Arc::new(batch(t, 1500, SampleQuality::Good))).await.unwrap();
    }
    drop(tx);
    tokio::time::timeout(Duration::from_secs(10), engine).await.unwrap().unwrap();
    let i = &alarms.instances()[0];
    assert_eq!((i.state, i.activated_ms), (AlarmState::ActiveUnacknowledged, Some(ms(16))), "from t=11, 5 s");
    assert!(i.event_id > first.event_id);
}

/// Waits (in paused time) until `done` holds, at most a minute of it.
async fn until(what: &str, done: impl Fn() -> bool) {
    let wait = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait).await.unwrap_or_else(|_| panic!("waited for {what}"));
}

/// A device silent for `comm_delay_s` is its communication alarm, stamped when the delay
/// ended; its next answer clears it. After a restart, a device not read yet holds it.
#[tokio::test(start_paused = true)]
async fn a_silent_device_raises_its_communication_alarm_and_its_answer_clears_it() {
    let registry = Arc::new(registry());
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let cfg = AlarmsConfig { journal_days: 3650, comm_delay_s: 5 };
    let alarms = Arc::new(Alarms::new(&registry, journal.clone(), &cfg).unwrap());
    assert_eq!(alarms.ids(), ["T_ZONE1_001.HI", "t-plc.COMM"]);
    let (entry, _) = alarms.get("t-plc.COMM").unwrap();
    assert_eq!((entry.sensor(), entry.kind(), entry.priority), (None, "communication", AlarmPriority::High));
    let reader = reader(&registry);
    let device: crate::ids::DeviceId = "t-plc".parse().unwrap();
    let comm = || alarms.get("t-plc.COMM").unwrap().1;

    let (tx, rx) = mpsc::channel(4);
    let engine = tokio::spawn(alarms.clone().run(reader.clone(), rx));
    reader.observe(&device, Err(&crate::driver::DriverError::Timeout));
    let failed_at = reader.guard(&device).unwrap().health.failing_since().unwrap().0.timestamp_millis();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(comm().state, AlarmState::Normal, "not before its 5 s");
    until("the communication alarm", || comm().state == AlarmState::ActiveUnacknowledged).await;
    assert_eq!(comm().activated_ms, Some(failed_at + 5000));

    reader.observe(&device, Ok(()));
    until("the answer to clear it", || comm().state == AlarmState::ReturnedUnacknowledged).await;
    let events = journal.events(0, i64::MAX, None, 10).unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Activated, EventKind::Cleared]);

    // Failing again; a restart with a reader that has not read the device yet holds it.
    reader.observe(&device, Err(&crate::driver::DriverError::Timeout));
    until("the second activation", || comm().state == AlarmState::ActiveUnacknowledged).await;
    let event = comm().event_id;
    drop(tx);
    engine.await.unwrap();
    let alarms = Arc::new(Alarms::new(&registry, journal.clone(), &cfg).unwrap());
    let (tx, rx) = mpsc::channel(4);
    let fresh = self::reader(&registry);
    let engine = tokio::spawn(alarms.clone().run(fresh.clone(), rx));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held = alarms.get("t-plc.COMM").unwrap().1;
    assert_eq!((held.state, held.event_id), (AlarmState::ActiveUnacknowledged, event), "held, not cleared");
    fresh.observe(&device, Err(&crate::driver::DriverError::Timeout));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(journal.events(0, i64::MAX, None, 10).unwrap().len(), 3, "no second activation");
    drop(tx);
    engine.await.unwrap();

    // comm_delay_s = 0: no communication alarm.
    let none =
        Alarms::new(&registry, journal, &AlarmsConfig { journal_days: 3650, comm_delay_s: 0 }).unwrap();
    assert_eq!(none.ids(), ["T_ZONE1_001.HI"]);
}
