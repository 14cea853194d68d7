//! MCP: one [`rmcp::ServerHandler`] over the tool service, served on stdio
//! (`fieldgate mcp`, `stdio.rs`) and as Streamable HTTP at `/mcp` (`http.rs`, with its
//! sessions in `sessions.rs`).
//!
//! Protocol versions 2025-06-18, 2025-11-25 and 2026-07-28 (`server/discover`, stateless
//! requests); rmcp runs the lifecycle and answers every method we do not handle with an
//! immediate JSON-RPC error. Unknown tools and non-object arguments are JSON-RPC errors;
//! every other outcome, argument errors included, is a tool result whose
//! `structuredContent` is the envelope (`to_result`, the one mapping for MCP).
//!
//! Each wire frames messages itself (`jsonrpc.rs`) before rmcp reads them, so that
//! nothing malformed goes unanswered. A process builds one [`McpServer`] (with the tool
//! definitions) per wire; every request and session is served by clones of it. Over HTTP,
//! a plain `tools/call` skips rmcp's per-request service and is answered by `fast.rs`
//! through the same [`McpServer::call`], exactly as rmcp would answer it.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomRequest, CustomResult, ErrorCode,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value};

use crate::tools::{CallError, Caller, Envelope, ToolService, ToolSpec};

mod fast;
pub mod http;
pub mod jsonrpc;
mod scope;
pub mod sessions;
pub(crate) mod stdio;

const VERSIONS: [ProtocolVersion; 3] =
    [ProtocolVersion::V_2025_06_18, ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28];

const INSTRUCTIONS: &str = "fieldgate reads plant sensors and proposes maintenance. Start with \
list_sensors to find sensor IDs (PLANT_ZONE_NNN), read values with get_sensor_reading or \
get_sensor_readings, and follow each error's hint, retryable flag and retry_after_ms.";

/// The MCP server. `caller` is the stdio caller; over HTTP the caller comes from the
/// request (the bearer token checked by the HTTP layer). Cloning it is cheap (reference
/// counts): the definitions are built once, by `new`.
#[derive(Clone)]
pub struct McpServer {
    tools: ToolService,
    caller: Arc<Caller>,
    definitions: Arc<Vec<Tool>>,
}

fn object(v: Value) -> Arc<Map<String, Value>> {
    Arc::new(match v {
        Value::Object(m) => m,
        _ => Map::new(),
    })
}

/// The MCP definition of one tool: schemas, title and annotations.
pub fn tool_definition(spec: &ToolSpec) -> Tool {
    let a = spec.annotations;
    let annotations = ToolAnnotations::with_title(spec.title)
        .read_only(a.read_only_hint)
        .destructive(a.destructive_hint)
        .idempotent(a.idempotent_hint)
        .open_world(a.open_world_hint);
    Tool::new(spec.name(), spec.description, object(spec.input_schema()))
        .with_title(spec.title)
        .with_raw_output_schema(object(spec.output_schema()))
        .with_annotations(annotations)
}

/// The envelope as an MCP tool result: `structuredContent`, the same JSON as text, and
/// `isError = !ok`.
pub fn to_result(envelope: &Envelope) -> Result<CallToolResult, ErrorData> {
    let value: serde_json::Value = serde_json::from_slice(&envelope.to_json())
        .map_err(|_| ErrorData::internal_error("serialization failed", None))?;
    Ok(if envelope.ok { CallToolResult::structured(value) } else { CallToolResult::structured_error(value) })
}

impl McpServer {
    pub fn new(tools: ToolService, caller: Caller) -> McpServer {
        let definitions = Arc::new(tools.served().map(tool_definition).collect());
        McpServer { tools, caller: Arc::new(caller), definitions }
    }

    fn caller_of(&self, context: &RequestContext<RoleServer>) -> Caller {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Caller>().cloned())
            .unwrap_or_else(|| Caller::clone(&self.caller))
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("fieldgate", env!("CARGO_PKG_VERSION")).with_title("fieldgate"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Owned(VERSIONS.to_vec())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.definitions.as_ref().clone()))
    }

    /// Requests rmcp could not parse land here: a method we serve with malformed
    /// parameters (such as `tools/call` with non-object arguments, or `initialize` without
    /// a protocol version) is an invalid-params error; any other method is answered at once
    /// as not found.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        let method = request.method.as_str();
        let expected = match method {
            "tools/call" => Some("{\"name\": string, \"arguments\": object}"),
            "initialize" => Some(
                "{\"protocolVersion\": string, \"capabilities\": object, \"clientInfo\": {\"name\": string, \"version\": string}}",
            ),
            "tools/list" => Some("{\"cursor\"?: string}"),
            "ping" | "server/discover" => Some("{\"_meta\"?: object}"),
            _ => None,
        };
        if let Some(expected) = expected {
            return Err(ErrorData::invalid_params(format!("{method} needs params {expected}"), None));
        }
        // Echoed escaped and cut: the caller's text may hide or reorder what a person reads.
        let shown = crate::tools::envelope::cut(method);
        Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, format!("Method not found: {shown}"), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller_of(&context);
        self.call(&caller, &request.name, request.arguments).await
    }
}

impl McpServer {
    /// `tools/call`: the tool through `ToolService::call_as`, its envelope as a result.
    /// rmcp's dispatch and the HTTP fast path (`fast.rs`) both come here.
    pub async fn call(
        &self,
        caller: &Caller,
        name: &str,
        arguments: Option<Map<String, Value>>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = arguments.map(Value::Object).unwrap_or(Value::Object(Map::new()));
        match self.tools.tool(name) {
            Ok(tool) => to_result(&self.tools.call_as(caller, tool, args).await).map(CallToolResponse::from),
            Err(CallError::UnknownTool(name)) => {
                let served: Vec<&str> = self.tools.served().map(|t| t.name()).collect();
                Err(ErrorData::invalid_params(
                    format!("Unknown tool {name}; tools: {}", served.join(", ")),
                    None,
                ))
            }
        }
    }
}

/// Serves MCP on stdin/stdout until the client closes stdin. Nothing but MCP messages
/// is written to stdout; what is not MCP is answered with a JSON-RPC error and logged on
/// stderr. An error when the peer sent only what was refused (it never spoke MCP).
pub async fn serve_stdio(tools: ToolService) -> Result<(), String> {
    let max_line = tools.config().server.max_body_bytes as usize;
    let server = McpServer::new(tools, Caller::local());
    // Pipes are driven by the IO reactor (no blocking thread per message); anything
    // else falls back to the blocking handles.
    let (read, write) = rmcp::transport::io::stdio_pipes();
    stdio::serve_lines(server, read, write, max_line).await
}
