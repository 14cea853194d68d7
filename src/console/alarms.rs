//! The alarm page: every configured alarm with its state (what stands first, filters by
//! state), and an operator's acknowledge, shelve and unshelve buttons with a comment.

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::auth::NO_TOKENS;
use super::view::{layout, number};
use super::viewer::Viewer;
use super::{Console, ConsoleError, page};
use crate::tools::ToolError;
use crate::tools::defs::{AlarmInfo, AlarmState, AlarmStateFilter, ListAlarmsArgs};

/// The filters offered: what stands, what waits for an operator, then the rest.
const FILTERS: [(&str, Option<AlarmStateFilter>); 6] = [
    ("not_normal", Some(AlarmStateFilter::NotNormal)),
    ("unacknowledged", Some(AlarmStateFilter::Unacknowledged)),
    ("active", Some(AlarmStateFilter::Active)),
    ("shelved", Some(AlarmStateFilter::Shelved)),
    ("out_of_service", Some(AlarmStateFilter::OutOfService)),
    ("all", None),
];

/// Shelving times offered (seconds).
const SHELVE_FOR: [(u64, &str); 4] =
    [(900, "15 min"), (3600, "1 hour"), (8 * 3600, "8 hours"), (86_400, "24 hours")];

#[derive(Debug, Default, Deserialize)]
pub struct AlarmsQuery {
    state: Option<String>,
}

/// `GET /console/alarms`.
pub async fn alarms(
    State(c): State<Console>,
    headers: HeaderMap,
    q: Result<Query<AlarmsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    let name = q.ok().and_then(|Query(q)| q.state).unwrap_or_else(|| "not_normal".into());
    let Some((name, filter)) = FILTERS.iter().find(|(n, _)| *n == name).copied() else {
        return Err(ToolError::invalid(
            "state",
            Some(&name),
            FILTERS.map(|f| f.0).join(", "),
            "Unknown alarm filter.",
            "Use the filter links on the alarm page.",
        )
        .into());
    };
    let mut list =
        c.tools.list_alarms(&ListAlarmsArgs { state: filter, limit: Some(1000), ..Default::default() })?;
    // What stands first: active and unacknowledged, active, returned, normal; then by ID.
    let rank = |a: &AlarmInfo| match a.state {
        AlarmState::ActiveUnacknowledged => 0,
        AlarmState::ActiveAcknowledged => 1,
        AlarmState::ReturnedUnacknowledged => 2,
        AlarmState::Normal => 3,
    };
    list.alarms.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.alarm_id.cmp(&b.alarm_id)));
    let n = &list.counts;
    let body = html! {
        h1 { "Alarms" }
        (actions_note(&viewer))
        p #alarm-counts { (n.configured) " configured · " b { (n.active) " active" } " · " (n.unacknowledged) " unacknowledged · " (n.shelved) " shelved · " (n.out_of_service) " out of service" }
        nav.filters {
            @for (f, _) in FILTERS {
                a href={ "/console/alarms?state=" (f) } class=[(name == f).then_some("here")] { (f.replace('_', " ")) }
            }
        }
        @if list.alarms.is_empty() {
            p #alarms-empty { "No alarm in this state."
                @if n.shelved > 0 && name == "not_normal" { " Shelved alarms are not shown here: see " a href="/console/alarms?state=shelved" { "shelved" } "." } }
        }
        @for a in &list.alarms { (card(&viewer, a)) }
    };
    Ok(page(layout(&c, &viewer, "Alarms", "/console/alarms", None, body)))
}

fn actions_note(viewer: &Viewer) -> Markup {
    match viewer {
        Viewer::Open => html! { p.note #actions-disabled { (NO_TOKENS) } },
        Viewer::Signed(s) if !viewer.is_operator() => html! {
            p.note #actions-refused { "You are signed in as " (s.caller.id) " with an agent token: you can look, but only an operator can acknowledge or shelve alarms." }
        },
        Viewer::Signed(_) => html! {},
    }
}

fn card(viewer: &Viewer, a: &AlarmInfo) -> Markup {
    let allowed = viewer.is_operator();
    let id = a.alarm_id.replace('.', "-");
    html! {
        section.card #{ "alarm-" (id) } data-state=(a.state.name()) {
            h2 { (a.alarm_id) " · " span.status { (a.state.name().replace('_', " ")) }
                @if let Some(u) = &a.shelved_until { " · shelved until " (u) }
                @if a.out_of_service { " · out of service" } }
            p { strong { (a.priority.name()) } " · " (a.message) " · "
                @match &a.sensor_id {
                    Some(s) => a href={ "/console/sensors/" (s) } { (s) },
                    None => a href={ "/console/devices/" (a.device_id) } { (a.device_id) },
                } }
            p.muted {
                (a.kind.replace('_', " "))
                @if let Some(l) = a.limit { " at " (number(l)) " " (a.unit) }
                @if let Some(t) = &a.activated_at { " · activated " (t) }
                @if let Some(v) = a.value { " at " (number(v)) }
                @if let Some(b) = &a.acknowledged_by { " · acknowledged by " (b) }
            }
            form.decide method="post" action={ "/console/alarms/" (a.alarm_id) } {
                input type="hidden" name="csrf" value=(viewer.csrf().unwrap_or(""));
                input type="hidden" name="event_id" value=(a.event_id);
                input type="text" name="comment" maxlength=(crate::tools::ALARM_COMMENT_CHARS) placeholder="Comment (a reason to shelve)" disabled[!allowed];
                @if a.state.is_unacknowledged() {
                    button type="submit" name="action" value="acknowledge" id={ "ack-" (id) } disabled[!allowed] { "acknowledge" }
                }
                @if a.shelved_until.is_some() {
                    button type="submit" name="action" value="unshelve" id={ "unshelve-" (id) } disabled[!allowed] { "unshelve" }
                } @else if !a.out_of_service {
                    select name="duration_s" disabled[!allowed] { @for (s, label) in SHELVE_FOR { option value=(s) { (label) } } }
                    button type="submit" name="action" value="shelve" id={ "shelve-" (id) } disabled[!allowed] { "shelve" }
                }
                @if !allowed { span.muted { "Only a signed-in operator can act on alarms." } }
            }
        }
    }
}

#[derive(Deserialize)]
pub struct AlarmAct {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    comment: String,
    duration_s: Option<u64>,
    event_id: Option<u64>,
}

/// `POST /console/alarms/{alarm_id}`: an operator's act, recorded with the name of the
/// operator's token (as the command line and the HTTP API record it).
pub async fn act(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    form: Result<Form<AlarmAct>, axum::extract::rejection::FormRejection>,
) -> Result<Response, ConsoleError> {
    let Ok(Form(form)) = form else {
        return Err(ToolError::invalid(
            "form",
            None,
            "csrf, action, comment, duration_s and event_id, form-encoded",
            "The form did not arrive whole.",
            "Reload the page and try again.",
        )
        .into());
    };
    let session = c.operator(&headers, &form.csrf)?;
    let comment = Some(form.comment.trim().to_string()).filter(|n| !n.is_empty());
    let body = crate::tools::AlarmActBody {
        comment,
        duration_s: form.duration_s.filter(|_| form.action == "shelve"),
        event_id: form.event_id.filter(|_| form.action == "acknowledge"),
    };
    let e = c.tools.act_on_alarm(&session.caller, &id, &form.action, body).await;
    match e.error {
        Some(err) => Err(ConsoleError::Tool(err)),
        None => {
            let mut res = Redirect::to("/console/alarms").into_response();
            *res.status_mut() = StatusCode::SEE_OTHER;
            Ok(res)
        }
    }
}
