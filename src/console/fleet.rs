//! The fleet page (at the hub): every edge node with its state and last birth, its
//! devices, and the IDs two edge nodes both announce (conflicts, served by neither).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{Markup, html};

use super::view::{self, layout, when};
use super::viewer::Viewer;
use super::{Console, ConsoleError, page};
use crate::tools::defs::{DeviceState, DeviceStatus, EdgeNodeStatus};

/// Conflicts the page lists, at most (`list_sensors` lists them all).
const CONFLICTS_SHOWN: usize = 200;

/// `GET /console/fleet`.
pub async fn fleet(State(c): State<Console>, headers: HeaderMap) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    Ok(page(fleet_markup(&c, &viewer)))
}

/// The served devices' statuses by edge node (`group/node`).
fn devices_by_node(devices: &[DeviceStatus]) -> BTreeMap<&str, Vec<&DeviceStatus>> {
    let mut nodes: BTreeMap<&str, Vec<&DeviceStatus>> = BTreeMap::new();
    for d in devices {
        if let Some(e) = &d.edge {
            nodes.entry(e.edge.as_str()).or_default().push(d);
        }
    }
    nodes
}

pub fn fleet_markup(c: &Console, viewer: &Viewer) -> Markup {
    let devices = view::devices(&c.tools);
    let served = devices_by_node(&devices);
    let hub = c.tools.hub();
    let nodes: &[EdgeNodeStatus] = hub.as_ref().map_or(&[], |h| &h.edge_nodes);
    let registry = c.tools.registry();
    let conflicts = registry.conflicts();
    let online = nodes.iter().filter(|n| n.state == "online").count();
    let body = html! {
        h1 { "Fleet" }
        @if hub.is_none() {
            p.muted { "This fieldgate reads its own devices: it is an edge node, not the fleet hub. "
                      "The fleet page shows what a hub hears from its edge nodes." }
        }
        @if let Some(h) = hub.as_ref().filter(|h| h.link != "online") {
            p.st-down { "The hub is not online on a broker (" (h.broker) "): every edge node shows offline."
                @if let Some(e) = &h.link_error { " " (e) } }
        }
        @if hub.is_some() && nodes.is_empty() {
            p.muted { "No edge node has announced a device yet. Edge nodes publishing to the hub's broker "
                      "appear here once their births arrive." }
        } @else if hub.is_some() {
            p { (online) " of " (nodes.len()) " edge nodes online, " (devices.len()) " devices and "
                (registry.sensors().len()) " sensors served." }
            table #fleet {
                thead { tr { th { "Edge node" } th { "State" } th { "Last birth" } th { "Devices online" }
                             th { "Messages" } th { "Gaps" } th { "Rebirths asked" } th { "Dropped" } } }
                tbody {
                    @for e in nodes {
                        @let mine = served.get(e.edge.as_str()).map_or(&[][..], |v| v.as_slice());
                        @let up = mine.iter().filter(|d| d.state == DeviceState::Up).count();
                        tr data-edge=(e.edge) {
                            td { strong { (e.edge) } }
                            @if e.state == "online" {
                                td.st-up { "▲ online" br; span.muted { "since " (when(&e.since)) } }
                            } @else {
                                td.st-down { "▼ offline" br; span.muted {
                                    "since " (when(&e.since))
                                    @if let Some(r) = &e.offline_reason { " (" (reason(r)) ")" } } }
                            }
                            td { @match &e.last_birth { Some(t) => { (when(t)) } None => { span.muted { "none" } } } }
                            td.num { (up) " / " (mine.len()) }
                            td.num { (e.messages) }
                            td.num { (e.gaps) }
                            td.num { (e.rebirths_requested) }
                            td.num { (e.dropped) }
                        }
                        tr { td colspan="8" {
                            @if mine.is_empty() {
                                span.muted { "No device served: " (e.devices) " announced, none born or all in conflict (below)." }
                            } @else {
                                ul.sensors { @for d in mine {
                                    li { a href={ "/console/devices/" (d.device_id) } { (d.device_id) } " "
                                         span.muted { (d.description) } ": " (device_state(d)) }
                                } }
                            }
                        } }
                    }
                }
            }
        }
        @if let Some(n) = hub.as_ref().map(|h| &h.never_born).filter(|n| n.edge_nodes > 0 || n.not_kept > 0 || n.births_refused > 0) {
            h2 { "Heard from, never born" }
            p #never-born { (n.edge_nodes) " edge nodes sent messages but no birth since the hub started ("
                (n.messages) " messages, dropped: nothing is guessed without a birth; each is asked for a rebirth)."
                @if !n.recent.is_empty() { " Last heard: " (n.recent.join(", ")) "." }
                @if n.not_kept > 0 { " " (n.not_kept) " messages of further nodes were only counted (the hub keeps 1,000)." }
                @if n.births_refused > 0 { " " (n.births_refused) " births were refused: the hub takes 10,000 edge nodes (shard the fleet by group)." } }
        }
        @if !conflicts.is_empty() {
            h2 { "Conflicts" }
            p.muted { "IDs announced by more than one edge node. Neither is served until one of them stops announcing it." }
            table #conflicts {
                thead { tr { th { "ID" } th { "Announced by" } } }
                tbody { @for k in conflicts.iter().take(CONFLICTS_SHOWN) { tr { td { (k.id) } td { (k.claimants.join(", "))
                    @if let Some(d) = &k.device { span.muted { " (its device " (d) " is in conflict)" } } } } } }
            }
            @if conflicts.len() > CONFLICTS_SHOWN {
                p.muted { "and " (conflicts.len() - CONFLICTS_SHOWN) " more: list_sensors lists them all." }
            }
        }
    };
    layout(c, viewer, "Fleet", "/console/fleet", None, body)
}

fn reason(r: &str) -> &str {
    match r {
        "death" => "its death message",
        "broker_lost" => "the hub lost the broker",
        "not_born" => "not born since the hub started",
        other => other,
    }
}

fn device_state(d: &DeviceStatus) -> &'static str {
    match d.state {
        DeviceState::Up => "up",
        DeviceState::Degraded => "degraded",
        DeviceState::Down => "down",
        DeviceState::Unknown => "unknown",
    }
}
