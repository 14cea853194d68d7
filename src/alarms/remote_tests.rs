use super::*;
use crate::config::AlarmsConfig;
use crate::registry::Registry;
use crate::store::alarm_journal::{AlarmJournal, EventKind};

fn remote(id: &str, state: AlarmState, by: Option<&str>) -> RemoteAlarm {
    RemoteAlarm {
        id: id.into(),
        state,
        time_ms: None,
        priority: AlarmPriority::Critical,
        kind: "high_high".into(),
        message: "Boiler hot".into(),
        device: "b-boiler-rtu".into(),
        sensor: Some("B_BOILER_001".into()),
        plant: "B".into(),
        zone: "BOILER".into(),
        limit: Some(90.0),
        unit: "degC".into(),
        acknowledged_by: by.map(str::to_string),
        activated_ms: None,
        shelved_until_ms: None,
        out_of_service: false,
    }
}

fn hub(journal: &Arc<AlarmJournal>) -> Alarms {
    Alarms::new(&Registry::from_texts(&[]).unwrap(), journal.clone(), &AlarmsConfig::default()).unwrap()
}

#[test]
fn an_edges_alarms_are_followed_journaled_and_a_birth_without_one_returns_it_to_normal() {
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = hub(&journal);
    let id = "B_BOILER_001.HIHI";
    a.on_remote("plant/gw1", true, vec![remote(id, AlarmState::Normal, None)]);
    let (e, i) = a.get(id).unwrap();
    assert_eq!((e.kind(), i.state, e.priority), ("high_high", AlarmState::Normal, AlarmPriority::Critical));
    let registry = Registry::from_texts(&[]).unwrap();
    assert_eq!(
        (e.sensor_id(&registry).as_deref(), e.device_id(&registry).as_str()),
        (Some("B_BOILER_001"), "b-boiler-rtu")
    );
    assert_eq!(e.plant_zone(&registry), Some(("B".to_string(), "BOILER".to_string())));
    a.on_remote("plant/gw1", false, vec![remote(id, AlarmState::ActiveUnacknowledged, None)]);
    a.on_remote("plant/gw1", false, vec![remote(id, AlarmState::ActiveAcknowledged, Some("shift-lead"))]);
    // Another edge node's alarm of the same ID is left out.
    a.on_remote("plant/gw2", true, vec![remote(id, AlarmState::Normal, None)]);
    assert_eq!(a.get(id).unwrap().1.state, AlarmState::ActiveAcknowledged);
    assert_eq!(a.counters.remote_left_out.load(Ordering::Relaxed), 1);
    // A birth of gw1 without it: back to normal.
    a.on_remote("plant/gw1", true, vec![]);
    let events = journal.events(0, i64::MAX, None, 10).unwrap();
    let got: Vec<(EventKind, Option<&str>, Option<&str>)> =
        events.iter().map(|e| (e.kind, e.by.as_deref(), e.comment.as_deref())).collect();
    assert_eq!(
        got,
        [
            (EventKind::Activated, None, None),
            (EventKind::Acknowledged, Some("shift-lead"), Some("acknowledged on the edge")),
            (EventKind::Cleared, None, Some("no longer published by the edge")),
        ]
    );
    assert_eq!(a.get(id).unwrap().1.state, AlarmState::Normal);

    // The hub restarted: the alarm comes back with its instance as journaled.
    a.on_remote("plant/gw1", false, vec![remote(id, AlarmState::ActiveUnacknowledged, None)]);
    let event = a.get(id).unwrap().1.event_id;
    let again = hub(&journal);
    assert!(again.get(id).is_none(), "not known before an edge publishes it");
    again.on_remote("plant/gw1", true, vec![remote(id, AlarmState::ActiveUnacknowledged, None)]);
    let i = again.get(id).unwrap().1;
    assert_eq!((i.state, i.event_id), (AlarmState::ActiveUnacknowledged, event), "no second activation");
}

/// A hub that starts after the edge, or misses a new event while away, still has each
/// event: activated when the edge says, and the state reached from there; the edge's
/// shelving and service are the hub's too.
#[test]
fn a_late_hub_takes_each_event_as_the_edge_says_and_its_shelving_and_service() {
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = hub(&journal);
    let now = chrono::Utc::now().timestamp_millis();
    let at = |id: &str, state, activated: i64, time: i64| RemoteAlarm {
        activated_ms: Some(activated),
        time_ms: Some(time),
        ..remote(id, state, None)
    };
    // Returned unacknowledged, and active acknowledged, before the hub ever saw them.
    a.on_remote(
        "plant/gw1",
        true,
        vec![
            at("B_BOILER_001.HI", AlarmState::ReturnedUnacknowledged, now - 60_000, now - 30_000),
            RemoteAlarm {
                acknowledged_by: Some("op".into()),
                ..at("B_BOILER_001.HIHI", AlarmState::ActiveAcknowledged, now - 50_000, now - 20_000)
            },
        ],
    );
    let (_, hi) = a.get("B_BOILER_001.HI").unwrap();
    assert_eq!((hi.state, hi.activated_ms), (AlarmState::ReturnedUnacknowledged, Some(now - 60_000)));
    let (_, hihi) = a.get("B_BOILER_001.HIHI").unwrap();
    assert_eq!(
        (hihi.state, hihi.activated_ms, hihi.acknowledged_ms, hihi.acknowledged_by.as_deref()),
        (AlarmState::ActiveAcknowledged, Some(now - 50_000), Some(now - 20_000), Some("op"))
    );
    // The HIHI cleared and activated again on the edge while the hub was away.
    a.on_remote(
        "plant/gw1",
        false,
        vec![at("B_BOILER_001.HIHI", AlarmState::ActiveUnacknowledged, now - 10_000, now - 10_000)],
    );
    let (_, again) = a.get("B_BOILER_001.HIHI").unwrap();
    assert_eq!((again.state, again.activated_ms), (AlarmState::ActiveUnacknowledged, Some(now - 10_000)));
    assert!(again.event_id > hihi.event_id, "a new event");
    // Shelved, then out of service, on the edge.
    let mut shelved = at("B_BOILER_001.HIHI", AlarmState::ActiveUnacknowledged, now - 10_000, now - 10_000);
    shelved.shelved_until_ms = Some(now + 3_600_000);
    a.on_remote("plant/gw1", false, vec![shelved.clone()]);
    assert_eq!(a.get("B_BOILER_001.HIHI").unwrap().1.shelved_until_ms, Some(now + 3_600_000));
    let shelving = journal.events(0, i64::MAX, None, 100).unwrap().pop().unwrap();
    assert!(
        shelving.kind == EventKind::Shelved && shelving.at_ms >= now,
        "stamped when the hub learned it, not with the state's older time: {shelving:?}"
    );
    let out =
        RemoteAlarm { out_of_service: true, state: AlarmState::Normal, shelved_until_ms: None, ..shelved };
    a.on_remote("plant/gw1", false, vec![out.clone()]);
    let i = a.get("B_BOILER_001.HIHI").unwrap().1;
    assert!(i.out_of_service && i.state == AlarmState::Normal, "{i:?}");
    let acks = journal.events(0, i64::MAX, None, 100).unwrap();
    assert!(
        !acks.iter().any(|e| e.kind == EventKind::Acknowledged && e.at_ms > now - 10_000),
        "out of service is no acknowledgement: {acks:?}"
    );
    a.on_remote("plant/gw1", false, vec![RemoteAlarm { out_of_service: false, ..out }]);
    assert!(!a.get("B_BOILER_001.HIHI").unwrap().1.out_of_service);
}

#[test]
fn one_edge_node_cannot_fill_the_table_with_births_of_new_alarms() {
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = hub(&journal);
    let birth = |from: usize, n: usize| -> Vec<RemoteAlarm> {
        (from..from + n).map(|k| remote(&format!("X_FLOOD_001.A{k}"), AlarmState::Normal, None)).collect()
    };
    a.on_remote("X/fake", true, birth(0, MAX_PER_EDGE - 5));
    // A second birth of other IDs: those of the first stay (as normal), so only 5 more fit.
    a.on_remote("X/fake", true, birth(MAX_PER_EDGE, 10));
    assert_eq!(a.count(), MAX_PER_EDGE);
    assert_eq!(a.counters.remote_left_out.load(Ordering::Relaxed), 5);
    // A real edge's alarm is still followed.
    a.on_remote("B/gw-b", true, vec![remote("B_BOILER_001.HIHI", AlarmState::ActiveUnacknowledged, None)]);
    assert_eq!(a.get("B_BOILER_001.HIHI").unwrap().1.state, AlarmState::ActiveUnacknowledged);
}

#[test]
fn a_shelving_said_longer_than_an_edge_allows_is_seven_days() {
    let journal = Arc::new(AlarmJournal::in_memory().unwrap());
    let a = hub(&journal);
    let id = "B_BOILER_001.HIHI";
    let mut far = remote(id, AlarmState::ActiveUnacknowledged, None);
    far.shelved_until_ms = Some(99_999_999_999_999);
    a.on_remote("B/gw-b", true, vec![far.clone()]);
    a.on_remote("B/gw-b", false, vec![far]);
    let until = a.get(id).unwrap().1.shelved_until_ms.unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    assert!(until <= now + MAX_SHELVE_MS && until > now + MAX_SHELVE_MS - 60_000, "{until}");
    let shelved = journal
        .events(0, i64::MAX, None, 10)
        .unwrap()
        .iter()
        .filter(|e| e.kind == EventKind::Shelved)
        .count();
    assert_eq!(shelved, 1, "kept, not shelved again by every message");
}
