//! The sample feed: where fresh samples meet the consumers that want them besides history.
//!
//! Producers (the poller's tasks, the OPC UA subscriptions) publish every batch of fresh
//! samples of one device; consumers (the Sparkplug edge node today, alarms and the hub next)
//! subscribe before the producers start, each with its own bounded queue. Neither side
//! names the other: they meet here. A producer never waits: a full queue loses that batch
//! for that consumer alone, and the consumer's `lost` counter says how many samples.
//!
//! The end of the feed is the end of its producers: once the feed is sealed (after the
//! producers took their publishers) and the last publisher is dropped, every consumer's
//! queue ends, so a consumer stopping with the service still gets what was handed over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::driver::Sample;

/// Fresh samples of one device read together: the device's and each sensor's index in the
/// registry.
#[derive(Debug, Clone)]
pub struct Batch {
    pub device: usize,
    pub samples: Vec<(usize, Sample)>,
}

#[derive(Clone)]
struct Subscriber {
    tx: mpsc::Sender<Arc<Batch>>,
    lost: Arc<AtomicU64>,
}

/// The consumers' queues, until the feed is sealed.
#[derive(Default)]
pub struct Feed {
    subscribers: Mutex<Vec<Subscriber>>,
}

impl Feed {
    /// A consumer's queue of at most `capacity` batches; samples that find it full are
    /// counted in `lost`.
    pub fn subscribe(&self, capacity: usize, lost: Arc<AtomicU64>) -> mpsc::Receiver<Arc<Batch>> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.subscribers.lock().push(Subscriber { tx, lost });
        rx
    }

    /// What a producer publishes through: every consumer subscribed so far.
    pub fn publisher(&self) -> Publisher {
        Publisher { subscribers: self.subscribers.lock().clone().into() }
    }

    /// No consumer joins after this: the queues end when the last publisher is gone.
    pub fn seal(&self) {
        self.subscribers.lock().clear();
    }
}

/// A producer's side of the feed; cheap to clone, one per producing task.
#[derive(Clone, Default)]
pub struct Publisher {
    subscribers: Arc<[Subscriber]>,
}

impl Publisher {
    /// Whether anyone takes samples (a producer gathers none otherwise).
    pub fn wanted(&self) -> bool {
        !self.subscribers.is_empty()
    }

    /// Hands `batch` to every consumer without waiting.
    pub fn send(&self, batch: Batch) {
        if batch.samples.is_empty() || self.subscribers.is_empty() {
            return;
        }
        let n = batch.samples.len() as u64;
        let batch = Arc::new(batch);
        for s in self.subscribers.iter() {
            if s.tx.try_send(batch.clone()).is_err() {
                s.lost.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::RawValue;
    use crate::driver::SampleQuality;

    fn batch(n: usize) -> Batch {
        let sample =
            Sample { value: RawValue::Float(1.0), at: chrono::Utc::now(), quality: SampleQuality::Good };
        Batch { device: 0, samples: (0..n).map(|i| (i, sample.clone())).collect() }
    }

    #[tokio::test]
    async fn every_consumer_gets_every_batch_and_a_full_queue_loses_only_its_own() {
        let feed = Feed::default();
        let (fast_lost, slow_lost) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut fast = feed.subscribe(8, fast_lost.clone());
        let mut slow = feed.subscribe(1, slow_lost.clone());
        let p = feed.publisher();
        feed.seal();
        assert!(p.wanted());
        p.send(batch(2));
        p.send(batch(3));
        p.send(batch(0));
        drop(p);
        let (a, b) = (fast.recv().await.unwrap(), fast.recv().await.unwrap());
        assert_eq!((a.samples.len(), b.samples.len()), (2, 3));
        assert!(fast.recv().await.is_none(), "the queue ends with its last publisher");
        assert_eq!(slow.recv().await.unwrap().samples.len(), 2);
        assert!(slow.recv().await.is_none());
        assert_eq!((fast_lost.load(Ordering::Relaxed), slow_lost.load(Ordering::Relaxed)), (0, 3));
    }

    #[test]
    fn without_consumers_nothing_is_wanted() {
        let feed = Feed::default();
        assert!(!feed.publisher().wanted());
        feed.publisher().send(batch(1));
    }
}
