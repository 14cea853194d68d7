//! The command line's commands, each in the module of what it does; `main.rs` only parses
//! the command line and calls them: [`run`] starts the service (`serve`, `mcp`, `demo`)
//! or makes one call (`call`), [`work_orders`] and [`devices`] are the operators' commands
//! (against the data directory when no service holds it, or through a running service with
//! `--url`), [`discover`] writes a device file skeleton from a live device.

use std::process::ExitCode;

use serde_json::Value;

use crate::transport::client::{HttpClient, HttpResponse};

pub mod devices;
pub mod discover;
pub mod run;
pub mod work_orders;

pub use run::StopSignal;
pub use work_orders::{Target, WorkOrderCommand};

/// Prints a line to stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn out(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn fail(code: u8, message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(code)
}

/// A client of the running service at `url`.
pub async fn connect(url: &str, token: Option<String>) -> Result<HttpClient, (u8, String)> {
    let Some(authority) = url.strip_prefix("http://").map(|r| r.trim_end_matches('/')) else {
        return Err((2, "--url must be http://host:port".into()));
    };
    let Some(addr) = tokio::net::lookup_host(authority).await.ok().and_then(|mut a| a.next()) else {
        return Err((1, format!("cannot resolve {authority}")));
    };
    let client = HttpClient::connect(addr).await.map_err(|e| (1, format!("cannot reach {url}: {e}")))?;
    Ok(match &token {
        Some(t) => client.with_token(t),
        None => client,
    })
}

/// The data of an envelope, or its error as one line for a person.
fn data_of(r: std::io::Result<HttpResponse>) -> Result<Value, (u8, String)> {
    let r = r.map_err(|e| (1, e.to_string()))?;
    let v = r.json();
    if v["ok"] == true {
        return Ok(v["data"].clone());
    }
    let e = &v["error"];
    match (e["code"].as_str(), e["message"].as_str()) {
        (Some(code), Some(message)) => {
            let hint = match code {
                // The agent's words are not the right ones for a person at the command line.
                "UNAUTHORIZED" | "FORBIDDEN" => " This needs an operator token: pass it with --token or FIELDGATE_CLI_TOKEN (the service knows it from FIELDGATE_TOKEN_<NAME>=operator:<token> or its tokens file).".to_string(),
                _ => e["hint"].as_str().map(|h| format!(" {h}")).unwrap_or_default(),
            };
            Err((2, format!("{message} ({code}).{hint}")))
        }
        _ => Err((1, format!("unexpected answer (HTTP {})", r.status))),
    }
}
