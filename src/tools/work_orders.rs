//! `create_work_order`, `get_work_order`, `list_work_orders`: proposals for a person to
//! approve, never lost or duplicated. The agent's tools cannot change a state; an
//! operator's decision ([`act`]) can, and only for the operator role.
//!
//! This is the edge of `work_orders/`: arguments are validated here, the store's
//! failures become the contract's errors (`store_error`), and the store's records are
//! rendered into the contract's types ([`render`]).

use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};

use super::defs::{
    CreateWorkOrderArgs, CreateWorkOrderData, Delivery, GetWorkOrderArgs, ListWorkOrdersArgs,
    ListWorkOrdersData, Transition, UnitMode, WorkOrder, WorkOrderData, WorkOrderStatus,
};
use super::envelope::{ErrorCode, ToolError};
use super::validate::{parse_sensor_id, registered_sensor};
use super::{Caller, ToolResult, View, to_data};
use crate::work_orders::model::{self, Action, Request, number_of, query_fingerprint};
use crate::work_orders::{Created, WorkOrderError, WorkOrderStore};

/// The most characters an operator's decision note may have.
pub const NOTE_CHARS: usize = 500;

/// How long the agent should wait before checking an order again.
const NEXT_CHECK_S: u64 = 900;
fn store(inner: &View) -> Result<Arc<WorkOrderStore>, ToolError> {
    inner.core.work_orders.clone().ok_or_else(ToolError::internal)
}

fn not_found(id: &str) -> ToolError {
    let mut e = ToolError::new(
        ErrorCode::WorkOrderNotFound,
        format!("No work order {} exists.", super::envelope::cut(id)),
        "Call list_work_orders to see the existing work orders.",
    );
    e.parameter = Some("work_order_id".into());
    e.received = Some(super::envelope::cut(id));
    e
}

/// Store failures the agent can act on; anything else is a logged internal error.
pub fn store_error(e: WorkOrderError) -> ToolError {
    match &e {
        WorkOrderError::NotFound(id) => not_found(id),
        WorkOrderError::Conflict { existing } => {
            let mut err = ToolError::new(
                ErrorCode::IdempotencyConflict,
                format!(
                    "This idempotency_key was already used for work order {existing} with other arguments."
                ),
                "Resend the original arguments to get that work order back, or use a new idempotency_key for a new request.",
            );
            err.parameter = Some("idempotency_key".into());
            err
        }
        WorkOrderError::Transition { id, from, to } => {
            let actions: Vec<&str> = Action::allowed_from(*from).map(Action::as_str).collect();
            let allowed_now = if actions.is_empty() {
                format!("No action is allowed on a work order that is {}.", from.as_str())
            } else {
                format!("Allowed now: {}.", actions.join(", "))
            };
            let mut e = ToolError::new(
                ErrorCode::InvalidState,
                format!("Work order {id} is {}; it cannot move to {}.", from.as_str(), to.as_str()),
                format!("{allowed_now} get_work_order shows the state and its history."),
            );
            e.received = Some(to.as_str().to_string());
            e
        }
        WorkOrderError::UnknownKey => {
            let mut e = ToolError::new(
                ErrorCode::WorkOrderNotFound,
                "No work order was created with this idempotency_key.",
                "The create_work_order call with this key did not take effect: it is safe to send it again (with the same key).",
            );
            e.parameter = Some("idempotency_key".into());
            e
        }
        // Logged where it happened (the store's problem, with the file).
        WorkOrderError::Db(_) => ToolError::storage_unavailable(),
        WorkOrderError::Corrupt | WorkOrderError::Refused(_) => {
            tracing::error!(error = %e, "work order store failed");
            ToolError::internal()
        }
    }
}

pub(crate) async fn create(inner: &View, caller: &Caller, args: CreateWorkOrderArgs) -> ToolResult {
    let registry = &inner.core.registry;
    let sensor = registered_sensor("sensor_id", &args.sensor_id, registry)?;
    let id = &sensor.id;
    let summary = args.summary.trim().to_string();
    if summary.chars().count() < 10 {
        return Err(ToolError::invalid(
            "summary",
            Some(&args.summary),
            "10-500 characters besides spaces",
            "`summary` is too short once spaces are removed.",
            "Say what was observed and what should be done.",
        ));
    }
    let fingerprint = Request {
        sensor_id: id.as_str(),
        work_type: args.work_type,
        priority: args.priority,
        summary: &summary,
    }
    .fingerprint();
    let now = Utc::now();
    let at = now.to_rfc3339_opts(SecondsFormat::Millis, true);
    // The evidence: the last value read (the poller keeps it fresh at an edge); at the
    // fleet hub, the latest value the sensor's edge node sent (nothing is read to get it).
    let (sample, source) = match &sensor.source {
        crate::registry::SensorSource::Edge(_) => {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
            let read = inner.core.reader.read(&[sensor], None, deadline).await;
            let sample = read.results.into_iter().next().and_then(|r| r.ok()).map(|(s, _)| s);
            (sample, super::defs::ReadingSource::Hub)
        }
        _ => (inner.core.reader.cache().fresh(sensor, u64::MAX / 2, now), super::defs::ReadingSource::Cache),
    };
    let evidence = sample.and_then(|s| {
        let mut stamps = super::reading_json::Stamps::new();
        let alarm = super::alarms::reading_alarm(inner, sensor);
        let reading =
            super::reading_json::reading(sensor, &s, UnitMode::Normalized, source, &mut stamps, alarm);
        serde_json::to_value(reading).ok()
    });
    let draft = model::WorkOrder {
        id: String::new(),
        sensor_id: id.to_string(),
        equipment: sensor.equipment.clone(),
        work_type: args.work_type,
        priority: args.priority,
        summary,
        status: WorkOrderStatus::PendingApproval,
        evidence,
        created_by: caller.id.clone(),
        created_at: at.clone(),
        updated_at: at.clone(),
        history: vec![model::Transition {
            from: None,
            to: WorkOrderStatus::PendingApproval,
            at,
            by: caller.id.clone(),
            note: None,
        }],
        delivery: None,
    };
    let policy = format!("{}:{}", args.work_type.as_str(), args.priority.as_str());
    let auto = inner.core.config.work_orders.auto_approve.contains(&policy);
    let store = store(inner)?;
    let key = args.idempotency_key.clone();
    // redb commits (with fsync) block: off the async threads.
    let created = tokio::task::spawn_blocking(move || store.create(&key, &fingerprint, draft, auto))
        .await
        .map_err(|_| ToolError::internal())?
        .map_err(store_error)?;
    let Created { order, created, duplicate_of } = created;
    let status = order.status;
    to_data(&CreateWorkOrderData {
        created,
        duplicate_of,
        status,
        approval_required: status == WorkOrderStatus::PendingApproval,
        next_check_after_seconds: NEXT_CHECK_S,
        work_order: shown(inner, order),
    })
}

/// `get_work_order`, typed.
pub(crate) fn work_order(inner: &View, args: &GetWorkOrderArgs) -> Result<WorkOrderData, ToolError> {
    let store = store(inner)?;
    let order = match (&args.work_order_id, &args.idempotency_key) {
        (Some(id), None) => store.get(id),
        (None, Some(key)) => store.by_key(key),
        (id, _) => {
            return Err(ToolError::invalid(
                if id.is_some() { "idempotency_key" } else { "work_order_id" },
                None,
                "exactly one of work_order_id and idempotency_key",
                "Give exactly one of `work_order_id` and `idempotency_key`.",
                "Look an order up by its ID, or by the idempotency_key of the create_work_order call that made it.",
            ));
        }
    }
    .map_err(store_error)?;
    Ok(WorkOrderData { work_order: shown(inner, order) })
}

/// An order as the agent sees it.
fn shown(inner: &View, order: model::WorkOrder) -> WorkOrder {
    render(order, !inner.core.config.work_orders.webhook_url.is_empty())
}

/// A stored order in the contract's type (the tools, and the command line's local
/// answers). With no webhook configured, its delivery says `not_configured` instead of
/// looking stuck at "pending".
pub fn render(order: model::WorkOrder, webhook_configured: bool) -> WorkOrder {
    let transition =
        |t: model::Transition| Transition { from: t.from, to: t.to, at: t.at, by: t.by, note: t.note };
    let delivery = |d: model::Delivery| Delivery {
        state: if webhook_configured { d.state.as_str() } else { "not_configured" }.to_string(),
        attempts: d.attempts,
        last_attempt_at: d.last_attempt_at,
    };
    WorkOrder {
        id: order.id,
        sensor_id: order.sensor_id,
        equipment: order.equipment,
        work_type: order.work_type,
        priority: order.priority,
        summary: order.summary,
        status: order.status,
        // The reading as it was shown when the order was created.
        evidence: order.evidence.and_then(|v| serde_json::from_value(v).ok()),
        created_by: order.created_by,
        created_at: order.created_at,
        updated_at: order.updated_at,
        history: order.history.into_iter().map(transition).collect(),
        delivery: order.delivery.map(delivery),
    }
}

/// An operator's decision on a work order (`approve`, `reject`, `start`, `complete`,
/// `cancel`). Only the operator role may; the agent's tools never change a state.
pub(crate) async fn act(
    inner: &View,
    caller: &Caller,
    id: &str,
    action: &str,
    note: Option<String>,
) -> ToolResult {
    if !caller.is_operator() {
        return Err(ToolError::new(
            ErrorCode::Forbidden,
            "Only an operator can change a work order's state.",
            "A person approves or rejects work orders; check it later with get_work_order.",
        ));
    }
    let Some(action) = Action::named(action) else {
        return Err(ToolError::invalid(
            "action",
            Some(action),
            Action::NAMES,
            "Unknown action.",
            "Use one of the listed actions.",
        ));
    };
    let store = store(inner)?;
    let (id, by) = (id.to_string(), caller.id.clone());
    if let Some(n) = note.as_deref() {
        super::validate::text::check("note", n)?;
    }
    // A person's note is kept whole, up to NOTE_CHARS; a longer one is refused, not cut.
    if let Some(n) = note.as_deref().filter(|n| n.chars().count() > NOTE_CHARS) {
        return Err(ToolError::invalid(
            "note",
            Some(&super::envelope::cut(n)),
            format!("at most {NOTE_CHARS} characters"),
            format!("The note has {} characters.", n.chars().count()),
            format!("Shorten the note to {NOTE_CHARS} characters or fewer."),
        ));
    }
    let order = tokio::task::spawn_blocking(move || store.transition(&id, action.target(), &by, note))
        .await
        .map_err(|_| ToolError::internal())?
        .map_err(store_error)?;
    tracing::info!(
        target: "audit",
        event = "operator_decision",
        caller = caller.id.as_str(),
        work_order = %order.id,
        action = action.as_str(),
        outcome = "success",
        "work order decided"
    );
    to_data(&WorkOrderData { work_order: shown(inner, order) })
}

const PAGING: super::cursor::Paging =
    super::cursor::Paging { this: "the same listing", other: "a listing with other filters" };

/// Where a page of `list_work_orders` ended: the last number shown, and the `since` the
/// first page resolved (`-1h` means an hour before the first page, on every page).
#[derive(serde::Serialize, serde::Deserialize)]
struct Cursor {
    n: u64,
    since: Option<i64>,
}

/// `list_work_orders`, typed.
pub(crate) fn work_orders(inner: &View, args: &ListWorkOrdersArgs) -> Result<ListWorkOrdersData, ToolError> {
    let sensor = match &args.sensor_id {
        Some(raw) => Some(parse_sensor_id("sensor_id", raw, &inner.core.registry)?),
        None => None,
    };
    let f = super::cursor::fingerprint(&query_fingerprint(
        args.status,
        args.sensor_id.as_deref(),
        args.since.as_deref(),
    ));
    let cursor = match &args.cursor {
        Some(c) => Some(super::cursor::decode::<Cursor>(c, f, &PAGING)?),
        None => None,
    };
    let since_ms = match (&cursor, &args.since) {
        (Some(c), _) => c.since,
        (None, Some(raw)) => Some(super::when::instant("since", raw, Utc::now().timestamp_millis())?),
        (None, None) => None,
    };
    let since = match since_ms {
        Some(ms) => {
            Some(chrono::TimeZone::timestamp_millis_opt(&Utc, ms).single().ok_or_else(ToolError::internal)?)
        }
        None => None,
    };
    let before = cursor.map(|c| c.n);
    let matching: Vec<model::WorkOrder> = store(inner)?
        .list()
        .map_err(store_error)?
        .into_iter()
        .filter(|o| args.status.is_none_or(|s| o.status == s))
        .filter(|o| sensor.as_ref().is_none_or(|s| o.sensor_id == s.as_str()))
        .filter(|o| since.is_none_or(|t| DateTime::parse_from_rfc3339(&o.created_at).is_ok_and(|c| c >= t)))
        .collect();
    let total = matching.len();
    let limit = args.limit.unwrap_or(ListWorkOrdersArgs::DEFAULT_LIMIT) as usize;
    let number = |o: &model::WorkOrder| number_of(&o.id).unwrap_or(0);
    let mut page: Vec<model::WorkOrder> =
        matching.into_iter().filter(|o| before.is_none_or(|b| number(o) < b)).collect();
    let more = page.len() > limit;
    page.truncate(limit);
    let next_cursor = if more {
        page.last().map(|o| super::cursor::encode(Cursor { n: number(o), since: since_ms }, f))
    } else {
        None
    };
    let page = page.into_iter().map(|o| shown(inner, o)).collect();
    let since = since.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true));
    Ok(ListWorkOrdersData { work_orders: page, total, complete: next_cursor.is_none(), next_cursor, since })
}
