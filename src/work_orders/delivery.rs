//! Delivery of approved work orders to the maintenance system (CMMS) through a webhook:
//! at least once, with exponential backoff, surviving restarts (the outbox is in redb and
//! is written in the same transaction as the approval). The work order ID is sent as the
//! `Idempotency-Key`, so the receiver can drop repeats. Also expires pending orders.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::model::WorkOrder;
use super::store::{OutboxEntry, WorkOrderStore};
use super::webhook::Webhook;

/// Deliveries in flight at once, at most.
const PARALLEL: usize = 8;

/// First retry after a failed delivery; doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long to wait before the next attempt after `attempts` failed ones (0 after the
/// first): 1 s, 2 s, 4 s, ... up to 5 minutes, each with the equal jitter of
/// `crate::backoff` (between half and all of it), so that the gateways of a plant do not
/// all retry together when the maintenance system comes back. Computed from the count the
/// outbox keeps, so it survives a restart.
pub fn backoff_ms(attempts: u32) -> i64 {
    let full = FIRST_BACKOFF.saturating_mul(1 << attempts.min(20)).min(MAX_BACKOFF);
    // Rounded up: a wait is never shorter than half its step.
    crate::backoff::jittered(full).as_micros().div_ceil(1000) as i64
}

/// One pass now: deliver what is due, expire what is overdue. Returns deliveries made.
pub async fn pass(store: &Arc<WorkOrderStore>, webhook: Option<&Webhook>, ttl: chrono::Duration) -> usize {
    pass_at(store, webhook, ttl, Utc::now()).await
}

/// One pass as of `now_at` (tests move time forward through backoffs with it): every due
/// order is sent, up to `PARALLEL` at once, and the pass ends when all have answered.
pub async fn pass_at(
    store: &Arc<WorkOrderStore>,
    webhook: Option<&Webhook>,
    ttl: chrono::Duration,
    now_at: chrono::DateTime<Utc>,
) -> usize {
    expire(store, now_at - ttl).await;
    let Some(webhook) = webhook else { return 0 };
    let started = tokio::time::Instant::now();
    let now = now_at.timestamp_millis();
    let Some(due) = due(store, now) else { return 0 };
    let mut delivered = 0;
    let mut posts = futures_util::stream::iter(due)
        .map(|(order, entry)| async move {
            let failure = post(webhook, &order).await;
            (order, entry, failure)
        })
        .buffer_unordered(PARALLEL);
    while let Some((order, entry, failure)) = posts.next().await {
        let at = now + started.elapsed().as_millis() as i64;
        match record(store, &order, &entry, failure, at).await {
            Some(true) => delivered += 1,
            Some(false) => {}
            // Stop this pass rather than hammer a failing disk.
            None => return delivered,
        }
    }
    delivered
}

/// Expires the pending orders created before `cutoff`.
async fn expire(store: &Arc<WorkOrderStore>, cutoff: chrono::DateTime<Utc>) {
    let s = store.clone();
    match tokio::task::spawn_blocking(move || s.expire(cutoff)).await {
        Ok(Ok(expired)) if !expired.is_empty() => {
            tracing::info!(count = expired.len(), "work orders expired")
        }
        Ok(Err(error)) => tracing::error!(%error, "work order expiry failed"),
        _ => {}
    }
}

/// The orders due at `now` (none when the outbox cannot be read, logged).
fn due(store: &WorkOrderStore, now: i64) -> Option<Vec<(WorkOrder, OutboxEntry)>> {
    store.due(now).map_err(|error| tracing::error!(%error, "reading the outbox failed")).ok()
}

/// Sends one order: why it failed, if it did.
async fn post(webhook: &Webhook, order: &WorkOrder) -> Option<super::webhook::Failure> {
    let body = serde_json::to_vec(order).unwrap_or_default();
    webhook.post(&order.id, body).await.err()
}

/// Records one attempt that ended at `at` (Unix ms): delivered, or due again after its
/// backoff from then. `Some(delivered)`, or `None` when the outbox could not be written
/// (the order stays due and is sent again, with the same Idempotency-Key, once it can).
async fn record(
    store: &Arc<WorkOrderStore>,
    order: &WorkOrder,
    entry: &OutboxEntry,
    failure: Option<super::webhook::Failure>,
    at: i64,
) -> Option<bool> {
    let ok = failure.is_none();
    let backoff = backoff_ms(entry.attempts);
    let s = store.clone();
    let id = order.id.clone();
    match tokio::task::spawn_blocking(move || s.delivered(&id, ok, at + backoff)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::error!(work_order = %order.id, %error, delivered = ok, "cannot record the delivery attempt; it will be repeated");
            return None;
        }
        Err(error) => {
            tracing::error!(work_order = %order.id, %error, "delivery bookkeeping failed");
            return None;
        }
    }
    if ok {
        tracing::info!(work_order = %order.id, attempts = entry.attempts + 1, "work order delivered");
    } else {
        let error = failure.map(|f| f.to_string()).unwrap_or_default();
        tracing::warn!(work_order = %order.id, attempts = entry.attempts + 1, retry_in_ms = backoff, %error, "work order delivery failed");
    }
    Some(ok)
}

/// Delivers until `stop`: every second it expires overdue orders and starts sending the
/// orders that have come due, up to `PARALLEL` in flight at once, without waiting for the
/// ones still in flight (a stalled request holds back neither the others nor newly
/// approved orders). `stop` ends it at once: deliveries in flight are dropped and stay due
/// in the outbox (sent again, with the same `Idempotency-Key`, by the next start), so a
/// stalled webhook never holds up a shutdown.
pub fn start(
    store: Arc<WorkOrderStore>,
    webhook: Option<Webhook>,
    ttl_hours: u64,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let ttl = chrono::Duration::hours(ttl_hours as i64);
    tokio::spawn(async move {
        let webhook = webhook.map(Arc::new);
        let mut in_flight = futures_util::stream::FuturesUnordered::new();
        let mut sending: HashSet<String> = HashSet::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    store.recheck();
                    tokio::select! {
                        () = expire(&store, Utc::now() - ttl) => {}
                        () = stop.cancelled() => return,
                    }
                    let Some(webhook) = &webhook else { continue };
                    if in_flight.len() >= PARALLEL {
                        continue;
                    }
                    let due = due(&store, Utc::now().timestamp_millis()).unwrap_or_default();
                    for (order, entry) in due {
                        if in_flight.len() >= PARALLEL {
                            break;
                        }
                        if !sending.insert(order.id.clone()) {
                            continue;
                        }
                        let webhook = webhook.clone();
                        in_flight.push(async move {
                            let failure = post(&webhook, &order).await;
                            (order, entry, failure)
                        });
                    }
                }
                Some((order, entry, failure)) = in_flight.next(), if !in_flight.is_empty() => {
                    sending.remove(&order.id);
                    let at = Utc::now().timestamp_millis();
                    tokio::select! {
                        _ = record(&store, &order, &entry, failure, at) => {}
                        () = stop.cancelled() => return,
                    }
                }
                () = stop.cancelled() => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::backoff_ms;

    #[test]
    fn backoff_doubles_from_a_second_up_to_five_minutes_with_jitter() {
        let full = [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000];
        for _ in 0..100 {
            for (attempts, full) in full.into_iter().enumerate() {
                let wait = backoff_ms(attempts as u32);
                assert!((full / 2..=full).contains(&wait), "{wait} ms outside [{}, {full}]", full / 2);
            }
            assert!(backoff_ms(u32::MAX) <= 300_000, "bounded however many attempts failed");
        }
    }
}
