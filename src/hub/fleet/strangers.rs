//! Edge nodes heard from but not born since the hub has known them: a node whose birth the
//! hub missed (it started later), a misconfigured client, a flood of made-up topics. Kept
//! apart from the fleet, at most [`MAX_STRANGERS`] of them, each forgotten after
//! [`FORGET`] of silence (and, with the list full, one silent for a few seconds gives its
//! place to a new one): no number of topics grows the hub or slows what it does for the
//! edge nodes it knows. Each is asked for a rebirth (paced, after the known ones, the last
//! heard first); when it is born it joins the fleet with what was counted of it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::Clock;

/// Strangers kept at most; messages of more are counted, not kept.
pub const MAX_STRANGERS: usize = 1_000;
/// A stranger silent this long is forgotten.
pub const FORGET: Duration = Duration::from_secs(600);
/// How often the silent ones are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// With the list full, a stranger silent this long gives its place to a new one (looked
/// for among a few, in turn): a flood's names, heard once, make room for a node that keeps
/// sending.
const IDLE: Duration = Duration::from_secs(5);
/// Places looked at for one that is idle, at most.
const LOOK: usize = 8;

/// An edge node heard from, never born.
#[derive(Debug, Clone)]
pub struct Stranger {
    pub group: String,
    pub node: String,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub messages: u64,
    pub rebirths_requested: u64,
    seen: Instant,
    wanted: bool,
    pub(super) last_request: Option<Instant>,
}

#[derive(Debug, Default)]
pub struct Strangers {
    list: Vec<Stranger>,
    index: foldhash::HashMap<(String, String), usize>,
    /// Messages of strangers not kept (the list was full).
    pub not_kept: u64,
    /// Births of edge nodes beyond what the hub takes (`MAX_EDGE_NODES`).
    pub births_refused: u64,
    last_sweep: Option<Instant>,
    /// Where the next look for an idle place starts.
    hand: usize,
}

impl Strangers {
    pub fn list(&self) -> &[Stranger] {
        &self.list
    }

    /// A message of a node not born; `ask`: it wants a rebirth (not for its death).
    pub fn heard(&mut self, group: &str, node: &str, ask: bool, clock: Clock) {
        let key = (group.to_string(), node.to_string());
        let known = self.index.get(&key).copied();
        let i = match known {
            Some(i) => i,
            None if self.list.len() >= MAX_STRANGERS && !self.make_room(clock.now) => {
                self.not_kept += 1;
                return;
            }
            None => {
                self.list.push(Stranger {
                    group: key.0.clone(),
                    node: key.1.clone(),
                    first_seen: clock.wall,
                    last_seen: clock.wall,
                    messages: 0,
                    rebirths_requested: 0,
                    seen: clock.now,
                    wanted: false,
                    last_request: None,
                });
                self.index.insert(key, self.list.len() - 1);
                self.list.len() - 1
            }
        };
        let s = &mut self.list[i];
        s.messages += 1;
        s.last_seen = clock.wall;
        s.seen = clock.now;
        s.wanted |= ask;
    }

    /// A place freed for a new stranger: one silent for [`IDLE`], looked for among the
    /// next [`LOOK`] in turn. Whether one was.
    fn make_room(&mut self, now: Instant) -> bool {
        let n = self.list.len();
        for k in 0..LOOK.min(n) {
            let i = (self.hand + k) % n;
            if now.duration_since(self.list[i].seen) >= IDLE {
                self.hand = i;
                let s = self.remove_at(i);
                self.index.remove(&(s.group, s.node));
                return true;
            }
        }
        self.hand = (self.hand + LOOK) % n.max(1);
        false
    }

    /// The stranger `group/node`, taken out (it was born).
    pub fn take(&mut self, group: &str, node: &str) -> Option<Stranger> {
        let i = self.index.remove(&(group.to_string(), node.to_string()))?;
        Some(self.remove_at(i))
    }

    fn remove_at(&mut self, i: usize) -> Stranger {
        let s = self.list.swap_remove(i);
        if let Some(moved) = self.list.get(i) {
            self.index.insert((moved.group.clone(), moved.node.clone()), i);
        }
        s
    }

    /// Strangers silent for [`FORGET`] are forgotten (looked for every few seconds).
    pub fn sweep(&mut self, now: Instant) {
        if self.last_sweep.is_some_and(|t| now.duration_since(t) < SWEEP_EVERY) {
            return;
        }
        self.last_sweep = Some(now);
        let mut i = 0;
        while i < self.list.len() {
            if now.duration_since(self.list[i].seen) >= FORGET {
                let s = self.remove_at(i);
                self.index.remove(&(s.group, s.node));
            } else {
                i += 1;
            }
        }
    }

    /// Strangers to ask for a rebirth now, each at most once per `cooldown`, until `due`
    /// holds `max`: the last heard first (a node that keeps sending goes before the names
    /// of a flood that is over).
    pub fn rebirths(
        &mut self,
        now: Instant,
        cooldown: Duration,
        max: usize,
        due: &mut Vec<(String, String)>,
    ) {
        while due.len() < max {
            let ready =
                |s: &Stranger| s.wanted && s.last_request.is_none_or(|t| now.duration_since(t) >= cooldown);
            let Some(s) = self.list.iter_mut().filter(|s| ready(s)).max_by_key(|s| s.seen) else { return };
            s.wanted = false;
            s.last_request = Some(now);
            s.rebirths_requested += 1;
            due.push((s.group.clone(), s.node.clone()));
        }
    }
}
