//! The registry: the demo plant loads, and every rejection of docs/device-files.md is
//! reported with its file and line.

use super::support::*;
use fieldgate::ids::{DeviceId, SensorId};
use fieldgate::registry::{DataType, Protocol, RegisterTable, SensorSource, WordOrder};

fn assert_one(problems: &[String], expected: &str) {
    assert!(
        problems.iter().any(|p| p.contains(expected)),
        "expected a problem containing {expected:?}, got:\n{}",
        problems.join("\n")
    );
}

#[test]
fn demo_plant_loads_with_every_required_feature() {
    let r = demo_registry();
    assert!(r.sensors().len() >= 30, "{} sensors", r.sensors().len());
    assert!(r.plants().len() >= 2);
    let protocols: Vec<Protocol> = r.devices().iter().map(|d| d.protocol).collect();
    assert_eq!(protocols.iter().filter(|p| **p == Protocol::ModbusTcp).count(), 2);
    assert!(protocols.contains(&Protocol::ModbusRtuOverTcp));
    assert!(protocols.contains(&Protocol::Opcua));
    assert!(r.devices().iter().any(|d| d.protocol == Protocol::ModbusTcp && d.word_order == WordOrder::CDAB));

    let points: Vec<_> = r
        .sensors()
        .iter()
        .filter_map(|s| match &s.source {
            SensorSource::Modbus(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let has = |f: &dyn Fn(&fieldgate::registry::ModbusPoint) -> bool| points.iter().any(f);
    assert!(has(&|p| p.data_type == DataType::F32));
    assert!(has(&|p| p.data_type == DataType::F64));
    assert!(has(&|p| p.data_type == DataType::I16 && p.scale != 1.0));
    assert!(has(&|p| p.data_type == DataType::U32));
    assert!(has(&|p| p.table == RegisterTable::Coil));
    assert!(has(&|p| p.bit.is_some()));
    assert!(has(&|p| p.data_type == DataType::String));
    // Every sensor has a description, kind and a device of its own plant and zone.
    for s in r.sensors() {
        let d = r.device_of(s);
        assert_eq!((s.id.plant(), s.id.zone()), (d.plant.as_str(), d.zone.as_str()));
        assert!(!s.description.is_empty() && !s.kind.is_empty());
    }
}

#[test]
fn lookups_and_equipment_index() {
    let r = demo_registry();
    let id: SensorId = "A_LINE1_001".parse().unwrap();
    let s = r.sensor(&id).unwrap();
    assert_eq!(s.device.as_str(), "a-line1-plc");
    let on_pump: Vec<_> = r.sensors_of_equipment("P-101").map(|s| s.id.to_string()).collect();
    assert!(on_pump.contains(&"A_LINE1_001".to_string()) && on_pump.len() >= 4, "{on_pump:?}");
    let dev: DeviceId = "a-util-meter".parse().unwrap();
    assert!(r.sensors_of_device(&dev).all(|s| s.id.zone() == "UTIL"));
    assert!(r.sensor(&"A_LINE1_999".parse().unwrap()).is_none());
}

#[test]
fn a_good_file_has_no_problems() {
    assert_eq!(problems(&[("t.toml", GOOD)]), Vec::<String>::new());
}

#[test]
fn rejects_malformed_sensor_id_with_suggestion() {
    let text = GOOD.replace("id = \"T_ZONE1_001\"", "id = \"t_zone1_1\"");
    let p = problems(&[("t.toml", &text)]);
    assert_one(&p, "t.toml:9: `id` in sensor t_zone1_1: PLANT must be 1-8 characters");
    assert_one(&p, "did you mean T_ZONE1_001?");
}

#[test]
fn rejects_sensor_of_another_plant_or_zone() {
    let text = GOOD.replace("id = \"T_ZONE1_001\"", "id = \"T_ZONE2_001\"");
    let p = problems(&[("t.toml", &text)]);
    assert_one(
        &p,
        "t.toml:9: `id` in sensor T_ZONE2_001: sensor T_ZONE2_001 must start with this device's PLANT_ZONE T_ZONE1_",
    );
    let text = GOOD.replace("id = \"T_ZONE1_001\"", "id = \"U_ZONE1_001\"");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "must start with this device's PLANT_ZONE T_ZONE1_ (found U_ZONE1_)",
    );
}

#[test]
fn rejects_duplicate_device_ids_across_files() {
    let other = GOOD.replace("T_ZONE1_001", "T_ZONE1_002");
    let p = problems(&[("a.toml", GOOD), ("b.toml", &other)]);
    assert_eq!(p, vec!["b.toml:1: duplicate device ID t-plc: already declared at a.toml:1".to_string()]);
}

#[test]
fn rejects_duplicate_sensor_ids_across_files() {
    let other = GOOD.replace("id = \"t-plc\"", "id = \"t-plc-2\"");
    let p = problems(&[("a.toml", GOOD), ("b.toml", &other)]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("b.toml:8: duplicate sensor ID T_ZONE1_001: already declared at "), "{p:?}");
    assert!(p[0].ends_with("a.toml:8"), "{p:?}");
}

#[test]
fn rejects_unknown_keys_everywhere_with_a_suggestion() {
    let text = GOOD
        .replace("endpoint =", "wordorder = \"ABCD\"\nendpoint =")
        .replace("kind = \"pressure\"", "kind = \"pressure\"\ntabel = \"x\"");
    let p = problems(&[("t.toml", &text)]);
    assert_one(&p, "t.toml:6: unknown key `wordorder`; did you mean `word_order`?");
    assert_one(&p, "t.toml:13: unknown key `tabel` in sensor T_ZONE1_001; did you mean `table`?");
    let text = format!("{GOOD}\n[serial]\nbaud = 9600\n");
    assert_one(&problems(&[("t.toml", &text)]), "unknown key `baud` in [serial]; did you mean `baud_rate`?");
}

#[test]
fn rejects_wrong_types() {
    let text = GOOD
        .replace("address = 0", "address = \"0\"")
        .replace("protocol = \"modbus-tcp\"", "protocol = \"modbus-tcp\"\ntimeout_ms = 1.5");
    let p = problems(&[("t.toml", &text)]);
    assert_one(&p, "t.toml:6: `timeout_ms`: must be an integer, found a float");
    assert_one(&p, "t.toml:15: `address` in sensor T_ZONE1_001: must be an integer, found a string");
}

#[test]
fn rejects_out_of_range_numbers() {
    let text = GOOD.replace("protocol = \"modbus-tcp\"", "protocol = \"modbus-tcp\"\nunit_id = 248");
    assert_one(&problems(&[("t.toml", &text)]), "t.toml:6: `unit_id`: must be between 0 and 247, found 248");

    let text = GOOD.replace("address = 0", "address = 65535");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "`address` in sensor T_ZONE1_001: address 65535 + 2 registers runs past the end of the table (65536)",
    );
    let text = with_sensor("table = \"holding\"\naddress = 65530\ntype = \"string\"\nlength = 8");
    assert_one(&problems(&[("t.toml", &text)]), "address 65530 + 8 registers runs past the end");

    let text = with_sensor("table = \"holding\"\naddress = 10\ntype = \"bool\"\nbit = 16");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "`bit` in sensor T_ZONE1_002: must be between 0 and 15, found 16",
    );
}

#[test]
fn rejects_modbus_sensor_with_node_id() {
    let text = GOOD.replace("type = \"f32\"", "type = \"f32\"\nnode_id = \"ns=2;s=X\"");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "t.toml:16: `node_id` in sensor T_ZONE1_001: a Modbus sensor is addressed by table and address, not node_id",
    );
}

const OPCUA: &str = r#"id = "t-ua"
plant = "T"
zone = "ZONE1"
description = "UA"
protocol = "opcua"
endpoint = "opc.tcp://127.0.0.1:4840/x"

[[sensors]]
id = "T_ZONE1_001"
description = "Temp"
kind = "temperature"
unit = "degC"
node_id = "ns=2;s=T1"
"#;

#[test]
fn rejects_opcua_sensor_with_table() {
    assert_eq!(problems(&[("u.toml", OPCUA)]), Vec::<String>::new());
    let text = OPCUA.replace("node_id", "table = \"holding\"\nnode_id");
    assert_one(
        &problems(&[("u.toml", &text)]),
        "u.toml:13: `table` in sensor T_ZONE1_001: an OPC UA sensor is addressed by node_id, not by Modbus keys",
    );
    let text = OPCUA.replace("ns=2;s=T1", "Temperature1");
    assert_one(&problems(&[("u.toml", &text)]), "`node_id` in sensor T_ZONE1_001: must look like");
}

#[test]
fn rejects_bool_on_register_without_bit() {
    let text = with_sensor("table = \"holding\"\naddress = 10\ntype = \"bool\"");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "`type` in sensor T_ZONE1_002: bool on a register table needs `bit`",
    );
}

#[test]
fn rejects_multi_register_type_on_coils() {
    let text = with_sensor("table = \"coil\"\naddress = 0\ntype = \"f32\"");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "`type` in sensor T_ZONE1_002: a coil table holds single bits: type must be \"bool\", found \"f32\"",
    );
}

#[test]
fn rejects_overlapping_spans_with_different_types() {
    // f32 at 0..1 and u16 at 1: the second register of the float.
    let text = with_sensor("table = \"holding\"\naddress = 1\ntype = \"u16\"");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "sensor T_ZONE1_002: u16 holding registers 1..1 overlap T_ZONE1_001 (f32) with a different type",
    );
    // Same registers on another table, or with the same type, are fine.
    assert!(
        problems(&[("t.toml", &with_sensor("table = \"input\"\naddress = 1\ntype = \"u16\""))]).is_empty()
    );
    assert!(
        problems(&[(
            "t.toml",
            &with_sensor("table = \"holding\"\naddress = 0\ntype = \"f32\"\nscale = 2.0")
        )])
        .is_empty()
    );
}

#[test]
fn rejects_bad_range_and_negative_deadband() {
    let text = with_sensor(
        "table = \"holding\"\naddress = 10\ntype = \"u16\"\nrange = { min = 5.0, max = 5.0 }\ndeadband = -0.1",
    );
    let p = problems(&[("t.toml", &text)]);
    assert_one(&p, "`range` in sensor T_ZONE1_002: min (5) must be less than max (5)");
    assert_one(&p, "`deadband` in sensor T_ZONE1_002: must not be negative, found -0.1");
}

#[test]
fn rejects_unreadable_and_unparsable_files() {
    let dir = device_dir(&[("good.toml", GOOD)]);
    std::fs::write(dir.path().join("binary.toml"), [0xff, 0xfe, 0x00, 0x41]).unwrap();
    std::fs::write(dir.path().join("syntax.toml"), "id = \"x\"\nplant = \n").unwrap();
    let p = problems_in(dir.path());
    assert_one(&p, "binary.toml: unreadable file: not valid UTF-8");
    assert_one(&p, "syntax.toml:2: invalid TOML");
}

#[test]
fn rejects_an_empty_or_missing_folder() {
    let dir = tempfile::tempdir().unwrap();
    assert_one(&problems_in(dir.path()), "no device files (*.toml) in this folder");
    assert_one(&problems_in(&dir.path().join("nope")), "cannot read the devices folder");
}

#[test]
fn rejects_bad_device_header_fields() {
    let text = GOOD
        .replace("id = \"t-plc\"", "id = \"T PLC\"")
        .replace("endpoint = \"127.0.0.1:5020\"", "endpoint = \"127.0.0.1\"")
        .replace("protocol = \"modbus-tcp\"", "protocol = \"modbus\"")
        .replace("description = \"Test PLC\"\n", "");
    let p = problems(&[("t.toml", &text)]);
    assert_one(&p, "t.toml:1: `id`: device ID must be 1-64 characters of a-z, 0-9 and '-', found \"T PLC\"");
    assert_one(&p, "missing required key `description`");
    assert_one(
        &p,
        "`protocol`: must be one of modbus-tcp, modbus-rtu, modbus-rtu-over-tcp, opcua, found \"modbus\"",
    );
    let text = GOOD.replace("endpoint = \"127.0.0.1:5020\"", "endpoint = \"127.0.0.1\"");
    assert_one(&problems(&[("t.toml", &text)]), "t.toml:6: `endpoint`: must be host:port");
    let text = GOOD
        .replace("protocol = \"modbus-tcp\"", "protocol = \"modbus-rtu\"")
        .replace("127.0.0.1:5020", "/dev/ttyUSB0");
    assert_one(&problems(&[("t.toml", &text)]), "a modbus-rtu device needs a [serial] table");
}

#[test]
fn reports_every_problem_of_every_file_at_once() {
    let a =
        GOOD.replace("address = 0", "address = -1").replace("kind = \"pressure\"", "kind = \"Pressure!\"");
    let b = OPCUA.replace("id = \"T_ZONE1_001\"", "id = \"T_ZONE1_01\"").replace("t-ua", "t-ua2");
    let p = problems(&[("a.toml", &a), ("b.toml", &b)]);
    assert_one(&p, "a.toml:11: `kind` in sensor T_ZONE1_001: must be one lower-case word");
    assert_one(&p, "a.toml:14: `address` in sensor T_ZONE1_001: must be between 0 and 65535, found -1");
    assert_one(&p, "b.toml:9: `id` in sensor T_ZONE1_01: NNN must be exactly three digits");
    assert_eq!(p.len(), 3, "{p:#?}");
}

#[test]
fn rejects_a_point_larger_than_one_read() {
    let text = GOOD.replace("endpoint =", "max_registers_per_read = 1\nendpoint =");
    assert_one(
        &problems(&[("t.toml", &text)]),
        "sensor T_ZONE1_001: needs 2 registers but the device reads at most 1 per request",
    );
}

#[test]
fn a_device_can_set_its_own_breaker() {
    use fieldgate::resilience::breaker_settings;
    let config = fieldgate::config::Config::default();
    let r = demo_registry();
    let boiler = r.device(&"b-boiler-rtu".parse().unwrap()).unwrap();
    let s = breaker_settings(&config, boiler);
    assert_eq!(s.failure_threshold, 3);
    assert_eq!(
        s.open,
        std::time::Duration::from_millis(config.breaker.open_ms),
        "unset keys keep the defaults"
    );
    let meter = r.device(&"a-util-meter".parse().unwrap()).unwrap();
    assert_eq!(breaker_settings(&config, meter).failure_threshold, config.breaker.failure_threshold);

    let text = format!("{GOOD}\n[breaker]\nmin_calls = 30\nwindow_size = 20\nopen_ms = 5\nbogus = 1\n");
    let p = problems(&[("t.toml", &text)]);
    assert_one(&p, "`min_calls` in [breaker]: must not exceed window_size (20)");
    assert_one(&p, "`open_ms` in [breaker]: must be between 10 and 86400000, found 5");
    assert_one(&p, "unknown key `bogus` in [breaker]");
}

/// Text a person reads (descriptions, units, equipment) holds no control, bidirectional or
/// invisible formatting characters: each is a problem naming the character and where.
#[test]
fn hidden_characters_in_device_text_are_problems() {
    for (text, hidden) in [
        (
            with_sensor("table = \"holding\"\naddress = 10\ntype = \"u16\"")
                .replace("\"Second\"", "\"Sec\\u001b[31mond\""),
            "U+001B",
        ),
        (
            with_sensor("table = \"holding\"\naddress = 10\ntype = \"u16\"")
                .replace("\"m3/h\"", "\"m3\\u202e/h\""),
            "U+202E",
        ),
        (
            with_sensor("table = \"holding\"\naddress = 10\ntype = \"u16\"\nequipment = \"P\\u0007-101\""),
            "U+0007",
        ),
    ] {
        let found = problems(&[("t.toml", &text)]);
        assert!(
            found
                .iter()
                .any(|p| p.contains("must be plain text") && p.contains(hidden) && p.starts_with("t.toml:")),
            "{hidden}: {found:?}"
        );
    }
}

/// `demo --plant`: one plant's devices and sensors alone (two demos, one a plant, are two
/// edge nodes of a fleet without a conflict).
#[test]
fn of_plant_keeps_one_plants_devices_and_sensors() {
    let all = demo_registry();
    let b = all.of_plant("B").expect("plant B");
    assert!(b.devices().iter().all(|d| d.plant == "B") && !b.devices().is_empty());
    let of_b = all.sensors().iter().filter(|s| s.id.plant() == "B").count();
    assert_eq!(b.sensors().len(), of_b);
    assert!(b.sensors().iter().all(|s| b.device(&s.device).is_some()));
    let a = all.of_plant("A").expect("plant A");
    assert_eq!(a.sensors().len() + b.sensors().len(), all.sensors().len());
    assert!(all.of_plant("Z").is_none());
}

/// `[[sensors.alarms]]`: a limit alarm read as written, and every mistake in one go.
#[test]
fn limit_alarms_are_read_and_every_mistake_is_reported() {
    let good = with_sensor(
        r#"table = "holding"
address = 10
type = "f32"
[[sensors.alarms]]
name = "HI"
type = "high"
limit = 245.0
deadband = 1.0
on_delay_s = 10
off_delay_s = 5
priority = "high"
message = "Flow high"
[[sensors.alarms]]
name = "LO_LO"
type = "low_low"
limit = 2.5
priority = "critical"
message = "Flow very low"
"#,
    );
    let dir = device_dir(&[("t.toml", &good)]);
    let r = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let s = r.sensor(&"T_ZONE1_002".parse().unwrap()).unwrap();
    assert_eq!(s.alarms.len(), 2);
    let hi = &s.alarms[0];
    assert_eq!((hi.name.as_str(), hi.kind.name(), hi.limit, hi.deadband), ("HI", "high", 245.0, 1.0));
    assert_eq!((hi.on_delay.as_secs(), hi.off_delay.as_secs(), hi.priority.name()), (10, 5, "high"));
    assert_eq!(
        (s.alarms[1].kind.name(), s.alarms[1].deadband, s.alarms[1].on_delay.as_secs()),
        ("low_low", 0.0, 0)
    );

    let bad = with_sensor(
        r#"table = "holding"
address = 10
type = "f32"
[[sensors.alarms]]
name = "hi"
type = "high"
limit = 1.0
priority = "high"
message = "m"
[[sensors.alarms]]
name = "A"
type = "very_high"
priority = "urgent"
message = "m"
[[sensors.alarms]]
name = "B"
type = "high"
deadband = -1.0
on_delay_s = 100000
priority = "low"
message = "m"
[[sensors.alarms]]
name = "B"
type = "off_normal"
priority = "low"
message = "m"
colour = "red"
[[sensors.alarms]]
name = "C"
type = "low"
limit = 3.0
"#,
    );
    let p = problems(&[("t.toml", &bad)]).join("\n");
    for want in [
        "must be 1 to 16 of A-Z",
        "very_high",
        "urgent",
        "must not be negative",
        "on_delay_s",
        "needs its limit",
        "is this sensor's alarm already",
        "off_normal watches a boolean sensor",
        "colour",
        "priority",
        "message",
    ] {
        assert!(p.contains(want), "{want:?} in:\n{p}");
    }
}

/// An alarm on a text sensor (no alarm can read text) and a blank message are refused,
/// as a helper's walk found them accepted.
#[test]
fn an_alarm_on_a_text_sensor_and_a_blank_message_are_refused() {
    let text = with_sensor(
        "table = \"holding\"\naddress = 10\ntype = \"string\"\nlength = 8\n[[sensors.alarms]]\nname = \"HI\"\ntype = \"high\"\nlimit = 1.0\npriority = \"low\"\nmessage = \" \"\n",
    );
    let p = problems(&[("t.toml", &text)]);
    assert!(p.iter().any(|p| p.contains("no alarm watches text")), "{p:?}");
    assert!(p.iter().any(|p| p.contains("`message`") && p.contains("1 to 200 characters")), "{p:?}");
}
