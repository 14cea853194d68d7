//! The fleet as a Sparkplug B host application sees it, without I/O: every edge node and
//! device, their births and deaths, each edge node's `seq` (gaps wait for the missing
//! message, then a rebirth is asked for), alias maps, and each metric's latest value.
//!
//! The task (`run.rs`) hands every message in ([`Fleet::on_message`]), ticks the clock
//! ([`Fleet::tick`]), and sends the rebirth requests [`Fleet::rebirths`] gives out. The
//! rules (Sparkplug 3.0, the host application's side of each edge node statement):
//! - an NBIRTH starts the edge node afresh: its `bdSeq`, `seq` 0, no device born;
//! - an NDEATH counts only when its `bdSeq` is the current NBIRTH's (an older connection's
//!   will arriving late changes nothing);
//! - a DDEATH counts only when it is not older than the device's DBIRTH;
//! - messages are applied in `seq` order; one that comes early waits up to the reorder
//!   timeout for those before it, then what waits is applied and the edge node is asked
//!   for a rebirth; one that comes late (already passed) is dropped and counted;
//! - data of an edge node, device or alias not born is never guessed at: it is dropped and
//!   a rebirth asked for;
//! - at most one rebirth request per edge node per cooldown; one wanted during the
//!   cooldown goes out when it ends;
//! - historical values go to history only, never to the latest value; so does a value
//!   older than the latest one.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

pub use super::metric::{At, Latest, MetricState, Update};
use crate::spb::payload::Payload;
use crate::spb::topic::Kind;
pub use strangers::{Stranger, Strangers};

/// Messages of one edge node held while one before them is missing, at most: beyond it the
/// reorder timeout is taken as over.
const HELD_MAX: usize = 256;

/// Edge nodes a hub takes: the births of more are dropped (each such node a stranger).
pub const MAX_EDGE_NODES: usize = 10_000;

#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub reorder_timeout: Duration,
    pub rebirth_cooldown: Duration,
}

/// Online since, or offline since and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Online { since: DateTime<Utc> },
    Offline { since: DateTime<Utc>, why: Gone },
}

impl Status {
    pub fn is_online(&self) -> bool {
        matches!(self, Status::Online { .. })
    }
}

/// Why an edge node or device is offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// Its NDEATH (or DDEATH).
    Death,
    /// Its edge node died, or was born again without it.
    EdgeGone,
    /// The hub lost the broker: nothing is known until it is back.
    BrokerLost,
    /// Seen, but never born since the hub started (or since the hub reconnected).
    NotBorn,
}

#[derive(Debug, Clone)]
pub struct DeviceState {
    pub id: String,
    pub status: Status,
    /// The DBIRTH's own time, when born.
    pub birth: Option<DateTime<Utc>>,
    /// Born in its edge node's current life (since its last NBIRTH).
    pub current: bool,
    /// When (the hub's clock) its claim stopped being current: its edge node died, was
    /// born again without it, or the hub lost the broker. `None` while current.
    pub left: Option<DateTime<Utc>>,
    pub metrics: Vec<MetricState>,
    /// Its metrics' indexes in the order of their names (a map of names would hold each
    /// name twice: at a hub of 100,000 sensors, megabytes).
    by_name: Vec<u32>,
}

impl DeviceState {
    /// The metric named `name`, if the device was born with one.
    pub fn metric_named(&self, name: &str) -> Option<&MetricState> {
        self.index_of(name).map(|i| &self.metrics[i])
    }

    /// The index of the metric named `name`.
    pub(super) fn index_of(&self, name: &str) -> Option<usize> {
        let name_at = |&i: &u32| self.metrics.get(i as usize).map_or("", |m| m.name.as_str());
        let k = self.by_name.binary_search_by(|i| name_at(i).cmp(name)).ok()?;
        self.by_name.get(k).map(|&i| i as usize)
    }
}

/// An edge node's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdgeStats {
    pub messages: u64,
    /// `seq` gaps that lasted the reorder timeout.
    pub gaps: u64,
    pub rebirths_requested: u64,
    /// Messages dropped: late (their `seq` already passed), not decodable, without `seq`,
    /// or of a device or alias not born.
    pub dropped: u64,
}

#[derive(Debug, Clone)]
pub struct EdgeState {
    pub group: String,
    pub node: String,
    pub status: Status,
    pub bd_seq: Option<u64>,
    /// The NBIRTH's own time, when born.
    pub birth: Option<DateTime<Utc>>,
    pub devices: Vec<DeviceState>,
    device_index: foldhash::HashMap<String, usize>,
    /// The node's own metrics (`bdSeq`, `Node Control/Rebirth`, any other).
    pub node_metrics: Vec<MetricState>,
    /// The metrics (device, index; `None` for the node's own) each alias was given to: an
    /// alias given to more than one names none of them.
    aliases: foldhash::HashMap<u64, Vec<(Option<usize>, usize)>>,
    pub stats: EdgeStats,
    /// The `seq` the next message must carry; `None` until an NBIRTH.
    expect: Option<u8>,
    /// Messages that came early, by their `seq`.
    held: BTreeMap<u8, Held>,
    gap_since: Option<Instant>,
    last_request: Option<Instant>,
    rebirth_wanted: bool,
    /// Devices born since the fleet last looked (their claims to names are renewed).
    reborn: Vec<usize>,
    /// The names each device claims, as the fleet last recorded them.
    claimed: foldhash::HashMap<usize, Vec<String>>,
}

/// How a device's claim to an ID stands ([`Fleet::standing`]): ordered, the best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    Unknown,
    /// Born in an earlier life of its edge node (or the node is offline): when it stopped
    /// being current (the hub's clock). Two that stopped at the same moment (the hub lost
    /// the broker) stand equal: a conflict stays a conflict.
    Earlier {
        left: Option<DateTime<Utc>>,
    },
    /// Born in its edge node's current life, the node online.
    Current,
}

/// What a message changed beyond values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changed {
    /// Births (or deaths) changed which metrics exist: the catalogue is rebuilt.
    pub catalogue: bool,
}

/// Whom a message is from (its topic).
#[derive(Debug, Clone, Copy)]
pub struct From<'a> {
    pub group: &'a str,
    pub node: &'a str,
    pub kind: Kind,
    pub device: Option<&'a str>,
}

/// When: the monotonic clock (timeouts) and the wall clock (what is shown).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub now: Instant,
    pub wall: DateTime<Utc>,
}

/// A message held for its turn.
#[derive(Debug, Clone)]
struct Held {
    kind: Kind,
    device: Option<String>,
    payload: Payload,
}

impl Held {
    fn of(kind: Kind, device: Option<&str>, payload: Payload) -> Held {
        Held { kind, device: device.map(str::to_string), payload }
    }
}

/// Every edge node the hub has seen.
pub struct Fleet {
    timing: Timing,
    edges: Vec<EdgeState>,
    index: foldhash::HashMap<(String, String), usize>,
    /// Who announces each metric name: (edge node, device) of every DBIRTH that holds it.
    claims: foldhash::HashMap<String, Vec<(usize, usize)>>,
    /// Where the next look for rebirths to ask starts (every edge node gets its turn).
    next_rebirth: usize,
    /// Edge nodes heard from, never born.
    strangers: Strangers,
}

impl Fleet {
    pub fn new(timing: Timing) -> Fleet {
        Fleet {
            timing,
            edges: Vec::new(),
            index: Default::default(),
            claims: Default::default(),
            next_rebirth: 0,
            strangers: Strangers::default(),
        }
    }

    /// Edge nodes heard from but not born since the hub has known them.
    pub fn strangers(&self) -> &Strangers {
        &self.strangers
    }

    pub fn edges(&self) -> &[EdgeState] {
        &self.edges
    }

    pub fn edge(&self, group: &str, node: &str) -> Option<&EdgeState> {
        self.index.get(&(group.to_string(), node.to_string())).map(|&i| &self.edges[i])
    }

    /// The metric at `at`, with its device.
    pub fn metric(&self, at: At) -> Option<(&EdgeState, Option<&DeviceState>, &MetricState)> {
        let e = self.edges.get(at.edge)?;
        match at.device {
            Some(d) => {
                let dev = e.devices.get(d)?;
                Some((e, Some(dev), dev.metrics.get(at.metric)?))
            }
            None => Some((e, None, e.node_metrics.get(at.metric)?)),
        }
    }

    /// How a claim of device `(edge, device)` to an ID stands against others: a device
    /// born in its edge node's current life (the node online) over any other, then the
    /// one that was current last (it died, or was born again without it, after the
    /// others). Claims of the best standing hold the ID; two of them are a conflict. (An edge node that dies keeps its IDs: answered
    /// `EDGE_OFFLINE`, not lost to a claimant that died before it, however late that one
    /// was born.)
    pub fn standing(&self, edge: usize, device: usize) -> Standing {
        let Some(x) = self.edges.get(edge) else { return Standing::Unknown };
        let Some(d) = x.devices.get(device) else { return Standing::Unknown };
        if x.status.is_online() && d.current { Standing::Current } else { Standing::Earlier { left: d.left } }
    }

    /// Whether `name` is held by the device `(edge, device)` and no other (as the
    /// catalogue decides: [`Fleet::standing`]).
    pub fn sole_claim(&self, name: &str, edge: usize, device: usize) -> bool {
        let Some(c) = self.claims.get(name) else { return false };
        // One claim (the common case): it is this device's or not, whoever is online.
        if let [only] = c.as_slice() {
            return *only == (edge, device);
        }
        let best = c.iter().map(|&(e, d)| self.standing(e, d)).max();
        let mut held = c.iter().filter(|&&(e, d)| Some(self.standing(e, d)) == best);
        matches!((held.next(), held.next()), (Some(&only), None) if only == (edge, device))
    }

    /// Whether the device `(edge, device)` holds its device ID: no other edge node's device
    /// of that ID stands as well or better (as the catalogue decides: a sensor of a device
    /// that does not hold its ID is not served, and its values are not history).
    pub fn holds_device(&self, edge: usize, device: usize) -> bool {
        let Some(id) = self.edges.get(edge).and_then(|e| e.devices.get(device)).map(|d| d.id.as_str()) else {
            return false;
        };
        let mine = self.standing(edge, device);
        self.edges
            .iter()
            .enumerate()
            .all(|(e, x)| e == edge || x.device_index.get(id).is_none_or(|&d| self.standing(e, d) < mine))
    }

    /// A message that does not decode: what it held is lost, so the edge node is asked
    /// for a rebirth (paced).
    pub fn undecodable(&mut self, group: &str, node: &str, clock: Clock) {
        match self.known(group, node) {
            Some(e) => {
                self.edges[e].stats.messages += 1;
                self.edges[e].drop_and_ask();
            }
            None => self.strangers.heard(group, node, true, clock),
        }
    }

    /// What a message of a known edge node said was lost after it was taken (its alarms
    /// not journaled): counted as dropped, and a rebirth asked for (paced).
    pub fn want_rebirth(&mut self, group: &str, node: &str) {
        if let Some(e) = self.known(group, node) {
            self.edges[e].drop_and_ask();
        }
    }

    /// One message from the broker, decoded; values applied go to `out`.
    pub fn on_message(
        &mut self,
        from: From<'_>,
        payload: Payload,
        clock: Clock,
        out: &mut Vec<Update>,
    ) -> Changed {
        let (changed, e) = self.handle(from, payload, clock, out);
        if let Some(e) = e {
            self.renew_claims(e);
        }
        changed
    }

    /// The names devices of edge node `e` born since the last look announce, recorded as
    /// their claims.
    fn renew_claims(&mut self, e: usize) {
        if let Some(edge) = self.edges.get_mut(e) {
            for d in std::mem::take(&mut edge.reborn) {
                let before = edge.claimed.remove(&d).unwrap_or_default();
                for name in before {
                    if let Some(c) = self.claims.get_mut(&name) {
                        c.retain(|x| *x != (e, d));
                        if c.is_empty() {
                            self.claims.remove(&name);
                        }
                    }
                }
                let names: Vec<String> = edge.devices[d].metrics.iter().map(|m| m.name.clone()).collect();
                for name in &names {
                    let c = self.claims.entry(name.clone()).or_default();
                    if !c.contains(&(e, d)) {
                        c.push((e, d));
                    }
                }
                edge.claimed.insert(d, names);
            }
        }
    }

    /// The message applied, and the edge node it was of (if one the fleet knows).
    fn handle(
        &mut self,
        from: From<'_>,
        payload: Payload,
        clock: Clock,
        out: &mut Vec<Update>,
    ) -> (Changed, Option<usize>) {
        let From { group, node, kind, device } = from;
        let wall = clock.wall;
        // Commands to an edge node (the hub's own rebirth requests among them) are not
        // the edge node's messages.
        if matches!(kind, Kind::NCmd | Kind::DCmd) {
            return (Changed::default(), None);
        }
        // A birth carries its `bdSeq` (to match its death), an integer, and `seq` 0: one
        // without is no birth to build on (an empty payload decodes as one); dropped, and
        // a proper one asked for.
        let birth =
            kind == Kind::NBirth && payload.seq == Some(0) && super::metric::bd_seq_of(&payload).is_some();
        let e = match self.known(group, node) {
            Some(e) => e,
            None if birth && self.edges.len() < MAX_EDGE_NODES => self.add_edge(group, node, wall),
            None => {
                if birth {
                    // A birth beyond what the hub takes: the node stays a stranger.
                    self.strangers.births_refused += 1;
                }
                self.strangers.heard(group, node, kind != Kind::NDeath && !birth, clock);
                return (Changed::default(), None);
            }
        };
        let edge = &mut self.edges[e];
        edge.stats.messages += 1;
        let changed = match kind {
            Kind::NBirth if !birth => {
                edge.drop_and_ask();
                Changed::default()
            }
            Kind::NBirth => {
                let changed = edge.nbirth(e, payload, wall, out);
                edge.expect = Some(1);
                changed
            }
            Kind::NDeath => edge.ndeath(&payload, wall),
            _ => {
                match (edge.expect, payload.seq.filter(|s| *s <= 255).map(|s| s as u8)) {
                    // Not born since the hub has known it (it died), or no `seq`: ask,
                    // never guess.
                    (None, _) | (_, None) => {
                        edge.drop_and_ask();
                        Changed::default()
                    }
                    (Some(expect), Some(seq)) => {
                        edge.in_turn(e, (expect, seq), Held::of(kind, device, payload), clock, out)
                    }
                }
            }
        };
        (changed, Some(e))
    }

    /// Gaps that waited the reorder timeout are given up on; rebirths wanted are due.
    pub fn tick(&mut self, now: Instant, wall: DateTime<Utc>, out: &mut Vec<Update>) -> Changed {
        let mut changed = Changed::default();
        for i in 0..self.edges.len() {
            let edge = &mut self.edges[i];
            if edge.gap_since.is_some_and(|t| now.duration_since(t) >= self.timing.reorder_timeout) {
                changed.catalogue |= edge.give_up_waiting(i, wall, out).catalogue;
                self.renew_claims(i);
            }
        }
        self.strangers.sweep(now);
        changed
    }

    /// The edge nodes to ask for a rebirth now: each at most once per cooldown, at most
    /// `max` of them (the others stay wanted, taken in turn next time).
    ///
    /// Edge nodes born before (the fleet the hub knows) go first: data on topics of nodes
    /// never born (strangers: a misconfigured client, a flood) must not hold up a known
    /// edge node's request behind hundreds of theirs.
    pub fn rebirths(&mut self, now: Instant, max: usize) -> Vec<(String, String)> {
        let cooldown = self.timing.rebirth_cooldown;
        let mut due = Vec::new();
        let (n, start) = (self.edges.len(), self.next_rebirth);
        for k in 0..n {
            if due.len() >= max {
                return due;
            }
            let i = (start + k) % n;
            let edge = &mut self.edges[i];
            if edge.rebirth_wanted && edge.last_request.is_none_or(|t| now.duration_since(t) >= cooldown) {
                self.next_rebirth = i + 1;
                edge.rebirth_wanted = false;
                edge.last_request = Some(now);
                edge.stats.rebirths_requested += 1;
                due.push((edge.group.clone(), edge.node.clone()));
            }
        }
        self.strangers.rebirths(now, cooldown, max, &mut due);
        due
    }

    /// The broker is lost: nothing is known of any edge node until it is back and born.
    pub fn broker_lost(&mut self, wall: DateTime<Utc>) {
        for edge in &mut self.edges {
            if edge.status.is_online() {
                edge.devices_left(wall);
                edge.status = Status::Offline { since: wall, why: Gone::BrokerLost };
            }
            edge.expect = None;
            edge.held.clear();
            edge.gap_since = None;
            for d in &mut edge.devices {
                if d.status.is_online() {
                    d.status = Status::Offline { since: wall, why: Gone::BrokerLost };
                }
            }
        }
    }

    /// Connected again (`now`: the hub's STATE said online): every edge node known is
    /// asked for a rebirth, since what happened meanwhile is not known; but only after one
    /// cooldown, and only if it has not been born since: an edge node that follows the hub
    /// as its primary host births by itself on that STATE (asking it too would have it
    /// birth twice, in the middle of sending what it kept).
    pub fn broker_back(&mut self, now: Instant) {
        for edge in &mut self.edges {
            edge.rebirth_wanted = true;
            edge.last_request = Some(now);
        }
    }

    fn known(&self, group: &str, node: &str) -> Option<usize> {
        self.index.get(&(group.to_string(), node.to_string())).copied()
    }

    /// A new edge node, being born (what was counted of it as a stranger carried over).
    fn add_edge(&mut self, group: &str, node: &str, wall: DateTime<Utc>) -> usize {
        let was = self.strangers.take(group, node);
        let key = (group.to_string(), node.to_string());
        self.edges.push(EdgeState {
            group: key.0.clone(),
            node: key.1.clone(),
            status: Status::Offline { since: wall, why: Gone::NotBorn },
            bd_seq: None,
            birth: None,
            devices: Vec::new(),
            device_index: Default::default(),
            node_metrics: Vec::new(),
            aliases: Default::default(),
            stats: EdgeStats {
                messages: was.as_ref().map_or(0, |s| s.messages),
                dropped: was.as_ref().map_or(0, |s| s.messages),
                rebirths_requested: was.as_ref().map_or(0, |s| s.rebirths_requested),
                gaps: 0,
            },
            expect: None,
            held: BTreeMap::new(),
            gap_since: None,
            last_request: was.and_then(|s| s.last_request),
            rebirth_wanted: false,
            reborn: Vec::new(),
            claimed: Default::default(),
        });
        self.index.insert(key, self.edges.len() - 1);
        self.edges.len() - 1
    }
}

/// A message's own time, or the time it was received.
fn time_of(ms: Option<u64>, wall: DateTime<Utc>) -> DateTime<Utc> {
    ms.and_then(|ms| i64::try_from(ms).ok()).and_then(DateTime::from_timestamp_millis).unwrap_or(wall)
}

mod edge;
pub mod strangers;
#[cfg(test)]
mod tests;
