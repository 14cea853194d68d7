use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::registry::AlarmPriority;

fn high(limit: f64, deadband: f64, on_s: u64, off_s: u64) -> AlarmDef {
    AlarmDef {
        name: "HI".into(),
        kind: AlarmKind::High,
        limit,
        deadband,
        on_delay: Duration::from_secs(on_s),
        off_delay: Duration::from_secs(off_s),
        normal: false,
        priority: AlarmPriority::High,
        message: "high".into(),
    }
}

/// Every transition of `samples` (one a second from t = 0 s, all good), as (t in s, active).
fn run(def: &AlarmDef, samples: &[f64]) -> Vec<(i64, bool)> {
    let mut s = LimitState::default();
    samples
        .iter()
        .enumerate()
        .filter_map(|(i, v)| s.on_sample(def, i as i64 * 1000, Value::Number(*v), true))
        .map(|t| match t {
            Transition::Activated { at_ms, .. } => (at_ms / 1000, true),
            Transition::Cleared { at_ms, .. } => (at_ms / 1000, false),
        })
        .collect()
}

/// The example: limit 100, deadband 2, on-delay 5 s, off-delay 3 s. A step to 101
/// at t=10 activates at t=15; back to 97.9 from t=40 clears at t=43.
#[test]
fn a_step_activates_after_the_on_delay_and_clears_after_the_off_delay() {
    let def = high(100.0, 2.0, 5, 3);
    let mut v = vec![90.0; 60];
    for x in v.iter_mut().take(40).skip(10) {
        *x = 101.0;
    }
    for x in v.iter_mut().skip(40) {
        *x = 97.9;
    }
    assert_eq!(run(&def, &v), [(15, true), (43, false)]);
    // Between the limit and the deadband it stays active: 99 is not below 98.
    let mut w = v.clone();
    for x in w.iter_mut().skip(40) {
        *x = 99.0;
    }
    assert_eq!(run(&def, &w), [(15, true)]);
}

#[test]
fn a_spike_shorter_than_the_on_delay_does_nothing() {
    let def = high(100.0, 2.0, 5, 3);
    let mut v = vec![90.0; 30];
    for x in v.iter_mut().skip(10).take(3) {
        *x = 120.0;
    }
    assert!(run(&def, &v).is_empty());
    // Exactly at the limit counts as beyond (>=): 5 s of 100.0 after the first sample;
    // back at 90 from t=16, it clears 3 s later.
    let mut at = vec![90.0; 30];
    for x in at.iter_mut().skip(10).take(6) {
        *x = 100.0;
    }
    assert_eq!(run(&def, &at), [(15, true), (19, false)]);
}

#[test]
fn a_square_wave_chatters_without_a_deadband_and_not_with_one() {
    let wave: Vec<f64> = (0..40).map(|i| if i % 2 == 0 { 100.5 } else { 99.5 }).collect();
    let chatter = run(&high(100.0, 0.0, 0, 0), &wave);
    assert_eq!(chatter.len(), 40, "every sample a transition");
    assert_eq!(run(&high(100.0, 2.0, 0, 0), &wave), [(0, true)], "the deadband holds it");
}

#[test]
fn low_alarms_mirror_high_ones() {
    let def = AlarmDef { kind: AlarmKind::LowLow, ..high(10.0, 1.0, 2, 0) };
    let v = [12.0, 10.0, 9.0, 8.0, 10.5, 11.2, 12.0];
    // <= 10 from t=1, for 2 s: t=3; above 11 (10 + 1) at t=5.
    assert_eq!(run(&def, &v), [(3, true), (5, false)]);
}

#[test]
fn off_normal_watches_a_boolean_against_its_normal_state() {
    let def = AlarmDef { kind: AlarmKind::OffNormal, normal: true, ..high(0.0, 0.0, 1, 0) };
    let mut s = LimitState::default();
    let seq = [true, false, false, false, true];
    let got: Vec<_> = seq
        .iter()
        .enumerate()
        .filter_map(|(i, b)| s.on_sample(&def, i as i64 * 1000, Value::Bool(*b), true))
        .collect();
    assert_eq!(
        got,
        [
            Transition::Activated { at_ms: 2000, value: Value::Bool(false) },
            Transition::Cleared { at_ms: 4000, value: Value::Bool(true) }
        ]
    );
    // A number is no boolean: held.
    assert_eq!(LimitState::default().on_sample(&def, 0, Value::Number(1.0), true), None);
}

#[test]
fn bad_quality_holds_the_state_and_forgets_the_delay() {
    let def = high(100.0, 2.0, 5, 0);
    let mut s = LimitState::default();
    assert_eq!(s.on_sample(&def, 0, Value::Number(101.0), true), None);
    // Bad at 3 s: what happened in between is unknown; the delay starts again at 4 s.
    assert_eq!(s.on_sample(&def, 3000, Value::Number(101.0), false), None);
    for t in [4, 5, 6, 7, 8] {
        assert_eq!(s.on_sample(&def, t * 1000, Value::Number(101.0), true), None, "t={t}");
    }
    let at9 = s.on_sample(&def, 9000, Value::Number(101.0), true);
    assert!(matches!(at9, Some(Transition::Activated { at_ms: 9000, .. })), "{at9:?}");
    // Active, then bad, NaN and text: held active.
    for (t, v) in [(10, Value::Number(50.0)), (11, Value::Number(f64::NAN)), (12, Value::Other)] {
        assert_eq!(s.on_sample(&def, t * 1000, v, t != 10), None);
        assert!(s.active);
    }
    // A sample not after the last one is ignored.
    assert_eq!(s.on_sample(&def, 12_000, Value::Number(0.0), true), None);
}

/// A subscription sends a change once: the held value's delay ends on the clock, stamped
/// when it ended; a change back before then forgets it.
#[test]
fn a_held_value_ends_its_delay_on_the_clock() {
    let def = high(100.0, 2.0, 5, 3);
    let mut s = LimitState::default();
    assert_eq!(s.on_time(&def, 50_000), None, "nothing pending");
    assert_eq!(s.on_sample(&def, 10_000, Value::Number(101.0), true), None);
    assert_eq!(s.on_time(&def, 14_999), None);
    assert_eq!(
        s.on_time(&def, 16_200),
        Some(Transition::Activated { at_ms: 15_000, value: Value::Number(101.0) })
    );
    assert_eq!(s.on_time(&def, 30_000), None, "once");
    assert_eq!(s.on_sample(&def, 40_000, Value::Number(97.9), true), None);
    assert_eq!(s.on_sample(&def, 41_000, Value::Number(99.0), true), None, "back inside the deadband");
    assert_eq!(s.on_time(&def, 60_000), None, "the delay was forgotten");
    assert_eq!(s.on_sample(&def, 61_000, Value::Number(97.0), true), None);
    assert_eq!(
        s.on_time(&def, 64_000),
        Some(Transition::Cleared { at_ms: 64_000, value: Value::Number(97.0) })
    );
    // A sample before the clock's transition time is not taken after it.
    assert_eq!(s.on_sample(&def, 63_500, Value::Number(101.0), true), None);
}

proptest! {
    /// Transitions alternate (activated, cleared, activated, ...), and an alarm activates no
    /// more often than the value crosses its limit upward.
    #[test]
    fn transitions_alternate_and_never_outnumber_the_crossings(
        values in prop::collection::vec(90.0f64..110.0, 1..400),
        deadband in 0.0f64..5.0,
        on in 0u64..4,
        off in 0u64..4,
    ) {
        let def = high(100.0, deadband, on, off);
        let got = run(&def, &values);
        for (k, (_, active)) in got.iter().enumerate() {
            prop_assert_eq!(*active, k % 2 == 0);
        }
        let crossings = values.windows(2).filter(|w| w[0] < 100.0 && w[1] >= 100.0).count()
            + usize::from(values[0] >= 100.0);
        let activations = got.iter().filter(|(_, a)| *a).count();
        prop_assert!(activations <= crossings, "{} activations, {} crossings", activations, crossings);
    }
}
