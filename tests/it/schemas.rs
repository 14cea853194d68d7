//! Golden files for the generated schemas in `schemas/`, and the description rules of
//! docs/tool-contract.md §4. `UPDATE_SCHEMA=1 cargo test --test it schemas` rewrites them.

use super::support::*;
use fieldgate::tools::TOOLS;
use fieldgate::tools::catalog::device_file_schema;
use serde_json::Value;

fn generated() -> Vec<(String, Value)> {
    let mut out = vec![("device-file.json".to_string(), device_file_schema())];
    for t in &TOOLS {
        out.push((format!("{}.input.json", t.name()), t.input_schema()));
        out.push((format!("{}.output.json", t.name()), t.output_schema()));
    }
    out
}

#[test]
fn schemas_match_the_committed_files() {
    let dir = root().join("schemas");
    let update = super::support::updating();
    let mut stale = Vec::new();
    for (name, schema) in generated() {
        let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        let path = dir.join(&name);
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "schemas/ is out of date for {stale:?}; run `UPDATE_SCHEMA=1 cargo test --test it schemas` and commit the result"
    );
    // No stray files: every committed schema is still generated.
    let names: Vec<String> = generated().into_iter().map(|(n, _)| n).collect();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        assert!(names.contains(&name), "schemas/{name} is no longer generated; delete it");
    }
}

#[test]
fn every_schema_compiles() {
    for (name, schema) in generated() {
        assert!(jsonschema::validator_for(&schema).is_ok(), "{name} does not compile");
    }
}

#[test]
fn every_parameter_is_described_with_an_example_and_its_default() {
    for t in &TOOLS {
        let schema = t.input_schema();
        assert_eq!(schema["type"], "object", "{}", t.name());
        assert_eq!(schema["additionalProperties"], false, "{}", t.name());
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (param, p) in schema["properties"].as_object().unwrap() {
            let desc = p["description"].as_str().unwrap_or("");
            assert!(desc.len() > 15, "{}.{param} has no useful description", t.name());
            assert!(
                p.get("examples").is_some_and(|e| e.as_array().is_some_and(|a| !a.is_empty())),
                "{}.{param} has no example",
                t.name()
            );
            if !required.contains(&param.as_str()) {
                assert!(
                    desc.contains("Default"),
                    "{}.{param} is optional but does not state its default",
                    t.name()
                );
            }
        }
    }
}

#[test]
fn every_description_says_when_and_when_not() {
    for t in &TOOLS {
        let d = t.description;
        assert!(d.contains("Use it") || d.contains("Use this"), "{}: when to use", t.name());
        assert!(d.contains("Do not use"), "{}: when not to use", t.name());
        assert!(d.contains("side effect") || d.contains("Creates a record"), "{}: side effects", t.name());
        let other_tools = TOOLS.iter().filter(|o| o.name() != t.name() && d.contains(o.name())).count();
        assert!(other_tools >= 1, "{}: names the right tool instead", t.name());
        let def = t.definition();
        assert_eq!(def["outputSchema"]["type"], "object");
        assert!(def["annotations"]["readOnlyHint"].is_boolean());
    }
    let create = TOOLS.iter().find(|t| t.name() == "create_work_order").unwrap();
    assert_eq!(create.definition()["annotations"]["readOnlyHint"], false);
}

#[test]
fn demo_device_files_validate_against_the_device_file_schema() {
    let validator = jsonschema::validator_for(&device_file_schema()).unwrap();
    let files = fieldgate::registry::device_files(&demo_dir()).unwrap();
    assert!(files.len() >= 4);
    for path in files {
        let value: Value = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
    }
    // And the schema is not vacuous: an unknown key fails it.
    let bad: Value = toml::from_str(&GOOD.replace("zone =", "zonee = \"X\"\nzone =")).unwrap();
    assert!(!validator.is_valid(&bad));
}

/// Every `format` under `v`, with where it is.
fn formats(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                match child {
                    Value::String(f) if k == "format" => out.push((at.to_string(), f.clone())),
                    _ => formats(child, &format!("{at}/{k}"), out),
                }
            }
        }
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, child)| formats(child, &format!("{at}/{i}"), out))
        }
        _ => {}
    }
}

/// Every schema fieldgate publishes: each tool's input and output schema, the files in
/// `schemas/`, and the component schemas of the OpenAPI document, generated and committed.
fn published() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for t in &TOOLS {
        out.push((format!("{} input", t.name()), t.input_schema()));
        out.push((format!("{} output", t.name()), t.output_schema()));
    }
    for entry in std::fs::read_dir(root().join("schemas")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        out.push((path.display().to_string(), serde_json::from_str(&text).unwrap()));
    }
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("openapi.json")).unwrap()).unwrap();
    for (which, doc) in
        [("openapi.json", committed), ("/openapi.json", fieldgate::transport::openapi::document())]
    {
        for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
            out.push((format!("{which} {name}"), schema.clone()));
        }
    }
    out
}

#[test]
fn published_schemas_are_valid_2020_12_with_standard_formats_only() {
    let meta = jsonschema::draft202012::meta::validator();
    let published = published();
    assert!(published.len() > 40, "{}", published.len());
    let mut wrong = Vec::new();
    for (name, schema) in &published {
        for error in meta.iter_errors(schema) {
            wrong.push(format!("{name}: {error} at {}", error.instance_path()));
        }
        let mut found = Vec::new();
        formats(schema, "", &mut found);
        for (at, f) in found {
            if !STANDARD_FORMATS.contains(&f.as_str()) {
                wrong.push(format!("{name}: format {f:?} at {at}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{} problems:\n{}", wrong.len(), wrong.join("\n"));
    // The bounds the formats stood for are still said: a count is never negative.
    let history = TOOLS.iter().find(|t| t.name() == "get_sensor_history").unwrap().output_schema();
    let count = &history["properties"]["data"]["properties"]["buckets"]["items"]["properties"]["count"];
    assert_eq!((&count["type"], &count["minimum"]), (&Value::from("integer"), &Value::from(0)), "{count}");
}

/// Whether `v` says anywhere that `null` is allowed.
fn admits_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s == "null",
        Value::Array(items) => items.iter().any(admits_null),
        Value::Object(m) => m.iter().any(|(k, child)| match k.as_str() {
            // Instance data and prose are not types.
            "examples" | "description" | "default" | "const" | "pattern" => false,
            _ => admits_null(child),
        }),
        _ => false,
    }
}

#[test]
fn optional_parameters_are_published_as_their_type_with_a_default() {
    for t in &TOOLS {
        let schema = t.input_schema();
        assert!(!admits_null(&schema), "{}: {schema:#}", t.name());
        for (param, p) in schema["properties"].as_object().unwrap() {
            assert!(p["type"].is_string(), "{}.{param} has one type: {p}", t.name());
        }
    }
    let limit = &TOOLS[0].input_schema()["properties"]["limit"];
    assert_eq!(TOOLS[0].name(), "list_sensors");
    assert_eq!(limit["type"], "integer", "{limit}");
    assert_eq!(limit["default"], 100, "{limit}");
    assert_eq!((&limit["minimum"], &limit["maximum"]), (&Value::from(1), &Value::from(1000)));
    let reading = TOOLS.iter().find(|t| t.name() == "get_sensor_reading").unwrap().input_schema();
    assert_eq!(reading["properties"]["unit"]["default"], "normalized");
    assert_eq!(reading["properties"]["max_age_ms"]["default"], 0);
    for (tool, default) in [("get_sensor_history", 500), ("list_work_orders", 50)] {
        let schema = TOOLS.iter().find(|t| t.name() == tool).unwrap().input_schema();
        assert_eq!(schema["properties"]["limit"]["default"], default, "{tool}");
    }
}

/// What fieldgate takes is wider than what it publishes by exactly one thing: `null` for
/// an optional parameter, meaning its default.
#[tokio::test]
async fn null_is_still_taken_for_every_optional_parameter() {
    use fieldgate::tools::validate::InputValidator;
    for t in &TOOLS {
        let schema = t.input_schema();
        let v = InputValidator::new(&schema).unwrap();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut args = serde_json::Map::new();
        for (param, p) in schema["properties"].as_object().unwrap() {
            let value =
                if required.contains(&param.as_str()) { p["examples"][0].clone() } else { Value::Null };
            args.insert(param.clone(), value);
        }
        // get_work_order takes one of its two; the other may still be null.
        if t.name() == "get_work_order" {
            args.insert("work_order_id".into(), "WO-000042".into());
        }
        let args = Value::Object(args);
        assert!(v.check(&args, &|_, _| Vec::new()).is_ok(), "{}: {args}", t.name());
        // A required parameter is not optional because it is null.
        if let Some(first) = required.first() {
            let mut args = args.clone();
            args[*first] = Value::Null;
            assert!(v.check(&args, &|_, _| Vec::new()).is_err(), "{}: {args}", t.name());
        }
    }
    // And through the service: `limit: null` is the default limit.
    let e = call("list_sensors", serde_json::json!({"limit": null})).await;
    assert!(e.ok, "{e:?}");
    assert_eq!(e.json()["complete"], true);
}
