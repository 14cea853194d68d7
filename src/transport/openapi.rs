//! `GET /openapi.json`: paths and operations built with utoipa; the request and response
//! schemas are the tools' generated JSON Schemas (OpenAPI 3.1 uses JSON Schema 2020-12,
//! which is what `schemars` produces), placed in `components.schemas` unchanged.

use serde_json::{Value, json};
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{Content, InfoBuilder, OpenApiBuilder, PathItem, PathsBuilder, Ref, Required};

use super::routes::{Endpoint, ROUTES, Route, Verb};
use crate::tools::{TOOLS, Tool};

fn schema_ref(name: &str) -> Ref {
    Ref::new(format!("#/components/schemas/{name}"))
}

fn envelope_responses(op: OperationBuilder, schema: &str) -> OperationBuilder {
    let ok = ResponseBuilder::new()
        .description("The envelope; `ok` says whether the call succeeded")
        .content("application/json", Content::new(Some(schema_ref(schema))))
        .build();
    let mut op = op.response("200", ok);
    for (code, text) in [
        ("400", "INVALID_ARGUMENT; MALFORMED_REQUEST for bytes that are not HTTP"),
        ("401", "UNAUTHORIZED: missing or wrong bearer token"),
        ("403", "foreign Host or Origin"),
        ("404", "SENSOR_NOT_FOUND, DEVICE_NOT_FOUND, WORK_ORDER_NOT_FOUND"),
        ("409", "IDEMPOTENCY_CONFLICT, INVALID_STATE"),
        ("413", "PAYLOAD_TOO_LARGE: request body over the limit"),
        ("431", "REQUEST_HEAD_TOO_LARGE: request line or headers over the limit"),
        ("429", "RATE_LIMITED or RETRY_LIMIT_REACHED, with Retry-After"),
        ("502", "DEVICE_REJECTED: a configuration fault"),
        (
            "503",
            "DEVICE_TIMEOUT, DEVICE_UNAVAILABLE, DEVICE_BUSY, CIRCUIT_OPEN, DEVICE_PROTOCOL_ERROR, STORAGE_UNAVAILABLE, EDGE_OFFLINE (fleet hub), with Retry-After",
        ),
    ] {
        let r = ResponseBuilder::new()
            .description(text)
            .content("application/json", Content::new(Some(schema_ref(schema))))
            .build();
        op = op.response(code, r);
    }
    op
}

fn string_param(
    name: &str,
    place: ParameterIn,
    required: bool,
    description: &str,
) -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(place)
        .required(if required { Required::True } else { Required::False })
        .description(Some(description))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .build()
}

/// The OpenAPI 3.1 document of the HTTP API: an operation for every route of the table.
pub fn document() -> Value {
    let mut paths = PathsBuilder::new();
    for r in ROUTES {
        let method = match r.verb {
            Verb::Get => HttpMethod::Get,
            Verb::Post => HttpMethod::Post,
            Verb::Delete => HttpMethod::Delete,
        };
        for (path, op) in operations(r) {
            paths = paths.path(path, PathItem::new(method.clone(), op.build()));
        }
    }
    let api = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("fieldgate")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some("Field devices as tools for an AI reporting agent. Every tool answers with the envelope of docs/tool-contract.md; send `Authorization: Bearer <token>` when tokens are configured."))
                .build(),
        )
        .paths(paths.build())
        .build();
    let mut doc = serde_json::to_value(api).unwrap_or(Value::Null);
    let mut schemas = serde_json::Map::new();
    for t in TOOLS.iter().filter(|t| t.served) {
        schemas.insert(format!("{}.input", t.name()), strip(t.input_schema()));
        schemas.insert(format!("{}.output", t.name()), strip(t.output_schema()));
    }
    schemas.insert(
        "envelope".into(),
        json!({"type": "object", "required": ["ok", "meta"], "properties": {"ok": {"type": "boolean"}, "data": {}, "error": {"type": "object"}, "meta": {"type": "object"}}}),
    );
    if let Some(o) = doc.as_object_mut() {
        o.insert("openapi".into(), Value::String("3.1.0".into()));
        o.insert("components".into(), json!({ "schemas": schemas }));
    }
    doc
}

/// The operations of one route, each with its path (a route per tool for `CallTool`).
fn operations(r: &Route) -> Vec<(String, OperationBuilder)> {
    let one = |op: OperationBuilder| vec![(r.path.to_string(), op)];
    let output = |t: Tool| format!("{}.output", t.name());
    let id_param = |what: &str| string_param("id", ParameterIn::Path, true, what);
    const SENSOR_ID: &str = "Sensor ID, e.g. A_LINE1_001";
    const DEVICE_ID: &str = "Device ID, e.g. a-line1-plc";
    const ORDER_ID: &str = "Work order ID, e.g. WO-000001";
    match r.endpoint {
        Endpoint::CallTool => TOOLS.iter().filter(|t| t.served).map(tool_operation).collect(),
        Endpoint::ListTools => one(OperationBuilder::new()
            .tag("tools")
            .operation_id(Some("list_tool_definitions"))
            .summary(Some("Tool definitions, usable as function-calling definitions"))
            .response("200", ResponseBuilder::new().description("{\"tools\": [definition, ...]}").build())),
        Endpoint::Sensors => {
            let op =
                resource("get_sensors", "The sensors, as list_sensors (query parameters are its arguments)");
            let op = query_params(
                op,
                &[
                    ("plant", false),
                    ("zone", false),
                    ("device_id", false),
                    ("kind", false),
                    ("text", false),
                    ("limit", false),
                    ("cursor", false),
                ],
                "list_sensors",
            );
            one(envelope_responses(op, &output(Tool::ListSensors)))
        }
        Endpoint::Sensor => {
            let op = resource("get_sensor", "One sensor's description").parameter(id_param(SENSOR_ID));
            one(envelope_responses(op, "envelope"))
        }
        Endpoint::Reading => {
            let op = resource(
                "get_sensor_reading_resource",
                "The live reading of one sensor, as get_sensor_reading",
            )
            .parameter(id_param(SENSOR_ID))
            .parameter(string_param("unit", ParameterIn::Query, false, "normalized (default) or raw"))
            .parameter(string_param(
                "max_age_ms",
                ParameterIn::Query,
                false,
                "Accept a cached value this young; default 0",
            ));
            one(envelope_responses(op, &output(Tool::GetSensorReading)))
        }
        Endpoint::History => {
            let op = resource(
                "get_sensor_history_resource",
                "Stored values of one sensor, as get_sensor_history (query parameters are its arguments)",
            )
            .parameter(id_param(SENSOR_ID));
            let op = query_params(
                op,
                &[("from", true), ("to", false), ("bucket", false), ("limit", false), ("cursor", false)],
                "get_sensor_history",
            );
            one(envelope_responses(op, &output(Tool::GetSensorHistory)))
        }
        Endpoint::Devices => one(envelope_responses(resource("get_devices", "Every device"), "envelope")),
        Endpoint::Device => {
            let op = resource("get_device", "One device").parameter(id_param(DEVICE_ID));
            one(envelope_responses(op, "envelope"))
        }
        Endpoint::ProbeDevice => {
            let op = resource(
                "probe_device",
                "An operator's probe of the device, at once, whatever its breaker says (operator token)",
            )
            .parameter(id_param(DEVICE_ID));
            one(envelope_responses(op, "envelope"))
        }
        Endpoint::WorkOrders => {
            let op = orders(
                "get_work_orders",
                "Work orders, newest first, as list_work_orders (query parameters are its arguments)",
            );
            let op = query_params(
                op,
                &[
                    ("status", false),
                    ("sensor_id", false),
                    ("since", false),
                    ("limit", false),
                    ("cursor", false),
                ],
                "list_work_orders",
            );
            one(envelope_responses(op, &output(Tool::ListWorkOrders)))
        }
        Endpoint::WorkOrder => {
            let op = orders("get_work_order_resource", "One work order with its history, as get_work_order")
                .parameter(id_param(ORDER_ID));
            one(envelope_responses(op, &output(Tool::GetWorkOrder)))
        }
        Endpoint::ActOnWorkOrder => one(envelope_responses(decide_operation(), &output(Tool::GetWorkOrder))),
        Endpoint::Alarms => {
            let op = alarms(
                "get_alarms",
                "The configured alarms and their state, as list_alarms (query parameters are its arguments)",
            );
            let op = query_params(
                op,
                &[
                    ("state", false),
                    ("priority", false),
                    ("plant", false),
                    ("zone", false),
                    ("sensor_id", false),
                    ("limit", false),
                    ("cursor", false),
                ],
                "list_alarms",
            );
            one(envelope_responses(op, &output(Tool::ListAlarms)))
        }
        Endpoint::ActOnAlarm => one(envelope_responses(alarm_act_operation(), "envelope")),
        Endpoint::Index => one(service("index", "What is served here")),
        Endpoint::OpenApi => one(service("openapi", "This document")),
        Endpoint::Healthz => one(service("healthz", "The process is alive")),
        Endpoint::ResourceMetadata => one(if r.path.ends_with("/mcp") {
            service(
                "resource_metadata_mcp",
                "OAuth Protected Resource Metadata (RFC 9728) of /mcp; 404 without [server.oauth]",
            )
        } else {
            service(
                "resource_metadata",
                "OAuth Protected Resource Metadata (RFC 9728) of the server; 404 without [server.oauth]",
            )
        }),
        Endpoint::Readyz => one(service(
            "readyz",
            "Ready to serve readings; status degraded while storage fails; 503 at a fleet hub without a broker",
        )),
        Endpoint::Metrics => one(service("metrics", "Prometheus metrics")),
        Endpoint::Mcp => one(match r.verb {
            Verb::Post => service("mcp", "MCP over Streamable HTTP (JSON-RPC)"),
            Verb::Get => service("mcp_stream", "MCP: a session's server-sent event stream"),
            Verb::Delete => service("mcp_end", "MCP: end a session"),
        }),
    }
}

/// `POST /v1/tools/{name}` of one tool.
fn tool_operation(t: &crate::tools::ToolSpec) -> (String, OperationBuilder) {
    let op = OperationBuilder::new()
        .tag("tools")
        .operation_id(Some(t.name()))
        .summary(Some(t.title))
        .description(Some(t.description))
        .request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content("application/json", Content::new(Some(schema_ref(&format!("{}.input", t.name())))))
                .build(),
        ));
    (format!("/v1/tools/{}", t.name()), envelope_responses(op, &format!("{}.output", t.name())))
}

fn resource(id: &str, summary: &str) -> OperationBuilder {
    OperationBuilder::new().tag("resources").operation_id(Some(id)).summary(Some(summary))
}

fn orders(id: &str, summary: &str) -> OperationBuilder {
    OperationBuilder::new().tag("work orders").operation_id(Some(id)).summary(Some(summary))
}

/// The service's own routes: index, this document, health, metrics and MCP.
fn service(id: &str, summary: &str) -> OperationBuilder {
    let op = OperationBuilder::new().tag("service").operation_id(Some(id)).summary(Some(summary));
    op.response("200", ResponseBuilder::new().description(summary).build())
}

/// Query parameters that are the arguments of `tool` of the same names.
fn query_params(mut op: OperationBuilder, params: &[(&str, bool)], tool: &str) -> OperationBuilder {
    for (p, required) in params {
        op = op.parameter(string_param(
            p,
            ParameterIn::Query,
            *required,
            &format!("As the {tool} argument of the same name."),
        ));
    }
    op
}

/// An operator's decision on a work order.
fn decide_operation() -> OperationBuilder {
    orders(
        "act_on_work_order",
        "An operator's decision: approve, reject, start, complete or cancel (operator token; body {\"note\": \"...\"} optional)",
    )
    .parameter(string_param("id", ParameterIn::Path, true, "Work order ID, e.g. WO-000001"))
    .parameter(string_param("action", ParameterIn::Path, true, "approve, reject, start, complete or cancel"))
    .request_body(Some(
        RequestBodyBuilder::new()
            .required(Some(Required::False))
            .content(
                "application/json",
                Content::new(Some(
                    ObjectBuilder::new().property("note", ObjectBuilder::new().schema_type(Type::String)).build(),
                )),
            )
            .build(),
    ))
}

fn alarms(id: &str, summary: &str) -> OperationBuilder {
    OperationBuilder::new().tag("alarms").operation_id(Some(id)).summary(Some(summary))
}

/// An operator's act on an alarm.
fn alarm_act_operation() -> OperationBuilder {
    let integer = || ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0));
    alarms(
        "act_on_alarm",
        "An operator's act: acknowledge, shelve, unshelve, out_of_service or in_service (operator token); answers {alarm} as it is after the act",
    )
    .parameter(string_param("alarm_id", ParameterIn::Path, true, "Alarm ID, SENSOR_ID.NAME, e.g. B_OVEN2_001.HI"))
    .parameter(string_param(
        "action",
        ParameterIn::Path,
        true,
        "acknowledge, shelve, unshelve, out_of_service or in_service",
    ))
    .request_body(Some(
        RequestBodyBuilder::new()
            .required(Some(Required::False))
            .content(
                "application/json",
                Content::new(Some(
                    ObjectBuilder::new()
                        .property("comment", ObjectBuilder::new().schema_type(Type::String).max_length(Some(500)))
                        .property("duration_s", integer().maximum(Some(604_800)))
                        .property("event_id", integer())
                        .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
                        .build(),
                )),
            )
            .build(),
    ))
}

/// `$schema` belongs to documents, not to component schemas.
fn strip(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
    }
    v
}
