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

fn draft_at(sensor: &str, created_at: &str) -> WorkOrder {
    WorkOrder { created_at: created_at.into(), ..draft(sensor) }
}

fn ids(orders: &[WorkOrder]) -> Vec<&str> {
    orders.iter().map(|o| o.id.as_str()).collect()
}

#[test]
fn the_list_is_newest_first_each_order_with_its_delivery() {
    let s = WorkOrderStore::in_memory().unwrap();
    for n in 1..=3 {
        s.create(&format!("k{n}"), "f", draft(&format!("A_LINE1_00{n}")), false).unwrap();
    }
    s.transition("WO-000002", WorkOrderStatus::Approved, "op", None).unwrap();
    let list = s.list().unwrap();
    assert_eq!(ids(&list), vec!["WO-000003", "WO-000002", "WO-000001"]);
    let states: Vec<Option<DeliveryState>> =
        list.iter().map(|o| o.delivery.as_ref().map(|d| d.state)).collect();
    assert_eq!(states, vec![None, Some(DeliveryState::Pending), None]);
}

#[test]
fn transitions_follow_the_lifecycle_and_an_open_order_stays_the_one_of_its_sensor_and_type() {
    let s = WorkOrderStore::in_memory().unwrap();
    s.create("k1", "f", draft("A_LINE1_001"), false).unwrap();
    let e = s.transition("WO-000001", WorkOrderStatus::Completed, "op", None).expect_err("not from pending");
    assert!(matches!(e, WorkOrderError::Transition { .. }), "{e}");
    let o = s.transition("WO-000001", WorkOrderStatus::Approved, "op", Some("ok".into())).unwrap();
    assert_eq!((o.status, o.history.len()), (WorkOrderStatus::Approved, 1));
    assert_eq!(o.history[0].note.as_deref(), Some("ok"));
    // Approved is still open: the same sensor and type again is its duplicate.
    let again = s.create("k2", "f", draft("A_LINE1_001"), false).unwrap();
    assert_eq!((again.created, again.duplicate_of.as_deref()), (false, Some("WO-000001")));
    // Cancelled is closed: the next one is a new order.
    s.transition("WO-000001", WorkOrderStatus::Cancelled, "op", None).unwrap();
    let next = s.create("k3", "f", draft("A_LINE1_001"), false).unwrap();
    assert_eq!((next.created, next.order.id.as_str()), (true, "WO-000002"));
    // Only an approval queues a delivery.
    s.transition("WO-000002", WorkOrderStatus::Rejected, "op", None).unwrap();
    assert!(s.get("WO-000002").unwrap().delivery.is_none());
    assert!(s.due(i64::MAX).unwrap().iter().all(|(o, _)| o.id == "WO-000001"));
}

#[test]
fn pending_orders_created_before_the_cutoff_expire_and_no_others() {
    let s = WorkOrderStore::in_memory().unwrap();
    s.create("k1", "f", draft_at("A_LINE1_001", "2026-12-01T10:00:00.000Z"), false).unwrap();
    s.create("k2", "f", draft_at("A_LINE1_002", "2026-12-01T10:00:00.000Z"), false).unwrap();
    s.create("k3", "f", draft_at("A_LINE1_003", "2026-12-01T11:00:00.000Z"), false).unwrap();
    s.transition("WO-000002", WorkOrderStatus::Approved, "op", None).unwrap();
    let at = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc);
    // Created exactly at the cutoff: not before it.
    assert_eq!(s.expire(at("2026-12-01T10:00:00.000Z")).unwrap(), Vec::<String>::new());
    assert_eq!(s.expire(at("2026-12-01T10:00:00.001Z")).unwrap(), vec!["WO-000001".to_string()]);
    let o = s.get("WO-000001").unwrap();
    assert_eq!((o.status, o.history[0].by.as_str()), (WorkOrderStatus::Expired, "system"));
    assert_eq!(s.get("WO-000002").unwrap().status, WorkOrderStatus::Approved, "approved: not expired");
    assert_eq!(s.get("WO-000003").unwrap().status, WorkOrderStatus::PendingApproval);
}

#[test]
fn a_delivery_is_due_at_its_time_counted_per_attempt_and_not_again_once_delivered() {
    let s = WorkOrderStore::in_memory().unwrap();
    s.create("k1", "f", draft("A_LINE1_001"), false).unwrap();
    s.create("k2", "f", draft("A_LINE1_002"), true).unwrap();
    assert!(s.due(i64::MAX).unwrap().iter().all(|(o, _)| o.id == "WO-000002"), "only the approved");
    assert_eq!(s.due(0).unwrap().len(), 1, "due at once");
    assert!(s.due(-1).unwrap().is_empty());
    s.delivered("WO-000002", false, 5000).unwrap();
    assert!(s.due(4999).unwrap().is_empty(), "waits for its next attempt");
    let due = s.due(5000).unwrap();
    assert_eq!((due.len(), due[0].1.attempts, due[0].1.delivered), (1, 1, false));
    let d = s.get("WO-000002").unwrap().delivery.unwrap();
    assert_eq!((d.state, d.attempts), (DeliveryState::Failing, 1));
    assert!(d.last_attempt_at.is_some());
    s.delivered("WO-000002", true, 0).unwrap();
    assert!(s.due(i64::MAX).unwrap().is_empty(), "delivered: never due again");
    let d = s.get("WO-000002").unwrap().delivery.unwrap();
    assert_eq!((d.state, d.attempts), (DeliveryState::Delivered, 2));
    assert!(matches!(s.delivered("WO-000001", true, 0), Err(WorkOrderError::NotFound(_))), "nothing queued");
}

#[test]
fn a_marker_that_could_not_be_written_is_caught_up_by_recheck_once_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("work_orders.redb");
    let s = WorkOrderStore::open(&path).unwrap();
    s.create("k1", "f", draft("A_LINE1_001"), false).unwrap();
    assert_eq!(marker(dir.path()), "WO-000001");
    // The marker's temporary file cannot be created (a directory stands in its place): the
    // order is committed, the marker lags and the store says so.
    let blocker = dir.path().join("work_orders.tmp");
    std::fs::create_dir(&blocker).unwrap();
    s.create("k2", "f", draft("A_LINE1_002"), false).unwrap();
    assert_eq!(marker(dir.path()), "WO-000001");
    let problem = s.problem().expect("the lagging marker is a problem");
    assert!(problem.reason.contains("marker"), "{}", problem.reason);
    // The store itself writes again, the marker still cannot: not fine.
    assert!(!s.recheck());
    assert!(s.problem().is_some());
    assert_eq!(marker(dir.path()), "WO-000001");
    // Once it can, recheck catches the marker up to the highest order and clears the problem.
    std::fs::remove_dir(&blocker).unwrap();
    assert!(s.recheck());
    assert!(s.problem().is_none());
    assert_eq!(marker(dir.path()), "WO-000002");
    // And a reopen agrees with it.
    drop(s);
    drop(WorkOrderStore::open(&path).unwrap());
}

#[test]
fn recheck_of_a_store_that_never_issued_an_order_leaves_no_marker() {
    let dir = tempfile::tempdir().unwrap();
    let s = WorkOrderStore::open_in(dir.path()).unwrap();
    s.db.note("a write failed");
    assert!(s.recheck(), "the store writes: fine");
    assert!(s.problem().is_none());
    // Nothing was issued: no marker claims an ID.
    assert!(!dir.path().join("work_orders.last_id").exists());
}
