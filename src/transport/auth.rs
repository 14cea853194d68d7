//! Bearer tokens: static ones from a TOML file and `FIELDGATE_TOKEN_<NAME>=<role>:<token>`
//! (never from device files; compared in constant time), and the identity provider's
//! access tokens when `[server.oauth]` is set (`oauth/`). A presented token that is a JWT
//! goes to the provider's check; any other is compared with the static ones.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use super::oauth::{OAuth, TokenError};
pub use super::pacing::Busy;
use super::pacing::Pacer;

use crate::config::TOKEN_ENV_PREFIX;
use crate::toml_reader::{Doc, Problem, Table};
use crate::tools::{Caller, Role};

/// Shortest token accepted: guessing must be hopeless.
const MIN_TOKEN_LEN: usize = 16;

struct Token {
    name: String,
    role: Role,
    secret: Vec<u8>,
}

/// The configured tokens, the identity provider's check, and the pacing of wrong ones
/// (one [`Pacer`] for every door).
#[derive(Default)]
pub struct Tokens {
    tokens: Vec<Token>,
    oauth: Option<Arc<OAuth>>,
    pacer: Arc<Pacer>,
    /// Tokens refused, by reason, and requests refused for a missing scope (`/metrics`).
    refused: parking_lot::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    scope_refused: std::sync::atomic::AtomicU64,
    /// One audit line a minute per caller refused for a scope (a caller with a valid token
    /// can send refused requests as fast as it likes).
    scope_log: parking_lot::Mutex<crate::logs::Throttle<String>>,
}

/// Why a presented token does not let its bearer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// Not a valid token; for an access token, why.
    Wrong(Option<TokenError>),
    /// Too many wrong tokens from this address wait already.
    Busy,
    /// An access token that cannot be checked now: the identity provider's keys cannot be
    /// fetched (not the caller's fault, so not paced).
    Unavailable,
}

fn check_secret(secret: &str) -> Result<(), String> {
    if secret.len() < MIN_TOKEN_LEN {
        return Err(format!("a token must be at least {MIN_TOKEN_LEN} characters"));
    }
    if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token must be printable ASCII without spaces".into());
    }
    Ok(())
}

fn role(s: &str) -> Option<Role> {
    match s {
        "agent" => Some(Role::Agent),
        "operator" => Some(Role::Operator),
        _ => None,
    }
}

/// True when both are equal; the time taken depends only on their lengths.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Tokens from `file` (if any) and from `FIELDGATE_TOKEN_*` variables in `env`.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Tokens, Vec<Problem>> {
        let mut tokens = Vec::new();
        let mut problems = Vec::new();
        if let Some(path) = file {
            let name = path.display().to_string();
            match crate::toml_reader::read_text_file(path) {
                Ok(text) => {
                    let doc = Doc::new(name, &text);
                    if let Some(root) = doc.parse(&text) {
                        let t = Table::root(&doc, &root);
                        for entry in t.tables("tokens") {
                            let name = entry.req_str("name");
                            let role = entry.req_choice("role", &["agent", "operator"]).and_then(role);
                            let secret = entry.req_str("token").filter(|s| match check_secret(s) {
                                Ok(()) => true,
                                Err(m) => {
                                    entry.problem("token", m);
                                    false
                                }
                            });
                            entry.finish();
                            if let (Some(name), Some(role), Some(secret)) = (name, role, secret) {
                                tokens.push(Token {
                                    name: name.to_string(),
                                    role,
                                    secret: secret.as_bytes().to_vec(),
                                });
                            }
                        }
                        t.finish();
                    }
                    problems.extend(doc.into_problems());
                }
                Err(why) => problems.push(Problem {
                    source: name,
                    line: 0,
                    message: format!("cannot read the tokens file: {why}"),
                }),
            }
        }
        let mut env: Vec<_> = env.into_iter().filter(|(k, _)| k.starts_with(TOKEN_ENV_PREFIX)).collect();
        env.sort();
        for (key, value) in env {
            let name = key[TOKEN_ENV_PREFIX.len()..].to_ascii_lowercase().replace('_', "-");
            let bad =
                |message: String| Problem { source: format!("environment variable {key}"), line: 0, message };
            match value.split_once(':') {
                Some((r, secret)) => match (role(r), check_secret(secret)) {
                    (Some(role), Ok(())) => {
                        tokens.push(Token { name, role, secret: secret.as_bytes().to_vec() })
                    }
                    (None, _) => problems.push(bad(format!("role must be agent or operator, found {r:?}"))),
                    (_, Err(m)) => problems.push(bad(m)),
                },
                None => problems.push(bad("must be <role>:<token>, e.g. agent:6f1c…".into())),
            }
        }
        for (i, a) in tokens.iter().enumerate() {
            for b in &tokens[..i] {
                if a.name == b.name {
                    problems.push(Problem {
                        source: "tokens".into(),
                        line: 0,
                        message: format!("token name {:?} is used twice", a.name),
                    });
                }
                if ct_eq(&a.secret, &b.secret) {
                    problems.push(Problem {
                        source: "tokens".into(),
                        line: 0,
                        message: format!("tokens {:?} and {:?} are the same", b.name, a.name),
                    });
                }
            }
        }
        if problems.is_empty() { Ok(Tokens { tokens, ..Tokens::default() }) } else { Err(problems) }
    }

    /// These tokens, and the access tokens `oauth` accepts.
    pub fn with_oauth(mut self, oauth: Option<Arc<OAuth>>) -> Tokens {
        self.oauth = oauth;
        self
    }

    /// The identity provider's check, when `[server.oauth]` is set.
    pub fn oauth(&self) -> Option<&Arc<OAuth>> {
        self.oauth.as_ref()
    }

    /// No way to authenticate: callers are anonymous (loopback only).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty() && self.oauth.is_none()
    }

    /// A configured secret of `role`, if any: the demo's scripted tour calls with it.
    pub fn secret_of(&self, role: Role) -> Option<String> {
        let t = self.tokens.iter().find(|t| t.role == role)?;
        String::from_utf8(t.secret.clone()).ok()
    }

    /// The caller of `token` presented from `from` at `door` (named in the log), paced
    /// against guessing (`pacing.rs`): at once when it is right, after a pause when it is
    /// wrong, refused unchecked when too many checks from that address wait.
    pub async fn check(&self, door: &'static str, from: IpAddr, token: &str) -> Result<Caller, Denied> {
        let verdict = match &self.oauth {
            Some(o) if super::oauth::looks_like_jwt(token) => o.verify(token).await.map_err(Some),
            _ => self.authenticate(token).ok_or(None),
        };
        let why = verdict.as_ref().err().copied().flatten();
        let reason = why.map_or("not_configured", TokenError::reason);
        if verdict.is_err() {
            *self.refused.lock().entry(reason).or_default() += 1;
        }
        if why == Some(TokenError::Key(super::oauth::KeyError::Unavailable)) {
            return Err(Denied::Unavailable);
        }
        let refused = |_| {
            let (claimed_sub, claimed_iss) =
                if why.is_some() { super::oauth::claimed(token) } else { (None, None) };
            super::pacing::Refusal { reason, claimed_sub, claimed_iss }
        };
        match self.pacer.check(door, from, || verdict.map_err(refused)).await {
            Ok(Some(caller)) => Ok(caller),
            Ok(None) => Err(Denied::Wrong(why)),
            Err(Busy::Address) => Err(Denied::Busy),
        }
    }

    /// Wrong tokens seen since start, at every door.
    pub fn failures(&self) -> u64 {
        self.pacer.failures()
    }

    /// A request of `caller` for `what` (a path, a tool) refused for a missing `scope`:
    /// counted, and an audit event (one a minute per caller, with those left out counted).
    pub fn scope_refused(&self, caller: &Caller, what: &str, scope: crate::tools::Scope) {
        self.scope_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(skipped) = self.scope_log.lock().allow(caller.id.clone()) else { return };
        tracing::warn!(
            target: "audit",
            event = "authorization",
            outcome = "refused",
            caller = caller.id.as_str(),
            what,
            scope = scope.name(),
            skipped,
            "request refused: a scope is missing"
        );
    }

    /// Writes the refusals on `/metrics`.
    pub fn report(&self, s: &mut crate::metrics::Sheet<'_>) {
        let refused = self.refused.lock().clone();
        s.counters(
            "fieldgate_auth_tokens_refused",
            "Bearer tokens refused (every door), by reason, e.g. not_configured (no static token matches), expired, audience, issuer, unknown_key, keys_unavailable.",
            "reason",
            refused.iter().map(|(k, v)| (*k, *v)),
        );
        s.counter(
            "fieldgate_auth_scope_refusals",
            "Requests refused (403) because the caller's scopes do not allow them.",
            self.scope_refused.load(std::sync::atomic::Ordering::Relaxed),
        );
    }

    /// The caller a presented token belongs to. Every configured token is compared, so
    /// the time taken does not tell which one (or whether any) matched.
    pub fn authenticate(&self, presented: &str) -> Option<Caller> {
        let mut found = None;
        for t in &self.tokens {
            if ct_eq(&t.secret, presented.as_bytes()) {
                found = Some(Caller::with_role(t.name.clone(), t.role));
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn tokens_from_file_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(
            &path,
            "[[tokens]]\nname = \"reporting-agent\"\nrole = \"agent\"\ntoken = \"a-very-long-agent-token\"\n",
        )
        .unwrap();
        let t = Tokens::load(
            Some(&path),
            env(&[("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:a-very-long-operator-token")]),
        )
        .unwrap();
        assert_eq!(
            t.authenticate("a-very-long-agent-token"),
            Some(Caller::with_role("reporting-agent", Role::Agent))
        );
        assert_eq!(
            t.authenticate("a-very-long-operator-token").map(|c| (c.is_operator(), c.id)),
            Some((true, "shift-lead".into()))
        );
        assert_eq!(t.authenticate("a-very-long-agent-tokem"), None);
        assert_eq!(t.authenticate(""), None);
    }

    #[test]
    fn bad_tokens_are_reported_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, "[[tokens]]\nname = \"x\"\nrole = \"admin\"\ntoken = \"short\"\nextra = 1\n")
            .unwrap();
        let e = Tokens::load(
            Some(&path),
            env(&[("FIELDGATE_TOKEN_A", "agent"), ("FIELDGATE_TOKEN_B", "boss:0123456789abcdefgh")]),
        )
        .err()
        .unwrap();
        let prefix = format!("{}/", dir.path().display());
        let text: Vec<String> = e.iter().map(|p| p.to_string().replace(&prefix, "")).collect();
        assert_eq!(
            text,
            [
                "tokens.toml:3: `role` in tokens[1]: must be one of agent, operator, found \"admin\"",
                "tokens.toml:4: `token` in tokens[1]: a token must be at least 16 characters",
                "tokens.toml:5: unknown key `extra` in tokens[1]",
                "environment variable FIELDGATE_TOKEN_A: must be <role>:<token>, e.g. agent:6f1c…",
                "environment variable FIELDGATE_TOKEN_B: role must be agent or operator, found \"boss\"",
            ]
        );
    }

    #[test]
    fn the_same_token_twice_is_refused() {
        let e = Tokens::load(
            None,
            env(&[
                ("FIELDGATE_TOKEN_A", "agent:0123456789abcdefgh"),
                ("FIELDGATE_TOKEN_B", "operator:0123456789abcdefgh"),
            ]),
        );
        let text: Vec<String> = e.err().unwrap().iter().map(|p| p.to_string()).collect();
        assert_eq!(text, [r#"tokens: tokens "a" and "b" are the same"#]);
    }

    #[test]
    fn the_same_name_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(
            &path,
            "[[tokens]]\nname = \"shift-lead\"\nrole = \"agent\"\ntoken = \"0123456789abcdefgh\"\n",
        )
        .unwrap();
        let e = Tokens::load(
            Some(&path),
            env(&[("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:zyxwvutsrq9876543210")]),
        );
        let text: Vec<String> = e.err().unwrap().iter().map(|p| p.to_string()).collect();
        assert_eq!(text, [r#"tokens: token name "shift-lead" is used twice"#]);
    }

    #[test]
    fn a_token_with_a_space_or_a_control_character_is_refused() {
        for secret in ["0123456789 abcdefgh", "0123456789\tabcdefgh", "0123456789abcdéfgh"] {
            let e = Tokens::load(None, env(&[("FIELDGATE_TOKEN_A", &format!("agent:{secret}"))]));
            let text: Vec<String> = e.err().unwrap().iter().map(|p| p.to_string()).collect();
            assert_eq!(
                text,
                ["environment variable FIELDGATE_TOKEN_A: a token must be printable ASCII without spaces"],
                "{secret:?}"
            );
        }
    }

    #[test]
    fn tokens_are_compared_whole() {
        let t = Tokens::load(None, env(&[("FIELDGATE_TOKEN_A", "agent:0123456789abcdefgh")])).unwrap();
        for other in ["0123456789abcdefg", "0123456789abcdefghi", "1123456789abcdefgh", "0123456789abcdefgH"]
        {
            assert_eq!(t.authenticate(other), None, "{other}");
        }
        assert_eq!(t.authenticate("0123456789abcdefgh").map(|c| c.id), Some("a".to_string()));
    }
}
