//! The command line's commands, each in the module of what it does; `main.rs` only parses
//! the command line and calls them: [`run`] starts the service (`serve`, `mcp`, `demo`)
//! or makes one call (`call`), [`work_orders`] and [`devices`] are the operators' commands
//! (against the data directory when no service holds it, or through a running service with
//! `--url`), [`discover`] writes a device file skeleton from a live device.

use std::process::ExitCode;

use serde_json::Value;

use crate::transport::client::{HttpClient, HttpResponse};
use crate::transport::service_url::ServiceUrl;

pub mod alarms;
pub mod devices;
pub mod discover;
pub mod history;
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
    let target = ServiceUrl::parse(url).map_err(|e| (2, e.to_string()))?;
    let client = target.connect().await.map_err(|e| (1, e.to_string()))?;
    Ok(match &token {
        Some(t) => client.with_token(t),
        None => client,
    })
}

/// The running fieldgate a command next to it should ask, if any: the one that holds the
/// data directory (its owner file says where it listens), or one answering on the
/// configured `server.listen` (a demo keeps its data elsewhere; not asked when the command
/// named its data directory itself). `None`: no service here, the command runs in this
/// process.
pub async fn running_service(config: &crate::config::Config, named_dir: bool) -> Option<String> {
    let dir = crate::app::absolute(&config.storage.data_dir);
    // An owner file left by a process that died (kill -9, power loss) names nobody.
    let owner = crate::app::owner_of(&dir).and_then(|o| o.url).and_then(|u| ServiceUrl::parse(&u).ok());
    if let Some(url) = owner
        && let Some(url) = answers(&url).await
    {
        return Some(url);
    }
    if named_dir {
        return None;
    }
    answers(&crate::app::own_url(&config.server)).await
}

/// The URL when a fieldgate answers there within 2 s.
async fn answers(url: &ServiceUrl) -> Option<String> {
    let ask = async {
        let mut client = url.connect().await.ok()?;
        let r = client.get("/").await.ok()?;
        // Itself a fieldgate (open on loopback), or one that wants a token for its index.
        let ours = r.json()["service"] == "fieldgate" || r.json()["error"]["code"] == "UNAUTHORIZED";
        ours.then(|| url.to_string())
    };
    tokio::time::timeout(std::time::Duration::from_secs(2), ask).await.ok().flatten()
}

/// The data of an envelope, or its error as one line for a person.
fn data_of(r: std::io::Result<HttpResponse>) -> Result<Value, (u8, String)> {
    let r = r.map_err(|e| (1, e.to_string()))?;
    let v = r.json();
    envelope_data(&v).map_err(|(code, message)| {
        if v["error"]["code"].is_string() {
            (code, message)
        } else {
            // Not an envelope (a plain-HTTP request to the HTTPS port is answered "use
            // https://"): its first line, if it is short plain text.
            let said = std::str::from_utf8(&r.body)
                .ok()
                .and_then(|t| t.lines().next())
                .map(str::trim)
                .filter(|l| !l.is_empty() && l.len() <= 200 && !l.chars().any(crate::plain::is_hidden));
            match said {
                Some(line) => (1, format!("unexpected answer (HTTP {}): {line}", r.status)),
                None => (1, format!("unexpected answer (HTTP {})", r.status)),
            }
        }
    })
}

/// The data of an envelope, or its error as one line for a person (exit code 2).
fn envelope_data(v: &Value) -> Result<Value, (u8, String)> {
    if v["ok"] == true {
        return Ok(v["data"].clone());
    }
    let e = &v["error"];
    match (e["code"].as_str(), e["message"].as_str()) {
        (Some(code), Some(message)) => {
            let hint = match code {
                // The agent's words are not the right ones for a person at the command line.
                "UNAUTHORIZED" => " This service needs a token: pass one with --token or FIELDGATE_CLI_TOKEN (the service knows it from FIELDGATE_TOKEN_<NAME>=<role>:<token> or its tokens file).".to_string(),
                "FORBIDDEN" if message.contains("operator") => " This needs an operator token: pass it with --token or FIELDGATE_CLI_TOKEN.".to_string(),
                _ => e["hint"].as_str().map(|h| format!(" {h}")).unwrap_or_default(),
            };
            let near: Vec<&str> =
                e["suggestions"].as_array().into_iter().flatten().filter_map(Value::as_str).take(3).collect();
            let near =
                if near.is_empty() { String::new() } else { format!(" Did you mean {}?", near.join(", ")) };
            Err((2, format!("{message} ({code}).{near}{hint}")))
        }
        _ => Err((1, "unexpected answer: not an envelope".into())),
    }
}
