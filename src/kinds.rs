//! The closed vocabularies of work orders, their kinds and priorities: a leaf, since the
//! configuration names them too (`work_orders.auto_approve = ["inspection:low"]`) and is
//! read below `work_orders/`, which re-exports them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// What kind of work is asked for (a doc comment would reach the tools' schemas).
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
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum WorkOrderType {
    Inspection,
    Calibration,
    Repair,
    Replacement,
    Cleaning,
}

impl WorkOrderType {
    pub const ALL: &[WorkOrderType] = <WorkOrderType as strum::VariantArray>::VARIANTS;

    /// The name on every wire and in the store (serde's).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

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
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Priority {
    Low,
    Medium,
    High,
    Urgent,
}

impl Priority {
    pub const ALL: &[Priority] = <Priority as strum::VariantArray>::VARIANTS;

    /// The name on every wire and in the store (serde's).
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}
