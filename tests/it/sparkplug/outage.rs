//! Store-and-forward: every value change made while the broker (or the primary host) is
//! away arrives afterwards, historical, in order, once; across a restart of fieldgate too.
//!
//! The oracle is the simulator: the test sets a sensor to known values one after another
//! (each read by the poller before the next), so the values that must arrive are known
//! without trusting fieldgate's own counters.

use std::time::Duration;

use fieldgate::spb::payload::Value;
use fieldgate_sim::Wave;

use super::broker::{Broker, Host, Msg, counter, metric, state};
use super::edge::{Rig, demo_sim, mqtt_config, rig_with};
use crate::support::wait_until;

const T: Duration = Duration::from_secs(20);
const SENSOR: &str = "A_LINE1_001";

/// Sets `SENSOR` to `v` and waits until fieldgate's poller has read it.
async fn set_and_read(rig: &Rig, v: f64) {
    rig.sim.set_wave(SENSOR, Wave::Constant { value: v });
    let tools = rig.running.tools.clone();
    let s = tools.registry().sensor(&SENSOR.parse().unwrap()).unwrap().clone();
    wait_until(&format!("{SENSOR} read as {v}"), T, || {
        let got = tools.reader().cache().last(&s).and_then(|x| x.value.as_f64());
        async move { got.is_some_and(|g| (g - v).abs() < 1e-4) }
    })
    .await;
}

/// The alias of `SENSOR` in the DBIRTHs seen.
fn alias(seen: &[Msg]) -> u64 {
    seen.iter()
        .filter(|m| m.kind() == "DBIRTH")
        .flat_map(|m| &m.payload.metrics)
        .find(|m| m.name.as_deref() == Some(SENSOR))
        .and_then(|m| m.alias)
        .expect("SENSOR born")
}

/// `SENSOR`'s historical values and timestamps, in arrival order.
fn historical(seen: &[Msg], alias: u64) -> Vec<(f64, u64)> {
    seen.iter()
        .filter(|m| m.kind() == "DDATA")
        .flat_map(|m| &m.payload.metrics)
        .filter(|m| m.alias == Some(alias) && m.is_historical == Some(true))
        .map(|m| match m.value {
            Some(Value::Float(f)) => (f as f64, m.timestamp.unwrap()),
            ref other => panic!("a Float: {other:?}"),
        })
        .collect()
}

/// `SENSOR`'s values delivered: historical ones and those its DBIRTHs carried (the newest
/// value at a birth goes in the birth, not again in the drain), by timestamp. A birth's
/// value that is no change (a later sample of the value before it) is left out.
fn delivered(seen: &[Msg], alias: u64) -> Vec<(f64, u64)> {
    let births = seen
        .iter()
        .filter(|m| m.kind() == "DBIRTH")
        .flat_map(|m| &m.payload.metrics)
        .filter(|m| m.alias == Some(alias))
        .filter_map(|m| match m.value {
            Some(Value::Float(f)) => Some((f as f64, m.timestamp?, true)),
            _ => None,
        });
    let mut all: Vec<(f64, u64, bool)> =
        historical(seen, alias).into_iter().map(|(v, t)| (v, t, false)).chain(births).collect();
    all.sort_by_key(|(_, t, _)| *t);
    let mut out: Vec<(f64, u64)> = Vec::new();
    for (v, t, birth) in all {
        if birth && out.last().is_some_and(|(last, _)| (last - v).abs() < 1e-4) {
            continue;
        }
        out.push((v, t));
    }
    out
}

/// The values the test set arrived (historical, or the newest in a DBIRTH), exactly once
/// each and in order, and every historical value of the sensor has a later timestamp than
/// the one before.
fn check_history(seen: &[Msg], values: &[f64]) {
    no_repeat_of_a_birth(seen);
    let h = historical(seen, alias(seen));
    for w in h.windows(2) {
        assert!(w[0].1 < w[1].1, "historical timestamps strictly increase: {h:?}");
    }
    let d = delivered(seen, alias(seen));
    let ours: Vec<f64> =
        d.iter().map(|(v, _)| *v).filter(|v| values.iter().any(|x| (x - v).abs() < 1e-4)).collect();
    assert_eq!(ours.len(), values.len(), "every change arrived once: {ours:?} vs {values:?}");
    for (got, want) in ours.iter().zip(values) {
        assert!((got - want).abs() < 1e-4, "in order: {ours:?} vs {values:?}");
    }
}

/// [`check_history`] across a restart of fieldgate at `restart_ms`: the values set before
/// it arrived once each, sampled before it; those set after, once each, sampled after it. The
/// new process knows nothing of what the old one reported, so its first reading of the
/// unchanged sensor is reported too: a new sample (its own, later timestamp), not a copy,
/// and allowed only as the first value after the restart, equal to the last one before.
fn check_history_across_restart(seen: &[Msg], before: &[f64], after: &[f64], restart_ms: u64) {
    no_repeat_of_a_birth(seen);
    let h = historical(seen, alias(seen));
    for w in h.windows(2) {
        assert!(w[0].1 < w[1].1, "historical timestamps strictly increase: {h:?}");
    }
    let set = |v: &f64| before.iter().chain(after).any(|x| (x - v).abs() < 1e-4);
    let h = delivered(seen, alias(seen));
    let pre: Vec<f64> = h.iter().filter(|(v, t)| *t < restart_ms && set(v)).map(|(v, _)| *v).collect();
    let mut post: Vec<f64> = h.iter().filter(|(v, t)| *t >= restart_ms && set(v)).map(|(v, _)| *v).collect();
    assert_eq!(pre, before, "every change before the restart arrived once, in order: {h:?}");
    if post.len() == after.len() + 1 && before.last() == post.first() {
        post.remove(0);
    }
    assert_eq!(post, after, "every change after the restart arrived once, in order: {h:?}");
}

/// No historical value repeats one a DBIRTH carried (same metric, same timestamp): the
/// birth's value was buffered too while the device waited, and is not drained again.
fn no_repeat_of_a_birth(seen: &[Msg]) {
    let births: std::collections::HashSet<(Option<&str>, u64, u64)> = seen
        .iter()
        .filter(|m| m.kind() == "DBIRTH")
        .flat_map(|m| m.payload.metrics.iter().map(move |x| (m.device(), x)))
        .filter_map(|(d, x)| Some((d, x.alias?, x.timestamp?)))
        .collect();
    for m in seen.iter().filter(|m| m.kind() == "DDATA") {
        for x in m.payload.metrics.iter().filter(|x| x.is_historical == Some(true)) {
            let key = (m.device(), x.alias.unwrap(), x.timestamp.unwrap());
            assert!(!births.contains(&key), "historical {key:?} repeats a DBIRTH's value");
        }
    }
}

/// fieldgate's count of historical values sent, now.
fn historical_sent(rig: &Rig) -> u64 {
    metric(&rig.running.tools, "fieldgate_sparkplug_historical_sent_total").unwrap()
}

/// Waits until the buffer is drained and the host has seen, from `seen[mark..]`, every
/// historical value sent since fieldgate's count was `base`.
async fn drained(host: &mut Host, rig: &Rig, (mark, base): (usize, u64)) {
    let tools = rig.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_buffered", T, |v| v == 0).await;
    let sent = historical_sent(rig) - base;
    let count = |seen: &[Msg]| {
        seen[mark..].iter().flat_map(|m| &m.payload.metrics).filter(|x| x.is_historical == Some(true)).count()
            as u64
    };
    let deadline = tokio::time::Instant::now() + T;
    while count(&host.seen) < sent {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the host got {} of {sent} historical values",
            count(&host.seen)
        );
        host.until("the drained values", T, |m| m.kind() == "DDATA").await;
    }
    assert_eq!(count(&host.seen), sent, "the host got what was sent as historical");
}

fn values(from: f64, n: usize) -> Vec<f64> {
    (0..n).map(|i| from + i as f64 * 0.25).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_every_change_arrives_historical_in_order() {
    let mut broker = Broker::start().await;
    let mut host = Host::connect_as(broker.port, Some("scada")).await;
    let data = tempfile::tempdir().unwrap();
    let mut c = mqtt_config(&broker, data.path());
    c.mqtt.primary_host_id = "scada".into();
    let rig = rig_with(c, demo_sim().await, data).await;
    let tools = rig.running.tools.clone();
    host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    set_and_read(&rig, 3.0).await;

    broker.stop().await;
    counter(&tools, "fieldgate_sparkplug_connected", T, |v| v == 0).await;
    host.take();
    let mark = (host.seen.len(), historical_sent(&rig));
    let during = values(10.0, 8);
    for v in &during {
        set_and_read(&rig, *v).await;
    }
    counter(&tools, "fieldgate_sparkplug_buffered", T, |v| v > 0).await;
    broker.restart().await;
    let birth = host.until("NBIRTH after the outage", T, |m| m.kind() == "NBIRTH").await;
    drained(&mut host, &rig, mark).await;
    // Births come first: nothing historical between the outage and the new NBIRTH.
    let after = &host.seen[mark.0..];
    let at = after.iter().position(|m| m.kind() == "NBIRTH").unwrap();
    assert!(after[..at].iter().flat_map(|m| &m.payload.metrics).all(|m| m.is_historical != Some(true)));
    assert_eq!(birth.payload.seq, Some(0));
    check_history(&host.seen, &during);
    // Live data goes on.
    set_and_read(&rig, 42.0).await;
    host.until("live data after the drain", T, |m| {
        m.kind() == "DDATA"
            && m.payload
                .metrics
                .iter()
                .any(|x| x.value == Some(Value::Float(42.0)) && x.is_historical.is_none())
    })
    .await;
    rig.running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fieldgate_restarted_during_the_outage_loses_nothing() {
    let mut broker = Broker::start().await;
    let mut host = Host::connect_as(broker.port, Some("scada")).await;
    let data = tempfile::tempdir().unwrap();
    let mut c = mqtt_config(&broker, data.path());
    c.mqtt.primary_host_id = "scada".into();
    let sim = demo_sim().await;
    let data_path = data.path().to_path_buf();
    let rig = rig_with(c.clone(), sim, data).await;
    let first = host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    broker.stop().await;
    counter(&rig.running.tools, "fieldgate_sparkplug_connected", T, |v| v == 0).await;
    let before = values(10.0, 4);
    for v in &before {
        set_and_read(&rig, *v).await;
    }
    // A clean stop writes the buffer; a new process (same data directory) goes on.
    let Rig { sim, running, devices, data } = rig;
    running.stop().await.unwrap();
    let restart_ms = chrono::Utc::now().timestamp_millis() as u64;
    drop(devices);
    assert_eq!(data.path(), data_path);
    let rig = rig_with(c, sim, data).await;
    counter(&rig.running.tools, "fieldgate_sparkplug_buffered", T, |v| v >= 4).await;
    host.take();
    let mark = (host.seen.len(), 0);
    let after = values(20.0, 4);
    for v in &after {
        set_and_read(&rig, *v).await;
    }
    broker.restart().await;
    let second = host.until("NBIRTH after the restart", T, |m| m.kind() == "NBIRTH").await;
    assert_ne!(super::edge::bd_seq(&second), super::edge::bd_seq(&first), "a new bdSeq");
    drained(&mut host, &rig, mark).await;
    check_history_across_restart(&host.seen, &before, &after, restart_ms);
    rig.running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_host_offline_means_buffer_then_births_and_drain() {
    let broker = Broker::start().await;
    let mut host = Host::connect_as(broker.port, Some("scada")).await;
    let data = tempfile::tempdir().unwrap();
    let mut c = mqtt_config(&broker, data.path());
    c.mqtt.primary_host_id = "scada".into();
    let rig = rig_with(c, demo_sim().await, data).await;
    let tools = rig.running.tools.clone();
    let first = host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    host.until("DDATA", T, |m| m.kind() == "DDATA").await;

    host.publish("spBv1.0/STATE/scada", state(false), true).await;
    let death = host.until("NDEATH when the host goes offline", T, |m| m.kind() == "NDEATH").await;
    assert_eq!(super::edge::bd_seq(&death), super::edge::bd_seq(&first));
    // That NDEATH is the only one: no will of an abandoned connection attempt came before the
    // first births (the broker sends the will of a connection dropped half-made).
    let kinds: Vec<&str> = host.seen.iter().map(|m| m.kind()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "NDEATH").count(), 1, "one NDEATH: {kinds:?}");
    let left = host.seen.len();
    counter(&tools, "fieldgate_sparkplug_online", T, |v| v == 0).await;
    host.take();
    let mark = (host.seen.len(), historical_sent(&rig));
    let during = values(30.0, 5);
    for v in &during {
        set_and_read(&rig, *v).await;
    }
    // Connected again (the only broker is the next one), but no births while the host is away.
    counter(&tools, "fieldgate_sparkplug_connected", T, |v| v == 1).await;
    assert_eq!(metric(&tools, "fieldgate_sparkplug_online"), Some(0));
    host.take();
    let kinds: Vec<&str> = host.seen[left..].iter().map(|m| m.kind()).collect();
    assert!(!kinds.contains(&"NBIRTH"), "no birth while the host is offline: {kinds:?}");

    host.publish("spBv1.0/STATE/scada", state(true), true).await;
    host.until("NBIRTH when the host is back", T, |m| m.kind() == "NBIRTH").await;
    drained(&mut host, &rig, mark).await;
    check_history(&host.seen, &during);
    rig.running.stop().await.unwrap();
}

/// A `/metrics` figure of the fieldgate at `addr`.
pub(super) async fn served_metric(addr: std::net::SocketAddr, name: &str) -> Option<u64> {
    let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.ok()?;
    let text = String::from_utf8(c.get("/metrics").await.ok()?.body).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

/// Sets `SENSOR` to `v` and waits until the fieldgate at `addr` has read it.
async fn set_and_read_served(sim: &fieldgate_sim::Simulator, addr: std::net::SocketAddr, v: f64) {
    sim.set_wave(SENSOR, Wave::Constant { value: v });
    wait_until(&format!("{SENSOR} read as {v}"), T, || async move {
        let Ok(mut c) = fieldgate::transport::client::HttpClient::connect(addr).await else { return false };
        let body = format!("{{\"sensor_id\":\"{SENSOR}\",\"max_age_ms\":60000}}");
        let Ok(r) = c.post("/v1/tools/get_sensor_reading", body.as_bytes()).await else { return false };
        r.json()["data"]["value"].as_f64().is_some_and(|g| (g - v).abs() < 1e-4)
    })
    .await;
}

/// The buffer's disk fills up during a broker outage (a real 24 MB filesystem under a real
/// `fieldgate serve`): the node keeps running and says so in health and on /metrics, and
/// in the log once (not per flush or reconnect attempt); the values wait in memory, are
/// written once space returns and, when the broker is back, every change arrives once, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_during_an_outage_loses_nothing_and_is_said_once() {
    let Some((data, _unmount)) = crate::support::small_fs("24m") else { return };
    let mut broker = Broker::start().await;
    let mut host = Host::connect_as(broker.port, Some("scada")).await;
    let sim = demo_sim().await;
    let devices = super::edge::fast_devices(&sim);
    let brokers = format!("[\"{}\"]", broker.url());
    let mut env = super::edge::node_env(&brokers);
    env.extend([
        ("FIELDGATE_MQTT_PRIMARY_HOST_ID", "scada"),
        ("FIELDGATE_MQTT_RECONNECT_MAX_MS", "100"),
        ("FIELDGATE_STORAGE_FLUSH_INTERVAL_MS", "200"),
    ]);
    let mut served = crate::support::serve_binary(devices.path(), data.path(), &env).await;
    let stderr = served.drain_stderr();
    let addr = served.addr;
    let figure =
        |name: &'static str, want: u64| async move {
            wait_until(&format!("{name} = {want}"), T, || async move {
                served_metric(addr, name).await == Some(want)
            })
            .await
        };
    host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    set_and_read_served(&sim, addr, 3.0).await;

    broker.stop().await;
    figure("fieldgate_sparkplug_connected", 0).await;
    host.take();
    let mark = host.seen.len();
    let base = served_metric(addr, "fieldgate_sparkplug_historical_sent_total").await.unwrap();
    let before = values(10.0, 3);
    for v in &before {
        set_and_read_served(&sim, addr, *v).await;
    }
    let filler = crate::support::fill(data.path());
    figure("fieldgate_sparkplug_buffer_failing", 1).await;
    // Each value read while the disk is full: flushes (every 200 ms) and reconnect attempts
    // (every 100 ms, each writing a new bdSeq) fail again and again meanwhile.
    let during = values(20.0, 3);
    for v in &during {
        set_and_read_served(&sim, addr, *v).await;
    }
    let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
    let status = c.post("/v1/tools/get_device_status", b"{}").await.unwrap().json();
    assert!(status["data"]["storage"]["problems"].to_string().contains("sparkplug buffer"), "{status}");
    assert_eq!(status["data"]["storage"]["state"], "failing", "{status}");
    std::fs::remove_file(&filler).unwrap();
    figure("fieldgate_sparkplug_buffer_failing", 0).await;

    broker.restart().await;
    host.until("NBIRTH after the outage", T, |m| m.kind() == "NBIRTH").await;
    figure("fieldgate_sparkplug_buffered", 0).await;
    let sent = served_metric(addr, "fieldgate_sparkplug_historical_sent_total").await.unwrap() - base;
    let count = |seen: &[Msg]| {
        seen[mark..].iter().flat_map(|m| &m.payload.metrics).filter(|x| x.is_historical == Some(true)).count()
            as u64
    };
    while count(&host.seen) < sent {
        host.until("the drained values", T, |m| m.kind() == "DDATA").await;
    }
    let all: Vec<f64> = before.iter().chain(&during).copied().collect();
    check_history(&host.seen, &all);

    served.child.start_kill().unwrap();
    tokio::time::timeout(T, served.child.wait()).await.expect("fieldgate exits on kill").unwrap();
    let log = tokio::time::timeout(T, stderr).await.expect("its stderr ends").unwrap();
    let said =
        |what: &str| log.lines().filter(|l| l.contains("sparkplug buffer") && l.contains(what)).count();
    assert_eq!(said("storage is failing"), 1, "once per outage: {log}");
    assert_eq!(said("storage writes again"), 1, "{log}");
    assert!(log.matches("bdSeq not recorded").count() <= 1, "{log}");
}
