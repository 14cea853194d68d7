//! Work orders: idempotency under concurrency, duplicates, the lifecycle, the operator
//! role, expiry and delivery through the outbox (crashes: `work_orders_crash.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use fieldgate::tools::defs::WorkOrderStatus as S;
use fieldgate::tools::{ErrorCode, ToolService};
use fieldgate::work_orders::{WorkOrderStore, allowed};
use serde_json::{Value, json};

use super::support::*;

fn order(sensor: &str, ty: &str, key: &str) -> Value {
    json!({"sensor_id": sensor, "type": ty, "priority": "medium",
           "summary": "Discharge pressure above range for an hour; inspect the pump.", "idempotency_key": key})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_calls_with_one_key_create_one_work_order() {
    let svc = service();
    let calls = (0..50).map(|_| {
        let svc = svc.clone();
        tokio::spawn(async move {
            svc.call("create_work_order", order("A_LINE1_001", "inspection", "report-key-0001"))
                .await
                .unwrap()
        })
    });
    let mut ids = HashSet::new();
    let mut created = 0;
    for c in calls {
        let e = c.await.unwrap();
        assert!(e.ok, "{:?}", e.error);
        let d = e.json();
        ids.insert(d["work_order"]["id"].as_str().unwrap().to_string());
        created += usize::from(d["created"] == true);
        assert_eq!(d["status"], "pending_approval");
        assert_eq!(d["approval_required"], true);
        assert!(d["next_check_after_seconds"].as_u64().unwrap() > 0);
    }
    assert_eq!((ids.len(), created), (1, 1));
    assert_eq!(svc.work_orders().unwrap().list().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_keys_for_the_same_sensor_and_type_create_one_and_point_at_it() {
    let svc = service();
    let calls = (0..50).map(|i| {
        let svc = svc.clone();
        tokio::spawn(async move {
            svc.call("create_work_order", order("A_LINE1_002", "repair", &format!("agent-run-{i:04}")))
                .await
                .unwrap()
        })
    });
    let mut results = Vec::new();
    for c in calls {
        results.push(c.await.unwrap().json());
    }
    let created: Vec<&Value> = results.iter().filter(|d| d["created"] == true).collect();
    assert_eq!(created.len(), 1);
    let id = created[0]["work_order"]["id"].clone();
    for d in results.iter().filter(|d| d["created"] == false) {
        assert_eq!(d["duplicate_of"], id);
        assert_eq!(d["work_order"]["id"], id);
    }
    // Another type for the same sensor is a separate order.
    let e = svc.call("create_work_order", order("A_LINE1_002", "cleaning", "agent-run-9999")).await.unwrap();
    assert_eq!(e.json()["created"], true);
}

#[tokio::test]
async fn a_key_reused_with_other_arguments_is_a_conflict() {
    let svc = service();
    let first =
        svc.call("create_work_order", order("A_LINE1_003", "inspection", "key-conflict-1")).await.unwrap();
    assert!(first.ok);
    let e =
        svc.call("create_work_order", order("A_LINE1_004", "inspection", "key-conflict-1")).await.unwrap();
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::IdempotencyConflict);
    assert!(!err.retryable);
    assert!(err.message.contains(first.json()["work_order"]["id"].as_str().unwrap()));
    // The same arguments with the same key: the same order, not created again.
    let again = svc
        .call("create_work_order", order("A_LINE1_003", "inspection", "key-conflict-1"))
        .await
        .unwrap()
        .json();
    assert_eq!(again["created"], false);
    assert_eq!(again["work_order"]["id"], first.json()["work_order"]["id"]);
}

#[tokio::test]
async fn arguments_are_validated() {
    let svc = service();
    for (args, param) in [
        (
            json!({"sensor_id": "A_LINE1_001", "type": "inspect", "priority": "low", "summary": "A long enough summary.", "idempotency_key": "abcdefgh"}),
            "type",
        ),
        (
            json!({"sensor_id": "A_LINE1_001", "type": "repair", "priority": "low", "summary": "short", "idempotency_key": "abcdefgh"}),
            "summary",
        ),
        (
            json!({"sensor_id": "A_LINE1_001", "type": "repair", "priority": "low", "summary": "A long enough summary.", "idempotency_key": "bad key!"}),
            "idempotency_key",
        ),
        (
            json!({"sensor_id": "A_LINE1_001", "type": "repair", "priority": "low", "summary": "          x         ", "idempotency_key": "abcdefgh"}),
            "summary",
        ),
    ] {
        let err = svc.call("create_work_order", args.clone()).await.unwrap().error.unwrap();
        assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::InvalidArgument, Some(param)), "{args}");
    }
    let err = svc
        .call("create_work_order", order("A_LINE1_099", "repair", "abcdefgh"))
        .await
        .unwrap()
        .error
        .unwrap();
    assert_eq!(err.code, ErrorCode::SensorNotFound);
    let err = svc.call("get_work_order", json!({"work_order_id": "WO-000777"})).await.unwrap().error.unwrap();
    assert_eq!(err.code, ErrorCode::WorkOrderNotFound);
    // Regression (issue 32): a short key said "not in the expected format" with a regex.
    let err =
        svc.call("create_work_order", order("A_LINE1_001", "repair", "abc123")).await.unwrap().error.unwrap();
    assert_eq!(err.parameter.as_deref(), Some("idempotency_key"));
    assert_eq!(err.message, "`idempotency_key` has 6 characters; 8-128 are needed.");
    assert!(err.expected.as_deref().is_some_and(|e| e.starts_with("8-128 characters")), "{err:?}");
    // A pattern without a friendlier name is stated as the pattern itself.
    let err = svc.call("get_work_order", json!({"work_order_id": "WO-12"})).await.unwrap().error.unwrap();
    assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::InvalidArgument, Some("work_order_id")));
    assert_eq!(err.expected.as_deref(), Some("a string matching ^WO-[0-9]{6,}$"));
    assert_eq!(err.received.as_deref(), Some("WO-12"));
}

#[test]
fn every_lifecycle_transition_and_every_refused_one() {
    let all =
        [S::PendingApproval, S::Approved, S::InProgress, S::Completed, S::Rejected, S::Cancelled, S::Expired];
    let ok = [
        (S::PendingApproval, S::Approved),
        (S::PendingApproval, S::Rejected),
        (S::PendingApproval, S::Expired),
        (S::Approved, S::InProgress),
        (S::Approved, S::Cancelled),
        (S::InProgress, S::Completed),
        (S::InProgress, S::Cancelled),
    ];
    for from in all {
        for to in all {
            assert_eq!(allowed(from, to), ok.contains(&(from, to)), "{from:?} -> {to:?}");
        }
    }
}

#[tokio::test]
async fn operators_move_orders_and_the_agent_cannot() {
    let svc = service();
    let id = svc
        .call("create_work_order", order("A_LINE1_005", "calibration", "cal-0000001"))
        .await
        .unwrap()
        .json()["work_order"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let agent = fieldgate::tools::Caller::with_role("reporter", fieldgate::tools::Role::Agent);
    let op = fieldgate::tools::Caller::with_role("shift-lead", fieldgate::tools::Role::Operator);
    let e = svc.act_on_work_order(&agent, &id, "approve", None).await;
    assert_eq!(e.error.unwrap().code, ErrorCode::Forbidden);
    // A state conflict, not a bad argument: its own code, naming the state and what is allowed.
    let e = svc.act_on_work_order(&op, &id, "start", None).await;
    let err = e.error.unwrap();
    assert_eq!(err.code, ErrorCode::InvalidState, "pending cannot start");
    assert!(!err.retryable);
    assert_eq!(err.message, format!("Work order {id} is pending_approval; it cannot move to in_progress."));
    assert!(err.hint.starts_with("Allowed now: approve, reject."), "{}", err.hint);
    // A note past 500 characters is refused whole, never cut and stored.
    let e = svc.act_on_work_order(&op, &id, "approve", Some("n".repeat(501))).await;
    assert_eq!(e.error.unwrap().code, ErrorCode::InvalidArgument);
    let long = "Checked on site: ".to_string() + &"n".repeat(483);
    for (action, status) in [("approve", "approved"), ("start", "in_progress"), ("complete", "completed")] {
        let note = if action == "approve" { long.clone() } else { format!("{action}d by the test") };
        let e = svc.act_on_work_order(&op, &id, action, Some(note)).await;
        assert_eq!(e.json()["work_order"]["status"], status, "{:?}", e.error);
    }
    let wo = svc.call("get_work_order", json!({"work_order_id": id})).await.unwrap().json();
    assert_eq!(wo["work_order"]["history"][1]["note"], long.as_str(), "a 500-character note kept whole");
    let e = svc.act_on_work_order(&op, &id, "cancel", None).await;
    assert!(e.error.unwrap().message.contains("completed"));
    let wo = svc.call("get_work_order", json!({"work_order_id": id})).await.unwrap().json();
    let history: Vec<(&str, &str)> = wo["work_order"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["to"].as_str().unwrap(), t["by"].as_str().unwrap()))
        .collect();
    assert_eq!(
        history,
        [
            ("pending_approval", "local"),
            ("approved", "shift-lead"),
            ("in_progress", "shift-lead"),
            ("completed", "shift-lead")
        ]
    );
    // Closed: a new order for the same sensor and type is created, not a duplicate.
    let again = svc
        .call("create_work_order", order("A_LINE1_005", "calibration", "cal-0000002"))
        .await
        .unwrap()
        .json();
    assert_eq!(again["created"], true);
    // list_work_orders filters and pages.
    let l = svc.call("list_work_orders", json!({"status": "completed"})).await.unwrap().json();
    assert_eq!(l["total"], 1);
    let l =
        svc.call("list_work_orders", json!({"sensor_id": "A_LINE1_005", "limit": 1})).await.unwrap().json();
    assert_eq!((l["total"].as_u64(), l["work_orders"].as_array().unwrap().len()), (Some(2), 1));
    let next = l["next_cursor"].as_str().unwrap();
    let l2 = svc
        .call("list_work_orders", json!({"sensor_id": "A_LINE1_005", "limit": 1, "cursor": next}))
        .await
        .unwrap()
        .json();
    assert_ne!(l2["work_orders"][0]["id"], l["work_orders"][0]["id"]);
    assert_eq!(l2["complete"], true);
}

/// Regression (issue 32): a summary with U+202E showed "Pump BLOCK overheat" reversed on
/// the operator's queue, and NUL and BEL went raw into the HTML. Text a person will read
/// is refused with what and where; nothing is stored.
#[tokio::test]
async fn control_and_bidi_characters_in_agent_text_are_refused_and_nothing_is_stored() {
    let svc = service();
    let env = [("FIELDGATE_TOKEN_LEAD".to_string(), "operator:operator-token-0123456789".to_string())];
    let server = Server::start(svc, fieldgate::transport::auth::Tokens::load(None, env).unwrap()).await;
    let mut c = server.client().await.with_token("operator-token-0123456789");
    for (i, summary) in
        ["Pump \u{202e}kcolb overheat, check it", "Pump overheat\u{0}\u{7} check it"].iter().enumerate()
    {
        let mut args = order("B_BOILER_003", "inspection", &format!("bidi-key-00{i}"));
        args["summary"] = json!(summary);
        let r = c.post("/v1/tools/create_work_order", &serde_json::to_vec(&args).unwrap()).await.unwrap();
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
        let e = &r.json()["error"];
        assert_eq!((&e["code"], &e["parameter"]), (&json!("INVALID_ARGUMENT"), &json!("summary")), "{e}");
        assert!(e["message"].as_str().unwrap().contains("U+"), "{e}");
    }
    let mut args = order("B_BOILER_003", "inspection", "bidi-key-ok");
    args["summary"] = json!("Pump overheat.\nLine two\twith a tab: check it");
    let r = c.post("/v1/tools/create_work_order", &serde_json::to_vec(&args).unwrap()).await.unwrap();
    assert_eq!(r.status, 200, "a multi-line summary is fine");
    let id = r.json()["data"]["work_order"]["id"].as_str().unwrap().to_string();
    let r = c
        .post(&format!("/v1/work-orders/{id}/approve"), "{\"note\": \"ok \\u202e\"}".as_bytes())
        .await
        .unwrap();
    assert_eq!((r.status, r.json()["error"]["parameter"].clone()), (400, json!("note")));
    let r = c.get("/v1/work-orders").await.unwrap();
    assert_eq!(r.json()["data"]["total"], 1, "only the plain one was stored");
    assert_eq!(
        r.json()["data"]["work_orders"][0]["status"],
        "pending_approval",
        "the refused decision changed nothing"
    );
    let r = c.get("/v1/sensors?text=%E2%80%AEx").await.unwrap();
    assert_eq!((r.status, r.json()["error"]["parameter"].clone()), (400, json!("text")));
    // Named as what it is even where the schema's pattern would refuse it too, and echoed
    // escaped (review of issue 32: the raw character came back in `received`).
    let r = c
        .post("/v1/tools/get_sensor_reading", "{\"sensor_id\": \"A_LINE1_001\\u202eX\"}".as_bytes())
        .await
        .unwrap();
    let e = &r.json()["error"];
    assert!(e["message"].as_str().unwrap().contains("bidirectional"), "{e}");
    assert_eq!(e["received"], "A_LINE1_001\\u{202e}X", "{e}");
}

#[tokio::test]
async fn over_http_only_an_operator_token_can_approve() {
    let svc = service();
    let env = [
        ("FIELDGATE_TOKEN_REPORTER".to_string(), "agent:agent-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_LEAD".to_string(), "operator:operator-token-0123456789".to_string()),
    ];
    let server = Server::start(svc, fieldgate::transport::auth::Tokens::load(None, env).unwrap()).await;
    let mut agent = server.client().await.with_token("agent-token-0123456789");
    let r = agent
        .post(
            "/v1/tools/create_work_order",
            &serde_json::to_vec(&order("B_BOILER_003", "inspection", "http-key-001")).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let id = r.json()["data"]["work_order"]["id"].as_str().unwrap().to_string();
    assert_eq!(r.json()["data"]["work_order"]["created_by"], "reporter");
    let r = agent.post(&format!("/v1/work-orders/{id}/approve"), b"{}").await.unwrap();
    assert_eq!(r.status, 403);
    let mut lead = server.client().await.with_token("operator-token-0123456789");
    let r = lead.post(&format!("/v1/work-orders/{id}/approve"), br#"{"note": "go ahead"}"#).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = agent.get(&format!("/v1/work-orders/{id}")).await.unwrap();
    assert_eq!(r.json()["data"]["work_order"]["status"], "approved");
    // No webhook is configured here: delivery says so rather than look stuck.
    assert_eq!(r.json()["data"]["work_order"]["delivery"]["state"], "not_configured");
    let r = agent.get("/v1/work-orders?status=approved").await.unwrap();
    assert_eq!(r.json()["data"]["total"], 1);
    let r = lead.post(&format!("/v1/work-orders/{id}/approve"), b"").await.unwrap();
    assert_eq!(r.status, 409, "approved cannot be approved again");
    assert_eq!(r.json()["error"]["code"], "INVALID_STATE");
    let r = lead.post("/v1/work-orders/WO-009999/approve", b"").await.unwrap();
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn pending_orders_expire_after_their_ttl_and_auto_approval_is_recorded() {
    let mut config = fieldgate::config::Config::default();
    config.work_orders.auto_approve = vec!["inspection:low".into()];
    let svc = ToolService::new(Arc::new(demo_registry()), config);
    let low = json!({"sensor_id": "A_LINE1_006", "type": "inspection", "priority": "low", "summary": "Counter looks stuck; have a look.", "idempotency_key": "auto-00001"});
    let d = svc.call("create_work_order", low).await.unwrap().json();
    assert_eq!(d["status"], "approved");
    assert_eq!(d["approval_required"], false);
    assert_eq!(d["work_order"]["history"][1]["by"], "system");
    assert!(d["work_order"]["history"][1]["note"].as_str().unwrap().contains("auto-approved"));
    let pending =
        svc.call("create_work_order", order("A_LINE1_007", "repair", "expire-0001")).await.unwrap().json();
    let id = pending["work_order"]["id"].as_str().unwrap().to_string();
    let store = svc.work_orders().unwrap().clone();
    let ttl = chrono::Duration::hours(72);
    // 71 hours later: still pending; 73 hours later: expired.
    fieldgate::work_orders::delivery::pass_at(
        &store,
        None,
        ttl,
        chrono::Utc::now() + chrono::Duration::hours(71),
    )
    .await;
    assert_eq!(store.get(&id).unwrap().status, S::PendingApproval);
    fieldgate::work_orders::delivery::pass_at(
        &store,
        None,
        ttl,
        chrono::Utc::now() + chrono::Duration::hours(73),
    )
    .await;
    let wo = store.get(&id).unwrap();
    assert_eq!(wo.status, S::Expired);
    assert_eq!(wo.history.last().unwrap().by, "system");
}

#[tokio::test]
async fn the_outbox_delivers_at_least_once_through_failures_and_a_restart() {
    // A maintenance system that fails the first two deliveries.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(String, u16)>::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        while let Ok((stream, _)) = listener.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let mut r = BufReader::new(stream);
                let (mut key, mut len, mut line) = (String::new(), 0usize, String::new());
                while r.read_line(&mut line).await.unwrap_or(0) > 0 && line != "\r\n" {
                    let l = line.to_ascii_lowercase();
                    if let Some(v) = l.strip_prefix("idempotency-key:") {
                        key = v.trim().to_uppercase();
                    }
                    if let Some(v) = l.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body).await;
                let status = if s.lock().unwrap().len() < 2 { 500 } else { 200 };
                s.lock().unwrap().push((key, status));
                let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                let _ = r.get_mut().write_all(reply.as_bytes()).await;
            });
        }
    });
    let webhook = fieldgate::work_orders::Webhook::parse(&format!("http://{addr}/cmms/work-orders")).ok();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("work_orders.redb");
    let ttl = chrono::Duration::hours(72);
    let t0 = chrono::Utc::now();
    let id = {
        let store = Arc::new(WorkOrderStore::open(&path).unwrap());
        let svc = service_with_orders(store.clone());
        let id = svc
            .call("create_work_order", order("A_UTIL_004", "inspection", "deliver-0001"))
            .await
            .unwrap()
            .json()["work_order"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        // Nothing is delivered before approval.
        assert_eq!(fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, t0).await, 0);
        let op = fieldgate::tools::Caller::with_role("lead", fieldgate::tools::Role::Operator);
        assert!(svc.act_on_work_order(&op, &id, "approve", None).await.ok);
        assert_eq!(
            fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, t0).await,
            0,
            "first attempt fails"
        );
        // Before the backoff has passed, nothing is tried.
        assert_eq!(fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, t0).await, 0);
        assert_eq!(seen.lock().unwrap().len(), 1);
        id
    };
    // The service restarts; the outbox is on disk.
    let store = Arc::new(WorkOrderStore::open(&path).unwrap());
    let wo = store.get(&id).unwrap();
    assert_eq!(
        (wo.delivery.as_ref().unwrap().state.as_str(), wo.delivery.as_ref().unwrap().attempts),
        ("failing", 1)
    );
    let later = |s: i64| t0 + chrono::Duration::seconds(s);
    assert_eq!(
        fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, later(2)).await,
        0,
        "second attempt fails"
    );
    assert_eq!(
        fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, later(3)).await,
        0,
        "backing off (2 s)"
    );
    assert_eq!(fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, later(10)).await, 1);
    assert_eq!(
        fieldgate::work_orders::delivery::pass_at(&store, webhook.as_ref(), ttl, later(100)).await,
        0,
        "delivered once is enough"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), [500, 500, 200]);
    assert!(seen.iter().all(|(k, _)| *k == id), "the work order ID is the idempotency key: {seen:?}");
    let d = store.get(&id).unwrap().delivery.unwrap();
    assert_eq!((d.state.as_str(), d.attempts), ("delivered", 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_decides_through_a_running_service_with_an_operator_token() {
    let svc = service();
    let env = [
        ("FIELDGATE_TOKEN_BOT".to_string(), "agent:bot-token-0123456789".to_string()),
        ("FIELDGATE_TOKEN_LEAD".to_string(), "operator:lead-token-0123456789".to_string()),
    ];
    let created =
        svc.call("create_work_order", order("A_LINE1_012", "cleaning", "cli-remote-01")).await.unwrap();
    let id = created.json()["work_order"]["id"].as_str().unwrap().to_string();
    let server =
        Server::start(svc.clone(), fieldgate::transport::auth::Tokens::load(None, env).unwrap()).await;
    let url = format!("http://{}", server.addr);
    let data = tempfile::tempdir().unwrap();
    let run = |token: &str| {
        let (url, id, token, data) = (url.clone(), id.clone(), token.to_string(), data.path().to_owned());
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
                .args(["work-orders", "approve", &id, "--url", &url, "--note", "from the CLI"])
                .env_clear()
                .env("FIELDGATE_STORAGE_DATA_DIR", data)
                .env("FIELDGATE_CLI_TOKEN", token)
                .output_within()
                .unwrap()
        })
    };
    let agent = run("bot-token-0123456789").await.unwrap();
    assert_eq!(agent.status.code(), Some(2));
    let refused = String::from_utf8_lossy(&agent.stderr);
    assert!(refused.starts_with("error: Only an operator") && refused.contains("(FORBIDDEN)"), "{refused}");
    assert!(
        refused.contains("needs an operator token") && refused.contains("FIELDGATE_CLI_TOKEN"),
        "{refused}"
    );
    let lead = run("lead-token-0123456789").await.unwrap();
    assert!(lead.status.success(), "{}", String::from_utf8_lossy(&lead.stderr));
    let wo = svc.work_orders().unwrap().get(&id).unwrap();
    assert_eq!(wo.status, S::Approved);
    let last = wo.history.last().unwrap();
    assert_eq!((last.by.as_str(), last.note.as_deref()), ("lead", Some("from the CLI")));
}

/// `fieldgate work-orders` reads the same way from the data directory and from a running
/// service: one table (or `--json`), "no work orders" when there are none, no data
/// directory created by reading, and a pointer to `--url` when a service holds the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_orders_command_agrees_with_itself_locally_and_remotely() {
    // A configured listen address where nothing answers, held for the whole test.
    let closed = ClosedPort::new();
    let listen = closed.addr().to_string();
    let cli = |args: Vec<String>| {
        let listen = listen.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
                .args(&args)
                .env_clear()
                .env("FIELDGATE_SERVER_LISTEN", listen)
                .output_within()
                .unwrap()
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = data.to_str().unwrap().to_string();
    let o = cli(vec!["work-orders".into(), "list".into(), "--data-dir".into(), d.clone()]).await.unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "no work orders");
    assert!(!data.exists(), "reading created the data directory");

    let store = std::sync::Arc::new(fieldgate::work_orders::WorkOrderStore::open_in(&data).unwrap());
    let svc = service_with_orders(store.clone());
    svc.call("create_work_order", order("A_LINE1_005", "inspection", "cli-agree-01")).await.unwrap();
    // Another process holds the store: the local command says how to ask it instead.
    let o = cli(vec!["work-orders".into(), "list".into(), "--data-dir".into(), d.clone()]).await.unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("is held by a running fieldgate") && err.contains("--url"), "{err}");
    drop(svc);
    drop(store);
    let local = cli(vec!["work-orders".into(), "list".into(), "--data-dir".into(), d.clone()]).await.unwrap();
    let local_json =
        cli(vec!["work-orders".into(), "list".into(), "--data-dir".into(), d.clone(), "--json".into()])
            .await
            .unwrap();
    let store = std::sync::Arc::new(fieldgate::work_orders::WorkOrderStore::open_in(&data).unwrap());
    let server =
        Server::start(service_with_orders(store), fieldgate::transport::auth::Tokens::default()).await;
    let url = format!("http://{}", server.addr);
    let remote = cli(vec!["work-orders".into(), "list".into(), "--url".into(), url.clone()]).await.unwrap();
    let remote_json =
        cli(vec!["work-orders".into(), "list".into(), "--url".into(), url, "--json".into()]).await.unwrap();
    let table = String::from_utf8_lossy(&local.stdout).to_string();
    assert!(table.starts_with("id ") && table.contains("WO-000001  pending_approval"), "{table}");
    assert_eq!(String::from_utf8_lossy(&remote.stdout), table, "one format for both");
    let (a, b): (Value, Value) = (
        serde_json::from_slice(&local_json.stdout).unwrap(),
        serde_json::from_slice(&remote_json.stdout).unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(a[0]["id"], "WO-000001");
}

/// A decision made with the local command is an audit event like one made over HTTP (logged
/// at the default log level of a one-shot command, which shows warnings only); what
/// a person types as `--by` or `--note` is plain text, or refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_decision_is_audited_and_its_text_checked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    {
        let store = std::sync::Arc::new(fieldgate::work_orders::WorkOrderStore::open_in(&data).unwrap());
        let svc = service_with_orders(store);
        svc.call("create_work_order", order("A_LINE1_005", "inspection", "cli-audit-01")).await.unwrap();
    }
    let closed = ClosedPort::new();
    let decide = |extra: &[&str]| {
        let mut args: Vec<String> =
            ["work-orders", "approve", "WO-000001", "--data-dir"].map(String::from).into();
        args.push(data.to_str().unwrap().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        let listen = closed.addr().to_string();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
                .args(&args)
                .env_clear()
                .env("FIELDGATE_SERVER_LISTEN", listen)
                .output_within()
                .unwrap()
        })
    };
    for hostile in [&["--by", "evil\n\u{1b}[31mop"][..], &["--by", "lead", "--note", "ok\u{202e}gnp.exe"]] {
        let o = decide(hostile).await.unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{hostile:?}: {err}");
        assert!(err.contains(" holds a ") && (err.contains("--by: ") || err.contains("--note: ")), "{err}");
    }
    let o = decide(&["--by", "shift-lead"]).await.unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("operator_decision") && err.contains("shift-lead") && err.contains("command line"),
        "{err}"
    );
}

/// An agent whose create_work_order timed out asks by its key whether it happened; a key
/// that created nothing is NOT_FOUND with the hint that sending it again is safe. A replay
/// answers exactly like the first call, duplicate_of included.
#[tokio::test]
async fn orders_are_found_by_their_idempotency_key_and_replays_answer_the_same() {
    let svc = service();
    let first =
        svc.call("create_work_order", order("A_LINE1_009", "repair", "key-lookup-001")).await.unwrap();
    let id = first.json()["work_order"]["id"].as_str().unwrap().to_string();
    let by_key = svc.call("get_work_order", json!({"idempotency_key": "key-lookup-001"})).await.unwrap();
    assert_eq!(by_key.json()["work_order"]["id"], id.as_str());
    let e = svc.call("get_work_order", json!({"idempotency_key": "never-sent-01"})).await.unwrap();
    let err = e.error.unwrap();
    assert_eq!((err.code, err.parameter.as_deref()), (ErrorCode::WorkOrderNotFound, Some("idempotency_key")));
    assert!(err.hint.contains("safe to send it again"), "{}", err.hint);
    for both in [json!({}), json!({"work_order_id": id, "idempotency_key": "key-lookup-001"})] {
        let err = svc.call("get_work_order", both).await.unwrap().error.unwrap();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
    }
    // A new key for the same open order: a duplicate; its replay says so again.
    let dup =
        svc.call("create_work_order", order("A_LINE1_009", "repair", "key-lookup-002")).await.unwrap().json();
    assert_eq!((dup["created"].as_bool(), dup["duplicate_of"].as_str()), (Some(false), Some(id.as_str())));
    let replay =
        svc.call("create_work_order", order("A_LINE1_009", "repair", "key-lookup-002")).await.unwrap().json();
    assert_eq!(replay, dup, "a replay answers exactly like the first call");
    let replay =
        svc.call("create_work_order", order("A_LINE1_009", "repair", "key-lookup-001")).await.unwrap().json();
    assert_eq!((replay["created"].as_bool(), replay["duplicate_of"].as_str()), (Some(false), None));
}

/// A relative `since` is pinned by the first page's cursor (as history's range is): the
/// window does not slide between pages, and the answer states the instant it used.
#[tokio::test]
async fn a_relative_since_is_pinned_across_pages_and_stated() {
    let svc = service();
    for (sensor, key) in [("A_LINE1_002", "since-pin-001"), ("A_LINE1_003", "since-pin-002")] {
        assert!(svc.call("create_work_order", order(sensor, "inspection", key)).await.unwrap().ok);
    }
    let first = svc.call("list_work_orders", json!({"since": "-2s", "limit": 1})).await.unwrap().json();
    assert_eq!(first["total"], 2, "{first}");
    assert!(
        first["since"].as_str().is_some_and(|s| s.ends_with('Z')),
        "the absolute instant is stated: {first}"
    );
    // Time passes beyond the relative window (waited for until it has, not guessed): both
    // orders are now older than 2 s, so "-2s" asked afresh finds none.
    let created: Vec<chrono::DateTime<chrono::Utc>> =
        svc.call("list_work_orders", json!({"since": "-1h"})).await.unwrap().json()["work_orders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["created_at"].as_str().unwrap().parse().unwrap())
            .collect();
    let newest = *created.iter().max().unwrap();
    wait_until("both orders to be older than 2 s", std::time::Duration::from_secs(30), || {
        std::future::ready(chrono::Utc::now() - chrono::Duration::milliseconds(2100) > newest)
    })
    .await;
    let fresh = svc.call("list_work_orders", json!({"since": "-2s", "limit": 1})).await.unwrap().json();
    assert_eq!(fresh["total"], 0, "the window did slide: {fresh}");
    // The next page still belongs to the first's.
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = svc
        .call("list_work_orders", json!({"since": "-2s", "limit": 1, "cursor": cursor}))
        .await
        .unwrap()
        .json();
    assert_eq!(second["work_orders"].as_array().unwrap().len(), 1, "{second}");
    assert_eq!(second["since"], first["since"]);
}
