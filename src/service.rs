//! The service core: the handles every front needs, built once (`app.rs`, or a test) and
//! shared by the poller, the Sparkplug edge node, the tools and the console.
//!
//! [`Core`] holds the registry, the configuration, the reading core (and through it every
//! device read), the stores, the metrics, the sample feed, the cross-call retry limit
//! and the Sparkplug link's counters once the edge node runs. It knows nothing of tools,
//! envelopes or wires: the tools are one front over it (`tools::ToolService`), and a second
//! source of data (the fleet hub) answers the same contract by building its own core.

use std::sync::{Arc, OnceLock};

use crate::alarms::Alarms;
use crate::config::Config;
use crate::driver::Drivers;
use crate::ids::DeviceId;
use crate::metrics::Metrics;
use crate::metrics::sparkplug::Counters as SparkplugCounters;
use crate::reading::Reader;
use crate::reading::feed::Feed;
use crate::registry::Registry;
use crate::resilience::breaker::SnapshotState;
use crate::resilience::repeat::RepeatGuard;
use crate::store::HistoryStore;
use crate::store::alarm_journal::AlarmJournal;
use crate::work_orders::WorkOrderStore;

/// The stores a service keeps its data in, given when it is built (the core is shared from
/// then on, so they cannot change afterwards).
pub struct Stores {
    pub history: Option<Arc<HistoryStore>>,
    pub work_orders: Option<Arc<WorkOrderStore>>,
    /// The alarm journal; the core evaluates its registry's alarms into it.
    pub alarms: Option<Arc<AlarmJournal>>,
}

impl Stores {
    /// Both stores in memory (tests, one-shot commands without a data directory).
    pub fn in_memory() -> Stores {
        Stores {
            history: HistoryStore::in_memory().ok().map(Arc::new),
            work_orders: WorkOrderStore::in_memory().ok().map(Arc::new),
            alarms: AlarmJournal::in_memory().ok().map(Arc::new),
        }
    }
}

/// The handles of one running service; cheap to clone.
#[derive(Clone)]
pub struct Core {
    parts: Arc<Parts>,
}

/// What a [`Core`] holds.
pub struct Parts {
    pub registry: Arc<Registry>,
    pub config: Config,
    /// Every device read goes through the reading core.
    pub reader: Arc<Reader>,
    pub metrics: Arc<Metrics>,
    pub history: Option<Arc<HistoryStore>>,
    pub work_orders: Option<Arc<WorkOrderStore>>,
    /// The registry's alarms and their instances (none without a journal, or when it
    /// could not be read: the alarm tools then answer that storage is unavailable).
    pub alarms: Option<Arc<Alarms>>,
    /// Fresh samples, for the consumers besides history (Sparkplug).
    pub feed: Feed,
    /// The cross-call retry limit, fed by the tools and asked by fieldgate's own probes.
    pub repeat: Arc<RepeatGuard>,
    /// The Sparkplug edge node's counters, when it runs (`get_device_status` shows them).
    pub sparkplug: OnceLock<Arc<SparkplugCounters>>,
    /// This core serves a fleet of edge nodes (the hub), not devices of its own.
    pub fleet: bool,
}

impl AsRef<Core> for Core {
    fn as_ref(&self) -> &Core {
        self
    }
}

impl std::ops::Deref for Core {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.parts
    }
}

/// What a core serves: devices of its own, or a fleet of edge nodes (the hub), whose
/// alarm table, once made, every renewed core shares.
enum Serves {
    Devices,
    Fleet { alarms: Option<Arc<Alarms>> },
}

impl Core {
    /// A core over `registry` as `config` says, keeping its data in `stores`.
    pub fn new(registry: Arc<Registry>, config: Config, stores: Stores) -> Core {
        let metrics = Arc::new(Metrics::default());
        let reader = Arc::new(Reader::new(registry.clone(), &config, &metrics));
        let repeat = Arc::new(RepeatGuard::new(
            config.calls.repeat_failure_limit,
            std::time::Duration::from_secs(config.calls.repeat_failure_window_s),
        ));
        Core::of(registry, config, reader, metrics, stores, repeat, Serves::Devices)
    }

    /// A core whose devices are read through `drivers` (the fleet hub's, which answer
    /// from the fleet's latest values), not through drivers made from the registry.
    pub fn fleet(registry: Arc<Registry>, config: Config, stores: Stores, drivers: Drivers) -> Core {
        let metrics = Arc::new(Metrics::default());
        let reader = Arc::new(Reader::with_drivers(registry.clone(), &config, &metrics, drivers));
        let repeat = Arc::new(RepeatGuard::new(
            config.calls.repeat_failure_limit,
            std::time::Duration::from_secs(config.calls.repeat_failure_window_s),
        ));
        Core::of(registry, config, reader, metrics, stores, repeat, Serves::Fleet { alarms: None })
    }

    /// This core over another registry, read through `drivers`: the same configuration,
    /// metrics, stores and cross-call retry limit (the fleet hub, when births change its
    /// catalogue; `ToolService::renew` takes it).
    pub fn renewed(&self, registry: Arc<Registry>, drivers: Drivers) -> Core {
        let reader = Arc::new(Reader::with_drivers(registry.clone(), &self.config, &self.metrics, drivers));
        let stores = Stores {
            history: self.history.clone(),
            work_orders: self.work_orders.clone(),
            alarms: self.alarms.as_ref().map(|a| a.journal_handle()),
        };
        Core::of(
            registry,
            self.config.clone(),
            reader,
            self.metrics.clone(),
            stores,
            self.repeat.clone(),
            // The hub's alarms are the edges' (none of its catalogue's): one table for
            // every catalogue, kept as the fleet's births renew it.
            if self.fleet { Serves::Fleet { alarms: self.alarms.clone() } } else { Serves::Devices },
        )
    }

    fn of(
        registry: Arc<Registry>,
        config: Config,
        reader: Arc<Reader>,
        metrics: Arc<Metrics>,
        stores: Stores,
        repeat: Arc<RepeatGuard>,
        serves: Serves,
    ) -> Core {
        let (fleet, shared_alarms) = match serves {
            Serves::Devices => (false, None),
            Serves::Fleet { alarms } => (true, alarms),
        };
        let alarms = shared_alarms.or_else(|| {
            stores.alarms.and_then(|journal| match Alarms::new(&registry, journal, &config.alarms) {
                Ok(a) => Some(Arc::new(a)),
                Err(error) => {
                    tracing::error!(%error, "alarms: the journal cannot be read; no alarm is evaluated");
                    None
                }
            })
        });
        let parts = Parts {
            alarms,
            registry,
            config,
            reader,
            metrics,
            history: stores.history,
            work_orders: stores.work_orders,
            feed: Feed::default(),
            repeat,
            sparkplug: OnceLock::new(),
            fleet,
        };
        let core = Core { parts: Arc::new(parts) };
        core.report_metrics();
        core
    }

    /// Registers what the core reports on `/metrics`: each device's breaker, the stores.
    fn report_metrics(&self) {
        let (registry, reader) = (self.registry.clone(), self.reader.clone());
        self.metrics.collect("breakers", move |s| {
            let snapshots: Vec<(&str, crate::resilience::breaker::Snapshot)> = registry
                .devices()
                .iter()
                .filter_map(|d| reader.guard(&d.id).map(|g| (d.id.as_str(), g.breaker.snapshot())))
                .collect();
            let state = |s: &crate::resilience::breaker::Snapshot| match s.state {
                SnapshotState::Closed => 0,
                SnapshotState::HalfOpen => 1,
                SnapshotState::Open => 2,
            };
            s.gauges(
                "fieldgate_breaker_state",
                "Circuit breaker per device: 0 closed, 1 half-open, 2 open.",
                "device",
                snapshots.iter().map(|(d, b)| (*d, state(b))),
            );
            s.gauges(
                "fieldgate_breaker_consecutive_failures",
                "Transient failures in a row per device.",
                "device",
                snapshots.iter().map(|(d, b)| (*d, i64::from(b.consecutive_failures))),
            );
            let clocks: Vec<(&str, u64)> = registry
                .devices()
                .iter()
                .filter_map(|d| reader.clock(&d.id).map(|c| (d.id.as_str(), c.corrections())))
                .collect();
            if !clocks.is_empty() {
                s.counters(
                    "fieldgate_device_clock_corrections",
                    "Samples whose device time was off (moved by the device clock's offset, or replaced by the time received), per device.",
                    "device",
                    clocks,
                );
            }
        });
        if let Some(a) = self.alarms.clone().filter(|a| a.any() || self.fleet) {
            self.metrics.collect("alarms", move |s| a.report(s));
        }
        let (history, orders) = (self.history.clone(), self.work_orders.clone());
        self.metrics.collect("storage", move |s| {
            let failing = history.as_ref().is_some_and(|h| h.problem().is_some())
                || orders.as_ref().is_some_and(|w| w.problem().is_some());
            s.gauge(
                "fieldgate_storage_failing",
                "1 while a store cannot write: history waits in memory (or, with a database, in the data directory), or work orders are refused.",
                i64::from(failing),
            );
            if let Some((free, _)) = history.as_ref().and_then(|h| h.disk_space()) {
                s.gauge(
                    "fieldgate_storage_free_bytes",
                    "Free space of the data directory's filesystem.",
                    i64::try_from(free).unwrap_or(i64::MAX),
                );
            }
            let h = history.as_deref();
            let rows: [(&str, &str, u64); 5] = [
                (
                    "fieldgate_history_flush_failures",
                    "History writes that failed (their points were kept in memory).",
                    h.map_or(0, |h| h.failures()),
                ),
                (
                    "fieldgate_history_points_dropped",
                    "History points dropped because writes failed for longer than memory could hold.",
                    h.map_or(0, |h| h.dropped_points()),
                ),
                (
                    "fieldgate_history_points_late",
                    "History points stored that came before their sensor's newest one (a replay, a sample out of order).",
                    h.map_or(0, |h| h.late_points()),
                ),
                (
                    "fieldgate_history_points_repeated",
                    "History points dropped because their sensor already had a point at that instant.",
                    h.map_or(0, |h| h.repeated_points()),
                ),
                (
                    "fieldgate_history_late_chunks",
                    "History chunks begun for late points (a replay, a sample out of order, a clock that stepped back).",
                    h.map_or(0, |h| h.late_chunks()),
                ),
            ];
            for (name, help, v) in rows {
                s.counter(name, help, v);
            }
            if let Some(r) = h.and_then(|h| h.remote_stats()) {
                s.counter(
                    "fieldgate_history_db_chunks_written",
                    "History chunks written to the database (PostgreSQL).",
                    r.shipped,
                );
                s.counter(
                    "fieldgate_history_db_failures",
                    "Shipments of history chunks to the database that failed (the chunks waited).",
                    r.failures,
                );
                s.gauge(
                    "fieldgate_history_db_chunks_waiting",
                    "History chunks waiting in the data directory for the database.",
                    i64::try_from(r.waiting).unwrap_or(i64::MAX),
                );
            }
        });
    }

    /// When `device` last answered a read.
    pub fn last_success(&self, device: &DeviceId) -> Option<chrono::DateTime<chrono::Utc>> {
        self.reader.guard(device).and_then(|g| g.health.last_success())
    }

    /// Whether a caller is blocked by the retry limit on `device`: fieldgate then probes
    /// the device itself, since that caller will not reach it.
    pub fn blocked_on(&self, device: &DeviceId) -> bool {
        self.repeat
            .blocked_devices(|id| (id == device.as_str()).then(|| self.last_success(device)).flatten())
            .iter()
            .any(|id| id == device.as_str())
    }
}
