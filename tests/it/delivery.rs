//! Delivery of approved work orders to the maintenance system's webhook, against a
//! hand-written HTTP peer on 127.0.0.1:0 that answers as each test scripts: a status
//! (2xx, 4xx, 5xx), no answer at all, or a closed connection; and against a port that
//! refuses. Time moves through the backoffs with `pass_at`, never by waiting.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use fieldgate::tools::{Caller, Role};
use fieldgate::work_orders::WorkOrderStore;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::support::*;

// The public API under test, named once.
use fieldgate::work_orders::delivery::pass_at;

fn parse_webhook(url: &str) -> Option<fieldgate::work_orders::Webhook> {
    fieldgate::work_orders::Webhook::parse(url).ok()
}

const TTL_HOURS: i64 = 72;

/// How the webhook answers one request.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// Reads the request and never answers (the connection stays open).
    Hang,
    /// Reads the request and closes the connection.
    Close,
}

/// A request as the webhook read it.
#[derive(Clone, Debug)]
struct Request {
    line: String,
    idempotency_key: String,
    content_type: String,
    body: Value,
}

struct Webhook {
    url: String,
    script: Arc<Mutex<VecDeque<Answer>>>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Webhook {
    /// Answers as scripted; after the script, 200.
    async fn start(script: &[Answer]) -> Webhook {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/cmms/work-orders", listener.local_addr().unwrap());
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (s, r) = (script.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (s, r) = (s.clone(), r.clone());
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    let mut head = Vec::new();
                    let mut line = String::new();
                    while stream.read_line(&mut line).await.unwrap_or(0) > 0 && line != "\r\n" {
                        head.push(line.trim_end().to_string());
                        line.clear();
                    }
                    let header = |name: &str| {
                        head.iter()
                            .find_map(|h| {
                                let (k, v) = h.split_once(':')?;
                                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                            })
                            .unwrap_or_default()
                    };
                    let mut body = vec![0; header("content-length").parse().unwrap_or(0)];
                    stream.read_exact(&mut body).await.unwrap();
                    r.lock().unwrap().push(Request {
                        line: head.first().cloned().unwrap_or_default(),
                        idempotency_key: header("idempotency-key"),
                        content_type: header("content-type"),
                        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    });
                    let answer = s.lock().unwrap().pop_front().unwrap_or(Answer::Status(200));
                    match answer {
                        Answer::Status(code) => {
                            let reply = format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n");
                            let _ = stream.get_mut().write_all(reply.as_bytes()).await;
                        }
                        Answer::Hang => std::future::pending::<()>().await,
                        Answer::Close => {}
                    }
                });
            }
        });
        Webhook { url, script, requests }
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// A store in `dir` with one approved order (an outbox entry due now); its ID.
async fn approved_order(dir: &std::path::Path) -> (Arc<WorkOrderStore>, String) {
    let (store, ids) = approved_orders(dir, 1).await;
    (store, ids[0].clone())
}

/// The delivery task over `store` and `hook`, and what stops it.
fn delivering(
    store: &Arc<WorkOrderStore>,
    hook: &Webhook,
) -> (tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = tokio_util::sync::CancellationToken::new();
    let task = fieldgate::work_orders::delivery::start(
        store.clone(),
        parse_webhook(&hook.url),
        TTL_HOURS as u64,
        stop.clone(),
    );
    (stop, task)
}

/// A store in `dir` with `n` approved orders; their IDs.
async fn approved_orders(dir: &std::path::Path, n: usize) -> (Arc<WorkOrderStore>, Vec<String>) {
    let store = Arc::new(WorkOrderStore::open_in(dir).unwrap());
    let ids = approve(&store, 0, n).await;
    (store, ids)
}

/// Creates and approves orders `first..first + n` in `store`; their IDs.
async fn approve(store: &Arc<WorkOrderStore>, first: usize, n: usize) -> Vec<String> {
    let svc = service_with_orders(store.clone());
    let lead = Caller::with_role("lead", Role::Operator);
    let mut ids = Vec::new();
    for i in first..first + n {
        let args = json!({"sensor_id": format!("A_UTIL_{:03}", i % 8 + 4), "type": "inspection", "priority": "medium",
            "summary": format!("Voltage dips on feeder {i}; inspect the meter."), "idempotency_key": format!("delivery-{i:04}")});
        let created = svc.call("create_work_order", args).await.unwrap();
        let id = created.json()["work_order"]["id"].as_str().unwrap().to_string();
        let approved = svc.act_on_work_order(&lead, &id, "approve", None).await;
        assert!(approved.ok, "{:?}", approved.error);
        ids.push(id);
    }
    ids
}

/// (state, attempts) of the order's delivery.
fn delivery(store: &WorkOrderStore, id: &str) -> (String, u32) {
    let d = store.get(id).unwrap().delivery.unwrap();
    (d.state.as_str().to_string(), d.attempts)
}

async fn pass(store: &Arc<WorkOrderStore>, url: &str, at: DateTime<Utc>) -> usize {
    let webhook = parse_webhook(url).expect("an http:// URL");
    pass_at(store, Some(&webhook), Duration::hours(TTL_HOURS), at).await
}

#[tokio::test]
async fn a_webhook_answering_4xx_or_5xx_is_retried_with_doubling_backoff_until_a_2xx() {
    let hook = Webhook::start(&[Answer::Status(400), Answer::Status(503), Answer::Status(500)]).await;
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = approved_order(dir.path()).await;
    let t0 = Utc::now();
    let at = |ms: i64| t0 + Duration::milliseconds(ms);
    // The first attempt: 400, not delivered.
    assert_eq!(pass(&store, &hook.url, at(0)).await, 0);
    assert_eq!((hook.requests().len(), delivery(&store, &id)), (1, ("failing".to_string(), 1)));
    // Each wait is the step (1 s doubling) with jitter: in [half the step, the step].
    let mut t = 0;
    for (n, (step_ms, delivered, state)) in
        [(1_000, 0, "failing"), (2_000, 0, "failing"), (4_000, 1, "delivered")].into_iter().enumerate()
    {
        let attempts = n as u32 + 1;
        assert_eq!(pass(&store, &hook.url, at(t + step_ms / 2 - 1)).await, 0, "before half of {step_ms} ms");
        assert_eq!(hook.requests().len(), n + 1, "tried before half of {step_ms} ms had passed");
        t += step_ms;
        assert_eq!(pass(&store, &hook.url, at(t)).await, delivered, "pass at +{t} ms");
        assert_eq!(hook.requests().len(), n + 2, "requests by +{t} ms");
        assert_eq!(delivery(&store, &id), (state.to_string(), attempts + 1), "+{t} ms");
    }
    // Delivered once is enough.
    assert_eq!(pass(&store, &hook.url, at(3_600_000)).await, 0);
    assert_eq!(hook.requests().len(), 4);
    // Every attempt is the same request: the order, keyed by its ID.
    for r in hook.requests() {
        assert_eq!(r.line, "POST /cmms/work-orders HTTP/1.1");
        assert_eq!(r.idempotency_key, id);
        assert_eq!(r.content_type, "application/json");
        assert_eq!(
            (r.body["id"].as_str(), r.body["sensor_id"].as_str()),
            (Some(id.as_str()), Some("A_UTIL_004"))
        );
        assert_eq!(r.body["status"], "approved", "{}", r.body);
    }
}

#[tokio::test]
async fn any_2xx_is_a_delivery() {
    let hook = Webhook::start(&[Answer::Status(204)]).await;
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = approved_order(dir.path()).await;
    assert_eq!(pass(&store, &hook.url, Utc::now()).await, 1);
    assert_eq!(delivery(&store, &id), ("delivered".to_string(), 1));
}

/// A refused connection is a failed attempt like any other; the backoff doubles from 1 s
/// and stops growing at 5 minutes, each wait jittered within [half the step, the step].
/// The steps are written out.
#[tokio::test]
async fn a_webhook_that_refuses_backs_off_doubling_up_to_five_minutes() {
    let closed = ClosedPort::new();
    let url = format!("http://{}/cmms", closed.addr());
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = approved_order(dir.path()).await;
    let t0 = Utc::now();
    let mut due = t0;
    let waits_s = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300];
    for (n, wait) in waits_s.iter().enumerate() {
        assert_eq!(pass(&store, &url, due).await, 0);
        assert_eq!(delivery(&store, &id), ("failing".to_string(), n as u32 + 1), "attempt {}", n + 1);
        // A millisecond before half the step, nothing is tried; by the whole step it is.
        let half = due + Duration::milliseconds(wait * 500 - 1);
        assert_eq!(pass(&store, &url, half).await, 0);
        assert_eq!(delivery(&store, &id).1, n as u32 + 1, "tried before half of {wait} s had passed");
        due += Duration::seconds(*wait);
    }
}

/// A webhook that takes the request and never answers costs one attempt, given up after
/// the client's timeout (paused time: no real wait), and the order is sent again.
#[tokio::test(start_paused = true)]
async fn a_webhook_that_hangs_is_given_up_on_and_the_order_sent_again() {
    let hook = Webhook::start(&[Answer::Hang, Answer::Close]).await;
    let dir = tempfile::tempdir().unwrap();
    let (store, id) = approved_order(dir.path()).await;
    let t0 = Utc::now();
    // Bounded here too: a client without its own timeout would fail this, not hang it.
    let first = tokio::time::timeout(std::time::Duration::from_secs(60), pass(&store, &hook.url, t0))
        .await
        .expect("the client gives up on a webhook that never answers within a minute");
    assert_eq!(first, 0);
    assert_eq!(delivery(&store, &id), ("failing".to_string(), 1));
    // Its backoff (up to 1 s) counts from when the attempt ended, 10 s in, not from when it
    // began (it was due again at once, and was sent every 10 s).
    assert_eq!(pass(&store, &hook.url, t0 + Duration::seconds(2)).await, 0);
    assert_eq!(
        (delivery(&store, &id), hook.requests().len()),
        (("failing".to_string(), 1), 1),
        "not due yet"
    );
    // Closed without an answer: failed again.
    assert_eq!(pass(&store, &hook.url, t0 + Duration::seconds(11)).await, 0);
    assert_eq!(delivery(&store, &id), ("failing".to_string(), 2));
    assert_eq!(pass(&store, &hook.url, t0 + Duration::seconds(13)).await, 1);
    assert_eq!(delivery(&store, &id), ("delivered".to_string(), 3));
    assert!(hook.script.lock().unwrap().is_empty(), "every scripted answer was used");
    assert_eq!(hook.requests().len(), 3);
}

/// Six orders due and a maintenance system that takes each request and never answers: all
/// six are in flight at once (one stalled request does not hold back the others for its
/// timeout), and a stop ends the delivery task at once, the orders still due for the next
/// start.
#[tokio::test]
async fn stalled_deliveries_go_in_parallel_and_never_hold_up_a_stop() {
    let hook = Webhook::start(&[Answer::Hang; 6]).await;
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = approved_orders(dir.path(), 6).await;
    let (stop, task) = delivering(&store, &hook);
    // Well inside the client's 10 s timeout: one at a time, only the first would be here.
    crate::support::wait_until("six deliveries in flight at once", std::time::Duration::from_secs(5), || {
        let n = hook.requests().len();
        async move { n == 6 }
    })
    .await;
    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(2), task)
        .await
        .expect("the delivery task ends within 2 s of the stop, not after the webhook's timeout")
        .unwrap();
    for id in &ids {
        assert_eq!(delivery(&store, id), ("pending".to_string(), 0), "{id} stays due for the next start");
    }
}

/// An order approved while another's request hangs goes out at once: the delivery task does
/// not wait for the requests in flight before sending what has come due (it did: the new
/// order waited for the hanging one's 10 s timeout).
#[tokio::test]
async fn an_order_approved_while_another_hangs_goes_out_at_once() {
    let hook = Webhook::start(&[Answer::Hang]).await;
    let dir = tempfile::tempdir().unwrap();
    let (store, first) = approved_orders(dir.path(), 1).await;
    let (stop, task) = delivering(&store, &hook);
    let t = std::time::Duration::from_secs(5);
    crate::support::wait_until("the first order's request, left hanging", t, || {
        let n = hook.requests().len();
        async move { n == 1 }
    })
    .await;
    let second = approve(&store, 1, 1).await;
    // Well inside the hanging request's 10 s timeout.
    crate::support::wait_until("the second order delivered while the first hangs", t, || {
        let state = delivery(&store, &second[0]).0;
        async move { state == "delivered" }
    })
    .await;
    assert_eq!(delivery(&store, &first[0]), ("pending".to_string(), 0), "the first still in flight");
    stop.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(2), task).await.expect("stops at once").unwrap();
}

/// Through the real binary: six approved orders whose webhook stalls, then SIGTERM: the
/// process exits well within its 10 s grace period (it took 57.6 s: deliveries went one at a
/// time, each waiting out its 10 s timeout), and the next start sends the six again, with
/// the same idempotency keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_stalled_deliveries_stops_within_the_grace_period_and_the_next_start_delivers() {
    let hook = Webhook::start(&[Answer::Hang; 6]).await;
    let closed = ClosedPort::new();
    let devices = demo_devices_unreachable(&closed);
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("FIELDGATE_WORK_ORDERS_AUTO_APPROVE", r#"["inspection:medium"]"#),
        ("FIELDGATE_WORK_ORDERS_WEBHOOK_URL", hook.url.as_str()),
    ];
    let mut served = serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = served.drain_stderr();
    let mut client = fieldgate::transport::client::HttpClient::connect(served.addr).await.unwrap();
    for i in 0..6 {
        let args = json!({"sensor_id": format!("A_UTIL_{:03}", i + 4), "type": "inspection", "priority": "medium",
            "summary": format!("Voltage dips on feeder {i}; inspect the meter."), "idempotency_key": format!("sigterm-{i:04}")});
        let r = client.post("/v1/tools/create_work_order", args.to_string().as_bytes()).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    let t = std::time::Duration::from_secs(30);
    wait_until("six deliveries in flight, none answered", t, || {
        let n = hook.requests().len();
        async move { n == 6 }
    })
    .await;
    let pid = served.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), served.child.wait())
        .await
        .expect("the process exits within its 10 s grace period, stalled deliveries or not")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    // The next start: the six are still due and go out again, same keys.
    let mut again = serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = again.drain_stderr();
    wait_until("the six sent again after the restart", t, || {
        let n = hook.requests().len();
        async move { n == 12 }
    })
    .await;
    let keys = |r: &[Request]| {
        let mut k: Vec<String> = r.iter().map(|r| r.idempotency_key.clone()).collect();
        k.sort();
        k
    };
    let all = hook.requests();
    assert_eq!(keys(&all[..6]), keys(&all[6..]), "the same deliveries, by key");
    again.child.start_kill().unwrap();
    let _ = crate::support::exited(&mut again.child, "again").await;
}

#[test]
fn webhook_urls_are_parsed_by_hand_written_cases() {
    for (url, accepted) in [
        ("http://cmms.local:8080/api/orders", true),
        ("http://cmms.local/api", true),
        ("http://10.0.0.5:9000", true),
        ("https://cmms.local/api", true),
        ("cmms.local/api", false),
        ("ftp://cmms.local/api", false),
        ("http://user:secret@cmms.local/api", false),
    ] {
        assert_eq!(parse_webhook(url).is_some(), accepted, "{url}");
    }
}
