//! OPC UA readings through the tools from the simulator's OPC UA server on a real
//! loopback socket: values and types, status codes, a server that goes away.

use super::support::*;
use fieldgate::registry::SensorSource;
use fieldgate::tools::ErrorCode;
use fieldgate_sim::{Faults, SimValue};
use serde_json::json;

fn opcua_sensors() -> Vec<String> {
    demo_registry()
        .sensors()
        .iter()
        .filter(|s| matches!(s.source, SensorSource::OpcUa { .. }))
        .map(|s| s.id.to_string())
        .collect()
}

#[tokio::test]
async fn every_demo_opcua_sensor_reads_the_simulators_value() {
    let plant = demo_plant().await;
    let sensors = opcua_sensors();
    assert_eq!(sensors.len(), 8);
    for t in [0.0, 37.25, 1234.5] {
        plant.sim.freeze(Some(t));
        for id in &sensors {
            let e = plant.call("get_sensor_reading", json!({ "sensor_id": id })).await;
            assert!(e.ok, "{id}: {:?}", e.error);
            let data = e.json();
            assert_eq!(data["source"], "live", "{id}");
            assert_eq!(data["quality"], "good", "{id}");
            let got = &data["value"];
            match plant.sim.expected(id).unwrap() {
                SimValue::Num(w) => {
                    let g = got.as_f64().unwrap_or_else(|| panic!("{id}: {got}"));
                    assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{id}: read {g}, simulator serves {w}");
                }
                SimValue::Bool(w) => assert_eq!(got.as_bool(), Some(w), "{id}"),
                SimValue::Text(w) => assert_eq!(got.as_str(), Some(w.as_str()), "{id}"),
            }
        }
    }
    assert!(plant.sim.opcua_reads() >= 24, "reads went to the OPC UA server");
}

#[tokio::test]
async fn a_batch_reads_all_opcua_sensors_in_one_call() {
    let plant = demo_plant().await;
    let sensors = opcua_sensors();
    let before = plant.sim.opcua_reads();
    let e = plant.call("get_sensor_readings", json!({ "sensor_ids": sensors })).await;
    assert!(e.ok, "{:?}", e.error);
    assert_eq!(e.json()["readings"].as_array().map(Vec::len), Some(8));
    assert_eq!(plant.sim.opcua_reads() - before, 8, "one value read per node");
}

#[tokio::test]
async fn status_codes_map_to_busy_rejected_and_unavailable() {
    let plant = demo_plant().await;
    plant.faults(
        "b-oven2-opcua",
        Faults { exception_code: Some(6), exception_rate: 1.0, ..Default::default() },
    );
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceBusy, true));

    plant.faults(
        "b-oven2-opcua",
        Faults { exception_code: Some(2), exception_rate: 1.0, ..Default::default() },
    );
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceRejected, false));
    assert!(err.message.contains("BadNodeIdUnknown"), "{}", err.message);
    assert!(err.hint.contains("node ns=2;s=Oven2.Zone3.Temperature"), "{}", err.hint);

    plant.faults("b-oven2-opcua", Faults { down: true, ..Default::default() });
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceUnavailable, true));

    plant.faults("b-oven2-opcua", Faults::default());
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_003"})).await;
    assert!(e.ok, "{:?}", e.error);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_unavailable_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(demo_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    // A port that refuses connections for the whole test.
    let closed = ClosedPort::new();
    registry.override_opcua_endpoints([(
        "b-oven2-opcua".to_string(),
        format!("opc.tcp://127.0.0.1:{}/", closed.port),
    )]);
    let service = fieldgate::tools::ToolService::new(std::sync::Arc::new(registry), Default::default());
    let e = service.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001"})).await.unwrap();
    let err = e.error.unwrap();
    // Refused, so unavailable (a timeout would be DEVICE_TIMEOUT); how fast is a bench figure.
    assert_eq!(err.code, ErrorCode::DeviceUnavailable, "{err:?}");
    assert!(err.retryable);
}

#[tokio::test]
async fn a_restarted_server_gets_a_new_session_and_values_flow_again() {
    let mut plant = demo_plant().await;
    let read = json!({"sensor_id": "B_OVEN2_001"});
    assert!(plant.call("get_sensor_reading", read.clone()).await.ok);
    plant.sim.restart_opcua("b-oven2-opcua").await.unwrap();
    // The old session died with the server. The first call after the restart may still
    // meet it (a retryable error) but must not hang; within the next call values flow.
    let mut answers = Vec::new();
    for _ in 0..2 {
        let e = plant.call("get_sensor_reading", read.clone()).await;
        if e.ok {
            break;
        }
        let err = e.error.unwrap();
        assert!(err.retryable, "{err:?}");
        answers.push(err.code);
    }
    assert!(answers.len() < 2, "no value after a restart: {answers:?}");
    let e = plant.call("get_sensor_reading", read).await;
    assert!(e.ok, "{:?}", e.error);
    assert_eq!(e.json()["source"], "live");
}

/// A plant of the oven alone, as `oven` describes it, with fieldgate's data in `data`.
async fn oven_plant(
    oven: &str,
    data: &std::path::Path,
    scenario: fieldgate_sim::Scenario,
) -> (Plant, tempfile::TempDir) {
    let dir = device_dir(&[("b-oven2-opcua.toml", oven)]);
    let mut config = fieldgate::config::Config::default();
    config.storage.data_dir = data.to_path_buf();
    (plant_with(dir.path(), scenario, config).await, dir)
}

fn assert_reads_the_simulators_value(plant: &Plant, e: &fieldgate::tools::Envelope) {
    assert!(e.ok, "{:?}", e.error);
    let want = match plant.sim.expected("B_OVEN2_001").unwrap() {
        SimValue::Num(w) => w,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.json()["value"].as_f64(), Some(want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_server_is_refused_until_its_certificate_is_trusted_then_read() {
    for (policy, mode) in [
        ("Basic256Sha256", "SignAndEncrypt"),
        ("Aes256_Sha256_RsaPss", "Sign"),
        ("Aes128_Sha256_RsaOaep", "SignAndEncrypt"),
    ] {
        let data = tempfile::tempdir().unwrap();
        let (plant, _dir) =
            oven_plant(&secured_oven(policy, mode, None), data.path(), Default::default()).await;
        plant.sim.freeze(Some(12.5));
        let pki = data.path().join("pki");
        assert!(pki.join("own/cert.der").is_file(), "fieldgate made its certificate on start");
        let read = json!({"sensor_id": "B_OVEN2_001"});

        // Untrusted: refused, not retryable, and the hint says which file to move where.
        let e = plant.call("get_sensor_reading", read.clone()).await;
        let err = e.error.unwrap();
        assert_eq!((err.code, err.retryable), (ErrorCode::DeviceRejected, false), "{policy}: {err:?}");
        assert!(err.message.contains("not trusted"), "{}", err.message);
        let rejected: Vec<_> =
            std::fs::read_dir(pki.join("rejected")).unwrap().map(|f| f.unwrap().path()).collect();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        let name = rejected[0].file_name().unwrap().to_string_lossy().to_string();
        let thumbprint = name.rsplit_once('[').unwrap().1.trim_end_matches("].der").to_string();
        assert_eq!(thumbprint.len(), 40, "{name}");
        for part in [
            format!("[{thumbprint}].der"),
            pki.join("rejected").display().to_string(),
            pki.join("trusted").display().to_string(),
        ] {
            assert!(err.hint.contains(&part), "hint lacks {part}: {}", err.hint);
        }
        // The certificate is the simulator's own.
        let served = std::fs::read(plant.sim.opcua_certificate("b-oven2-opcua").unwrap()).unwrap();
        assert_eq!(std::fs::read(&rejected[0]).unwrap(), served);
        // Asking again changes nothing.
        let again = plant.call("get_sensor_reading", read.clone()).await.error.unwrap();
        assert_eq!(again.code, ErrorCode::DeviceRejected);

        // The operator does what the hint says; the next read is live and right.
        std::fs::rename(&rejected[0], pki.join("trusted").join(&name)).unwrap();
        let e = plant.call("get_sensor_reading", read).await;
        assert_reads_the_simulators_value(&plant, &e);
        assert_eq!(e.json()["source"], "live");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_configured_security_is_a_configuration_fault() {
    // The device file asks for encryption; the server offers only None.
    let data = tempfile::tempdir().unwrap();
    let dir = device_dir(&[("b-oven2-opcua.toml", &secured_oven("None", "None", None))]);
    let sim = sim_for(dir.path()).await;
    let secured = device_dir(&[("b-oven2-opcua.toml", &secured_oven("Basic256Sha256", "Sign", None))]);
    let mut registry = fieldgate::registry::Registry::load(secured.path()).unwrap();
    registry.override_opcua_endpoints(sim.opcua_urls());
    let mut config = fieldgate::config::Config::default();
    config.storage.data_dir = data.path().to_path_buf();
    let service = fieldgate::tools::ToolService::new(std::sync::Arc::new(registry), config);
    let e = service.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001"})).await.unwrap();
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceRejected, false), "{err:?}");
    assert!(err.message.contains("no endpoint with security Basic256Sha256/Sign"), "{}", err.message);
}

/// `fieldgate call get_sensor_reading` for the oven, run as the real binary with `env`.
fn call_binary(devices: &std::path::Path, data: &std::path::Path, env: &[(&str, &str)]) -> serde_json::Value {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"));
    cmd.args(["--devices", devices.to_str().unwrap(), "call", "get_sensor_reading"])
        .arg(r#"{"sensor_id":"B_OVEN2_001"}"#)
        .env_clear()
        .env("FIELDGATE_STORAGE_DATA_DIR", data)
        // In this process: no fieldgate another program runs on the default port is asked.
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output_within().unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!(
            "stdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_from_the_environment_opens_the_session() {
    let (u, p) = ("FG_TEST_OVEN_USER", "FG_TEST_OVEN_PASSWORD");
    let oven = secured_oven("Basic256Sha256", "SignAndEncrypt", Some((u, p)));
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let scenario = fieldgate_sim::Scenario {
        opcua_users: [(
            "b-oven2-opcua".to_string(),
            fieldgate_sim::wave::UaUser { user: "baker".into(), password: "s3cret-crust".into() },
        )]
        .into(),
        ..Default::default()
    };
    let sim = fieldgate_sim::Simulator::start(
        fieldgate_sim::plant::load_dir(dir.path()).unwrap(),
        scenario,
        fieldgate_sim::Bind::Ephemeral,
    )
    .await
    .unwrap();
    sim.freeze(Some(3.0));
    // The service's device file points at the simulator's port.
    let url = sim.opcua_urls()["b-oven2-opcua"].clone();
    let service_dir =
        device_dir(&[("b-oven2-opcua.toml", &oven.replace("opc.tcp://127.0.0.1:4840/fieldgate", &url))]);
    let data = tempfile::tempdir().unwrap();
    // Trust the server as an operator would.
    let cert = sim.opcua_certificate("b-oven2-opcua").unwrap();
    let pki = fieldgate::driver::opcua::security::Pki::new(data.path().join("pki"));
    pki.trust(&std::fs::read(&cert).unwrap()).unwrap();

    let run = |env: Vec<(&'static str, &'static str)>| {
        let (devices, data) = (service_dir.path().to_path_buf(), data.path().to_path_buf());
        tokio::task::spawn_blocking(move || call_binary(&devices, &data, &env))
    };
    let ok = run(vec![(u, "baker"), (p, "s3cret-crust")]).await.unwrap();
    assert_eq!(ok["ok"], true, "{ok}");
    let SimValue::Num(want) = sim.expected("B_OVEN2_001").unwrap() else { panic!() };
    assert_eq!(ok["data"]["value"].as_f64(), Some(want));

    let wrong = run(vec![(u, "baker"), (p, "rye")]).await.unwrap();
    assert_eq!(wrong["error"]["code"], "DEVICE_REJECTED", "{wrong}");
    assert_eq!(wrong["error"]["retryable"], false);
    assert!(
        wrong["error"]["message"].as_str().unwrap().contains("refused fieldgate's user identity"),
        "{wrong}"
    );
    assert!(wrong["error"]["hint"].as_str().unwrap().contains(u), "{wrong}");
    assert!(!wrong.to_string().contains("rye"), "the password never appears: {wrong}");

    let unset = run(vec![(u, "baker")]).await.unwrap();
    assert_eq!(unset["error"]["code"], "DEVICE_REJECTED", "{unset}");
    assert!(unset["error"]["message"].as_str().unwrap().contains(&format!("{p} is not set")), "{unset}");
    sim.shutdown().await;
}

/// Waits (observing, not sleeping for a guess) until `done` holds; fails after 30 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    wait_until(what, std::time::Duration::from_secs(30), || std::future::ready(done())).await;
}

fn metric(service: &fieldgate::tools::ToolService, name: &str) -> u64 {
    let text = service.render_metrics();
    let line = format!("{name}{{device=\"b-oven2-opcua\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_feeds_history_and_survives_a_server_restart() {
    use fieldgate_sim::Wave;
    let oven = std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml"))
        .unwrap()
        .replace("mode = \"poll\"", "mode = \"subscribe\"")
        .replace("poll_interval_ms = 1000", "poll_interval_ms = 50");
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let mut scenario = fieldgate_sim::Scenario::default();
    scenario.sensors.insert("B_OVEN2_001".into(), Wave::Constant { value: 200.0 }); // deadband 0.5
    let mut plant = plant_from(dir.path(), scenario).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&plant.service.core(), stop.clone());
    let store = plant.service.history().unwrap().clone();
    let values = |sensor: &str| -> Vec<f64> {
        store
            .points(sensor, 0, i64::MAX)
            .unwrap()
            .iter()
            .map(|p| match p.value {
                fieldgate::store::gorilla::Stored::Float(f) => f,
                _ => f64::NAN,
            })
            .collect()
    };
    until("the first value", || values("B_OVEN2_001") == [200.0]).await;
    // No tool has read the device, yet its status says it was heard from.
    let status = plant.call("get_device_status", json!({"device_id": "b-oven2-opcua"})).await.json();
    assert!(status["devices"][0]["last_success"].is_string(), "{status}");

    // A change inside the deadband is filtered by the server: wait until every item has
    // been sampled a few times since (each sampling reads the 8 nodes), then leave it.
    plant.sim.set_wave("B_OVEN2_001", Wave::Constant { value: 200.3 });
    let reads = plant.sim.opcua_reads();
    until("sampling after the small change", || plant.sim.opcua_reads() >= reads + 8 * 4).await;
    plant.sim.set_wave("B_OVEN2_001", Wave::Constant { value: 201.0 });
    until("the change beyond the deadband", || values("B_OVEN2_001").len() >= 2).await;
    assert_eq!(values("B_OVEN2_001"), [200.0, 201.0]);
    assert_eq!(metric(&plant.service, "fieldgate_opcua_sessions_total"), 1);
    // 8 initial values and the one change: the server filtered 200.3 (the other sensors
    // are constant in this scenario).
    assert_eq!(metric(&plant.service, "fieldgate_opcua_notifications_total"), 9);

    // The server restarts under the live subscription: all its sessions and
    // subscriptions are gone. fieldgate opens a new session and recreates them.
    plant.sim.restart_opcua("b-oven2-opcua").await.unwrap();
    plant.sim.set_wave("B_OVEN2_001", Wave::Constant { value: 230.0 });
    until("values after the restart", || values("B_OVEN2_001").last() == Some(&230.0)).await;
    assert_eq!(metric(&plant.service, "fieldgate_opcua_sessions_total"), 2);
    // The subscription also keeps the reading cache fresh.
    let cached = plant
        .call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001", "max_age_ms": 60000}))
        .await
        .json();
    assert_eq!((cached["value"].as_f64(), cached["source"].as_str()), (Some(230.0), Some("cache")));
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_times_out_and_failures_open_the_breaker() {
    let plant = demo_plant().await;
    // Slower than the oven's 1000 ms timeout: a retryable timeout within the call deadline.
    plant.faults("b-oven2-opcua", Faults { latency_ms: 1500, ..Default::default() });
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_001"})).await;
    let err = e.error.unwrap();
    assert_eq!((err.code, err.retryable), (ErrorCode::DeviceTimeout, true), "{err:?}");
    // The first attempt times out at 1000 ms, the retry runs into the 2 s deadline: two
    // attempts, counted rather than timed.
    assert_eq!(e.meta.attempts, 2);

    // A server that answers every node with BadNotConnected is failing: after the
    // breaker's threshold the device is not asked any more.
    plant.faults("b-oven2-opcua", Faults { down: true, ..Default::default() });
    let mut codes = Vec::new();
    for _ in 0..10 {
        let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_002"})).await;
        let code = e.error.unwrap().code;
        codes.push(code);
        if code == ErrorCode::CircuitOpen {
            break;
        }
    }
    assert_eq!(codes.last(), Some(&ErrorCode::CircuitOpen), "{codes:?}");
    assert!(codes[..codes.len() - 1].iter().all(|c| *c == ErrorCode::DeviceUnavailable), "{codes:?}");
    let reads = plant.sim.opcua_reads();
    let e = plant.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_002"})).await;
    assert_eq!(e.error.unwrap().code, ErrorCode::CircuitOpen);
    assert_eq!(plant.sim.opcua_reads(), reads, "an open breaker sends nothing to the device");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_trusts_its_own_simulators_secured_server() {
    let oven = secured_oven("Basic256Sha256", "SignAndEncrypt", None);
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let mut config = fieldgate::config::Config::default();
    config.devices.dir = dir.path().to_path_buf();
    let registry = fieldgate::registry::Registry::load(dir.path()).unwrap();
    let demo =
        fieldgate::demo::Demo::start(config, registry, "127.0.0.1:0".parse().unwrap(), None).await.unwrap();
    let e = demo.tools.call("get_sensor_reading", json!({"sensor_id": "B_OVEN2_004"})).await.unwrap();
    assert!(e.ok, "{:?}", e.error);
    assert_eq!(e.json()["source"], "live");
    demo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_failures_say_whose_certificate_and_what_is_wrong() {
    use fieldgate::driver::Refusal;
    use opcua::types::{ByteString, StatusCode};
    let dir = device_dir(&[("b-oven2-opcua.toml", &secured_oven("Basic256Sha256", "Sign", None))]);
    let sim = sim_for(dir.path()).await;
    let der = std::fs::read(sim.opcua_certificate("b-oven2-opcua").unwrap()).unwrap();
    let cert = ByteString::from(der.clone());
    let data = tempfile::tempdir().unwrap();
    let pki = fieldgate::driver::opcua::security::Pki::new(data.path().join("pki"));
    // Not trusted: whatever async-opcua says, the operator's step is to trust it.
    for status in [StatusCode::BadCertificateUntrusted, StatusCode::BadCertificateHostNameInvalid] {
        let r = pki.refusal_for(&cert, status);
        assert!(matches!(r, Some(Refusal::UntrustedServer { .. })), "{status}: {r:?}");
    }
    assert_eq!(std::fs::read_dir(pki.rejected_dir()).unwrap().count(), 1, "the file the hint names exists");
    pki.trust(&der).unwrap();
    // Trusted but unfit: said as such, not blamed on fieldgate's certificate.
    let r = pki.refusal_for(&cert, StatusCode::BadCertificateHostNameInvalid);
    assert!(
        matches!(r, Some(Refusal::UnfitServerCertificate { reason, .. }) if reason.contains("host names")),
        "{r:?}"
    );
    let r = pki.refusal_for(&cert, StatusCode::BadCertificateTimeInvalid);
    assert!(
        matches!(r, Some(Refusal::UnfitServerCertificate { reason, .. }) if reason.contains("expired")),
        "{r:?}"
    );
    // Trusted, and the channel still failed its security checks: the server refused us.
    let r = pki.refusal_for(&cert, StatusCode::BadSecurityChecksFailed);
    assert!(matches!(r, Some(Refusal::ClientNotTrusted { .. })), "{r:?}");
    // Not a certificate matter at all.
    assert_eq!(pki.refusal_for(&cert, StatusCode::BadTimeout), None);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_subscription_stores_the_last_value_again_after_max_silence() {
    let oven = std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml"))
        .unwrap()
        .replace("poll_interval_ms = 1000", "poll_interval_ms = 50");
    assert!(oven.contains("mode = \"subscribe\""));
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let mut config = fieldgate::config::Config::default();
    config.history.max_silence_s = 1;
    let plant = plant_with(dir.path(), fieldgate_sim::Scenario::default(), config).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&plant.service.core(), stop.clone());
    let store = plant.service.history().unwrap().clone();
    // Every wave is constant here: after the 8 initial values the server sends nothing.
    until("three points of an unchanging sensor", || {
        store.points("B_OVEN2_004", 0, i64::MAX).unwrap().len() >= 3
    })
    .await;
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
    let points = store.points("B_OVEN2_004", 0, i64::MAX).unwrap();
    assert!(points.windows(2).all(|w| w[0].value == w[1].value), "the same value repeated");
    assert!(points.windows(2).all(|w| w[1].t - w[0].t >= 1000), "not before max_silence: {points:?}");
    assert_eq!(metric(&plant.service, "fieldgate_opcua_notifications_total"), 8, "no change was sent");
}

/// A live server that answers every item of a subscription with BadNotConnected (the
/// device behind it is gone): the cached values turn bad instead of staying the last good
/// ones, and the device goes down; when the items answer again, values and state return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_device_whose_items_all_go_unreachable_is_down_and_its_values_bad() {
    let oven = std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml"))
        .unwrap()
        .replace("poll_interval_ms = 1000", "poll_interval_ms = 50");
    assert!(oven.contains("mode = \"subscribe\""), "the demo oven subscribes");
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let mut config = fieldgate::config::Config::default();
    config.breaker.failure_threshold = 2;
    config.breaker.open_ms = 200;
    config.breaker.max_open_ms = 400;
    let plant = plant_with(dir.path(), fieldgate_sim::Scenario::default(), config).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&plant.service.core(), stop.clone());
    let cached = || {
        let p = plant.service.clone();
        async move {
            let args = json!({"sensor_id": "B_OVEN2_001", "max_age_ms": 60000});
            let v = p.call("get_sensor_reading", args).await.expect("served").json();
            v["quality"].as_str().map(str::to_string)
        }
    };
    let state = || {
        let p = plant.service.clone();
        async move {
            let args = json!({"device_id": "b-oven2-opcua"});
            let v = p.call("get_device_status", args).await.expect("served").json();
            v["devices"][0]["state"].as_str().map(str::to_string)
        }
    };
    let t = std::time::Duration::from_secs(30);
    wait_until("a good value", t, || async { cached().await.as_deref() == Some("good") }).await;
    wait_until("up", t, || async { state().await.as_deref() == Some("up") }).await;

    plant.faults("b-oven2-opcua", Faults { down: true, ..Default::default() });
    wait_until("the cached value bad", t, || async { cached().await.as_deref() == Some("bad") }).await;
    wait_until("the device down", t, || async { state().await.as_deref() == Some("down") }).await;

    plant.faults("b-oven2-opcua", Faults::default());
    wait_until("a good value again", t, || async { cached().await.as_deref() == Some("good") }).await;
    wait_until("up again", t, || async { state().await.as_deref() == Some("up") }).await;
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
}

/// A subscribed server is never read, yet its latency is known: its round trip is measured
/// by a read of its current time every 10 s (the first at once), shown by
/// get_device_status (and so by the console) and counted on /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_device_has_a_latency() {
    let oven = std::fs::read_to_string(demo_dir().join("b-oven2-opcua.toml")).unwrap();
    assert!(oven.contains("mode = \"subscribe\""), "the demo oven subscribes");
    let dir = device_dir(&[("b-oven2-opcua.toml", &oven)]);
    let plant = plant_from(dir.path(), fieldgate_sim::Scenario::default()).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let polling = fieldgate::poller::start(&plant.service.core(), stop.clone());
    let latency = || {
        let p = plant.service.clone();
        async move {
            let args = json!({"device_id": "b-oven2-opcua"});
            let v = p.call("get_device_status", args).await.expect("served").json();
            v["devices"][0]["latency"].clone()
        }
    };
    let t = std::time::Duration::from_secs(30);
    wait_until("a latency", t, || async { latency().await.is_object() }).await;
    let l = latency().await;
    assert!(l["samples"].as_u64() >= Some(1) && l["p50_ms"].as_f64() > Some(0.0), "{l}");
    let text = plant.service.metrics().render();
    let reads = "fieldgate_device_read_seconds_count{device=\"b-oven2-opcua\"} ";
    assert!(text.lines().any(|l| l.starts_with(reads) && !l.ends_with(" 0")), "{text}");
    stop.cancel();
    for h in polling {
        h.await.unwrap();
    }
}
