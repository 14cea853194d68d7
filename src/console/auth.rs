//! Who is looking at the console, and who may act.
//!
//! Without configured tokens (a loopback server), anyone who reaches the page may look
//! and nobody may act. With tokens, a person signs in once with a token: the server keeps
//! a session (its caller, its CSRF token, its expiry) behind a random ID sent as an
//! `HttpOnly; SameSite=Strict` cookie. Every form carries the session's CSRF token (the
//! sign-in form a token of its own, in a short-lived cookie), and the HTTP layer's
//! Host/Origin checks apply to every console request. An agent's token can sign in to
//! look, never to decide: `tools::work_orders::act` refuses the agent role.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::view::layout;
use super::viewer::{Session, Viewer};
use super::{Console, ConsoleError};
use crate::tools::{Caller, Scope};
use crate::transport::auth::Denied;

/// The console's two cookies: the session, and the sign-in form's CSRF value. Under TLS
/// they carry `Secure` and the `__Host-` prefix (the browser then keeps them to this host
/// and HTTPS, and nothing at another path or subdomain can set them).
#[derive(Debug, Clone, Copy)]
pub struct Cookies {
    pub session: &'static str,
    login: &'static str,
    secure: bool,
}

impl Cookies {
    pub fn new(tls: bool) -> Cookies {
        if tls {
            Cookies { session: "__Host-fieldgate_session", login: "__Host-fieldgate_login", secure: true }
        } else {
            Cookies { session: "fieldgate_session", login: "fieldgate_login", secure: false }
        }
    }

    /// A `Set-Cookie` value for `name` (`Max-Age=0` removes it).
    fn set(&self, name: &str, value: &str, max_age: u64) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!("{name}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}")
    }
}
/// How long a session lives after sign-in.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most: when they are all taken, a new sign-in is refused (nobody
/// else's session is ended for it).
const MAX_SESSIONS: usize = 1024;
/// Sessions one token holds at most; its own oldest goes first, so no token can fill the
/// table and sign everyone else out.
const PER_CALLER: usize = 8;

/// The sentence shown where actions would be, on a server without tokens.
pub const NO_TOKENS: &str = "Actions are disabled: this server has no tokens configured, so nobody can sign in as an operator. To approve work orders here, configure an operator token (the environment variable FIELDGATE_TOKEN_<NAME>=operator:<secret of 16+ characters>, or [auth] tokens_file), restart fieldgate, and sign in with it.";

/// The server's sessions.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes as hex, from the operating system's generator.
fn random_hex() -> Option<String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).ok()?;
    Some(super::guard::hex(&b))
}

/// True when both are equal; the time taken depends only on their lengths.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl Sessions {
    fn open(&self, caller: Caller) -> Result<(String, Session), &'static str> {
        let no_random = "No session could be opened (no randomness).";
        let csrf = random_hex().ok_or(no_random)?;
        let id = random_hex().ok_or(no_random)?;
        let session = Session { expires: Instant::now() + session_ttl(&caller), caller, csrf };
        let mut map = self.map.lock();
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        let own = map.iter().filter(|(_, s)| s.caller.id == session.caller.id);
        if own.clone().count() >= PER_CALLER
            && let Some(oldest) = own.min_by_key(|(_, s)| s.expires).map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        if map.len() >= MAX_SESSIONS {
            return Err("Every console session is taken; sign out elsewhere or wait for sessions to expire.");
        }
        map.insert(id.clone(), session.clone());
        Ok((id, session))
    }

    fn get(&self, id: &str) -> Option<Session> {
        let map = self.map.lock();
        map.get(id).filter(|s| s.expires > Instant::now()).cloned()
    }

    fn close(&self, id: &str) {
        self.map.lock().remove(id);
    }
}

impl Console {
    /// Who is looking: anyone on a server without tokens, else the session's caller.
    pub(super) fn viewer(&self, headers: &HeaderMap) -> Result<Viewer, ConsoleError> {
        if self.tokens.is_empty() {
            return Ok(Viewer::Open);
        }
        cookie(headers, self.cookies.session)
            .and_then(|id| self.sessions.get(id))
            .map(Viewer::Signed)
            .ok_or(ConsoleError::SignIn)
    }

    /// Whether the holder of session `id` (none on a server without tokens) may still look.
    pub(super) fn may_look(&self, id: Option<&str>) -> bool {
        self.tokens.is_empty() || id.is_some_and(|id| self.sessions.get(id).is_some())
    }

    /// The session of a form's sender, checked: signed in, the form's CSRF token is the
    /// session's, and the role is operator.
    pub(super) fn operator(&self, headers: &HeaderMap, csrf: &str) -> Result<Session, ConsoleError> {
        let session = match self.viewer(headers)? {
            Viewer::Open => return Err(ConsoleError::Refused(NO_TOKENS.into())),
            Viewer::Signed(s) => s,
        };
        if !same(&session.csrf, csrf) {
            return Err(ConsoleError::Refused(
                "This form is stale or was not sent from this console (its CSRF token does not match your session). Reload the page and try again.".into(),
            ));
        }
        if !session.caller.is_operator() {
            return Err(ConsoleError::Refused(format!(
                "Only an operator can decide a work order or act on an alarm; you are signed in as {} with an agent token.",
                session.caller.id
            )));
        }
        Ok(session)
    }
}

/// How long a session of `caller` lasts: [`SESSION_TTL`], and never past its access
/// token's expiry (the identity provider decides how long its operator rights last).
fn session_ttl(caller: &Caller) -> Duration {
    match caller.expires {
        None => SESSION_TTL,
        Some(exp) => {
            let left = exp.saturating_sub(chrono::Utc::now().timestamp()).max(0) as u64;
            SESSION_TTL.min(Duration::from_secs(left))
        }
    }
}

fn set_cookie(res: &mut Response, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
}

/// `GET /console/login`.
pub async fn login_page(State(c): State<Console>) -> Response {
    login_form(&c, None, StatusCode::OK)
}

fn login_form(c: &Console, problem: Option<&str>, status: StatusCode) -> Response {
    let nonce = c.guard.nonce().unwrap_or_default();
    let body = html! {
        h1 { "Sign in" }
        @if c.tokens.is_empty() {
            p.note { (NO_TOKENS) }
        } @else {
            @if let Some(p) = problem { div.error { (p) } }
            p { "Sign in with your fieldgate token. An operator token may approve and reject work orders; an agent token may only look." }
            form.card method="post" action="/console/login" {
                input type="hidden" name="csrf" value=(nonce);
                label { "Token " input type="password" name="token" autocomplete="current-password" required; }
                " " button type="submit" id="sign-in" { "Sign in" }
            }
        }
    };
    let mut res = (status, layout(c, &Viewer::Open, "Sign in", "", None, body)).into_response();
    set_cookie(&mut res, c.cookies.set(c.cookies.login, &nonce, 900));
    res
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

/// `POST /console/login`: a token for a session.
pub async fn login(
    State(c): State<Console>,
    peer: Option<axum::Extension<crate::transport::Peer>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if c.tokens.is_empty() {
        return login_form(&c, None, StatusCode::FORBIDDEN);
    }
    let Ok(Form(form)) = form else {
        return login_form(&c, Some("The form did not arrive whole; try again."), StatusCode::BAD_REQUEST);
    };
    // The form's value must be the cookie's, and one this server issued.
    let expected = cookie(&headers, c.cookies.login).unwrap_or("");
    if expected.is_empty() || !same(expected, &form.csrf) || !c.guard.issued(&form.csrf) {
        return login_form(
            &c,
            Some("This sign-in form is stale or was not sent from this console; try again."),
            StatusCode::FORBIDDEN,
        );
    }
    // Wrong tokens of one address are answered one at a time after a pause: guessing gets
    // one try a second per address, and nobody else is held up (`transport/pacing.rs`).
    let from = peer.map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |p| p.0.0);
    let caller = match c.tokens.check("console sign-in", from, form.token.trim()).await {
        Ok(caller) => caller,
        Err(Denied::Wrong(_)) => {
            return login_form(&c, Some("That token is not valid."), StatusCode::UNAUTHORIZED);
        }
        Err(Denied::Unavailable) => {
            return login_form(
                &c,
                Some(
                    "That token cannot be checked now: the identity provider cannot be reached. Try again shortly.",
                ),
                StatusCode::SERVICE_UNAVAILABLE,
            );
        }
        Err(Denied::Busy) => {
            let mut res = login_form(
                &c,
                Some(
                    "Too many wrong tokens from your address are waiting; wait a few seconds and try again.",
                ),
                StatusCode::TOO_MANY_REQUESTS,
            );
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return res;
        }
    };
    if !caller.may(Scope::Read) && !caller.is_operator() {
        return login_form(
            &c,
            Some("That token does not allow looking at the console (it needs the scope fieldgate.read)."),
            StatusCode::FORBIDDEN,
        );
    }
    // One line a minute per token at most: a token's holder cannot fill the log either.
    let allowed = c.signins.lock().allow(caller.id.to_string());
    if let Some(skipped) = allowed {
        tracing::info!(caller = caller.id.as_str(), skipped, "console sign-in");
    }
    let ttl = session_ttl(&caller);
    let (id, _) = match c.sessions.open(caller) {
        Ok(s) => s,
        Err(why) => return ConsoleError::Refused(why.into()).into_response(),
    };
    let mut res = axum::response::Redirect::to("/console/work-orders").into_response();
    *res.status_mut() = StatusCode::SEE_OTHER;
    set_cookie(&mut res, c.cookies.set(c.cookies.session, &id, ttl.as_secs()));
    set_cookie(&mut res, c.cookies.set(c.cookies.login, "", 0));
    res
}

#[derive(Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /console/logout`.
pub async fn logout(
    State(c): State<Console>,
    headers: HeaderMap,
    form: Result<Form<LogoutForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    let Some(id) = cookie(&headers, c.cookies.session) else {
        return axum::response::Redirect::to("/console/login").into_response();
    };
    match c.viewer(&headers) {
        Ok(Viewer::Signed(s)) if !same(&s.csrf, &csrf) => {
            // A stale or foreign form: the session stays, and so does its cookie.
            return ConsoleError::Refused(
                "This sign-out form is stale or was not sent from this console; reload the page and sign out again.".into(),
            )
            .into_response();
        }
        _ => c.sessions.close(id),
    }
    let mut res = axum::response::Redirect::to("/console/login").into_response();
    *res.status_mut() = StatusCode::SEE_OTHER;
    set_cookie(&mut res, c.cookies.set(c.cookies.session, "", 0));
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Role;

    /// A session opened with an access token ends when the token does, not 12 hours on.
    #[test]
    fn a_session_ends_with_the_access_token_that_opened_it() {
        let now = chrono::Utc::now().timestamp();
        let mut c = Caller::with_role("op@idp", Role::Operator);
        assert_eq!(session_ttl(&c), SESSION_TTL, "a static token: the whole TTL");
        c.expires = Some(now + 60);
        assert!(session_ttl(&c) <= Duration::from_secs(60), "{:?}", session_ttl(&c));
        c.expires = Some(now - 1);
        let s = Sessions::default();
        let (id, _) = s.open(c).unwrap();
        assert!(s.get(&id).is_none(), "an expired token's session is over at once");
    }

    #[test]
    fn cookies_are_found_by_name_among_others() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1; fieldgate_session=abc"));
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie(&h, Cookies::new(false).session), Some("abc"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "fieldgate"), None);
    }

    #[test]
    fn sessions_expire_and_close() {
        let s = Sessions::default();
        let (id, session) = s.open(Caller::with_role("op", Role::Operator)).unwrap();
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf);
        assert!(s.get(&id).is_some());
        s.close(&id);
        assert!(s.get(&id).is_none());
        assert!(!same("abc", "abd") && same("abc", "abc") && !same("abc", "ab"));
    }

    #[test]
    fn a_token_holds_a_few_sessions_and_cannot_end_anyone_elses() {
        let s = Sessions::default();
        let op = Caller::with_role("op", Role::Operator);
        let agent = Caller::with_role("bot", Role::Agent);
        let (op_id, _) = s.open(op).unwrap();
        let mine: Vec<String> = (0..PER_CALLER + 20).map(|_| s.open(agent.clone()).unwrap().0).collect();
        assert!(s.get(&op_id).is_some(), "another token's sign-ins end no operator's session");
        let kept = mine.iter().filter(|id| s.get(id).is_some()).count();
        assert_eq!(kept, PER_CALLER);
        assert!(s.get(mine.last().unwrap()).is_some(), "the newest is kept");
        // Full: a new sign-in is refused rather than ending someone's session.
        for i in 0..MAX_SESSIONS {
            let c = Caller::with_role(format!("t{i}"), Role::Agent);
            if s.open(c).is_err() {
                break;
            }
        }
        assert!(s.open(Caller::with_role("late", Role::Agent)).is_err());
        assert!(s.get(&op_id).is_some());
    }
}
