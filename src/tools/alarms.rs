//! `list_alarms`, `get_alarm_history`, `get_alarm_summary`, and the operators' acts on an
//! alarm (acknowledge, shelve, unshelve, out of service, back in service): the edge of
//! `alarms/`. Arguments are checked here, the journal's failures and refusals become the
//! contract's errors, and instances and transitions are rendered into the contract's types.
//! The agent's tools only read; an act needs the operator role.

use std::sync::Arc;

use chrono::Utc;

use super::defs::{
    AlarmCounts, AlarmEvent, AlarmHistoryData, AlarmInfo, AlarmStateFilter, AlarmSummaryData,
    GetAlarmHistoryArgs, GetAlarmSummaryArgs, ListAlarmsArgs, ListAlarmsData, ReadingAlarm,
};
use super::envelope::{ErrorCode, ToolError, cut};
use super::validate::registered_sensor;
use super::{Caller, ToolResult, View, to_data, when};
use crate::alarms::conditions::ServerAckError;
use crate::alarms::summary::{self, Options};
use crate::alarms::{ActError, Alarms, Entry, Watch};
use crate::driver::opcua::conditions::AckFailed;
use crate::store::alarm_journal::{Act, AlarmState, Event, Instance, JournalError, Refusal};

/// The longest an alarm may be shelved (7 days): shelving is for a known, passing cause.
pub const MAX_SHELVE_S: u64 = 7 * 86_400;
/// The most characters an operator's comment may have.
pub const COMMENT_CHARS: usize = 500;
/// The longest range `get_alarm_summary` covers.
const MAX_SUMMARY_MS: i64 = 31 * 86_400_000;
/// The most transitions a summary reads (a range holding more is refused).
const MAX_SUMMARY_EVENTS: usize = 2_000_000;

fn engine(view: &View) -> Result<Arc<Alarms>, ToolError> {
    view.core.alarms.clone().ok_or_else(ToolError::storage_unavailable)
}

fn journal_error(e: JournalError) -> ToolError {
    match e {
        JournalError::Db(_) => ToolError::storage_unavailable(),
        other => {
            tracing::error!(error = %other, "alarm journal failed");
            ToolError::internal()
        }
    }
}

fn rfc3339(ms: i64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// An alarm and its instance as the contract shows them.
fn info(view: &View, entry: &Entry, i: &Instance) -> AlarmInfo {
    let registry = &view.core.registry;
    AlarmInfo {
        alarm_id: entry.id.clone(),
        sensor_id: entry.sensor_id(registry),
        device_id: entry.device_id(registry),
        edge: match &entry.watch {
            Watch::Remote(r) => Some(r.edge.clone()),
            _ => None,
        },
        kind: entry.kind().to_string(),
        priority: entry.priority,
        message: entry.message.clone(),
        limit: entry.limit(),
        deadband: entry.deadband(),
        unit: entry.unit(registry),
        state: i.state,
        event_id: i.event_id,
        since: (i.event_id > 0 || i.out_of_service).then(|| rfc3339(i.since_ms)).flatten(),
        activated_at: i.activated_ms.and_then(rfc3339),
        value: i.value,
        acknowledged_by: i.acknowledged_by.clone(),
        acknowledged_at: i.acknowledged_ms.and_then(rfc3339),
        shelved_until: i.shelved_until_ms.and_then(rfc3339),
        shelved_by: i.shelved_by.clone(),
        out_of_service: i.out_of_service,
    }
}

fn matches(filter: AlarmStateFilter, i: &Instance) -> bool {
    use AlarmStateFilter as F;
    let shelved = i.shelved_until_ms.is_some();
    match filter {
        F::Active => i.state.is_active(),
        F::Unacknowledged => i.state.is_unacknowledged(),
        F::NotNormal => i.state != AlarmState::Normal && !shelved && !i.out_of_service,
        F::Normal => i.state == AlarmState::Normal,
        F::ActiveUnacknowledged => i.state == AlarmState::ActiveUnacknowledged,
        F::ActiveAcknowledged => i.state == AlarmState::ActiveAcknowledged,
        F::ReturnedUnacknowledged => i.state == AlarmState::ReturnedUnacknowledged,
        F::Shelved => shelved,
        F::OutOfService => i.out_of_service,
    }
}

const PAGING: super::cursor::Paging =
    super::cursor::Paging { this: "the same listing", other: "a listing with other filters" };

/// A sensor's alarm state as its readings carry it; `None` for a sensor without alarms.
pub(crate) fn reading_alarm(view: &View, sensor: &crate::registry::Sensor) -> Option<ReadingAlarm> {
    let alarms = view.core.alarms.as_ref()?;
    // The sensor at that place is this one (a renewed hub registry places others there);
    // at the hub, the edges' alarms on it.
    let (entry, standing) = alarms
        .of_sensor(sensor.place.sensor)
        .filter(|(e, _)| e.id.starts_with(sensor.id.as_str()))
        .or_else(|| alarms.of_remote_sensor(sensor.id.as_str()))?;
    Some(match standing {
        Some(i) => {
            ReadingAlarm { state: i.state, alarm_id: Some(i.alarm_id), priority: Some(entry.priority) }
        }
        None => ReadingAlarm { state: AlarmState::Normal, alarm_id: None, priority: None },
    })
}

impl super::ToolService {
    /// `list_alarms`, typed, outside the agent's pipeline (the console's alarm page).
    pub fn list_alarms(&self, args: &ListAlarmsArgs) -> Result<ListAlarmsData, ToolError> {
        list(&self.view(), args)
    }
}

/// Where a page of `list_alarms` ended: the last alarm ID shown (a cursor is an object:
/// the codec flattens it beside the query's fingerprint).
#[derive(serde::Serialize, serde::Deserialize)]
struct ListCursor {
    a: String,
}

/// `list_alarms`, typed.
pub(crate) fn list(view: &View, args: &ListAlarmsArgs) -> Result<ListAlarmsData, ToolError> {
    let registry = &view.core.registry;
    let sensor = match &args.sensor_id {
        Some(raw) => Some(registered_sensor("sensor_id", raw, registry)?.id.clone()),
        None => None,
    };
    let alarms = engine(view)?;
    let f = super::cursor::fingerprint(
        &serde_json::to_string(&(&args.state, &args.priority, &args.plant, &args.zone, &args.sensor_id))
            .unwrap_or_default(),
    );
    let after: Option<String> = match &args.cursor {
        Some(c) => Some(super::cursor::decode::<ListCursor>(c, f, &PAGING)?.a),
        None => None,
    };
    let listing = alarms.listing();
    let mut counts = AlarmCounts { configured: listing.len(), ..AlarmCounts::default() };
    for (_, i) in &listing {
        counts.active += usize::from(i.state.is_active());
        counts.unacknowledged += usize::from(i.state.is_unacknowledged());
        counts.shelved += usize::from(i.shelved_until_ms.is_some());
        counts.out_of_service += usize::from(i.out_of_service);
    }
    let mut matching: Vec<(&Entry, &Instance)> = listing
        .iter()
        .map(|(e, i)| (e.as_ref(), i))
        .filter(|(e, i)| {
            let place = e.plant_zone(registry);
            args.state.is_none_or(|f| matches(f, i))
                && args.priority.is_none_or(|p| e.priority == p)
                && args.plant.as_deref().is_none_or(|p| place.as_ref().is_some_and(|(x, _)| x == p))
                && args.zone.as_deref().is_none_or(|z| place.as_ref().is_some_and(|(_, x)| x == z))
                && sensor.as_ref().is_none_or(|id| e.sensor_id(registry).as_deref() == Some(id.as_str()))
        })
        .collect();
    matching.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    let total = matching.len();
    let limit = args.limit.unwrap_or(ListAlarmsArgs::DEFAULT_LIMIT) as usize;
    let mut page: Vec<(&Entry, &Instance)> = matching
        .into_iter()
        .filter(|(e, _)| after.as_ref().is_none_or(|a| e.id.as_str() > a.as_str()))
        .collect();
    let more = page.len() > limit;
    page.truncate(limit);
    let next_cursor = if more {
        page.last().map(|(e, _)| super::cursor::encode(ListCursor { a: e.id.clone() }, f))
    } else {
        None
    };
    Ok(ListAlarmsData {
        alarms: page.into_iter().map(|(e, i)| info(view, e, i)).collect(),
        total,
        counts,
        complete: next_cursor.is_none(),
        next_cursor,
    })
}

fn event(e: Event) -> AlarmEvent {
    AlarmEvent {
        at: rfc3339(e.at_ms).unwrap_or_default(),
        alarm_id: e.alarm_id,
        event_id: e.event_id,
        kind: e.kind,
        value: e.value,
        by: e.by,
        comment: e.comment,
        priority: e.priority,
        activated_at: e.activated_ms.and_then(rfc3339),
        shelved_until: e.until_ms.and_then(rfc3339),
        shelved: e.shelved,
    }
}

/// Where a page of the journal ended, and the range the first page resolved.
#[derive(serde::Serialize, serde::Deserialize)]
struct HistoryCursor {
    at: i64,
    seq: u64,
    from: i64,
    to: i64,
}

/// `get_alarm_history`, typed.
pub(crate) fn history(view: &View, args: &GetAlarmHistoryArgs) -> Result<AlarmHistoryData, ToolError> {
    let sensor = match &args.sensor_id {
        Some(raw) => Some(registered_sensor("sensor_id", raw, &view.core.registry)?.id.to_string()),
        None => None,
    };
    let alarms = engine(view)?;
    // An alarm no device file configures (any more) is named as such, with the nearest.
    if let Some(id) = args.alarm_id.as_deref().filter(|id| alarms.get(id).is_none()) {
        return Err(alarm_not_found(&alarms, id));
    }
    let f = super::cursor::fingerprint(
        &serde_json::to_string(&(&args.from, &args.to, &args.alarm_id, &args.sensor_id)).unwrap_or_default(),
    );
    let now = Utc::now().timestamp_millis();
    let cursor: Option<HistoryCursor> = match &args.cursor {
        Some(c) => Some(super::cursor::decode(c, f, &PAGING)?),
        None => None,
    };
    let (from, to) = match &cursor {
        Some(c) => (c.from, c.to),
        None => when::range(&args.from, args.to.as_deref(), now)?,
    };
    let wanted = |e: &Event| {
        args.alarm_id.as_deref().is_none_or(|a| e.alarm_id == a)
            && sensor.as_deref().is_none_or(|s| e.alarm_id.split('.').next() == Some(s))
    };
    let limit = args.limit.unwrap_or(GetAlarmHistoryArgs::DEFAULT_LIMIT) as usize;
    let mut after = cursor.map(|c| (c.at, c.seq));
    let mut events: Vec<Event> = Vec::new();
    // Read on until the page is full (filters drop some) or the range ends; one more than
    // the page says whether more follow.
    loop {
        let read = alarms.journal().events(from, to, after, 1000).map_err(journal_error)?;
        let ended = read.len() < 1000;
        after = read.last().map(|e| (e.at_ms, e.seq)).or(after);
        events.extend(read.into_iter().filter(|e| wanted(e)));
        if ended || events.len() > limit {
            break;
        }
    }
    let more = events.len() > limit;
    events.truncate(limit);
    let next_cursor = match events.last() {
        Some(e) if more => {
            Some(super::cursor::encode(HistoryCursor { at: e.at_ms, seq: e.seq, from, to }, f))
        }
        _ => None,
    };
    Ok(AlarmHistoryData {
        from: rfc3339(from).unwrap_or_default(),
        to: rfc3339(to).unwrap_or_default(),
        events: events.into_iter().map(event).collect(),
        complete: next_cursor.is_none(),
        next_cursor,
    })
}

/// `get_alarm_summary`, typed.
pub(crate) fn summary(view: &View, args: &GetAlarmSummaryArgs) -> Result<AlarmSummaryData, ToolError> {
    let alarms = engine(view)?;
    let now = Utc::now().timestamp_millis();
    let (from, to) = when::range(&args.from, args.to.as_deref(), now)?;
    if to - from > MAX_SUMMARY_MS {
        return Err(ToolError::invalid(
            "from",
            Some(&args.from),
            "at most 31 days before `to`",
            "A summary covers at most 31 days.",
            "Ask for a shorter range, such as -8h (a shift) or -7d.",
        ));
    }
    let events = alarms.journal().events(from, to, None, MAX_SUMMARY_EVENTS + 1).map_err(journal_error)?;
    let later = alarms.journal().events(to, i64::MAX, None, MAX_SUMMARY_EVENTS + 1).map_err(journal_error)?;
    if events.len() > MAX_SUMMARY_EVENTS || later.len() > MAX_SUMMARY_EVENTS {
        return Err(ToolError::invalid(
            "from",
            Some(&args.from),
            "a range with at most 2,000,000 alarm transitions in it and after it",
            "The journal holds too many transitions for one summary of this range.",
            "Ask for a shorter or more recent range.",
        ));
    }
    let instances: Vec<Instance> = alarms.listing().into_iter().map(|(_, i)| i).collect();
    let standing = summary::standing_at(to, &instances, &later);
    let o = Options {
        top: args.top.map_or(10, |t| t as usize),
        flood_threshold: args.flood_threshold.map_or(10, |t| t as usize),
        ..Options::default()
    };
    Ok(AlarmSummaryData {
        from: rfc3339(from).unwrap_or_default(),
        to: rfc3339(to).unwrap_or_default(),
        alarms_configured: alarms.count(),
        figures: summary::summarize(&events, &standing, from, to, o),
    })
}

/// What an operator sends with an act (`POST /v1/alarms/{alarm_id}/{action}`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActBody {
    /// Why (a shelving and taking out of service need one).
    pub comment: Option<String>,
    /// Shelve: for how long, 1 s to 7 days.
    pub duration_s: Option<u64>,
    /// Acknowledge: the event seen, so a newer activation is not acknowledged unseen.
    pub event_id: Option<u64>,
}

impl ActBody {
    /// The body of an act as it came over HTTP: empty, or the JSON object.
    pub fn from_json(body: &[u8]) -> Result<ActBody, ToolError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(ActBody::default());
        }
        let not_an_act = || {
            ToolError::invalid(
                "body",
                None,
                "a JSON object with comment (text), duration_s and event_id (integers), each optional",
                "The request body is not an alarm act.",
                "Send e.g. {\"comment\": \"seen\"}, or {\"comment\": \"known cause\", \"duration_s\": 3600} to shelve.",
            )
        };
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(body) else {
            return Err(not_an_act());
        };
        // Each field named when it is the wrong one or of the wrong type.
        for (name, value) in &fields {
            let received = serde_json::to_string(value).unwrap_or_default();
            let expected = match name.as_str() {
                "comment" if value.is_string() || value.is_null() => continue,
                "duration_s" | "event_id" if value.as_u64().is_some() || value.is_null() => continue,
                "comment" => "text",
                "duration_s" => "a whole number of seconds, 1 to 604800 (7 days)",
                "event_id" => "a whole number: the event's ID as list_alarms shows it",
                _ => {
                    let mut e = ToolError::invalid(
                        name.as_str(),
                        None,
                        "comment, duration_s or event_id",
                        format!("An alarm act takes no `{}`.", cut(name)),
                        "Send only comment, duration_s (shelve) and event_id (acknowledge).",
                    );
                    e.suggestions = crate::suggest::closest(name, ["comment", "duration_s", "event_id"])
                        .map(str::to_string)
                        .into_iter()
                        .collect();
                    return Err(e);
                }
            };
            return Err(ToolError::invalid(
                name.as_str(),
                Some(&received),
                expected,
                format!("`{name}` must be {expected}."),
                "Send e.g. {\"comment\": \"known cause\", \"duration_s\": 3600} to shelve.",
            ));
        }
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|_| not_an_act())
    }
}

/// The acts, as named on every wire.
pub const ACTIONS: [&str; 5] = ["acknowledge", "shelve", "unshelve", "out_of_service", "in_service"];

fn alarm_not_found(alarms: &Alarms, id: &str) -> ToolError {
    let ids = alarms.ids();
    let mut e = ToolError::new(
        ErrorCode::AlarmNotFound,
        format!("No alarm {} is configured.", cut(id)),
        "Call list_alarms to see the configured alarms.",
    )
    .with_suggestions(
        crate::suggest::closest(id, ids.iter().map(String::as_str)).map(str::to_string).into_iter().collect(),
    );
    e.parameter = Some("alarm_id".into());
    e.received = Some(cut(id));
    e
}

fn refused(id: &str, r: Refusal) -> ToolError {
    let (message, hint) = match r {
        Refusal::NothingToAcknowledge => {
            (format!("Alarm {id} has nothing to acknowledge."), "list_alarms shows its state.")
        }
        Refusal::OtherEvent { current } => (
            format!("Alarm {id} is at event {current} now, not the event_id sent."),
            "Look at the alarm again (a newer activation came) and acknowledge what you see.",
        ),
        Refusal::NotShelved => (format!("Alarm {id} is not shelved."), "list_alarms shows its state."),
        Refusal::OutOfService => {
            (format!("Alarm {id} is out of service."), "Put it back in service first (in_service).")
        }
        Refusal::InService => (format!("Alarm {id} is in service."), "list_alarms shows its state."),
    };
    ToolError::new(ErrorCode::InvalidState, message, hint)
}

/// A server that did not take an acknowledgement of its condition.
fn server_refused(id: &str, e: AckFailed) -> ToolError {
    match e {
        AckFailed::Stale => ToolError::new(
            ErrorCode::InvalidState,
            format!("The OPC UA server has a newer event of alarm {id} (or it was acknowledged there)."),
            "Look at the alarm again and acknowledge what you see.",
        ),
        AckFailed::Unavailable => ToolError::new(
            ErrorCode::DeviceUnavailable,
            format!("The OPC UA server of alarm {id} cannot be reached now; the alarm is not acknowledged."),
            "Try again when the device answers (get_device_status shows it).",
        ),
        AckFailed::Other(code) => ToolError::new(
            ErrorCode::DeviceRejected,
            format!("The OPC UA server refused to acknowledge alarm {id} ({code})."),
            "Acknowledge it on the server's own console, or ask its administrator.",
        ),
    }
}

/// An operator's act on an alarm, journaled before it answers with the alarm as it is
/// then. Only the operator role may.
pub(crate) async fn act(
    view: &View,
    caller: &Caller,
    alarm_id: &str,
    action: &str,
    body: ActBody,
) -> ToolResult {
    if !caller.is_operator() {
        return Err(ToolError::new(
            ErrorCode::Forbidden,
            "Only an operator can acknowledge, shelve or take an alarm out of service.",
            "Report the alarm; a person acts on it in the console.",
        ));
    }
    let alarms = engine(view)?;
    let Some((entry, _)) = alarms.get(alarm_id) else { return Err(alarm_not_found(&alarms, alarm_id)) };
    if let Some(c) = body.comment.as_deref() {
        super::validate::text::check("comment", c)?;
        if c.chars().count() > COMMENT_CHARS {
            return Err(ToolError::invalid(
                "comment",
                Some(&cut(c)),
                format!("at most {COMMENT_CHARS} characters"),
                format!("The comment has {} characters.", c.chars().count()),
                format!("Shorten the comment to {COMMENT_CHARS} characters or fewer."),
            ));
        }
    }
    let comment = body.comment.as_deref().map(str::trim).filter(|c| !c.is_empty());
    let needs_reason = |what: &str| {
        ToolError::invalid(
            "comment",
            None,
            "a reason, 1-500 characters",
            format!("{what} needs a reason in `comment`."),
            "Say why, e.g. \"transmitter being replaced, work order WO-000123\".",
        )
    };
    let stray = match action {
        "acknowledge" => body.duration_s.map(|_| "duration_s"),
        "shelve" => body.event_id.map(|_| "event_id"),
        "unshelve" | "out_of_service" | "in_service" => {
            body.duration_s.map(|_| "duration_s").or(body.event_id.map(|_| "event_id"))
        }
        _ => None,
    };
    if let Some(field) = stray {
        return Err(ToolError::invalid(
            field,
            None,
            format!("no {field} with {action}"),
            format!("`{action}` takes no `{field}`."),
            "Send duration_s only to shelve, and event_id only to acknowledge.",
        ));
    }
    let now = Utc::now().timestamp_millis();
    let what = match action {
        "acknowledge" => Act::Acknowledge { event_id: body.event_id },
        "shelve" => {
            let Some(d) = body.duration_s.filter(|d| (1..=MAX_SHELVE_S).contains(d)) else {
                return Err(ToolError::invalid(
                    "duration_s",
                    body.duration_s.map(|d| d.to_string()).as_deref(),
                    "1 to 604800 seconds (7 days)",
                    "Shelving needs `duration_s`, from 1 second to 7 days.",
                    "Shelve for as long as the known cause lasts, e.g. 3600.",
                ));
            };
            if comment.is_none() {
                return Err(needs_reason("Shelving"));
            }
            Act::Shelve { until_ms: now + (d as i64) * 1000 }
        }
        "unshelve" => Act::Unshelve,
        "out_of_service" if comment.is_none() => return Err(needs_reason("Taking an alarm out of service")),
        "out_of_service" => Act::OutOfService,
        "in_service" => Act::InService,
        other => {
            return Err(ToolError::invalid(
                "action",
                Some(other),
                ACTIONS.join(", "),
                "Unknown action.",
                "Use one of the listed actions.",
            ));
        }
    };
    if let Watch::Remote(r) = &entry.watch {
        let edge = &r.edge;
        return Err(ToolError::new(
            ErrorCode::InvalidState,
            format!("Alarm {alarm_id} is evaluated on edge node {edge}; the hub lists it, and acts on none."),
            "Act on it where it is evaluated: its edge's console, HTTP API or command line.",
        ));
    }
    let done = if let (Act::Acknowledge { event_id }, Watch::Condition { .. }) = (&what, &entry.watch) {
        // A server's condition is acknowledged on its server first.
        match alarms.acknowledge_on_server(alarm_id, *event_id, &caller.id, comment).await {
            Ok(i) => Ok(i),
            Err(ServerAckError::Act(e)) => Err(e),
            Err(ServerAckError::Server(e)) => return Err(server_refused(alarm_id, e)),
        }
    } else {
        let (id, by, comment) = (alarm_id.to_string(), caller.id.clone(), comment.map(str::to_string));
        let engine = alarms.clone();
        tokio::task::spawn_blocking(move || engine.operate(&id, &what, now, Some(&by), comment.as_deref()))
            .await
            .map_err(|_| ToolError::internal())?
    };
    let instance = match done {
        Ok(i) => i,
        Err(ActError::NotFound(id)) => return Err(alarm_not_found(&alarms, &id)),
        Err(ActError::Journal(JournalError::Refused { refusal, .. })) => {
            return Err(refused(alarm_id, refusal));
        }
        Err(ActError::Journal(e)) => return Err(journal_error(e)),
    };
    tracing::info!(
        target: "audit",
        event = "operator_alarm_act",
        caller = caller.id.as_str(),
        alarm = alarm_id,
        action,
        outcome = "success",
        "alarm acted on"
    );
    to_data(&super::defs::AlarmData { alarm: info(view, &entry, &instance) })
}
