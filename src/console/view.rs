//! What the pages show, in pieces the pages and the live stream share: the frame of every
//! page (`layout`), a device's row, a sensor's value, what needs attention and the agent's
//! recent calls, and `snapshot`, every live part at once.

use chrono::{DateTime, SecondsFormat, Utc};
use maud::{DOCTYPE, Markup, html};
use serde_json::json;

use super::Console;
use super::viewer::Viewer;
use crate::registry::Sensor;
use crate::tools::ToolService;
use crate::tools::activity::Call;
use crate::tools::defs::{
    BreakerState, DeviceState, DeviceStatus, GetDeviceStatusArgs, Quality, Reading, Value,
};
use crate::tools::envelope::ErrorCode;

/// Recent calls shown on the activity page.
pub const ACTIVITY_ROWS: usize = 50;

/// The frame of every page: navigation, who is signed in, the live-update state.
pub fn layout(
    c: &Console,
    viewer: &Viewer,
    title: &str,
    here: &str,
    live: Option<&str>,
    body: Markup,
) -> Markup {
    let fleet = c.tools.core().fleet.then_some(("/console/fleet", "Fleet"));
    let nav = [
        Some(("/console", "Overview")),
        fleet,
        Some(("/console/work-orders", "Work orders")),
        Some(("/console/alarms", "Alarms")),
        Some(("/console/activity", "Agent activity")),
    ];
    let nav = nav.into_iter().flatten();
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fieldgate" }
                link rel="stylesheet" href="/console/assets/console.css";
                // No icon: the browser does not ask for /favicon.ico (a 404 on every page).
                link rel="icon" href="data:,";
                script src="/console/assets/console.js" defer {}
            }
            body data-live=[live] {
                header.top {
                    span.brand { "fieldgate" }
                    @for (href, name) in nav {
                        a href=(href) class=[(here == href).then_some("here")] { (name) }
                    }
                    @if live.is_some() { span #live-state .muted { "loading…" } }
                    span.who {
                        @match viewer {
                            Viewer::Open if c.tokens.is_empty() => { "viewing (no tokens configured: actions disabled)" }
                            Viewer::Open => { a href="/console/login" { "Sign in" } }
                            Viewer::Signed(s) => {
                                "signed in as " strong #who { (s.caller.id) } " (" (if s.caller.is_operator() { "operator" } else { "agent" }) ") "
                                form method="post" action="/console/logout" {
                                    input type="hidden" name="csrf" value=(s.csrf);
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
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

/// Every device's status, as `get_device_status` gives it.
pub fn devices(tools: &ToolService) -> Vec<DeviceStatus> {
    tools.device_status(&GetDeviceStatusArgs::default()).map(|d| d.devices).unwrap_or_default()
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
        ErrorCode::EdgeOffline => "offline at its edge node",
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
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Number(n) => number(*n),
        Value::Bool(b) => b.to_string(),
        Value::Text(t) => shown_text(t),
    }
}

/// The most of a text value the console shows (the tools give it whole).
pub const SHOWN_TEXT: usize = 200;

/// A text value as a person reads it: its first `SHOWN_TEXT` characters, and how many
/// more there are.
fn shown_text(t: &str) -> String {
    match t.char_indices().nth(SHOWN_TEXT) {
        Some((at, _)) => format!("{}… ({} more characters)", &t[..at], t[at..].chars().count()),
        None => t.to_string(),
    }
}

/// Whether `r` lies outside its sensor's range, and on which side.
fn out_of_range(r: &Reading) -> Option<&'static str> {
    match (r.in_range, &r.value, r.range) {
        (Some(false), Some(v), Some(range)) if v.as_f64().is_some_and(|v| v > range.max) => {
            Some("▲ ABOVE RANGE")
        }
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
    let registry = tools.registry();
    let sensors = registry.sensors();
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

#[cfg(test)]
mod text_tests {
    use super::*;

    #[test]
    fn a_long_text_value_is_cut_for_people() {
        assert_eq!(value_text(&Value::Text("RYE".into())), "RYE");
        let long = "é".repeat(SHOWN_TEXT + 5);
        assert_eq!(
            value_text(&Value::Text(long)),
            format!("{}… (5 more characters)", "é".repeat(SHOWN_TEXT))
        );
        let exact = "x".repeat(SHOWN_TEXT);
        assert_eq!(value_text(&Value::Text(exact.clone())), exact);
    }
}
