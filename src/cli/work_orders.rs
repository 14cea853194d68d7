//! `fieldgate work-orders`: list, show and the operator's decisions, against the data
//! directory when no service holds it or through a running service (`--url`), with one
//! output either way (a table or a block for people, `--json` for machines).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{connect, data_of, fail, out};
use crate::tools::defs::WorkOrder;
use crate::tools::work_orders::render;
use crate::work_orders::{Action, WorkOrderError, WorkOrderStatus, WorkOrderStore};

/// Where a command runs.
pub enum Target {
    /// The data directory, opened by this process.
    Local { data_dir: PathBuf, webhook_configured: bool },
    /// A running service.
    Remote { url: String, token: Option<String> },
}

/// What a work-order command asks.
pub struct WorkOrderCommand {
    pub action: String,
    pub id: Option<String>,
    pub note: Option<String>,
    pub by: Option<String>,
    pub json: bool,
}

enum Answer {
    List(Vec<WorkOrder>),
    One(Box<WorkOrder>),
}

fn transition_of(action: &str) -> Result<Option<WorkOrderStatus>, String> {
    if matches!(action, "list" | "show") {
        return Ok(None);
    }
    Action::named(action)
        .map(|a| Some(a.target()))
        .ok_or_else(|| format!("unknown action {action:?}; use list, show, {}", Action::NAMES))
}

/// `fieldgate work-orders ACTION [ID]`.
pub async fn work_orders(target: Target, cmd: WorkOrderCommand) -> ExitCode {
    let to = match transition_of(&cmd.action) {
        Ok(t) => t,
        Err(e) => return fail(2, &e),
    };
    if cmd.action != "list" && cmd.id.is_none() {
        return fail(2, &format!("{} needs a work order ID, e.g. WO-000001", cmd.action));
    }
    let answer = match target {
        Target::Local { data_dir, webhook_configured } => local(&data_dir, &cmd, to, webhook_configured),
        Target::Remote { url, token } => remote_work_orders(&url, token, &cmd).await,
    };
    match answer {
        Ok(a) => {
            print_answer(&a, cmd.json);
            ExitCode::SUCCESS
        }
        Err((code, message)) => fail(code, &message),
    }
}

fn local(
    data_dir: &Path,
    cmd: &WorkOrderCommand,
    to: Option<WorkOrderStatus>,
    webhook_configured: bool,
) -> Result<Answer, (u8, String)> {
    let file = data_dir.join("work_orders.redb");
    // Reading never creates a data directory or a store.
    if to.is_none() && !file.exists() {
        return match cmd.action.as_str() {
            "list" => Ok(Answer::List(Vec::new())),
            _ => Err((
                2,
                format!("no work order {} (no store at {})", cmd.id.as_deref().unwrap_or(""), file.display()),
            )),
        };
    }
    let store = WorkOrderStore::open_in(data_dir).map_err(|e| match &e {
        WorkOrderError::Refused(m) if m.contains("in use by another fieldgate process") => {
            let id = cmd.id.as_deref().map(|i| format!(" {i}")).unwrap_or_default();
            let hint = match crate::app::owner_of(data_dir).and_then(|o| o.url) {
                Some(url) => format!(
                    "ask it instead: fieldgate work-orders {}{id} --url {url} (deciding needs an operator token in FIELDGATE_CLI_TOKEN)",
                    cmd.action
                ),
                None => "ask it with --url http://HOST:PORT (where it listens), or stop it".to_string(),
            };
            (1, format!("{} is held by a running fieldgate; {hint}", file.display()))
        }
        _ => (1, e.to_string()),
    })?;
    let id = cmd.id.clone().unwrap_or_default();
    let by = cmd.by.clone().or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "operator".into());
    // What a person types is shown on the console and in terminals: plain text only.
    let plain = |what: &str, text: &str| {
        crate::tools::validate::text::check(what, text).map_err(|e| (2, format!("--{what}: {}", e.message)))
    };
    plain("by", &by)?;
    if by.chars().count() > 100 {
        return Err((2, "--by: at most 100 characters".into()));
    }
    if let Some(note) = &cmd.note {
        plain("note", note)?;
    }
    // Shown as the tools show it (with no webhook configured, delivery says so).
    let one = |o| Answer::One(Box::new(render(o, webhook_configured)));
    let result = match (cmd.action.as_str(), to) {
        ("list", _) => {
            store.list().map(|l| Answer::List(l.into_iter().map(|o| render(o, webhook_configured)).collect()))
        }
        (_, None) => store.get(&id).map(one),
        (_, Some(to)) => store
            .transition(&id, to, &by, cmd.note.clone())
            .inspect(|order| {
                tracing::info!(
                    target: "audit",
                    event = "operator_decision",
                    caller = by.as_str(),
                    door = "command line",
                    work_order = %order.id,
                    action = cmd.action.as_str(),
                    outcome = "success",
                    "work order decided"
                );
            })
            .map(one),
    };
    result.map_err(|e| (2, e.to_string()))
}

async fn remote_work_orders(
    url: &str,
    token: Option<String>,
    cmd: &WorkOrderCommand,
) -> Result<Answer, (u8, String)> {
    let mut client = connect(url, token).await?;
    let id = cmd.id.clone().unwrap_or_default();
    let data = match cmd.action.as_str() {
        "list" => data_of(client.get("/v1/work-orders?limit=500").await)?,
        "show" => data_of(client.get(&format!("/v1/work-orders/{id}")).await)?,
        action => {
            let body = serde_json::to_vec(&serde_json::json!({ "note": cmd.note })).unwrap_or_default();
            data_of(client.post(&format!("/v1/work-orders/{id}/{action}"), &body).await)?
        }
    };
    let bad = |_| (1, "the service answered work orders in an unexpected shape".to_string());
    match cmd.action.as_str() {
        "list" => serde_json::from_value(data["work_orders"].clone()).map(Answer::List).map_err(bad),
        _ => {
            serde_json::from_value(data["work_order"].clone()).map(|o| Answer::One(Box::new(o))).map_err(bad)
        }
    }
}

fn print_answer(a: &Answer, json: bool) {
    match (a, json) {
        (Answer::List(list), true) => out(&serde_json::to_string_pretty(list).unwrap_or_default()),
        (Answer::One(o), true) => out(&serde_json::to_string_pretty(o).unwrap_or_default()),
        (Answer::List(list), false) if list.is_empty() => out("no work orders"),
        (Answer::List(list), false) => {
            out(&format!(
                "{:<9}  {:<16} {:<12} {:<7} {:<24}  summary",
                "id", "status", "sensor", "priority", "created"
            ));
            for o in list {
                out(&format!(
                    "{:<9}  {:<16} {:<12} {:<7} {:<24}  {}",
                    o.id,
                    o.status.as_str(),
                    o.sensor_id,
                    o.priority.as_str(),
                    o.created_at,
                    // One row per order: a line break or control character in the text an
                    // agent wrote is shown escaped, never able to forge a row.
                    crate::tools::envelope::visible(&o.summary)
                ));
            }
        }
        (Answer::One(o), false) => {
            out(&format!(
                "{}  {}  {} {} on {}",
                o.id,
                o.status.as_str(),
                o.priority.as_str(),
                o.work_type.as_str(),
                o.sensor_id
            ));
            out(&format!("  {}", crate::tools::envelope::visible(&o.summary)));
            out(&format!("  created {} by {}", o.created_at, o.created_by));
            for t in &o.history {
                let note = t
                    .note
                    .as_deref()
                    .map(|n| format!(": {}", crate::tools::envelope::visible(n)))
                    .unwrap_or_default();
                out(&format!("  {}  {} by {}{note}", t.at, t.to.as_str(), t.by));
            }
            if let Some(d) = &o.delivery {
                out(&format!("  delivery {} ({} attempts)", d.state, d.attempts));
            }
        }
    }
}
