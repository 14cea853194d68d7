use std::path::Path;

use super::*;
use crate::driver::RawValue;
use crate::driver::SampleQuality;

fn edge() -> Edge {
    let registry = Registry::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("devices")).unwrap();
    Edge::new(Topics::new("A", "gw"), Arc::new(registry), 60_000)
}

fn sample(v: f64, t: i64, quality: SampleQuality) -> Sample {
    Sample { value: RawValue::Float(v), at: chrono::DateTime::from_timestamp_millis(t).unwrap(), quality }
}

fn decode(o: &Out) -> Payload {
    Payload::decode_bytes(&o.payload).unwrap()
}

#[test]
fn births_reset_seq_and_seq_wraps() {
    let mut e = edge();
    let b = e.nbirth(3);
    let p = decode(&b);
    assert_eq!((b.topic.as_str(), p.seq), ("spBv1.0/A/NBIRTH/gw", Some(0)));
    assert_eq!(p.metrics[0].value, Some(Value::Long(3)));
    assert_eq!(p.metrics[1].name.as_deref(), Some(REBIRTH));
    let d = e.dbirth(0, |_| None);
    assert_eq!(decode(&d).seq, Some(1));
    let mut last = 1;
    for _ in 0..300 {
        last = decode(&e.ddeath(0)).seq.unwrap();
    }
    assert_eq!(last, (1 + 300) % 256);
    assert_eq!(decode(&e.nbirth(3)).seq, Some(0));
    let death = decode(&e.ndeath(9));
    assert_eq!((death.seq, death.metrics[0].value.clone()), (None, Some(Value::Long(9))));
}

#[test]
fn report_by_exception_and_ddata_by_alias() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    let s = reg.sensor(&"A_LINE1_001".parse().unwrap()).unwrap(); // deadband 0.02
    let dev = s.place.device;
    e.dbirth(dev, |x| (x.id == s.id).then(|| sample(4.0, 1000, SampleQuality::Good)));
    assert!(e.offer(s, &sample(4.01, 2000, SampleQuality::Good)).is_none(), "inside the deadband");
    let moved = e.offer(s, &sample(4.05, 3000, SampleQuality::Good)).unwrap();
    let bad = e.offer(s, &sample(4.05, 4000, SampleQuality::Bad)).unwrap();
    assert!(e.offer(s, &sample(4.05, 64_000, SampleQuality::Bad)).is_some(), "max_silence");
    let out = e.ddata(&[moved, bad], false, 100);
    assert_eq!(out.len(), 1);
    let p = decode(&out[0]);
    assert_eq!(out[0].topic, "spBv1.0/A/DDATA/gw/a-line1-plc");
    assert_eq!(p.metrics.len(), 2);
    assert_eq!((p.metrics[0].name.clone(), p.metrics[0].alias), (None, Some(metric::alias(s))));
    assert_eq!(p.metrics[0].timestamp, Some(3000));
    assert!(p.metrics[0].properties.is_none());
    assert!(p.metrics[1].properties.is_some(), "quality change carried");
}

#[test]
fn a_sample_no_newer_than_the_birth_is_not_sent_again() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    // A sensor without a deadband, where every newer sample is news.
    let s = reg.sensors().iter().find(|s| s.deadband.is_none() && s.range.is_some());
    let s = s.expect("the demo plant has a number sensor without a deadband");
    e.dbirth(s.place.device, |x| (x.id == s.id).then(|| sample(4.0, 1000, SampleQuality::Good)));
    // The poller's batch of the same read (or an older one) arrives after the birth.
    assert!(e.offer(s, &sample(4.0, 1000, SampleQuality::Good)).is_none(), "the birth carried it");
    assert!(e.offer(s, &sample(3.0, 900, SampleQuality::Bad)).is_none(), "older than the birth");
    assert!(e.offer(s, &sample(4.0, 2000, SampleQuality::Good)).is_some(), "a newer sample");
    // The clock stepped back an hour: what follows is sent, not held back for an hour.
    assert!(e.offer(s, &sample(5.0, 2000 - 3_600_000, SampleQuality::Good)).is_some(), "a clock step");
}

#[test]
fn unborn_devices_get_no_data_and_silence_repeats() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    let s = reg.sensor(&"A_LINE1_001".parse().unwrap()).unwrap();
    let r = Rec { sensor: s.id.to_string(), t: 1, value: Stored::Float(1.0), quality: 0 };
    assert!(e.ddata(std::slice::from_ref(&r), true, 100).is_empty());
    e.dbirth(s.place.device, |x| (x.id == s.id).then(|| sample(4.0, 1000, SampleQuality::Good)));
    let h = e.ddata(&[r], true, 100);
    assert_eq!(decode(&h[0]).metrics[0].is_historical, Some(true));
    let again = e.silent(61_000);
    assert_eq!(again.len(), 1);
    assert!(e.silent(62_000).is_empty());
    e.ddeath(s.place.device);
    assert!(e.silent(200_000).is_empty());
}

#[test]
fn rebirth_command() {
    let yes = Payload {
        metrics: vec![Metric::new(Some(REBIRTH), None, datatype::BOOLEAN, Some(Value::Boolean(true)))],
        ..Payload::default()
    };
    assert!(asks_rebirth(&yes));
    assert!(!asks_rebirth(&Payload::default()));
}

fn seq_of(payload: &[u8]) -> Option<u64> {
    Payload::decode_bytes(payload).unwrap().seq
}

/// Seven values of two devices, three metrics per message: messages of 3 + 1 values
/// of one device and 3 of the other (the order `ddata` makes them in).
fn seven_recs(e: &Edge) -> Vec<Rec> {
    let reg = e.registry_arc();
    let ids = ["A_LINE1_001", "A_LINE1_002", "A_LINE1_003", "A_LINE1_004"];
    let others: Vec<String> = reg
        .sensors()
        .iter()
        .filter(|s| {
            s.device.as_str() != "a-line1-plc" && matches!(s.source, crate::registry::SensorSource::Modbus(_))
        })
        .take(3)
        .map(|s| s.id.to_string())
        .collect();
    assert_eq!(others.len(), 3);
    let mut out = Vec::new();
    for (i, id) in ids.iter().map(|s| s.to_string()).chain(others).enumerate() {
        out.push(Rec { sensor: id, t: 1000 + i as i64, value: Stored::Float(i as f64), quality: 0 });
    }
    out
}

/// An edge node with every device born, and [`seven_recs`] of it.
fn all_born() -> (Edge, Vec<Rec>) {
    let mut e = edge();
    e.nbirth(1);
    for d in 0..e.registry_arc().devices().len() {
        e.dbirth(d, |_| None);
    }
    let recs = seven_recs(&e);
    (e, recs)
}

#[test]
fn ddata_says_which_records_each_message_carries() {
    let (mut e, recs) = all_born();
    let outs = e.ddata(&recs, true, 3);
    let mut all: Vec<usize> = outs.iter().flat_map(|o| o.recs.clone()).collect();
    for o in &outs {
        assert_eq!(o.recs.len(), o.metrics, "{}", o.topic);
    }
    all.sort();
    assert_eq!(all, (0..recs.len()).collect::<Vec<_>>(), "every record in exactly one message");
}

#[test]
fn a_refused_message_returns_its_records_and_the_rest_and_takes_back_their_seq() {
    let (mut e, recs) = all_born();
    let outs = e.ddata(&recs, true, 3);
    assert!(outs.len() >= 3, "{} messages", outs.len());
    let carried: Vec<Vec<usize>> = outs.iter().map(|o| o.recs.clone()).collect();
    let first_refused = seq_of(&outs[1].payload);
    let mut sent = 0;
    let unsent = hand_over(&mut e, outs, |_| {
        sent += 1;
        sent == 1
    });
    let mut want: Vec<usize> = carried[1..].concat();
    want.sort();
    let mut got = unsent.clone();
    got.sort();
    assert_eq!(got, want, "the refused message's records and every later one's, none sent");
    // The next message takes the seq the refused one had: the host sees no gap.
    assert_eq!(seq_of(&e.ddeath(0).payload), first_refused);
    // All sent: nothing returned.
    let outs = e.ddata(&recs[..2], true, 3);
    assert!(hand_over(&mut e, outs, |_| true).is_empty());
}

#[test]
fn deaths_and_messages_carry_the_time_they_are_made() {
    let mut e = edge();
    let before = chrono::Utc::now().timestamp_millis() as u64;
    let death = decode(&e.ndeath(4));
    let birth = decode(&e.nbirth(4));
    let after = chrono::Utc::now().timestamp_millis() as u64;
    for (what, p) in [("NDEATH", &death), ("NBIRTH", &birth)] {
        let t = p.timestamp.unwrap_or_else(|| panic!("{what} has no timestamp"));
        assert!((before..=after).contains(&t), "{what}: {t} not within {before}..={after}");
        // bdSeq has no sample time of its own: it gets the payload's.
        assert_eq!(p.metrics[0].timestamp, Some(t), "{what}");
    }
}

#[test]
fn a_lost_connection_leaves_no_device_born() {
    let mut e = edge();
    e.nbirth(0);
    e.dbirth(0, |_| None);
    e.dbirth(1, |_| None);
    assert!(e.is_born(0) && e.is_born(1));
    e.all_dead();
    assert!(!e.is_born(0) && !e.is_born(1));
}

#[test]
fn a_births_values_are_known_as_carried_until_its_births_are_dropped() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    let s = reg.sensor(&"A_LINE1_001".parse().unwrap()).unwrap();
    let id = s.id.to_string();
    e.dbirth(s.place.device, |x| (x.id == s.id).then(|| sample(4.0, 1000, SampleQuality::Good)));
    assert!(e.carried_by_birth(&id, 1000));
    assert!(!e.carried_by_birth(&id, 999) && !e.carried_by_birth("A_LINE1_002", 1000));
    assert!(!e.carried_by_birth("NOT_A_SENSOR", 1000));
    assert_eq!(e.carried(), [(id.clone(), 1000)]);
    // The broker took those births: dropping later ones leaves these carried.
    e.births_taken();
    e.dbirth(s.place.device, |x| (x.id == s.id).then(|| sample(5.0, 2000, SampleQuality::Good)));
    e.births_dropped();
    assert!(e.carried_by_birth(&id, 1000), "taken");
    assert!(!e.carried_by_birth(&id, 2000), "dropped: drained after all");
    e.forget_carried();
    assert!(e.carried().is_empty());
}

#[test]
fn an_opc_ua_metrics_datatype_is_decided_by_a_good_value_only() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    let s = reg.sensor(&"B_OVEN2_001".parse().unwrap()).unwrap();
    let at = |v: RawValue, quality| Sample {
        value: v,
        at: chrono::DateTime::from_timestamp_millis(1000).unwrap(),
        quality,
    };
    let datatype = |o: &Out| {
        decode(o).metrics.iter().find(|m| m.name.as_deref() == Some(s.id.as_str())).and_then(|m| m.datatype)
    };
    // A bad value may be a stand-in: it does not decide the type.
    let b =
        e.dbirth(s.place.device, |x| (x.id == s.id).then(|| at(RawValue::Bool(true), SampleQuality::Bad)));
    assert_eq!(datatype(&b), Some(metric::datatype_of(s, None)));
    let b = e.dbirth(s.place.device, |x| (x.id == s.id).then(|| at(RawValue::Int(7), SampleQuality::Good)));
    assert_eq!(datatype(&b), Some(crate::spb::payload::datatype::INT64));
    // Decided once, kept across births (hosts take a change of type as an error).
    let b =
        e.dbirth(s.place.device, |x| (x.id == s.id).then(|| at(RawValue::Bool(true), SampleQuality::Good)));
    assert_eq!(datatype(&b), Some(crate::spb::payload::datatype::INT64));
}

/// A DCMD is a device's rebirth only when it holds `Device Control/Rebirth` = true and
/// nothing else (anything more is a write, refused whole).
#[test]
fn a_device_rebirth_is_that_one_metric_set_true_and_nothing_else() {
    let control =
        |name: &str, v: bool| Metric::new(Some(name), None, datatype::BOOLEAN, Some(Value::Boolean(v)));
    let p = |metrics: Vec<Metric>| Payload { metrics, ..Payload::default() };
    assert!(asks_device_rebirth(&p(vec![control(DEVICE_REBIRTH, true)])));
    assert!(!asks_device_rebirth(&p(vec![control(DEVICE_REBIRTH, false)])), "false asks nothing");
    assert!(!asks_device_rebirth(&p(vec![control(REBIRTH, true)])), "the node's control is not the device's");
    assert!(
        !asks_device_rebirth(&p(vec![control(DEVICE_REBIRTH, true), control("A_LINE1_001", true)])),
        "with a write"
    );
    assert!(!asks_device_rebirth(&p(Vec::new())));
    // The right name with a value that is no boolean asks nothing either.
    let odd = Metric::new(Some(DEVICE_REBIRTH), None, datatype::INT32, Some(Value::Int(1)));
    assert!(!asks_device_rebirth(&p(vec![odd])));
}

/// A live value no newer than what its device's current DBIRTH carried is covered by the
/// birth; a newer one, one of a device not born, or of an unknown sensor is not.
#[test]
fn a_birth_covers_the_values_up_to_the_time_it_carried() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    let s = reg.sensor(&"A_LINE1_001".parse().unwrap()).unwrap();
    assert!(!e.birth_covers("A_LINE1_001", 500), "not born");
    e.dbirth(s.place.device, |x| (x.id == s.id).then(|| sample(4.0, 1000, SampleQuality::Good)));
    assert!(e.birth_covers("A_LINE1_001", 1000));
    assert!(e.birth_covers("A_LINE1_001", 999));
    assert!(!e.birth_covers("A_LINE1_001", 1001));
    assert!(!e.birth_covers("A_LINE1_002", 0), "born without a value: nothing carried");
    assert!(!e.birth_covers("Z_NONE_001", 0));
    e.ddeath(s.place.device);
    assert!(!e.birth_covers("A_LINE1_001", 1000), "the device died: its birth covers nothing now");
}

/// A clock step is a step back of a minute or more: exactly a minute back is one.
#[test]
fn exactly_a_minute_back_is_a_clock_step() {
    let mut e = edge();
    e.nbirth(0);
    let reg = e.registry.clone();
    let s = reg.sensors().iter().find(|s| s.deadband.is_none() && s.range.is_some()).unwrap();
    e.dbirth(s.place.device, |x| (x.id == s.id).then(|| sample(4.0, 100_000, SampleQuality::Good)));
    let step = crate::store::history::CLOCK_STEP_MS;
    assert!(e.offer(s, &sample(5.0, 100_000 - step + 1, SampleQuality::Good)).is_none(), "late, not a step");
    assert!(e.offer(s, &sample(5.0, 100_000 - step, SampleQuality::Good)).is_some(), "a step");
}
