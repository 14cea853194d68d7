//! The HTTP control API (`--control ADDR`): look at devices and change faults at run time.
//!
//! - `GET  /`                        what is served here
//! - `GET  /devices`                 every served device: address, faults, counters
//! - `GET  /devices/{id}/faults`     one device's faults
//! - `PATCH /devices/{id}/faults`    change the fields the JSON object names, keep the
//!   others (`null` sets one back to healthy); `PUT` does the same
//! - `DELETE /devices/{id}/faults`   every fault back to healthy
//! - `GET  /sensors/{id}`            the value a correct master reads now
//! - `PUT  /sensors/{id}`            drive the sensor with another wave from now on, e.g.
//!   `{"wave": "constant", "value": 250}` (the scenario's syntax)
//! - `PUT  /clock`                   `{"frozen_at_s": 12.5}` pins time, `null` releases it

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::{Faults, Simulator};

type Sim = Arc<Simulator>;

fn not_found(what: &str) -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "error": format!("no simulated {what}") }))).into_response()
}

async fn devices(State(sim): State<Sim>) -> Json<serde_json::Value> {
    let mut list: Vec<_> = sim
        .addrs()
        .into_iter()
        .map(|(id, addr)| json!({ "id": id, "addr": addr, "faults": sim.faults(&id), "stats": sim.stats(&id) }))
        .collect();
    list.extend(
        sim.opcua_urls()
            .into_iter()
            .map(|(id, url)| json!({ "id": id, "url": url, "protocol": "opcua", "faults": sim.faults(&id) })),
    );
    Json(json!({ "devices": list, "skipped": sim.skipped(), "time_s": sim.now() }))
}

async fn get_faults(State(sim): State<Sim>, Path(id): Path<String>) -> Response {
    match sim.faults(&id) {
        Some(f) => Json(f).into_response(),
        None => not_found("device"),
    }
}

/// `PATCH` or `PUT`: merges the fields given into the device's faults.
async fn patch_faults(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    Json(patch): Json<serde_json::Value>,
) -> Response {
    answer(sim.update_faults(&id, &patch))
}

async fn clear_faults(State(sim): State<Sim>, Path(id): Path<String>) -> Response {
    answer(sim.set_faults(&id, Faults::default()).map(|()| Faults::default()))
}

fn answer(result: Result<Faults, crate::SimError>) -> Response {
    match result {
        Ok(f) => Json(f).into_response(),
        Err(crate::SimError::UnknownDevice(_)) => not_found("device"),
        Err(e) => (StatusCode::BAD_REQUEST, Json(json!({ "error": e.to_string() }))).into_response(),
    }
}

async fn sensor(State(sim): State<Sim>, Path(id): Path<String>) -> Response {
    let t = sim.now();
    match sim.expected_at(&id, t) {
        Some(v) => Json(json!({ "sensor_id": id, "value": v, "time_s": t })).into_response(),
        None => not_found("sensor"),
    }
}

/// `PUT /sensors/{id}`: the sensor follows `wave` from now on.
async fn drive(State(sim): State<Sim>, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    if sim.expected(&id).is_none() {
        return not_found("sensor");
    }
    match serde_json::from_slice::<crate::Wave>(&body) {
        Ok(wave) => {
            sim.set_wave(&id, wave.clone());
            let t = sim.now();
            Json(json!({ "sensor_id": id, "wave": wave, "value": sim.expected_at(&id, t), "time_s": t })).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": format!("not a wave: {e}"), "example": { "wave": "constant", "value": 250 } })),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct ClockBody {
    frozen_at_s: Option<f64>,
}

async fn clock(State(sim): State<Sim>, Json(body): Json<ClockBody>) -> Json<serde_json::Value> {
    sim.freeze(body.frozen_at_s);
    Json(json!({ "time_s": sim.now(), "frozen": body.frozen_at_s.is_some() }))
}

/// `GET /`: what is served here.
async fn index() -> Json<serde_json::Value> {
    Json(json!({
        "service": "fieldgate-sim control API",
        "routes": {
            "GET /devices": "every served device: address, faults, counters",
            "GET /devices/{id}/faults": "one device's faults",
            "PATCH /devices/{id}/faults": "change the fault fields the JSON object names, keep the others (null: healthy); PUT does the same",
            "DELETE /devices/{id}/faults": "every fault back to healthy",
            "GET /sensors/{id}": "the value a correct master reads now",
            "PUT /sensors/{id}": "drive the sensor with another wave from now on, e.g. {\"wave\": \"constant\", \"value\": 250}",
            "PUT /clock": "{\"frozen_at_s\": 12.5} pins time, null releases it"
        },
        "faults": ["latency_ms", "jitter_ms", "no_reply", "late_reply", "late_reply_ms", "exception_code",
                   "exception_rate", "reset", "stall", "stall_ms", "down", "max_connections"]
    }))
}

pub fn router(sim: Sim) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/devices", get(devices))
        .route(
            "/devices/{id}/faults",
            get(get_faults).put(patch_faults).patch(patch_faults).delete(clear_faults),
        )
        .route("/sensors/{id}", get(sensor).put(drive))
        .route("/clock", put(clock))
        .with_state(sim)
}

/// Serves the control API on `addr`; returns the bound address.
pub async fn serve(sim: Sim, addr: SocketAddr) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router(sim)).await {
            tracing::warn!(%error, "control API stopped");
        }
    });
    Ok((bound, task))
}
