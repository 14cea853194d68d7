//! The hub's queue of what edge nodes said of their alarms, and the task that journals it
//! (`Alarms::on_remote`) in the order it came, off the broker's task: a full queue, or
//! a node past its share of it, drops the message and asks that node for a rebirth.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::fleet::Fleet;
use crate::tools::ToolService;

/// Edge node (`group/node`) → its alarm messages waiting to be journaled.
pub(super) type Waiting = Arc<Mutex<HashMap<String, usize>>>;

/// What one edge node said of its alarms, with its `group/node`.
pub(super) type AlarmNews = (String, super::alarms::AlarmNews);

/// Messages with alarms waiting to be journaled, at most (beyond: dropped and counted, and
/// the edge node asked for a rebirth, which says its alarms again).
pub(super) const ALARM_NEWS: usize = 256;
/// Of those, one edge node's at most (a node flooding its alarms leaves the others room).
const ALARM_NEWS_PER_EDGE: usize = 64;

/// Queues what edge node `edge` said of its alarms, unless the queue, or that node's share
/// of it, is full: whether it was queued.
pub(super) fn queued(
    queue: &tokio::sync::mpsc::Sender<AlarmNews>,
    waiting: &Waiting,
    edge: String,
    news: super::alarms::AlarmNews,
) -> bool {
    let mut waiting = waiting.lock();
    let n = waiting.get(&edge).copied().unwrap_or(0);
    if n >= ALARM_NEWS_PER_EDGE {
        return false;
    }
    match queue.try_send((edge.clone(), news)) {
        Ok(()) => {
            waiting.insert(edge, n + 1);
            true
        }
        Err(_) => false,
    }
}

/// Messages taken off the queue together at most (one blocking task for them).
const ALARM_BATCH: usize = 64;

/// Journals what the edge nodes said of their alarms, in the order it came, off the
/// async threads, until the hub's task ends, each message in one durable write. An edge
/// node whose transitions the journal did not take is asked for a rebirth.
pub(super) async fn journal_alarms(
    mut rx: tokio::sync::mpsc::Receiver<AlarmNews>,
    tools: ToolService,
    fleet: Arc<Mutex<Fleet>>,
    waiting: Waiting,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < ALARM_BATCH
            && let Ok(more) = rx.try_recv()
        {
            batch.push(more);
        }
        {
            let mut waiting = waiting.lock();
            for (edge, _) in &batch {
                if let Some(n) = waiting.get_mut(edge) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        waiting.remove(edge);
                    }
                }
            }
        }
        let Some(alarms) = tools.core().alarms.clone() else { continue };
        let done = tokio::task::spawn_blocking(move || {
            let mut lost = Vec::new();
            for (edge, news) in batch {
                alarms.remote_left_out(news.left_out);
                if alarms.on_remote(&edge, news.birth, news.alarms) > 0 {
                    lost.push(edge);
                }
            }
            lost
        });
        match done.await {
            Ok(lost) => {
                let mut fleet = fleet.lock();
                for edge in lost {
                    if let Some((group, node)) = edge.split_once('/') {
                        fleet.want_rebirth(group, node);
                    }
                }
            }
            Err(_) => tracing::error!("hub: an edge's alarms could not be journaled"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_flooding_its_alarms_takes_its_share_of_the_queue_only() {
        let (tx, _rx) = tokio::sync::mpsc::channel(ALARM_NEWS);
        let waiting = Waiting::default();
        let news = super::super::alarms::AlarmNews::default;
        let sent = (0..ALARM_NEWS).filter(|_| queued(&tx, &waiting, "X/fake".into(), news())).count();
        assert_eq!(sent, ALARM_NEWS_PER_EDGE);
        assert!(queued(&tx, &waiting, "B/gw-b".into(), news()), "another node still has room");
        assert_eq!(waiting.lock().get("X/fake"), Some(&ALARM_NEWS_PER_EDGE));
    }
}
