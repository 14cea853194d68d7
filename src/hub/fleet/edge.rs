//! An edge node's messages in its `seq` turn: births, deaths, data, and the messages held
//! while one before them is missing (a child of `fleet`, which owns the fields).

use chrono::{DateTime, Utc};

use super::super::metric::{apply_value, bd_seq_of, define};
use super::{At, Changed, Clock, DeviceState, EdgeState, Gone, HELD_MAX, Held, Status, Update, time_of};
use crate::spb::payload::{Metric, Payload};
use crate::spb::topic::Kind;

impl EdgeState {
    /// Its devices' claims stop being current at `wall` (those that were).
    pub(super) fn devices_left(&mut self, wall: DateTime<Utc>) {
        for d in &mut self.devices {
            if d.current {
                d.left.get_or_insert(wall);
            }
        }
    }

    /// The metric at `at` (a device's, or the node's own with `None`) marked as holding a
    /// shared alias or not.
    fn set_shared(&mut self, (dev, i): (Option<usize>, usize), shared: bool) {
        let slot = match dev {
            Some(d) => self.devices.get_mut(d).and_then(|d| d.metrics.get_mut(i)),
            None => self.node_metrics.get_mut(i),
        };
        if let Some(m) = slot {
            m.alias_shared = shared;
        }
    }

    /// Gives `alias` to the metric at `at`; an alias given to more than one metric names
    /// none (each marked). Whether it is shared.
    fn hold(&mut self, alias: u64, at: (Option<usize>, usize)) -> bool {
        let holders = self.aliases.entry(alias).or_default();
        holders.push(at);
        let all = holders.clone();
        let shared = all.len() > 1;
        for h in all {
            self.set_shared(h, shared);
        }
        shared
    }

    /// The aliases device `d` holds are its no more: a metric left holding one alone names
    /// it again.
    fn release_aliases(&mut self, d: usize) {
        let held: Vec<u64> = self
            .devices
            .get(d)
            .map_or(Vec::new(), |dev| dev.metrics.iter().filter_map(|m| m.alias).collect());
        for alias in held {
            let Some(h) = self.aliases.get_mut(&alias) else { continue };
            h.retain(|(x, _)| *x != Some(d));
            match h.as_slice() {
                [] => {
                    self.aliases.remove(&alias);
                }
                [only] => {
                    let only = *only;
                    self.set_shared(only, false);
                }
                _ => {}
            }
        }
    }

    pub(super) fn drop_and_ask(&mut self) {
        self.stats.dropped += 1;
        self.rebirth_wanted = true;
    }

    pub(super) fn nbirth(
        &mut self,
        e: usize,
        payload: Payload,
        wall: DateTime<Utc>,
        out: &mut Vec<Update>,
    ) -> Changed {
        let since = time_of(payload.timestamp, wall);
        self.bd_seq = bd_seq_of(&payload);
        self.status = Status::Online { since: wall };
        self.birth = Some(since);
        self.drop_held();
        self.rebirth_wanted = false;
        self.aliases.clear();
        // Every device waits for its own DBIRTH after this one.
        self.devices_left(wall);
        for d in &mut self.devices {
            d.current = false;
            if d.status.is_online() || matches!(d.status, Status::Offline { why: Gone::BrokerLost, .. }) {
                d.status = Status::Offline { since: wall, why: Gone::EdgeGone };
            }
        }
        let before = std::mem::take(&mut self.node_metrics);
        self.node_metrics =
            define(&payload.metrics, |n| before.iter().find(|b| b.name == n).and_then(|b| b.latest.clone()));
        let given: Vec<(usize, u64)> =
            self.node_metrics.iter().enumerate().filter_map(|(i, m)| Some((i, m.alias?))).collect();
        for (i, alias) in given {
            self.hold(alias, (None, i));
        }
        for (i, m) in payload.metrics.iter().enumerate() {
            apply_value(
                At { edge: e, device: None, metric: i },
                &mut self.node_metrics[i],
                m,
                since,
                true,
                wall,
                out,
            );
        }
        Changed { catalogue: true }
    }

    pub(super) fn ndeath(&mut self, payload: &Payload, wall: DateTime<Utc>) -> Changed {
        let bd_seq = bd_seq_of(payload);
        if !self.status.is_online() || bd_seq != self.bd_seq {
            // Another connection's will, or a death already known.
            self.stats.dropped += 1;
            return Changed::default();
        }
        self.status = Status::Offline { since: wall, why: Gone::Death };
        self.devices_left(wall);
        self.expect = None;
        self.drop_held();
        for d in &mut self.devices {
            if d.status.is_online() {
                d.status = Status::Offline { since: wall, why: Gone::EdgeGone };
            }
        }
        // Its claims no longer count over others' (a conflict it made clears).
        Changed { catalogue: true }
    }

    /// A message with `seq` when `expect` is due: applied in its turn (with those held
    /// after it), held while one before it is missing, dropped if its turn passed.
    pub(super) fn in_turn(
        &mut self,
        e: usize,
        (expect, seq): (u8, u8),
        msg: Held,
        clock: Clock,
        out: &mut Vec<Update>,
    ) -> Changed {
        let ahead = seq.wrapping_sub(expect);
        if ahead == 0 {
            let mut changed = self.apply(e, msg.kind, msg.device.as_deref(), msg.payload, clock.wall, out);
            self.expect = Some(expect.wrapping_add(1));
            changed.catalogue |= self.release(e, clock.wall, out).catalogue;
            changed
        } else if ahead < 128 {
            self.held.insert(seq, msg);
            self.gap_since.get_or_insert(clock.now);
            if self.held.len() > HELD_MAX {
                return self.give_up_waiting(e, clock.wall, out);
            }
            Changed::default()
        } else {
            // Behind: a duplicate, or too late to be placed.
            self.stats.dropped += 1;
            Changed::default()
        }
    }

    /// Messages held for a turn that will not come (the edge node was born again, or
    /// died): dropped, and counted.
    fn drop_held(&mut self) {
        self.stats.dropped += self.held.len() as u64;
        self.held.clear();
        self.gap_since = None;
    }

    /// A message in its `seq` turn.
    pub(super) fn apply(
        &mut self,
        e: usize,
        kind: Kind,
        device: Option<&str>,
        payload: Payload,
        wall: DateTime<Utc>,
        out: &mut Vec<Update>,
    ) -> Changed {
        let sent = time_of(payload.timestamp, wall);
        match (kind, device) {
            (Kind::DBirth, Some(id)) => {
                let d = match self.device_index.get(id) {
                    Some(&d) => d,
                    None => {
                        self.devices.push(DeviceState {
                            id: id.to_string(),
                            status: Status::Offline { since: wall, why: Gone::NotBorn },
                            birth: None,
                            current: false,
                            left: None,
                            metrics: Vec::new(),
                            by_name: Default::default(),
                        });
                        self.device_index.insert(id.to_string(), self.devices.len() - 1);
                        self.devices.len() - 1
                    }
                };
                // Aliases the device held before are its no more.
                self.release_aliases(d);
                self.reborn.push(d);
                let was = &self.devices[d];
                let metrics =
                    define(&payload.metrics, |n| was.metric_named(n).and_then(|m| m.latest.clone()));
                let given: Vec<(usize, u64)> =
                    metrics.iter().enumerate().filter_map(|(i, m)| Some((i, m.alias?))).collect();
                let dev = &mut self.devices[d];
                let mut by_name: Vec<u32> = (0..metrics.len() as u32).collect();
                by_name.sort_unstable_by(|&a, &b| metrics[a as usize].name.cmp(&metrics[b as usize].name));
                dev.by_name = by_name;
                dev.metrics = metrics;
                dev.status = Status::Online { since: wall };
                dev.birth = Some(sent);
                dev.current = true;
                dev.left = None;
                // An alias must name one metric of the whole edge node: one another device
                // (or the node) holds names neither, as an alias given twice in one birth.
                let shared = given.into_iter().filter(|&(i, alias)| self.hold(alias, (Some(d), i))).count();
                if shared > 0 {
                    tracing::warn!(
                        group = %self.group,
                        node = %self.node,
                        device = %id,
                        shared,
                        "aliases of this device's birth are another metric's of the edge node: data by them is not read"
                    );
                }
                let dev = &mut self.devices[d];
                for (i, m) in payload.metrics.iter().enumerate() {
                    let at = At { edge: e, device: Some(d), metric: i };
                    apply_value(at, &mut dev.metrics[i], m, time_of(m.timestamp, sent), true, wall, out);
                }
                Changed { catalogue: true }
            }
            (Kind::DDeath, Some(id)) => {
                match self.device_index.get(id).map(|&d| &mut self.devices[d]) {
                    Some(dev) if dev.status.is_online() && dev.birth.is_none_or(|b| sent >= b) => {
                        dev.status = Status::Offline { since: wall, why: Gone::Death };
                    }
                    _ => self.stats.dropped += 1,
                }
                Changed::default()
            }
            (Kind::DData, Some(id)) => {
                let Some(&d) = self.device_index.get(id).filter(|&&d| self.devices[d].status.is_online())
                else {
                    self.drop_and_ask();
                    return Changed::default();
                };
                self.data(e, Some(d), &payload.metrics, (sent, wall), out);
                Changed::default()
            }
            (Kind::NData, None) => {
                self.data(e, None, &payload.metrics, (sent, wall), out);
                Changed::default()
            }
            _ => Changed::default(),
        }
    }

    /// A data message's metrics, found by alias (or by name) among what `device` was born with.
    pub(super) fn data(
        &mut self,
        e: usize,
        device: Option<usize>,
        metrics: &[Metric],
        (sent, wall): (DateTime<Utc>, DateTime<Utc>),
        out: &mut Vec<Update>,
    ) {
        let (mut unknown, mut shared) = (false, false);
        for m in metrics {
            let found = match (m.alias, m.name.as_deref()) {
                (Some(a), _) => self.aliases.get(&a).and_then(|h| match h.as_slice() {
                    [(d, i)] if *d == device => Some(*i),
                    _ => None,
                }),
                (None, Some(n)) => match device {
                    Some(d) => self.devices[d].index_of(n),
                    None => self.node_metrics.iter().position(|x| x.name == n),
                },
                (None, None) => None,
            };
            let slot = found.and_then(|i| match device {
                Some(d) => self.devices[d].metrics.get_mut(i).map(|s| (i, s)),
                None => self.node_metrics.get_mut(i).map(|s| (i, s)),
            });
            match slot {
                // Data by an alias two metrics were born with: it cannot be placed, and a
                // rebirth would give the same aliases again; dropped, counted.
                None if m.alias.is_some_and(|a| self.aliases.get(&a).is_some_and(|h| h.len() > 1)) => {
                    shared = true
                }
                Some((i, slot)) => apply_value(
                    At { edge: e, device, metric: i },
                    slot,
                    m,
                    time_of(m.timestamp, sent),
                    false,
                    wall,
                    out,
                ),
                None => unknown = true,
            }
        }
        if unknown {
            self.drop_and_ask();
        } else if shared {
            self.stats.dropped += 1;
        }
    }

    /// Applies held messages that are next in turn.
    pub(super) fn release(&mut self, e: usize, wall: DateTime<Utc>, out: &mut Vec<Update>) -> Changed {
        let mut changed = Changed::default();
        while let Some(expect) = self.expect {
            let Some(Held { kind, device, payload }) = self.held.remove(&expect) else { break };
            changed.catalogue |= self.apply(e, kind, device.as_deref(), payload, wall, out).catalogue;
            // An NBIRTH cannot be held, so `expect` is still this one's.
            self.expect = Some(expect.wrapping_add(1));
        }
        if self.held.is_empty() {
            self.gap_since = None;
        }
        changed
    }

    /// The missing message is not coming: what waits is applied in `seq` order, the gap
    /// counted, and a rebirth asked for.
    pub(super) fn give_up_waiting(
        &mut self,
        e: usize,
        wall: DateTime<Utc>,
        out: &mut Vec<Update>,
    ) -> Changed {
        let mut changed = Changed::default();
        let expect = self.expect.unwrap_or(0);
        let mut held: Vec<(u8, Held)> = std::mem::take(&mut self.held).into_iter().collect();
        held.sort_by_key(|(seq, _)| seq.wrapping_sub(expect));
        for (seq, Held { kind, device, payload }) in held {
            changed.catalogue |= self.apply(e, kind, device.as_deref(), payload, wall, out).catalogue;
            self.expect = Some(seq.wrapping_add(1));
        }
        self.gap_since = None;
        self.stats.gaps += 1;
        self.rebirth_wanted = true;
        changed
    }
}
