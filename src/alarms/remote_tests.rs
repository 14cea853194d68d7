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
