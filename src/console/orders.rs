//! The work-order queue (filters by state, the evidence the agent attached, approve or
//! reject with a note), one order's page with its whole history, the decision form's
//! handler, and the agent's recent calls.

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::auth::NO_TOKENS;
use super::view::{activity_rows, layout, value_text};
use super::viewer::Viewer;
use super::{Console, ConsoleError, page};
use crate::tools::ToolError;
use crate::tools::defs::{
    GetWorkOrderArgs, ListWorkOrdersArgs, ListWorkOrdersData, WorkOrder, WorkOrderData, WorkOrderStatus,
};
use crate::work_orders::model::Action;

/// The filters offered, in the order of an order's life.
const STATES: [WorkOrderStatus; 7] = [
    WorkOrderStatus::PendingApproval,
    WorkOrderStatus::Approved,
    WorkOrderStatus::InProgress,
    WorkOrderStatus::Completed,
    WorkOrderStatus::Rejected,
    WorkOrderStatus::Cancelled,
    WorkOrderStatus::Expired,
];

/// Orders shown on one page of the queue at most (the tool's own maximum).
const SHOWN: u32 = 500;

#[derive(Debug, Default, Deserialize)]
pub struct QueueQuery {
    /// A state name, or `all`. Default: `pending_approval`.
    status: Option<String>,
}

/// `GET /console/work-orders`.
pub async fn queue(
    State(c): State<Console>,
    headers: HeaderMap,
    q: Result<Query<QueueQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    let status = q.ok().and_then(|Query(q)| q.status).unwrap_or_else(|| "pending_approval".into());
    let wanted = match status.as_str() {
        "all" => None,
        name => Some(WorkOrderStatus::named(name).ok_or_else(|| {
            let names: Vec<&str> = WorkOrderStatus::ALL.iter().map(|s| s.as_str()).collect();
            ToolError::invalid(
                "status",
                Some(name),
                format!("all, or one of {}", names.join(", ")),
                "Unknown work-order state.",
                "Use the state links on the work-order page.",
            )
        })?),
    };
    let args = ListWorkOrdersArgs { status: wanted, limit: Some(SHOWN), ..Default::default() };
    let list: ListWorkOrdersData = c.tools.list_work_orders(&args)?;
    let body = html! {
        h1 { "Work orders" }
        (actions_note(&viewer))
        nav.filters {
            @for s in STATES {
                a href={ "/console/work-orders?status=" (s.as_str()) } class=[(status == s.as_str()).then_some("here")] { (s.as_str().replace('_', " ")) }
            }
            a href="/console/work-orders?status=all" class=[(status == "all").then_some("here")] { "all" }
        }
        p.muted { (list.total) " work orders " @if status != "all" { (status.replace('_', " ")) } }
        @for o in &list.work_orders { (order_card(&viewer, o, false, None)) }
        @if list.work_orders.is_empty() { p #queue-empty { "No work orders in this state." } }
    };
    Ok(page(layout(&c, &viewer, "Work orders", "/console/work-orders", None, body)))
}

/// Who may decide here, in one sentence, when it is not the viewer.
fn actions_note(viewer: &Viewer) -> Markup {
    match viewer {
        Viewer::Open => html! { p.note #actions-disabled { (NO_TOKENS) } },
        Viewer::Signed(s) if !viewer.is_operator() => html! {
            p.note #actions-refused { "You are signed in as " (s.caller.id) " with an agent token: you can look, but only an operator can approve or reject work orders." }
        },
        Viewer::Signed(_) => html! {},
    }
}

/// A decision the server refused, shown again with the note as typed.
struct Draft<'a> {
    error: &'a ToolError,
    note: &'a str,
}

/// One order: what, why (the evidence), its state and, where allowed, the decision form.
fn order_card(viewer: &Viewer, o: &WorkOrder, full: bool, draft: Option<&Draft<'_>>) -> Markup {
    let actions: Vec<Action> = Action::allowed_from(o.status).collect();
    html! {
        section.card #{ "wo-" (o.id) } data-status=(o.status.as_str()) {
            h2 { a href={ "/console/work-orders/" (o.id) } { (o.id) } " · " span.status { (o.status.as_str().replace('_', " ")) } }
            p { strong { (o.priority.as_str()) " " (o.work_type.as_str()) } " on "
                a href={ "/console/sensors/" (o.sensor_id) } { (o.sensor_id) }
                @if let Some(e) = &o.equipment { " (equipment " (e) ")" } }
            p.summary { (o.summary) }
            p.muted { "Proposed by " (o.created_by) " at " (o.created_at) }
            @match &o.evidence {
                Some(r) => { p { "Evidence: " b { (r.value.as_ref().map(value_text).unwrap_or_else(|| "no value".into())) } " " (r.unit)
                    " · quality " (format!("{:?}", r.quality).to_lowercase()) " · read " (r.timestamp)
                    @if r.in_range == Some(false) { " · " span.out { "OUT OF RANGE" } }
                    @if let Some(range) = r.range { " (normal " (range.min) " – " (range.max) ")" } } }
                None => { p.muted { "No reading was cached for the sensor when the order was made." } }
            }
            @if !actions.is_empty() { (decision_form(viewer, o, &actions, draft)) }
            @if full { (history(o)) } @else {
                details { summary { "History (" (o.history.len()) @if o.history.len() == 1 { " step)" } @else { " steps)" } } (history(o)) }
            }
        }
    }
}

fn history(o: &WorkOrder) -> Markup {
    html! {
        table.history {
            thead { tr { th { "When" } th { "From" } th { "To" } th { "By" } th { "Note" } } }
            tbody { @for t in &o.history {
                tr { td { (t.at) } td { (t.from.map(|f| f.as_str()).unwrap_or("–")) } td { (t.to.as_str()) } td.by { (t.by) } td { (t.note.as_deref().unwrap_or("")) } }
            } }
        }
        @if let Some(d) = &o.delivery { p.muted { "Delivery: " (d.state) ", " (d.attempts) " attempts" } }
    }
}

/// The decision form: a note and one button per allowed action. Disabled, with the
/// reason beside it, for anyone but an operator (the server refuses them anyway).
fn decision_form(viewer: &Viewer, o: &WorkOrder, actions: &[Action], draft: Option<&Draft<'_>>) -> Markup {
    let allowed = viewer.is_operator();
    let limit = crate::tools::work_orders::NOTE_CHARS;
    html! {
        @if let Some(d) = draft {
            div.error #decision-refused { p { (super::prose(&d.error.message)) } @if let Some(x) = &d.error.expected { p { "Accepted: " (super::prose(x)) } } }
        }
        form.decide method="post" action={ "/console/work-orders/" (o.id) } {
            input type="hidden" name="csrf" value=(viewer.csrf().unwrap_or(""));
            textarea name="note" placeholder={ "Note (optional, at most " (limit) " characters)" } maxlength=(limit) disabled[!allowed] { (draft.map_or("", |d| d.note)) }
            @for a in actions {
                button type="submit" name="action" value=(a.as_str()) id={ (a.as_str()) "-" (o.id) } disabled[!allowed] { (a.as_str()) }
            }
            @if !allowed { span.muted { "Only a signed-in operator can decide." } }
        }
    }
}

/// `GET /console/work-orders/{id}`: one order and its whole history.
pub async fn order(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    let data: WorkOrderData =
        c.tools.work_order(&GetWorkOrderArgs { work_order_id: Some(id), idempotency_key: None })?;
    Ok(page(order_page(&c, &viewer, &data.work_order, None)))
}

fn order_page(c: &Console, viewer: &Viewer, o: &WorkOrder, draft: Option<&Draft<'_>>) -> Markup {
    let body = html! {
        p { a href="/console/work-orders" { "Work orders" } " › " (o.id) }
        (actions_note(viewer))
        (order_card(viewer, o, true, draft))
    };
    layout(c, viewer, &o.id, "/console/work-orders", None, body)
}

#[derive(Deserialize)]
pub struct Decision {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    note: String,
}

/// `POST /console/work-orders/{id}`: an operator's decision, recorded with the name of
/// the operator's token (as the CLI and the HTTP API record it).
pub async fn decide(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    form: Result<Form<Decision>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ConsoleError> {
    let Ok(Form(form)) = form else {
        return Err(ToolError::invalid(
            "form",
            None,
            "csrf, action and note, form-encoded",
            "The form did not arrive whole.",
            "Reload the page and try again.",
        )
        .into());
    };
    let session = c.operator(&headers, &form.csrf)?;
    // A browser sends a textarea's line breaks as CRLF but counts each as one character
    // against `maxlength`: kept as one here too.
    let note = Some(form.note.trim().replace("\r\n", "\n")).filter(|n| !n.is_empty());
    let e = c.tools.act_on_work_order(&session.caller, &id, &form.action, note.clone()).await;
    match e.error {
        // A note (or action) refused: the order again, with why and the note as typed.
        Some(err) if err.code == crate::tools::ErrorCode::InvalidArgument => {
            let args = GetWorkOrderArgs { work_order_id: Some(id), idempotency_key: None };
            let data = c.tools.work_order(&args)?;
            let viewer = Viewer::Signed(session);
            let draft = Draft { error: &err, note: note.as_deref().unwrap_or("") };
            let markup = order_page(&c, &viewer, &data.work_order, Some(&draft));
            Ok((StatusCode::BAD_REQUEST, markup).into_response())
        }
        Some(err) => Err(ConsoleError::Tool(err)),
        None => {
            let mut res = Redirect::to(&format!("/console/work-orders/{}", urlencode(&id))).into_response();
            *res.status_mut() = StatusCode::SEE_OTHER;
            Ok(res)
        }
    }
}

/// A path segment percent-encoded (the ID came from the request).
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET /console/activity`: the agent's recent tool calls, updated live.
pub async fn activity(State(c): State<Console>, headers: HeaderMap) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    let calls = c.tools.activity();
    let body = html! {
        h1 { "Agent activity" }
        p.muted { "The agent's most recent tool calls over MCP and HTTP, newest first (the console's own requests are not among them)." }
        table {
            thead { tr { th { "When" } th { "Caller" } th { "Tool" } th { "Arguments" } th { "Outcome" } th { "Duration" } } }
            tbody #activity { (activity_rows(&calls)) }
        }
    };
    Ok(page(layout(&c, &viewer, "Agent activity", "/console/activity", Some("/console/live"), body)))
}
