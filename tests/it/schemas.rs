//! Golden files for the generated schemas in `schemas/`, and the description rules of
//! docs/tool-contract.md §4. `UPDATE_SCHEMA=1 cargo test --test it schemas` rewrites them.

use super::support::*;
use fieldgate::tools::TOOLS;
use fieldgate::tools::catalog::device_file_schema;
use serde_json::Value;

fn generated() -> Vec<(String, Value)> {
    let mut out = vec![("device-file.json".to_string(), device_file_schema())];
    for t in &TOOLS {
        out.push((format!("{}.input.json", t.name), t.input_schema()));
        out.push((format!("{}.output.json", t.name), t.output_schema()));
    }
    out
}

#[test]
fn schemas_match_the_committed_files() {
    let dir = root().join("schemas");
    let update = std::env::var_os("UPDATE_SCHEMA").is_some();
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
        assert_eq!(schema["type"], "object", "{}", t.name);
        assert_eq!(schema["additionalProperties"], false, "{}", t.name);
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (param, p) in schema["properties"].as_object().unwrap() {
            let desc = p["description"].as_str().unwrap_or("");
            assert!(desc.len() > 15, "{}.{param} has no useful description", t.name);
            assert!(
                p.get("examples").is_some_and(|e| e.as_array().is_some_and(|a| !a.is_empty())),
                "{}.{param} has no example",
                t.name
            );
            if !required.contains(&param.as_str()) {
                assert!(
                    desc.contains("Default"),
                    "{}.{param} is optional but does not state its default",
                    t.name
                );
            }
        }
    }
}

#[test]
fn every_description_says_when_and_when_not() {
    for t in &TOOLS {
        let d = t.description;
        assert!(d.contains("Use it") || d.contains("Use this"), "{}: when to use", t.name);
        assert!(d.contains("Do not use"), "{}: when not to use", t.name);
        assert!(d.contains("side effect") || d.contains("Creates a record"), "{}: side effects", t.name);
        let other_tools = TOOLS.iter().filter(|o| o.name != t.name && d.contains(o.name)).count();
        assert!(other_tools >= 1, "{}: names the right tool instead", t.name);
        let def = t.definition();
        assert_eq!(def["outputSchema"]["type"], "object");
        assert!(def["annotations"]["readOnlyHint"].is_boolean());
    }
    let create = TOOLS.iter().find(|t| t.name == "create_work_order").unwrap();
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
