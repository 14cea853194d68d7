//! Delivery of approved work orders to the maintenance system (CMMS) through a webhook:
//! at least once, with exponential backoff, surviving restarts (the outbox is in redb and
//! is written in the same transaction as the approval). The work order ID is sent as the
//! `Idempotency-Key`, so the receiver can drop repeats. Also expires pending orders.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::store::WorkOrderStore;
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

/// One pass as of `now_at` (tests move time forward through backoffs with it).
pub async fn pass_at(
    store: &Arc<WorkOrderStore>,
    webhook: Option<&Webhook>,
    ttl: chrono::Duration,
    now_at: chrono::DateTime<Utc>,
) -> usize {
    let s = store.clone();
    let cutoff = now_at - ttl;
    match tokio::task::spawn_blocking(move || s.expire(cutoff)).await {
        Ok(Ok(expired)) if !expired.is_empty() => {
            tracing::info!(count = expired.len(), "work orders expired")
        }
        Ok(Err(error)) => tracing::error!(%error, "work order expiry failed"),
        _ => {}
    }
    let Some(webhook) = webhook else { return 0 };
    let now = now_at.timestamp_millis();
    let due = match store.due(now) {
        Ok(d) => d,
        Err(error) => {
            tracing::error!(%error, "reading the outbox failed");
            return 0;
        }
    };
    let mut delivered = 0;
    // Up to `PARALLEL` at once, each recorded as it ends: one stalled request does not hold
    // back the others for its timeout.
    let mut posts = futures_util::stream::iter(due)
        .map(|(order, entry)| async move {
            let body = serde_json::to_vec(&order).unwrap_or_default();
            let failure = webhook.post(&order.id, body).await.err();
            (order, entry, failure)
        })
        .buffer_unordered(PARALLEL);
    while let Some((order, entry, failure)) = posts.next().await {
        let ok = failure.is_none();
        let backoff = backoff_ms(entry.attempts);
        let s = store.clone();
        let id = order.id.clone();
        match tokio::task::spawn_blocking(move || s.delivered(&id, ok, now + backoff)).await {
            Ok(Ok(())) => {}
            // Not recorded: the order stays due, and is sent again (same Idempotency-Key)
            // once the store writes again. Stop this pass rather than hammer a failing disk.
            Ok(Err(error)) => {
                tracing::error!(work_order = %order.id, %error, delivered = ok, "cannot record the delivery attempt; it will be repeated");
                return delivered;
            }
            Err(error) => {
                tracing::error!(work_order = %order.id, %error, "delivery bookkeeping failed");
                return delivered;
            }
        }
        if ok {
            delivered += 1;
            tracing::info!(work_order = %order.id, attempts = entry.attempts + 1, "work order delivered");
        } else {
            let error = failure.map(|f| f.to_string()).unwrap_or_default();
            tracing::warn!(work_order = %order.id, attempts = entry.attempts + 1, retry_in_ms = backoff, %error, "work order delivery failed");
        }
    }
    delivered
}

/// Runs `pass` every second until `stop`, which also ends a pass in the middle: deliveries
/// in flight are dropped and stay due in the outbox (sent again, with the same
/// `Idempotency-Key`, by the next start), so a stalled webhook never holds up a shutdown.
pub fn start(
    store: Arc<WorkOrderStore>,
    webhook: Option<Webhook>,
    ttl_hours: u64,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let ttl = chrono::Duration::hours(ttl_hours as i64);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    store.recheck();
                    tokio::select! {
                        _ = pass(&store, webhook.as_ref(), ttl) => {}
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
