//! `list_sensors`: filters, paging with cursors, errors, and the output schema.

use std::collections::BTreeSet;

use super::support::*;
use fieldgate::tools::{ErrorCode, TOOLS};
use proptest::prelude::*;
use serde_json::{Value, json};

fn ids(e: &fieldgate::tools::Envelope) -> Vec<String> {
    e.json()["sensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sensor_id"].as_str().unwrap().to_string())
        .collect()
}

/// Follows `next_cursor` to the end and returns every ID in order.
async fn all_pages(mut args: Value) -> (Vec<String>, usize) {
    let svc = service();
    let mut out = Vec::new();
    let mut pages = 0;
    loop {
        let e = svc.call("list_sensors", args.clone()).await.unwrap();
        assert!(e.ok, "{e:?}");
        pages += 1;
        out.extend(ids(&e));
        let data = e.json();
        match data["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(data["complete"], false);
                args["cursor"] = json!(c);
            }
            None => {
                assert_eq!(data["complete"], true);
                assert_eq!(data["total"].as_u64().unwrap() as usize, out.len());
                return (out, pages);
            }
        }
    }
}

/// Every sensor the demo device files declare, as `(id, plant, kind)`, read with the `toml`
/// crate straight from the files (not through the registry, whose order is under test) and
/// sorted by the ID's text.
fn declared_sensors() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(demo_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let doc: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
        let plant = doc["plant"].as_str().unwrap().to_string();
        for s in doc["sensors"].as_array().unwrap() {
            out.push((
                s["id"].as_str().unwrap().to_string(),
                plant.clone(),
                s["kind"].as_str().unwrap().to_string(),
            ));
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out
}

#[tokio::test]
async fn default_page_lists_every_demo_sensor_sorted() {
    let e = call("list_sensors", json!({})).await;
    let got = ids(&e);
    let want: Vec<String> = declared_sensors().into_iter().map(|s| s.0).collect();
    assert_eq!(want.len(), 44, "the demo plant declares 44 sensors");
    assert_eq!(got, want);
    assert_eq!(e.json()["total"], want.len());
    // Written out where plants and zones meet, so the oracle is not trusted alone.
    let at = |id: &str| got.iter().position(|g| g == id).unwrap();
    assert_eq!(&got[..2], ["A_LINE1_001", "A_LINE1_002"]);
    assert_eq!(at("A_LINE1_015") + 1, at("A_UTIL_001"));
    assert_eq!(at("A_UTIL_009") + 1, at("B_BOILER_001"));
    assert_eq!(at("B_BOILER_012") + 1, at("B_OVEN2_001"));
    assert_eq!(got.last().unwrap(), "B_OVEN2_008");
}

/// Sensors declared out of order, across files whose names sort the other way round, are
/// listed by ID: the order is the tool's, not the files'.
#[tokio::test]
async fn sensors_declared_out_of_order_are_listed_by_id() {
    let device = |id: &str, plant: &str, zone: &str, port: u16, sensors: &[&str]| {
        let mut text = format!(
            "id = \"{id}\"\nplant = \"{plant}\"\nzone = \"{zone}\"\ndescription = \"d\"\n\
             protocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:{port}\"\n"
        );
        for (i, s) in sensors.iter().enumerate() {
            text.push_str(&format!(
                "\n[[sensors]]\nid = \"{s}\"\ndescription = \"s\"\nkind = \"flow\"\nunit = \"m3/h\"\n\
                 table = \"holding\"\naddress = {}\ntype = \"u16\"\n",
                i
            ));
        }
        text
    };
    let dir = device_dir(&[
        ("a.toml", &device("z-dev", "Z", "WEST", 1, &["Z_WEST_010", "Z_WEST_002", "Z_WEST_100"])),
        ("b.toml", &device("m-dev", "M", "EAST", 2, &["M_EAST_007", "M_EAST_001"])),
        ("c.toml", &device("m-dev2", "M", "BACK", 3, &["M_BACK_900"])),
    ]);
    let registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let svc = fieldgate::tools::ToolService::new(
        std::sync::Arc::new(registry),
        fieldgate::config::Config::default(),
    );
    let want = ["M_BACK_900", "M_EAST_001", "M_EAST_007", "Z_WEST_002", "Z_WEST_010", "Z_WEST_100"];
    let e = svc.call("list_sensors", json!({})).await.unwrap();
    assert_eq!(ids(&e), want);
    // And across pages.
    let mut args = json!({"limit": 4});
    let first = svc.call("list_sensors", args.clone()).await.unwrap();
    args["cursor"] = first.json()["next_cursor"].clone();
    let second = svc.call("list_sensors", args).await.unwrap();
    assert_eq!([ids(&first), ids(&second)].concat(), want);
}

#[tokio::test]
async fn paging_returns_every_sensor_exactly_once() {
    let n = demo_registry().sensors().len();
    for limit in [1, 2, 3, 7, 10, n - 1, n, n + 1, 1000] {
        let (got, pages) = all_pages(json!({ "limit": limit })).await;
        let unique: BTreeSet<_> = got.iter().collect();
        assert_eq!(unique.len(), got.len(), "duplicates with limit {limit}");
        assert_eq!(got.len(), n, "limit {limit}");
        assert_eq!(pages, n.div_ceil(limit).max(1), "limit {limit}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn paging_with_filters_matches_an_unpaged_listing(
        limit in 1u32..12,
        plant in prop::option::of(prop::sample::select(vec!["A", "B"])),
        kind in prop::option::of(prop::sample::select(vec!["pressure", "temperature", "status", "count"])),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut args = json!({ "limit": limit });
        if let Some(p) = plant { args["plant"] = json!(p); }
        if let Some(k) = kind { args["kind"] = json!(k); }
        let (paged, _) = rt.block_on(all_pages(args));
        let want: Vec<String> = declared_sensors()
            .into_iter()
            .filter(|(_, p, k)| plant.is_none_or(|want| p == want) && kind.is_none_or(|want| k == want))
            .map(|(id, ..)| id)
            .collect();
        prop_assert_eq!(paged, want);
    }
}

#[tokio::test]
async fn filters_combine() {
    let e = call("list_sensors", json!({"zone": "LINE1", "kind": "pressure"})).await;
    assert_eq!(ids(&e), ["A_LINE1_001", "A_LINE1_002"]);
    let e = call("list_sensors", json!({"device_id": "a-util-meter", "text": "voltage l2"})).await;
    assert_eq!(ids(&e), ["A_UTIL_002"]);
    // Text matches the equipment tag, case-insensitively.
    let e = call("list_sensors", json!({"text": "p-101"})).await;
    assert!(ids(&e).len() >= 4 && ids(&e).iter().all(|i| i.starts_with("A_LINE1_")));
    // A text that matches nothing is an empty success, not an error.
    let e = call("list_sensors", json!({"text": "no such words"})).await;
    assert!(e.ok);
    assert_eq!(e.json()["total"], 0);
}

/// Text of spaces only names no word: refused as the empty text is, not read as no filter.
#[tokio::test]
async fn text_of_spaces_only_is_refused_like_empty_text() {
    for text in ["", "   "] {
        let e = call("list_sensors", json!({"text": text})).await;
        let err = e.error.unwrap_or_else(|| panic!("{text:?} refused"));
        assert_eq!(
            (err.code, err.parameter.as_deref()),
            (ErrorCode::InvalidArgument, Some("text")),
            "{text:?}"
        );
    }
    // The kind is searched too.
    let e = call("list_sensors", json!({"text": "temperature", "kind": "temperature"})).await;
    let n = e.json()["total"].as_u64().unwrap();
    assert!(n > 0);
}

#[tokio::test]
async fn unknown_filter_values_are_errors_with_suggestions() {
    let e = call("list_sensors", json!({"zone": "LINE2"})).await;
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.parameter.as_deref(), Some("zone"));
    assert_eq!(err.suggestions, ["LINE1"]);
    assert!(err.expected.unwrap().contains("BOILER"));

    let e = call("list_sensors", json!({"kind": "presure"})).await;
    assert_eq!(e.error.unwrap().suggestions, ["pressure"]);

    let e = call("list_sensors", json!({"device_id": "a-line1-plk"})).await;
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::DeviceNotFound);
    assert!(!err.retryable);
    assert_eq!(err.suggestions, ["a-line1-plc"]);
}

#[tokio::test]
async fn cursors_are_checked() {
    let e = call("list_sensors", json!({"limit": 2})).await;
    let cursor = e.json()["next_cursor"].as_str().unwrap().to_string();

    // The same cursor with other filters is refused, not silently misapplied.
    let e = call("list_sensors", json!({"limit": 2, "plant": "B", "cursor": cursor})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::InvalidArgument, Some("cursor")));
    assert!(err.message.contains("other filters"), "{}", err.message);

    for bad in ["garbage", "eyJ4IjoxfQ", "!!!"] {
        let e = call("list_sensors", json!({"cursor": bad})).await;
        let err = e.error.unwrap();
        assert_eq!(err.parameter.as_deref(), Some("cursor"), "{bad}");
        assert!(err.hint.contains("omit cursor"));
    }
}

#[tokio::test]
async fn every_result_matches_the_output_schema() {
    let schema = TOOLS.iter().find(|t| t.name() == "list_sensors").unwrap().output_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for args in [
        json!({}),
        json!({"limit": 3}),
        json!({"zone": "NOPE"}),
        json!({"device_id": "x"}),
        json!({"limit": "3", "extra": true}),
        json!({"cursor": "bad"}),
    ] {
        let e = call("list_sensors", args.clone()).await;
        let v = serde_json::to_value(&e).unwrap();
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{args}: {errors:?}\n{v}");
        assert_eq!(v["ok"], e.error.is_none());
        assert!(v["meta"]["call_id"].as_str().unwrap().starts_with("c_"));
    }
}
