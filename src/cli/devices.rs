//! `fieldgate devices status|probe` (in this process, or through a running service with
//! `--url`) and `fieldgate check`.

use std::process::ExitCode;
use std::sync::Arc;

use super::{connect, data_of, fail, out};
use crate::config::Config;
use crate::registry::Registry;
use crate::tools::{Caller, Tool, ToolService};

/// `fieldgate devices status|probe ... --url`: a running service's device status and an
/// operator's probe; prints the envelope's data as JSON.
pub async fn devices_remote(url: &str, token: Option<String>, action: &str, id: Option<String>) -> ExitCode {
    let mut client = match connect(url, token).await {
        Ok(c) => c,
        Err((code, message)) => return fail(code, &message),
    };
    // Bounded: a hung service must not hold a script forever (as `call`).
    let wait = std::time::Duration::from_secs(60);
    let asked = match (action, id) {
        ("status", None) => tokio::time::timeout(wait, client.get("/v1/devices")).await,
        ("status", Some(id)) => tokio::time::timeout(wait, client.get(&format!("/v1/devices/{id}"))).await,
        ("probe", Some(id)) => {
            tokio::time::timeout(wait, client.post(&format!("/v1/devices/{id}/probe"), b"")).await
        }
        _ => return fail(2, "use `devices status [ID]` or `devices probe ID`"),
    };
    let Ok(response) = asked else {
        return fail(1, &format!("{url} did not answer within {} s", wait.as_secs()));
    };
    match data_of(response) {
        Ok(data) => {
            out(&serde_json::to_string_pretty(&data).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err((code, message)) => fail(code, &message),
    }
}

/// `devices status|probe` without `--url`: through the running fieldgate next to it
/// (`super::running_service`), else in this process; one output either way, the data as
/// JSON or the error as one line.
pub async fn devices(
    config: Config,
    registry: Registry,
    action: &str,
    id: Option<String>,
    token: Option<String>,
) -> ExitCode {
    match super::running_service(&config, false).await {
        Some(url) => devices_remote(&url, token, action, id).await,
        None => devices_local(config, registry, action, id).await,
    }
}

/// `devices status|probe` in this process (no service runs next to it).
async fn devices_local(config: Config, registry: Registry, action: &str, id: Option<String>) -> ExitCode {
    let service = ToolService::new(Arc::new(registry), config);
    let envelope = match (action, id) {
        ("probe", Some(id)) => Some(service.probe_device(&Caller::local(), &id).await),
        ("status", id) => Some(
            service
                .call_as(
                    &crate::tools::Caller::local(),
                    Tool::GetDeviceStatus,
                    serde_json::json!({ "device_id": id }),
                )
                .await,
        ),
        _ => None,
    };
    match envelope {
        Some(e) => {
            let v = serde_json::to_value(&e).unwrap_or_default();
            match super::envelope_data(&v) {
                Ok(data) => {
                    out(&serde_json::to_string_pretty(&data).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err((code, message)) => fail(code, &message),
            }
        }
        None => {
            eprintln!("error: use `devices status [ID]` or `devices probe ID`");
            ExitCode::from(2)
        }
    }
}

/// `check`: a summary of a valid configuration and plant, with notes on OPC UA security.
pub fn check(config: &Config, registry: &Registry, tokens: &crate::transport::auth::Tokens) -> ExitCode {
    out(&format!(
        "ok: {} devices, {} sensors (devices from {})",
        registry.devices().len(),
        registry.sensors().len(),
        config.devices.dir.display()
    ));
    for (protocol, devices, sensors) in registry.summary() {
        out(&format!("  {:<20} {devices} device(s), {sensors} sensor(s)", protocol.name()));
    }
    let pki = crate::driver::opcua::security::Pki::new(config.storage.data_dir.join("pki"));
    for d in registry.devices() {
        for line in crate::driver::opcua::security::notes(d, &pki) {
            out(&line);
        }
    }
    if exposure_and_tls(config, tokens) { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// `check --hub`: the configuration as `fieldgate hub` runs it.
pub fn check_hub(config: &Config, tokens: &crate::transport::auth::Tokens) -> ExitCode {
    let h = &config.hub;
    out(&format!(
        "ok: fleet hub {} on {} ({})",
        h.host_id,
        h.link.brokers.join(", "),
        if h.groups.is_empty() {
            "every group".to_string()
        } else {
            format!("groups {}", h.groups.join(", "))
        }
    ));
    if exposure_and_tls(config, tokens) { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// Whether the listener's exposure or its TLS settings fail (each finding printed).
fn exposure_and_tls(config: &Config, tokens: &crate::transport::auth::Tokens) -> bool {
    let mut failed = false;
    let exposure = crate::transport::http::Exposure {
        authenticated: !tokens.is_empty(),
        tls: config.server.tls.is_some(),
        allow_plaintext: config.server.allow_plaintext,
    };
    if let Some(refused) = crate::transport::http::exposure_refusal(config.server.listen, exposure) {
        failed = true;
        eprintln!("error: {refused}");
    }
    if let Some(tls) = &config.server.tls {
        use crate::transport::tls_listener::{Finding, check};
        for finding in check(tls, &config.server.public_url) {
            match finding {
                Finding::Error(m) => {
                    failed = true;
                    eprintln!("error: {m}");
                }
                Finding::Warning(m) => eprintln!("warning: {m}"),
                Finding::Fine(m) => out(&m),
            }
        }
    }
    failed
}
