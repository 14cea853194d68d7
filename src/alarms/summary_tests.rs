use super::*;
use crate::registry::AlarmPriority::{self, *};

const T0: i64 = 1_764_482_400_000; // 2025-11-30T06:00:00Z, on a 10-minute boundary
const MIN: i64 = 60_000;

fn event(seq: u64, id: &str, kind: EventKind, at: i64) -> Event {
    Event {
        seq,
        alarm_id: id.to_string(),
        event_id: seq,
        kind,
        at_ms: at,
        value: None,
        by: None,
        comment: None,
        priority: None,
        activated_ms: None,
        until_ms: None,
        shelved: false,
    }
}

/// An eight-hour shift's journal, written by hand; the figures below are counted by hand.
fn shift() -> Vec<Event> {
    let mut out = Vec::new();
    let mut act = |id: &str, at: i64, p: AlarmPriority| {
        let mut e = event(out.len() as u64 + 1, id, EventKind::Activated, at);
        e.priority = Some(p);
        e.activated_ms = Some(at);
        out.push(e);
    };
    act("X_L1_001.HI", T0 + 5 * MIN, High);
    act("X_L1_001.HI", T0 + 65 * MIN, High);
    // Chatters: three within 40 s, a fourth five minutes on.
    for s in [0, 20, 40, 300] {
        act("X_L1_002.LO", T0 + 120 * MIN + s * 1000, Low);
    }
    // A flood: 11 in 4:00-4:10; then exactly 10 in 4:10-4:20, which is none.
    for n in 10..21 {
        act(&format!("X_L2_{n:03}.HI"), T0 + 240 * MIN + n * 1000, Critical);
    }
    for n in 21..31 {
        act(&format!("X_L2_{n:03}.HI"), T0 + 250 * MIN + n * 1000, Medium);
    }
    let mut shelved = event(0, "X_L4_001.HI", EventKind::Activated, T0 + 180 * MIN);
    shelved.shelved = true;
    shelved.priority = Some(High);
    out.push(shelved);
    let mut ack = |id: &str, at: i64, activated: i64, by: Option<&str>| {
        let mut e = event(0, id, EventKind::Acknowledged, at);
        e.activated_ms = Some(activated);
        e.by = by.map(str::to_string);
        out.push(e);
    };
    let op = Some("op");
    ack("X_L1_001.HI", T0 + 7 * MIN, T0 + 5 * MIN, op);
    ack("X_L1_001.HI", T0 + 75 * MIN, T0 + 65 * MIN, op);
    // Activated before the shift, acknowledged in it.
    ack("X_L0_001.HI", T0 + MIN, T0 - MIN, op);
    // A server's own acknowledgement (no one named) is no one's time to acknowledge.
    ack("X_L1_001.HI", T0 + 66 * MIN, T0 + 65 * MIN, None);
    out.sort_by_key(|e| e.at_ms);
    out
}

#[test]
fn a_golden_eight_hour_journal_gives_the_figures_counted_by_hand() {
    let to = T0 + 8 * 60 * MIN;
    let standing =
        [("X_L3_001.HI".to_string(), to - 25 * 60 * MIN), ("X_L3_002.HI".to_string(), to - 23 * 60 * MIN)];
    let s = summarize(&shift(), &standing, T0, to, Options::default());
    assert_eq!((s.activations, s.shelved_activations), (27, 1));
    assert_eq!(s.by_priority, ByPriority { low: 4, medium: 10, high: 2, critical: 11 });
    assert_eq!(s.per_10_min.mean, 27.0 / 48.0);
    assert_eq!((s.per_10_min.peak, s.per_10_min.peak_at.as_deref()), (11, Some("2025-11-30T10:00:00.000Z")));
    assert_eq!(
        s.floods.periods,
        [Flood {
            from: "2025-11-30T10:00:00.000Z".into(),
            to: "2025-11-30T10:10:00.000Z".into(),
            activations: 11
        }],
        "11 in ten minutes is a flood, 10 is not"
    );
    assert_eq!(s.floods.percent_of_time, 100.0 * 10.0 / 480.0);
    assert_eq!(
        s.chattering,
        [AlarmCount { alarm_id: "X_L1_002.LO".into(), activations: 4, most_in_window: 3 }]
    );
    let top: Vec<(&str, u64)> = s.top_alarms.iter().map(|c| (c.alarm_id.as_str(), c.activations)).collect();
    assert_eq!(top[..3], [("X_L1_002.LO", 4), ("X_L1_001.HI", 2), ("X_L2_010.HI", 1)]);
    assert_eq!(top.len(), 10);
    assert_eq!(s.top10_share_percent, Some(100.0 * 14.0 / 27.0));
    assert_eq!(
        s.stale,
        [Stale {
            alarm_id: "X_L3_001.HI".into(),
            activated_at: "2025-11-29T13:00:00.000Z".into(),
            active_for_s: 90_000
        }]
    );
    assert_eq!(
        s.time_to_acknowledge,
        TimeToAcknowledge { acknowledged: 3, mean_s: Some(280.0), p90_s: Some(600.0) }
    );
}

#[test]
fn three_activations_chatter_only_within_the_window() {
    let at = |secs: &[i64]| -> Vec<Event> {
        secs.iter()
            .enumerate()
            .map(|(n, s)| event(n as u64, "A_B_001.HI", EventKind::Activated, T0 + s * 1000))
            .collect()
    };
    let o = Options::default();
    assert_eq!(summarize(&at(&[0, 30, 59]), &[], T0, T0 + 10 * MIN, o).chattering.len(), 1);
    assert_eq!(
        summarize(&at(&[0, 30, 60]), &[], T0, T0 + 10 * MIN, o).chattering.len(),
        0,
        "the third at 60 s"
    );
    let flood =
        |n: i64| summarize(&at(&(0..n).collect::<Vec<_>>()), &[], T0, T0 + 10 * MIN, o).floods.periods.len();
    assert_eq!((flood(10), flood(11)), (0, 1));
    let none = summarize(&[], &[], T0, T0 + 10 * MIN, o);
    assert_eq!(
        (none.top10_share_percent, none.per_10_min.peak_at, none.time_to_acknowledge.mean_s),
        (None, None, None)
    );
}

#[test]
fn what_stood_at_the_end_comes_from_the_events_after_it() {
    let instance = |id: &str, state, activated: Option<i64>| Instance {
        state,
        activated_ms: activated,
        ..Instance::normal(id)
    };
    use crate::store::alarm_journal::AlarmState::*;
    let to = T0;
    let instances = [
        instance("A_B_001.HI", ActiveUnacknowledged, Some(T0 - MIN)), // active then and now
        instance("A_B_002.HI", Normal, Some(T0 - 2 * MIN)),           // cleared after `to`
        instance("A_B_003.HI", ActiveAcknowledged, Some(T0 + MIN)),   // activated after `to`
        instance("A_B_004.HI", Normal, None),
    ];
    let mut cleared = event(1, "A_B_002.HI", EventKind::Cleared, T0 + 5 * MIN);
    cleared.activated_ms = Some(T0 - 2 * MIN);
    let later = [event(0, "A_B_003.HI", EventKind::Activated, T0 + MIN), cleared];
    assert_eq!(
        standing_at(to, &instances, &later),
        [("A_B_001.HI".to_string(), T0 - MIN), ("A_B_002.HI".to_string(), T0 - 2 * MIN)]
    );
}
