//! Work orders, in one room: what an order is and its lifecycle (`model.rs`), the durable
//! store with its idempotency keys and outbox (`store.rs`), delivery of approved orders
//! to the maintenance system and expiry of pending ones (`delivery.rs`), and the webhook
//! it delivers through (`webhook.rs`).
//!
//! The agent's three tools and the operators' decisions are at the edge, in
//! `tools/work_orders.rs`: they validate arguments, call the store and render its
//! records into the tool contract's types. Nothing here knows about tools, MCP or HTTP
//! (the webhook is an HTTP *client* of the maintenance system, not fieldgate's API).

pub mod delivery;
pub mod model;
pub mod store;
pub mod webhook;

pub use model::{
    Action, Delivery, DeliveryState, Priority, Request, Transition, WorkOrder, WorkOrderStatus,
    WorkOrderType, allowed,
};
pub use store::{Created, OutboxEntry, WorkOrderError, WorkOrderStore};
pub use webhook::Webhook;
