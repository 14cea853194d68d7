//! Edge nodes heard from but not born since the hub has known them: a node whose birth the
//! hub missed (it started later), a misconfigured client, a flood of made-up topics. Kept
//! apart from the fleet, at most [`MAX_STRANGERS`] of them, each forgotten after
//! [`FORGET`] of silence: no number of topics grows the hub or slows what it does for the
//! edge nodes it knows. Each is asked for a rebirth (paced, after the known ones); when
//! it is born it joins the fleet with what was counted of it.

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
    next: usize,
    /// Messages of strangers not kept (the list was full).
    pub not_kept: u64,
    last_sweep: Option<Instant>,
}

impl Strangers {
    pub fn list(&self) -> &[Stranger] {
        &self.list
    }

    /// A message of a node not born; `ask`: it wants a rebirth (not for its death).
    pub fn heard(&mut self, group: &str, node: &str, ask: bool, clock: Clock) {
        let key = (group.to_string(), node.to_string());
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None if self.list.len() >= MAX_STRANGERS => {
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
    /// holds `max`; taken in turn.
    pub fn rebirths(
        &mut self,
        now: Instant,
        cooldown: Duration,
        max: usize,
        due: &mut Vec<(String, String)>,
    ) {
        let (n, start) = (self.list.len(), self.next);
        for k in 0..n {
            if due.len() >= max {
                return;
            }
            let i = (start + k) % n;
            let s = &mut self.list[i];
            if s.wanted && s.last_request.is_none_or(|t| now.duration_since(t) >= cooldown) {
                self.next = i + 1;
                s.wanted = false;
                s.last_request = Some(now);
                s.rebirths_requested += 1;
                due.push((s.group.clone(), s.node.clone()));
            }
        }
    }
}
