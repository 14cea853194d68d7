//! The hub bench's variants, after the steady window: one DDATA message in 1,000 not sent;
//! an edge node killed (its connection closed without DISCONNECT, as after `kill -9`) and
//! started again; the broker stopped for `HUB_BENCH_OUTAGE_S` (default 60 s) while the edge
//! nodes keep what they could not send, then started again. Figures printed, not asserted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::json;

use super::fleet_gen::{DEVICES, Edge, Offered, TAGS, now_ms, sensor, value};
use super::{EDGES, call, metric};

/// The hub under test, and the generator's runtime.
pub struct Hub<'a> {
    pub http: &'a reqwest::Client,
    pub addr: &'a str,
    pub generator: &'a tokio::runtime::Handle,
}

impl Hub<'_> {
    async fn metric(&self, name: &str) -> f64 {
        metric(self.http, self.addr, name).await
    }

    async fn call(&self, tool: &str, args: serde_json::Value) -> serde_json::Value {
        call(self.http, self.addr, tool, args).await
    }

    /// Waits (at most `limit`, else panics saying for what) until `done` holds.
    async fn until<F, Fut>(&self, what: &str, limit: Duration, mut done: F) -> Duration
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let t = Instant::now();
        while !done().await {
            assert!(t.elapsed() < limit, "{what} within {} s", limit.as_secs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        t.elapsed()
    }

    async fn fleet_online(&self) -> bool {
        self.metric("fieldgate_hub_edge_nodes_online").await == EDGES as f64
    }
}

/// One DDATA message in 1,000 is not sent for 20 s: each gap should cost its edge node one
/// rebirth request (one per cooldown when two gaps of one node fall close together).
pub async fn dropped_messages(hub: &Hub<'_>, edges: &[Arc<Edge>], offered: &Offered) {
    let before: Vec<(u64, u64)> = edges
        .iter()
        .map(|e| (e.dropped.load(Ordering::SeqCst), e.rebirths_asked.load(Ordering::SeqCst)))
        .collect();
    let (gaps0, asked0) = (
        hub.metric("fieldgate_hub_seq_gaps_total").await,
        hub.metric("fieldgate_hub_rebirth_requests_total").await,
    );
    offered.drop_one_in.store(1000, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await;
    offered.drop_one_in.store(0, Ordering::SeqCst);
    // The last gap waits out the reorder timeout (2 s), then its rebirth.
    let quiet = Instant::now();
    let mut last = hub.metric("fieldgate_hub_rebirth_requests_total").await;
    while quiet.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = hub.metric("fieldgate_hub_rebirth_requests_total").await;
        assert!(quiet.elapsed() < Duration::from_secs(60) || now == last, "rebirth requests settle");
        last = now;
    }
    let (mut drops, mut hit, mut once, mut more, mut none, mut innocent) = (0, 0, 0, 0, 0, 0);
    for (e, (d0, a0)) in edges.iter().zip(before) {
        let d = e.dropped.load(Ordering::SeqCst) - d0;
        let a = e.rebirths_asked.load(Ordering::SeqCst) - a0;
        drops += d;
        match (d, a) {
            (0, 0) => {}
            (0, a) => innocent += a,
            (_, 0) => none += 1,
            (d, a) => {
                hit += 1;
                if a == 1 || a <= d {
                    once += 1;
                } else {
                    more += 1;
                }
            }
        }
    }
    println!(
        "variant, 1 DDATA in 1,000 not sent for 20 s: {drops} messages dropped on {} edge nodes; {} seq gaps and {} rebirth requests at the hub",
        hit + none,
        hub.metric("fieldgate_hub_seq_gaps_total").await - gaps0,
        hub.metric("fieldgate_hub_rebirth_requests_total").await - asked0,
    );
    println!(
        "  edge nodes asked once per gap (or fewer, within the cooldown): {once}; asked more: {more}; not asked: {none}; requests to edge nodes without a gap: {innocent}   target: one per affected edge"
    );
    hub.until("the fleet online again after the gaps", Duration::from_secs(60), || hub.fleet_online()).await;
}

/// Edge node 7's connection dies without DISCONNECT: its will (NDEATH) → `EDGE_OFFLINE`;
/// then it connects again → values again.
pub async fn edge_killed(hub: &Hub<'_>, edges: &[Arc<Edge>]) {
    let victim = &edges[7];
    let id = sensor(7, 1, 5);
    victim.kill();
    let offline = hub
        .until("EDGE_OFFLINE for a killed edge node's sensor", Duration::from_secs(60), || async {
            hub.call("get_sensor_reading", json!({"sensor_id": id})).await["error"]["code"] == "EDGE_OFFLINE"
        })
        .await;
    let e = hub.call("get_sensor_reading", json!({"sensor_id": id})).await;
    victim.restart(hub.generator);
    let back = hub
        .until("values again from the restarted edge node", Duration::from_secs(60), || async {
            hub.call("get_sensor_reading", json!({"sensor_id": id})).await["ok"] == true
        })
        .await;
    println!(
        "variant, an edge node killed (connection closed, no DISCONNECT): EDGE_OFFLINE after {:.0} ms (retry_after_ms {}); values again {:.1} s after it started again",
        offline.as_secs_f64() * 1e3,
        e["error"]["retry_after_ms"],
        back.as_secs_f64(),
    );
}

/// The broker stopped for the outage, started again: the edge nodes send what they kept as
/// historical DDATA after their births, and the hub's history covers the outage.
pub async fn broker_outage(
    hub: &Hub<'_>,
    edges: &[Arc<Edge>],
    offered: &Offered,
    mut broker: tokio::process::Child,
    conf: &std::path::Path,
    port: u16,
) -> tokio::process::Child {
    let outage = Duration::from_secs(
        std::env::var("HUB_BENCH_OUTAGE_S").ok().and_then(|v| v.parse().ok()).unwrap_or(60),
    );
    let (gaps0, live0) =
        (hub.metric("fieldgate_hub_seq_gaps_total").await, offered.metrics.load(Ordering::SeqCst));
    let (values0, dropped0, asked0, hist0) = (
        hub.metric("fieldgate_hub_values_total").await,
        hub.metric("fieldgate_hub_messages_dropped_total").await,
        hub.metric("fieldgate_hub_rebirth_requests_total").await,
        offered.historical.load(Ordering::SeqCst),
    );
    let start = now_ms();
    // From here the edge nodes follow the hub as their primary host: they publish only
    // while its STATE says online, and keep the rest (a fieldgate edge with
    // `primary_host_id` does the same).
    *offered.primary_host.lock().expect("not poisoned") = Some("bench-hub".to_string());
    let _ = broker.start_kill();
    let _ = broker.wait().await;
    tokio::time::sleep(outage / 2).await;
    let during = hub.call("get_sensor_reading", json!({"sensor_id": sensor(3, 2, 1)})).await;
    // The same call with nothing to ingest: what the hub's answer costs by itself.
    let mut idle = Vec::new();
    for k in 0..300 {
        let t = Instant::now();
        hub.call("get_sensor_reading", json!({"sensor_id": sensor(k % EDGES, 1, 5)})).await;
        idle.push(t.elapsed());
    }
    let idle_p50 = super::pct(&mut idle, 0.5);
    tokio::time::sleep(outage - outage / 2).await;
    let end = now_ms();
    let broker = super::mosquitto(conf, port).await;
    let back = Instant::now();
    let online =
        hub.until("the fleet online after the outage", Duration::from_secs(120), || hub.fleet_online()).await;
    let kept = (end - start) / 1000 * (EDGES * DEVICES * TAGS) as u64;
    hub.until("the edge nodes sent what they kept", Duration::from_secs(300), || async {
        offered.historical.load(Ordering::SeqCst) - hist0 >= kept * 9 / 10
            && edges.iter().all(|e| e.connected.load(Ordering::SeqCst))
    })
    .await;
    // The hub's history over the outage, for sensors across the fleet: every second there,
    // each value the one the generator computes for its time.
    let from = DateTime::<Utc>::from_timestamp_millis((start - 5_000) as i64).expect("a time");
    let to = DateTime::<Utc>::from_timestamp_millis((end + 5_000) as i64).expect("a time");
    let mut report = Vec::new();
    loop {
        report.clear();
        for edge in [0, 33, 66, 99] {
            let (device, tag) = (edge % DEVICES, (edge * 7) % TAGS);
            let args = json!({"sensor_id": sensor(edge, device, tag), "from": from.to_rfc3339(), "to": to.to_rfc3339(), "limit": 5000});
            let e = hub.call("get_sensor_history", args).await;
            let points = e["data"]["points"].as_array().cloned().unwrap_or_default();
            let times: Vec<i64> = points
                .iter()
                .filter_map(|p| DateTime::parse_from_rfc3339(p["t"].as_str()?).ok())
                .map(|t| t.timestamp_millis())
                .collect();
            let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(i64::MAX);
            let wrong = points
                .iter()
                .zip(&times)
                .filter(|(p, t)| p["value"].as_f64() != Some(value(edge, device, tag, **t as u64)))
                .count();
            let spans = times.first().is_some_and(|&f| f <= start as i64)
                && times.last().is_some_and(|&l| l >= end as i64);
            report.push((edge, points.len(), gap, wrong, spans));
        }
        if report.iter().all(|&(_, _, gap, wrong, spans)| gap <= 1_500 && wrong == 0 && spans) {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(300),
            "the hub's history covers the outage within 300 s: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let covered = back.elapsed();
    // Everything offered since the outage began applied (what was kept, and live values
    // that queued behind it).
    let offered_since =
        || offered.historical.load(Ordering::SeqCst) - hist0 + offered.metrics.load(Ordering::SeqCst) - live0;
    loop {
        let applied = hub.metric("fieldgate_hub_values_total").await - values0;
        if applied >= offered_since() as f64 * 0.999 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(300),
            "the hub caught up within 300 s ({applied} of {})",
            offered_since()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let caught_up = back.elapsed();
    println!(
        "variant, broker stopped {:.0} s: a reading during it {}; fleet online {:.1} s after the broker returned; {} historical metrics sent; history complete {:.1} s after the return; everything applied after {:.1} s",
        outage.as_secs_f64(),
        during["error"]["code"].as_str().map_or_else(
            || format!("{} age {} ms", during["data"]["quality"], during["data"]["age_ms"]),
            str::to_string
        ),
        online.as_secs_f64(),
        offered.historical.load(Ordering::SeqCst) - hist0,
        covered.as_secs_f64(),
        caught_up.as_secs_f64(),
    );
    println!("  a reading at the hub with nothing to ingest (the broker away): p50 {idle_p50:.3} ms");
    println!(
        "  hub: {:.0} values applied of {} offered (live and historical), {} messages dropped, {} seq gaps, {} rebirth requests; history over the outage (edge, points, largest gap ms, wrong values, spans it): {report:?}",
        hub.metric("fieldgate_hub_values_total").await - values0,
        offered_since(),
        hub.metric("fieldgate_hub_messages_dropped_total").await - dropped0,
        hub.metric("fieldgate_hub_seq_gaps_total").await - gaps0,
        hub.metric("fieldgate_hub_rebirth_requests_total").await - asked0,
    );
    broker
}
