//! Alarm evaluation cost (issue 37): 10,000 configured limit alarms (one on each of 10,000
//! sensors, 50 devices of 200), a minute of samples at 10,000 a second (each sensor once a
//! second; one sensor in a hundred steps past its limit half-way, so about 100 alarms
//! activate, journaled on disk), evaluated by the engine as the sample feed hands them over.
//!
//! Reported, in one run: the CPU time of the engine over the minute's 600,000 samples, and
//! of a baseline consumer that only takes the same batches off the same queue and reads
//! each sample's value; evaluations per second per core; the share of one core the engine
//! takes at 10,000 samples a second. Target: ≤ 5 % of one core.
//!
//! Then the fleet hub's side: an edge node's messages, every alarm changing state in each
//! (100 of 250 alarms; 2,000 of 20), followed into a journal on disk, each message in one
//! durable write. Reported: transitions and messages journaled per second, and the
//! longest message.

use std::sync::Arc;
use std::time::Instant;

use fieldgate::alarms::Alarms;
use fieldgate::alarms::remote::RemoteAlarm;
use fieldgate::config::{AlarmsConfig, Config};
use fieldgate::driver::{RawValue, Sample, SampleQuality};
use fieldgate::metrics::Metrics;
use fieldgate::reading::Reader;
use fieldgate::reading::feed::Batch;
use fieldgate::registry::{AlarmPriority, Registry};
use fieldgate::store::alarm_journal::{AlarmJournal, AlarmState};

const DEVICES: usize = 50;
const PER_DEVICE: usize = 200;
const SECONDS: i64 = 60;

fn registry() -> Registry {
    let mut files = Vec::new();
    for d in 0..DEVICES {
        let mut text = format!(
            "id = \"b-dev{d}\"\nplant = \"B\"\nzone = \"Z{d}\"\ndescription = \"bench\"\nprotocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:1\"\n"
        );
        for s in 0..PER_DEVICE {
            text.push_str(&format!(
                "\n[[sensors]]\nid = \"B_Z{d}_{s:03}\"\ndescription = \"t\"\nkind = \"temperature\"\nunit = \"degC\"\ntable = \"holding\"\naddress = {}\ntype = \"f32\"\n\n[[sensors.alarms]]\nname = \"HI\"\ntype = \"high\"\nlimit = 90.0\ndeadband = 1.0\non_delay_s = 2\noff_delay_s = 2\npriority = \"high\"\nmessage = \"high\"\n",
                s * 2
            ));
        }
        files.push((format!("d{d}.toml"), text));
    }
    Registry::from_texts(&files).expect("the bench's device files")
}

/// A minute of batches: each device once a second, every sensor in it.
fn batches(registry: &Registry) -> Vec<Arc<Batch>> {
    let t0 = chrono::DateTime::from_timestamp(1_790_000_000, 0).expect("a time");
    let mut out = Vec::new();
    for t in 0..SECONDS {
        let at = t0 + chrono::Duration::seconds(t);
        for d in 0..DEVICES {
            let samples = (0..PER_DEVICE)
                .map(|s| {
                    let i = d * PER_DEVICE + s;
                    let stepped = i.is_multiple_of(100) && t >= SECONDS / 2;
                    let v = if stepped { 95.0 } else { 50.0 + 10.0 * ((t as f64 + i as f64) / 7.0).sin() };
                    (i, Sample { value: RawValue::Float(v), at, quality: SampleQuality::Good })
                })
                .collect();
            out.push(Arc::new(Batch { device: d, samples }));
        }
    }
    assert_eq!(
        out.iter().map(|b| b.samples.len()).sum::<usize>(),
        registry.sensors().len() * SECONDS as usize
    );
    out
}

/// This process's CPU time, in seconds (to the nanosecond: the minute's work takes
/// milliseconds).
fn cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn queue(batches: &[Arc<Batch>]) -> tokio::sync::mpsc::Receiver<Arc<Batch>> {
    let (tx, rx) = tokio::sync::mpsc::channel(batches.len());
    for b in batches {
        tx.try_send(b.clone()).expect("room for every batch");
    }
    rx
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let registry = Arc::new(registry());
    let batches = batches(&registry);
    let samples = batches.iter().map(|b| b.samples.len()).sum::<usize>() as f64;

    // Baseline: the same batches off the same queue, each value read.
    let mut rx = queue(&batches);
    let (c0, w0) = (cpu(), Instant::now());
    let sum = rt.block_on(async {
        let mut sum = 0.0;
        while let Some(b) = rx.recv().await {
            sum += b.samples.iter().filter_map(|(_, s)| s.value.as_f64()).sum::<f64>();
        }
        sum
    });
    let (base_cpu, base_wall) = (cpu() - c0, w0.elapsed().as_secs_f64());
    std::hint::black_box(sum);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = Arc::new(AlarmJournal::open_in(dir.path()).expect("the journal"));
    let alarms =
        Arc::new(Alarms::new(&registry, journal.clone(), &AlarmsConfig::default()).expect("the alarms"));
    let rx = queue(&batches);
    let (c0, w0) = (cpu(), Instant::now());
    let reader = Arc::new(Reader::new(registry.clone(), &Config::default(), &Metrics::default()));
    rt.block_on(alarms.clone().run(reader, rx));
    let (cpu_s, wall) = (cpu() - c0, w0.elapsed().as_secs_f64());
    let transitions = journal.events(0, i64::MAX, None, usize::MAX).map(|e| e.len()).unwrap_or(0);
    let active = alarms.instances().iter().filter(|i| i.state.is_active()).count();

    let evaluations = samples; // one alarm per sensor
    println!("alarms: {} configured, {samples} samples (a minute at 10,000/s)", alarms.count());
    println!("  baseline (take the batches, read each value): {base_cpu:.4} s CPU, {base_wall:.4} s wall");
    println!(
        "  engine (evaluate, journal {transitions} transitions, {active} active at the end): {cpu_s:.4} s CPU, {wall:.4} s wall"
    );
    let per_core = evaluations / cpu_s.max(1e-9);
    println!("  evaluations per second per core: {per_core:.0}");
    println!(
        "  share of one core at 10,000 samples/s: {:.3} % (target <= 5 %); engine / baseline CPU: {:.1}x",
        100.0 * cpu_s / SECONDS as f64,
        cpu_s / base_cpu.max(1e-9)
    );
    // The hub: big messages and small ones, each written to disk.
    hub(100, 250);
    hub(2_000, 20);
}

/// The hub's side: one edge node's `messages` of `per_message` alarms each followed into
/// a journal on disk, each in one durable write.
fn hub(messages: usize, per_message: usize) {
    let text = "id = \"h-dev\"\nplant = \"H\"\nzone = \"Z\"\ndescription = \"bench\"\nprotocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:1\"\n\n[[sensors]]\nid = \"H_Z_001\"\ndescription = \"t\"\nkind = \"temperature\"\nunit = \"degC\"\ntable = \"holding\"\naddress = 0\ntype = \"f32\"\n";
    let registry = Registry::from_texts(&[("h.toml".to_string(), text.to_string())])
        .expect("the hub bench's device file");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = Arc::new(AlarmJournal::open_in(dir.path()).expect("the journal"));
    let alarms = Alarms::new(&registry, journal.clone(), &AlarmsConfig::default()).expect("the alarms");
    let t0 = chrono::Utc::now().timestamp_millis() - 3_600_000;
    // Message m: alarm k of its block of 1,000 IDs is active (m even) or normal (m odd).
    let message = |m: usize| -> Vec<RemoteAlarm> {
        (0..per_message)
            .map(|k| {
                let state =
                    if m.is_multiple_of(2) { AlarmState::ActiveUnacknowledged } else { AlarmState::Normal };
                RemoteAlarm {
                    id: format!("E_Z{}_{:03}.HI", (m / 4) % 100, k),
                    state,
                    time_ms: Some(t0 + (m * 1000) as i64),
                    priority: AlarmPriority::High,
                    kind: "high".into(),
                    message: "high".into(),
                    device: "e-dev".into(),
                    sensor: Some(format!("E_Z{}_{:03}", (m / 4) % 100, k)),
                    plant: "E".into(),
                    zone: format!("Z{}", (m / 4) % 100),
                    limit: Some(90.0),
                    unit: "degC".into(),
                    acknowledged_by: None,
                    activated_ms: m.is_multiple_of(2).then_some(t0 + (m * 1000) as i64),
                    shelved_until_ms: None,
                    out_of_service: false,
                }
            })
            .collect()
    };
    let list: Vec<Vec<RemoteAlarm>> = (0..messages).map(message).collect();
    let (mut longest, w0) = (0.0f64, Instant::now());
    for one in list {
        let w = Instant::now();
        alarms.on_remote("G/edge", false, one);
        longest = longest.max(w.elapsed().as_secs_f64());
    }
    let wall = w0.elapsed().as_secs_f64();
    let transitions = journal.events(0, i64::MAX, None, usize::MAX).map(|e| e.len()).unwrap_or(0);
    println!("hub: {messages} messages of {per_message} alarms from one edge node, into a journal on disk");
    println!(
        "  {transitions} transitions in {wall:.2} s: {:.0} transitions/s, {:.0} messages/s; longest message {:.1} ms",
        transitions as f64 / wall.max(1e-9),
        messages as f64 / wall.max(1e-9),
        longest * 1000.0
    );
}
