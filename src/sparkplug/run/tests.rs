use std::path::Path;
use std::sync::Arc;

use super::hand_over;
use crate::registry::Registry;
use crate::sparkplug::buffer::Rec;
use crate::sparkplug::node::Edge;
use crate::sparkplug::payload::Payload;
use crate::sparkplug::topic::Topics;
use crate::store::gorilla::Stored;

fn edge() -> Edge {
    let registry = Registry::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("devices")).unwrap();
    Edge::new(Topics::new("A", "gw"), Arc::new(registry), 60_000)
}

fn seq(payload: &[u8]) -> Option<u64> {
    Payload::decode_bytes(payload).unwrap().seq
}

/// Seven values of two devices, three metrics per message: messages of 3 + 1 values
/// of one device and 3 of the other (the order `ddata` makes them in).
fn recs(e: &Edge) -> Vec<Rec> {
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

#[test]
fn ddata_says_which_records_each_message_carries() {
    let mut e = edge();
    e.nbirth(1);
    for d in 0..e.registry_arc().devices().len() {
        e.dbirth(d, |_| None);
    }
    let recs = recs(&e);
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
    let mut e = edge();
    e.nbirth(1);
    for d in 0..e.registry_arc().devices().len() {
        e.dbirth(d, |_| None);
    }
    let recs = recs(&e);
    let outs = e.ddata(&recs, true, 3);
    assert!(outs.len() >= 3, "{} messages", outs.len());
    let carried: Vec<Vec<usize>> = outs.iter().map(|o| o.recs.clone()).collect();
    let first_refused = seq(&outs[1].payload);
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
    assert_eq!(seq(&e.ddeath(0).payload), first_refused);
    // All sent: nothing returned.
    let outs = e.ddata(&recs[..2], true, 3);
    assert!(hand_over(&mut e, outs, |_| true).is_empty());
}
