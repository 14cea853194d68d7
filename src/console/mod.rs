//! The operator console: server-rendered HTML pages (maud) at `/console` for the people
//! next to the agent: the plant overview with live values (server-sent events), a page
//! per device and per sensor (history chart), the work-order approval queue, the
//! agent's recent calls, and at the fleet hub the fleet page (edge nodes, conflicts).
//!
//! The console asks the same query code as the tools (`ToolService::view`) but not the
//! agent's pipeline: no rate limit, no log line, no activity entry. Its live values come
//! from the reading cache the poller fills (`ToolService::cached_reading`): it never reads
//! a device itself. Viewing follows the server's auth (with tokens configured, a session
//! opened with a token); decisions need an operator's session and the form's CSRF token
//! (`auth.rs`).

mod alarms;
mod auth;
mod chart;
mod fleet;
mod guard;
mod live;
mod orders;
mod pages;
mod streams;
mod view;
mod viewer;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, MethodFilter, MethodRouter, get};
use maud::{Markup, html};
use tokio_util::sync::CancellationToken;

use crate::tools::{ToolError, ToolService};
use crate::transport::auth::Tokens;
use crate::transport::routes::Verb;

pub use chart::{Chart, sparkline};
pub use live::LIFETIME as LIVE_STREAM_LIFETIME;

/// What a console route shows or does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Overview,
    Fleet,
    Device,
    Sensor,
    Queue,
    Order,
    Decide,
    Activity,
    Alarms,
    ActOnAlarm,
    Live,
    SignInForm,
    SignIn,
    SignOut,
    Css,
    Js,
}

/// One route of the console.
#[derive(Debug, Clone, Copy)]
pub struct ConsoleRoute {
    pub verb: Verb,
    pub path: &'static str,
    pub page: Page,
}

const fn at(verb: Verb, path: &'static str, page: Page) -> ConsoleRoute {
    ConsoleRoute { verb, path, page }
}

/// Every route of the console, the one table its router is made from. They answer HTML
/// (or SSE, CSS, JS), not the API's JSON envelope, so `/openapi.json` does not list them;
/// a test probes each.
pub const ROUTES: &[ConsoleRoute] = &[
    at(Verb::Get, "/console", Page::Overview),
    at(Verb::Get, "/console/fleet", Page::Fleet),
    at(Verb::Get, "/console/devices/{id}", Page::Device),
    at(Verb::Get, "/console/sensors/{id}", Page::Sensor),
    at(Verb::Get, "/console/work-orders", Page::Queue),
    at(Verb::Get, "/console/work-orders/{id}", Page::Order),
    at(Verb::Post, "/console/work-orders/{id}", Page::Decide),
    at(Verb::Get, "/console/alarms", Page::Alarms),
    at(Verb::Post, "/console/alarms/{alarm_id}", Page::ActOnAlarm),
    at(Verb::Get, "/console/activity", Page::Activity),
    at(Verb::Get, "/console/live", Page::Live),
    at(Verb::Get, "/console/login", Page::SignInForm),
    at(Verb::Post, "/console/login", Page::SignIn),
    at(Verb::Post, "/console/logout", Page::SignOut),
    at(Verb::Get, "/console/assets/console.css", Page::Css),
    at(Verb::Get, "/console/assets/console.js", Page::Js),
];

/// The handler of `page` for the method `on`.
fn handler(page: Page, on: MethodFilter) -> MethodRouter<Console> {
    match page {
        Page::Overview => routing::on(on, pages::overview),
        Page::Fleet => routing::on(on, fleet::fleet),
        Page::Device => routing::on(on, pages::device),
        Page::Sensor => routing::on(on, pages::sensor),
        Page::Queue => routing::on(on, orders::queue),
        Page::Order => routing::on(on, orders::order),
        Page::Decide => routing::on(on, orders::decide),
        Page::Activity => routing::on(on, orders::activity),
        Page::Alarms => routing::on(on, alarms::alarms),
        Page::ActOnAlarm => routing::on(on, alarms::act),
        Page::Live => routing::on(on, live::stream),
        Page::SignInForm => routing::on(on, auth::login_page),
        Page::SignIn => routing::on(on, auth::login),
        Page::SignOut => routing::on(on, auth::logout),
        Page::Css => routing::on(on, css),
        Page::Js => routing::on(on, js),
    }
}

/// What the console's handlers share.
#[derive(Clone)]
pub struct Console {
    tools: ToolService,
    tokens: Arc<Tokens>,
    sessions: Arc<auth::Sessions>,
    live: Arc<live::Live>,
    /// Live streams open at once, at most [`live::MAX_STREAMS`] ([`live::PER_VIEWER`] each).
    streams: Arc<streams::Streams>,
    /// Failed sign-ins answer one at a time per address, each after a pause.
    guard: Arc<guard::Guard>,
    /// Successful sign-ins are logged once a minute per token at most.
    signins: Arc<parking_lot::Mutex<crate::logs::Throttle<String>>>,
    /// Cookie names and attributes (`Secure`, `__Host-` under TLS).
    cookies: auth::Cookies,
    shutdown: CancellationToken,
}

/// Why a console page cannot be shown.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// A query's own refusal (unknown sensor, bad range, ...), shown as the tool says it.
    #[error("{}", .0.message)]
    Tool(ToolError),
    /// Not signed in while the server has tokens.
    #[error("sign in to see this page")]
    SignIn,
    /// A decision without an operator's session, or with a stale form.
    #[error("{0}")]
    Refused(String),
    /// No console page at this address.
    #[error("no console page here")]
    NotFound,
}

impl From<ToolError> for ConsoleError {
    fn from(e: ToolError) -> Self {
        ConsoleError::Tool(e)
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let (status, title, body) = match &self {
            ConsoleError::SignIn => {
                let mut res = axum::response::Redirect::to("/console/login").into_response();
                *res.status_mut() = StatusCode::SEE_OTHER;
                return res;
            }
            ConsoleError::Tool(e) => {
                let status = crate::transport::status::status_of_code(e.code);
                // Not the hint: it speaks to the agent ("call list_sensors ...").
                (status, title_of(e.code), refusal(e))
            }
            ConsoleError::Refused(why) => (StatusCode::FORBIDDEN, "Refused", html! { p { (why) } }),
            ConsoleError::NotFound => (
                StatusCode::NOT_FOUND,
                "Not found",
                html! { p { "There is no console page at this address." } },
            ),
        };
        let page = html! {
            (maud::DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "fieldgate: " (title) }
                       link rel="stylesheet" href="/console/assets/console.css"; }
                body { main { h1 { (title) } div.error { (body) } p { a href="/console" { "Back to the overview" } } } }
            }
        };
        (status, page).into_response()
    }
}

/// A request the server refused before the console saw it (a foreign `Origin`, a form
/// posted from another site), as a console page rather than the API's JSON.
pub fn refusal_page(e: ToolError) -> Response {
    let mut res = ConsoleError::Tool(e).into_response();
    secure(&mut res, false);
    res
}

/// A page's heading for a query's refusal, in words.
fn title_of(code: crate::tools::ErrorCode) -> &'static str {
    use crate::tools::ErrorCode as C;
    match code {
        C::InvalidArgument => "Not a valid request",
        C::SensorNotFound => "No such sensor",
        C::DeviceNotFound => "No such device",
        C::WorkOrderNotFound => "No such work order",
        C::InvalidState => "Not possible in this state",
        C::Forbidden => "Not allowed",
        C::StorageUnavailable => "Storage unavailable",
        C::RateLimited | C::RetryLimitReached => "Too many requests",
        C::MethodNotAllowed => "Not possible on this page",
        _ => "Cannot show this page",
    }
}

/// Text with `code` spans (as the tools write their messages) as markup.
fn prose(text: &str) -> Markup {
    html! {
        @for (i, part) in text.split('`').enumerate() {
            @if i % 2 == 1 { code { (part) } } @else { (part) }
        }
    }
}

/// What a query refused, as a person reads it: the message, what is accepted, what was
/// received, and the close valid values as links (the API's did-you-mean).
fn refusal(e: &ToolError) -> Markup {
    let link = |s: &str| match e.code {
        crate::tools::ErrorCode::SensorNotFound => Some(format!("/console/sensors/{s}")),
        crate::tools::ErrorCode::DeviceNotFound => Some(format!("/console/devices/{s}")),
        _ if e.parameter.as_deref().is_some_and(crate::tools::validate::is_sensor_param) => {
            Some(format!("/console/sensors/{s}"))
        }
        _ => None,
    };
    html! {
        p { (prose(&e.message)) }
        @if let Some(x) = &e.expected { p { "Accepted: " (prose(x)) } }
        @if let Some(r) = &e.received { p { "Received: " code { (r.escape_debug().to_string()) } } }
        @if !e.suggestions.is_empty() {
            p { "Did you mean "
                @for (i, s) in e.suggestions.iter().enumerate() {
                    @if i > 0 { ", " }
                    @match link(s) { Some(href) => { a href=(href) { (s) } } None => { code { (s) } } }
                }
                "?"
            }
        }
        @for d in &e.details { p { (prose(&d.message)) } }
    }
}

/// Markup as a page: security headers, never cached.
fn page(markup: Markup) -> Response {
    markup.into_response()
}

/// Headers every console answer carries: no foreign scripts, styles or frames, no
/// caching of pages that show live state.
async fn headers(req: Request, next: Next) -> Response {
    let asset = req.uri().path().starts_with("/console/assets/");
    let mut res = next.run(req).await;
    secure(&mut res, asset);
    res
}

/// The console's security and caching headers on `res`.
fn secure(res: &mut Response, asset: bool) {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    let cache = if asset { "public, max-age=3600" } else { "no-store" };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], JS).into_response()
}

impl Console {
    pub fn new(tools: ToolService, tokens: Arc<Tokens>, shutdown: CancellationToken) -> Console {
        let streams = Arc::new(streams::Streams::default());
        let places = streams.clone();
        tools.core().metrics.collect("console live streams", move |s| places.report(s));
        let cookies = auth::Cookies::new(tools.config().server.tls.is_some());
        Console {
            live: Arc::new(live::Live::new(tools.clone(), shutdown.clone())),
            tools,
            tokens,
            sessions: Arc::new(auth::Sessions::default()),
            streams,
            guard: Arc::new(guard::Guard::new()),
            signins: Arc::default(),
            cookies,
            shutdown,
        }
    }

    /// The console's routes, to be merged into the HTTP application (whose Host/Origin
    /// checks, body limit and timeout apply to them too).
    pub fn router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let pages = ROUTES
            .iter()
            .fold(Router::new(), |router, r| router.route(r.path, handler(r.page, r.verb.filter())));
        pages
            .route("/console/", get(|| async { axum::response::Redirect::permanent("/console") }))
            .route("/console/{*rest}", axum::routing::any(|| async { ConsoleError::NotFound }))
            .layer(middleware::from_fn(headers))
            .with_state(self)
    }

    /// Renders the overview (for benchmarks; the route renders the same).
    pub fn render_overview(&self) -> String {
        pages::overview_markup(self, &viewer::Viewer::Open).into_string()
    }

    /// Renders a sensor page over `range` ("1h", "24h", "7d"), for benchmarks.
    pub fn render_sensor(&self, id: &str, range: &str) -> Result<String, ConsoleError> {
        let q = pages::RangeQuery { range: Some(range.to_string()), from: None, to: None };
        pages::sensor_markup(self, &viewer::Viewer::Open, id, &q).map(Markup::into_string)
    }

    /// One live snapshot as sent to every browser (JSON of element IDs and their HTML).
    pub fn render_snapshot(&self) -> String {
        view::snapshot(&self.tools)
    }
}
