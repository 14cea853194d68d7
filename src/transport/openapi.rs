//! `GET /openapi.json`: paths and operations built with utoipa; the request and response
//! schemas are the tools' generated JSON Schemas (OpenAPI 3.1 uses JSON Schema 2020-12,
//! which is what `schemars` produces), placed in `components.schemas` unchanged.

use serde_json::{Value, json};
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{Content, InfoBuilder, OpenApiBuilder, PathItem, PathsBuilder, Ref, Required};

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
            "DEVICE_TIMEOUT, DEVICE_UNAVAILABLE, DEVICE_BUSY, CIRCUIT_OPEN, DEVICE_PROTOCOL_ERROR, STORAGE_UNAVAILABLE, with Retry-After",
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

/// The OpenAPI 3.1 document of the HTTP API.
pub fn document() -> Value {
    let paths = service_paths(work_order_paths(resource_paths(tool_paths(PathsBuilder::new()))));
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

/// `POST /v1/tools/{name}` for every served tool, and `GET /v1/tools`.
fn tool_paths(mut paths: PathsBuilder) -> PathsBuilder {
    for t in TOOLS.iter().filter(|t| t.served) {
        let op = OperationBuilder::new()
            .tag("tools")
            .operation_id(Some(t.name()))
            .summary(Some(t.title))
            .description(Some(t.description))
            .request_body(Some(
                RequestBodyBuilder::new()
                    .required(Some(Required::True))
                    .content(
                        "application/json",
                        Content::new(Some(schema_ref(&format!("{}.input", t.name())))),
                    )
                    .build(),
            ));
        let op = envelope_responses(op, &format!("{}.output", t.name()));
        paths = paths.path(format!("/v1/tools/{}", t.name()), PathItem::new(HttpMethod::Post, op.build()));
    }
    let list = OperationBuilder::new()
        .tag("tools")
        .operation_id(Some("list_tool_definitions"))
        .summary(Some("Tool definitions, usable as function-calling definitions"))
        .response("200", ResponseBuilder::new().description("{\"tools\": [definition, ...]}").build());
    paths = paths.path("/v1/tools", PathItem::new(HttpMethod::Get, list.build()));

    paths
}

/// The resources: sensors, readings, history, devices and the operator's probe.
fn resource_paths(mut paths: PathsBuilder) -> PathsBuilder {
    let mut sensors = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("get_sensors"))
        .summary(Some("The sensors, as list_sensors (query parameters are its arguments)"));
    for p in ["plant", "zone", "device_id", "kind", "text", "limit", "cursor"] {
        sensors = sensors.parameter(string_param(
            p,
            ParameterIn::Query,
            false,
            "As the list_sensors argument of the same name.",
        ));
    }
    paths = paths.path(
        "/v1/sensors",
        PathItem::new(
            HttpMethod::Get,
            envelope_responses(sensors, &format!("{}.output", Tool::ListSensors.name())).build(),
        ),
    );
    let sensor = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("get_sensor"))
        .summary(Some("One sensor's description"))
        .parameter(string_param("id", ParameterIn::Path, true, "Sensor ID, e.g. A_LINE1_001"));
    paths = paths.path(
        "/v1/sensors/{id}",
        PathItem::new(HttpMethod::Get, envelope_responses(sensor, "envelope").build()),
    );
    let reading = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("get_sensor_reading_resource"))
        .summary(Some("The live reading of one sensor, as get_sensor_reading"))
        .parameter(string_param("id", ParameterIn::Path, true, "Sensor ID, e.g. A_LINE1_001"))
        .parameter(string_param("unit", ParameterIn::Query, false, "normalized (default) or raw"))
        .parameter(string_param(
            "max_age_ms",
            ParameterIn::Query,
            false,
            "Accept a cached value this young; default 0",
        ));
    paths = paths.path(
        "/v1/sensors/{id}/reading",
        PathItem::new(
            HttpMethod::Get,
            envelope_responses(reading, &format!("{}.output", Tool::GetSensorReading.name())).build(),
        ),
    );
    let devices = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("get_devices"))
        .summary(Some("Every device"));
    paths = paths
        .path("/v1/devices", PathItem::new(HttpMethod::Get, envelope_responses(devices, "envelope").build()));
    let device = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("get_device"))
        .summary(Some("One device"))
        .parameter(string_param("id", ParameterIn::Path, true, "Device ID, e.g. a-line1-plc"));
    paths = paths.path(
        "/v1/devices/{id}",
        PathItem::new(HttpMethod::Get, envelope_responses(device, "envelope").build()),
    );
    let mut history = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("get_sensor_history_resource"))
        .summary(Some(
            "Stored values of one sensor, as get_sensor_history (query parameters are its arguments)",
        ))
        .parameter(string_param("id", ParameterIn::Path, true, "Sensor ID, e.g. A_LINE1_001"));
    for (p, required) in
        [("from", true), ("to", false), ("bucket", false), ("limit", false), ("cursor", false)]
    {
        history = history.parameter(string_param(
            p,
            ParameterIn::Query,
            required,
            "As the get_sensor_history argument of the same name.",
        ));
    }
    paths = paths.path(
        "/v1/sensors/{id}/history",
        PathItem::new(
            HttpMethod::Get,
            envelope_responses(history, &format!("{}.output", Tool::GetSensorHistory.name())).build(),
        ),
    );
    let probe = OperationBuilder::new()
        .tag("resources")
        .operation_id(Some("probe_device"))
        .summary(Some(
            "An operator's probe of the device, at once, whatever its breaker says (operator token)",
        ))
        .parameter(string_param("id", ParameterIn::Path, true, "Device ID, e.g. a-line1-plc"));
    paths = paths.path(
        "/v1/devices/{id}/probe",
        PathItem::new(HttpMethod::Post, envelope_responses(probe, "envelope").build()),
    );
    paths
}

/// Work orders: the listing, one order, and an operator's decision.
fn work_order_paths(mut paths: PathsBuilder) -> PathsBuilder {
    let mut orders = OperationBuilder::new()
        .tag("work orders")
        .operation_id(Some("get_work_orders"))
        .summary(Some("Work orders, newest first, as list_work_orders (query parameters are its arguments)"));
    for p in ["status", "sensor_id", "since", "limit", "cursor"] {
        orders = orders.parameter(string_param(
            p,
            ParameterIn::Query,
            false,
            "As the list_work_orders argument of the same name.",
        ));
    }
    paths = paths.path(
        "/v1/work-orders",
        PathItem::new(
            HttpMethod::Get,
            envelope_responses(orders, &format!("{}.output", Tool::ListWorkOrders.name())).build(),
        ),
    );
    let order = OperationBuilder::new()
        .tag("work orders")
        .operation_id(Some("get_work_order_resource"))
        .summary(Some("One work order with its history, as get_work_order"))
        .parameter(string_param("id", ParameterIn::Path, true, "Work order ID, e.g. WO-000001"));
    paths = paths.path(
        "/v1/work-orders/{id}",
        PathItem::new(
            HttpMethod::Get,
            envelope_responses(order, &format!("{}.output", Tool::GetWorkOrder.name())).build(),
        ),
    );
    let decide = OperationBuilder::new()
        .tag("work orders")
        .operation_id(Some("act_on_work_order"))
        .summary(Some("An operator's decision: approve, reject, start, complete or cancel (operator token; body {\"note\": \"...\"} optional)"))
        .parameter(string_param("id", ParameterIn::Path, true, "Work order ID, e.g. WO-000001"))
        .parameter(string_param("action", ParameterIn::Path, true, "approve, reject, start, complete or cancel"))
        .request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::False))
                .content(
                    "application/json",
                    Content::new(Some(
                        ObjectBuilder::new()
                            .property("note", ObjectBuilder::new().schema_type(Type::String))
                            .build(),
                    )),
                )
                .build(),
        ));
    paths = paths.path(
        "/v1/work-orders/{id}/{action}",
        PathItem::new(
            HttpMethod::Post,
            envelope_responses(decide, &format!("{}.output", Tool::GetWorkOrder.name())).build(),
        ),
    );
    paths
}

/// The service's own routes: index, this document, health, metrics and MCP.
fn service_paths(mut paths: PathsBuilder) -> PathsBuilder {
    for (path, id, summary) in [
        ("/", "index", "What is served here"),
        ("/openapi.json", "openapi", "This document"),
        ("/healthz", "healthz", "The process is alive"),
        ("/readyz", "readyz", "Ready to serve readings; status degraded while storage fails"),
        ("/metrics", "metrics", "Prometheus metrics"),
        ("/mcp", "mcp", "MCP over Streamable HTTP (JSON-RPC)"),
    ] {
        let op = OperationBuilder::new().tag("service").operation_id(Some(id)).summary(Some(summary));
        let op = op.response("200", ResponseBuilder::new().description(summary).build());
        let method = if path == "/mcp" { HttpMethod::Post } else { HttpMethod::Get };
        paths = paths.path(path, PathItem::new(method, op.build()));
    }
    for (method, id, summary) in [
        (HttpMethod::Get, "mcp_stream", "MCP: a session's server-sent event stream"),
        (HttpMethod::Delete, "mcp_end", "MCP: end a session"),
    ] {
        let op = OperationBuilder::new().tag("service").operation_id(Some(id)).summary(Some(summary));
        let op = op.response("200", ResponseBuilder::new().description(summary).build());
        paths = paths.path("/mcp", PathItem::new(method, op.build()));
    }

    paths
}

/// `$schema` belongs to documents, not to component schemas.
fn strip(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
    }
    v
}
