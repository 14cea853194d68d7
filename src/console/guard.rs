//! Sign-in against guessing: failed sign-ins from one address are answered one at a time,
//! each after a pause, in a task of their own (a client that gives up does not cut the
//! pause short), and at most a few wait per address, the rest refused at once. A good
//! token from another address is never held up by them. The sign-in form's CSRF value is
//! issued by this server (signed with a key made at start), so a client cannot choose it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::tools::Caller;
use crate::transport::auth::Tokens;

/// How long a failed sign-in takes to answer.
const PAUSE: Duration = Duration::from_secs(1);
/// Sign-ins waiting their turn at most, per address and in all.
const WAITING_PER_ADDRESS: usize = 3;
const WAITING: usize = 256;

/// Why a sign-in was not checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Busy {
    /// Too many sign-ins from this address wait already.
    Address,
    /// Too many wait in all.
    Everyone,
}

/// An address's turn (held through a failure's pause) and how many wait for it.
type Queue = (Arc<tokio::sync::Mutex<()>>, usize);

pub struct Guard {
    key: ring::hmac::Key,
    queues: Mutex<HashMap<IpAddr, Queue>>,
    failures: AtomicU64,
}

impl Guard {
    pub fn new() -> Guard {
        let mut secret = [0u8; 32];
        // Without randomness every form is refused (the check below never matches a
        // value signed with a key no one can know), which is safe.
        let _ = getrandom::fill(&mut secret);
        Guard {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
            queues: Mutex::default(),
            failures: AtomicU64::new(0),
        }
    }

    /// A new CSRF value for the sign-in form: random, signed.
    pub fn nonce(&self) -> Option<String> {
        let mut r = [0u8; 16];
        getrandom::fill(&mut r).ok()?;
        let random = hex(&r);
        let tag = ring::hmac::sign(&self.key, random.as_bytes());
        Some(format!("{random}.{}", hex(&tag.as_ref()[..16])))
    }

    /// Whether `nonce` is one this server issued.
    pub fn issued(&self, nonce: &str) -> bool {
        let Some((random, tag)) = nonce.split_once('.') else { return false };
        let Some(tag) = unhex(tag) else { return false };
        tag.len() == 16 && {
            let full = ring::hmac::sign(&self.key, random.as_bytes());
            // Compared in constant time by ring when the whole tag is given; ours is cut,
            // so compare the cut part without an early exit.
            full.as_ref()[..16].iter().zip(&tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        }
    }

    /// Checks `token` from `from` in its turn: the caller, `Ok(None)` for a wrong token
    /// (after the pause), or why it was not checked.
    pub async fn check(
        self: &Arc<Self>,
        from: IpAddr,
        tokens: Arc<Tokens>,
        token: String,
    ) -> Result<Option<Caller>, Busy> {
        let turn = {
            let mut q = self.queues.lock();
            if q.values().map(|(_, n)| n).sum::<usize>() >= WAITING {
                return Err(Busy::Everyone);
            }
            let (turn, waiting) = q.entry(from).or_insert_with(|| (Arc::default(), 0));
            if *waiting >= WAITING_PER_ADDRESS {
                return Err(Busy::Address);
            }
            *waiting += 1;
            turn.clone()
        };
        let me = self.clone();
        let checked = tokio::spawn(async move {
            let held = turn.lock().await;
            let caller = tokens.authenticate(&token);
            if caller.is_none() {
                let failures = me.failures.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(failures, address = %from, "console sign-in refused: the token is not valid");
                tokio::time::sleep(PAUSE).await;
            }
            drop(held);
            let mut q = me.queues.lock();
            if let Some((_, waiting)) = q.get_mut(&from) {
                *waiting -= 1;
                if *waiting == 0 {
                    q.remove(&from);
                }
            }
            caller
        });
        Ok(checked.await.ok().flatten())
    }
}

/// Bytes as lowercase hex.
pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nonces_it_issued_pass() {
        let g = Guard::new();
        let n = g.nonce().unwrap();
        assert!(g.issued(&n));
        assert!(!Guard::new().issued(&n), "another key");
        let (random, _) = n.split_once('.').unwrap();
        for bad in [
            "",
            "x",
            "b".repeat(64).as_str(),
            &format!("{random}.{}", "0".repeat(32)),
            &format!("{random}.zz"),
        ] {
            assert!(!g.issued(bad), "{bad:?}");
        }
    }
}
