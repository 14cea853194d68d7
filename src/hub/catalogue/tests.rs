use super::*;
use crate::hub::fleet::{Clock, From, Timing};
use crate::spb::payload::{Metric, Payload, PropertySet, PropertyValue, Value, datatype};
use crate::spb::topic::Kind;

const T0: u64 = 1_700_000_000_000;

fn born(fleet: &mut Fleet, group: &str, node: &str, devices: &[(&str, &[&str])]) {
    born_at(fleet, T0, group, node, devices);
}

/// Born as the hub's clock says `at` (ms).
fn born_at(fleet: &mut Fleet, at: u64, group: &str, node: &str, devices: &[(&str, &[&str])]) {
    let clock = Clock {
        now: tokio::time::Instant::now(),
        wall: chrono::DateTime::from_timestamp_millis(at as i64).unwrap(),
    };
    let mut out = Vec::new();
    let bd = Metric::new(Some("bdSeq"), None, datatype::INT64, Some(Value::Long(0)));
    let nbirth = Payload { timestamp: Some(T0), metrics: vec![bd], seq: Some(0), uuid: None, body: None };
    fleet.on_message(From { group, node, kind: Kind::NBirth, device: None }, nbirth, clock, &mut out);
    let mut alias = 0;
    for (seq, (device, names)) in devices.iter().enumerate() {
        let metrics = names
            .iter()
            .map(|n| {
                alias += 1;
                let mut m = Metric::new(Some(n), Some(alias), datatype::UINT16, Some(Value::Int(7)));
                let mut p = PropertySet::default();
                p.push("engUnit", PropertyValue::string("bar"));
                p.push("protocol", PropertyValue::string("modbus-tcp"));
                p.push("dataType", PropertyValue::string("u16"));
                p.push("expectedIntervalMs", PropertyValue::long(30_000));
                m.properties = Some(p);
                m
            })
            .collect();
        let p = Payload { timestamp: Some(T0), metrics, seq: Some(seq as u64 + 1), uuid: None, body: None };
        fleet.on_message(From { group, node, kind: Kind::DBirth, device: Some(device) }, p, clock, &mut out);
    }
}

fn fleet() -> Fleet {
    Fleet::new(Timing { reorder_timeout: Duration::from_secs(2), rebirth_cooldown: Duration::from_secs(5) })
}

fn ids(r: &Registry) -> Vec<&str> {
    r.sensors().iter().map(|s| s.id.as_str()).collect()
}

#[test]
fn every_born_sensor_of_every_edge_with_where_it_comes_from() {
    let mut f = fleet();
    born(&mut f, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001", "A_LINE1_002"])]);
    born(&mut f, "B", "gw2", &[("b-press-plc", &["B_PRESS_001"])]);
    let (r, left) = build(&f).unwrap();
    assert_eq!(ids(&r), ["A_LINE1_001", "A_LINE1_002", "B_PRESS_001"]);
    assert_eq!(left, Left::default());
    let s = r.sensor_named("B_PRESS_001").unwrap();
    let SensorSource::Edge(p) = &s.source else { panic!("{:?}", s.source) };
    assert_eq!((p.edge, p.device, p.metric, p.data_type), (1, 0, 0, Some(DataType::U16)));
    assert_eq!(p.expected_interval, Some(Duration::from_secs(30)));
    let d = r.device_of(s);
    assert_eq!(d.endpoint, Endpoint::Edge { group: "B".into(), node: "gw2".into() });
    assert_eq!((d.plant.as_str(), d.zone.as_str(), d.protocol), ("B", "PRESS", Protocol::ModbusTcp));
    assert_eq!(s.unit, "bar");
    assert!(r.conflicts().is_empty());
}

#[test]
fn an_id_two_edges_announce_is_a_conflict_served_by_neither() {
    let mut f = fleet();
    born(&mut f, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001", "A_LINE1_002"])]);
    born(&mut f, "A", "gw9", &[("a-line1-spare", &["A_LINE1_002", "A_LINE1_003"])]);
    let (r, _) = build(&f).unwrap();
    assert_eq!(ids(&r), ["A_LINE1_001", "A_LINE1_003"]);
    let c = r.conflict("A_LINE1_002").unwrap();
    assert_eq!(c.claimants, ["A/gw1/a-line1-plc", "A/gw9/a-line1-spare"]);

    // The same device ID on two edge nodes: neither device is served.
    born(&mut f, "B", "gw2", &[("a-line1-plc", &["A_LINE1_004"])]);
    let (r, _) = build(&f).unwrap();
    assert_eq!(ids(&r), ["A_LINE1_003"]);
    assert_eq!(r.conflict("a-line1-plc").unwrap().claimants, ["A/gw1/a-line1-plc", "B/gw2/a-line1-plc"]);
    // Its sensors are withheld with it, each listed with who announced it, not every
    // claimant of the device (gw1 never announced A_LINE1_004).
    let c = r.conflict("A_LINE1_004").unwrap();
    assert_eq!(
        (c.claimants.as_slice(), c.device.as_deref()),
        (&["B/gw2/a-line1-plc".to_string()][..], Some("a-line1-plc"))
    );
    let c = r.conflict("A_LINE1_001").unwrap();
    assert_eq!(
        (c.claimants.as_slice(), c.device.as_deref()),
        (&["A/gw1/a-line1-plc".to_string()][..], Some("a-line1-plc"))
    );
    assert_eq!(r.conflict("a-line1-plc").unwrap().device, None);
}

#[test]
fn what_cannot_be_a_sensor_is_left_out_and_counted() {
    let mut f = fleet();
    born(
        &mut f,
        "X",
        "other",
        &[
            ("Line 1", &["A_LINE1_009"]),
            ("plc-7", &["Inputs/Temp", "temperature", "A_LINE1_010", "A_LINE2_011"]),
        ],
    );
    let (r, left) = build(&f).unwrap();
    assert_eq!(ids(&r), ["A_LINE1_010"]);
    assert_eq!(left, Left { not_sensor_ids: 1, not_device_ids: 1, misplaced: 1, superseded: 0 });
}

/// A sensor of a device whose ID is in conflict is withheld and listed too; a claim from an
/// earlier life of an edge node (dead, or born again without the device) gives way to a
/// current one, so a conflict clears once its cause is gone.
#[test]
fn device_conflicts_list_their_sensors_and_stale_claims_give_way() {
    let mut f = fleet();
    born(&mut f, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001", "A_LINE1_002"])]);
    born(&mut f, "Y", "fake", &[("a-line1-plc", &["A_LINE1_001"])]);
    let (r, _) = build(&f).unwrap();
    assert!(ids(&r).is_empty());
    let listed: Vec<&str> = r.conflicts().iter().map(|c| c.id.as_str()).collect();
    assert_eq!(listed, ["a-line1-plc", "A_LINE1_001", "A_LINE1_002"]);
    // The forger dies: its claims are of an earlier life now, and give way.
    let clock = Clock {
        now: tokio::time::Instant::now(),
        wall: chrono::DateTime::from_timestamp_millis(T0 as i64).unwrap(),
    };
    let death = Payload {
        timestamp: Some(T0),
        metrics: vec![Metric::new(Some("bdSeq"), None, datatype::INT64, Some(Value::Long(0)))],
        seq: None,
        uuid: None,
        body: None,
    };
    f.on_message(
        From { group: "Y", node: "fake", kind: Kind::NDeath, device: None },
        death,
        clock,
        &mut Vec::new(),
    );
    let (r, _) = build(&f).unwrap();
    assert_eq!(ids(&r), ["A_LINE1_001", "A_LINE1_002"]);
    assert!(r.conflicts().is_empty());
    assert_eq!(
        r.device_of(r.sensor_named("A_LINE1_001").unwrap()).endpoint,
        Endpoint::Edge { group: "A".into(), node: "gw1".into() }
    );
}

/// Its NDEATH, as the hub's clock says `at` (ms).
fn died(fleet: &mut Fleet, at: u64, group: &str, node: &str) {
    let clock = Clock {
        now: tokio::time::Instant::now(),
        wall: chrono::DateTime::from_timestamp_millis(at as i64).unwrap(),
    };
    let bd = Metric::new(Some("bdSeq"), None, datatype::INT64, Some(Value::Long(0)));
    let death = Payload { timestamp: Some(at), metrics: vec![bd], seq: None, uuid: None, body: None };
    fleet.on_message(From { group, node, kind: Kind::NDeath, device: None }, death, clock, &mut Vec::new());
}

/// The edge node holding `id` in `r`.
fn holder(r: &Registry, id: &str) -> Endpoint {
    r.device_of(r.sensor_named(id).unwrap()).endpoint.clone()
}

/// Regression (the adversarial walk, twice): an edge node whose rival died before it
/// keeps its IDs when it dies too (offline, answered `EDGE_OFFLINE`), instead of both
/// claims of earlier lives standing as a conflict, and however late the rival was born:
/// a forger that births after the real edge and dies first takes nothing with it.
#[test]
fn among_claims_of_earlier_lives_the_one_current_last_holds_the_id() {
    let gw = |n: &str| Endpoint::Edge { group: "A".into(), node: n.into() };
    let mut f = fleet();
    born_at(&mut f, T0, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001"])]);
    // The forger, born after the real one.
    born_at(&mut f, T0 + 1_000, "A", "gw2", &[("a-line1-plc", &["A_LINE1_001"])]);
    assert!(ids(&build(&f).unwrap().0).is_empty(), "both online: a conflict");
    died(&mut f, T0 + 2_000, "A", "gw2");
    assert_eq!(holder(&build(&f).unwrap().0, "A_LINE1_001"), gw("gw1"));
    died(&mut f, T0 + 3_000, "A", "gw1");
    let (r, _) = build(&f).unwrap();
    assert_eq!(ids(&r), ["A_LINE1_001"]);
    assert!(r.conflicts().is_empty(), "{:?}", r.conflicts());
    assert_eq!(holder(&r, "A_LINE1_001"), gw("gw1"), "the edge current last holds it, not the forger");
    let SensorSource::Edge(p) = &r.sensor_named("A_LINE1_001").unwrap().source else { panic!() };
    assert!(f.sole_claim("A_LINE1_001", p.edge, p.device), "history takes gw1's values, as the catalogue");
    // The ID moved: gw1 born again without it, then gw2 announces it and dies: gw2's.
    born_at(&mut f, T0 + 4_000, "A", "gw1", &[("a-line1-other", &["A_LINE1_009"])]);
    born_at(&mut f, T0 + 5_000, "A", "gw2", &[("a-line1-plc", &["A_LINE1_001"])]);
    died(&mut f, T0 + 6_000, "A", "gw2");
    assert_eq!(holder(&build(&f).unwrap().0, "A_LINE1_001"), gw("gw2"));
    // Two claims current until the same moment and born at the same time stand equal.
    let mut g = fleet();
    born_at(&mut g, T0, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001"])]);
    born_at(&mut g, T0, "A", "gw2", &[("a-line1-plc", &["A_LINE1_001"])]);
    died(&mut g, T0 + 1_000, "A", "gw1");
    died(&mut g, T0 + 1_000, "A", "gw2");
    assert!(ids(&build(&g).unwrap().0).is_empty());
    // A conflict between two live claims stays one when the hub loses the broker (both
    // stop being current at the same moment; the later birth wins nothing).
    let mut k = fleet();
    born_at(&mut k, T0, "A", "real", &[("a-line1-plc", &["A_LINE1_001"])]);
    born_at(&mut k, T0 + 1_000, "A", "forger", &[("a-line1-plc", &["A_LINE1_001"])]);
    k.broker_lost(chrono::DateTime::from_timestamp_millis(T0 as i64 + 2_000).unwrap());
    assert!(ids(&build(&k).unwrap().0).is_empty(), "still a conflict");
    // The hub losing the broker leaves every claim as it stood: the one current holds.
    let mut h = fleet();
    born_at(&mut h, T0, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001"])]);
    born_at(&mut h, T0 + 1_000, "A", "gw2", &[("a-line1-plc", &["A_LINE1_001"])]);
    died(&mut h, T0 + 2_000, "A", "gw2");
    h.broker_lost(chrono::DateTime::from_timestamp_millis(T0 as i64 + 3_000).unwrap());
    assert_eq!(
        holder(&build(&h).unwrap().0, "A_LINE1_001"),
        Endpoint::Edge { group: "A".into(), node: "gw1".into() }
    );
}

/// Regression (the adversarial walk): a device's plant and zone are those of most of its
/// sensors; one stray ID (first by name) no longer takes the others with it.
#[test]
fn a_device_is_where_most_of_its_sensors_are() {
    let mut f = fleet();
    born(&mut f, "J", "gw1", &[("j-line-plc", &["J_LINE_001", "J_LINE_002", "AA_STRAY_001", "J_LINE_003"])]);
    let (r, left) = build(&f).unwrap();
    assert_eq!(ids(&r), ["J_LINE_001", "J_LINE_002", "J_LINE_003"]);
    assert_eq!(left.misplaced, 1);
    // Equal counts: the first in the birth's order.
    let mut f = fleet();
    born(&mut f, "J", "gw1", &[("j-line-plc", &["J_LINE_001", "AA_STRAY_001"])]);
    assert_eq!(ids(&build(&f).unwrap().0), ["J_LINE_001"]);
}

/// Regression (the adversarial walk): a device born with an alias another device of its
/// edge node holds is listed, but no value of either metric is served (it could be the
/// other's): the agent is told the edge's fault, not handed a birth value forever.
#[test]
fn a_sensor_whose_alias_another_metric_holds_serves_no_value() {
    let mut f = fleet();
    born(&mut f, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001", "A_LINE1_002"])]);
    let clock = Clock {
        now: tokio::time::Instant::now(),
        wall: chrono::DateTime::from_timestamp_millis(T0 as i64).unwrap(),
    };
    // Alias 1 is A_LINE1_001's already.
    let m = Metric::new(Some("A_LINE2_001"), Some(1), datatype::UINT16, Some(Value::Int(3)));
    let p = Payload { timestamp: Some(T0), metrics: vec![m], seq: Some(2), uuid: None, body: None };
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DBirth, device: Some("a-line2-plc") },
        p,
        clock,
        &mut Vec::new(),
    );
    let (r, _) = build(&f).unwrap();
    let now = chrono::DateTime::from_timestamp_millis(T0 as i64 + 1_000).unwrap();
    for (id, shared) in [("A_LINE1_001", true), ("A_LINE1_002", false), ("A_LINE2_001", true)] {
        let got = crate::hub::source::latest(&f, r.sensor_named(id).unwrap(), now);
        match got {
            Err(crate::driver::DriverError::AliasShared { edge }) => {
                assert!(shared && edge == "A/gw1", "{id}")
            }
            Ok(s) => assert!(!shared && s.value == crate::driver::RawValue::UInt(7), "{id}: {s:?}"),
            Err(e) => panic!("{id}: {e:?}"),
        }
    }
}

/// Regression (the adversarial walk): a device that moved to another edge node (born there,
/// its old edge dead) is served from where it is now, with the sensors it has now; the one
/// it left behind is no longer served, and a dead forger's device takes nothing from the
/// live one (catalogue and readings agree on the edge).
#[test]
fn a_device_id_is_served_from_the_claim_that_holds_it_with_its_own_sensors() {
    let gw = |n: &str| Endpoint::Edge { group: "M".into(), node: n.into() };
    let mut f = fleet();
    born_at(&mut f, T0, "M", "gw-old", &[("m-pump", &["M_ZONE1_001", "M_ZONE1_002"])]);
    died(&mut f, T0 + 1_000, "M", "gw-old");
    born_at(&mut f, T0 + 2_000, "M", "gw-new", &[("m-pump", &["M_ZONE1_002", "M_ZONE1_003"])]);
    let (r, left) = build(&f).unwrap();
    assert_eq!(ids(&r), ["M_ZONE1_002", "M_ZONE1_003"]);
    assert_eq!(left.superseded, 1);
    assert_eq!(r.device(&"m-pump".parse().unwrap()).unwrap().endpoint, gw("gw-new"));
    for id in ["M_ZONE1_002", "M_ZONE1_003"] {
        let SensorSource::Edge(p) = &r.sensor_named(id).unwrap().source else { panic!() };
        assert_eq!(f.edges()[p.edge].node, "gw-new", "{id} read from where it is listed");
    }
    // History follows the same rule: the old edge's device writes nothing.
    let at = |node: &str| f.edges().iter().position(|e| e.node == node).unwrap();
    assert!(f.holds_device(at("gw-new"), 0));
    assert!(!f.holds_device(at("gw-old"), 0));
    // A forger's device (dead) with a sensor of its own: the live device keeps its ID and
    // the forger's sensor is not served under it.
    let mut g = fleet();
    born_at(&mut g, T0, "W", "forger", &[("w-dev", &["W_ZONE1_001", "W_ZONE1_003"])]);
    born_at(&mut g, T0 + 1_000, "W", "real", &[("w-dev", &["W_ZONE1_001", "W_ZONE1_002"])]);
    died(&mut g, T0 + 2_000, "W", "forger");
    let (r, _) = build(&g).unwrap();
    assert_eq!(ids(&r), ["W_ZONE1_001", "W_ZONE1_002"]);
    assert!(r.conflicts().is_empty(), "{:?}", r.conflicts());
}

/// Regression (the adversarial walk): a plant whose every sensor is in conflict is still a
/// plant to `list_sensors`: no sensor and the conflicts, not "no sensor has plant U".
#[tokio::test]
async fn a_plant_whose_sensors_are_all_in_conflict_lists_its_conflicts() {
    let mut f = fleet();
    born(&mut f, "A", "gw1", &[("a-line1-plc", &["A_LINE1_001"]), ("u-plc", &["U_ZONE1_001"])]);
    born(&mut f, "B", "gw2", &[("u-plc2", &["U_ZONE1_001"])]);
    let (r, _) = build(&f).unwrap();
    let svc = crate::tools::ToolService::new(std::sync::Arc::new(r), crate::config::Config::default());
    let e = svc.call("list_sensors", serde_json::json!({"plant": "U"})).await.unwrap();
    assert!(e.ok, "{:?}", e.error);
    let d = e.json();
    assert_eq!(d["sensors"].as_array().map(Vec::len), Some(0), "{d}");
    assert_eq!(d["conflicts"][0]["id"], "U_ZONE1_001", "{d}");
    let e = svc.call("list_sensors", serde_json::json!({"plant": "Q"})).await.unwrap();
    assert!(!e.ok, "a plant nobody announced is still refused");
}
