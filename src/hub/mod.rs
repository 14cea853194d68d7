//! The fleet hub: a Sparkplug B primary host application over the brokers the edges
//! already publish to, serving the same tools for every edge node of the fleet.
//!
//! `fleet.rs` the fleet as the host sees it, without I/O (births, deaths, `seq`, aliases,
//! latest values, rebirth requests); `metric.rs` what a metric says (properties, quality,
//! its value as its datatype says); `catalogue.rs` the fleet as a registry the tools answer
//! from (conflicts withheld); `source.rs` the fleet's latest values behind the `Driver`
//! trait (`EDGE_OFFLINE`, stale values); `run.rs` the task on the broker.

mod alarm_queue;
pub mod alarms;
pub mod catalogue;
pub mod fleet;
pub mod metric;
mod run;
pub mod source;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::hub::HubConfig;
use crate::driver::{Driver, Drivers};
use crate::metrics::Sheet;
use crate::registry::Registry;
use crate::tools::ToolService;
use fleet::{Fleet, Timing};

/// The largest message the hub takes (a DBIRTH of 10,000 metrics with their properties is
/// about 2 MiB).
pub const MAX_MESSAGE: usize = 16 << 20;

/// The hub's fleet and its driver, made before the core that reads through it.
#[derive(Clone)]
pub struct Hub {
    pub fleet: Arc<Mutex<Fleet>>,
    driver: Arc<dyn Driver>,
    counters: Arc<Counters>,
}

impl Hub {
    pub fn new(cfg: &HubConfig) -> Hub {
        let timing = Timing {
            reorder_timeout: Duration::from_millis(cfg.reorder_timeout_ms),
            rebirth_cooldown: Duration::from_millis(cfg.rebirth_cooldown_ms),
        };
        let fleet = Arc::new(Mutex::new(Fleet::new(timing)));
        let counters = Arc::new(Counters::default());
        let driver: Arc<dyn Driver> =
            Arc::new(source::FleetDriver { fleet: fleet.clone(), counters: counters.clone() });
        Hub { fleet, driver, counters }
    }

    /// Every device of `registry` read from the fleet.
    pub fn drivers(&self, registry: &Registry) -> Drivers {
        Drivers::shared(registry, self.driver.clone())
    }
}

/// What `/metrics` and `get_device_status` show of the hub.
#[derive(Default)]
pub struct Counters {
    pub connects: AtomicU64,
    pub messages: AtomicU64,
    /// Values applied (live and historical).
    pub values: AtomicU64,
    pub undecodable: AtomicU64,
    /// Edge messages with alarms dropped: more waited to be journaled than the queue holds.
    pub alarm_news_dropped: AtomicU64,
    pub rebirths_requested: AtomicU64,
    pub sensors: AtomicU64,
    pub online: AtomicBool,
    pub broker: Mutex<String>,
    pub link_error: Mutex<Option<String>>,
    pub left: Mutex<catalogue::Left>,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn report(&self, s: &mut Sheet<'_>, fleet: &Mutex<Fleet>) {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (edges, online, dropped, gaps) = {
            let f = fleet.lock();
            let e = f.edges();
            (
                e.len(),
                e.iter().filter(|e| e.status.is_online()).count(),
                e.iter().map(|e| e.stats.dropped).sum::<u64>(),
                e.iter().map(|e| e.stats.gaps).sum::<u64>(),
            )
        };
        s.gauge("fieldgate_hub_edge_nodes", "Edge nodes the hub has seen.", edges as i64);
        s.gauge("fieldgate_hub_edge_nodes_online", "Edge nodes online (born, not dead).", online as i64);
        let left = self.left.lock().clone();
        s.gauge(
            "fieldgate_hub_metrics_not_served",
            "Metrics of born devices not served as sensors: names that are no sensor IDs, devices whose ID is no device ID, sensors not of their device's plant and zone, sensors of a device whose ID another edge node's claim holds.",
            (left.not_sensor_ids + left.not_device_ids + left.misplaced + left.superseded) as i64,
        );
        s.counter(
            "fieldgate_hub_messages_dropped",
            "Messages dropped: repeats (seq already passed), without seq, undecodable, or of an edge node, device or alias not born.",
            dropped,
        );
        s.counter(
            "fieldgate_hub_seq_gaps",
            "Gaps in an edge node's seq that lasted the reorder timeout.",
            gaps,
        );
        s.gauge(
            "fieldgate_hub_online",
            "1 while the hub's STATE is online on a broker.",
            i64::from(self.online.load(Ordering::Relaxed)),
        );
        s.gauge("fieldgate_hub_sensors", "Sensors in the fleet's catalogue.", n(&self.sensors) as i64);
        for (name, help, v) in [
            ("fieldgate_hub_connects", "Connections made to a broker.", n(&self.connects)),
            ("fieldgate_hub_messages", "Messages received from the broker.", n(&self.messages)),
            ("fieldgate_hub_values", "Metric values applied (live and historical).", n(&self.values)),
            (
                "fieldgate_hub_undecodable_messages",
                "Messages whose payload is no Sparkplug B payload.",
                n(&self.undecodable),
            ),
            (
                "fieldgate_hub_alarm_messages_dropped",
                "Edge messages with alarms not journaled: more waited than the queue holds (the edge's next birth says them again).",
                n(&self.alarm_news_dropped),
            ),
            (
                "fieldgate_hub_rebirth_requests",
                "Node Control/Rebirth commands sent.",
                n(&self.rebirths_requested),
            ),
        ] {
            s.counter(name, help, v);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    NoBroker(&'static str),
    #[error("{0}")]
    Link(#[from] crate::spb::link::LinkError),
    #[error("hub: cannot start its thread: {0}")]
    Thread(String),
}

/// Starts the hub's task over `tools` (whose core reads through `hub`'s driver).
pub fn start(
    hub: Hub,
    tools: &ToolService,
    env: impl Fn(&str) -> Option<String>,
    stop: CancellationToken,
) -> Result<(JoinHandle<()>, Arc<Counters>), HubError> {
    let cfg = tools.config().hub.clone();
    let brokers: Vec<_> =
        cfg.link.brokers.iter().filter_map(|b| crate::config::mqtt::parse_broker(b).ok()).collect();
    let unread = brokers.is_empty().then_some("hub.brokers: no broker URL could be read");
    if let Some(why) = crate::config::hub::start_problem(&cfg).or(unread) {
        return Err(HubError::NoBroker(why));
    }
    let mut settings =
        crate::spb::link::Settings::of(&(&cfg.link).into(), &format!("fieldgate-{}", cfg.host_id), env)?;
    // Births of large devices are large; anything larger than this drops the connection.
    settings.max_incoming = MAX_MESSAGE;
    let counters = hub.counters.clone();
    let (c, fleet) = (counters.clone(), hub.fleet.clone());
    tools.metrics().collect("hub", move |s| c.report(s, &fleet));
    tracing::info!(host_id = %cfg.host_id, brokers = ?cfg.link.brokers, groups = ?cfg.groups, "fleet hub starting");
    let host = run::Host::new(cfg, brokers, settings, hub, tools.clone(), counters.clone());
    // The host gets a thread of its own: a burst of messages (a fleet's births, a replay
    // after an outage) must not hold up the tools' answers on the shared workers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("hub-host")
        .build()
        .map_err(|e| HubError::Thread(e.to_string()))?;
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("hub-host".into())
        .spawn(move || {
            runtime.block_on(host.run(stop));
            let _ = done.send(());
        })
        .map_err(|e| HubError::Thread(e.to_string()))?;
    Ok((
        tokio::spawn(async move {
            let _ = finished.await;
        }),
        counters,
    ))
}
