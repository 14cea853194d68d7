//! The three validation layers of docs/tool-contract.md §3.

use super::support::*;
use fieldgate::tools::validate::{known_sensor, parse_sensor_id};
use fieldgate::tools::{CallError, ErrorCode};
use serde_json::json;

// ---- layer 1: the schema

#[tokio::test]
async fn wrong_type_is_invalid_argument() {
    let e = call("list_sensors", json!({"plant": 7})).await;
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert!(!err.retryable && err.retry_after_ms.is_none());
    assert_eq!(err.parameter.as_deref(), Some("plant"));
    assert_eq!(err.expected.as_deref(), Some("string"));
    assert_eq!(err.received.as_deref(), Some("7"));
}

#[tokio::test]
async fn a_string_for_an_integer_is_not_coerced() {
    let e = call("list_sensors", json!({"limit": "150"})).await;
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.parameter.as_deref(), Some("limit"));
    assert_eq!(err.expected.as_deref(), Some("integer"));
    assert_eq!(err.received.as_deref(), Some("150"));
    assert!(err.hint.contains("limit"));
}

#[tokio::test]
async fn null_for_an_optional_argument_means_the_default() {
    let with_null = call("list_sensors", json!({"limit": null, "zone": null, "cursor": null})).await;
    let without = call("list_sensors", json!({})).await;
    assert!(with_null.ok, "{with_null:?}");
    assert_eq!(with_null.json(), without.json());
    // The default limit is 100, so the demo plant fits on one page.
    assert_eq!(with_null.json()["complete"], true);
}

#[tokio::test]
async fn unknown_field_is_rejected_with_the_nearest_parameter() {
    let e = call("list_sensors", json!({"zones": "LINE1"})).await;
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.parameter.as_deref(), Some("zones"));
    assert_eq!(err.suggestions, ["zone"]);
    assert!(err.expected.unwrap().contains("plant, zone, device_id"));
}

#[tokio::test]
async fn an_unknown_parameter_names_the_one_meant_in_the_hint() {
    // Alone: the suggestion and a hint that says it.
    let err = call("list_sensors", json!({"zonee": "LINE1"})).await.error.unwrap();
    assert_eq!(err.suggestions, ["zone"]);
    assert!(err.hint.contains("Did you mean `zone`?"), "{}", err.hint);
    // Names that are no typo of a parameter, but another word for one.
    let err = call("list_sensors", json!({"max": 5})).await.error.unwrap();
    assert_eq!(
        (err.parameter.as_deref(), err.suggestions.as_slice()),
        (Some("max"), &["limit".to_string()][..])
    );
    assert!(err.hint.contains("Did you mean `limit`?"), "{}", err.hint);
    // `start` for `from`: the required `from` is missing too; the hint joins the two.
    let e = call("get_sensor_history", json!({"sensor_id": "A_LINE1_001", "start": "-1h"})).await;
    let err = e.error.unwrap();
    assert_eq!(err.details.len(), 2, "{err:?}");
    let start = err.details.iter().find(|d| d.parameter == "start").unwrap();
    assert_eq!(start.suggestions, ["from"]);
    assert!(err.hint.contains("did you mean `from` instead of `start`?"), "{}", err.hint);
    // camelCase, and a synonym among the tool's own parameters only.
    let err = call("get_sensor_reading", json!({"sensorId": "A_LINE1_001"})).await.error.unwrap();
    assert!(err.hint.contains("`sensor_id` instead of `sensorId`"), "{}", err.hint);
    let err = call("list_work_orders", json!({"start": "-1h"})).await.error.unwrap();
    assert_eq!(err.suggestions, ["since"]);
    // Nothing close: no guess, and the hint says to remove it.
    let err = call("list_sensors", json!({"bogus": 1})).await.error.unwrap();
    assert!(err.suggestions.is_empty());
    assert!(err.hint.contains("Remove `bogus`"), "{}", err.hint);
}

#[tokio::test]
async fn out_of_bounds_values_are_rejected() {
    for (args, expected) in [
        (json!({"limit": 0}), ">= 1"),
        (json!({"limit": 1001}), "<= 1000"),
        (json!({"text": ""}), "at least 1 characters"),
        (json!({"text": "x".repeat(101)}), "at most 100 characters"),
    ] {
        let err = call("list_sensors", args.clone()).await.error.unwrap();
        assert_eq!(err.expected.as_deref(), Some(expected), "{args}");
        // What came back is cut to 100 characters.
        assert!(err.received.as_deref().unwrap_or("").chars().count() <= 101);
    }
}

#[tokio::test]
async fn several_problems_are_reported_together() {
    let e = call("list_sensors", json!({"limit": "x", "plant": "a", "bogus": 1})).await;
    let err = e.error.unwrap();
    assert_eq!(err.details.len(), 3, "{err:?}");
    let params: Vec<_> = err.details.iter().map(|d| d.parameter.as_str()).collect();
    assert!(params.contains(&"limit") && params.contains(&"plant") && params.contains(&"bogus"));
    // The malformed plant gets the registered one it most likely meant.
    let plant = err.details.iter().find(|d| d.parameter == "plant").unwrap();
    assert_eq!(plant.suggestions, ["A"]);
    assert_eq!(plant.received.as_deref(), Some("a"));
    assert_eq!(plant.expected.as_deref(), Some("a plant code in upper case, e.g. A"));
    assert_eq!(plant.message, "`plant` is not in the expected format.");
}

#[tokio::test]
async fn a_batch_that_names_a_sensor_twice_is_refused() {
    let ids = json!(["A_LINE1_001", "A_LINE1_002", "A_LINE1_001"]);
    let err = call("get_sensor_readings", json!({ "sensor_ids": ids })).await.error.unwrap();
    assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::InvalidArgument, Some("sensor_ids")));
    assert_eq!(err.expected.as_deref(), Some("distinct items"));
    assert_eq!(err.message, "`sensor_ids` lists an item twice.");
    assert_eq!(err.received, None);
    // Next to another problem: both are listed.
    let ids = json!(["A_LINE1_001", "a_line1_002", "A_LINE1_001"]);
    let err = call("get_sensor_readings", json!({ "sensor_ids": ids })).await.error.unwrap();
    let params: Vec<_> = err.details.iter().map(|d| d.parameter.as_str()).collect();
    assert_eq!(params.len(), 2, "{err:?}");
    assert!(params.contains(&"sensor_ids") && params.contains(&"sensor_ids/1"), "{params:?}");
}

#[tokio::test]
async fn non_object_arguments_are_refused() {
    for args in [json!([1]), json!("zone"), json!(3)] {
        let err = call("list_sensors", args).await.error.unwrap();
        assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::InvalidArgument, Some("arguments")));
    }
    // Absent arguments are all defaults.
    assert!(call("list_sensors", serde_json::Value::Null).await.ok);
}

#[tokio::test]
async fn unknown_and_unserved_tools_are_call_errors() {
    let svc = service();
    assert_eq!(svc.call("nope", json!({})).await.unwrap_err(), CallError::UnknownTool("nope".into()));
    // Every tool of the contract is served.
    assert_eq!(svc.served().count(), fieldgate::tools::TOOLS.len());
}

// ---- layer 2: the domain

#[test]
fn malformed_sensor_id_is_rejected_with_a_suggestion() {
    let r = demo_registry();
    let err = parse_sensor_id("sensor_id", "a_line1_001", &r).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.parameter.as_deref(), Some("sensor_id"));
    assert_eq!(err.received.as_deref(), Some("a_line1_001"));
    assert_eq!(err.suggestions[0], "A_LINE1_001");
    assert!(err.hint.contains("list_sensors"));

    let err = parse_sensor_id("sensor_id", "A-LINE1-1", &r).unwrap_err();
    assert_eq!(err.suggestions[0], "A_LINE1_001");
    // The input is never silently corrected.
    assert!(parse_sensor_id("sensor_id", "A_LINE1_001 ", &r).is_err());
}

// ---- layer 3: the reference exists

#[test]
fn unknown_sensor_id_is_not_found_with_nearest_ids() {
    let r = demo_registry();
    let id = parse_sensor_id("sensor_id", "A_LINE1_016", &r).unwrap();
    let err = known_sensor("sensor_id", &id, &r).unwrap_err();
    assert_eq!(err.code, ErrorCode::SensorNotFound);
    assert!(!err.retryable);
    assert!(!err.suggestions.is_empty() && err.suggestions.len() <= 3);
    assert!(err.suggestions.iter().all(|s| s.starts_with("A_LINE1_")), "{:?}", err.suggestions);
    assert!(err.suggestions.contains(&"A_LINE1_015".to_string()));
    assert!(err.hint.contains("list_sensors") && err.hint.contains("zone=LINE1"));

    let known = parse_sensor_id("sensor_id", "B_OVEN2_003", &r).unwrap();
    assert_eq!(known_sensor("sensor_id", &known, &r).unwrap().id, known);
}

#[test]
fn suggestions_prefer_the_same_plant_and_zone() {
    let r = demo_registry();
    // B_LINE1_001 is one edit from A_LINE1_001 but names no zone of plant B.
    let s = r.suggest_sensors("B_LINE1_001");
    assert_eq!(s[0], "A_LINE1_001");
    let s = r.suggest_sensors("B_BOILER_013");
    assert!(s.iter().all(|x| x.starts_with("B_BOILER_")), "{s:?}");
    assert!(r.suggest_sensors("QQQQ_XXXXXXX_999").is_empty());
}

#[test]
fn an_enum_value_outside_the_choices_names_them() {
    use fieldgate::tools::validate::InputValidator;
    let spec = fieldgate::tools::catalog::spec("get_sensor_reading").unwrap();
    let v = InputValidator::new(&spec.input_schema()).unwrap();
    let err = v.check(&json!({"sensor_id": "A_LINE1_001", "unit": "RAW"}), &|_, _| Vec::new()).unwrap_err();
    assert_eq!(err.parameter.as_deref(), Some("unit"));
    assert_eq!(err.expected.as_deref(), Some("one of normalized, raw"));
    assert_eq!(err.received.as_deref(), Some("RAW"));
    // And a malformed sensor ID reaches the suggestion hook.
    let err = v
        .check(&json!({"sensor_id": "a_line1_001"}), &|p, r| vec![format!("{p}:{}", r.to_uppercase())])
        .unwrap_err();
    assert_eq!(err.suggestions, ["sensor_id:A_LINE1_001"]);
}
