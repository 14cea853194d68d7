//! The places of live streams: at most [`MAX_STREAMS`] in all and [`PER_VIEWER`] per
//! viewer (a token, or everyone on a server without tokens). A viewer past its share gets
//! a place by ending its own oldest stream (as a token's sessions do); when all places are
//! taken, a stream that has not taken a snapshot for [`STALLED`] (a client that stopped
//! reading, a laptop asleep) gives its place up. A stream that gives its place up has its
//! connection closed at once (it may never be polled again: its client may not read).

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::live::{MAX_STREAMS, PER_VIEWER};
use crate::transport::Hangup;

/// A stream that took no snapshot for this long (they come every second) is stalled.
pub const STALLED: Duration = Duration::from_secs(30);

struct Held {
    who: String,
    id: u64,
    opened: Instant,
    /// When it last took a snapshot.
    polled: Arc<Mutex<Instant>>,
    ended: Arc<AtomicBool>,
    /// Closes its connection: a stream that gave its place up may never be polled again
    /// (its client stopped reading), so it is not left to end by itself.
    hangup: Hangup,
}

/// The live streams held.
#[derive(Default)]
pub struct Streams {
    held: Mutex<(u64, Vec<Held>)>,
    /// Streams refused (every place taken by streams that keep reading), and given way
    /// (a viewer's oldest or a stalled one ended for a new one).
    refused: AtomicU64,
    ended: AtomicU64,
    log: Mutex<crate::logs::Throttle<&'static str>>,
}

/// One stream's place, given back when the stream ends.
pub struct Slot {
    streams: Arc<Streams>,
    id: u64,
    opened: Instant,
    polled: Arc<Mutex<Instant>>,
    ended: Arc<AtomicBool>,
    hangup: Hangup,
}

impl Streams {
    /// A place for a stream of viewer `who`, or why there is none.
    pub fn take(self: &Arc<Self>, who: String, hangup: Hangup) -> Result<Slot, String> {
        let mut guard = self.held.lock();
        let (next, held) = &mut *guard;
        let end = |held: &mut Vec<Held>, at: usize| {
            let gone = held.remove(at);
            gone.ended.store(true, Ordering::Relaxed);
            gone.hangup.now();
            self.ended.fetch_add(1, Ordering::Relaxed);
        };
        let now = Instant::now();
        let mine: Vec<usize> = (0..held.len()).filter(|&i| held[i].who == who).collect();
        if mine.len() >= PER_VIEWER {
            // Its own oldest goes: one viewer never holds more than its share.
            if let Some(&oldest) = mine.iter().min_by_key(|&&i| held[i].opened) {
                end(held, oldest);
            }
        } else if held.len() >= MAX_STREAMS {
            let stalled = (0..held.len())
                .filter(|&i| now.duration_since(*lock(&held[i].polled)) >= STALLED)
                .min_by_key(|&i| *lock(&held[i].polled));
            match stalled {
                Some(i) => end(held, i),
                None => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    if let Some(left_out) = self.log.lock().allow("full") {
                        tracing::warn!(
                            open = held.len(),
                            max = MAX_STREAMS,
                            left_out,
                            "console live stream refused: every place is taken"
                        );
                    }
                    return Err(format!(
                        "{MAX_STREAMS} live views are open already; close one, or reload later"
                    ));
                }
            }
        }
        *next += 1;
        let (polled, ended) = (Arc::new(Mutex::new(now)), Arc::new(AtomicBool::new(false)));
        let slot = Slot {
            streams: self.clone(),
            id: *next,
            opened: now,
            polled: polled.clone(),
            ended: ended.clone(),
            hangup: hangup.clone(),
        };
        held.push(Held { who, id: *next, opened: now, polled, ended, hangup });
        Ok(slot)
    }

    /// Streams held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.lock().1.len()
    }
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

impl Streams {
    /// Writes the places on `/metrics`: streams open, refused, and ended to make room.
    pub fn report(&self, s: &mut crate::metrics::Sheet<'_>) {
        let open = self.held.lock().1.len();
        s.gauge("fieldgate_console_live_streams", "Console live streams open.", open as i64);
        s.counter(
            "fieldgate_console_live_streams_refused",
            "Console live streams refused: every place taken by streams that keep reading.",
            self.refused.load(Ordering::Relaxed),
        );
        s.counter(
            "fieldgate_console_live_streams_ended",
            "Console live streams ended to make room (a viewer's oldest past its share, or a stalled one).",
            self.ended.load(Ordering::Relaxed),
        );
    }
}

impl Slot {
    /// How long the stream has been open.
    pub fn age(&self) -> std::time::Duration {
        self.opened.elapsed()
    }

    /// Ends the stream's connection (its viewer may no longer look: signed out, expired).
    pub fn hang_up(&self) {
        self.hangup.now();
    }

    /// Whether the stream still has its place (it takes a snapshot now); false once it
    /// was given to another.
    pub fn held(&self) -> bool {
        *lock(&self.polled) = Instant::now();
        !self.ended.load(Ordering::Relaxed)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut guard = self.streams.held.lock();
        guard.1.retain(|h| h.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_viewer_past_its_share_ends_its_own_oldest_and_stalled_ones_give_way() {
        let streams = Arc::new(Streams::default());
        let first = streams.take("a".into(), Hangup::detached()).unwrap();
        let mut a: Vec<Slot> =
            (1..PER_VIEWER).map(|_| streams.take("a".into(), Hangup::detached()).unwrap()).collect();
        assert!(first.held());
        a.push(streams.take("a".into(), Hangup::detached()).unwrap());
        assert!(!first.held(), "its oldest stream gave its place");
        assert!(a.iter().all(Slot::held));
        assert_eq!(streams.len(), PER_VIEWER);
        drop(first);
        assert_eq!(streams.len(), PER_VIEWER, "an ended stream's place is not given twice");

        // Full with streams of others that keep reading: refused.
        let mut others: Vec<Slot> = Vec::new();
        for v in 0..(MAX_STREAMS - PER_VIEWER) {
            others.push(streams.take(format!("v{}", v % 3), Hangup::detached()).unwrap());
        }
        assert_eq!(streams.len(), MAX_STREAMS);
        let full = streams.take("late".into(), Hangup::detached()).err().expect("full");
        assert!(full.starts_with(&format!("{MAX_STREAMS} live views")), "{full}");
        let metrics = crate::metrics::Metrics::default();
        let s = streams.clone();
        metrics.collect("streams", move |sheet| s.report(sheet));
        let text = metrics.render();
        assert!(text.contains(&format!("fieldgate_console_live_streams {MAX_STREAMS}\n")), "{text}");
        assert!(text.contains("fieldgate_console_live_streams_refused_total 1\n"), "{text}");
        assert!(text.contains("fieldgate_console_live_streams_ended_total 1\n"), "{text}");
        // All but viewer a's streams keep reading; a's stop: after STALLED, one gives way.
        tokio::time::advance(STALLED).await;
        others.iter().for_each(|s| {
            s.held();
        });
        let late = streams.take("late".into(), Hangup::detached()).expect("a stalled stream gave way");
        assert!(late.held());
        assert_eq!(a.iter().filter(|s| !s.held()).count(), 1, "exactly one stalled stream ended");
        drop((a, others, late));
        assert_eq!(streams.len(), 0, "every place given back");
    }
}
