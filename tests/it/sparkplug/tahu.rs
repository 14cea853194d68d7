//! Eclipse Tahu's JavaScript decoder (`decode.js --lines`) as the test host's only reader of
//! what the edge node publishes: each payload that crossed the broker is decoded by Tahu,
//! and its result, typed by the datatype Tahu read, is what the tests look at. A field we
//! encode wrongly the way our own decoder would read it wrongly fails here.

use fieldgate::spb::payload::{Metric, Payload, PropertySet, PropertyValue, PropertyValueKind, Value as Mv};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::external_decoder::decoder_modules;
use crate::support;

/// One Tahu decoder process, asked one payload at a time.
pub struct Tahu {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Tahu {
    pub fn start() -> Tahu {
        let modules = decoder_modules();
        assert!(
            modules.join("sparkplug-payload").is_dir(),
            "Eclipse Tahu's sparkplug-payload is not installed: run scripts/test-deps"
        );
        let mut child = tokio::process::Command::new("node")
            .arg(support::root().join("tests/it/sparkplug/decode.js"))
            .arg("--lines")
            .env("NODE_PATH", &modules)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs Tahu's decoder");
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        Tahu { _child: child, stdin, stdout }
    }

    /// `bytes` as Tahu decodes them, or why it cannot.
    pub async fn decode(&mut self, bytes: &[u8]) -> Result<Payload, String> {
        use base64::Engine as _;
        let line = base64::engine::general_purpose::STANDARD.encode(bytes) + "\n";
        let asked = async {
            self.stdin.write_all(line.as_bytes()).await.ok()?;
            self.stdout.next_line().await.ok().flatten()
        };
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), asked)
            .await
            .map_err(|_| "Tahu's decoder did not answer within 10 s".to_string())?
            .ok_or("Tahu's decoder stopped")?;
        let json: Value = serde_json::from_str(&answer).map_err(|e| format!("{e}: {answer}"))?;
        if let Some(e) = json.get("error") {
            return Err(format!("Tahu cannot decode it: {e}"));
        }
        payload_of(&json)
    }
}

/// An integer Tahu gave (a number, or a 64-bit one as a decimal string).
fn int(v: &Value) -> Option<i128> {
    match v {
        Value::Number(n) => n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from)),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn uint(v: &Value) -> Option<u64> {
    int(v).and_then(|i| u64::try_from(i).ok())
}

/// The specification's number of a datatype Tahu names.
fn datatype(name: &str) -> Result<u32, String> {
    const NAMES: [&str; 15] = [
        "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double",
        "Boolean", "String", "DateTime", "Text", "UUID",
    ];
    NAMES.iter().position(|n| *n == name).map(|i| i as u32 + 1).ok_or(format!("datatype {name}"))
}

/// A value Tahu read for `kind`, where the specification keeps it.
fn value(kind: &str, v: &Value) -> Result<Mv, String> {
    let bad = || format!("a {kind} value: {v}");
    Ok(match kind {
        "Int8" | "Int16" | "Int32" => {
            Mv::Int(int(v).and_then(|i| i32::try_from(i).ok()).ok_or_else(bad)? as u32)
        }
        "UInt8" | "UInt16" => Mv::Int(int(v).and_then(|i| u32::try_from(i).ok()).ok_or_else(bad)?),
        "Int64" => Mv::Long(int(v).and_then(|i| i64::try_from(i).ok()).ok_or_else(bad)? as u64),
        "UInt32" | "UInt64" | "DateTime" => Mv::Long(uint(v).ok_or_else(bad)?),
        "Float" => Mv::Float(v.as_f64().ok_or_else(bad)? as f32),
        "Double" => Mv::Double(v.as_f64().ok_or_else(bad)?),
        "Boolean" => Mv::Boolean(v.as_bool().ok_or_else(bad)?),
        "String" | "Text" | "UUID" => Mv::String(v.as_str().ok_or_else(bad)?.to_string()),
        _ => return Err(bad()),
    })
}

fn property(v: &Value) -> Result<PropertyValue, String> {
    let kind = v["type"].as_str().ok_or("a property without a type")?;
    let value = match (&v["value"], value(kind, &v["value"])) {
        (Value::Null, _) => None,
        (_, Ok(Mv::Int(i))) => Some(PropertyValueKind::Int(i)),
        (_, Ok(Mv::Long(l))) => Some(PropertyValueKind::Long(l)),
        (_, Ok(Mv::Float(f))) => Some(PropertyValueKind::Float(f)),
        (_, Ok(Mv::Double(d))) => Some(PropertyValueKind::Double(d)),
        (_, Ok(Mv::Boolean(b))) => Some(PropertyValueKind::Boolean(b)),
        (_, Ok(Mv::String(s))) => Some(PropertyValueKind::String(s)),
        (_, Ok(Mv::Bytes(_))) | (_, Err(_)) => return Err(format!("a property: {v}")),
    };
    Ok(PropertyValue { r#type: Some(datatype(kind)?), is_null: value.is_none().then_some(true), value })
}

fn metric(m: &Value) -> Result<Metric, String> {
    let kind = m["type"].as_str().ok_or_else(|| format!("a metric without a type: {m}"))?;
    let flag = |k: &str| m.get(k).and_then(Value::as_bool);
    let (value, is_null) = match &m["value"] {
        Value::Null => (None, Some(true)),
        v => (Some(value(kind, v)?), None),
    };
    let properties = match m.get("properties").and_then(Value::as_object) {
        None => None,
        Some(p) => {
            let mut set = PropertySet::default();
            for (k, v) in p {
                set.push(k, property(v)?);
            }
            Some(set)
        }
    };
    Ok(Metric {
        name: m.get("name").and_then(Value::as_str).map(str::to_string),
        alias: m.get("alias").and_then(uint),
        timestamp: m.get("timestamp").and_then(uint),
        datatype: Some(datatype(kind)?),
        is_historical: flag("isHistorical"),
        is_transient: flag("isTransient"),
        is_null,
        properties,
        value,
    })
}

/// Tahu's decoded payload in our types, for the tests to look at.
fn payload_of(p: &Value) -> Result<Payload, String> {
    let metrics = match p.get("metrics").and_then(Value::as_array) {
        Some(ms) => ms.iter().map(metric).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    Ok(Payload {
        timestamp: p.get("timestamp").and_then(uint),
        metrics,
        seq: p.get("seq").and_then(uint),
        uuid: p.get("uuid").and_then(Value::as_str).map(str::to_string),
        body: None,
    })
}

/// Tahu reads what our encoder wrote: every value type and flag comes back as written.
#[tokio::test]
async fn tahu_reads_each_value_as_it_was_written() {
    let mut tahu = Tahu::start();
    let m = |name: &str, datatype: u32, value: Mv| Metric {
        name: Some(name.into()),
        alias: Some(7),
        timestamp: Some(1_700_000_000_123),
        datatype: Some(datatype),
        is_historical: Some(true),
        value: Some(value),
        ..Default::default()
    };
    use fieldgate::spb::payload::datatype as t;
    let sent = Payload {
        timestamp: Some(1_700_000_000_999),
        seq: Some(255),
        metrics: vec![
            m("i32", t::INT32, Mv::Int((-5i32) as u32)),
            m("i64", t::INT64, Mv::Long((-9_007_199_254_740_993i64) as u64)),
            m("u64", t::UINT64, Mv::Long(u64::MAX)),
            m("f", t::FLOAT, Mv::Float(1.5)),
            m("d", t::DOUBLE, Mv::Double(-0.1)),
            m("b", t::BOOLEAN, Mv::Boolean(true)),
            m("s", t::STRING, Mv::String("<b>\"x\"</b>".into())),
        ],
        ..Default::default()
    };
    let read = tahu.decode(&sent.encode_to_bytes()).await.unwrap();
    assert_eq!(read, sent);
    assert!(tahu.decode(b"\x08\x01\x10\x01").await.unwrap_err().contains("cannot decode"));
}

/// The payload `json` describes (Tahu's object form: `{"timestamp", "metrics": [{"name",
/// "type", "value"}]}`), as Eclipse Tahu's encoder writes it.
pub fn encode(json: &Value) -> Vec<u8> {
    use crate::support::OutputWithin as _;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    let out = std::process::Command::new("node")
        .arg(support::root().join("tests/it/sparkplug/encode.js"))
        .arg(&file)
        .arg(json.to_string())
        .env("NODE_PATH", decoder_modules())
        .output_within()
        .expect("node runs");
    assert!(out.status.success(), "Tahu's encoder failed: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&file).unwrap()
}

/// A command with one Boolean metric `name` set, as Tahu encodes it.
pub fn command(name: &str) -> Vec<u8> {
    let now = chrono::Utc::now().timestamp_millis();
    encode(
        &serde_json::json!({"timestamp": now, "metrics": [{"name": name, "type": "Boolean", "value": true}]}),
    )
}
