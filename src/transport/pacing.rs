//! Token checks against guessing, shared by the API's bearer check and the console's
//! sign-in. A right token is accepted at once, whatever else its address is doing: guesses
//! from the same address (a NAT, a TLS proxy on loopback) or from many addresses never lock
//! a token's holder out. A wrong token is answered one at a time per address, each after a
//! pause, in a task of its own (a client that gives up does not cut the pause short); past a
//! few waiting per address a wrong one is answered `Busy` at once. That tells a guesser
//! "wrong" sooner, but costs it the pause's log line and a place: what makes guessing
//! hopeless is the tokens' length (16 characters at least), what the pause buys is a slow,
//! quiet log. IPv6 addresses count per /64 (one host can hold a whole /64).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::tools::Caller;

/// How long a wrong token takes to answer.
pub const PAUSE: Duration = Duration::from_secs(1);
/// Wrong tokens waiting per address at most.
const WAITING_PER_ADDRESS: usize = 3;
/// Wrong tokens waiting their turn in all; past it a wrong token waits its pause in the
/// request itself, holding its address's place.
const QUEUED: usize = 256;

/// Why a token is wrong, for the audit log: a word, and for an access token who it
/// claims to be (unverified, already cut to printable text).
#[derive(Debug, Default)]
pub struct Refusal {
    pub reason: &'static str,
    pub claimed_sub: Option<String>,
    pub claimed_iss: Option<String>,
}

impl From<&'static str> for Refusal {
    fn from(reason: &'static str) -> Refusal {
        Refusal { reason, ..Refusal::default() }
    }
}

/// Why a token was not checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Busy {
    /// Too many wrong tokens from this address wait already.
    Address,
}

/// An address's turn (held through a failure's pause) and how many wait for it.
type Queue = (Arc<tokio::sync::Mutex<()>>, usize);

#[derive(Default)]
pub struct Pacer {
    queues: Mutex<HashMap<IpAddr, Queue>>,
    queued: AtomicUsize,
    failures: AtomicU64,
    /// Wrong tokens are logged once a minute per door (with how many were left out).
    log: Mutex<crate::logs::Throttle<&'static str>>,
}

/// An address's place among the waiting: given back when dropped.
struct Place {
    pacer: Arc<Pacer>,
    key: IpAddr,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut q = self.pacer.queues.lock();
        if let Some((_, waiting)) = q.get_mut(&self.key) {
            *waiting -= 1;
            if *waiting == 0 {
                q.remove(&self.key);
            }
        }
    }
}

/// The address as counted: IPv4 (also mapped into IPv6) as it is, IPv6 by its /64.
fn key(from: IpAddr) -> IpAddr {
    match from {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
        v4 => v4,
    }
}

impl Pacer {
    /// Wrong tokens seen since start.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Checks a token from `from` with `authenticate` (the caller, or why the token is
    /// refused): the caller at once, `Ok(None)` for a wrong token (after the pause), or
    /// `Busy` for a wrong one when too many of its address's wait. `what` names the door in
    /// the audit log: one event a minute per door at most, with the failures left out
    /// counted in it (a flood of wrong tokens cannot fill the disk).
    pub async fn check(
        self: &Arc<Self>,
        what: &'static str,
        from: IpAddr,
        authenticate: impl FnOnce() -> Result<Caller, Refusal>,
    ) -> Result<Option<Caller>, Busy> {
        let refusal = match authenticate() {
            Ok(caller) => return Ok(Some(caller)),
            Err(refusal) => refusal,
        };
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(skipped) = self.log.lock().allow(what) {
            tracing::warn!(
                target: "audit",
                event = "authentication",
                outcome = "failure",
                door = what,
                address = %from,
                reason = refusal.reason,
                claimed_sub = refusal.claimed_sub.as_deref(),
                claimed_iss = refusal.claimed_iss.as_deref(),
                failures,
                skipped,
                "{what} refused: the token is not valid"
            );
        }
        let place = self.admit(key(from))?;
        if self.queued.fetch_add(1, Ordering::Relaxed) >= QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            tokio::time::sleep(PAUSE).await;
            return Ok(None);
        }
        let me = self.clone();
        let paused = tokio::spawn(async move {
            let held = place.turn.lock().await;
            tokio::time::sleep(PAUSE).await;
            drop(held);
            drop(place);
            me.queued.fetch_sub(1, Ordering::Relaxed);
        });
        let _ = paused.await;
        Ok(None)
    }

    fn admit(self: &Arc<Self>, key: IpAddr) -> Result<Place, Busy> {
        let mut q = self.queues.lock();
        let (turn, waiting) = q.entry(key).or_insert_with(|| (Arc::default(), 0));
        if *waiting >= WAITING_PER_ADDRESS {
            return Err(Busy::Address);
        }
        *waiting += 1;
        Ok(Place { pacer: self.clone(), key, turn: turn.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let a: Ipv6Addr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(key(a.into()), key(b.into()));
        assert_ne!(key(a.into()), key(c.into()));
        let mapped = Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped();
        assert_eq!(key(mapped.into()), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)));
    }

    /// One operator token, `ops`.
    fn check(
        p: &Arc<Pacer>,
        from: IpAddr,
        token: &str,
    ) -> impl Future<Output = Result<Option<Caller>, Busy>> + use<> {
        let right = token == "operator-secret-123456";
        let (p, token) = (p.clone(), "ops".to_string());
        async move {
            let caller = move || {
                right
                    .then(|| crate::tools::Caller::with_role(token, crate::tools::Role::Operator))
                    .ok_or_else(|| "wrong".into())
            };
            p.check("test", from, caller).await
        }
    }

    /// Many addresses guessing at once hold up neither a good token nor each other's
    /// places; the address that guesses most is refused unchecked past its few places.
    #[tokio::test(start_paused = true)]
    async fn guessing_from_many_addresses_locks_nobody_out() {
        let pacer = Arc::new(Pacer::default());
        let mut guesses = tokio::task::JoinSet::new();
        for i in 0..400u32 {
            let from = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i / 2));
            guesses.spawn(check(&pacer, from, "a-wrong-guess-0000"));
        }
        while pacer.failures() < 400 {
            tokio::task::yield_now().await;
        }
        let from = IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1));
        let good = check(&pacer, from, "operator-secret-123456").await;
        assert_eq!(good.map(|c| c.map(|c| c.id)), Ok(Some("ops".to_string())));
        let guesser = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0));
        assert_eq!(check(&pacer, guesser, "x").await, Ok(None), "its third place");
        let mut wrong = 0;
        while let Some(r) = guesses.join_next().await {
            assert_eq!(r.unwrap(), Ok(None));
            wrong += 1;
        }
        assert_eq!(wrong, 400);
        assert!(pacer.queues.lock().is_empty(), "every place given back");
        assert_eq!(pacer.queued.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_address_gets_one_answer_a_pause_and_a_few_places() {
        let pacer = Arc::new(Pacer::default());
        let from = IpAddr::V4(Ipv4Addr::new(10, 1, 1, 1));
        let start = tokio::time::Instant::now();
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let wrong = check(&pacer, from, "wrong-wrong-wrong");
            waiting.spawn(async move { (wrong.await, start.elapsed()) });
        }
        while pacer.failures() < 3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(check(&pacer, from, "another-wrong-one").await.err(), Some(Busy::Address));
        let right = check(&pacer, from, "operator-secret-123456").await;
        assert!(matches!(right, Ok(Some(_))), "a right token from the busy address is let in at once");
        let mut took: Vec<Duration> = Vec::new();
        while let Some(r) = waiting.join_next().await {
            let (answer, after) = r.unwrap();
            assert_eq!(answer, Ok(None));
            took.push(after);
        }
        took.sort();
        assert_eq!(took, vec![PAUSE, PAUSE * 2, PAUSE * 3], "one at a time");
        assert_eq!(pacer.failures(), 4, "every wrong token counted, the refused one too");
        // While some of an address's wrong tokens still wait, the ones answered give their
        // places back one by one: the address never holds more than its few.
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let wrong = check(&pacer, from, "wrong-wrong-wrong");
            waiting.spawn(wrong);
        }
        while pacer.failures() < 7 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(PAUSE).await;
        assert_eq!(waiting.join_next().await.map(|r| r.unwrap()), Some(Ok(None)), "the first answered");
        let again = tokio::spawn(check(&pacer, from, "one-more-wrong"));
        while pacer.failures() < 8 {
            tokio::task::yield_now().await;
        }
        assert_eq!(check(&pacer, from, "and-another-wrong").await.err(), Some(Busy::Address), "3 wait again");
        assert_eq!(again.await.unwrap(), Ok(None));
        while let Some(r) = waiting.join_next().await {
            assert_eq!(r.unwrap(), Ok(None));
        }
        assert!(pacer.queues.lock().is_empty(), "every place given back");
    }
}
