//! Alarm states as node metrics (`Alarms/<ALARM_ID>`, docs/sparkplug.md "Alarms"), from a
//! real `fieldgate serve` through Mosquitto, read by Eclipse Tahu's decoder: every alarm in
//! the NBIRTH, and an NDATA by alias when one activates and when an operator acknowledges.

use std::time::Duration;

use fieldgate::spb::payload::{Metric, PropertyValueKind, Value};
use fieldgate_sim::Wave;

use super::broker::{Broker, Host, Msg};
use super::edge::{demo_sim, node_env};
use crate::support;

const T: Duration = Duration::from_secs(30);
const HIHI: &str = "Alarms/B_BOILER_001.HIHI";

fn prop<'a>(m: &'a Metric, key: &str) -> Option<&'a PropertyValueKind> {
    m.properties.as_ref()?.get(key)?.value.as_ref()
}

fn state(m: &Metric) -> Option<&str> {
    match &m.value {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

/// The NDATA metric of alias `alias` in `m`, if it carries it in `state`.
fn ndata_of(m: &Msg, alias: u64, want: &str) -> Option<Metric> {
    if m.kind() != "NDATA" {
        return None;
    }
    m.payload.metrics.iter().find(|x| x.alias == Some(alias) && state(x) == Some(want)).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarm_states_are_node_metrics_born_and_sent_when_they_change() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let sim = demo_sim().await;
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 80.0 });
    let devices = support::demo_devices_for(&sim);
    let data = tempfile::tempdir().unwrap();
    let brokers = format!("[\"{}\"]", broker.url());
    let mut env = node_env(&brokers);
    env.push(("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:operator-token-0123456789"));
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = served.drain_stderr();

    let birth = host.until("NBIRTH", T, |m| m.kind() == "NBIRTH").await;
    let alarms: Vec<&Metric> = birth
        .payload
        .metrics
        .iter()
        .filter(|m| m.name.as_deref().is_some_and(|n| n.starts_with("Alarms/")))
        .collect();
    assert_eq!(alarms.len(), 9, "six limit alarms and three communication alarms: {alarms:?}");
    let hihi = *alarms.iter().find(|m| m.name.as_deref() == Some(HIHI)).expect("the boiler's HIHI is born");
    assert_eq!(
        (state(hihi), hihi.datatype),
        (Some("normal"), Some(fieldgate::spb::payload::datatype::STRING))
    );
    assert_eq!(prop(hihi, "priority"), Some(&PropertyValueKind::String("critical".into())));
    assert_eq!(prop(hihi, "type"), Some(&PropertyValueKind::String("high_high".into())));
    assert_eq!(prop(hihi, "sensor"), Some(&PropertyValueKind::String("B_BOILER_001".into())));
    assert_eq!(prop(hihi, "device"), Some(&PropertyValueKind::String("b-boiler-rtu".into())));
    let comm = alarms.iter().find(|m| m.name.as_deref() == Some("Alarms/a-line1-plc.COMM")).expect("comm");
    assert_eq!(prop(comm, "sensor"), None, "a device's own alarm has no sensor");
    let alias = hihi.alias.expect("an alias");
    assert!(alarms.iter().filter(|m| m.alias == Some(alias)).count() == 1, "aliases are unique");

    // Past the limit: an NDATA with the alias alone, active, with its event.
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 91.0 });
    let active =
        host.until("HIHI active", T, |m| ndata_of(m, alias, "active_unacknowledged").is_some()).await;
    let m = ndata_of(&active, alias, "active_unacknowledged").unwrap();
    assert_eq!(m.name, None, "data carries the alias alone");
    let Some(PropertyValueKind::Long(event)) = prop(&m, "eventId").cloned() else { panic!("eventId: {m:?}") };
    assert!(event > 0);
    assert!(matches!(prop(&m, "activatedAt"), Some(PropertyValueKind::Long(t)) if *t > 1_700_000_000_000));

    // An operator's acknowledgement is on the wire too, with who.
    fieldgate::tls::install_crypto_provider();
    let res = reqwest::Client::new()
        .post(format!("http://{}/v1/alarms/B_BOILER_001.HIHI/acknowledge", served.addr))
        .bearer_auth("operator-token-0123456789")
        .header("content-type", "application/json")
        .body(r#"{"comment": "on it"}"#)
        .timeout(T)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let acked =
        host.until("HIHI acknowledged", T, |m| ndata_of(m, alias, "active_acknowledged").is_some()).await;
    let m = ndata_of(&acked, alias, "active_acknowledged").unwrap();
    assert_eq!(prop(&m, "acknowledgedBy"), Some(&PropertyValueKind::String("shift-lead".into())));
    assert_eq!(prop(&m, "eventId"), Some(&PropertyValueKind::Long(event)), "the same event");

    // Sparkplug's NDATA statements, on what crossed the broker: QoS 0, a timestamp, and the
    // node's one `seq` going on by one from the NBIRTH's 0 through every message after it.
    host.take();
    let mut seq = None;
    let mut ndata = 0;
    for m in host.seen.iter().filter(|m| ["NBIRTH", "NDATA", "DBIRTH", "DDATA", "DDEATH"].contains(&m.kind()))
    {
        let got = m.payload.seq.expect("every message but NDEATH has a seq");
        match (m.kind(), seq) {
            ("NBIRTH", _) => assert_eq!(got, 0, "an NBIRTH's seq"),
            (kind, Some(before)) => assert_eq!(got, (before + 1) % 256, "{kind} after seq {before}"),
            (_, None) => continue,
        }
        seq = Some(got);
        if m.kind() == "NDATA" {
            ndata += 1;
            assert_eq!(m.qos, 0, "NDATA is QoS 0");
            assert!(m.payload.timestamp.is_some_and(|t| t > 1_700_000_000_000), "NDATA's timestamp");
        }
    }
    assert!(ndata >= 2, "the activation's and the acknowledgement's NDATA were checked");
    served.child.start_kill().unwrap();
    let _ = support::exited(&mut served.child, "served").await;
}
