//! MCP sessions over Streamable HTTP (protocols 2025-06-18 and 2025-11-25), kept by
//! fieldgate rather than by rmcp.
//!
//! A session is what its requests need and no more: its caller, the negotiated protocol
//! version, when it was last used, the requests it has in flight (for
//! `notifications/cancelled`) and a token that ends its GET streams. Requests are served
//! by the one server instance of the process, so an idle session costs a map entry
//! (a few hundred bytes), not a server instance with its tool definitions and a task.
//!
//! Opening is limited four ways: at most `server.mcp_max_sessions` open at once, no
//! caller holding more than half of them, sessions being opened counted with those open
//! (so one caller, a looping script or a burst of concurrent `initialize`s, cannot take
//! every session from the others), a per-caller rate (`server.rate_limit_per_minute`
//! opens per minute, like tool calls), and sessions unused for `server.mcp_session_idle_s`
//! are closed (checked on every use and swept in the background). Every refusal is
//! counted by reason and logged (at most a line a minute per reason).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::tools::limits::RateLimiter;

/// One open session.
pub struct Session {
    /// The caller (token name) that opened it; nobody else can use it.
    pub caller: Arc<str>,
    /// Whether the caller is an operator (agents leave some sessions for operators).
    operator: bool,
    /// The protocol version negotiated by its `initialize`.
    pub version: Arc<str>,
    last_used: Mutex<Instant>,
    /// Requests in flight by their id as sent (raw JSON), for `notifications/cancelled`.
    in_flight: Mutex<HashMap<String, CancellationToken>>,
    /// Cancelled when the session ends: its GET streams end with it.
    pub ended: CancellationToken,
}

impl Session {
    fn idle_since(&self) -> Instant {
        *self.last_used.lock()
    }

    /// Registers a request in flight; the guard removes it when the request is answered.
    pub fn start(self: &Arc<Self>, id: &str) -> InFlight {
        let token = self.ended.child_token();
        self.in_flight.lock().insert(id.to_string(), token.clone());
        InFlight { session: self.clone(), id: id.to_string(), token }
    }

    /// Cancels the request in flight with this id (raw JSON), if any.
    pub fn cancel(&self, id: &str) -> bool {
        let token = self.in_flight.lock().remove(id);
        token.map(|t| t.cancel()).is_some()
    }
}

/// A request in flight in a session.
pub struct InFlight {
    session: Arc<Session>,
    id: String,
    pub token: CancellationToken,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut map = self.session.in_flight.lock();
        if map.get(&self.id).is_some_and(|t| t == &self.token) {
            map.remove(&self.id);
        }
    }
}

/// Why a session cannot be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max` sessions are open; one frees up in `retry_after` at the latest (when the
    /// longest-idle session expires).
    Full { max: usize, retry_after: Duration },
    /// This caller already holds its share (`held`, half of the maximum); one of its
    /// sessions frees up in `retry_after` at the latest.
    CallerFull { held: usize, retry_after: Duration },
    /// This caller opened sessions faster than its rate.
    RateLimited { retry_after: Duration },
    /// Agents hold `max` sessions, all but those kept for operators.
    AgentsFull { max: usize, retry_after: Duration },
}

/// A slot reserved by an `initialize` in progress; dropped without `open`, it is freed.
pub struct Reservation {
    sessions: Arc<Inner>,
    caller: Arc<str>,
    operator: bool,
    done: bool,
}

impl Reservation {
    /// The `initialize` succeeded: the session exists from now on. Returns its ID.
    pub fn open(mut self, version: &str) -> Arc<str> {
        self.done = true;
        let id: Arc<str> = rmcp::transport::common::server_side_http::session_id().to_string().into();
        let session = Arc::new(Session {
            caller: self.caller.clone(),
            operator: self.operator,
            version: version.into(),
            last_used: Mutex::new(Instant::now()),
            in_flight: Mutex::new(HashMap::new()),
            ended: self.sessions.shutdown.child_token(),
        });
        let mut t = self.sessions.table();
        t.unreserve(&self.caller, self.operator);
        t.map.insert(id.clone(), session);
        id
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.done {
            self.sessions.table().unreserve(&self.caller, self.operator);
        }
    }
}

struct Table {
    map: HashMap<Arc<str>, Arc<Session>>,
    /// `initialize` requests admitted and not yet answered.
    reserved: usize,
    /// The same, per caller.
    reserved_by: HashMap<Arc<str>, usize>,
    /// The same, of callers that are not operators.
    reserved_agents: usize,
    sweeper: bool,
}

impl Table {
    fn unreserve(&mut self, caller: &Arc<str>, operator: bool) {
        self.reserved = self.reserved.saturating_sub(1);
        if !operator {
            self.reserved_agents = self.reserved_agents.saturating_sub(1);
        }
        if let Some(n) = self.reserved_by.get_mut(caller) {
            *n -= 1;
            if *n == 0 {
                self.reserved_by.remove(caller);
            }
        }
    }

    /// The unexpired sessions `caller` holds at `now`, and when the first of them expires.
    fn held_by(&self, caller: &str, idle: Duration, now: Instant) -> (usize, Option<Instant>) {
        let expiries = self.map.values().filter(|s| &*s.caller == caller).map(|s| s.idle_since() + idle);
        expiries
            .filter(|e| *e > now)
            .fold((0, None), |(n, first), e| (n + 1, Some(first.map_or(e, |f: Instant| f.min(e)))))
    }
}

struct Inner {
    table: Mutex<Table>,
    max: usize,
    idle: Duration,
    opens: RateLimiter,
    shutdown: CancellationToken,
    /// Opens refused, by reason: the table full, the caller's share, the caller's rate, the
    /// agents' part full.
    refused: [AtomicU64; 4],
    log: Mutex<crate::logs::Throttle<&'static str>>,
}

impl Inner {
    fn table(&self) -> parking_lot::MutexGuard<'_, Table> {
        self.table.lock()
    }

    /// Removes every session idle for `idle` or longer; returns when the next one expires.
    fn sweep(&self, now: Instant) -> Option<Instant> {
        let mut t = self.table();
        let mut next: Option<Instant> = None;
        t.map.retain(|_, s| {
            let expires = s.idle_since() + self.idle;
            if expires <= now {
                s.ended.cancel();
                false
            } else {
                next = Some(next.map_or(expires, |n| n.min(expires)));
                true
            }
        });
        next
    }
}

/// The session table of the `/mcp` service.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl Sessions {
    pub fn new(max: usize, idle: Duration, opens_per_minute: u64, shutdown: CancellationToken) -> Sessions {
        Sessions {
            inner: Arc::new(Inner {
                table: Mutex::new(Table {
                    map: HashMap::new(),
                    reserved: 0,
                    reserved_by: HashMap::new(),
                    reserved_agents: 0,
                    sweeper: false,
                }),
                max: max.max(1),
                idle,
                opens: RateLimiter::new(opens_per_minute),
                shutdown,
                refused: Default::default(),
                log: Mutex::default(),
            }),
        }
    }

    /// Admits an `initialize` from `caller` (an operator or not): a slot is held until the
    /// answer is known. A refusal is counted and logged.
    pub fn reserve(&self, caller: &str, operator: bool) -> Result<Reservation, Refusal> {
        self.admit(caller, operator).inspect_err(|r| self.refused(caller, *r))
    }

    /// The most sessions callers that are not operators may hold together: an eighth of the
    /// table is kept for operators, at least one (none only when the table holds one).
    fn agents_max(&self) -> usize {
        let max = self.inner.max;
        if max < 2 { max } else { max - (max / 8).max(1) }
    }

    fn refused(&self, caller: &str, refusal: Refusal) {
        let (i, reason) = match refusal {
            Refusal::Full { .. } => (0, "session_limit"),
            Refusal::CallerFull { .. } => (1, "caller_session_limit"),
            Refusal::RateLimited { .. } => (2, "rate_limited"),
            Refusal::AgentsFull { .. } => (3, "agent_session_limit"),
        };
        self.inner.refused[i].fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = self.inner.log.lock().allow(reason) {
            let open = self.len();
            tracing::warn!(reason, caller, open, max = self.inner.max, left_out, "MCP session refused");
        }
    }

    fn admit(&self, caller: &str, operator: bool) -> Result<Reservation, Refusal> {
        let now = Instant::now();
        {
            let mut t = self.inner.table();
            if t.map.len() + t.reserved >= self.inner.max {
                drop(t);
                let next = self.inner.sweep(now);
                t = self.inner.table();
                if t.map.len() + t.reserved >= self.inner.max {
                    let retry_after =
                        next.map_or(Duration::from_secs(1), |n| n - now).max(Duration::from_secs(1));
                    return Err(Refusal::Full { max: self.inner.max, retry_after });
                }
            }
            if !operator {
                let agents = t.map.values().filter(|s| !s.operator).count() + t.reserved_agents;
                if agents >= self.agents_max() {
                    let first = t
                        .map
                        .values()
                        .filter(|s| !s.operator)
                        .map(|s| s.idle_since() + self.inner.idle)
                        .min();
                    let retry_after = first
                        .map_or(Duration::from_secs(1), |f| f.saturating_duration_since(now))
                        .max(Duration::from_secs(1));
                    return Err(Refusal::AgentsFull { max: self.agents_max(), retry_after });
                }
            }
            let share = (self.inner.max / 2).max(1);
            let (open, first) = t.held_by(caller, self.inner.idle, now);
            // Sessions being opened count: a burst of `initialize`s gets no more than its share.
            let held = open + t.reserved_by.get(caller).copied().unwrap_or(0);
            if held >= share {
                let retry_after =
                    first.map_or(Duration::from_secs(1), |f| f - now).max(Duration::from_secs(1));
                return Err(Refusal::CallerFull { held, retry_after });
            }
            self.inner.opens.take(caller).map_err(|retry_after| Refusal::RateLimited { retry_after })?;
            t.reserved += 1;
            if !operator {
                t.reserved_agents += 1;
            }
            *t.reserved_by.entry(caller.into()).or_default() += 1;
            if !t.sweeper {
                t.sweeper = true;
                self.spawn_sweeper();
            }
        }
        Ok(Reservation { sessions: self.inner.clone(), caller: caller.into(), operator, done: false })
    }

    /// The session `id` of `caller`, marked used now. `None` when it does not exist, has
    /// expired (it is closed now) or belongs to another caller.
    pub fn get(&self, id: &str, caller: &str) -> Option<Arc<Session>> {
        let now = Instant::now();
        let mut t = self.inner.table();
        let s = t.map.get(id)?;
        if &*s.caller != caller {
            return None;
        }
        let mut last = s.last_used.lock();
        if *last + self.inner.idle <= now {
            drop(last);
            if let Some(s) = t.map.remove(id) {
                s.ended.cancel();
            }
            return None;
        }
        *last = now;
        drop(last);
        Some(s.clone())
    }

    /// Closes the session `id` of `caller` (DELETE). `false` when there is no such session.
    pub fn close(&self, id: &str, caller: &str) -> bool {
        let mut t = self.inner.table();
        match t.map.get(id) {
            Some(s) if &*s.caller == caller => {
                s.ended.cancel();
                t.map.remove(id);
                true
            }
            _ => false,
        }
    }

    /// Sessions open now.
    pub fn len(&self) -> usize {
        self.inner.table().map.len()
    }

    /// Writes the table on `/metrics`: sessions open, being opened, and refused by reason.
    pub fn report(&self, s: &mut crate::metrics::Sheet<'_>) {
        let (open, opening) = {
            let t = self.inner.table();
            (t.map.len(), t.reserved)
        };
        s.gauge("fieldgate_mcp_sessions", "MCP sessions open (Streamable HTTP).", open as i64);
        s.gauge(
            "fieldgate_mcp_sessions_opening",
            "MCP initialize requests admitted and not yet answered.",
            opening as i64,
        );
        s.gauge(
            "fieldgate_mcp_sessions_max",
            "The most MCP sessions open at once (server.mcp_max_sessions).",
            self.inner.max as i64,
        );
        let n = |i: usize| self.inner.refused[i].load(Ordering::Relaxed);
        s.counters(
            "fieldgate_mcp_sessions_refused",
            "MCP sessions refused, by reason: the table full, the caller's share, the caller's rate, the agents' part (an eighth is kept for operators).",
            "reason",
            [
                ("session_limit", n(0)),
                ("caller_session_limit", n(1)),
                ("rate_limited", n(2)),
                ("agent_session_limit", n(3)),
            ],
        );
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes expired sessions in the background, at the latest a quarter of the idle time
    /// after they expire; ends with the server or when the table is dropped.
    fn spawn_sweeper(&self) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let period = (self.inner.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = shutdown.cancelled() => break,
                }
                let Some(inner) = weak.upgrade() else { break };
                inner.sweep(Instant::now());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(max: usize, idle_ms: u64) -> Sessions {
        Sessions::new(max, Duration::from_millis(idle_ms), 1000, CancellationToken::new())
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_counts_open_and_opening_sessions() {
        // Operators: the whole table is theirs (agents leave one session to them).
        let s = sessions(2, 60_000);
        let a = s.reserve("c", true).unwrap().open("2025-06-18");
        let pending = s.reserve("d", true).unwrap();
        assert!(matches!(s.reserve("e", true), Err(Refusal::Full { max: 2, .. })));
        drop(pending);
        let _b = s.reserve("d", true).unwrap().open("2025-06-18");
        assert!(s.close(&a, "c"));
        assert!(!s.close(&a, "c"));
        assert!(s.reserve("c", true).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_sessions_expire_and_use_keeps_them() {
        let s = sessions(10, 1000);
        let id = s.reserve("c", false).unwrap().open("2025-06-18");
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(s.get(&id, "c").is_some());
        tokio::time::advance(Duration::from_millis(900)).await;
        let session = s.get(&id, "c").unwrap();
        assert!(s.get(&id, "other").is_none(), "another caller never sees it");
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert!(s.get(&id, "c").is_none());
        assert!(session.ended.is_cancelled());
        assert!(s.is_empty());
    }

    /// Nobody asks for an idle session again: the background sweep ends it (and so its
    /// GET stream) within a quarter of the idle time after it expired, not before.
    #[tokio::test(start_paused = true)]
    async fn the_sweeper_ends_an_idle_session_nobody_asks_for() {
        let s = sessions(10, 1000);
        let id = s.reserve("c", false).unwrap().open("2025-06-18");
        let session = s.get(&id, "c").unwrap();
        tokio::time::sleep(Duration::from_millis(990)).await;
        assert!(!session.ended.is_cancelled(), "not before the idle time");
        assert_eq!(s.len(), 1);
        tokio::time::sleep(Duration::from_millis(10 + 250 + 1)).await;
        assert!(session.ended.is_cancelled(), "within a sweep period after it");
        assert!(s.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_names_when_a_slot_frees() {
        let s = sessions(1, 10_000);
        let _id = s.reserve("c", false).unwrap().open("2025-06-18");
        tokio::time::advance(Duration::from_secs(4)).await;
        match s.reserve("c", false) {
            Err(Refusal::Full { retry_after, .. }) => assert_eq!(retry_after, Duration::from_secs(6)),
            other => panic!("{:?}", other.err()),
        }
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(s.reserve("c", false).is_ok(), "the expired session is swept on demand");
    }

    /// One caller cannot take every session: past half of them it is refused, with the
    /// time its own oldest session expires, while another caller still gets one.
    #[tokio::test(start_paused = true)]
    async fn one_caller_holds_at_most_half_of_the_sessions() {
        let s = sessions(4, 10_000);
        let first = s.reserve("greedy", false).unwrap().open("2025-06-18");
        tokio::time::advance(Duration::from_secs(3)).await;
        let _second = s.reserve("greedy", false).unwrap().open("2025-06-18");
        match s.reserve("greedy", false) {
            Err(Refusal::CallerFull { held: 2, retry_after }) => {
                assert_eq!(retry_after, Duration::from_secs(7))
            }
            other => panic!("{:?}", other.err()),
        }
        let _other = s.reserve("other", false).unwrap().open("2025-06-18");
        assert!(s.close(&first, "greedy"));
        assert!(s.reserve("greedy", false).is_ok(), "a closed session gives the caller its slot back");
    }

    /// Regression: the share counted only sessions already open, so concurrent
    /// `initialize`s from one token (reserved, not yet answered) took every slot.
    #[tokio::test(start_paused = true)]
    async fn sessions_being_opened_count_against_the_callers_share() {
        let s = sessions(8, 60_000);
        let opening: Vec<Reservation> = (0..50).filter_map(|_| s.reserve("greedy", false).ok()).collect();
        assert_eq!(opening.len(), 4, "half of the table, however many are opening at once");
        assert!(matches!(s.reserve("greedy", false), Err(Refusal::CallerFull { held: 4, .. })));
        let operator = s.reserve("operator", false).expect("another caller still gets a session");
        let ids: Vec<Arc<str>> = opening.into_iter().map(|r| r.open("2025-06-18")).collect();
        assert_eq!(ids.len(), 4);
        drop(operator);
        assert!(
            matches!(s.reserve("greedy", false), Err(Refusal::CallerFull { held: 4, .. })),
            "open ones count too"
        );
        let mut text = String::new();
        let metrics = crate::metrics::Metrics::default();
        let t = s.clone();
        metrics.collect("t", move |sheet| t.report(sheet));
        text.push_str(&metrics.render());
        assert!(text.contains("fieldgate_mcp_sessions 4\n"), "{text}");
        assert!(
            text.contains("fieldgate_mcp_sessions_refused_total{reason=\"caller_session_limit\"} 48\n"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn opens_are_rate_limited_per_caller() {
        let s = Sessions::new(100, Duration::from_secs(60), 2, CancellationToken::new());
        s.reserve("a", false).unwrap();
        s.reserve("a", false).unwrap();
        assert!(matches!(s.reserve("a", false), Err(Refusal::RateLimited { .. })));
        assert!(s.reserve("b", false).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_reaches_the_request_in_flight() {
        let s = sessions(10, 60_000);
        let id = s.reserve("c", false).unwrap().open("2025-06-18");
        let session = s.get(&id, "c").unwrap();
        let f = session.start("7");
        assert!(session.cancel("7"));
        assert!(f.token.is_cancelled());
        assert!(!session.cancel("7"));
        let g = session.start("8");
        drop(g);
        assert!(!session.cancel("8"), "an answered request is gone");
    }
}
