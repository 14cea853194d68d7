//! `fieldgate alarms list|ack|shelve|unshelve|out-of-service|in-service`: the alarms and
//! the operator's acts on them, through the running fieldgate next to it (or `--url`),
//! else in this process against the data directory; one output either way (a table for
//! people, `--json` for machines).

use std::process::ExitCode;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{connect, data_of, envelope_data, fail, out};
use crate::config::Config;
use crate::registry::Registry;
use crate::tools::{AlarmActBody, Caller, Tool, ToolService};

/// What an alarm command asks.
pub struct AlarmCommand {
    pub action: String,
    pub id: Option<String>,
    pub comment: Option<String>,
    /// Shelve: for how long, e.g. `30m`, `2h`, `3600s`.
    pub duration: Option<String>,
    /// Acknowledge: the event seen.
    pub event_id: Option<u64>,
    /// List: only this state (`active`, `unacknowledged`, `not_normal`, ...).
    pub state: Option<String>,
    pub json: bool,
}

/// The act of a command's action, as the HTTP route names it.
fn act_of(action: &str) -> Option<&'static str> {
    Some(match action {
        "ack" | "acknowledge" => "acknowledge",
        "shelve" => "shelve",
        "unshelve" => "unshelve",
        "out-of-service" | "out_of_service" => "out_of_service",
        "in-service" | "in_service" => "in_service",
        _ => return None,
    })
}

/// `30m`, `2h`, `1d`, `45s` or plain seconds.
fn seconds(text: &str) -> Option<u64> {
    let t = text.trim();
    let (n, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = n.parse().ok()?;
    n.checked_mul(match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    })
}

/// The request of a command: a list's query, or an act's route and body.
enum Request {
    List(Value),
    Act { id: String, act: &'static str, body: AlarmActBody },
}

fn request(cmd: &AlarmCommand) -> Result<Request, String> {
    if cmd.action == "list" {
        return Ok(Request::List(json!({ "state": cmd.state, "limit": 1000 })));
    }
    let act = act_of(&cmd.action).ok_or_else(|| {
        format!(
            "unknown action {:?}; use list, ack, shelve, unshelve, out-of-service or in-service",
            cmd.action
        )
    })?;
    let id =
        cmd.id.clone().ok_or_else(|| format!("{} needs an alarm ID, e.g. B_BOILER_001.HI", cmd.action))?;
    // Sent as a path segment: only the alarm ID grammar's characters, so that no ID
    // typed can reach another route or act.
    let grammar = regex::Regex::new(crate::tools::defs::ALARM_ID_PATTERN).map_err(|e| e.to_string())?;
    if !grammar.is_match(&id) {
        return Err(format!(
            "{id:?} is not an alarm ID: SENSOR_ID.NAME or DEVICE_ID.NAME, e.g. B_BOILER_001.HI or a-line1-plc.COMM"
        ));
    }
    let duration_s = match &cmd.duration {
        Some(d) => Some(seconds(d).ok_or_else(|| format!("--duration {d:?}: use e.g. 30m, 2h or 3600"))?),
        None if act == "shelve" => return Err("shelve needs --duration (e.g. 2h) and --comment (why)".into()),
        None => None,
    };
    let body = AlarmActBody { comment: cmd.comment.clone(), duration_s, event_id: cmd.event_id };
    Ok(Request::Act { id, act, body })
}

/// `fieldgate alarms ...` through a running service at `url`.
pub async fn alarms_remote(url: &str, token: Option<String>, cmd: &AlarmCommand) -> ExitCode {
    let req = match request(cmd) {
        Ok(r) => r,
        Err(e) => return fail(2, &e),
    };
    let mut client = match connect(url, token).await {
        Ok(c) => c,
        Err((code, message)) => return fail(code, &message),
    };
    let wait = std::time::Duration::from_secs(60);
    let asked = match &req {
        Request::List(q) => {
            let state = q["state"].as_str().map(|s| format!("&state={s}")).unwrap_or_default();
            tokio::time::timeout(wait, client.get(&format!("/v1/alarms?limit=1000{state}"))).await
        }
        Request::Act { id, act, body } => {
            let b =
                json!({ "comment": body.comment, "duration_s": body.duration_s, "event_id": body.event_id });
            let bytes = serde_json::to_vec(&b).unwrap_or_default();
            tokio::time::timeout(wait, client.post(&format!("/v1/alarms/{id}/{act}"), &bytes)).await
        }
    };
    let Ok(response) = asked else {
        return fail(1, &format!("{url} did not answer within {} s", wait.as_secs()));
    };
    shown(data_of(response), cmd.json)
}

/// `fieldgate alarms ...`: through the running fieldgate next to it, else in this process.
pub async fn alarms(
    config: Config,
    registry: Registry,
    cmd: AlarmCommand,
    token: Option<String>,
) -> ExitCode {
    if let Some(url) = super::running_service(&config, false).await {
        return alarms_remote(&url, token, &cmd).await;
    }
    let req = match request(&cmd) {
        Ok(r) => r,
        Err(e) => return fail(2, &e),
    };
    let dir = crate::app::absolute(&config.storage.data_dir);
    // A journal is made by the service; here one that is not there is a wrong directory.
    if !dir.join("alarms.redb").is_file() {
        return fail(
            1,
            &format!(
                "no alarm journal in {}: name fieldgate's data directory with --data-dir, or its service with --url",
                dir.display()
            ),
        );
    }
    let stores = match crate::app::open_stores(&config, &dir) {
        Ok(s) => s,
        Err(e) => return fail(1, &e.to_string()),
    };
    let service = ToolService::with_stores(Arc::new(registry), config, stores);
    let by = std::env::var("USER").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| "local".into());
    let caller = Caller::with_role(&by, crate::tools::Role::Operator);
    let envelope = match req {
        Request::List(q) => service.call_as(&caller, Tool::ListAlarms, q).await,
        Request::Act { id, act, body } => service.act_on_alarm(&caller, &id, act, body).await,
    };
    shown(envelope_data(&serde_json::to_value(&envelope).unwrap_or_default()), cmd.json)
}

/// Prints an answer: a list as a table, an alarm as one block; JSON with `--json`.
fn shown(data: Result<Value, (u8, String)>, as_json: bool) -> ExitCode {
    let data = match data {
        Ok(d) => d,
        Err((code, message)) => return fail(code, &message),
    };
    if as_json {
        out(&serde_json::to_string_pretty(&data).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let line = |a: &Value| {
        let mut state = text(&a["state"]);
        if a["shelved_until"].is_string() {
            state.push_str(&format!(" (shelved until {})", text(&a["shelved_until"])));
        }
        if a["out_of_service"] == true {
            state = "out_of_service".into();
        }
        format!(
            "{:<24} {:<8} {:<40} event {:<5} since {}  {}",
            text(&a["alarm_id"]),
            text(&a["priority"]),
            state,
            a["event_id"],
            text(&a["since"]),
            text(&a["message"])
        )
    };
    match data["alarms"].as_array() {
        Some(list) => {
            let c = &data["counts"];
            out(&format!(
                "{} alarms: {} active, {} unacknowledged, {} shelved, {} out of service",
                c["configured"], c["active"], c["unacknowledged"], c["shelved"], c["out_of_service"]
            ));
            for a in list {
                out(&line(a));
            }
        }
        None => out(&line(&data["alarm"])),
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::seconds;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(
            [seconds("90"), seconds("30m"), seconds("2h"), seconds("1d")],
            [Some(90), Some(1800), Some(7200), Some(86_400)]
        );
        assert_eq!([seconds("2w"), seconds("h"), seconds("99999999999999999999d")], [None, None, None]);
    }
}
