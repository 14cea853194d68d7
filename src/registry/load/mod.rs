//! Reading and validating `devices/*.toml`: every problem, with file and line, at once.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

mod alarm;
mod sensor;

use super::bounds;
use super::model::*;
use crate::ids::{DeviceId, SensorId, check_plant, check_zone};
use crate::toml_reader::{Doc, Problem, Table};
use sensor::read_sensor;

/// Where something was declared, for "also declared at" messages.
#[derive(Clone)]
struct Origin {
    file: String,
    line: usize,
}

/// What one file yielded: a device (if the file was valid) and its valid sensors, and the
/// IDs it declares whatever else is wrong with it (for the cross-file checks, which must
/// not wait until every file is fixed).
/// Things read from a file, each with where it was found.
type Found<T> = Vec<(T, Origin)>;

struct Parsed {
    device: Option<Device>,
    sensors: Vec<(Sensor, Origin)>,
    device_origin: Origin,
    declared_device: Option<DeviceId>,
    declared_sensors: Vec<(SensorId, Origin)>,
}

/// Lists the `*.toml` files of a folder, sorted by name.
pub fn device_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, Problem> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        let looked = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        Problem {
            source: dir.display().to_string(),
            line: 0,
            message: format!(
                "cannot read the devices folder ({}; looked in {}): pass --devices DIR, set devices.dir, or run from the folder that holds devices/",
                e.kind(),
                looked.display()
            ),
        }
    })?;
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// Loads and validates every device file in `dir`.
pub fn load_dir(dir: &Path) -> Result<(Vec<Device>, Vec<Sensor>), Vec<Problem>> {
    let files = device_files(dir).map_err(|p| vec![p])?;
    if files.is_empty() {
        return Err(vec![Problem {
            source: dir.display().to_string(),
            line: 0,
            message: "no device files (*.toml) in this folder".into(),
        }]);
    }
    let mut inputs = Vec::new();
    let mut problems = Vec::new();
    for path in files {
        let name = path.display().to_string();
        match crate::toml_reader::read_text_file(&path) {
            Ok(text) => inputs.push((name, text)),
            Err(why) => {
                problems.push(Problem { source: name, line: 0, message: format!("unreadable file: {why}") })
            }
        }
    }
    match load_texts(&inputs) {
        Ok(r) if problems.is_empty() => Ok(r),
        Ok(_) => Err(problems),
        Err(mut more) => {
            problems.append(&mut more);
            Err(problems)
        }
    }
}

/// Validates device files given as `(name, text)` pairs.
pub fn load_texts(inputs: &[(String, String)]) -> Result<(Vec<Device>, Vec<Sensor>), Vec<Problem>> {
    let mut problems = Vec::new();
    let mut parsed = Vec::new();
    for (name, text) in inputs {
        let doc = Doc::new(name.clone(), text);
        if let Some(root) = doc.parse(text) {
            let table = Table::root(&doc, &root);
            parsed.push(read_device_file(&table));
        }
        problems.extend(doc.into_problems());
    }

    // Cross-file checks: unique device and sensor IDs.
    let mut devices = Vec::new();
    let mut sensors = Vec::new();
    let mut seen_devices: HashMap<DeviceId, Origin> = HashMap::new();
    let mut seen_sensors: HashMap<SensorId, Origin> = HashMap::new();
    for p in parsed {
        if let Some(id) = &p.declared_device {
            match seen_devices.get(id) {
                Some(first) => problems.push(dup_problem("device", id.as_str(), &p.device_origin, first)),
                None => {
                    seen_devices.insert(id.clone(), p.device_origin.clone());
                }
            }
        }
        for (id, origin) in &p.declared_sensors {
            match seen_sensors.get(id) {
                Some(first) => problems.push(dup_problem("sensor", id.as_str(), origin, first)),
                None => {
                    seen_sensors.insert(id.clone(), origin.clone());
                }
            }
        }
        devices.extend(p.device);
        sensors.extend(p.sensors.into_iter().map(|(s, _)| s));
    }
    if problems.is_empty() {
        Ok((devices, sensors))
    } else {
        problems.sort_by(|a, b| (&a.source, a.line).cmp(&(&b.source, b.line)));
        Err(problems)
    }
}

fn dup_problem(what: &str, id: &str, here: &Origin, first: &Origin) -> Problem {
    Problem {
        source: here.file.clone(),
        line: here.line,
        message: format!("duplicate {what} ID {id}: already declared at {}:{}", first.file, first.line),
    }
}

const MODBUS_SENSOR_KEYS: [&str; 8] =
    ["table", "address", "type", "word_order", "bit", "length", "scale", "offset"];

/// What a device's sensors are read with: the device's own fields, as far as they parsed.
struct Context<'a> {
    protocol: Option<Protocol>,
    plant: Option<&'a str>,
    zone: Option<&'a str>,
    word_order: WordOrder,
    device: Option<&'a DeviceId>,
    max_regs: u16,
}

/// The `[[sensors]]` of a device file, each checked against the device's request size and
/// against the other sensors' registers; and every sensor ID the file declares, with its
/// line, for the cross-file checks.
fn read_sensors(t: &Table<'_, '_>, cx: Context<'_>) -> (Found<Sensor>, Found<SensorId>) {
    let doc = t.doc();
    let mut sensors = Vec::new();
    let mut spans: Vec<(RegisterTable, u32, u32, DataType, String)> = Vec::new();
    let mut declared_sensors = Vec::new();
    for mut s in t.tables("sensors") {
        let line = doc.line(s.span().start);
        if let Some(sid) = s.str("id") {
            s.set_path(format!("sensor {sid}"));
            if let Ok(parsed) = sid.parse::<SensorId>() {
                declared_sensors.push((parsed, Origin { file: doc.name().to_string(), line }));
            }
        }
        if let Some(sensor) = read_sensor(&s, cx.protocol, cx.plant, cx.zone, cx.word_order, cx.device) {
            if let SensorSource::Modbus(p) = &sensor.source
                && !p.table.is_bits()
                && p.count > cx.max_regs
            {
                s.table_problem(format!(
                    "needs {} registers but the device reads at most {} per request (max_registers_per_read)",
                    p.count, cx.max_regs
                ));
            }
            if let SensorSource::Modbus(p) = &sensor.source {
                let (start, end) = (u32::from(p.address), u32::from(p.address) + u32::from(p.count));
                for (table, s0, e0, ty, other) in &spans {
                    if *table == p.table && start < *e0 && *s0 < end && *ty != p.data_type {
                        s.table_problem(format!(
                            "{} {} registers {}..{} overlap {other} ({}) with a different type",
                            p.data_type.name(),
                            p.table,
                            start,
                            end - 1,
                            ty.name()
                        ));
                    }
                }
                spans.push((p.table, start, end, p.data_type, sensor.id.to_string()));
            }
            sensors.push((sensor, Origin { file: doc.name().to_string(), line }));
        }
        s.finish();
    }
    (sensors, declared_sensors)
}

/// A device's `[breaker]` overrides, checked against each other.
fn read_breaker(b: &Table<'_, '_>) -> BreakerOverrides {
    let o = BreakerOverrides {
        failure_threshold: b
            .int(bounds::FAILURE_THRESHOLD.key, bounds::FAILURE_THRESHOLD.range())
            .map(|v| v as u32),
        failure_rate_percent: b
            .int(bounds::FAILURE_RATE_PERCENT.key, bounds::FAILURE_RATE_PERCENT.range())
            .map(|v| v as u32),
        window_size: b.int(bounds::WINDOW_SIZE.key, bounds::WINDOW_SIZE.range()).map(|v| v as u32),
        min_calls: b.int(bounds::MIN_CALLS.key, bounds::MIN_CALLS.range()).map(|v| v as u32),
        open_ms: b.int(bounds::OPEN_MS.key, bounds::OPEN_MS.range()).map(|v| v as u64),
        max_open_ms: b.int(bounds::MAX_OPEN_MS.key, bounds::MAX_OPEN_MS.range()).map(|v| v as u64),
    };
    if let (Some(m), Some(w)) = (o.min_calls, o.window_size)
        && m > w
    {
        b.problem("min_calls", format!("must not exceed window_size ({w})"));
    }
    if let (Some(open), Some(max)) = (o.open_ms, o.max_open_ms)
        && open > max
    {
        b.problem("open_ms", format!("must not exceed max_open_ms ({max})"));
    }
    b.finish();
    o
}

/// The `[serial]` and `[opcua]` tables of a device, each refused on the wrong protocol;
/// an OPC UA device without `[opcua]` gets security None, polled.
fn read_protocol_tables(
    t: &Table<'_, '_>,
    protocol: Option<Protocol>,
) -> (Option<SerialSettings>, Option<OpcUaSettings>) {
    let serial = t.table("serial").and_then(|s| {
        let v = read_serial(&s);
        s.finish();
        v
    });
    if protocol == Some(Protocol::ModbusRtu) && serial.is_none() && !t.has("serial") {
        t.table_problem(
            "a modbus-rtu device needs a [serial] table (baud_rate, parity, data_bits, stop_bits)",
        );
    }
    if serial.is_some() && protocol.is_some_and(|p| p != Protocol::ModbusRtu) {
        t.problem("serial", "only modbus-rtu devices take a [serial] table");
    }
    let opcua_table = t.table("opcua");
    let opcua = opcua_table.as_ref().and_then(|o| {
        let v = read_opcua(o);
        o.finish();
        v
    });
    if opcua_table.is_some() && protocol.is_some_and(|p| p != Protocol::Opcua) {
        t.problem("opcua", "only opcua devices take an [opcua] table");
    }
    let opcua = match (protocol, opcua) {
        (Some(Protocol::Opcua), None) if opcua_table.is_none() => Some(OpcUaSettings {
            security_policy: "None".into(),
            security_mode: "None".into(),
            username_env: None,
            password_env: None,
            mode: OpcUaMode::Poll,
            alarms: false,
        }),
        (_, o) => o,
    };
    (serial, opcua)
}

fn read_device_file(t: &Table<'_, '_>) -> Parsed {
    let doc = t.doc();
    let id_line = t.key_span("id").map_or(1, |s| doc.line(s.start));
    let device_origin = Origin { file: doc.name().to_string(), line: id_line };

    let id = t.req_str("id").and_then(|s| match s.parse::<DeviceId>() {
        Ok(id) => Some(id),
        Err(e) => {
            t.problem("id", format!("{e}, found {s:?}"));
            None
        }
    });
    let plant = t.req_str("plant").filter(|p| match check_plant(p) {
        Ok(()) => true,
        Err(e) => {
            t.problem("plant", format!("{e}, found {p:?}"));
            false
        }
    });
    let zone = t.req_str("zone").filter(|z| match check_zone(z) {
        Ok(()) => true,
        Err(e) => {
            t.problem("zone", format!("{e}, found {z:?}"));
            false
        }
    });
    let description = t.req_text("description");
    let protocol = t.req_pick::<Protocol>("protocol");
    let endpoint_text = t.req_str("endpoint");
    let unit_id = t.int(bounds::UNIT_ID.key, bounds::UNIT_ID.range()).unwrap_or(1) as u8;
    let timeout_ms = t.int(bounds::TIMEOUT_MS.key, bounds::TIMEOUT_MS.range()).unwrap_or(1000);
    let poll_ms = t.int(bounds::POLL_INTERVAL_MS.key, bounds::POLL_INTERVAL_MS.range()).unwrap_or(1000);
    let max_regs = t
        .int(bounds::MAX_REGISTERS_PER_READ.key, bounds::MAX_REGISTERS_PER_READ.range())
        .unwrap_or(125) as u16;
    let max_gap = t.int(bounds::MAX_GAP.key, bounds::MAX_GAP.range()).unwrap_or(8) as u16;
    let word_order = t.pick::<WordOrder>("word_order").unwrap_or(WordOrder::ABCD);

    let endpoint = match (protocol, endpoint_text) {
        (Some(p), Some(e)) => parse_endpoint(p, e).map_err(|m| t.problem("endpoint", m)).ok(),
        _ => None,
    };

    let (serial, opcua) = read_protocol_tables(t, protocol);
    let breaker = t.table("breaker").map(|b| read_breaker(&b));
    let (mut sensors, declared_sensors) =
        read_sensors(t, Context { protocol, plant, zone, word_order, device: id.as_ref(), max_regs });
    t.finish();

    let declared_device = id.clone();
    let device = match (id, plant, zone, description, protocol, endpoint) {
        (Some(id), Some(plant), Some(zone), Some(description), Some(protocol), Some(endpoint))
            if !doc.has_problems() =>
        {
            Some(Device {
                id,
                plant: plant.to_string(),
                zone: zone.to_string(),
                description: description.to_string(),
                protocol,
                endpoint,
                unit_id,
                timeout: Duration::from_millis(timeout_ms as u64),
                poll_interval: (poll_ms > 0).then(|| Duration::from_millis(poll_ms as u64)),
                max_registers_per_read: max_regs,
                max_gap,
                word_order,
                serial,
                opcua,
                breaker,
                source: doc.name().to_string(),
            })
        }
        _ => None,
    };
    if device.is_none() {
        sensors.clear();
    }
    Parsed { device, sensors, device_origin, declared_device, declared_sensors }
}

fn parse_endpoint(protocol: Protocol, e: &str) -> Result<Endpoint, String> {
    match protocol {
        Protocol::ModbusTcp | Protocol::ModbusRtuOverTcp => {
            let bad = || format!("must be host:port, e.g. \"127.0.0.1:5020\", found {e:?}");
            let (host, port) = e.rsplit_once(':').ok_or_else(bad)?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port: u16 = port.parse().map_err(|_| bad())?;
            if host.is_empty() || host.contains(char::is_whitespace) || port == 0 {
                return Err(bad());
            }
            Ok(Endpoint::Tcp { host: host.to_string(), port })
        }
        Protocol::ModbusRtu => {
            if e.is_empty() || e.contains(char::is_whitespace) {
                Err(format!("must be a serial device path such as \"/dev/ttyUSB0\", found {e:?}"))
            } else {
                Ok(Endpoint::Serial { path: e.to_string() })
            }
        }
        Protocol::Opcua => {
            let rest = e
                .strip_prefix("opc.tcp://")
                .ok_or_else(|| format!("must be opc.tcp://host:port/path, found {e:?}"))?;
            let authority = rest.split('/').next().unwrap_or("");
            let ok = authority
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if ok {
                Ok(Endpoint::OpcUa { url: e.to_string() })
            } else {
                Err(format!("must be opc.tcp://host:port/path, found {e:?}"))
            }
        }
        // Not a protocol a device file can name (`pick` never yields it).
        Protocol::Sparkplug => Err("no device file reaches a device through Sparkplug".into()),
    }
}

fn read_serial(s: &Table<'_, '_>) -> Option<SerialSettings> {
    let baud = s.int(bounds::BAUD_RATE.key, bounds::BAUD_RATE.range());
    let parity = s.pick::<Parity>("parity");
    let data_bits = s.int(bounds::DATA_BITS.key, bounds::DATA_BITS.range());
    let stop_bits = s.int(bounds::STOP_BITS.key, bounds::STOP_BITS.range());
    Some(SerialSettings {
        baud_rate: baud.unwrap_or(19200) as u32,
        parity: parity.unwrap_or(Parity::Even),
        data_bits: data_bits.unwrap_or(8) as u8,
        stop_bits: stop_bits.unwrap_or(1) as u8,
    })
}

fn read_opcua(o: &Table<'_, '_>) -> Option<OpcUaSettings> {
    let policy = o.choice(
        "security_policy",
        &["None", "Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss"],
    );
    let mode = o.choice("security_mode", &["None", "Sign", "SignAndEncrypt"]);
    let env_name = |key: &'static str| {
        o.str(key).filter(|v| {
            let ok =
                !v.is_empty() && v.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                o.problem(
                    key,
                    "must name an environment variable (A-Z, 0-9, _); credentials never go in device files",
                );
            }
            ok
        })
    };
    let username_env = env_name("username_env").map(str::to_string);
    let password_env = env_name("password_env").map(str::to_string);
    if username_env.is_some() != password_env.is_some() {
        o.table_problem("username_env and password_env go together");
    }
    let sub = o.pick::<OpcUaMode>("mode");
    let (policy, mode) = (policy.unwrap_or("None"), mode.unwrap_or("None"));
    if (policy == "None") != (mode == "None") {
        o.table_problem(format!(
            "security_policy {policy:?} and security_mode {mode:?} do not fit: both are \"None\" or neither is"
        ));
    }
    Some(OpcUaSettings {
        security_policy: policy.to_string(),
        security_mode: mode.to_string(),
        username_env,
        password_env,
        mode: sub.unwrap_or(OpcUaMode::Poll),
        alarms: o.bool("alarms").unwrap_or(false),
    })
}
