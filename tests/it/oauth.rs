//! fieldgate as an OAuth resource server, through the real binary, against a real OpenID
//! provider it did not write (`oidc-provider`, `security/idp.mjs`): metadata and
//! challenges, tokens the provider issues (ES256 and RS256), tokens it would never issue
//! (expired, another issuer or audience, `alg: none`, a key not in its set), scopes, a key
//! rotation at the provider and the provider gone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use fieldgate::transport::client::{HttpClient, HttpResponse};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::support::{self, serve_binary, wait_until};

const T: Duration = Duration::from_secs(60);
pub const PUBLIC_URL: &str = "http://fieldgate.test";

fn modules() -> PathBuf {
    support::root().join("target/oidc-js/node_modules")
}

/// An `oidc-provider` on loopback; it stops when dropped.
pub struct Idp {
    pub issuer: String,
    child: tokio::process::Child,
    keys: PathBuf,
    resource: String,
}

impl Idp {
    /// A provider with the keys in `keys` (made when missing) whose tokens are for
    /// `resource` unless the client asks for another; on `port` (0: any).
    pub async fn start(keys: &Path, resource: &str, port: u16) -> Idp {
        assert!(
            modules().join("oidc-provider").is_dir(),
            "oidc-provider is not installed: run scripts/test-deps (npm install --prefix target/oidc-js oidc-provider@9)"
        );
        let mut child = tokio::process::Command::new("node")
            .arg(support::root().join("tests/it/security/idp.mjs"))
            .arg(keys)
            .arg(resource)
            .arg(port.to_string())
            .env("OIDC_MODULES", modules())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(T, lines.next_line())
            .await
            .expect("oidc-provider listened within 60 s")
            .unwrap()
            .expect("oidc-provider started");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let issuer = line.strip_prefix("listening ").expect("its issuer").to_string();
        Idp { issuer, child, keys: keys.to_path_buf(), resource: resource.to_string() }
    }

    pub fn port(&self) -> u16 {
        self.issuer.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap()
    }

    async fn post(&self, path: &str, content_type: &str, body: String) -> (u16, String) {
        self.post_as(path, content_type, body, None).await
    }

    async fn post_as(
        &self,
        path: &str,
        content_type: &str,
        body: String,
        basic: Option<&str>,
    ) -> (u16, String) {
        fieldgate::tls::install_crypto_provider();
        let mut req = reqwest::Client::new().post(format!("{}{path}", self.issuer));
        if let Some(b) = basic {
            req = req.header("authorization", format!("Basic {b}"));
        }
        let r = req.header("content-type", content_type).body(body).timeout(T).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// An access token of `client` by the client credentials grant, for `resource` if given.
    pub async fn token(&self, client: &str, scope: &str, resource: Option<&str>) -> String {
        let mut form = format!("grant_type=client_credentials&scope={}", scope.replace(' ', "+"));
        if let Some(r) = resource {
            form += &format!("&resource={}", url_escape(r));
        }
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{client}:{client}-secret-0123456789"));
        let (status, body) =
            self.post_as("/token", "application/x-www-form-urlencoded", form, Some(&basic)).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["access_token"].as_str().unwrap().to_string()
    }

    /// A token signed by the provider's own `alg` key (or, `foreign`, by a key not in its set).
    pub async fn sign(&self, claims: Value, alg: &str, foreign: bool) -> String {
        self.sign_typed(claims, alg, foreign, "at+jwt").await
    }

    /// As `sign`, with the header's `typ`.
    pub async fn sign_typed(&self, claims: Value, alg: &str, foreign: bool, typ: &str) -> String {
        let body = json!({"claims": claims, "alg": alg, "foreign": foreign, "typ": typ}).to_string();
        let (status, token) = self.post("/test/sign", "application/json", body).await;
        assert_eq!(status, 200, "{token}");
        token
    }

    /// Stops the provider (and waits until it has).
    pub async fn stop(mut self) -> (PathBuf, String, u16) {
        let port = self.port();
        drop(self.child.stdin.take());
        let _ = self.child.start_kill();
        support::exited(&mut self.child, "oidc-provider").await;
        (self.keys.clone(), self.resource.clone(), port)
    }
}

fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

async fn call(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> HttpResponse {
    let mut c = HttpClient::connect(addr).await.unwrap();
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
    ];
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    // A stateless MCP request names its method and tool in headers too.
    let rpc: Value = serde_json::from_str(body).unwrap_or_default();
    let name = rpc["params"]["name"].as_str().unwrap_or("").to_string();
    if path == "/mcp" && method == "POST" {
        headers.push(("mcp-method", "tools/call"));
        headers.push(("mcp-name", &name));
    }
    c.send(method, path, &headers, body.as_bytes()).await.unwrap()
}

/// A stateless MCP `tools/call` (2026-07-28: the version in every request).
fn mcp_call(tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": tool, "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {},
                  "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"}}}})
    .to_string()
}

fn challenge(r: &HttpResponse) -> &str {
    r.header("www-authenticate").unwrap_or("")
}

#[tokio::test]
async fn access_tokens_of_the_plants_provider_are_checked_as_the_mcp_specification_says() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.json");
    let resource = format!("{PUBLIC_URL}/mcp");
    let idp = Idp::start(&keys, &resource, 0).await;
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let mut served = serve_binary(
        devices.path(),
        data.path(),
        &[
            ("FIELDGATE_SERVER_PUBLIC_URL", PUBLIC_URL),
            ("FIELDGATE_SERVER_OAUTH_ISSUER", &idp.issuer),
            ("FIELDGATE_SERVER_OAUTH_LEEWAY_S", "0"),
            ("FIELDGATE_SERVER_OAUTH_JWKS_MIN_REFETCH_S", "0"),
            // A static token beside the provider's: both are accepted.
            ("FIELDGATE_TOKEN_CLI", "operator:static-operator-token-0123456789"),
        ],
    )
    .await;
    let stderr = served.drain_stderr();
    let addr = served.addr;

    // The metadata, outside the bearer check.
    let meta = call(addr, "GET", "/.well-known/oauth-protected-resource/mcp", None, "").await;
    assert_eq!(meta.status, 200);
    let m = meta.json();
    assert_eq!(m["resource"], json!(resource));
    assert_eq!(m["authorization_servers"], json!([idp.issuer]));
    assert_eq!(m["bearer_methods_supported"], json!(["header"]));
    assert_eq!(
        m["scopes_supported"],
        json!(["fieldgate.read", "fieldgate.work_orders.write", "fieldgate.operator"])
    );
    assert_eq!(
        call(addr, "GET", "/.well-known/oauth-protected-resource", None, "").await.json()["resource"],
        json!(PUBLIC_URL)
    );

    // No token: 401 pointing at the metadata, with the scopes an agent needs.
    let r = call(addr, "POST", "/mcp", None, &mcp_call("list_sensors", json!({}))).await;
    assert_eq!(r.status, 401);
    let metadata_url = format!("{PUBLIC_URL}/.well-known/oauth-protected-resource/mcp");
    assert_eq!(
        challenge(&r),
        format!("Bearer resource_metadata=\"{metadata_url}\", scope=\"fieldgate.read\"")
    );

    let idp_port = idp.port();
    // Tokens the provider issues, ES256 and RS256: served over MCP and /v1.
    for client in ["agent", "agent-rs"] {
        let token = idp.token(client, "fieldgate.read fieldgate.work_orders.write", None).await;
        let r = call(addr, "POST", "/mcp", Some(&token), &mcp_call("list_sensors", json!({"zone": "LINE1"})))
            .await;
        assert_eq!(r.status, 200, "{client}: {}", String::from_utf8_lossy(&r.body));
        let r = call(addr, "GET", "/v1/sensors?zone=LINE1", Some(&token), "").await;
        assert_eq!(r.status, 200, "{client}");
        assert!(r.json()["data"]["sensors"].as_array().is_some_and(|s| !s.is_empty()));
    }
    let agent = idp.token("agent", "fieldgate.read fieldgate.work_orders.write", None).await;
    let order = json!({"sensor_id": "A_LINE1_001", "type": "inspection", "priority": "low",
        "summary": "Vibration above normal on the pump.", "idempotency_key": "oauth-test-0001"});
    let r = call(addr, "POST", "/v1/tools/create_work_order", Some(&agent), &order.to_string()).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let created_by = r.json()["data"]["work_order"]["created_by"].clone();
    assert_eq!(
        created_by,
        json!(format!("agent@127.0.0.1:{}", idp.port())),
        "the caller as the provider names it"
    );

    // A token without the scope: 403 insufficient_scope on /v1 and on /mcp.
    let reader = idp.token("reader", "fieldgate.read", None).await;
    let r = call(addr, "POST", "/v1/tools/create_work_order", Some(&reader), &order.to_string()).await;
    assert_eq!((r.status, r.json()["error"]["code"].clone()), (403, json!("FORBIDDEN")));
    assert_eq!(
        challenge(&r),
        format!(
            "Bearer resource_metadata=\"{metadata_url}\", error=\"insufficient_scope\", scope=\"fieldgate.read fieldgate.work_orders.write\""
        )
    );
    let r = call(addr, "POST", "/mcp", Some(&reader), &mcp_call("create_work_order", order.clone())).await;
    assert_eq!(r.status, 403);
    assert!(
        challenge(&r)
            .contains("error=\"insufficient_scope\", scope=\"fieldgate.read fieldgate.work_orders.write\""),
        "{}",
        challenge(&r)
    );
    let r = call(addr, "POST", "/mcp", Some(&reader), &mcp_call("list_sensors", json!({}))).await;
    assert_eq!(r.status, 200, "reading is allowed");
    // Operator routes need the operator scope; the static operator token has it.
    let r = call(addr, "POST", "/v1/devices/oven2/probe", Some(&agent), "").await;
    assert_eq!(r.status, 403);
    assert!(
        challenge(&r).contains("scope=\"fieldgate.read fieldgate.work_orders.write fieldgate.operator\""),
        "what it holds and what it lacks: {}",
        challenge(&r)
    );
    let op = idp.token("operator", "fieldgate.read fieldgate.operator", None).await;
    assert_ne!(call(addr, "POST", "/v1/devices/oven2/probe", Some(&op), "").await.status, 403);
    assert_eq!(
        call(addr, "GET", "/v1/sensors", Some("static-operator-token-0123456789"), "").await.status,
        200
    );

    // Tokens no honest provider would issue here: each 401 invalid_token, saying why.
    let iss = idp.issuer.clone();
    let good = json!({"iss": iss, "aud": resource, "sub": "claimed-sub-7", "exp": now() + 300, "scope": "fieldgate.read"});
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let unsigned = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT"})), b64(&good));
    let hs256 = format!("{}.{}.c2ln", b64(&json!({"alg": "HS256", "typ": "JWT"})), b64(&good));
    let other_audience = idp.token("agent", "fieldgate.read", Some("https://other.plant/mcp")).await;
    let cases = [
        (idp.sign(with("exp", json!(now() - 60)), "ES256", false).await, "the token has expired"),
        (idp.sign(with("nbf", json!(now() + 600)), "ES256", false).await, "the token is not valid yet"),
        (
            idp.sign(with("iss", json!("https://other.plant/")), "ES256", false).await,
            "the token is from another issuer",
        ),
        (other_audience, "the token is for another audience"),
        // The issuer in a list is not the issuer.
        (idp.sign(with("iss", json!([iss])), "ES256", false).await, "the token is from another issuer"),
        (idp.sign(good.clone(), "ES256", true).await, "the token's signature is not valid"),
        (idp.sign(with("aud", Value::Null), "RS256", false).await, "the token lacks a required claim"),
        (unsigned, "the token is not a signed JWT"),
        (hs256, "the token's signing algorithm is not accepted"),
        // Signed by the provider, but a logout token, not an access token.
        (
            idp.sign_typed(good.clone(), "ES256", false, "logout+jwt").await,
            "the token is not an access token",
        ),
    ];
    for (token, why) in &cases {
        let r = call(addr, "GET", "/v1/sensors", Some(token), "").await;
        assert_eq!(r.status, 401, "{why}");
        assert!(
            challenge(&r).contains(&format!("error=\"invalid_token\", error_description=\"{why}\"")),
            "{why}: {}",
            challenge(&r)
        );
    }
    assert_eq!(
        call(addr, "GET", "/v1/sensors", Some(&idp.sign(good.clone(), "ES256", false).await), "")
            .await
            .status,
        200
    );
    // A token checked once is remembered, but only until its exp: then refused.
    let short = idp.sign(with("exp", json!(now() + 2)), "ES256", false).await;
    assert_eq!(call(addr, "GET", "/v1/sensors", Some(&short), "").await.status, 200);
    assert_eq!(call(addr, "GET", "/v1/sensors", Some(&short), "").await.status, 200, "remembered");
    wait_until("the remembered token refused once expired", T, || async {
        let r = call(addr, "GET", "/v1/sensors", Some(&short), "").await;
        r.status == 401 && challenge(&r).contains("the token has expired")
    })
    .await;

    // A second provider: its tokens' keys are not the configured issuer's.
    let other = Idp::start(&dir.path().join("other.json"), &resource, 0).await;
    let foreign = other.token("agent", "fieldgate.read", None).await;
    let r = call(addr, "GET", "/v1/sensors", Some(&foreign), "").await;
    assert_eq!(r.status, 401);
    assert!(challenge(&r).contains("not one of the identity provider"), "{}", challenge(&r));
    drop(other);

    // Key rotation at the provider: new keys, restarted on its port; fieldgate takes the
    // new tokens without a restart (their key ID is new: the keys are fetched again).
    let (keys_file, res, port) = idp.stop().await;
    let cached = agent.clone();
    assert_eq!(
        call(addr, "GET", "/v1/sensors", Some(&cached), "").await.status,
        200,
        "the provider down: cached keys still work"
    );
    std::fs::remove_file(&keys_file).unwrap();
    let idp = Idp::start(&keys_file, &res, port).await;
    let rotated = idp.token("agent", "fieldgate.read", None).await;
    assert_eq!(call(addr, "GET", "/v1/sensors", Some(&rotated), "").await.status, 200, "a new key taken");
    let r = call(addr, "GET", "/v1/sensors", Some(&cached), "").await;
    assert_eq!(r.status, 401, "a key the provider dropped is no longer trusted");
    // The provider gone: tokens of known keys pass, unknown keys fail closed.
    let unknown = idp.sign(good.clone(), "ES256", true).await;
    drop(idp.stop().await);
    assert_eq!(call(addr, "GET", "/v1/sensors", Some(&rotated), "").await.status, 200);
    assert_eq!(call(addr, "GET", "/v1/sensors", Some(&unknown), "").await.status, 401);
    wait_until("the key fetch failure counted", T, || async {
        let m = call(addr, "GET", "/metrics", Some(&rotated), "").await;
        String::from_utf8_lossy(&m.body).contains("fieldgate_oauth_key_fetches_total{outcome=\"failure\"}")
    })
    .await;
    let metrics = call(addr, "GET", "/metrics", Some(&rotated), "").await;
    let text = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(text.contains("fieldgate_auth_tokens_refused_total{reason=\"expired\"}"), "{text}");
    assert!(text.contains("fieldgate_auth_scope_refusals_total 3"), "{text}");

    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &served.child.id().unwrap().to_string()])
            .status()
            .unwrap()
            .success()
    );
    support::exited(&mut served.child, "fieldgate").await;
    let log = stderr.await.unwrap();
    assert!(
        log.contains("event=\"authentication\"") || log.contains("event=authentication"),
        "audit events: {log}"
    );
    // Authorization refusals: one audit line a minute per caller (the reader was refused twice).
    let reader_refusals = log
        .lines()
        .filter(|l| l.contains("authorization") && l.contains(&format!("reader@127.0.0.1:{}", idp_port)))
        .count();
    assert_eq!(reader_refusals, 1, "{log}");
    // The first refused token at the API (the expired one): who it claimed to be is logged.
    let refused = log.lines().find(|l| l.contains("reason=\"expired\"") || l.contains("reason=expired"));
    let refused = refused.unwrap_or_else(|| panic!("no audit event for the expired token: {log}"));
    assert!(refused.contains("claimed-sub-7") && refused.contains(&iss), "{refused}");
    for secret in [&agent, &reader, &rotated] {
        assert!(!log.contains(secret.as_str()), "a token in the log");
    }
    assert!(!log.contains("static-operator-token"), "a static token in the log");
}

fn python_modules() -> PathBuf {
    support::root().join("target/mcp-py")
}

/// The MCP Python SDK's client-credentials provider, over TLS trusting the test's CA: 401,
/// the resource metadata, the provider's metadata, a token, the call, all by itself. A
/// client of a scope too narrow gets the tool refused.
#[tokio::test]
async fn the_mcp_python_sdk_gets_a_token_and_calls_a_tool_over_tls_unaided() {
    assert!(
        python_modules().join("mcp").is_dir(),
        "the MCP Python SDK is not installed: run scripts/test-deps (pip install --target target/mcp-py mcp)"
    );
    let dir = tempfile::tempdir().unwrap();
    let ca = super::tls::TestCa::new();
    let ca_file = ca.write(dir.path());
    let (cert, key) = ca.server(dir.path(), "server", &["localhost"], (-1, 90));
    // The public URL names the port clients use: a free one, chosen now.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let public = format!("https://localhost:{port}");
    let idp = Idp::start(&dir.path().join("keys.json"), &format!("{public}/mcp"), 0).await;
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let mut served = serve_binary(
        devices.path(),
        data.path(),
        &[
            ("FIELDGATE_SERVER_LISTEN", &listen),
            ("FIELDGATE_SERVER_PUBLIC_URL", &public),
            ("FIELDGATE_SERVER_TLS_CERT_FILE", cert.to_str().unwrap()),
            ("FIELDGATE_SERVER_TLS_KEY_FILE", key.to_str().unwrap()),
            ("FIELDGATE_SERVER_OAUTH_ISSUER", &idp.issuer),
        ],
    )
    .await;
    let _log = served.drain_stderr();
    let sdk = |client: &str, scopes: &str, tool: &str, args: Value| {
        let mut cmd = tokio::process::Command::new("python3");
        cmd.arg(support::root().join("tests/it/security/mcp_client.py"))
            .args([
                &format!("{public}/mcp"),
                ca_file.to_str().unwrap(),
                client,
                scopes,
                tool,
                &args.to_string(),
            ])
            .env("PYTHONPATH", python_modules())
            .kill_on_drop(true);
        cmd
    };
    use support::ChildWithin;
    let out =
        sdk("agent", "fieldgate.read fieldgate.work_orders.write", "list_sensors", json!({"zone": "LINE1"}))
            .output_within()
            .await
            .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let v: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|_| panic!("{text}{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{v}");
    assert_eq!(v["result"]["isError"], json!(false), "{v}");
    assert!(v["result"]["structured"]["data"]["sensors"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
    assert!(v["tools"].as_array().unwrap().contains(&json!("create_work_order")), "{v}");

    // A client granted only reading reads: the first 401 asks for reading only.
    let out =
        sdk("reader", "fieldgate.read", "list_sensors", json!({"limit": 1})).output_within().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("\"isError\": false"), "{text}");
    // The agent's client, granted reading first, steps up on the 403 of a work order.
    let order = json!({"sensor_id": "A_LINE1_001", "type": "inspection", "priority": "low",
        "summary": "Vibration above normal on the pump.", "idempotency_key": "sdk-test-0002"});
    let out = sdk("agent", "fieldgate.read fieldgate.work_orders.write", "create_work_order", order)
        .output_within()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("\"isError\": false") && text.contains("WO-"), "{text}");
    // The reader's client: the tool it may not call is refused (403), and the SDK's attempt
    // to get the scope is refused by the provider.
    let order = json!({"sensor_id": "A_LINE1_001", "type": "inspection", "priority": "low",
        "summary": "Vibration above normal on the pump.", "idempotency_key": "sdk-test-0001"});
    let out = sdk("reader", "fieldgate.read", "create_work_order", order).output_within().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // The SDK read the 403's challenge and asked the provider for the missing scope, which
    // the provider does not grant this client: the call never happens.
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("invalid_scope") && text.contains("fieldgate.work_orders.write"), "{text}");
}

/// The identity provider unreachable from the start: an access token cannot be checked, so
/// it is answered 503 `AUTH_UNAVAILABLE`, retryable with `Retry-After` (not 401, which would
/// make a client throw a good token away), at once (not paced like a guess), and counted.
#[tokio::test]
async fn an_unreachable_provider_is_a_retryable_503_not_a_bad_token() {
    let closed = support::ClosedPort::new();
    let issuer = format!("http://127.0.0.1:{}", closed.port);
    let devices = support::demo_devices_unreachable(&support::ClosedPort::new());
    let data = tempfile::tempdir().unwrap();
    let mut served = serve_binary(
        devices.path(),
        data.path(),
        &[
            ("FIELDGATE_SERVER_PUBLIC_URL", PUBLIC_URL),
            ("FIELDGATE_SERVER_OAUTH_ISSUER", &issuer),
            ("FIELDGATE_TOKEN_CLI", "operator:static-operator-token-0123456789"),
        ],
    )
    .await;
    let _log = served.drain_stderr();
    let addr = served.addr;
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let claims = json!({"iss": issuer, "aud": format!("{PUBLIC_URL}/mcp"), "sub": "x", "exp": now() + 300});
    let token = format!("{}.{}.c2ln", b64(&json!({"alg": "ES256", "kid": "k"})), b64(&claims));
    let started = std::time::Instant::now();
    for _ in 0..5 {
        let r = call(addr, "GET", "/v1/sensors", Some(&token), "").await;
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(
            (v["error"]["code"].as_str(), v["error"]["retryable"].as_bool()),
            (Some("AUTH_UNAVAILABLE"), Some(true))
        );
        assert_eq!(r.header("retry-after"), Some("5"));
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not paced like wrong tokens: {:?}",
        started.elapsed()
    );
    let m = call(addr, "GET", "/metrics", Some("static-operator-token-0123456789"), "").await;
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(text.contains("fieldgate_auth_tokens_refused_total{reason=\"keys_unavailable\"} 5"), "{text}");
}
