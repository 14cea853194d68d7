//! The real `fieldgate` binary, run as a user would.

use std::process::{Command, Output};

use super::support::*;
use serde_json::{Value, json};

/// The binary in the repository's folder (for its devices/), hermetic otherwise: its own
/// data directory, no port of the demo's, none of the caller's FIELDGATE_* variables.
fn fieldgate(args: &[&str]) -> Output {
    let data = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(args)
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .output_within()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn check_summarises_the_demo_plant() {
    let o = fieldgate(&["check"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let n = demo_registry().sensors().len();
    let out = stdout(&o);
    assert!(out.starts_with(&format!("ok: 4 devices, {n} sensors")), "{out}");
    assert!(out.contains("modbus-tcp           2 device(s)"), "{out}");
    assert!(out.contains("opcua                1 device(s), 8 sensor(s)"), "{out}");
}

/// Regression (the adversarial walk): `check --hub` checks a hub's configuration as
/// `fieldgate hub` takes it (no device files; a broker named), and `hub` refuses one
/// without a broker before it says its configuration loaded.
#[test]
fn check_hub_checks_what_the_hub_needs_and_the_hub_refuses_no_broker_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("hub.toml");
    std::fs::write(&conf, "[devices]\ndir = \"no-such-folder\"\n[hub]\nbrokers = []\n").unwrap();
    let c = conf.to_str().unwrap();
    let o = fieldgate(&["--config", c, "check", "--hub"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stderr(&o).contains("hub.brokers is empty"), "{}", stderr(&o));
    let o = fieldgate(&["--config", c, "hub"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("hub.brokers is empty") && !stderr(&o).contains("configuration loaded"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&conf, "[devices]\ndir = \"no-such-folder\"\n[hub]\nbrokers = [\"mqtt://127.0.0.1:1883\"]\ngroups = [\"A\"]\n").unwrap();
    let o = fieldgate(&["--config", c, "check", "--hub"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).lines().next(),
        Some("ok: fleet hub fieldgate-hub on mqtt://127.0.0.1:1883 (groups A)")
    );
    // Without --hub the missing devices folder is what check reports.
    assert_eq!(fieldgate(&["--config", c, "check"]).status.code(), Some(1));
}

#[test]
fn demo_plant_names_the_plants_it_has_when_given_another() {
    let o = fieldgate(&["demo", "--plant", "Z", "--tour"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--plant Z: no device of that plant (the demo's plants: A, B)"),
        "{}",
        stderr(&o)
    );
}

/// A one-shot command's configuration load is no audit event (it would be a line on every
/// command); a refused configuration is one, whatever the command.
#[test]
fn a_refused_configuration_is_an_audit_event_and_a_good_one_at_the_command_line_is_not() {
    let o = fieldgate(&["check"]);
    assert!(o.status.success() && !stderr(&o).contains("configuration_load"), "{}", stderr(&o));
    let bad = GOOD.replace("address = 0", "address = 70000");
    let dir = device_dir(&[("bad.toml", &bad)]);
    let o = fieldgate(&["check", "--devices", dir.path().to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let audit = err.lines().find(|l| l.contains("configuration_load")).unwrap_or_else(|| panic!("{err}"));
    assert!(audit.contains("refused") && audit.contains("problems=1"), "{audit}");
}

#[test]
fn check_prints_every_problem_and_exits_1() {
    let bad = GOOD.replace("address = 0", "address = 70000").replace("kind = \"pressure\"", "kind = 3");
    let dir = device_dir(&[("bad.toml", &bad), ("dup.toml", &GOOD.replace("t-plc", "t-plc2"))]);
    let o = fieldgate(&["check", "--devices", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("bad.toml:11: `kind` in sensor T_ZONE1_001: must be a string, found an integer"),
        "{err}"
    );
    assert!(
        err.contains(
            "bad.toml:14: `address` in sensor T_ZONE1_001: must be between 0 and 65535, found 70000"
        ),
        "{err}"
    );
    // The second file repeats the broken file's sensor ID: reported too, not hidden by the
    // first file's own problems.
    assert!(err.contains("dup.toml:8: duplicate sensor ID T_ZONE1_001"), "{err}");
    assert!(err.contains("3 problem(s); fieldgate will not start until they are fixed."), "{err}");
    assert!(stdout(&o).is_empty());
}

/// `check` reads the tokens file as `serve` will: one it cannot read fails the check,
/// instead of `check` saying "ok" and `serve` refusing to start.
#[test]
fn check_reports_a_tokens_file_serve_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    for tokens in [dir.path().join("missing.toml"), std::path::PathBuf::from("/dev/zero")] {
        let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .arg("check")
            .current_dir(root())
            .env_clear()
            .env("FIELDGATE_AUTH_TOKENS_FILE", &tokens)
            .output_within()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(tokens.file_name().unwrap().to_str().unwrap()), "{}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    }
}

#[test]
fn check_reports_configuration_problems_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fieldgate.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"nowhere\"\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["check", "--config", cfg.to_str().unwrap()])
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_CALLS_DEADLINE_MS", "-5")
        .output_within()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("fieldgate.toml:2: `listen` in [server]: must be ip:port"), "{err}");
    assert!(
        err.contains(
            "environment variable FIELDGATE_CALLS_DEADLINE_MS: `deadline_ms` in [calls]: must be between"
        ),
        "{err}"
    );
}

#[test]
fn tools_prints_the_served_definitions() {
    let o = fieldgate(&["tools"]);
    assert!(o.status.success());
    let defs: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&str> = defs.as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "list_sensors",
            "get_sensor_reading",
            "get_sensor_readings",
            "get_sensor_history",
            "get_device_status",
            "create_work_order",
            "get_work_order",
            "list_work_orders",
            "list_alarms",
            "get_alarm_history",
            "get_alarm_summary"
        ]
    );
    for key in ["description", "inputSchema", "outputSchema", "annotations"] {
        assert!(defs[0].get(key).is_some(), "{key}");
    }
}

#[test]
fn call_prints_the_envelope_and_exits_by_outcome() {
    let o = fieldgate(&["call", "list_sensors", r#"{"zone":"UTIL","limit":3}"#]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(e["ok"], true);
    assert_eq!(e["data"]["sensors"].as_array().unwrap().len(), 3);
    assert_eq!(e["data"]["total"], 9);

    let o = fieldgate(&["call", "list_sensors", r#"{"zone":"util"}"#]);
    assert_eq!(o.status.code(), Some(2));
    let e: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(e["ok"], false);
    assert_eq!(e["error"]["code"], "INVALID_ARGUMENT");
    assert_eq!(e["error"]["suggestions"][0], "UTIL");

    let o = fieldgate(&["call", "list_sensors"]);
    assert!(o.status.success());
}

#[test]
fn call_refuses_bad_json_and_unknown_tools() {
    let o = fieldgate(&["call", "list_sensors", "{zone: LINE1}"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not valid JSON"));
    let o = fieldgate(&["call", "make_coffee", "{}"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown tool `make_coffee`; tools served: list_sensors, get_sensor_reading"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panicked"));
}

async fn fieldgate_async(args: &[&str]) -> Output {
    let data = tempfile::tempdir().unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(args)
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .output_within()
        .await
        .expect("the binary runs")
}

#[tokio::test]
async fn discover_modbus_writes_a_file_that_passes_check_and_covers_the_device() {
    use fieldgate::registry::SensorSource;
    let plant = demo_plant().await;
    let addr = plant.sim.addr("a-line1-plc").unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("found.toml");
    let file_s = file.to_str().unwrap();
    let args = [
        "discover",
        "modbus",
        "--endpoint",
        &addr,
        "--plant",
        "A",
        "--zone",
        "LINE9",
        "--max-address",
        "300",
    ];
    let o = fieldgate_async(&[&args[..], &["--out", file_s]].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    // Unedited, the file passes `fieldgate check`.
    let o = fieldgate_async(&["check", "--devices", dir.path().to_str().unwrap()]).await;
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    // Every register and bit the demo file declares for this device was found, and
    // addresses the simulator refuses were not.
    let found = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let has = |table: &str, address: u16| {
        found.sensors().iter().any(|s| match &s.source {
            SensorSource::Modbus(p) => {
                format!("{:?}", p.table).eq_ignore_ascii_case(table) && p.address == address
            }
            _ => false,
        })
    };
    let demo = demo_registry();
    let declared: Vec<_> = demo
        .sensors()
        .iter()
        .filter(|s| s.device.as_str() == "a-line1-plc")
        .filter_map(|s| match &s.source {
            SensorSource::Modbus(p) => Some((format!("{:?}", p.table), p.address)),
            _ => None,
        })
        .collect();
    assert!(!declared.is_empty());
    for (table, address) in &declared {
        assert!(has(table, *address), "{table} {address} was not discovered");
    }
    assert!(!has("Holding", 299), "an address the device refuses was listed");
    // The file is not overwritten, and bad arguments are refused with the reason.
    let o = fieldgate_async(&[&args[..], &["--out", file_s]].concat()).await;
    assert!(!o.status.success() && stderr(&o).contains("cannot write"), "{}", stderr(&o));
    let o =
        fieldgate_async(&["discover", "modbus", "--endpoint", &addr, "--plant", "a!", "--zone", "Z"]).await;
    assert!(!o.status.success() && stderr(&o).contains("--plant"), "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_opcua_writes_a_file_that_passes_check_and_reads_the_server() {
    use fieldgate::registry::SensorSource;
    use serde_json::json;
    let plant = demo_plant().await;
    plant.sim.freeze(Some(42.0));
    let url = plant.sim.opcua_urls()["b-oven2-opcua"].clone();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("oven9.toml");
    let args = ["discover", "opcua", "--endpoint", &url, "--plant", "B", "--zone", "OVEN9"];
    let o = fieldgate_async(&[&args[..], &["--out", file.to_str().unwrap()]].concat()).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = fieldgate_async(&["check", "--devices", dir.path().to_str().unwrap()]).await;
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));

    // One numbered sensor per variable of the server, with its description and unit.
    let found = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let node = |s: &fieldgate::registry::Sensor| match &s.source {
        SensorSource::OpcUa { node_id } => node_id.clone(),
        _ => unreachable!(),
    };
    let demo = demo_registry();
    let declared: Vec<_> = demo.sensors().iter().filter(|s| s.device.as_str() == "b-oven2-opcua").collect();
    assert_eq!(found.sensors().len(), declared.len());
    let ids: Vec<String> = found.sensors().iter().map(|s| s.id.to_string()).collect();
    assert_eq!(ids[0], "B_OVEN9_001");
    for d in &declared {
        let f = found
            .sensors()
            .iter()
            .find(|f| node(f) == node(d))
            .unwrap_or_else(|| panic!("{} ({}) not discovered", d.id, node(d)));
        assert_eq!(f.description, d.description, "{}", d.id);
        assert_eq!(f.unit, d.unit, "{}", d.id);
    }
    // Read unedited, the discovered sensors give the server's values.
    let service = fieldgate::tools::ToolService::new(
        std::sync::Arc::new(fieldgate::registry::Registry::load(dir.path()).unwrap()),
        Default::default(),
    );
    for d in &declared {
        let f = found.sensors().iter().find(|f| node(f) == node(d)).unwrap();
        let e = service.call("get_sensor_reading", json!({"sensor_id": f.id.to_string()})).await.unwrap();
        assert!(e.ok, "{}: {:?}", f.id, e.error);
        let want = serde_json::to_value(plant.sim.expected(d.id.as_str()).unwrap()).unwrap();
        assert_eq!(e.json()["value"], want, "{} as {}", d.id, f.id);
    }
    // A server that is not there is reported, not waited for.
    let closed = ClosedPort::new();
    let gone = format!("opc.tcp://{}/", closed.addr());
    let o = fieldgate_async(&["discover", "opcua", "--endpoint", &gone, "--plant", "B", "--zone", "Z"]).await;
    assert!(!o.status.success() && stderr(&o).contains("cannot connect"), "{}", stderr(&o));
    let o = fieldgate_async(&["discover", "opcua", "--endpoint", "http://x", "--plant", "B", "--zone", "Z"])
        .await;
    assert!(!o.status.success() && stderr(&o).contains("opc.tcp://"), "{}", stderr(&o));
}

#[test]
fn check_says_where_opcua_certificates_go_and_which_credentials_are_missing() {
    let oven = secured_oven("Basic256Sha256", "SignAndEncrypt", Some(("FG_CHECK_U", "FG_CHECK_P")));
    let dir = device_dir(&[("oven.toml", &oven)]);
    let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["check", "--devices", dir.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", "/srv/fg")
        .env("FG_CHECK_U", "baker")
        .output_within()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("b-oven2-opcua uses Basic256Sha256/SignAndEncrypt"), "{out}");
    assert!(out.contains("/srv/fg/pki/own/cert.der") && out.contains("/srv/fg/pki/trusted"), "{out}");
    assert!(out.contains("FG_CHECK_P is not set") && !out.contains("FG_CHECK_U is not set"), "{out}");
}

#[test]
fn check_warns_when_fieldgates_opcua_certificate_is_about_to_expire() {
    use opcua::crypto::{CertificateStore, X509Data};
    let data = tempfile::tempdir().unwrap();
    let store = CertificateStore::new(&data.path().join("pki"));
    store.ensure_pki_path().unwrap();
    let x509 = X509Data {
        key_size: 2048,
        common_name: "fieldgate".into(),
        organization: "fieldgate".into(),
        organizational_unit: "fieldgate".into(),
        country: "IE".into(),
        state: "Dublin".into(),
        alt_host_names: X509Data::alt_host_names("urn:fieldgate", None, true, false, true),
        certificate_duration_days: 10,
    };
    store.create_and_store_application_instance_cert(&x509, false).unwrap();
    let oven = secured_oven("Basic256Sha256", "Sign", None);
    let dir = device_dir(&[("oven.toml", &oven)]);
    let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["check", "--devices", dir.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        // In this process: no fieldgate another program runs on the default port is asked.
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .output_within()
        .unwrap();
    let out = stdout(&o);
    // Ten days from when it was made (a day boundary may have passed since).
    let day = |d| (chrono::Utc::now() + chrono::Days::new(d)).format("%Y-%m-%d").to_string();
    assert!(
        [day(9), day(10)]
            .iter()
            .any(|d| out.contains(&format!("fieldgate's OPC UA certificate expires {d}"))),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discover_opcua_says_when_a_server_offers_only_secured_endpoints() {
    let oven = secured_oven("Basic256Sha256", "SignAndEncrypt", None);
    let dir = device_dir(&[("oven.toml", &oven)]);
    let sim = sim_for(dir.path()).await;
    let url = sim.opcua_urls()["b-oven2-opcua"].clone();
    let o = fieldgate_async(&["discover", "opcua", "--endpoint", &url, "--plant", "B", "--zone", "Z"]).await;
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("offers no endpoint with security None/None") && err.contains("discovery connects"),
        "{err}"
    );
    sim.shutdown().await;
}

/// A FIFO named like a device file would block a plain read forever, and a link to
/// `/dev/zero` would never end: both are refused by name, and so is a file too large.
#[tokio::test]
async fn check_reads_only_regular_files_of_sane_size() {
    let dir = device_dir(&[("good.toml", GOOD)]);
    let fifo = dir.path().join("x.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().map(|s| s.success()).unwrap_or(false);
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.toml")).unwrap();
    std::fs::write(dir.path().join("huge.toml"), vec![b'#'; 5 << 20]).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["check", "--devices", dir.path().to_str().unwrap()])
        .env_clear()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Bounded: a hang here is the bug (the child is killed when the timeout drops it).
    let o = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("fieldgate check does not hang on a FIFO or /dev/zero")
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("zero.toml: unreadable file: not a regular file"), "{err}");
    assert!(err.contains("huge.toml: unreadable file: 5242880 bytes is more than the 4194304"), "{err}");
    if made {
        assert!(err.contains("x.toml") && err.contains("not a regular file"), "{err}");
    }
}

/// Every problem at once: a file broken on its own does not hide that its IDs are also
/// declared in another file.
#[test]
fn check_reports_duplicates_across_files_even_when_a_file_is_broken() {
    let broken = GOOD.replace("address = 0", "address = 70000");
    let dir = device_dir(&[("a.toml", &broken), ("b.toml", GOOD)]);
    let o = fieldgate(&["check", "--devices", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("must be between 0 and 65535, found 70000"), "{err}");
    assert!(err.contains("b.toml:1: duplicate device ID t-plc: already declared at"), "{err}");
    assert!(err.contains("b.toml:8: duplicate sensor ID T_ZONE1_001: already declared at"), "{err}");
    assert!(err.contains("3 problem(s)"), "{err}");
}

/// Device files accept host names, and so does discover: it resolves the name, says which
/// address answered, and keeps the name in the file it writes.
#[tokio::test]
async fn discover_modbus_accepts_a_host_name() {
    let plant = demo_plant().await;
    let port = plant.sim.addr("a-util-meter").unwrap().port();
    let endpoint = format!("localhost:{port}");
    let o = fieldgate_async(&[
        "discover",
        "modbus",
        "--endpoint",
        &endpoint,
        "--plant",
        "A",
        "--zone",
        "UTIL9",
        "--max-address",
        "20",
    ])
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("note: {endpoint} answered at ")), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("endpoint = \"{endpoint}\"")), "{}", stdout(&o));
    let o = fieldgate_async(&[
        "discover",
        "modbus",
        "--endpoint",
        "no-such-host.invalid:502",
        "--plant",
        "A",
        "--zone",
        "Z",
    ])
    .await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("must be host:port") && stderr(&o).contains("must resolve"),
        "{}",
        stderr(&o)
    );
}

/// Day one: run from the wrong folder, or with the port taken, and the message says
/// where it looked and which flag changes it.
#[test]
fn start_up_failures_say_what_to_change() {
    let elsewhere = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["check"])
        .current_dir(elsewhere.path())
        .env_clear()
        .output_within()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot read the devices folder")
            && err.contains("looked in")
            && err.contains("--devices"),
        "{err}"
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let data = tempfile::tempdir().unwrap();
    let closed = ClosedPort::new();
    let devices = demo_devices_unreachable(&closed);
    let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--devices", devices.path().to_str().unwrap()])
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", taken.local_addr().unwrap().to_string())
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .output_within()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot listen on") && err.contains("--listen"), "{err}");
}

/// Logs piped to a file carry no colour codes, and every tool call is one event, in
/// `call` as in `serve`.
#[test]
fn logs_to_a_pipe_have_no_escape_codes_and_one_event_per_call() {
    let data = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args([
            "call",
            "list_sensors",
            r#"{"zone":"UTIL","limit":1}"#,
            "--devices",
            demo_dir().to_str().unwrap(),
        ])
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .output_within()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(!err.contains('\u{1b}'), "escape codes in piped logs: {err:?}");
    assert_eq!(err.matches("tool call").count(), 1, "{err}");
}

/// Asking a running service needs none of the files a local call reads: `call --url` from
/// a folder with no `devices/` answers with the service's envelope.
#[tokio::test]
async fn call_with_a_url_needs_no_device_files_here() {
    let plant = demo_plant().await;
    let server = Server::start(plant.service.clone(), Default::default()).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let url = format!("http://{}", server.addr);
    let o = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["call", "--url", &url, "list_sensors", r#"{"limit":1}"#])
        .current_dir(elsewhere.path())
        .env_clear()
        .output_within()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
}

/// Regression (issue 32): `call` and `devices status` next to a running demo read the
/// device files' endpoints themselves and silently made `./data`; local and remote
/// `devices status` printed different things. A fieldgate answering on `server.listen` is
/// asked (its data directory elsewhere, as a demo's is), nothing is created here, and
/// `devices status` prints the same data either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_and_devices_next_to_a_running_service_ask_it_and_create_nothing() {
    let plant = demo_plant().await;
    let server = Server::start(plant.service.clone(), Default::default()).await;
    let here = tempfile::tempdir().unwrap();
    let devices = root().join("devices");
    let run = |listen: String, args: &'static [&'static str]| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"));
        c.arg("--devices")
            .arg(&devices)
            .args(args)
            .current_dir(here.path())
            .env_clear()
            .env("FIELDGATE_SERVER_LISTEN", listen)
            .kill_on_drop(true);
        async move {
            tokio::time::timeout(std::time::Duration::from_secs(60), c.output())
                .await
                .expect("the command ends within 60 s")
                .unwrap()
        }
    };
    let listen = server.addr.to_string();
    let o = run(listen.clone(), &["call", "get_sensor_reading", r#"{"sensor_id":"A_LINE1_001"}"#]).await;
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(v["ok"], true, "the service (and its simulator) answered: {v} {}", stderr(&o));
    assert!(!here.path().join("data").exists(), "no data directory made here");
    // A data directory named on the command line is used, not a service on server.listen.
    let named = here.path().join("named");
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"));
    c.arg("--devices").arg(&devices).args(["call", "list_work_orders", "{}", "--data-dir"]).arg(&named);
    let o = c.current_dir(here.path()).env_clear().env("FIELDGATE_SERVER_LISTEN", server.addr.to_string());
    let o = tokio::time::timeout(std::time::Duration::from_secs(60), o.output())
        .await
        .expect("call ends")
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        named.join("fieldgate.redb").exists() || named.read_dir().is_ok_and(|mut d| d.next().is_some()),
        "called over the named directory"
    );
    let remote = run(listen, &["devices", "status", "a-line1-plc"]).await;
    assert!(remote.status.success(), "{}", stderr(&remote));
    let remote: Value = serde_json::from_slice(&remote.stdout).unwrap();
    assert_eq!(remote["devices"][0]["device_id"], "a-line1-plc", "{remote}");
    assert_eq!(remote["devices"][0]["state"], "up", "{remote}");
    // With no service there: in this process, the same shape of output.
    let local = run("127.0.0.1:0".into(), &["devices", "status", "a-line1-plc"]).await;
    assert!(local.status.success(), "{}", stderr(&local));
    let local: Value = serde_json::from_slice(&local.stdout).unwrap();
    assert_eq!(local["devices"][0]["device_id"], "a-line1-plc", "{local}");
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(keys(&local), keys(&remote), "one output format");
}

/// Regression (review of issue 32): an owner file left by a process that died named a
/// service that no longer answers, and `call` failed with "cannot reach" although the data
/// directory was free. It now runs in this process over that directory.
#[tokio::test]
async fn a_stale_owner_file_is_not_taken_for_a_running_service() {
    let closed = ClosedPort::new();
    let data = tempfile::tempdir().unwrap();
    let owner = json!({"pid": 999_999, "mode": "serve", "url": format!("http://{}", closed.addr()), "started_at": "2026-01-01T00:00:00Z"});
    std::fs::write(data.path().join(fieldgate::app::OWNER_FILE), owner.to_string()).unwrap();
    let o = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .args(["call", "list_sensors", r#"{"limit":1}"#])
            .current_dir(root())
            .env_clear()
            .env("FIELDGATE_STORAGE_DATA_DIR", data.path())
            .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
            .output_within(),
    )
    .await
    .expect("call ends within 60 s")
    .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(v["ok"], true, "{v} {}", stderr(&o));
}

/// Regression (the adversarial walk): `call --data-dir` on a hub's box with the hub
/// stopped said "cannot read the devices folder"; it says that no service answers for the
/// directory and what to start.
#[test]
fn call_with_a_data_dir_no_service_answers_for_says_what_to_start() {
    let (here, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["call", "get_device_status", "{}", "--data-dir"])
        .arg(data.path())
        .current_dir(here.path())
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no running fieldgate answers for") && err.contains("fieldgate hub"), "{err}");
}

/// `fieldgate alarms` without a service reads the journal of the data directory named
/// with `--data-dir`; a directory without one is refused (nothing made there), not taken
/// as an empty journal.
#[test]
fn alarms_without_a_service_read_the_named_data_directory() {
    let here = tempfile::tempdir().unwrap();
    let run = |args: &[&str], dir: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
            .arg("--devices")
            .arg(crate::support::demo_dir())
            .args(args)
            .arg("--data-dir")
            .arg(dir)
            .current_dir(here.path())
            .env_clear()
            // No service answers here.
            .env("FIELDGATE_SERVER_LISTEN", crate::support::ClosedPort::new().addr().to_string())
            .output()
            .unwrap()
    };
    let empty = here.path().join("elsewhere");
    let o = run(&["alarms", "list"], &empty);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no alarm journal") && stderr(&o).contains("--data-dir"), "{}", stderr(&o));
    assert!(!empty.exists() && !here.path().join("data").exists(), "nothing made");
    let data = here.path().join("data-b");
    fieldgate::store::alarm_journal::AlarmJournal::open_in(&data).unwrap();
    let o = run(&["alarms", "list", "--json"], &data);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["counts"]["configured"], 9, "{v}");
    let o = run(&["alarms", "ack", "a-line1-plc.COMM"], &data);
    assert!(stderr(&o).contains("nothing to acknowledge"), "a device's alarm ID is taken: {}", stderr(&o));
    let o = run(&["alarms", "ack", "a-line1-plc.COM"], &data);
    assert!(stderr(&o).contains("Did you mean a-line1-plc.COMM?"), "the nearest is said: {}", stderr(&o));
}
