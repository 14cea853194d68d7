//! Live updates: the parts of a page that change (each device's row, each sensor's value,
//! the list of what needs attention, the agent's recent calls), rendered by `view.rs` for
//! the first page and for the stream alike.
//!
//! One task renders a snapshot once a second while any browser listens, from the device
//! status and the reading cache (never a device read), and every open stream sends that
//! same text: ten browsers cost one rendering.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Console;
use super::view::{devices, snapshot};
use crate::tools::ToolService;

/// How often the snapshot is rendered while someone listens.
pub const TICK: Duration = Duration::from_secs(1);
/// How often the devices' states are compared with the last snapshot's: a change is
/// sent at once, not at the next second.
const CHECK: Duration = Duration::from_millis(200);
/// Live streams open at once (every browser tab showing a live page holds one): enough for
/// a control room, and a bound on what clients that never read can make the server hold.
pub const MAX_STREAMS: usize = 64;
/// A stream ends after this long and the browser opens a new one by itself: a client
/// that stopped reading is noticed only once the network's buffers are full (minutes at
/// a snapshot a second), so this bounds how long such a stream holds a place.
pub const LIFETIME: Duration = Duration::from_secs(300);
/// Live streams one viewer holds at most (a signed-in token, or everyone on a server
/// without tokens): one browser, or one token, cannot take every stream.
pub const PER_VIEWER: usize = MAX_STREAMS / 4;

/// The shared snapshot and its rendering task (started by the first stream).
pub struct Live {
    tools: ToolService,
    shutdown: CancellationToken,
    tx: OnceLock<watch::Sender<Arc<str>>>,
}

impl Live {
    pub fn new(tools: ToolService, shutdown: CancellationToken) -> Live {
        Live { tools, shutdown, tx: OnceLock::new() }
    }

    /// A receiver of the snapshots; the first call starts the task.
    fn subscribe(&self) -> watch::Receiver<Arc<str>> {
        let tx = self.tx.get_or_init(|| {
            let (tx, _) = watch::channel(Arc::from(snapshot(&self.tools)));
            let (tools, tx2, stop) = (self.tools.clone(), tx.clone(), self.shutdown.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + CHECK, CHECK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut states, mut sent) = (String::new(), tokio::time::Instant::now());
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    if tx2.receiver_count() == 0 {
                        continue;
                    }
                    // A device's change of state is sent at once; values once a second.
                    let now_states = device_states(&tools);
                    if now_states != states || sent.elapsed() >= TICK {
                        states = now_states;
                        sent = tokio::time::Instant::now();
                        tx2.send_replace(Arc::from(snapshot(&tools)));
                    }
                }
            });
            tx
        });
        tx.subscribe()
    }
}

/// `GET /console/live`: the snapshot now, then every new one, until the server stops.
pub async fn stream(
    State(c): State<Console>,
    hangup: Option<axum::Extension<crate::transport::Hangup>>,
    headers: HeaderMap,
) -> Response {
    let viewer = match c.viewer(&headers) {
        Ok(v) => v,
        // A stream cannot follow a redirect to the sign-in page: say it plainly.
        Err(super::ConsoleError::SignIn) => {
            return (axum::http::StatusCode::UNAUTHORIZED, "sign in first").into_response();
        }
        Err(e) => return e.into_response(),
    };
    let who = match &viewer {
        super::viewer::Viewer::Open => String::new(),
        super::viewer::Viewer::Signed(s) => s.caller.id.to_string(),
    };
    let hangup = hangup.map_or_else(crate::transport::Hangup::detached, |h| h.0);
    let permit = match c.streams.take(who, hangup) {
        Ok(p) => p,
        Err(busy) => {
            return (axum::http::StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "30")], busy)
                .into_response();
        }
    };
    let mut rx = c.live.subscribe();
    let first: Arc<str> = Arc::from(snapshot(&c.tools));
    rx.mark_unchanged();
    let stop = c.shutdown.clone();
    // Each event is sent only while the viewer may still look: a stream ends at sign-out
    // or when its session expires.
    let session = super::auth::cookie(&headers, c.cookies.session).map(str::to_string);
    let state = (Some(first), rx, stop, c, session, permit);
    let events =
        futures_util::stream::unfold(state, |(first, mut rx, stop, c, session, permit)| async move {
            let text = match first {
                Some(t) => t,
                None => {
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        changed = rx.changed() => changed.ok()?,
                    }
                    rx.borrow_and_update().clone()
                }
            };
            if !c.may_look(session.as_deref()) || !permit.held() || permit.age() >= LIFETIME {
                // The connection goes too: a client that stopped reading may never see the end.
                permit.hang_up();
                return None;
            }
            let event = Event::default().event("snapshot").data(&*text);
            Some((Ok::<_, Infallible>(event), (None, rx, stop, c, session, permit)))
        });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

/// The state and breaker of every device, as one string to compare.
fn device_states(tools: &ToolService) -> String {
    devices(tools).iter().map(|d| format!("{:?}{:?};", d.state, d.breaker.state)).collect()
}
