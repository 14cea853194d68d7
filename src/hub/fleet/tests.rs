use super::*;
use crate::driver::{RawValue, SampleQuality};
use crate::hub::metric::raw_value;
use crate::spb::payload::{Metric, Value};
use crate::spb::payload::{PropertySet, PropertyValue};

const T0: u64 = 1_700_000_000_000;

fn fleet() -> Fleet {
    Fleet::new(Timing { reorder_timeout: Duration::from_secs(2), rebirth_cooldown: Duration::from_secs(5) })
}

fn wall(ms: u64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms as i64).unwrap()
}

fn payload(seq: Option<u64>, t: u64, metrics: Vec<Metric>) -> Payload {
    Payload { timestamp: Some(t), metrics, seq, uuid: None, body: None }
}

fn nbirth(bd_seq: u64) -> Payload {
    payload(
        Some(0),
        T0,
        vec![
            Metric::new(Some("bdSeq"), None, dt_::INT64, Some(Value::Long(bd_seq))),
            Metric::new(Some("Node Control/Rebirth"), None, dt_::BOOLEAN, Some(Value::Boolean(false))),
        ],
    )
}

use crate::spb::payload::datatype as dt_;

fn sensor(name: &str, alias: u64, v: f64) -> Metric {
    let mut m = Metric::new(Some(name), Some(alias), dt_::DOUBLE, Some(Value::Double(v)));
    m.timestamp = Some(T0);
    let mut p = PropertySet::default();
    p.push("engUnit", PropertyValue::string("bar"));
    p.push("kind", PropertyValue::string("pressure"));
    p.push("Quality", PropertyValue::int32(192));
    m.properties = Some(p);
    m
}

fn data(alias: u64, t: u64, v: f64) -> Metric {
    let mut m = Metric::new(None, Some(alias), dt_::DOUBLE, Some(Value::Double(v)));
    m.timestamp = Some(t);
    m
}

/// A fleet with edge A/gw1 born (bdSeq 3) and device plc-1 born with two sensors; the next
/// seq is 2.
fn born() -> (Fleet, Instant) {
    let mut f = fleet();
    let now = Instant::now();
    let mut out = Vec::new();
    let c = f.on_message(
        From { group: "A", node: "gw1", kind: Kind::NBirth, device: None },
        nbirth(3),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(c.catalogue);
    let birth = payload(Some(1), T0, vec![sensor("A_LINE1_001", 1, 1.5), sensor("A_LINE1_002", 2, 2.5)]);
    let c = f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("plc-1") },
        birth,
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(c.catalogue);
    assert_eq!(out.len(), 2, "the birth's values: {out:?}");
    (f, now)
}

fn latest(f: &Fleet, metric: usize) -> Option<f64> {
    let e = f.edge("A", "gw1").unwrap();
    e.devices[0].metrics[metric].latest.as_ref().and_then(|l| l.value.as_ref()).and_then(RawValue::as_f64)
}

fn ddata(f: &mut Fleet, seq: u64, metrics: Vec<Metric>, now: Instant) -> Vec<Update> {
    let mut out = Vec::new();
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DData, device: Some("plc-1") },
        payload(Some(seq), T0 + 10, metrics),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    out
}

#[test]
fn births_define_the_metrics_and_data_by_alias_updates_them() {
    let (mut f, now) = born();
    let e = f.edge("A", "gw1").unwrap();
    assert!(e.status.is_online());
    assert_eq!(e.bd_seq, Some(3));
    let d = &e.devices[0];
    assert_eq!(
        (d.id.as_str(), d.metrics[0].name.as_str(), d.metrics[0].props.unit.as_str()),
        ("plc-1", "A_LINE1_001", "bar")
    );
    assert_eq!(latest(&f, 0), Some(1.5));
    let out = ddata(&mut f, 2, vec![data(2, T0 + 5, 9.0)], now);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].at.metric, out[0].live, out[0].historical), (1, true, false));
    assert_eq!(latest(&f, 1), Some(9.0));
    assert_eq!(f.rebirths(now, usize::MAX), Vec::<(String, String)>::new());
}

#[test]
fn an_early_message_waits_for_the_one_before_it() {
    let (mut f, now) = born();
    let out = ddata(&mut f, 3, vec![data(1, T0 + 20, 3.0)], now);
    assert!(out.is_empty(), "held until seq 2 comes");
    assert_eq!(latest(&f, 0), Some(1.5));
    let out = ddata(&mut f, 2, vec![data(1, T0 + 10, 2.0)], now);
    assert_eq!(
        out.iter().map(|u| u.value.as_ref().and_then(RawValue::as_f64)).collect::<Vec<_>>(),
        [Some(2.0), Some(3.0)]
    );
    assert_eq!(latest(&f, 0), Some(3.0));
    // Nothing waits now: the reorder timeout passing changes nothing.
    let mut out = Vec::new();
    f.tick(now + Duration::from_secs(3), wall(T0), &mut out);
    assert!(out.is_empty());
    assert_eq!(
        (f.edge("A", "gw1").unwrap().stats.gaps, f.rebirths(now + Duration::from_secs(3), usize::MAX).len()),
        (0, 0)
    );
    // The next seq follows on.
    assert_eq!(ddata(&mut f, 4, vec![data(1, T0 + 30, 4.0)], now).len(), 1);
}

#[test]
fn a_gap_that_outlasts_the_reorder_timeout_asks_for_one_rebirth_per_cooldown() {
    let (mut f, now) = born();
    assert!(ddata(&mut f, 4, vec![data(1, T0 + 20, 4.0)], now).is_empty());
    assert!(ddata(&mut f, 3, vec![data(1, T0 + 10, 3.0)], now).is_empty());
    let mut out = Vec::new();
    f.tick(now + Duration::from_millis(1999), wall(T0), &mut out);
    assert!(out.is_empty(), "not yet");
    f.tick(now + Duration::from_secs(2), wall(T0), &mut out);
    assert_eq!(
        out.iter().map(|u| u.value.as_ref().and_then(RawValue::as_f64)).collect::<Vec<_>>(),
        [Some(3.0), Some(4.0)],
        "applied in seq order"
    );
    let t = now + Duration::from_secs(2);
    assert_eq!(f.rebirths(t, usize::MAX), [("A".to_string(), "gw1".to_string())]);
    assert_eq!(f.rebirths(t, usize::MAX), Vec::<(String, String)>::new(), "asked once");
    // The stream goes on from there; another gap within the cooldown waits for it to end.
    assert_eq!(ddata(&mut f, 5, vec![data(1, T0 + 30, 5.0)], t).len(), 1);
    assert!(ddata(&mut f, 7, vec![data(1, T0 + 40, 7.0)], t).is_empty());
    f.tick(t + Duration::from_secs(2), wall(T0), &mut out);
    assert_eq!(f.rebirths(t + Duration::from_secs(2), usize::MAX).len(), 0, "within the cooldown");
    assert_eq!(f.rebirths(t + Duration::from_secs(5), usize::MAX).len(), 1, "when it ends");
    let e = f.edge("A", "gw1").unwrap();
    assert_eq!((e.stats.gaps, e.stats.rebirths_requested), (2, 2));
}

#[test]
fn a_late_or_repeated_message_is_dropped() {
    let (mut f, now) = born();
    assert_eq!(ddata(&mut f, 2, vec![data(1, T0 + 10, 2.0)], now).len(), 1);
    assert!(ddata(&mut f, 2, vec![data(1, T0 + 10, 99.0)], now).is_empty());
    assert!(ddata(&mut f, 1, vec![data(1, T0 + 10, 99.0)], now).is_empty());
    assert_eq!(latest(&f, 0), Some(2.0));
    assert_eq!(f.edge("A", "gw1").unwrap().stats.dropped, 2);
}

#[test]
fn seq_wraps_from_255_to_0() {
    let (mut f, now) = born();
    for seq in 2..=255u64 {
        assert_eq!(ddata(&mut f, seq, vec![data(1, T0 + seq, seq as f64)], now).len(), 1, "{seq}");
    }
    assert_eq!(ddata(&mut f, 0, vec![data(1, T0 + 300, 0.5)], now).len(), 1);
    assert_eq!(latest(&f, 0), Some(0.5));
}

#[test]
fn unknown_edges_devices_and_aliases_are_never_guessed_at() {
    let mut f = fleet();
    let now = Instant::now();
    let mut out = Vec::new();
    // An edge never born (the hub started after it).
    f.on_message(
        From { group: "B", node: "gw9", kind: Kind::DData, device: Some("x") },
        payload(Some(7), T0, vec![data(1, T0, 1.0)]),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(out.is_empty());
    assert_eq!(f.rebirths(now, usize::MAX), [("B".to_string(), "gw9".to_string())]);
    assert!(f.edge("B", "gw9").is_none(), "a stranger, not an edge node of the fleet");
    assert_eq!(f.strangers().list().len(), 1);

    let (mut f, now) = born();
    // A device not born, then an alias not born: dropped, one rebirth asked.
    let mut out = Vec::new();
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DData, device: Some("plc-2") },
        payload(Some(2), T0, vec![data(1, T0, 7.0)]),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(
        ddata(&mut f, 3, vec![data(9, T0, 7.0), data(1, T0 + 1, 8.0)], now).len() == 1,
        "the known alias is applied"
    );
    assert!(out.is_empty());
    assert_eq!(f.rebirths(now, usize::MAX).len(), 1);
    // An alias of another device of the edge is not this device's.
    let other = payload(Some(4), T0, vec![sensor("A_LINE1_003", 3, 0.0)]);
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("plc-2") },
        other,
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(ddata(&mut f, 5, vec![data(3, T0 + 2, 1.0)], now).is_empty());
    // No seq at all: dropped and asked.
    let mut out = Vec::new();
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DData, device: Some("plc-1") },
        payload(None, T0, vec![data(1, T0 + 3, 1.0)]),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(out.is_empty());
}

#[test]
fn only_the_current_connections_ndeath_counts() {
    let (mut f, now) = born();
    let mut out = Vec::new();
    let death = |bd: u64| {
        payload(None, T0, vec![Metric::new(Some("bdSeq"), None, dt_::INT64, Some(Value::Long(bd)))])
    };
    let stale = f.on_message(
        From { group: "A", node: "gw1", kind: Kind::NDeath, device: None },
        death(2),
        Clock { now, wall: wall(T0 + 100) },
        &mut out,
    );
    assert!(f.edge("A", "gw1").unwrap().status.is_online(), "an older connection's will");
    assert!(!stale.catalogue);
    let dead = f.on_message(
        From { group: "A", node: "gw1", kind: Kind::NDeath, device: None },
        death(3),
        Clock { now, wall: wall(T0 + 200) },
        &mut out,
    );
    // Whose claims count changed (a dead edge node's claims give way): the catalogue is
    // built again.
    assert!(dead.catalogue, "a death changes the catalogue");
    let e = f.edge("A", "gw1").unwrap();
    assert_eq!(e.status, Status::Offline { since: wall(T0 + 200), why: Gone::Death });
    assert_eq!(e.devices[0].status, Status::Offline { since: wall(T0 + 200), why: Gone::EdgeGone });
    // Data after the death is not taken until a new birth.
    assert!(ddata(&mut f, 2, vec![data(1, T0 + 300, 1.0)], now).is_empty());
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::NBirth, device: None },
        nbirth(4),
        Clock { now, wall: wall(T0 + 400) },
        &mut out,
    );
    let e = f.edge("A", "gw1").unwrap();
    assert!(e.status.is_online());
    assert!(!e.devices[0].status.is_online(), "a device waits for its own DBIRTH");
}

#[test]
fn a_ddeath_older_than_the_dbirth_changes_nothing() {
    let (mut f, now) = born();
    let mut out = Vec::new();
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DDeath, device: Some("plc-1") },
        payload(Some(2), T0 - 1, vec![]),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(f.edge("A", "gw1").unwrap().devices[0].status.is_online());
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DDeath, device: Some("plc-1") },
        payload(Some(3), T0 + 1, vec![]),
        Clock { now, wall: wall(T0 + 5) },
        &mut out,
    );
    assert_eq!(
        f.edge("A", "gw1").unwrap().devices[0].status,
        Status::Offline { since: wall(T0 + 5), why: Gone::Death }
    );
}

#[test]
fn historical_and_older_values_go_to_history_only() {
    let (mut f, now) = born();
    let mut h = data(1, T0 - 1000, 7.0);
    h.is_historical = Some(true);
    let out = ddata(&mut f, 2, vec![h, data(1, T0 - 10, 8.0)], now);
    assert_eq!(
        out.iter().map(|u| (u.historical, u.live)).collect::<Vec<_>>(),
        [(true, false), (false, false)]
    );
    assert_eq!(latest(&f, 0), Some(1.5), "the birth's value (at T0) stays the latest");
}

#[test]
fn quality_and_values_keep_their_type() {
    let (mut f, now) = born();
    let mut bad = data(1, T0 + 1, 1.0);
    let mut p = PropertySet::default();
    p.push("Quality", PropertyValue::int32(0));
    bad.properties = Some(p);
    let out = ddata(&mut f, 2, vec![bad], now);
    assert_eq!(out[0].quality, SampleQuality::Bad);
    let m = |t, v| Metric::new(None, None, t, Some(v));
    assert_eq!(raw_value(dt_::INT8, &m(dt_::INT8, Value::Int(0xff))), Some(RawValue::Int(-1)));
    assert_eq!(raw_value(dt_::INT16, &m(dt_::INT16, Value::Int(-3i32 as u32))), Some(RawValue::Int(-3)));
    assert_eq!(raw_value(dt_::INT64, &m(dt_::INT64, Value::Long(-9i64 as u64))), Some(RawValue::Int(-9)));
    assert_eq!(
        raw_value(dt_::UINT32, &m(dt_::UINT32, Value::Long(4_000_000_000))),
        Some(RawValue::UInt(4_000_000_000))
    );
    assert_eq!(
        raw_value(dt_::UINT64, &m(dt_::UINT64, Value::Long(u64::MAX))),
        Some(RawValue::UInt(u64::MAX))
    );
    // A value of another type than the birth's is not reinterpreted.
    assert_eq!(raw_value(dt_::DOUBLE, &m(dt_::DOUBLE, Value::Long(5))), None);
    assert_eq!(
        raw_value(dt_::STRING, &m(dt_::STRING, Value::String("a\u{202e}b".into()))),
        Some(RawValue::Text("a\u{fffd}b".into()))
    );
    // Text up to the bound a device's text has too; beyond it, no value (bad), never kept.
    let most = "x".repeat(crate::driver::MAX_TEXT);
    assert_eq!(
        raw_value(dt_::STRING, &m(dt_::STRING, Value::String(most.clone()))),
        Some(RawValue::Text(most))
    );
    let over = "x".repeat(crate::driver::MAX_TEXT + 1);
    assert_eq!(raw_value(dt_::STRING, &m(dt_::STRING, Value::String(over))), None);
    assert_eq!(raw_value(dt_::DOUBLE, &Metric::new(None, None, dt_::DOUBLE, None)), None);
}

#[test]
fn losing_the_broker_takes_every_edge_offline_and_asks_each_again() {
    let (mut f, now) = born();
    f.broker_lost(wall(T0 + 50));
    let e = f.edge("A", "gw1").unwrap();
    assert_eq!(e.status, Status::Offline { since: wall(T0 + 50), why: Gone::BrokerLost });
    assert_eq!(e.devices[0].status, Status::Offline { since: wall(T0 + 50), why: Gone::BrokerLost });
    f.broker_back(now);
    // Not at once: an edge node that follows the hub births by itself on its STATE.
    assert!(f.rebirths(now, usize::MAX).is_empty());
    let later = now + Duration::from_secs(5);
    assert_eq!(f.rebirths(later, usize::MAX).len(), 1);
    // Data before the rebirth is not taken: seq is not known any more.
    assert!(ddata(&mut f, 2, vec![data(1, T0 + 60, 1.0)], later).is_empty());
}

/// An edge node born again within the cooldown after the broker came back is not asked.
#[test]
fn an_edge_node_that_births_when_the_hub_is_back_is_not_asked_again() {
    let (mut f, now) = born();
    f.broker_lost(wall(T0 + 50));
    f.broker_back(now);
    let mut out = Vec::new();
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::NBirth, device: None },
        nbirth(4),
        Clock { now: now + Duration::from_secs(1), wall: wall(T0 + 60) },
        &mut out,
    );
    assert!(f.rebirths(now + Duration::from_secs(6), usize::MAX).is_empty());
}

/// An edge whose clock ran a year ahead sent one value: it must not freeze the sensor.
/// What follows (and any birth) becomes the latest value again.
#[test]
fn a_value_from_the_future_does_not_freeze_the_latest() {
    let (mut f, now) = born();
    let year = 365 * 86_400_000;
    assert!(ddata(&mut f, 2, vec![data(1, T0 + year, 9.0)], now)[0].live);
    assert_eq!(latest(&f, 0), Some(9.0));
    assert!(ddata(&mut f, 3, vec![data(1, T0 + 20, 2.0)], now)[0].live, "the hub's clock says T0");
    assert_eq!(latest(&f, 0), Some(2.0));
    // A birth says what is current, whatever time the latest value had.
    assert!(ddata(&mut f, 4, vec![data(1, T0 + year, 9.0)], now)[0].live);
    let mut out = Vec::new();
    let birth = payload(Some(5), T0, vec![sensor("A_LINE1_001", 1, 1.25), sensor("A_LINE1_002", 2, 2.5)]);
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("plc-1") },
        birth,
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert_eq!(latest(&f, 0), Some(1.25));
}

/// An alias a birth gives twice names neither metric: data by it is dropped, never
/// applied to one of them at a guess, and no rebirth asked (it would give the same aliases
/// again); neither metric's value is served (regression, the adversarial walk: both were
/// served, their birth values forever).
#[test]
fn an_alias_given_twice_in_a_birth_names_neither_metric() {
    let (mut f, now) = born();
    let mut out = Vec::new();
    let birth = payload(Some(2), T0, vec![sensor("A_LINE1_001", 7, 1.0), sensor("A_LINE1_002", 7, 2.0)]);
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("plc-1") },
        birth,
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(ddata(&mut f, 3, vec![data(7, T0 + 5, 9.0)], now).is_empty());
    assert_eq!((latest(&f, 0), latest(&f, 1)), (Some(1.0), Some(2.0)));
    assert!(f.rebirths(now, usize::MAX).is_empty());
    let e = f.edge("A", "gw1").unwrap();
    assert!(e.devices[0].metrics.iter().all(|m| m.alias_shared));
    assert_eq!(e.stats.dropped, 1);
}

/// An alias a second device's birth gives that the first device already holds names
/// neither metric: data by it (from either device) is dropped, neither is served, no
/// rebirth asked; the first device's other aliases still work.
#[test]
fn an_alias_two_devices_of_an_edge_node_were_born_with_names_neither() {
    let (mut f, now) = born();
    let mut out = Vec::new();
    let birth = payload(Some(2), T0, vec![sensor("A_LINE2_001", 2, 7.0)]);
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("plc-2") },
        birth,
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    // plc-1's alias 2 is plc-2's too: not applied to plc-1 at a guess.
    assert!(ddata(&mut f, 3, vec![data(2, T0 + 5, 9.0)], now).is_empty());
    assert_eq!(latest(&f, 1), Some(2.5));
    assert!(f.rebirths(now, usize::MAX).is_empty());
    let e = f.edge("A", "gw1").unwrap();
    let shared: Vec<(&str, bool)> =
        e.devices.iter().flat_map(|d| &d.metrics).map(|m| (m.name.as_str(), m.alias_shared)).collect();
    assert_eq!(shared, [("A_LINE1_001", false), ("A_LINE1_002", true), ("A_LINE2_001", true)]);
    // Nor to plc-2.
    let mut out = Vec::new();
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DData, device: Some("plc-2") },
        payload(Some(4), T0 + 10, vec![data(2, T0 + 6, 8.0)]),
        Clock { now, wall: wall(T0) },
        &mut out,
    );
    assert!(out.is_empty(), "{out:?}");
    // Alias 1 is plc-1's alone.
    assert_eq!(ddata(&mut f, 5, vec![data(1, T0 + 7, 4.0)], now).len(), 1);
    assert_eq!(latest(&f, 0), Some(4.0));
    // Regression (the adversarial walk): plc-2 born again with an alias of its own gives
    // alias 2 back to plc-1 alone: served, and data by it applied again.
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("plc-2") },
        payload(Some(6), T0, vec![sensor("A_LINE2_001", 12, 7.0)]),
        Clock { now, wall: wall(T0) },
        &mut Vec::new(),
    );
    let e = f.edge("A", "gw1").unwrap();
    assert!(e.devices.iter().flat_map(|d| &d.metrics).all(|m| !m.alias_shared));
    assert_eq!(ddata(&mut f, 7, vec![data(2, T0 + 8, 3.5)], now).len(), 1);
    assert_eq!(latest(&f, 1), Some(3.5));
}

/// Regression (the adversarial walk, twice): an NBIRTH without `bdSeq`, with one that is
/// no integer or is negative, or whose `seq` is not 0 (an empty payload decodes as one
/// with neither), is no birth: dropped, a rebirth asked; of a node born before, it leaves
/// the node as it was.
#[test]
fn a_birth_without_bd_seq_or_seq_0_is_dropped_and_asked_again() {
    let bd = || Metric::new(Some("bdSeq"), None, dt_::INT64, Some(Value::Long(1)));
    let bad = |t: u32, v: Value| Metric::new(Some("bdSeq"), None, t, Some(v));
    for (why, p) in [
        ("empty", payload(None, T0, vec![])),
        ("no bdSeq", payload(Some(0), T0, vec![])),
        ("no seq", payload(None, T0, vec![bd()])),
        ("seq 7", payload(Some(7), T0, vec![bd()])),
        ("a string", payload(Some(0), T0, vec![bad(dt_::STRING, Value::String("1".into()))])),
        ("a double", payload(Some(0), T0, vec![bad(dt_::DOUBLE, Value::Double(1.0))])),
        ("negative Int64", payload(Some(0), T0, vec![bad(dt_::INT64, Value::Long(u64::MAX))])),
        ("negative Int32", payload(Some(0), T0, vec![bad(dt_::INT32, Value::Int(u32::MAX))])),
        ("no value", payload(Some(0), T0, vec![Metric::new(Some("bdSeq"), None, dt_::INT64, None)])),
    ] {
        // Never born: a stranger, asked.
        let mut f = fleet();
        let now = Instant::now();
        let nbirth_of = |f: &mut Fleet, p: Payload| {
            f.on_message(
                From { group: "A", node: "gw1", kind: Kind::NBirth, device: None },
                p,
                Clock { now, wall: wall(T0) },
                &mut Vec::new(),
            )
        };
        nbirth_of(&mut f, p.clone());
        assert!(f.edge("A", "gw1").is_none(), "{why}");
        assert_eq!(f.strangers().list().len(), 1, "{why}");
        assert_eq!(f.rebirths(now, usize::MAX).len(), 1, "{why}");
        // Born before: it stays as it was born, one message dropped, asked again.
        let (mut f, now) = born();
        nbirth_of(&mut f, p);
        let e = f.edge("A", "gw1").unwrap();
        assert!(e.status.is_online() && e.bd_seq == Some(3), "{why}");
        assert_eq!((e.stats.dropped, e.devices.len()), (1, 1), "{why}");
        assert_eq!(f.rebirths(now, usize::MAX).len(), 1, "{why}");
    }
    // Any integer type holds a bdSeq.
    for m in [
        Metric::new(Some("bdSeq"), None, dt_::UINT64, Some(Value::Long(5))),
        Metric::new(Some("bdSeq"), None, dt_::INT32, Some(Value::Int(5))),
        Metric::new(Some("bdSeq"), None, dt_::UINT8, Some(Value::Int(5))),
    ] {
        let mut f = fleet();
        f.on_message(
            From { group: "A", node: "gw1", kind: Kind::NBirth, device: None },
            payload(Some(0), T0, vec![m]),
            Clock { now: Instant::now(), wall: wall(T0) },
            &mut Vec::new(),
        );
        assert_eq!(f.edge("A", "gw1").and_then(|e| e.bd_seq), Some(5));
    }
}

/// Data may name a metric instead of giving its alias (Sparkplug allows either): found by
/// name in its device's birth; a name the birth did not give is dropped and asked again.
#[test]
fn data_by_name_finds_its_metric_and_an_unknown_name_is_never_guessed() {
    let (mut f, now) = born();
    let by_name = |name: &str, t: u64, v: f64| {
        let mut m = Metric::new(Some(name), None, dt_::DOUBLE, Some(Value::Double(v)));
        m.timestamp = Some(t);
        m
    };
    let out =
        ddata(&mut f, 2, vec![by_name("A_LINE1_002", T0 + 5, 8.5), by_name("A_LINE1_001", T0 + 5, 7.5)], now);
    assert_eq!(out.len(), 2);
    assert_eq!((latest(&f, 0), latest(&f, 1)), (Some(7.5), Some(8.5)));
    let e = f.edge("A", "gw1").unwrap();
    assert_eq!(e.devices[0].metric_named("A_LINE1_002").map(|m| m.name.as_str()), Some("A_LINE1_002"));
    assert!(e.devices[0].metric_named("A_LINE1_003").is_none());
    assert!(ddata(&mut f, 3, vec![by_name("A_LINE1_003", T0 + 6, 1.0)], now).is_empty());
    assert_eq!(f.rebirths(now, usize::MAX).len(), 1);
}

mod strangers;

#[test]
fn a_message_lost_after_it_was_taken_asks_its_edge_node_for_a_rebirth() {
    let (mut f, now) = born();
    f.want_rebirth("A", "nobody");
    assert!(f.rebirths(now, usize::MAX).is_empty(), "a node never born is asked nothing");
    f.want_rebirth("A", "gw1");
    assert_eq!(f.rebirths(now, usize::MAX), [("A".to_string(), "gw1".to_string())]);
    assert_eq!(f.edge("A", "gw1").unwrap().stats.dropped, 1, "what it said of its alarms was dropped");
}
