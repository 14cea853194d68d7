//! The webhook that delivers approved work orders: `https://` to a maintenance system
//! whose certificate a configured CA signed, the authorization header and its secret
//! (sent, and never in a log line or an error), and its configuration checks.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fieldgate::config::Config;
use fieldgate::tools::ToolService;
use fieldgate::work_orders::webhook::{Auth, Webhook};
use fieldgate::work_orders::{WorkOrderStore, delivery};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::support::*;

const SECRET: &str = "tok-7f3a9c1e5d2b8a46";

/// One request the maintenance system received: headers (lower-case names) and body.
#[derive(Debug, Clone)]
struct Received {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A maintenance system on `https://127.0.0.1:PORT` with a certificate signed by its own
/// CA (written to `ca.pem` in `dir`). It answers each status of `statuses` in turn, then
/// 200.
struct Cmms {
    url: String,
    ca_file: std::path::PathBuf,
    received: Arc<Mutex<Vec<Received>>>,
}

async fn https_cmms(dir: &Path, statuses: &[u16]) -> Cmms {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "Plant A maintenance CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}/cmms/work-orders", listener.local_addr().unwrap().port());
    let received = Arc::new(Mutex::new(Vec::new()));
    let (seen, statuses) = (received.clone(), statuses.to_vec());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen, statuses) = (acceptor.clone(), seen.clone(), statuses.clone());
            tokio::spawn(async move {
                // A client that does not trust the certificate ends here.
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let mut r = BufReader::new(tls);
                let (mut headers, mut line) = (Vec::new(), String::new());
                while r.read_line(&mut line).await.unwrap_or(0) > 0 && line != "\r\n" {
                    if let Some((k, v)) = line.trim_end().split_once(':') {
                        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                    line.clear();
                }
                let len = headers
                    .iter()
                    .find(|(k, _)| k == "content-length")
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body).await;
                let status = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(Received { headers, body });
                    statuses.get(seen.len() - 1).copied().unwrap_or(200)
                };
                let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = r.get_mut().write_all(reply.as_bytes()).await;
                let _ = r.get_mut().shutdown().await;
            });
        }
    });
    Cmms { url, ca_file, received }
}

/// A service whose low-priority inspections are approved without a person, and one such
/// order in its store (approved, in the outbox).
async fn approved_order() -> (Arc<WorkOrderStore>, String) {
    let mut config = Config::default();
    config.work_orders.auto_approve = vec!["inspection:low".into()];
    let svc = ToolService::new(Arc::new(demo_registry()), config);
    let args = json!({"sensor_id": "A_LINE1_001", "type": "inspection", "priority": "low",
        "summary": "Discharge pressure drifts; inspect the pump.", "idempotency_key": "webhook-0001"});
    let d = svc.call("create_work_order", args).await.unwrap().json();
    assert_eq!(d["status"], "approved", "{d}");
    (svc.work_orders().unwrap().clone(), d["work_order"]["id"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn an_https_webhook_signed_by_the_configured_ca_gets_the_order_and_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cmms = https_cmms(dir.path(), &[]).await;
    let (store, id) = approved_order().await;
    let auth = Auth::new("Authorization", SECRET).unwrap();
    let webhook = Webhook::new(&cmms.url, Some(&cmms.ca_file), Some(auth)).unwrap();
    let ttl = chrono::Duration::hours(72);
    assert_eq!(delivery::pass(&store, Some(&webhook), ttl).await, 1);
    let got = cmms.received.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
    assert_eq!(got[0].header("idempotency-key"), Some(id.as_str()));
    assert_eq!(got[0].header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!((body["id"].as_str(), body["status"].as_str()), (Some(id.as_str()), Some("approved")));
    assert_eq!(store.get(&id).unwrap().delivery.unwrap().state.as_str(), "delivered");

    // Any other header carries the secret as it is (an API key).
    let cmms = https_cmms(dir.path(), &[]).await;
    let auth = Auth::new("X-API-Key", SECRET).unwrap();
    let webhook = Webhook::new(&cmms.url, Some(&cmms.ca_file), Some(auth)).unwrap();
    webhook.post(&id, b"{}".to_vec()).await.unwrap();
    let got = cmms.received.lock().unwrap().clone();
    assert_eq!((got[0].header("x-api-key"), got[0].header("authorization")), (Some(SECRET), None));
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_failed_delivery_that_names_the_cause_not_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cmms = https_cmms(dir.path(), &[]).await;
    let (store, id) = approved_order().await;
    // The system's certificates only: the maintenance system's own CA is not among them.
    let webhook = Webhook::new(&cmms.url, None, Some(Auth::new("Authorization", SECRET).unwrap())).unwrap();
    let failure = webhook.post(&id, b"{}".to_vec()).await.unwrap_err().to_string();
    assert!(failure.contains("certificate"), "the cause is named: {failure}");
    assert!(!failure.contains(SECRET) && !failure.contains("cmms/work-orders"), "{failure}");
    assert_eq!(delivery::pass(&store, Some(&webhook), chrono::Duration::hours(72)).await, 0);
    let d = store.get(&id).unwrap().delivery.unwrap();
    assert_eq!((d.state.as_str(), d.attempts), ("failing", 1));
    assert!(cmms.received.lock().unwrap().is_empty(), "nothing was sent to an untrusted server");
    assert!(!format!("{webhook:?}").contains(SECRET));
}

fn problems(env: &[(&str, &str)]) -> Vec<String> {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    match Config::load(None, env) {
        Ok(_) => Vec::new(),
        Err(e) => e.0.iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn a_bad_webhook_is_a_configuration_error_that_never_shows_a_secret() {
    let url = ("FIELDGATE_WORK_ORDERS_WEBHOOK_URL", "https://cmms.example.com/api/work-orders");
    let var = ("FIELDGATE_WORK_ORDERS_WEBHOOK_AUTH_ENV", "FIELDGATE_WEBHOOK_TOKEN");
    // A complete configuration, its secret in a FIELDGATE_ variable that is not a key.
    assert_eq!(problems(&[url, var, ("FIELDGATE_WEBHOOK_TOKEN", SECRET)]), Vec::<String>::new());
    assert_eq!(
        problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_URL", "http://10.0.0.5:8080/wo")]),
        Vec::<String>::new()
    );

    let bad_scheme = problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_URL", "ftp://cmms.example.com/wo")]);
    assert!(bad_scheme.len() == 1 && bad_scheme[0].contains("webhook_url"), "{bad_scheme:?}");
    assert!(bad_scheme[0].contains("http:// or https://"), "{bad_scheme:?}");
    let no_url = problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_URL", "cmms.example.com/wo")]);
    assert!(no_url.len() == 1 && no_url[0].contains("webhook_url"), "{no_url:?}");

    let credentials = problems(&[(
        "FIELDGATE_WORK_ORDERS_WEBHOOK_URL",
        &format!("https://maint:{SECRET}@cmms.example.com/wo"),
    )]);
    assert!(credentials.len() == 1 && credentials[0].contains("webhook_auth_env"), "{credentials:?}");
    assert!(!credentials[0].contains(SECRET), "{credentials:?}");

    let unset = problems(&[url, var]);
    assert!(unset.len() == 1 && unset[0].contains("FIELDGATE_WEBHOOK_TOKEN, which is not set"), "{unset:?}");
    let broken = problems(&[url, var, ("FIELDGATE_WEBHOOK_TOKEN", &format!("{SECRET}\r\nX-Evil: 1"))]);
    assert!(broken.len() == 1 && broken[0].contains("cannot carry"), "{broken:?}");
    assert!(!broken.iter().any(|p| p.contains(SECRET)), "{broken:?}");
    // The secret itself where its variable's name belongs is refused, and not repeated.
    let pasted = problems(&[url, ("FIELDGATE_WORK_ORDERS_WEBHOOK_AUTH_ENV", &format!("Bearer {SECRET}"))]);
    assert!(pasted.len() == 1 && pasted[0].contains("webhook_auth_env"), "{pasted:?}");
    assert!(!pasted[0].contains(SECRET), "{pasted:?}");
    let no_webhook = problems(&[var, ("FIELDGATE_WEBHOOK_TOKEN", SECRET)]);
    assert!(no_webhook.len() == 1 && no_webhook[0].contains("webhook_url is empty"), "{no_webhook:?}");
    let header = problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_AUTH_HEADER", "X API Key")]);
    assert!(header.len() == 1 && header[0].contains("webhook_auth_header"), "{header:?}");

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let missing = problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_CA_FILE", missing.to_str().unwrap())]);
    assert!(missing.len() == 1 && missing[0].contains("webhook_ca_file"), "{missing:?}");
    // A link to a device that never ends is refused at once, not read into memory.
    let endless = dir.path().join("endless.pem");
    std::os::unix::fs::symlink("/dev/zero", &endless).unwrap();
    let endless = problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_CA_FILE", endless.to_str().unwrap())]);
    assert!(endless.len() == 1 && endless[0].contains("not a regular file"), "{endless:?}");
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let not_pem = problems(&[("FIELDGATE_WORK_ORDERS_WEBHOOK_CA_FILE", not_pem.to_str().unwrap())]);
    assert!(not_pem.len() == 1 && not_pem[0].contains("certificate"), "{not_pem:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_service_delivers_over_https_with_its_secret_and_never_logs_it() {
    let dir = tempfile::tempdir().unwrap();
    // The first delivery is refused: the failure is logged too.
    let cmms = https_cmms(dir.path(), &[503]).await;
    let data = dir.path().join("data");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .args(["serve", "--log-format", "json"])
        .current_dir(root())
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_STORAGE_DATA_DIR", &data)
        .env("FIELDGATE_LOG", "debug")
        .env("FIELDGATE_WORK_ORDERS_AUTO_APPROVE", r#"["inspection:low"]"#)
        .env("FIELDGATE_WORK_ORDERS_WEBHOOK_URL", &cmms.url)
        .env("FIELDGATE_WORK_ORDERS_WEBHOOK_CA_FILE", &cmms.ca_file)
        .env("FIELDGATE_WORK_ORDERS_WEBHOOK_AUTH_ENV", "FIELDGATE_WEBHOOK_TOKEN")
        .env("FIELDGATE_WEBHOOK_TOKEN", SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let all = log.clone();
    let reader = tokio::spawn(async move {
        let mut addr_tx = Some(addr_tx);
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("fieldgate listening on http://")
                && let Some(tx) = addr_tx.take()
            {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
            all.lock().unwrap().push_str(&line);
            all.lock().unwrap().push('\n');
        }
    });
    let addr = tokio::time::timeout(Duration::from_secs(30), addr_rx).await.expect("listening").unwrap();
    let body = json!({"sensor_id": "A_LINE1_002", "type": "inspection", "priority": "low",
        "summary": "Temperature creeps up every afternoon; have a look.", "idempotency_key": "serve-webhook-1"});
    fieldgate::tls::install_crypto_provider();
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/tools/create_work_order"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap();
    let d: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(d["data"]["status"], "approved", "{d}");
    // Refused once (503), delivered on the retry a second later.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while cmms.received.lock().unwrap().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "two deliveries within 30 s: {}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for got in cmms.received.lock().unwrap().iter() {
        assert_eq!(got.header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
    }
    // The service logs the delivery once it has recorded it.
    while !log.lock().unwrap().contains("work order delivered") {
        assert!(tokio::time::Instant::now() < deadline, "the delivery is logged: {}", log.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.start_kill().unwrap();
    let _ = crate::support::exited(&mut child, "child").await;
    let _ = reader.await;
    let log = log.lock().unwrap().clone();
    assert!(log.contains("work order delivery failed") && log.contains("HTTP 503"), "{log}");
    assert!(!log.contains(SECRET), "the secret is never logged:\n{log}");
}
