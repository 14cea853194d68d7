use super::*;
use crate::config::AlarmsConfig;
use crate::store::alarm_journal::{AlarmJournal, EventKind};

const DEVICE: &str = r#"
id = "t-ua"
plant = "T"
zone = "UA"
description = "an OPC UA server with conditions"
protocol = "opcua"
endpoint = "opc.tcp://127.0.0.1:4840"

[opcua]
alarms = true

[[sensors]]
id = "T_UA_001"
description = "a temperature"
kind = "temperature"
unit = "degC"
node_id = "ns=1;s=Temp"
"#;

fn registry() -> Registry {
    Registry::from_texts(&[("t.toml".to_string(), DEVICE.to_string())]).unwrap()
}

fn condition(node: &str, source: &str, name: &str, active: bool, acked: bool, n: u8) -> ServerEvent {
    ServerEvent::Condition(ConditionEvent {
        node: node.into(),
        event_id: vec![n],
        source: Some(source.into()),
        time_ms: Some(1_700_000_000_000 + i64::from(n)),
        name: name.into(),
        message: format!("{name} is {active}"),
        severity: 700,
        active,
        acked,
        retain: true,
    })
}

fn alarms(journal: &Arc<AlarmJournal>) -> Arc<Alarms> {
    Arc::new(Alarms::new(&registry(), journal.clone(), &AlarmsConfig::default()).unwrap())
}

/// Applies `events` and writes their transitions, as the engine does.
fn apply(a: &Alarms, events: Vec<ServerEvent>) {
    let acts = a.on_server_events(&registry(), events.into_iter().map(|e| (0, e)).collect());
    let mut acts: std::collections::VecDeque<Pending> = acts.into();
    a.commit(&mut acts);
    assert!(acts.is_empty());
}

#[test]
fn severities_names_and_ids_of_conditions() {
    assert_eq!(
        [1, 250, 251, 500, 501, 750, 751, 1000].map(priority_of),
        [
            AlarmPriority::Low,
            AlarmPriority::Low,
            AlarmPriority::Medium,
            AlarmPriority::Medium,
            AlarmPriority::High,
            AlarmPriority::High,
            AlarmPriority::Critical,
            AlarmPriority::Critical
        ]
    );
    assert_eq!(name_of("Temp.Alarm"), "TEMP_ALARM");
    assert_eq!(name_of("a very long condition name"), "A_VERY_LONG_COND");
    assert_eq!(name_of("..."), "CONDITION");
    assert_eq!(name_of("Überhitzung"), "_BERHITZUNG");

    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = alarms(&journal);
    apply(
        &a,
        vec![
            // On the sensor's node: the sensor's ID; elsewhere: the device's; a second
            // condition of the same name gets a suffix.
            condition("ns=1;s=T1", "ns=1;s=Temp", "Hot", false, true, 1),
            condition("ns=1;s=T2", "ns=1;s=Other", "Hot", false, true, 2),
            condition("ns=1;s=T3", "ns=1;s=Other", "Hot", false, true, 3),
        ],
    );
    assert_eq!(a.ids(), ["t-ua.COMM", "T_UA_001.HOT", "t-ua.HOT", "t-ua.HOT_2"]);
    let (e, _) = a.get("T_UA_001.HOT").unwrap();
    assert_eq!((e.sensor(), e.kind(), e.priority), (Some(0), "condition", AlarmPriority::High));
}

#[test]
fn a_conditions_events_are_journaled_and_a_refresh_without_it_returns_it_to_normal() {
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = alarms(&journal);
    let temp = |active, acked, n| condition("ns=1;s=T1", "ns=1;s=Temp", "Hot", active, acked, n);
    apply(&a, vec![ServerEvent::RefreshStart, temp(true, false, 1), ServerEvent::RefreshEnd]);
    let (_, i) = a.get("T_UA_001.HOT").unwrap();
    assert_eq!(i.state, AlarmState::ActiveUnacknowledged);
    assert_eq!(a.counters.transitions.load(Ordering::Relaxed), 1, "a server's transitions are counted too");
    // The same state again (a second refresh) changes nothing; acknowledged on the server
    // and back inside in one batch: both written, in order.
    apply(&a, vec![temp(true, false, 1), temp(true, true, 2), temp(false, true, 3)]);
    let kinds: Vec<(EventKind, Option<String>)> =
        journal.events(0, i64::MAX, None, 10).unwrap().into_iter().map(|e| (e.kind, e.comment)).collect();
    assert_eq!(
        kinds,
        [
            (EventKind::Activated, None),
            (EventKind::Acknowledged, Some("acknowledged on the server".into())),
            (EventKind::Cleared, None),
        ]
    );
    // Active again, then a refresh that does not re-send it: no longer held by the server.
    apply(&a, vec![temp(true, false, 4)]);
    apply(&a, vec![ServerEvent::RefreshStart, ServerEvent::RefreshEnd]);
    let (_, i) = a.get("T_UA_001.HOT").unwrap();
    assert_eq!(i.state, AlarmState::Normal);
    let last = journal.events(0, i64::MAX, None, 10).unwrap().pop().unwrap();
    assert_eq!(
        (last.kind, last.comment.as_deref()),
        (EventKind::Acknowledged, Some("no longer held by the server"))
    );
    // A RefreshEnd without its start (another session's) clears nothing.
    apply(&a, vec![temp(true, false, 5)]);
    apply(&a, vec![ServerEvent::RefreshEnd]);
    assert_eq!(a.get("T_UA_001.HOT").unwrap().1.state, AlarmState::ActiveUnacknowledged);

    // A restart lists it before the server speaks, with its message and priority.
    let again = alarms(&journal);
    let (e, i) = again.get("T_UA_001.HOT").unwrap();
    assert_eq!(
        (i.state, e.message.as_str(), e.priority),
        (AlarmState::ActiveUnacknowledged, "Hot is true", AlarmPriority::High)
    );
}

#[tokio::test]
async fn an_operators_acknowledgement_goes_to_the_server_and_is_journaled_only_when_taken() {
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = alarms(&journal);
    apply(&a, vec![condition("ns=1;s=T1", "ns=1;s=Temp", "Hot", true, false, 7)]);
    // No subscription attached: the server cannot be reached.
    let e = a.acknowledge_on_server("T_UA_001.HOT", None, "op", Some("seen")).await.unwrap_err();
    assert!(matches!(e, ServerAckError::Server(AckFailed::Unavailable)), "{e:?}");
    let mut commands = a.attach_server(0);
    let server = tokio::spawn(async move {
        let Some(Command::Acknowledge { node, event_id, comment, reply }) = commands.recv().await else {
            panic!("a command")
        };
        assert_eq!((node.as_str(), event_id, comment.as_str()), ("ns=1;s=T1", vec![7], "seen"));
        reply.send(Err(AckFailed::Stale)).unwrap();
        let Some(Command::Acknowledge { reply, .. }) = commands.recv().await else { panic!("a second") };
        reply.send(Ok(())).unwrap();
    });
    let e = a.acknowledge_on_server("T_UA_001.HOT", None, "op", Some("seen")).await.unwrap_err();
    assert!(matches!(e, ServerAckError::Server(AckFailed::Stale)), "{e:?}");
    assert_eq!(a.get("T_UA_001.HOT").unwrap().1.state, AlarmState::ActiveUnacknowledged, "not journaled");
    let i = a.acknowledge_on_server("T_UA_001.HOT", None, "op", Some("seen")).await.unwrap();
    assert_eq!((i.state, i.acknowledged_by.as_deref()), (AlarmState::ActiveAcknowledged, Some("op")));
    server.await.unwrap();
    // Nothing left to acknowledge: refused here, nothing sent.
    let e = a.acknowledge_on_server("T_UA_001.HOT", None, "op", None).await.unwrap_err();
    assert!(matches!(e, ServerAckError::Act(ActError::Journal(JournalError::Refused { .. }))), "{e:?}");
}
