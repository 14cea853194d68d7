//! Live updates: the parts of a page that change (each device's row, each sensor's value,
//! the list of what needs attention, the agent's recent calls), rendered here for the
//! first page and for the stream alike.
//!
//! One task renders a snapshot once a second while any browser listens, from the device
//! status and the reading cache (never a device read), and every open stream sends that
//! same text: ten browsers cost one rendering.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{Markup, html};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Console, typed};
use crate::registry::Sensor;
use crate::tools::ToolService;
use crate::tools::activity::Call;
use crate::tools::defs::{
    BreakerState, DeviceState, DeviceStatus, DeviceStatusData, Quality, Reading, Value,
};
use crate::tools::envelope::ErrorCode;

/// How often the snapshot is rendered while someone listens.
pub const TICK: Duration = Duration::from_secs(1);
/// How often the devices' states are compared with the last snapshot's: a change is
/// sent at once, not at the next second.
const CHECK: Duration = Duration::from_millis(200);
/// Live streams open at once (every browser tab showing a live page holds one): enough for
/// a control room, and a bound on what clients that never read can make the server hold.
pub const MAX_STREAMS: usize = 64;
/// Live streams one viewer holds at most (a signed-in token, or everyone on a server
/// without tokens): one browser, or one token, cannot take every stream.
pub const PER_VIEWER: usize = MAX_STREAMS / 4;
/// Recent calls shown on the activity page.
pub const ACTIVITY_ROWS: usize = 50;

/// The shared snapshot and its rendering task (started by the first stream).
pub struct Live {
    tools: ToolService,
    shutdown: CancellationToken,
    tx: OnceLock<watch::Sender<Arc<str>>>,
}

impl Live {
    pub fn new(tools: ToolService, shutdown: CancellationToken) -> Live {
        Live { tools, shutdown, tx: OnceLock::new() }
    }

    /// A receiver of the snapshots; the first call starts the task.
    fn subscribe(&self) -> watch::Receiver<Arc<str>> {
        let tx = self.tx.get_or_init(|| {
            let (tx, _) = watch::channel(Arc::from(snapshot(&self.tools)));
            let (tools, tx2, stop) = (self.tools.clone(), tx.clone(), self.shutdown.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + CHECK, CHECK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut states, mut sent) = (String::new(), tokio::time::Instant::now());
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    if tx2.receiver_count() == 0 {
                        continue;
                    }
                    // A device's change of state is sent at once; values once a second.
                    let now_states = device_states(&tools);
                    if now_states != states || sent.elapsed() >= TICK {
                        states = now_states;
                        sent = tokio::time::Instant::now();
                        tx2.send_replace(Arc::from(snapshot(&tools)));
                    }
                }
            });
            tx
        });
        tx.subscribe()
    }
}

/// `GET /console/live`: the snapshot now, then every new one, until the server stops.
pub async fn stream(State(c): State<Console>, headers: HeaderMap) -> Response {
    let viewer = match c.viewer(&headers) {
        Ok(v) => v,
        // A stream cannot follow a redirect to the sign-in page: say it plainly.
        Err(super::ConsoleError::SignIn) => {
            return (axum::http::StatusCode::UNAUTHORIZED, "sign in first").into_response();
        }
        Err(e) => return e.into_response(),
    };
    let who = match &viewer {
        super::auth::Viewer::Open => String::new(),
        super::auth::Viewer::Signed(s) => s.caller.id.to_string(),
    };
    let permit = match c.streams.take(who) {
        Ok(p) => p,
        Err(busy) => {
            return (axum::http::StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "30")], busy)
                .into_response();
        }
    };
    let mut rx = c.live.subscribe();
    let first: Arc<str> = Arc::from(snapshot(&c.tools));
    rx.mark_unchanged();
    let stop = c.shutdown.clone();
    // Each event is sent only while the viewer may still look: a stream ends at sign-out
    // or when its session expires.
    let session = super::auth::cookie(&headers, super::auth::SESSION_COOKIE).map(str::to_string);
    let state = (Some(first), rx, stop, c, session, permit);
    let events =
        futures_util::stream::unfold(state, |(first, mut rx, stop, c, session, permit)| async move {
            let text = match first {
                Some(t) => t,
                None => {
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        changed = rx.changed() => changed.ok()?,
                    }
                    rx.borrow_and_update().clone()
                }
            };
            if !c.may_look(session.as_deref()) || !permit.held() {
                return None;
            }
            let event = Event::default().event("snapshot").data(&*text);
            Some((Ok::<_, Infallible>(event), (None, rx, stop, c, session, permit)))
        });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// Every live part, as a JSON object of element IDs and their HTML.
pub fn snapshot(tools: &ToolService) -> String {
    let devices = devices(tools);
    let registry = tools.registry();
    let readings: Vec<Option<Reading>> = registry.sensors().iter().map(|s| tools.cached_reading(s)).collect();
    let mut parts = serde_json::Map::new();
    parts.insert("attention".into(), json!(attention(tools, &devices, &readings).into_string()));
    for d in &devices {
        parts.insert(format!("dev-{}", d.device_id), json!(device_cells(d).into_string()));
    }
    for (s, r) in registry.sensors().iter().zip(&readings) {
        parts.insert(format!("sen-{}", s.id), json!(sensor_value(s, r.as_ref()).into_string()));
    }
    parts.insert("activity".into(), json!(activity_rows(&tools.activity()).into_string()));
    serde_json::Value::Object(parts).to_string()
}

/// The state and breaker of every device, as one string to compare.
fn device_states(tools: &ToolService) -> String {
    devices(tools).iter().map(|d| format!("{:?}{:?};", d.state, d.breaker.state)).collect()
}

/// Every device's status, as `get_device_status` gives it.
pub fn devices(tools: &ToolService) -> Vec<DeviceStatus> {
    typed::<DeviceStatusData>(tools.view(crate::tools::Tool::GetDeviceStatus, &json!({})))
        .map(|d| d.devices)
        .unwrap_or_default()
}

fn parse_time(t: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(t).ok().map(|t| t.with_timezone(&Utc))
}

/// "14:02:03 (5 s ago)".
pub fn when(t: &str) -> String {
    let Some(at) = parse_time(t) else { return t.to_string() };
    let secs = (Utc::now() - at).num_seconds().max(0);
    let ago = match secs {
        0..=119 => format!("{secs} s ago"),
        120..=7199 => format!("{} min ago", secs / 60),
        _ => format!("{} h ago", secs / 3600),
    };
    format!("{} ({ago})", at.to_rfc3339_opts(SecondsFormat::Secs, true).replace('T', " "))
}

/// A device error code in plain words.
pub fn plain(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::DeviceTimeout => "did not answer in time",
        ErrorCode::DeviceUnavailable => "cannot be reached (connection refused or lost)",
        ErrorCode::DeviceBusy => "answered that it is busy",
        ErrorCode::DeviceProtocolError => "answered with a malformed reply",
        ErrorCode::DeviceRejected => "refused the request (an address or node it does not know)",
        ErrorCode::CircuitOpen => "not asked: its breaker is open",
        _ => "failed",
    }
}

fn state_text(s: DeviceState) -> (&'static str, &'static str) {
    match s {
        DeviceState::Up => ("st-up", "▲ UP"),
        DeviceState::Degraded => ("st-degraded", "◆ DEGRADED"),
        DeviceState::Down => ("st-down", "▼ DOWN"),
        DeviceState::Unknown => ("st-unknown", "? UNKNOWN"),
    }
}

/// The cells of a device's row (the row itself, `tr#dev-ID`, is the page's).
pub fn device_cells(d: &DeviceStatus) -> Markup {
    let (class, text) = state_text(d.state);
    let b = &d.breaker;
    html! {
        td { a href={ "/console/devices/" (d.device_id) } { (d.device_id) } br; span.muted { (d.description) } }
        td class=(class) data-state=(format!("{:?}", d.state).to_lowercase()) { (text)
            @if let Some(since) = &d.down_since { br; span.muted { "since " (when(since)) } } }
        td { @match b.state {
                BreakerState::Closed => "closed",
                BreakerState::Open => "OPEN",
                BreakerState::HalfOpen => "half-open (probing)",
            }
            @if b.consecutive_failures == 1 { br; span.muted { "1 failure" } }
            @if b.consecutive_failures > 1 { br; span.muted { (b.consecutive_failures) " failures in a row" } }
            @if let Some(ms) = b.retry_after_ms { br; span.muted { "next probe in " (ms.div_ceil(1000)) " s" } } }
        td { @match &d.last_error {
                Some(e) => { "Device " (plain(e.code)) br; span.muted { (e.code.as_str()) ", " (when(&e.at)) } }
                None => { span.muted { "none" } }
            } }
        td.num { @match &d.latency {
                Some(l) => { (l.p50_ms) " ms" br; span.muted { "p99 " (l.p99_ms) " ms" } }
                None => { span.muted { "–" } }
            } }
        td { @match &d.last_success {
                Some(t) => { (when(t)) }
                None => { span.muted { "never" } }
            } }
    }
}

/// A number for a person: about five significant digits, never in exponent form for
/// plant-sized values, no trailing zeros (`208.72006627` → `208.72`, `1254874.01` →
/// `1254874`).
pub fn number(n: f64) -> String {
    if !n.is_finite() || n == 0.0 {
        return n.to_string();
    }
    let magnitude = n.abs().log10().floor() as i32;
    let decimals = (4 - magnitude).clamp(0, 6) as usize;
    let text = format!("{n:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

/// A value as text.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::Number(n) => number(*n),
        Value::Bool(b) => b.to_string(),
        Value::Text(t) => t.clone(),
    }
}

/// Whether `r` lies outside its sensor's range, and on which side.
fn out_of_range(r: &Reading) -> Option<&'static str> {
    match (r.in_range, &r.value, r.range) {
        (Some(false), Some(Value::Number(v)), Some(range)) if *v > range.max => Some("▲ ABOVE RANGE"),
        (Some(false), _, _) => Some("▼ BELOW RANGE"),
        _ => None,
    }
}

/// A sensor's live value: value and unit, range verdict, quality when not good, age.
pub fn sensor_value(s: &Sensor, r: Option<&Reading>) -> Markup {
    let Some(r) = r else { return html! { span.muted { "no value yet" } } };
    html! {
        @match &r.value {
            Some(v) => { b { (value_text(v)) } " " (s.unit) }
            None => { span.out { "no value" } }
        }
        @if let Some(side) = out_of_range(r) { " " span.out { (side) } }
        @if r.quality != Quality::Good { " " span.out { "quality " (format!("{:?}", r.quality).to_lowercase()) } }
        " " span.muted { "(" (age(r.age_ms)) ")" }
    }
}

fn age(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1000..=119_999 => format!("{} s", ms / 1000),
        _ => format!("{} min", ms / 60_000),
    }
}

/// What needs a person's eyes first: devices not up, sensors out of range or of bad quality.
pub fn attention(tools: &ToolService, devices: &[DeviceStatus], readings: &[Option<Reading>]) -> Markup {
    let troubled: Vec<&DeviceStatus> =
        devices.iter().filter(|d| matches!(d.state, DeviceState::Down | DeviceState::Degraded)).collect();
    let sensors = tools.registry().sensors();
    let odd: Vec<(&Sensor, &Reading)> = sensors
        .iter()
        .zip(readings)
        .filter_map(|(s, r)| r.as_ref().map(|r| (s, r)))
        .filter(|(_, r)| out_of_range(r).is_some() || r.quality == Quality::Bad)
        .collect();
    html! {
        @if troubled.is_empty() && odd.is_empty() {
            p.calm { "Nothing needs attention: every device answers and every sensor is inside its range." }
        } @else {
            div.alarm { strong { "Needs attention" }
            ul {
                @for d in &troubled {
                    li { span class=(state_text(d.state).0) { (state_text(d.state).1) } " "
                         a href={ "/console/devices/" (d.device_id) } { (d.device_id) } " — " (d.description)
                         @if let Some(e) = &d.last_error { ": device " (plain(e.code)) } }
                }
                @for (s, r) in &odd {
                    li { span.out { (out_of_range(r).unwrap_or("BAD QUALITY")) } " "
                         a href={ "/console/sensors/" (s.id) } { (s.id) } " " (s.description) ": "
                         (sensor_value(s, Some(r))) }
                }
            } }
        }
    }
}

/// The agent's recent calls, newest first.
pub fn activity_rows(calls: &[Call]) -> Markup {
    html! {
        @for c in calls.iter().take(ACTIVITY_ROWS) {
            tr {
                td { (c.at.to_rfc3339_opts(SecondsFormat::Millis, true).replace('T', " ")) }
                td { (c.caller) }
                td { (c.tool) }
                td { code { (c.args_text()) } }
                td class=(if c.code == "OK" { "" } else { "out" }) { (c.code) }
                td.num { (c.duration_ms) " ms" }
            }
        }
        @if calls.is_empty() { tr { td colspan="6" .muted { "No tool calls since fieldgate started." } } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_shown_with_about_five_significant_digits() {
        assert_eq!(number(208.72006627105034), "208.72");
        assert_eq!(number(1254874.0114523398), "1254874");
        assert_eq!(number(0.955), "0.955");
        assert_eq!(number(12.19032), "12.19");
        assert_eq!(number(-18.2), "-18.2");
        assert_eq!(number(0.000_123_456), "0.000123");
        assert_eq!(number(35.0), "35");
        assert_eq!(number(0.0), "0");
    }
}
