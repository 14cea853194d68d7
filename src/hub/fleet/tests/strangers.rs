//! Edge nodes heard from, never born.

use super::*;

/// Regression (the adversarial walk): tens of thousands of made-up edge nodes sending
/// data (or commands) do not grow the fleet: at most `MAX_STRANGERS` are kept, each
/// forgotten after `FORGET` of silence, the rest counted; a command is nobody's message;
/// a stranger that is born joins the fleet with what was counted of it.
#[test]
fn strangers_are_kept_apart_bounded_and_forgotten() {
    use crate::hub::fleet::strangers::{FORGET, MAX_STRANGERS};
    let (mut f, now) = born();
    let n = MAX_STRANGERS + 500;
    for k in 0..n {
        f.on_message(
            From { group: "GHOST", node: &format!("g{k}"), kind: Kind::DData, device: Some("d") },
            payload(Some(1), T0, vec![data(1, T0, 1.0)]),
            Clock { now, wall: wall(T0) },
            &mut Vec::new(),
        );
    }
    for kind in [Kind::NCmd, Kind::DCmd] {
        f.on_message(
            From { group: "A", node: "gw7", kind, device: (kind == Kind::DCmd).then_some("d") },
            payload(None, T0, vec![]),
            Clock { now, wall: wall(T0) },
            &mut Vec::new(),
        );
    }
    assert_eq!(f.edges().len(), 1, "only gw1 is of the fleet");
    assert_eq!(f.strangers().list().len(), MAX_STRANGERS);
    assert_eq!(f.strangers().not_kept, 500);
    assert_eq!(f.edge("A", "gw1").unwrap().stats.messages, 2, "its births only, no command");
    // One of them is born: it joins the fleet, its messages counted (and dropped).
    f.on_message(
        From { group: "GHOST", node: "g3", kind: Kind::NBirth, device: None },
        nbirth(1),
        Clock { now, wall: wall(T0) },
        &mut Vec::new(),
    );
    let g3 = f.edge("GHOST", "g3").unwrap();
    assert!(g3.status.is_online());
    assert_eq!((g3.stats.messages, g3.stats.dropped), (2, 1));
    assert_eq!(f.strangers().list().len(), MAX_STRANGERS - 1);
    assert!(f.strangers().list().iter().all(|s| s.node != "g3"));
    // Silence: forgotten.
    f.tick(now + FORGET, wall(T0), &mut Vec::new());
    assert!(f.strangers().list().is_empty());
    assert_eq!(f.edges().len(), 2);
}

/// Regression (the adversarial walk): data on topics of hundreds of nodes never born does
/// not hold up the rebirth a known edge node needs.
#[test]
fn a_known_edge_node_is_asked_before_nodes_never_born() {
    let (mut f, now) = born();
    for k in 0..50 {
        f.on_message(
            From { group: "GHOST", node: &format!("g{k}"), kind: Kind::DData, device: Some("d") },
            payload(Some(1), T0, vec![data(1, T0, 1.0)]),
            Clock { now, wall: wall(T0) },
            &mut Vec::new(),
        );
    }
    // gw1 sends data of a device it did not announce: it wants a rebirth too.
    f.on_message(
        From { group: "A", node: "gw1", kind: Kind::DData, device: Some("plc-9") },
        payload(Some(2), T0, vec![data(1, T0, 7.0)]),
        Clock { now, wall: wall(T0) },
        &mut Vec::new(),
    );
    assert_eq!(f.rebirths(now, 1), [("A".to_string(), "gw1".to_string())]);
    assert_eq!(f.rebirths(now, usize::MAX).len(), 50, "the others after it");
}

/// Regression (the adversarial walk): a burst of 1,000 made-up names filled every place and
/// a real edge node heard afterwards was never asked for a rebirth until they were
/// forgotten (10 minutes). A place whose stranger went silent for a few seconds is given to
/// the new one, and the last heard is asked first.
#[test]
fn a_node_heard_after_a_flood_gets_a_place_and_is_asked_first() {
    use crate::hub::fleet::strangers::MAX_STRANGERS;
    let mut f = fleet();
    let now = Instant::now();
    let heard = |f: &mut Fleet, node: &str, now: Instant| {
        f.on_message(
            From { group: "G", node, kind: Kind::DData, device: Some("d") },
            payload(Some(1), T0, vec![data(1, T0, 1.0)]),
            Clock { now, wall: wall(T0) },
            &mut Vec::new(),
        );
    };
    for k in 0..MAX_STRANGERS {
        heard(&mut f, &format!("ghost{k}"), now);
    }
    // At once: no place is idle yet.
    heard(&mut f, "early", now);
    assert_eq!(f.strangers().not_kept, 1);
    // Seconds later the flood is silent: the real node takes a place and goes first.
    let later = now + Duration::from_secs(6);
    heard(&mut f, "real", later);
    assert_eq!(f.strangers().list().len(), MAX_STRANGERS);
    assert!(f.strangers().list().iter().any(|s| s.node == "real"));
    assert_eq!(f.rebirths(later, 1), [("G".to_string(), "real".to_string())]);
}
