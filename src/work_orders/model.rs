//! What a work order is, independent of any wire: its kinds, priorities and states, the
//! lifecycle (which moves are allowed, and the operators' actions that make them), the
//! record the store keeps, and the fingerprint that ties an idempotency key to the
//! arguments it was first used with.
//!
//! The tools render a [`WorkOrder`] into the contract's type at the edge
//! (`tools/work_orders.rs`); the store never sees that type.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::kinds::{Priority, WorkOrderType};

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Deserialize,
    Serialize,
    JsonSchema,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum WorkOrderStatus {
    PendingApproval,
    Approved,
    InProgress,
    Completed,
    Rejected,
    Cancelled,
    Expired,
}

impl WorkOrderStatus {
    pub const ALL: &[WorkOrderStatus] = <WorkOrderStatus as strum::VariantArray>::VARIANTS;

    /// The name on every wire and in the store (serde's).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The state named `name`, if there is one.
    pub fn named(name: &str) -> Option<WorkOrderStatus> {
        WorkOrderStatus::ALL.iter().copied().find(|s| s.as_str() == name)
    }

    /// Whether an order in this state still blocks a duplicate (pending, approved, in progress).
    pub fn is_open(self) -> bool {
        matches!(
            self,
            WorkOrderStatus::PendingApproval | WorkOrderStatus::Approved | WorkOrderStatus::InProgress
        )
    }
}

/// The lifecycle: which moves are allowed.
pub fn allowed(from: WorkOrderStatus, to: WorkOrderStatus) -> bool {
    use WorkOrderStatus::*;
    matches!(
        (from, to),
        (PendingApproval, Approved)
            | (PendingApproval, Rejected)
            | (PendingApproval, Expired)
            | (Approved, InProgress)
            | (Approved, Cancelled)
            | (InProgress, Completed)
            | (InProgress, Cancelled)
    )
}

/// An operator's decision on a work order. The one mapping from an action to the state
/// it moves an order to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "lowercase")]
pub enum Action {
    Approve,
    Reject,
    Start,
    Complete,
    Cancel,
}

impl Action {
    pub const ALL: &[Action] = <Action as strum::VariantArray>::VARIANTS;

    /// The names, for messages: "approve, reject, start, complete or cancel".
    pub const NAMES: &str = "approve, reject, start, complete or cancel";

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The action named `name`, if there is one.
    pub fn named(name: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.as_str() == name)
    }

    /// The state this action moves an order to.
    pub fn target(self) -> WorkOrderStatus {
        match self {
            Action::Approve => WorkOrderStatus::Approved,
            Action::Reject => WorkOrderStatus::Rejected,
            Action::Start => WorkOrderStatus::InProgress,
            Action::Complete => WorkOrderStatus::Completed,
            Action::Cancel => WorkOrderStatus::Cancelled,
        }
    }

    /// The actions allowed on an order in state `from`.
    pub fn allowed_from(from: WorkOrderStatus) -> impl Iterator<Item = Action> {
        Action::ALL.iter().copied().filter(move |a| allowed(from, a.target()))
    }
}

/// `WO-000042` → 42; only the form [`id_of`] writes (`WO-42` and `WO-0000042` are no IDs:
/// one order has one name).
pub fn number_of(id: &str) -> Option<u64> {
    let n = id.strip_prefix("WO-")?;
    if !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|n| id_of(*n) == id)
}

/// 42 → `WO-000042`.
pub fn id_of(n: u64) -> String {
    format!("WO-{n:06}")
}

/// One change of state, as recorded in the order's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// None for the creation.
    pub from: Option<WorkOrderStatus>,
    pub to: WorkOrderStatus,
    pub at: String,
    /// Who made the change: "agent", an operator's name, or "system".
    pub by: String,
    pub note: Option<String>,
}

/// Where an approved order's delivery to the maintenance system stands.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum DeliveryState {
    /// Not attempted yet.
    Pending,
    Delivered,
    /// Attempted and failed; it will be attempted again.
    Failing,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub state: DeliveryState,
    pub attempts: u32,
    pub last_attempt_at: Option<String>,
}

/// A work order as the store keeps it. Its JSON (field names and order) is the format of
/// the records already in `work_orders.redb` and of the webhook's body: change neither
/// without a migration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkOrder {
    /// `WO-000001`, never reused; empty in a draft.
    pub id: String,
    pub sensor_id: String,
    pub equipment: Option<String>,
    #[serde(rename = "type")]
    pub work_type: WorkOrderType,
    pub priority: Priority,
    pub summary: String,
    pub status: WorkOrderStatus,
    /// The sensor's reading when the order was created, as the agent was shown it
    /// (the tools' reading JSON, kept as it was).
    pub evidence: Option<serde_json::Value>,
    pub created_by: String,
    pub created_at: String,
    pub updated_at: String,
    pub history: Vec<Transition>,
    /// Filled from the outbox when read (never stored with the order).
    pub delivery: Option<Delivery>,
}

/// What a `create_work_order` call asks, once validated: its idempotency fingerprint
/// identifies these, so a key reused with other arguments is a conflict.
pub struct Request<'a> {
    pub sensor_id: &'a str,
    pub work_type: WorkOrderType,
    pub priority: Priority,
    /// Trimmed.
    pub summary: &'a str,
}

impl Request<'_> {
    /// The fingerprint stored beside the idempotency key.
    ///
    /// Its text is the format of the fingerprints already stored in `work_orders.redb`
    /// (the tool's name, then the arguments with sorted names and debug-quoted strings):
    /// a different text would turn every replay of a key made before an upgrade into an
    /// `IDEMPOTENCY_CONFLICT`. The test `fingerprint_keeps_its_stored_format` holds it.
    pub fn fingerprint(&self) -> String {
        canonical(
            "create_work_order",
            &[
                ("priority", Some(self.priority.as_str())),
                ("sensor_id", Some(self.sensor_id)),
                ("summary", Some(self.summary)),
                ("type", Some(self.work_type.as_str())),
            ],
        )
    }
}

/// The fingerprint of a `list_work_orders` query, which its cursors carry so that a
/// cursor is refused by any other query.
pub fn query_fingerprint(
    status: Option<WorkOrderStatus>,
    sensor_id: Option<&str>,
    since: Option<&str>,
) -> String {
    canonical(
        "list_work_orders",
        &[("id", sensor_id), ("s", status.map(WorkOrderStatus::as_str)), ("since", since)],
    )
}

/// `name:{"k":"v",...}` over fields given in sorted order, `null` for none; debug quoting
/// is injective, which is all a fingerprint needs.
fn canonical(name: &str, fields: &[(&str, Option<&str>)]) -> String {
    debug_assert!(fields.windows(2).all(|w| w[0].0 < w[1].0), "fields in sorted order");
    let mut out = String::with_capacity(64);
    out.push_str(name);
    out.push_str(":{");
    for (k, v) in fields {
        let _ = write!(out, "{k:?}:");
        match v {
            Some(v) => {
                let _ = write!(out, "{v:?}");
            }
            None => out.push_str("null"),
        }
        out.push(',');
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_order_has_one_name() {
        assert_eq!(number_of("WO-000042"), Some(42));
        assert_eq!(number_of("WO-1234567"), Some(1_234_567));
        for other in ["WO-42", "WO-0000042", "WO-+00042", "WO-00004 2", "wo-000042"] {
            assert_eq!(number_of(other), None, "{other}");
        }
    }

    use super::*;

    #[test]
    fn fingerprint_keeps_its_stored_format() {
        let r = Request {
            sensor_id: "A_LINE1_001",
            work_type: WorkOrderType::Inspection,
            priority: Priority::Medium,
            summary: "Pump \"P-101\" hums; check it.\n",
        };
        assert_eq!(
            r.fingerprint(),
            r#"create_work_order:{"priority":"medium","sensor_id":"A_LINE1_001","summary":"Pump \"P-101\" hums; check it.\n","type":"inspection",}"#
        );
        assert_eq!(
            query_fingerprint(Some(WorkOrderStatus::PendingApproval), None, Some("-1h")),
            r#"list_work_orders:{"id":null,"s":"pending_approval","since":"-1h",}"#
        );
    }

    #[test]
    fn names_are_serdes() {
        for t in WorkOrderType::ALL {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        for p in Priority::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        }
        for s in <WorkOrderStatus as strum::VariantArray>::VARIANTS {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for &a in Action::ALL {
            let s = a.target();
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(Action::named(a.as_str()), Some(a));
            assert!(Action::NAMES.contains(a.as_str()));
        }
        for d in <DeliveryState as strum::VariantArray>::VARIANTS {
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
        }
    }

    #[test]
    fn every_action_leads_somewhere_allowed() {
        assert_eq!(
            Action::allowed_from(WorkOrderStatus::PendingApproval).collect::<Vec<_>>(),
            [Action::Approve, Action::Reject]
        );
        assert_eq!(Action::allowed_from(WorkOrderStatus::Completed).count(), 0);
    }
}
