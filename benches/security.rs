//! The cost of HTTPS and an access-token check per call, against plain HTTP with a static
//! token, in the same run (issue 34: ≤ 1.3× the cost per call on keep-alive).
//!
//! `cargo bench --bench security` serves one tool service twice: plain HTTP with a static
//! bearer token, and HTTPS (a self-signed ECDSA certificate) with `[server.oauth]` whose
//! issuer is a small in-process provider (discovery and JWKS over HTTP) and an ES256 access
//! token signed here. 16 keep-alive clients call `get_sensor_reading` (cache hits) for 3 s
//! each way, twice, alternating; it prints calls/s, p50 and p99 per way and the ratio of
//! the cost per call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use fieldgate::config::Config;
use fieldgate::config::security::{OAuthConfig, TlsConfig};
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
use fieldgate::transport::auth::Tokens;
use fieldgate::transport::client::HttpClient;
use fieldgate::transport::http;
use fieldgate::transport::oauth::OAuth;
use fieldgate::transport::tls_listener::TlsListener;
use fieldgate_sim::{Bind, Scenario, Simulator};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

const CLIENTS: usize = 16;
const RUN: Duration = Duration::from_secs(3);
const WARM: Duration = Duration::from_millis(500);
const CACHED: &[u8] = br#"{"sensor_id":"A_LINE1_001","max_age_ms":3600000}"#;
const STATIC: &str = "bench-static-token-0123456789";
const AUDIENCE: &str = "https://bench.plant/mcp";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A provider of one ES256 key: its discovery document and JWKS served on loopback.
async fn provider() -> (String, EcdsaKeyPair) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = key.public_key().as_ref().to_vec();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
        "x": b64(&point[1..33]), "y": b64(&point[33..65])}]});
    let meta = serde_json::json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")});
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || async move { axum::Json(meta) }),
        )
        .route("/jwks", axum::routing::get(move || async move { axum::Json(jwks) }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (issuer, key)
}

fn token(issuer: &str, key: &EcdsaKeyPair) -> String {
    let header = b64(br#"{"alg":"ES256","typ":"at+jwt","kid":"k1"}"#);
    let exp = chrono::Utc::now().timestamp() + 3600;
    let claims = serde_json::json!({"iss": issuer, "aud": AUDIENCE, "sub": "bench-agent", "exp": exp,
        "scope": "fieldgate.read fieldgate.work_orders.write"});
    let message = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let sig = key.sign(&ring::rand::SystemRandom::new(), message.as_bytes()).unwrap();
    format!("{message}.{}", b64(sig.as_ref()))
}

/// How a client reaches the server.
#[derive(Clone)]
enum Dial {
    Plain(SocketAddr),
    Tls(SocketAddr, tokio_rustls::TlsConnector),
}

async fn connect(dial: &Dial, token: &str) -> HttpClient {
    match dial {
        Dial::Plain(addr) => HttpClient::connect(*addr).await.unwrap().with_token(token),
        Dial::Tls(addr, connector) => {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let tls = connector.connect(name, tcp).await.unwrap();
            HttpClient::over(tls, format!("localhost:{}", addr.port())).await.unwrap().with_token(token)
        }
    }
}

fn pct(v: &mut [Duration], p: usize) -> f64 {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1e6
}

async fn load(dial: Dial, token: String) -> (f64, f64, f64) {
    let begin = Instant::now() + WARM;
    let end = begin + RUN;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (dial, token) = (dial.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = connect(&dial, &token).await;
            let mut times = Vec::with_capacity(100_000);
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                let r = c.post("/v1/tools/get_sensor_reading", CACHED).await.unwrap();
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                if t >= begin {
                    times.push(t.elapsed());
                }
            }
            times
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all.len() as f64 / RUN.as_secs_f64(), pct(&mut all, 50), pct(&mut all, 99))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async { tokio::spawn(run()).await.unwrap() });
}

async fn run() {
    fieldgate::tls::install_crypto_provider();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let devices_dir = root.join("devices");
    let devices = fieldgate_sim::plant::load_dir(&devices_dir).unwrap();
    let sim = Simulator::start(devices, Scenario::default(), Bind::Ephemeral).await.unwrap();
    let mut registry = Registry::load(&devices_dir).unwrap();
    registry.override_endpoints(sim.addrs(), sim.serial_paths());
    let mut config = Config::default();
    config.server.rate_limit_per_minute = 100_000_000;
    let tools = ToolService::new(Arc::new(registry), config);
    let timeouts = http::Timeouts { header: Duration::from_secs(30), grace: Duration::from_secs(1) };
    let stop = tokio_util::sync::CancellationToken::new();

    // Plain HTTP, a static token.
    let env = [("FIELDGATE_TOKEN_BENCH".to_string(), format!("agent:{STATIC}"))];
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap();
    let tokens = Tokens::load(None, env).unwrap();
    fieldgate::app::serve_http(plain, &tools, Arc::new(tokens), timeouts, &stop, None);

    // HTTPS, an access token of the provider.
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let tls_cfg =
        TlsConfig { cert_file, key_file, client_ca_file: None, watch_s: 3600, handshake_timeout_ms: 10_000 };
    let tls = Arc::new(TlsListener::load(&tls_cfg).unwrap());
    let (issuer, signing) = provider().await;
    let oauth_cfg = OAuthConfig {
        issuer: issuer.clone(),
        audiences: vec![AUDIENCE.into()],
        scopes_claim: "scope".into(),
        leeway_s: 30,
        jwks_min_refetch_s: 10,
        jwks_max_age_s: 3600,
        ca_file: None,
        require_at_jwt: false,
    };
    let oauth = Arc::new(OAuth::new(&oauth_cfg, "https://bench.plant").unwrap());
    oauth.prefetch().await;
    let secured = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let secured_addr = secured.local_addr().unwrap();
    let tokens = Tokens::default().with_oauth(Some(oauth));
    fieldgate::app::serve_http(secured, &tools, Arc::new(tokens), timeouts, &stop, Some(tls));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let jwt = token(&issuer, &signing);

    // Warm the reading cache and the device connection.
    let mut c = connect(&Dial::Plain(plain_addr), STATIC).await;
    assert_eq!(
        c.post("/v1/tools/get_sensor_reading", br#"{"sensor_id":"A_LINE1_001"}"#).await.unwrap().status,
        200
    );

    let mut plain_runs = Vec::new();
    let mut secured_runs = Vec::new();
    for _ in 0..2 {
        plain_runs.push(load(Dial::Plain(plain_addr), STATIC.to_string()).await);
        secured_runs.push(load(Dial::Tls(secured_addr, connector.clone()), jwt.clone()).await);
    }
    let best = |runs: &[(f64, f64, f64)]| *runs.iter().max_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
    let (p, s) = (best(&plain_runs), best(&secured_runs));
    println!(
        "get_sensor_reading, cache hits, {CLIENTS} keep-alive clients, best of 2 alternating runs of {RUN:?}:"
    );
    println!("  plain HTTP, static token:  {:>8.0} calls/s  p50 {:>6.0} µs  p99 {:>6.0} µs", p.0, p.1, p.2);
    println!("  HTTPS, ES256 access token: {:>8.0} calls/s  p50 {:>6.0} µs  p99 {:>6.0} µs", s.0, s.1, s.2);
    println!("  cost per call, HTTPS + JWT / plain: {:.2}x (target ≤ 1.30x)", p.0 / s.0);
    for (i, (a, b)) in plain_runs.iter().zip(&secured_runs).enumerate() {
        println!("  run {}: plain {:.0} calls/s, secured {:.0} calls/s", i + 1, a.0, b.0);
    }
    stop.cancel();
}
