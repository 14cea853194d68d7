//! Property-based fuzzing with fixed case counts, run in CI: whatever comes in (tool
//! arguments, cursors, device files), fieldgate answers with a structured result and
//! never panics or fails internally. (cargo-fuzz needs a nightly toolchain; these run on
//! the stable one.)

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::support::*;

/// Parameter names the tools know, and some they do not, so that both the schema layer and
/// the domain layer are reached.
const KEYS: &[&str] = &[
    "sensor_id",
    "sensor_ids",
    "plant",
    "zone",
    "device_id",
    "kind",
    "text",
    "limit",
    "cursor",
    "unit",
    "max_age_ms",
    "from",
    "to",
    "bucket",
    "type",
    "priority",
    "summary",
    "idempotency_key",
    "work_order_id",
    "status",
    "since",
    "start",
    "x",
    "",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        "[A-Z]{1,3}_[A-Z0-9]{1,6}_[0-9]{3}".prop_map(Value::String),
        // Real IDs, so that mixes of known and unknown sensors are reached.
        prop::sample::select(
            &[
                "A_LINE1_001",
                "A_LINE1_015",
                "A_UTIL_002",
                "B_BOILER_001",
                "B_OVEN2_003",
                "WO-000001",
                "a-line1-plc"
            ][..]
        )
        .prop_map(|s| Value::String(s.to_string())),
        "\\PC{0,30}".prop_map(Value::String),
        Just(json!("2026-11-30T00:00:00Z")),
        Just(json!("-15m")),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

fn arguments() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => prop::collection::vec((prop::sample::select(KEYS), json_value()), 0..6)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Map<_, _>>())),
        1 => json_value(),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// One simulated demo plant for every case, on a runtime of its own that keeps it served.
fn shared_plant() -> &'static (tokio::runtime::Runtime, Plant) {
    static PLANT: std::sync::OnceLock<(tokio::runtime::Runtime, Plant)> = std::sync::OnceLock::new();
    PLANT.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        // Every case calls it: no rate limit in the way.
        let mut config = fieldgate::config::Config::default();
        config.server.rate_limit_per_minute = 1_000_000;
        let plant = rt.block_on(demo_plant_with(config));
        (rt, plant)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Any JSON as any tool's arguments: an envelope, never INTERNAL, never a panic.
    #[test]
    fn arbitrary_arguments_get_a_structured_answer(tool in prop::sample::select(&[
        "list_sensors", "get_sensor_reading", "get_sensor_readings", "get_sensor_history",
        "get_device_status", "create_work_order", "get_work_order", "list_work_orders",
    ][..]), args in arguments()) {
        // Devices behind the simulator, so that a valid sensor ID reads quickly.
        let (rt, plant) = shared_plant();
        let e = rt.block_on(plant.service.call(tool, args.clone())).expect("served tool");
        if let Some(err) = &e.error {
            prop_assert_ne!(err.code.as_str(), "INTERNAL", "{} {}: {:?}", tool, args, err);
            prop_assert!(!err.message.is_empty() && !err.hint.is_empty());
        }
    }

    /// Batches mixing known and unknown sensors: every sensor is either read or in
    /// `failed`, in request order, or (none read) the call fails with every one in details.
    #[test]
    fn batches_account_for_every_sensor(picks in prop::collection::vec((any::<bool>(), 0usize..44, 100u16..999), 1..12)) {
        let (rt, plant) = shared_plant();
        let known: Vec<String> = plant.service.registry().sensors().iter().map(|s| s.id.to_string()).collect();
        let mut ids: Vec<String> = picks
            .iter()
            .map(|(real, i, n)| if *real { known[i % known.len()].clone() } else { format!("A_LINE1_{n:03}") })
            .collect();
        ids.dedup();
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| seen.insert(id.clone()));
        let e = rt.block_on(plant.service.call("get_sensor_readings", json!({ "sensor_ids": ids }))).expect("served");
        match &e.error {
            None => {
                let d = e.json();
                let read: Vec<&str> = d["readings"].as_array().unwrap().iter().map(|r| r["sensor_id"].as_str().unwrap()).collect();
                let failed: Vec<&str> = d["failed"].as_array().unwrap().iter().map(|f| f["sensor_id"].as_str().unwrap()).collect();
                prop_assert_eq!(read.len() + failed.len(), ids.len(), "{}", d);
                for (k, f) in d["failed"].as_array().unwrap().iter().enumerate() {
                    let at = ids.iter().position(|i| i == failed[k]).unwrap();
                    let want = format!("sensor_ids/{at}");
                    prop_assert_eq!(f["error"]["parameter"].as_str(), Some(want.as_str()));
                }
            }
            Some(err) => {
                prop_assert_ne!(err.code.as_str(), "INTERNAL");
                prop_assert!(ids.len() == 1 || err.details.len() == ids.len(), "{:?}", err);
            }
        }
    }

    /// Any string as a cursor: INVALID_ARGUMENT about `cursor`, never anything else.
    #[test]
    fn arbitrary_cursors_are_refused_as_such(cursor in prop_oneof![
        "\\PC{0,60}",
        "[A-Za-z0-9_-]{0,80}",
        prop::collection::vec(any::<u8>(), 0..60).prop_map(|b| {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
        }),
        json_value().prop_map(|v| {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        }),
    ]) {
        let rt = runtime();
        let svc = service();
        for (tool, mut args) in [
            ("list_sensors", json!({})),
            ("get_sensor_history", json!({"sensor_id": "A_LINE1_001", "from": "2026-11-30T00:00:00Z", "to": "2026-11-30T01:00:00Z"})),
            ("list_work_orders", json!({})),
        ] {
            args["cursor"] = json!(cursor);
            let e = rt.block_on(svc.call(tool, args)).expect("served tool");
            // None was issued here (cursors carry a tag only this process can make).
            let err = e.error.as_ref();
            prop_assert!(err.is_some(), "{} accepted the cursor {:?}", tool, cursor);
            let err = err.unwrap();
            prop_assert_eq!(err.code.as_str(), "INVALID_ARGUMENT", "{}: {:?}", tool, err);
            prop_assert!(err.message.contains("cursor"), "{}: {:?}", tool, err);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A device file damaged in any way (bytes flipped, cut, lines doubled or dropped):
    /// loading reports problems with their file, or loads; it never panics.
    #[test]
    fn damaged_device_files_are_reported_never_a_panic(
        file in prop::sample::select(&["a-line1-plc.toml", "a-util-meter.toml", "b-boiler-rtu.toml", "b-oven2-opcua.toml"][..]),
        edits in prop::collection::vec((0u8..4, any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = std::fs::read(demo_dir().join(file)).unwrap();
        for (kind, at, byte) in edits {
            let i = at.index(bytes.len().max(1));
            match kind {
                0 if !bytes.is_empty() => bytes[i] = byte,
                1 => bytes.truncate(i),
                2 => {
                    // Double the line at `i`.
                    let start = bytes[..i].iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
                    let end = bytes[i..].iter().position(|b| *b == b'\n').map_or(bytes.len(), |p| i + p + 1);
                    let line = bytes[start..end].to_vec();
                    bytes.splice(end..end, line);
                }
                _ => {
                    let start = bytes[..i].iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
                    let end = bytes[i..].iter().position(|b| *b == b'\n').map_or(bytes.len(), |p| i + p + 1);
                    bytes.drain(start..end);
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(file), &bytes).unwrap();
        if let Err(e) = fieldgate::registry::Registry::load(dir.path()) {
            prop_assert!(!e.0.is_empty());
            for p in &e.0 {
                prop_assert!(p.source.contains(file) && !p.message.is_empty(), "{p:?}");
            }
        }
    }
}
