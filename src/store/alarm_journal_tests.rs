use super::*;

#[test]
fn an_activation_is_a_new_event_through_the_isa_18_2_states() {
    let j = AlarmJournal::in_memory().unwrap();
    let a = j.activate("B_OVEN2_001.HI", 1_000, Some(246.0)).unwrap().unwrap();
    assert_eq!((a.state, a.event_id, a.value), (AlarmState::ActiveUnacknowledged, 1, Some(246.0)));
    assert_eq!(
        j.activate("B_OVEN2_001.HI", 2_000, Some(250.0)).unwrap(),
        None,
        "active already: nothing twice"
    );
    let c = j.clear("B_OVEN2_001.HI", 3_000, Some(240.0)).unwrap().unwrap();
    assert_eq!(c.state, AlarmState::ReturnedUnacknowledged);
    // Acknowledging an event that is not the alarm's is refused.
    let wrong = j.acknowledge("B_OVEN2_001.HI", 7, 3_500, "op", None);
    assert!(matches!(wrong, Err(JournalError::NothingToAcknowledge { .. })), "{wrong:?}");
    let k = j.acknowledge("B_OVEN2_001.HI", 1, 4_000, "op", Some("seen")).unwrap();
    assert_eq!((k.state, k.acknowledged_by.as_deref()), (AlarmState::Normal, Some("op")));
    assert!(j.acknowledge("B_OVEN2_001.HI", 1, 4_500, "op", None).is_err(), "nothing left to acknowledge");
    // The next activation is the next event; acknowledged while active, it clears to normal.
    let b = j.activate("B_OVEN2_001.HI", 5_000, Some(247.0)).unwrap().unwrap();
    assert_eq!(b.event_id, 2);
    assert_eq!(
        j.acknowledge("B_OVEN2_001.HI", 2, 6_000, "op", None).unwrap().state,
        AlarmState::ActiveAcknowledged
    );
    assert_eq!(j.clear("B_OVEN2_001.HI", 7_000, None).unwrap().unwrap().state, AlarmState::Normal);
    let kinds: Vec<(u64, EventKind)> =
        j.events(0, i64::MAX).unwrap().iter().map(|e| (e.event_id, e.kind)).collect();
    use EventKind::*;
    assert_eq!(
        kinds,
        [(1, Activated), (1, Cleared), (1, Acknowledged), (2, Activated), (2, Acknowledged), (2, Cleared)]
    );
    assert_eq!(j.events(4_000, 6_000).unwrap().len(), 2);
}

#[test]
fn a_restart_finds_every_instance_and_event_id_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    {
        let j = AlarmJournal::open_in(dir.path()).unwrap();
        j.activate("A_LINE1_001.HI", 1_000, Some(101.0)).unwrap();
        j.activate("A_LINE1_002.LO", 1_500, Some(1.0)).unwrap();
        j.clear("A_LINE1_002.LO", 2_000, Some(3.0)).unwrap();
    }
    let j = AlarmJournal::open_in(dir.path()).unwrap();
    let states: Vec<(String, AlarmState, u64)> =
        j.instances().unwrap().into_iter().map(|i| (i.alarm_id, i.state, i.event_id)).collect();
    assert_eq!(
        states,
        [
            ("A_LINE1_001.HI".to_string(), AlarmState::ActiveUnacknowledged, 1),
            ("A_LINE1_002.LO".to_string(), AlarmState::ReturnedUnacknowledged, 2)
        ]
    );
    assert_eq!(j.activate("A_LINE1_001.HI", 3_000, Some(102.0)).unwrap(), None, "no second activation");
    assert_eq!(j.activate("A_LINE1_002.LO", 3_000, Some(0.5)).unwrap().unwrap().event_id, 3, "IDs go on");
}
