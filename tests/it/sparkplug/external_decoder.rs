//! Our payloads decoded by Eclipse Tahu's JavaScript `sparkplug-payload` (installed by
//! `scripts/test-deps` into `target/sparkplug-js`), so a field-number mistake in our prost types
//! cannot pass unseen: both sides written by us would agree with each other anyway.

use crate::support::OutputWithin as _;
use std::path::PathBuf;
use std::sync::Arc;

use fieldgate::driver::RawValue;
use fieldgate::driver::{Sample, SampleQuality};
use fieldgate::sparkplug::buffer::Rec;
use fieldgate::sparkplug::node::Edge;
use fieldgate::spb::topic::Topics;
use fieldgate::store::gorilla::Stored;
use serde_json::Value;

use crate::support;

/// Where `scripts/test-deps` installs the decoder.
pub fn decoder_modules() -> PathBuf {
    support::root().join("target/sparkplug-js/node_modules")
}

/// Decodes each payload with the JavaScript decoder.
pub fn decode_js(payloads: &[Vec<u8>]) -> Vec<Value> {
    let modules = decoder_modules();
    assert!(
        modules.join("sparkplug-payload").is_dir(),
        "Eclipse Tahu's sparkplug-payload is not installed: run `npm install --prefix target/sparkplug-js sparkplug-payload@1.0.3` (scripts/test-deps does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let f = dir.path().join(format!("{i}.bin"));
            std::fs::write(&f, p).unwrap();
            f
        })
        .collect();
    let out = std::process::Command::new("node")
        .arg(support::root().join("tests/it/sparkplug/decode.js"))
        .args(&files)
        .env("NODE_PATH", &modules)
        .output_within()
        .expect("node runs");
    assert!(out.status.success(), "decoder failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn sample(v: RawValue, t: i64) -> Sample {
    Sample { value: v, at: chrono::DateTime::from_timestamp_millis(t).unwrap(), quality: SampleQuality::Good }
}

#[test]
fn tahu_decodes_births_and_data() {
    let registry = Arc::new(support::demo_registry());
    let mut edge = Edge::new(Topics::new("A", "gw"), registry.clone(), 60_000);
    let nbirth = edge.nbirth(42);
    let plc = registry.devices().iter().position(|d| d.id.as_str() == "a-line1-plc").unwrap();
    let dbirth = edge.dbirth(plc, |s| match s.id.as_str() {
        "A_LINE1_001" => Some(sample(RawValue::Float(4.25), 1_700_000_000_123)),
        _ => None,
    });
    let recs = [
        Rec { sensor: "A_LINE1_001".into(), t: 1_700_000_001_000, value: Stored::Float(4.5), quality: 0 },
        Rec { sensor: "A_LINE1_001".into(), t: 1_700_000_002_000, value: Stored::Float(4.75), quality: 2 },
    ];
    let ddata = edge.ddata(&recs, true, 100);
    let death = edge.ndeath(42);
    let js = decode_js(&[nbirth.payload, dbirth.payload, ddata[0].payload.clone(), death.payload]);

    let (nb, db, dd, nd) = (&js[0], &js[1], &js[2], &js[3]);
    assert_eq!(nb["seq"], 0);
    assert_eq!(nb["metrics"][0]["name"], "bdSeq");
    assert_eq!(nb["metrics"][0]["type"], "Int64");
    assert_eq!(nb["metrics"][0]["value"], 42);
    assert_eq!(nb["metrics"][1]["name"], "Node Control/Rebirth");
    assert_eq!(nb["metrics"][1]["type"], "Boolean");
    assert_eq!(nb["metrics"][1]["value"], false);
    // Regression (issue 32): NBIRTH's metrics carried no timestamp; Sparkplug 3.0 wants one
    // on every metric of NBIRTH, DBIRTH, NDATA and DDATA.
    for m in nb["metrics"].as_array().unwrap() {
        assert_eq!(m["timestamp"], nb["timestamp"], "{m}");
    }

    assert_eq!(db["seq"], 1);
    let m = db["metrics"].as_array().unwrap().iter().find(|m| m["name"] == "A_LINE1_001").unwrap();
    assert_eq!(m["type"], "Float", "{m}");
    assert_eq!(m["value"], 4.25);
    assert_eq!(m["timestamp"], 1_700_000_000_123u64);
    let alias = m["alias"].as_u64().unwrap();
    assert_eq!(m["properties"]["engUnit"]["value"], "bar");
    assert_eq!(m["properties"]["engUnit"]["type"], "String");
    assert_eq!(m["properties"]["engLow"]["value"], 2.0);
    assert_eq!(m["properties"]["engHigh"]["type"], "Double");
    assert_eq!(m["properties"]["kind"]["value"], "pressure");
    assert_eq!(m["properties"]["Quality"]["value"], 192);
    assert_eq!(m["properties"]["Quality"]["type"], "Int32");
    // What the fleet hub needs to serve the sensor as the edge does, read by Tahu.
    assert_eq!(m["properties"]["protocol"]["value"], "modbus-tcp", "{m}");
    assert_eq!(m["properties"]["protocol"]["type"], "String");
    assert_eq!(m["properties"]["dataType"]["value"], "f32");
    assert_eq!(m["properties"]["history"]["value"], true);
    assert_eq!(m["properties"]["history"]["type"], "Boolean");
    assert_eq!(m["properties"]["expectedIntervalMs"]["value"], 60_000);
    assert_eq!(m["properties"]["expectedIntervalMs"]["type"], "UInt64");
    assert_eq!(m["properties"]["equipment"]["value"], "P-101");
    let unread = db["metrics"].as_array().unwrap().iter().find(|m| m["name"] == "A_LINE1_002").unwrap();
    assert_eq!(unread["value"], Value::Null, "no value yet: null");
    assert!(db["metrics"].as_array().unwrap().iter().all(|m| m["timestamp"].is_u64()), "{db}");

    assert_eq!(dd["seq"], 2);
    let ms = dd["metrics"].as_array().unwrap();
    assert_eq!(ms.len(), 2);
    assert_eq!(ms[0]["alias"].as_u64(), Some(alias));
    assert_eq!(ms[0].get("name"), None);
    assert_eq!(ms[0]["isHistorical"], true);
    assert_eq!(ms[0]["value"], 4.5);
    assert_eq!(ms[1]["timestamp"], 1_700_000_002_000u64);
    assert_eq!(ms[1]["properties"]["Quality"]["value"], 0);

    assert_eq!(nd.get("seq"), None, "NDEATH has no seq");
    assert_eq!(nd["metrics"][0]["value"], 42);
    assert_eq!(nd["metrics"][0]["timestamp"], nd["timestamp"], "{nd}");
}

/// Value types of the demo line's PLC, decoded by Tahu: each Sparkplug datatype in the
/// field the specification gives it (UInt32 in `long_value` like UInt64; the narrower
/// integers' `int_value` is read in the test above, by the Int32 quality property), values
/// beyond the signed 32-bit range included.
#[test]
fn tahu_decodes_each_datatype_from_its_own_field() {
    let registry = Arc::new(support::demo_registry());
    let mut edge = Edge::new(Topics::new("A", "gw"), registry.clone(), 60_000);
    edge.nbirth(1);
    let plc = registry.devices().iter().position(|d| d.id.as_str() == "a-line1-plc").unwrap();
    let dbirth = edge.dbirth(plc, |_| None);
    let cases: [(&str, Stored, &str, Value); 5] = [
        // Stored raw; the sensor's scale (0.1) applies on the way out.
        ("A_LINE1_003", Stored::Float(-12.5), "Double", Value::from(-1.25)),
        ("A_LINE1_015", Stored::Int(5_000_000_000), "UInt64", Value::from(5_000_000_000u64)),
        ("A_LINE1_006", Stored::Int(4_000_000_000), "UInt32", Value::from(4_000_000_000u64)),
        ("A_LINE1_008", Stored::Bool(true), "Boolean", Value::from(true)),
        ("A_LINE1_013", Stored::Text("LOT-7".into()), "String", Value::from("LOT-7")),
    ];
    let recs: Vec<Rec> = cases
        .iter()
        .map(|(id, v, _, _)| Rec {
            sensor: id.to_string(),
            t: 1_700_000_001_000,
            value: v.clone(),
            quality: 2,
        })
        .collect();
    let ddata = edge.ddata(&recs, false, 100);
    assert_eq!(ddata.len(), 1);
    let js = decode_js(&[dbirth.payload, ddata[0].payload.clone()]);
    let born = js[0]["metrics"].as_array().unwrap();
    let sent = js[1]["metrics"].as_array().unwrap();
    for (i, (id, _, ty, want)) in cases.iter().enumerate() {
        let b = born.iter().find(|m| m["name"] == *id).unwrap();
        assert_eq!(b["type"], *ty, "{id} born as {b}");
        assert_eq!(sent[i]["alias"], b["alias"], "{id}");
        assert_eq!(sent[i]["type"], *ty, "{id}");
        assert_eq!(sent[i]["value"], *want, "{id}: {}", sent[i]);
    }
}
