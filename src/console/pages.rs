//! The pages of the plant: the layout every page shares, the overview (plants → zones →
//! devices and their sensors), a device's page (its sensors with a sparkline of the last
//! hour) and a sensor's page (its history chart).

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;

use super::chart::{self, Chart};
use super::view::{self, device_cells, layout, sensor_value};
use super::viewer::Viewer;
use super::{Console, ConsoleError, page};
use crate::registry::Sensor;
use crate::tools::ToolError;
use crate::tools::defs::{DeviceStatus, GetDeviceStatusArgs, GetSensorHistoryArgs};

/// `GET /console`: every plant, zone and device, with each sensor's live value.
pub async fn overview(State(c): State<Console>, headers: HeaderMap) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    Ok(page(overview_markup(&c, &viewer)))
}

pub fn overview_markup(c: &Console, viewer: &Viewer) -> Markup {
    let tools = &c.tools;
    let registry = tools.registry();
    let devices = view::devices(tools);
    let readings: Vec<_> = registry.sensors().iter().map(|s| tools.cached_reading(s)).collect();
    let status = |id: &str| devices.iter().find(|d| d.device_id == id);
    let body = html! {
        h1 { "Plant overview" }
        div.attention #attention { (view::attention(tools, &devices, &readings)) }
        @for plant in registry.plants() {
            h2 { "Plant " (plant) }
            @for zone in registry.zones().iter().filter(|z| registry.devices().iter().any(|d| &d.plant == plant && &d.zone == *z)) {
                section.zone {
                    h3 { "Zone " (zone) }
                    table {
                        thead { tr { th { "Device" } th { "State" } th { "Breaker" } th { "Last error" } th { "Latency" } th { "Last contact" } } }
                        tbody {
                            @for d in registry.devices().iter().filter(|d| &d.plant == plant && &d.zone == zone) {
                                @if let Some(s) = status(d.id.as_str()) { tr #{ "dev-" (d.id) } { (device_cells(s)) } }
                                tr { td colspan="6" { ul.sensors {
                                    @for s in registry.sensors_of_device(&d.id) {
                                        li { a href={ "/console/sensors/" (s.id) } { (s.id) } " " span.muted { (s.description) } ": "
                                             span #{ "sen-" (s.id) } { (sensor_value(s, readings[s.place.sensor].as_ref())) } }
                                    }
                                } } }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(c, viewer, "Overview", "/console", Some("/console/live"), body)
}

/// A bucket of `secs` seconds as `get_sensor_history` takes it: a count of at most four
/// digits and a unit (`90s`, `1440m`, `168h`, `365d`); `secs` a whole number of that unit
/// ([`bucket_secs`] rounds to one).
fn bucket_text(secs: i64) -> String {
    match secs {
        s if s <= 9999 => format!("{s}s"),
        s if s / 60 <= 9999 => format!("{}m", s / 60),
        s if s / 3600 <= 9999 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// About [`BUCKETS`] buckets over `span_ms`, rounded up to a whole number of the unit
/// [`bucket_text`] writes it in.
fn bucket_secs(span_ms: i64) -> i64 {
    let s = (span_ms / BUCKETS / 1000).max(1);
    let unit = match s {
        s if s <= 9999 => 1,
        s if s / 60 < 9999 => 60,
        s if s / 3600 < 9999 => 3600,
        _ => 86_400,
    };
    (s + unit - 1) / unit * unit
}

/// The `get_sensor_history` arguments of a sensor's chart over `[from, to)` in buckets of
/// `bucket_s` seconds.
fn chart_args(s: &Sensor, from: &str, to: Option<&str>, bucket_s: i64) -> GetSensorHistoryArgs {
    GetSensorHistoryArgs {
        sensor_id: s.id.to_string(),
        from: from.to_string(),
        to: to.map(str::to_string),
        bucket: Some(bucket_text(bucket_s)),
        limit: Some(5000),
        cursor: None,
    }
}

/// `GET /console/devices/{id}`: the device's state and its sensors.
pub async fn device(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    let data = c.tools.device_status(&GetDeviceStatusArgs { device_id: Some(id) })?;
    let Some(d) = data.devices.first() else { return Err(ToolError::internal().into()) };
    Ok(page(device_markup(&c, &viewer, d)))
}

fn device_markup(c: &Console, viewer: &Viewer, d: &DeviceStatus) -> Markup {
    let registry = c.tools.registry();
    let now = chrono::Utc::now().timestamp_millis();
    let sensors: Vec<&Sensor> = match d.device_id.parse::<crate::ids::DeviceId>() {
        Ok(id) => registry.sensors_of_device(&id).collect(),
        Err(_) => Vec::new(),
    };
    // Every sensor's last hour in one call.
    let args: Vec<GetSensorHistoryArgs> = sensors.iter().map(|s| chart_args(s, "-1h", None, 60)).collect();
    let hours = c.tools.histories(&args);
    let body = html! {
        p { a href="/console" { "Overview" } " › " (d.device_id) }
        h1 { (d.device_id) }
        p { (d.description) }
        p.muted { (d.protocol) " at " code { (d.endpoint) } " · " (d.failures) " failed reads since start" }
        table {
            thead { tr { th { "Device" } th { "State" } th { "Breaker" } th { "Last error" } th { "Latency" } th { "Last contact" } } }
            tbody { tr #{ "dev-" (d.device_id) } { (device_cells(d)) } }
        }
        h2 { "Sensors" }
        table {
            thead { tr { th { "Sensor" } th { "Live value" } th { "Normal range" } th { "Last hour" } } }
            tbody {
                @for (s, hour) in sensors.iter().zip(&hours) {
                    tr {
                        td { a href={ "/console/sensors/" (s.id) } { (s.id) } br; span.muted { (s.description) } }
                        td #{ "sen-" (s.id) } { (sensor_value(s, c.tools.cached_reading(s).as_ref())) }
                        td { @match s.range { Some(r) => { (r.min) " – " (r.max) " " (s.unit) } None => { span.muted { "–" } } } }
                        td { @match hour {
                            Ok(h) => { (chart::sparkline(&h.buckets, now - 3_600_000, now)) }
                            Err(_) => { span.muted { "–" } }
                        } }
                    }
                }
            }
        }
    };
    layout(c, viewer, &d.device_id, "", Some("/console/live"), body)
}

/// The range of a sensor page: `range=1h|24h|7d`, or `from` (and `to`) as the tool takes them.
#[derive(Debug, Default, Deserialize)]
pub struct RangeQuery {
    pub range: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// The ranges offered as links.
const RANGES: [(&str, i64); 3] = [("1h", 3_600_000), ("24h", 86_400_000), ("7d", 7 * 86_400_000)];
/// Buckets in a chart, about.
const BUCKETS: i64 = 120;

/// `GET /console/sensors/{id}`: the sensor and its history chart.
pub async fn sensor(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<RangeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    let Query(q) = q.map_err(|_| {
        ToolError::invalid(
            "query",
            None,
            "range=1h|24h|7d, or from and to",
            "The query string does not decode.",
            "Use the range links on the sensor page.",
        )
    })?;
    Ok(page(sensor_markup(&c, &viewer, &id, &q)?))
}

pub fn sensor_markup(c: &Console, viewer: &Viewer, id: &str, q: &RangeQuery) -> Result<Markup, ConsoleError> {
    let registry = c.tools.registry();
    let Some(s) = registry.sensor_named(id) else {
        // The tool's own answer for an unknown ID, with its suggestions.
        let args = GetSensorHistoryArgs {
            sensor_id: id.to_string(),
            from: "-1h".into(),
            to: None,
            bucket: None,
            limit: None,
            cursor: None,
        };
        c.tools.sensor_history(&args)?;
        return Err(ToolError::internal().into());
    };
    let now = chrono::Utc::now().timestamp_millis();
    let custom = q.from.as_deref().filter(|f| !f.is_empty());
    if custom.is_none() && q.to.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(ToolError::invalid(
            "from",
            None,
            "a start such as -6h or 2026-11-30T08:00:00Z",
            "A custom range needs a start (from) as well as an end (to).",
            "Fill in from.",
        )
        .into());
    }
    let chosen = q.range.as_deref().filter(|_| custom.is_none()).unwrap_or("1h");
    let (from_text, to_text, from, to) = match custom {
        Some(f) => {
            let to_raw = q.to.as_deref().filter(|t| !t.is_empty());
            let from = crate::tools::when::instant("from", f, now)?;
            let to = match to_raw {
                Some(t) => crate::tools::when::instant("to", t, now)?,
                None => now,
            };
            (f.to_string(), to_raw.map(str::to_string), from, to)
        }
        None => {
            let Some((_, span)) = RANGES.iter().find(|(name, _)| *name == chosen) else {
                return Err(ToolError::invalid(
                    "range",
                    Some(chosen),
                    "1h, 24h or 7d",
                    "Unknown range.",
                    "Use the range links on the sensor page.",
                )
                .into());
            };
            (format!("-{chosen}"), None, now - span, now)
        }
    };
    let bucket_s = bucket_secs(to.saturating_sub(from));
    let h = c.tools.sensor_history(&chart_args(s, &from_text, to_text.as_deref(), bucket_s))?;
    let device = registry.device_of(s);
    let gaps = h.gaps.iter().filter_map(|g| Some((chart::ms(&g.from)?, chart::ms(&g.to)?))).collect();
    let chart = Chart {
        from,
        to,
        bucket_ms: bucket_s * 1000,
        range: s.range.map(|r| (r.min, r.max)),
        unit: s.unit.clone(),
        gaps,
    };
    let reading = c.tools.cached_reading(s);
    let body = html! {
        p { a href="/console" { "Overview" } " › " a href={ "/console/devices/" (device.id) } { (device.id) } " › " (s.id) }
        h1 { (s.id) }
        p { (s.description) }
        p.muted { (s.kind) " in " (s.unit)
            @if let Some(e) = &s.equipment { " · equipment " (e) }
            @if let Some(r) = s.range { " · normal range " (r.min) " – " (r.max) " " (s.unit) } }
        p { "Now: " span #{ "sen-" (s.id) } { (sensor_value(s, reading.as_ref())) } }
        nav.ranges {
            @for (name, _) in RANGES {
                a href={ "/console/sensors/" (s.id) "?range=" (name) } class=[(custom.is_none() && chosen == name).then_some("here")] { "last " (name) }
            }
        }
        form.card method="get" action={ "/console/sensors/" (s.id) } {
            label { "From " input type="text" name="from" value=(custom.unwrap_or("")) placeholder="-6h or 2026-11-30T08:00:00Z"; }
            " " label { "to " input type="text" name="to" value=(to_text.as_deref().unwrap_or("")) placeholder="now"; }
            " " button type="submit" { "Show" }
        }
        (chart.render(&h.buckets))
        p.muted {
            (chart::instant(from)) " to " (chart::instant(to)) ", buckets of " (bucket_s) " s: " (h.buckets.len()) " with data"
            @if !h.gaps.is_empty() { ", " (h.gaps.len()) " gaps without stored points" }
            ". The same data as " code { "get_sensor_history" } " with from=" code { (from_text) }
            @if let Some(t) = &to_text { ", to=" code { (t) } }
            ", bucket=" code { (bucket_text(bucket_s)) } "."
        }
    };
    Ok(layout(c, viewer, s.id.as_str(), "", Some("/console/live"), body))
}

#[cfg(test)]
mod tests {
    use super::{bucket_secs, bucket_text};

    #[test]
    fn buckets_of_any_range_are_written_as_the_history_tool_takes_them() {
        let day = 86_400_000;
        for span in [60_000, 3_600_000, day, 7 * day, 14 * day, 30 * day, 365 * day, 3650 * day, 36_500 * day]
        {
            let secs = bucket_secs(span);
            let text = bucket_text(secs);
            let (count, unit) = text.split_at(text.len() - 1);
            let n: i64 = count.parse().unwrap();
            assert!((1..=9999).contains(&n), "{span} ms: {text}");
            let unit_s = match unit {
                "s" => 1,
                "m" => 60,
                "h" => 3600,
                "d" => 86_400,
                u => panic!("unit {u}"),
            };
            assert_eq!(n * unit_s, secs, "{text} is the bucket used for the chart");
            assert!(span / secs / 1000 <= 120 && span / secs / 1000 >= 60, "{span} ms: {text}");
        }
        assert_eq!(bucket_text(30), "30s");
        assert_eq!(bucket_text(14 * 86_400 / 120 / 60 * 60 + 60), "169m");
    }
}
