//! The one route table of the HTTP API. The router (`http::app`), the OpenAPI document
//! (`openapi.rs`), the route list of `GET /` and the list in `docs/http-routes.md` are all
//! made from [`ROUTES`]: a route's method and path are written here once, and the router
//! and the document each match on its [`Endpoint`] exhaustively, so an endpoint one of them
//! forgot does not compile.

use axum::routing::MethodFilter;

/// What a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Index,
    ListTools,
    CallTool,
    Sensors,
    Sensor,
    Reading,
    History,
    WorkOrders,
    WorkOrder,
    ActOnWorkOrder,
    Alarms,
    ActOnAlarm,
    Devices,
    Device,
    ProbeDevice,
    Metrics,
    /// MCP over Streamable HTTP: one service for every method of its path.
    Mcp,
    Healthz,
    Readyz,
    OpenApi,
    /// OAuth Protected Resource Metadata (RFC 9728), when `[server.oauth]` is set.
    ResourceMetadata,
}

/// The HTTP methods the API uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Delete,
}

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Delete => "DELETE",
        }
    }

    pub fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
            Verb::Delete => MethodFilter::DELETE,
        }
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone who reaches the listener (the liveness probe).
    Open,
    /// Anyone on a loopback listener; a token on any other (what is served, readiness
    /// with its counts and disk sizes, the document).
    Local,
    /// A bearer token when tokens are configured (`transport/auth.rs`).
    Token,
    /// An operator's token; an agent's is answered `FORBIDDEN`.
    Operator,
}

/// One route: method, path (axum's syntax), what it does and who may call it.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub verb: Verb,
    pub path: &'static str,
    pub endpoint: Endpoint,
    pub access: Access,
}

const fn route(verb: Verb, path: &'static str, endpoint: Endpoint, access: Access) -> Route {
    Route { verb, path, endpoint, access }
}

use Access::{Local, Open, Operator, Token};
use Endpoint as E;
use Verb::{Delete, Get, Post};

/// Every route the server answers besides the console's pages.
pub const ROUTES: &[Route] = &[
    route(Get, "/", E::Index, Local),
    route(Get, "/v1/tools", E::ListTools, Token),
    route(Post, "/v1/tools/{name}", E::CallTool, Token),
    route(Get, "/v1/sensors", E::Sensors, Token),
    route(Get, "/v1/sensors/{id}", E::Sensor, Token),
    route(Get, "/v1/sensors/{id}/reading", E::Reading, Token),
    route(Get, "/v1/sensors/{id}/history", E::History, Token),
    route(Get, "/v1/work-orders", E::WorkOrders, Token),
    route(Get, "/v1/work-orders/{id}", E::WorkOrder, Token),
    route(Post, "/v1/work-orders/{id}/{action}", E::ActOnWorkOrder, Operator),
    route(Get, "/v1/alarms", E::Alarms, Token),
    route(Post, "/v1/alarms/{alarm_id}/{action}", E::ActOnAlarm, Operator),
    route(Get, "/v1/devices", E::Devices, Token),
    route(Get, "/v1/devices/{id}", E::Device, Token),
    route(Post, "/v1/devices/{id}/probe", E::ProbeDevice, Operator),
    route(Get, "/metrics", E::Metrics, Token),
    route(Post, "/mcp", E::Mcp, Token),
    route(Get, "/mcp", E::Mcp, Token),
    route(Delete, "/mcp", E::Mcp, Token),
    route(Get, "/healthz", E::Healthz, Open),
    route(Get, "/readyz", E::Readyz, Local),
    route(Get, "/openapi.json", E::OpenApi, Local),
    route(Get, "/.well-known/oauth-protected-resource", E::ResourceMetadata, Open),
    route(Get, "/.well-known/oauth-protected-resource/mcp", E::ResourceMetadata, Open),
];

/// The route list of `docs/http-routes.md` (a test holds the file to it).
pub fn markdown() -> String {
    let mut out = String::from(
        "# HTTP routes\n\nEvery route of the HTTP API, made from the route table in `src/transport/routes.rs` \
         (a test keeps this file equal to it). `/openapi.json` documents each; the console's pages \
         are in [console.md](console.md).\n\n| Method | Path | Who may call it |\n|---|---|---|\n",
    );
    for r in ROUTES {
        let who = match r.access {
            Access::Open => "anyone",
            Access::Local => "anyone on a loopback listener; a token on any other",
            Access::Token => "a token (when tokens are configured)",
            Access::Operator => "an operator's token",
        };
        out.push_str(&format!("| {} | `{}` | {who} |\n", r.verb.name(), r.path));
    }
    out
}
