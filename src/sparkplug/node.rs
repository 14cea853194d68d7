//! The edge node's Sparkplug state, without I/O: sequence numbers, which devices are born,
//! what each metric last sent (report by exception), and the messages that follow. The
//! task in `run.rs` feeds it samples and sends what it returns.

use std::sync::Arc;

use crate::driver::Sample;
use crate::reading::record::{stored_of, worth_storing};
use crate::registry::{Registry, Sensor};
use crate::store::gorilla::Stored;

use super::buffer::Rec;
use super::metric;
use crate::spb::payload::{Metric, Payload, Value, datatype};
use crate::spb::topic::{Kind, Topics};

/// A message to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Out {
    pub topic: String,
    pub payload: Vec<u8>,
    /// A data message (QoS `data_qos`), or state (births and deaths, QoS 0).
    pub data: bool,
    /// Metrics it carries.
    pub metrics: usize,
    /// Of a DDATA: the indices of the records (as given to [`Edge::ddata`]) it carries.
    pub recs: Vec<usize>,
}

/// What was last sent for a metric.
struct Last {
    t: i64,
    value: Stored,
    quality: u8,
}

pub const REBIRTH: &str = "Node Control/Rebirth";
/// The DCMD metric a host application sets to ask for one device's DBIRTH again.
pub const DEVICE_REBIRTH: &str = "Device Control/Rebirth";
pub const BD_SEQ: &str = "bdSeq";

pub struct Edge {
    topics: Topics,
    registry: Arc<Registry>,
    seq: u8,
    born: Vec<bool>,
    /// Per sensor: its datatype of the current birth, and what it last sent.
    datatypes: Vec<u32>,
    /// Whether a sensor's datatype was decided by a value (an OPC UA node's type is
    /// known only from one): kept across rebirths, since hosts take a change as an error.
    typed: Vec<bool>,
    last: Vec<Option<Last>>,
    /// Per sensor: the timestamp of the value its last DBIRTH carried.
    birth_t: Vec<Option<i64>>,
    /// (sensor, timestamp) of every value a DBIRTH carried while the buffer held values: the
    /// drain skips them, even after the connection that sent the birth is gone.
    carried: std::collections::HashSet<(usize, i64)>,
    /// The entries of `carried` whose births the broker has not yet been seen to take
    /// (`run/echo.rs`): if it dropped them, they are taken out again (`births_dropped`).
    unconfirmed: Vec<(usize, i64)>,
    /// Per sensor: the quality last sent (a change carries the `Quality` property).
    sent_quality: Vec<u8>,
    max_silence_ms: i64,
}

fn now_ms() -> u64 {
    chrono::Utc::now().timestamp_millis().max(0) as u64
}

impl Edge {
    pub fn new(topics: Topics, registry: Arc<Registry>, max_silence_ms: i64) -> Edge {
        let (d, s) = (registry.devices().len(), registry.sensors().len());
        Edge {
            topics,
            registry,
            seq: 0,
            born: vec![false; d],
            datatypes: vec![datatype::DOUBLE; s],
            typed: vec![false; s],
            last: (0..s).map(|_| None).collect(),
            birth_t: vec![None; s],
            carried: std::collections::HashSet::new(),
            unconfirmed: Vec::new(),
            sent_quality: vec![0; s],
            max_silence_ms,
        }
    }

    pub fn topics(&self) -> &Topics {
        &self.topics
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn registry_arc(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// The connection is gone: no device is born until the next births.
    pub fn all_dead(&mut self) {
        self.born.iter_mut().for_each(|b| *b = false);
    }

    /// Takes back the `seq` of the last `n` messages built, which were not sent.
    pub fn rollback(&mut self, n: usize) {
        self.seq = self.seq.wrapping_sub((n % 256) as u8);
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1);
        u64::from(s)
    }

    /// The NDEATH payload for `bd_seq` (registered as the will; no `seq`).
    pub fn ndeath(&self, bd_seq: u64) -> Out {
        let now = now_ms();
        let mut m = Metric::new(Some(BD_SEQ), None, datatype::INT64, Some(Value::Long(bd_seq)));
        m.timestamp = Some(now);
        let p = Payload { timestamp: Some(now), metrics: vec![m], ..Payload::default() };
        Out {
            topic: self.topics.node(Kind::NDeath),
            payload: p.encode_to_bytes(),
            data: false,
            metrics: 1,
            recs: Vec::new(),
        }
    }

    /// NBIRTH: `seq` starts again at 0; every device is unborn until its DBIRTH.
    pub fn nbirth(&mut self, bd_seq: u64) -> Out {
        self.nbirth_with(bd_seq, Vec::new())
    }

    /// NBIRTH carrying node metrics of its own (`extra`: the alarms) after the two of
    /// every birth.
    pub fn nbirth_with(&mut self, bd_seq: u64, extra: Vec<Metric>) -> Out {
        self.seq = 0;
        self.born.iter_mut().for_each(|b| *b = false);
        let mut metrics = vec![
            Metric::new(Some(BD_SEQ), None, datatype::INT64, Some(Value::Long(bd_seq))),
            Metric::new(Some(REBIRTH), None, datatype::BOOLEAN, Some(Value::Boolean(false))),
        ];
        metrics.extend(extra);
        self.message(Kind::NBirth, None, metrics, false)
    }

    /// NDATA of node metrics (the alarms' changes).
    pub fn ndata(&mut self, metrics: Vec<Metric>) -> Out {
        self.message(Kind::NData, None, metrics, true)
    }

    /// A message of this node. Sparkplug 3.0 wants a timestamp on every metric of a birth
    /// or data message: a metric without a sample time of its own (`bdSeq`, `Node
    /// Control/Rebirth`, a metric not read yet) gets the payload's.
    fn message(&mut self, kind: Kind, device: Option<usize>, mut metrics: Vec<Metric>, data: bool) -> Out {
        let n = metrics.len();
        let seq = self.next_seq();
        let now = now_ms();
        for m in metrics.iter_mut().filter(|m| m.timestamp.is_none()) {
            m.timestamp = Some(now);
        }
        let p = Payload { timestamp: Some(now), metrics, seq: Some(seq), ..Payload::default() };
        let topic = match device {
            Some(d) => self.topics.device(kind, self.registry.devices()[d].id.as_str()),
            None => self.topics.node(kind),
        };
        Out { topic, payload: p.encode_to_bytes(), data, metrics: n, recs: Vec::new() }
    }

    pub fn is_born(&self, device: usize) -> bool {
        self.born.get(device).copied().unwrap_or(false)
    }

    /// DBIRTH of `device` with every metric's current value (`current`: the latest sample
    /// of a sensor, if any), which also becomes what report by exception compares with.
    pub fn dbirth(&mut self, device: usize, current: impl Fn(&Sensor) -> Option<Sample>) -> Out {
        let registry = self.registry.clone();
        let d = &registry.devices()[device];
        let every = u64::try_from(self.max_silence_ms).unwrap_or(0);
        let mut metrics = Vec::new();
        for s in registry.sensors_of_device(&d.id) {
            let now = current(s).map(|sample| {
                let (v, q) = stored_of(&sample);
                (sample.at.timestamp_millis(), v, q)
            });
            let i = s.place.sensor;
            let dt = if self.typed[i] {
                self.datatypes[i]
            } else {
                // Decided by a value that is not of bad quality (a bad one may be a stand-in).
                let good = now.as_ref().filter(|(_, _, q)| *q != 2);
                self.typed[i] = good.is_some();
                metric::datatype_of(s, good.map(|(_, v, _)| v))
            };
            self.datatypes[i] = dt;
            metrics.push(metric::birth(s, d, every, dt, now.as_ref().map(|(t, v, q)| (*t, v, *q))));
            self.sent_quality[s.place.sensor] = now.as_ref().map_or(2, |(_, _, q)| *q);
            self.birth_t[s.place.sensor] = now.as_ref().map(|(t, _, _)| *t);
            if let Some((t, _, _)) = &now
                && self.carried.insert((s.place.sensor, *t))
            {
                self.unconfirmed.push((s.place.sensor, *t));
            }
            self.last[s.place.sensor] = now.map(|(t, value, quality)| Last { t, value, quality });
        }
        self.born[device] = true;
        self.message(Kind::DBirth, Some(device), metrics, false)
    }

    /// Whether the value of sensor `id` at `t` is one a DBIRTH carried (buffered as well
    /// while the device waited to be born): drained, it would repeat the birth.
    pub fn carried_by_birth(&self, id: &str, t: i64) -> bool {
        let Some(s) = id.parse().ok().and_then(|id| self.registry.sensor(&id)) else { return false };
        self.carried.contains(&(s.place.sensor, t))
    }

    /// The values DBIRTHs carried while the buffer held values, as (sensor, timestamp).
    pub fn carried(&self) -> Vec<(String, i64)> {
        let sensors = self.registry.sensors();
        self.carried.iter().filter_map(|(i, t)| sensors.get(*i).map(|s| (s.id.to_string(), *t))).collect()
    }

    /// The buffer is empty: no value in it can repeat a birth any more.
    pub fn forget_carried(&mut self) {
        self.carried.clear();
        self.unconfirmed.clear();
    }

    /// The births sent so far reached the broker.
    pub fn births_taken(&mut self) {
        self.unconfirmed.clear();
    }

    /// The births sent since the last `births_taken` never reached a host (the broker
    /// dropped them): the buffered values they carried are drained after all.
    pub fn births_dropped(&mut self) {
        for c in self.unconfirmed.drain(..) {
            self.carried.remove(&c);
        }
    }

    /// Whether a live value of sensor `id` at `t` is no newer than what its device's current
    /// DBIRTH carried: sent after the birth, it would repeat it or go back in time.
    pub fn birth_covers(&self, id: &str, t: i64) -> bool {
        let Some(s) = id.parse().ok().and_then(|id| self.registry.sensor(&id)) else { return false };
        self.born[s.place.device] && self.birth_t[s.place.sensor].is_some_and(|b| t <= b)
    }

    /// DDEATH of `device`.
    pub fn ddeath(&mut self, device: usize) -> Out {
        self.born[device] = false;
        self.message(Kind::DDeath, Some(device), Vec::new(), false)
    }

    /// Report by exception: the value to send for a fresh sample of `s`, if it moved past
    /// the deadband, changed quality, or `max_silence` passed since the last one sent.
    pub fn offer(&mut self, s: &Sensor, sample: &Sample) -> Option<Rec> {
        let t = sample.at.timestamp_millis();
        let (value, quality) = stored_of(sample);
        let slot = self.last.get_mut(s.place.sensor)?;
        let prev = slot.as_ref().map(|l| (l.t, &l.value, l.quality));
        // A sample no newer than the last sent is no news: the birth carried it (a poll's
        // batch can arrive after the DBIRTH built from the same read), or it came late. A
        // step back of a minute or more is a clock step, and what follows it is sent.
        if prev.is_some_and(|(lt, _, _)| t <= lt && lt - t < crate::store::history::CLOCK_STEP_MS) {
            return None;
        }
        if !worth_storing(s, prev, t, &value, quality, self.max_silence_ms) {
            return None;
        }
        *slot = Some(Last { t, value: value.clone(), quality });
        Some(Rec { sensor: s.id.to_string(), t, value, quality })
    }

    /// DDATA messages for `recs` (values of born devices; others are skipped), one per
    /// device and at most `per_message` metrics each, in the order given.
    pub fn ddata(&mut self, recs: &[Rec], historical: bool, per_message: usize) -> Vec<Out> {
        let registry = self.registry.clone();
        let mut out = Vec::new();
        let mut open: Vec<(usize, Vec<Metric>, Vec<usize>)> = Vec::new();
        for (j, r) in recs.iter().enumerate() {
            let Some(s) = r.sensor.parse().ok().and_then(|id| registry.sensor(&id)) else { continue };
            if !self.is_born(s.place.device) {
                continue;
            }
            let dt = self.datatypes[s.place.sensor];
            let changed = std::mem::replace(&mut self.sent_quality[s.place.sensor], r.quality) != r.quality;
            let m = metric::data(s, dt, r.t, &r.value, r.quality, changed, historical);
            let i = match open.iter().position(|(d, _, _)| *d == s.place.device) {
                Some(i) => i,
                None => {
                    open.push((s.place.device, Vec::new(), Vec::new()));
                    open.len() - 1
                }
            };
            open[i].1.push(m);
            open[i].2.push(j);
            if open[i].1.len() >= per_message {
                let (d, ms, js) = open.swap_remove(i);
                out.push(Out { recs: js, ..self.message(Kind::DData, Some(d), ms, true) });
            }
        }
        for (d, ms, js) in open {
            out.push(Out { recs: js, ..self.message(Kind::DData, Some(d), ms, true) });
        }
        out
    }

    /// The last value of every metric of a born device silent for `max_silence`, again,
    /// with its time now (what polling would have sent had the value been read).
    pub fn silent(&mut self, now: i64) -> Vec<Rec> {
        let registry = self.registry.clone();
        let mut out = Vec::new();
        for s in registry.sensors() {
            if !self.is_born(s.place.device) {
                continue;
            }
            if let Some(l) = self.last[s.place.sensor].as_mut().filter(|l| now - l.t >= self.max_silence_ms) {
                l.t = now;
                out.push(Rec {
                    sensor: s.id.to_string(),
                    t: now,
                    value: l.value.clone(),
                    quality: l.quality,
                });
            }
        }
        out
    }
}

/// A command's metrics: whether it asks for a rebirth (`Node Control/Rebirth` = true);
/// what else it asks is refused by the caller.
pub fn asks_rebirth(p: &Payload) -> bool {
    asks(p, REBIRTH)
}

/// Whether a DCMD asks for the device's DBIRTH again, and nothing else.
pub fn asks_device_rebirth(p: &Payload) -> bool {
    p.metrics.len() == 1 && asks(p, DEVICE_REBIRTH)
}

fn asks(p: &Payload, control: &str) -> bool {
    p.metrics.iter().any(|m| m.name.as_deref() == Some(control) && m.value == Some(Value::Boolean(true)))
}

/// Hands `outs` to `send` in order until one is refused; takes back the `seq` of every
/// message not sent and returns the indices of the records those carried.
pub fn hand_over(edge: &mut Edge, outs: Vec<Out>, mut send: impl FnMut(Out) -> bool) -> Vec<usize> {
    let n = outs.len();
    let mut outs = outs.into_iter();
    let mut i = 0;
    while let Some(out) = outs.next() {
        let recs = out.recs.clone();
        if !send(out) {
            edge.rollback(n - i);
            return recs.into_iter().chain(outs.flat_map(|o| o.recs)).collect();
        }
        i += 1;
    }
    Vec::new()
}

#[cfg(test)]
mod tests;
