//! The alarm-management figures of ISA-18.2 and EEMUA 191 over a range of the journal:
//! what a shift's alarm report is built on. A pure function of the journal's events (and
//! of which alarms stood at the range's end), so a golden journal gives exact figures.
//!
//! The rules, as `docs/alarms.md` states them:
//! - Counted are the activations *annunciated* in the range (`from <= t < to`): an
//!   activation while the alarm was shelved is counted apart (`shelved_activations`) and
//!   in no other figure.
//! - Rates go by 10-minute periods aligned to the clock (…:00, …:10, …): the mean over the
//!   range's length, the peak over the periods it touches.
//! - A flood is a period with more than `flood_threshold` activations (default 10);
//!   adjoining flood periods are one flood.
//! - An alarm chatters when it activated `chatter_count` times (3) with the last less than
//!   `chatter_window` (60 s) after the first.
//! - Stale: active at the range's end for more than 24 hours.
//! - Time to acknowledge: from an event's activation to its acknowledgement, over the
//!   acknowledgements in the range; p90 by nearest rank.

use std::collections::{BTreeMap, HashMap};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::registry::AlarmPriority;
use crate::store::alarm_journal::{Event, EventKind, Instance};

pub const PERIOD_MS: i64 = 600_000;
pub const STALE_AFTER_MS: i64 = 24 * 3_600_000;

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub flood_threshold: usize,
    pub top: usize,
    pub chatter_count: usize,
    pub chatter_window_ms: i64,
}

impl Default for Options {
    fn default() -> Options {
        Options { flood_threshold: 10, top: 10, chatter_count: 3, chatter_window_ms: 60_000 }
    }
}

/// Activations per priority.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ByPriority {
    pub low: u64,
    pub medium: u64,
    pub high: u64,
    pub critical: u64,
}

/// Activations per 10-minute period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Rate {
    /// Activations over the range's length in 10-minute periods.
    pub mean: f64,
    /// The most in one 10-minute period.
    pub peak: u64,
    /// Where the (first) peak period starts (RFC 3339); null without activations.
    pub peak_at: Option<String>,
}

/// One flood: adjoining 10-minute periods each over the threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Flood {
    pub from: String,
    pub to: String,
    pub activations: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Floods {
    /// More activations than this in a 10-minute period is a flood.
    pub threshold: usize,
    pub periods: Vec<Flood>,
    /// The share of the range spent in floods, 0-100.
    pub percent_of_time: f64,
}

/// An alarm and how often it activated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AlarmCount {
    pub alarm_id: String,
    pub activations: u64,
    /// The most activations within the chattering window (60 s).
    pub most_in_window: u64,
}

/// An alarm standing for more than 24 hours at the range's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stale {
    pub alarm_id: String,
    pub activated_at: String,
    pub active_for_s: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TimeToAcknowledge {
    /// Acknowledgements in the range.
    pub acknowledged: u64,
    /// Null without acknowledgements.
    pub mean_s: Option<f64>,
    pub p90_s: Option<f64>,
}

/// The alarm-management figures of a range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Summary {
    /// Activations annunciated in the range (not shelved).
    pub activations: u64,
    /// Activations while the alarm was shelved (in no other figure).
    pub shelved_activations: u64,
    pub by_priority: ByPriority,
    pub per_10_min: Rate,
    pub floods: Floods,
    /// Alarms that chattered (3 activations within 60 s), most activations first, top N.
    pub chattering: Vec<AlarmCount>,
    /// Alarms active at the range's end for more than 24 hours.
    pub stale: Vec<Stale>,
    /// The most frequent alarms, top N.
    pub top_alarms: Vec<AlarmCount>,
    /// The share of all activations made by the 10 most frequent alarms, 0-100; null
    /// without activations.
    pub top10_share_percent: Option<f64>,
    pub time_to_acknowledge: TimeToAcknowledge,
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// The most of `times` (sorted) within `window_ms`.
fn most_within(times: &[i64], window_ms: i64) -> u64 {
    let (mut most, mut first) = (0, 0);
    for (last, t) in times.iter().enumerate() {
        while t - times[first] >= window_ms {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most as u64
}

/// The figures over `events` (the journal's, `from <= at_ms < to`, in time order), with
/// `standing` the alarms active at `to` and since when.
pub fn summarize(events: &[Event], standing: &[(String, i64)], from: i64, to: i64, o: Options) -> Summary {
    let activations: Vec<&Event> = events.iter().filter(|e| e.kind == EventKind::Activated).collect();
    let shelved = activations.iter().filter(|e| e.shelved).count() as u64;
    let shown: Vec<&Event> = activations.into_iter().filter(|e| !e.shelved).collect();
    let mut by_priority = ByPriority::default();
    for e in &shown {
        match e.priority {
            Some(AlarmPriority::Low) => by_priority.low += 1,
            Some(AlarmPriority::Medium) | None => by_priority.medium += 1,
            Some(AlarmPriority::High) => by_priority.high += 1,
            Some(AlarmPriority::Critical) => by_priority.critical += 1,
        }
    }
    // Per aligned 10-minute period.
    let mut periods: BTreeMap<i64, u64> = BTreeMap::new();
    for e in &shown {
        *periods.entry(e.at_ms.div_euclid(PERIOD_MS) * PERIOD_MS).or_default() += 1;
    }
    let peak = periods.iter().fold(None, |best: Option<(i64, u64)>, (&p, &n)| match best {
        Some((_, m)) if m >= n => best,
        _ => Some((p, n)),
    });
    let length = (to - from).max(1) as f64 / PERIOD_MS as f64;
    let per_10_min = Rate {
        mean: shown.len() as f64 / length,
        peak: peak.map_or(0, |p| p.1),
        peak_at: peak.map(|p| rfc3339(p.0)),
    };
    let mut floods: Vec<(i64, i64, u64)> = Vec::new();
    for (&p, &n) in periods.iter().filter(|(_, n)| **n as usize > o.flood_threshold) {
        let (start, end) = (p.max(from), (p + PERIOD_MS).min(to));
        match floods.last_mut() {
            Some(last) if last.1 == start => {
                last.1 = end;
                last.2 += n;
            }
            _ => floods.push((start, end, n)),
        }
    }
    let flooded: i64 = floods.iter().map(|f| f.1 - f.0).sum();
    let floods = Floods {
        threshold: o.flood_threshold,
        percent_of_time: 100.0 * flooded as f64 / (to - from).max(1) as f64,
        periods: floods
            .into_iter()
            .map(|(a, b, n)| Flood { from: rfc3339(a), to: rfc3339(b), activations: n })
            .collect(),
    };
    let mut per_alarm: HashMap<&str, Vec<i64>> = HashMap::new();
    for e in &shown {
        per_alarm.entry(e.alarm_id.as_str()).or_default().push(e.at_ms);
    }
    let mut counts: Vec<AlarmCount> = per_alarm
        .iter()
        .map(|(id, times)| AlarmCount {
            alarm_id: id.to_string(),
            activations: times.len() as u64,
            most_in_window: most_within(times, o.chatter_window_ms),
        })
        .collect();
    counts.sort_by(|a, b| b.activations.cmp(&a.activations).then_with(|| a.alarm_id.cmp(&b.alarm_id)));
    let top10: u64 = counts.iter().take(10).map(|c| c.activations).sum();
    let top10_share_percent = (!shown.is_empty()).then(|| 100.0 * top10 as f64 / shown.len() as f64);
    let chattering: Vec<AlarmCount> =
        counts.iter().filter(|c| c.most_in_window as usize >= o.chatter_count).take(o.top).cloned().collect();
    counts.truncate(o.top);
    let mut stale: Vec<Stale> = standing
        .iter()
        .filter(|(_, since)| to - since > STALE_AFTER_MS)
        .map(|(id, since)| Stale {
            alarm_id: id.clone(),
            activated_at: rfc3339(*since),
            active_for_s: (to - since) / 1000,
        })
        .collect();
    stale.sort_by(|a, b| b.active_for_s.cmp(&a.active_for_s).then_with(|| a.alarm_id.cmp(&b.alarm_id)));
    let mut waits: Vec<i64> = events
        .iter()
        // A person's acknowledgements: not those a server made by itself (no one named).
        .filter(|e| e.kind == EventKind::Acknowledged && e.by.is_some())
        .filter_map(|e| e.activated_ms.map(|a| (e.at_ms - a).max(0)))
        .collect();
    waits.sort_unstable();
    let time_to_acknowledge = TimeToAcknowledge {
        acknowledged: waits.len() as u64,
        mean_s: (!waits.is_empty()).then(|| waits.iter().sum::<i64>() as f64 / waits.len() as f64 / 1000.0),
        p90_s: (!waits.is_empty()).then(|| {
            let rank = (waits.len() * 9).div_ceil(10).max(1);
            waits[rank - 1] as f64 / 1000.0
        }),
    };
    Summary {
        activations: shown.len() as u64,
        shelved_activations: shelved,
        by_priority,
        per_10_min,
        floods,
        chattering,
        stale,
        top_alarms: counts,
        top10_share_percent,
        time_to_acknowledge,
    }
}

/// Which alarms stood (were active) at `to`, and since when: each alarm's first
/// activation-changing event at or after `to` (`later`, in time order) tells; without
/// one, its instance now does.
pub fn standing_at(to: i64, instances: &[Instance], later: &[Event]) -> Vec<(String, i64)> {
    let mut first: HashMap<&str, &Event> = HashMap::new();
    for e in later.iter().filter(|e| e.at_ms >= to) {
        if matches!(
            e.kind,
            EventKind::Activated | EventKind::Cleared | EventKind::OutOfService | EventKind::InService
        ) {
            first.entry(e.alarm_id.as_str()).or_insert(e);
        }
    }
    instances
        .iter()
        .filter_map(|i| {
            let since = match first.get(i.alarm_id.as_str()) {
                Some(e) => match e.kind {
                    EventKind::Cleared | EventKind::OutOfService => e.activated_ms,
                    _ => None,
                },
                None => i.activated_ms.filter(|a| i.state.is_active() && *a < to),
            }?;
            Some((i.alarm_id.clone(), since))
        })
        .collect()
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
