use super::*;

const HI: &str = "B_OVEN2_001.HI";

fn activate(j: &AlarmJournal, id: &str, at: i64, v: f64) -> Option<Instance> {
    j.act(id, &Act::Activate { value: Some(v), priority: AlarmPriority::High }, at, None, None).unwrap()
}

fn clear(j: &AlarmJournal, id: &str, at: i64) -> Option<Instance> {
    j.act(id, &Act::Clear { value: None }, at, None, None).unwrap()
}

fn ack(j: &AlarmJournal, event: Option<u64>, at: i64) -> Result<Option<Instance>, JournalError> {
    j.act(HI, &Act::Acknowledge { event_id: event }, at, Some("op"), Some("seen"))
}

fn refusal(r: Result<Option<Instance>, JournalError>) -> Refusal {
    match r {
        Err(JournalError::Refused { refusal, .. }) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_activation_is_a_new_event_through_the_isa_18_2_states() {
    let j = AlarmJournal::in_memory().unwrap();
    let a = activate(&j, HI, 1_000, 246.0).unwrap();
    assert_eq!((a.state, a.event_id, a.value), (AlarmState::ActiveUnacknowledged, 1, Some(246.0)));
    assert_eq!(activate(&j, HI, 2_000, 250.0), None, "active already: nothing twice");
    assert_eq!(clear(&j, HI, 3_000).unwrap().state, AlarmState::ReturnedUnacknowledged);
    assert_eq!(
        refusal(ack(&j, Some(7), 3_500)),
        Refusal::OtherEvent { current: 1 },
        "a stale acknowledgement"
    );
    let k = ack(&j, Some(1), 4_000).unwrap().unwrap();
    assert_eq!(
        (k.state, k.acknowledged_by.as_deref(), k.acknowledged_ms),
        (AlarmState::Normal, Some("op"), Some(4_000))
    );
    assert_eq!(refusal(ack(&j, Some(1), 4_500)), Refusal::NothingToAcknowledge);
    // The next activation is the next event; acknowledged while active, it clears to normal.
    assert_eq!(activate(&j, HI, 5_000, 247.0).unwrap().event_id, 2);
    assert_eq!(ack(&j, None, 6_000).unwrap().unwrap().state, AlarmState::ActiveAcknowledged);
    assert_eq!(clear(&j, HI, 7_000).unwrap().state, AlarmState::Normal);
    let kinds: Vec<(u64, EventKind)> =
        j.events(0, i64::MAX, None, 100).unwrap().iter().map(|e| (e.event_id, e.kind)).collect();
    use EventKind::*;
    assert_eq!(
        kinds,
        [(1, Activated), (1, Cleared), (1, Acknowledged), (2, Activated), (2, Acknowledged), (2, Cleared)]
    );
    assert_eq!(j.events(4_000, 6_000, None, 100).unwrap().len(), 2);
}

#[test]
fn events_come_by_time_in_pages() {
    let j = AlarmJournal::in_memory().unwrap();
    for i in 0..5 {
        activate(&j, HI, 1_000 * i + 100, 1.0);
        clear(&j, HI, 1_000 * i + 600);
    }
    let first = j.events(0, 10_000, None, 4).unwrap();
    assert_eq!(first.len(), 4);
    let last = first.last().unwrap();
    let rest = j.events(0, 10_000, Some((last.at_ms, last.seq)), 100).unwrap();
    assert_eq!(rest.len(), 6);
    let times: Vec<i64> = first.iter().chain(&rest).map(|e| e.at_ms).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    assert_eq!(j.events(3_000, 3_000, None, 100).unwrap(), vec![], "an empty range");
    assert_eq!(j.events(2_100, 2_600, None, 100).unwrap().len(), 1, "to is exclusive: {times:?}");
}

/// A journal emptied (a 0-byte file, as one helper's walk made it) would give event IDs
/// again: the marker beside it refuses it.
#[test]
fn an_emptied_journal_is_refused_not_started_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let j = AlarmJournal::open_in(dir.path()).unwrap();
        activate(&j, HI, 1_000, 1.0);
        activate(&j, "A_B_001.HI", 2_000, 1.0);
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("alarms.last_event")).unwrap(), "2");
    // A damaged journal: the hint names both files (moving the journal alone would not start).
    std::fs::write(dir.path().join("alarms.redb"), vec![0x5a; 64 * 1024]).unwrap();
    let damaged = AlarmJournal::open_in(dir.path()).err().expect("refused");
    assert!(
        damaged.to_string().contains("is damaged") && damaged.to_string().contains("alarms.last_event aside"),
        "{damaged}"
    );
    std::fs::write(dir.path().join("alarms.redb"), b"").unwrap();
    let refused = AlarmJournal::open_in(dir.path()).err().expect("refused");
    assert!(refused.to_string().contains("alarms.last_event says 2 was given"), "{refused}");
    // Both moved aside: a new journal.
    std::fs::remove_file(dir.path().join("alarms.redb")).unwrap();
    std::fs::remove_file(dir.path().join("alarms.last_event")).unwrap();
    assert!(AlarmJournal::open_in(dir.path()).is_ok());
}

#[test]
fn pruning_removes_old_transitions_and_keeps_every_instance() {
    let j = AlarmJournal::in_memory().unwrap();
    activate(&j, HI, 1_000, 1.0);
    clear(&j, HI, 2_000);
    activate(&j, HI, 3_000, 1.0);
    j.prune_before(2_500).unwrap();
    let left: Vec<i64> = j.events(0, i64::MAX, None, 10).unwrap().iter().map(|e| e.at_ms).collect();
    assert_eq!(left, [3_000]);
    let i = j.instances().unwrap();
    assert_eq!((i.len(), i[0].state, i[0].event_id), (1, AlarmState::ActiveUnacknowledged, 2));
    assert_eq!(activate(&j, "A_B_001.HI", 4_000, 1.0).unwrap().event_id, 3, "event IDs go on");
}

#[test]
fn shelving_and_out_of_service_are_operator_acts_beside_the_state() {
    let j = AlarmJournal::in_memory().unwrap();
    let op = Some("op");
    assert_eq!(refusal(j.act(HI, &Act::Unshelve, 500, op, None)), Refusal::NotShelved);
    let s = j.act(HI, &Act::Shelve { until_ms: 60_000 }, 1_000, op, Some("sensor being replaced")).unwrap();
    assert_eq!(s.unwrap().shelved_until_ms, Some(60_000));
    // A shelved alarm still activates (journaled, marked shelved).
    activate(&j, HI, 2_000, 300.0);
    let events = j.events(0, 10_000, None, 10).unwrap();
    assert!(events[1].shelved && events[0].until_ms == Some(60_000), "{events:?}");
    let u = j.act(HI, &Act::Unshelve, 3_000, None, Some("shelving time ended")).unwrap().unwrap();
    assert_eq!((u.shelved_until_ms, u.state), (None, AlarmState::ActiveUnacknowledged));
    // Out of service ends the event standing; the engine's transitions change nothing then.
    let o = j.act(HI, &Act::OutOfService, 4_000, op, None).unwrap().unwrap();
    assert_eq!((o.state, o.out_of_service), (AlarmState::Normal, true));
    assert_eq!(activate(&j, HI, 5_000, 300.0), None);
    assert_eq!(refusal(j.act(HI, &Act::Shelve { until_ms: 9_000 }, 5_500, op, None)), Refusal::OutOfService);
    assert_eq!(refusal(j.act(HI, &Act::OutOfService, 5_600, op, None)), Refusal::OutOfService);
    assert!(j.act(HI, &Act::InService, 6_000, op, None).unwrap().is_some());
    assert_eq!(refusal(j.act(HI, &Act::InService, 6_100, op, None)), Refusal::InService);
    assert_eq!(activate(&j, HI, 7_000, 300.0).unwrap().event_id, 2, "a new event after service");
}

#[test]
fn a_restart_finds_every_instance_and_event_id_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    {
        let j = AlarmJournal::open_in(dir.path()).unwrap();
        activate(&j, "A_LINE1_001.HI", 1_000, 101.0);
        activate(&j, "A_LINE1_002.LO", 1_500, 1.0);
        clear(&j, "A_LINE1_002.LO", 2_000);
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
    assert_eq!(activate(&j, "A_LINE1_001.HI", 3_000, 102.0), None, "no second activation");
    assert_eq!(activate(&j, "A_LINE1_002.LO", 3_000, 0.5).unwrap().event_id, 3, "IDs go on");
}

#[test]
fn acts_in_one_transaction_see_each_other_and_a_refusal_leaves_the_rest_done() {
    let dir = tempfile::tempdir().unwrap();
    let j = AlarmJournal::open_in(dir.path()).unwrap();
    let on = Act::Activate { value: Some(1.0), priority: AlarmPriority::High };
    let (off, ack) = (Act::Clear { value: None }, Act::Acknowledge { event_id: None });
    let req = |alarm_id, act, at_ms| ActRequest { alarm_id, act, at_ms, by: Some("op"), comment: None };
    let done = j
        .act_all(&[
            req("A_LINE1_001.HI", &on, 1_000),
            req("A_LINE1_001.HI", &off, 2_000),
            req("A_LINE1_002.HI", &ack, 2_500),
            req("A_LINE1_001.HI", &on, 3_000),
            req("A_LINE1_001.HI", &on, 3_500),
        ])
        .unwrap();
    let states: Vec<_> = done.iter().map(|d| d.clone().map(|i| i.map(|i| (i.state, i.event_id)))).collect();
    assert_eq!(
        states,
        [
            Ok(Some((AlarmState::ActiveUnacknowledged, 1))),
            Ok(Some((AlarmState::ReturnedUnacknowledged, 1))),
            Err(Refusal::NothingToAcknowledge),
            Ok(Some((AlarmState::ActiveUnacknowledged, 2))),
            Ok(None),
        ]
    );
    assert_eq!(j.events(0, i64::MAX, None, 100).unwrap().len(), 3);
    assert_eq!(std::fs::read_to_string(dir.path().join("alarms.last_event")).unwrap(), "2");
    drop(j);
    let j = AlarmJournal::open_in(dir.path()).unwrap();
    assert_eq!(activate(&j, "A_LINE1_002.HI", 4_000, 1.0).unwrap().event_id, 3, "IDs go on");
}
