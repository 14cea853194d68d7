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
use crate::tools::defs::{DeviceState, DeviceStatus, EdgeStatus};

/// `GET /console/fleet`.
pub async fn fleet(State(c): State<Console>, headers: HeaderMap) -> Result<Response, ConsoleError> {
    let viewer = c.viewer(&headers)?;
    Ok(page(fleet_markup(&c, &viewer)))
}

/// One edge node as its devices' statuses describe it.
struct Node<'a> {
    /// What the first of its devices says of the edge node (they all say the same).
    edge: &'a EdgeStatus,
    devices: Vec<&'a DeviceStatus>,
}

/// The devices' statuses by edge node (`group/node`), in order.
fn nodes(devices: &[DeviceStatus]) -> BTreeMap<&str, Node<'_>> {
    let mut nodes: BTreeMap<&str, Node> = BTreeMap::new();
    for d in devices {
        if let Some(e) = &d.edge {
            nodes.entry(e.edge.as_str()).or_insert(Node { edge: e, devices: Vec::new() }).devices.push(d);
        }
    }
    nodes
}

pub fn fleet_markup(c: &Console, viewer: &Viewer) -> Markup {
    let devices = view::devices(&c.tools);
    let nodes = nodes(&devices);
    let registry = c.tools.registry();
    let conflicts = registry.conflicts();
    let online = nodes.values().filter(|n| n.edge.edge_state == "online").count();
    let body = html! {
        h1 { "Fleet" }
        @if !c.tools.core().fleet {
            p.muted { "This fieldgate reads its own devices: it is an edge node, not the fleet hub. "
                      "The fleet page shows what a hub hears from its edge nodes." }
        } @else if nodes.is_empty() {
            p.muted { "No edge node has announced a device yet. Edge nodes publishing to the hub's broker "
                      "appear here once their births arrive." }
        } @else {
            p { (online) " of " (nodes.len()) " edge nodes online, " (devices.len()) " devices, "
                (registry.sensors().len()) " sensors." }
            table #fleet {
                thead { tr { th { "Edge node" } th { "State" } th { "Last birth" } th { "Devices online" }
                             th { "Messages" } th { "Gaps" } th { "Rebirths asked" } th { "Dropped" } } }
                tbody {
                    @for (name, n) in &nodes {
                        @let e = n.edge;
                        @let up = n.devices.iter().filter(|d| d.state == DeviceState::Up).count();
                        tr data-edge=(name) {
                            td { strong { (name) } }
                            @if e.edge_state == "online" {
                                td.st-up { "▲ online" br; span.muted { "since " (when(&e.edge_since)) } }
                            } @else {
                                td.st-down { "▼ offline" br; span.muted {
                                    "since " (when(&e.edge_since))
                                    @if let Some(r) = &e.edge_offline_reason { " (" (reason(r)) ")" } } }
                            }
                            td { @match &e.last_birth { Some(t) => { (when(t)) } None => { span.muted { "none" } } } }
                            td.num { (up) " / " (n.devices.len()) }
                            td.num { (e.messages) }
                            td.num { (e.gaps) }
                            td.num { (e.rebirths_requested) }
                            td.num { (e.dropped) }
                        }
                        tr { td colspan="8" { ul.sensors {
                            @for d in &n.devices {
                                li { a href={ "/console/devices/" (d.device_id) } { (d.device_id) } " "
                                     span.muted { (d.description) } ": " (device_state(d)) }
                            }
                        } } }
                    }
                }
            }
        }
        @if !conflicts.is_empty() {
            h2 { "Conflicts" }
            p.muted { "IDs announced by more than one edge node. Neither is served until one of them stops announcing it." }
            table #conflicts {
                thead { tr { th { "ID" } th { "Announced by" } } }
                tbody { @for k in conflicts { tr { td { (k.id) } td { (k.claimants.join(", ")) } } } }
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
