//! Unit tests of the work-order store's own bookkeeping: the marker of issued IDs that
//! refuses a store with fewer orders than were issued, and the time stamps.

use super::*;

fn draft(sensor: &str) -> WorkOrder {
    serde_json::from_value(serde_json::json!({
        "id": "", "sensor_id": sensor, "equipment": null, "type": "inspection", "priority": "low",
        "summary": "x", "status": "pending_approval", "created_at": "2026-12-01T00:00:00Z",
        "updated_at": "2026-12-01T00:00:00Z", "created_by": "t", "evidence": null, "history": [],
        "delivery": null
    }))
    .unwrap()
}

fn marker(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("work_orders.last_id")).unwrap()
}

#[test]
fn the_marker_follows_every_order_issued_and_refuses_a_store_that_lost_some() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("work_orders.redb");
    {
        let s = WorkOrderStore::open(&path).unwrap();
        for n in 1..=3 {
            s.create(&format!("k{n}"), "f", draft(&format!("A_LINE1_00{n}")), false).unwrap();
        }
        // A replay issues nothing.
        s.create("k1", "f", draft("A_LINE1_001"), false).unwrap();
    }
    assert_eq!(marker(dir.path()), "WO-000003");
    // As issued: it opens.
    drop(WorkOrderStore::open(&path).unwrap());
    // The store replaced by an older copy (one order): refused, saying what was issued.
    std::fs::write(dir.path().join("work_orders.last_id"), "WO-000004").unwrap();
    let e = WorkOrderStore::open(&path).err().expect("refused").to_string();
    assert!(e.contains("holds work orders up to WO-000003") && e.contains("WO-000004"), "{e}");
    // A marker behind the store (written before a crash): caught up at open.
    std::fs::write(dir.path().join("work_orders.last_id"), "WO-000001").unwrap();
    drop(WorkOrderStore::open(&path).unwrap());
    assert_eq!(marker(dir.path()), "WO-000003");
    // An empty store with no marker: nothing issued, nothing to catch up.
    let empty = tempfile::tempdir().unwrap();
    drop(WorkOrderStore::open_in(empty.path()).unwrap());
    assert!(!empty.path().join("work_orders.last_id").exists());
    // A marker that is not an ID: refused.
    std::fs::write(dir.path().join("work_orders.last_id"), "garbage").unwrap();
    let e = WorkOrderStore::open(&path).err().expect("refused").to_string();
    assert!(e.contains("does not hold a work order ID"), "{e}");
}

#[test]
fn a_store_without_a_problem_is_fine_at_once() {
    let s = WorkOrderStore::in_memory().unwrap();
    assert!(s.problem().is_none());
    assert!(s.recheck());
}

#[test]
fn time_stamps_are_rfc_3339_utc_to_the_millisecond() {
    let before = Utc::now();
    let t = DateTime::parse_from_rfc3339(&now()).expect("RFC 3339").with_timezone(&Utc);
    assert!(t >= before - chrono::Duration::milliseconds(1) && t <= Utc::now());
    assert!(now().ends_with('Z') && now().len() == "2026-12-01T00:00:00.000Z".len());
}

#[test]
fn storage_failures_are_told_from_refusals() {
    assert!(WorkOrderError::Db("disk full".into()).is_storage());
    assert!(!WorkOrderError::Refused("x".into()).is_storage());
}
