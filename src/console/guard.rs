//! The sign-in form's CSRF value: issued by this server (signed with a key made at
//! start), so a client cannot choose it. Wrong tokens are paced where every door's are
//! (`transport/pacing.rs`, through `Tokens::check`).

pub struct Guard {
    key: ring::hmac::Key,
}

impl Guard {
    pub fn new() -> Guard {
        let mut secret = [0u8; 32];
        // Without randomness every form is refused (the check below never matches a
        // value signed with a key no one can know), which is safe.
        let _ = getrandom::fill(&mut secret);
        Guard { key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret) }
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
        // Two bytes of the tag changed alike: every difference counts, none cancels another.
        let (random, tag) = n.split_once('.').unwrap();
        let mut bytes = unhex(tag).unwrap();
        bytes[0] ^= 0x01;
        bytes[1] ^= 0x01;
        assert!(!g.issued(&format!("{random}.{}", hex(&bytes))), "a tag wrong in two bytes");
    }
}
