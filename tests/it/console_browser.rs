//! The operator console in a real browser: headless Chromium, driven over WebDriver
//! (chromedriver, through fantoccini), against the real `fieldgate serve` binary and the
//! simulator with its control API. The overview lists the demo devices, a device killed
//! through the control API shows as down without a reload (the time it took is printed) and as up again
//! when it returns, an operator signs in and approves a work order the agent created over
//! the HTTP API, an agent's token is refused, and a sensor page draws its chart.
//!
//! `scripts/test-deps` (the first half of the README's test command) installs Chromium and chromedriver (Debian's
//! `chromium`, `chromium-driver`) when they are missing; without them this test fails and
//! says so.
//! With `FIELDGATE_SCREENSHOTS=<dir>` it saves screenshots of the overview, a sensor page
//! and the approval queue there (README's pictures: `docs/`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use fieldgate::transport::client::HttpClient;
use fieldgate_sim::{Bind, Scenario, Simulator};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use super::support::*;

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const OPERATOR: &str = "operator-token-0123456789";
const AGENT: &str = "agent-token-0123456789";

/// chromedriver on a free port and one Chromium session through it.
struct Browser {
    client: Client,
    driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

/// Chromium outlives chromedriver (its processes are reparented, not killed), so the
/// driver runs in a process group of its own, and the whole group goes with the test,
/// also when the test fails before it closes the session.
impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            let _ = std::process::Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        }
    }
}

impl Browser {
    /// Chromium under chromedriver, each in a fresh profile.
    async fn start() -> Browser {
        assert!(
            Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
            "{CHROMEDRIVER} or {CHROMIUM} is not installed: run scripts/test-deps, which installs chromium and chromium-driver"
        );
        let mut driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg("--port=0")
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let mut lines = tokio::io::BufReader::new(driver.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let line =
                    lines.next_line().await.ok().flatten().expect("chromedriver exited before it listened");
                if let Some(p) = line.split("started successfully on port ").nth(1) {
                    return p.trim_end_matches('.').parse::<u16>().expect("a port");
                }
            }
        })
        .await
        .expect("chromedriver says its port within 20 s");
        // Keep reading its output so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                // Without these, this machine's closed network refuses Chromium's own
                // connections (and CI runs as root: no sandbox).
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage", "--window-size=1280,1000",
                         format!("--user-data-dir={}", profile.path().display())],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session");
        Browser { client, driver, _profile: profile }
    }

    async fn attr(&self, css: &str, name: &str) -> Option<String> {
        self.client.find(Locator::Css(css)).await.ok()?.attr(name).await.ok()?
    }

    async fn exists(&self, css: &str) -> bool {
        self.client.find(Locator::Css(css)).await.is_ok()
    }

    async fn text(&self, css: &str) -> String {
        self.client.find(Locator::Css(css)).await.unwrap().text().await.unwrap()
    }

    async fn screenshot(&self, name: &str) {
        if let Some(dir) = std::env::var_os("FIELDGATE_SCREENSHOTS") {
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(PathBuf::from(dir).join(name), png).unwrap();
        }
    }

    /// Signs in with `token` (the form sends the browser to the work-order queue).
    async fn sign_in(&self, base: &str, token: &str) {
        self.client.goto(&format!("{base}/console/login")).await.unwrap();
        self.client.find(Locator::Css("input[name=token]")).await.unwrap().send_keys(token).await.unwrap();
        self.client.find(Locator::Id("sign-in")).await.unwrap().click().await.unwrap();
        wait_until("signed in", Duration::from_secs(10), || self.exists("#who")).await;
    }
}

/// The demo plant in the simulator with its control API, and `fieldgate serve` on it:
/// polls every 200 ms, a breaker that opens at the first failure and probes after 300 ms,
/// so that a device's fall and return show at once.
struct Site {
    sim: Arc<Simulator>,
    control: std::net::SocketAddr,
    served: Served,
    _devices: tempfile::TempDir,
    _data: tempfile::TempDir,
}

async fn site() -> Site {
    let mut scenario = Scenario::load(&root().join("simulator/scenarios/demo.toml")).unwrap();
    scenario.faults.clear();
    let devices = fieldgate_sim::plant::load_dir(&demo_dir()).unwrap();
    let sim = Arc::new(Simulator::start(devices, scenario, Bind::Ephemeral).await.unwrap());
    let (control, _) =
        fieldgate_sim::control::serve(sim.clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = demo_devices_for(&sim);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let text: String = text
            .lines()
            .map(|l| if l.starts_with("poll_interval_ms") { "poll_interval_ms = 200" } else { l })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, text).unwrap();
    }
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("FIELDGATE_TOKEN_OPS", "operator:operator-token-0123456789"),
        ("FIELDGATE_TOKEN_BOT", "agent:agent-token-0123456789"),
        ("FIELDGATE_BREAKER_FAILURE_THRESHOLD", "1"),
        ("FIELDGATE_BREAKER_OPEN_MS", "300"),
    ];
    let mut served = serve_binary(dir.path(), data.path(), &env).await;
    served.drain_stderr();
    Site { sim, control, served, _devices: dir, _data: data }
}

impl Site {
    fn base(&self) -> String {
        format!("http://{}", self.served.addr)
    }

    /// Sets `device`'s faults through the simulator's control API.
    async fn faults(&self, device: &str, faults: Value) {
        let mut c = HttpClient::connect(self.control).await.unwrap();
        let r =
            c.send("PATCH", &format!("/devices/{device}/faults"), &[], faults.to_string().as_bytes()).await;
        assert_eq!(r.unwrap().status, 200);
    }

    async fn api(&self, token: &str) -> HttpClient {
        HttpClient::connect(self.served.addr).await.unwrap().with_token(token)
    }

    /// A work order created by the agent over the HTTP API; its ID.
    async fn order(&self, key: &str, sensor: &str) -> String {
        let args = json!({ "sensor_id": sensor, "type": "inspection", "priority": "high",
                           "summary": "Winding temperature climbs faster than the load explains", "idempotency_key": key });
        let r = self
            .api(AGENT)
            .await
            .post("/v1/tools/create_work_order", args.to_string().as_bytes())
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["data"]["work_order"]["id"].as_str().unwrap().to_string()
    }

    async fn work_order(&self, id: &str) -> Value {
        let r = self.api(AGENT).await.get(&format!("/v1/work-orders/{id}")).await.unwrap();
        r.json()["data"]["work_order"].clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_shows_faults_live_and_takes_an_operators_decision() {
    let b = Browser::start().await;
    let site = site().await;
    let base = site.base();
    b.sign_in(&base, OPERATOR).await;

    // The overview lists the four demo devices, with live values.
    b.client.goto(&format!("{base}/console")).await.unwrap();
    for d in ["a-line1-plc", "a-util-meter", "b-boiler-rtu", "b-oven2-opcua"] {
        assert!(b.exists(&format!("tr#dev-{d}")).await, "{d} is listed");
    }
    let state = "#dev-a-util-meter td[data-state]";
    wait_until("the meter is up", Duration::from_secs(15), || async {
        b.attr(state, "data-state").await.as_deref() == Some("up")
    })
    .await;
    wait_until("live updates arrive", Duration::from_secs(5), || async {
        b.text("#live-state").await == "live"
    })
    .await;
    // A mark on the page: gone if the page were reloaded.
    b.client.execute("window.fieldgateMark = 42; return null;", vec![]).await.unwrap();

    // Killed: shown down without a reload.
    site.faults("a-util-meter", json!({ "down": true })).await;
    let killed = Instant::now();
    wait_until("the meter shows as down", Duration::from_secs(10), || async {
        b.attr(state, "data-state").await.as_deref() == Some("down")
    })
    .await;
    let shown_down = killed.elapsed();
    assert!(b.text("#attention").await.contains("a-util-meter"), "a device down is listed first");
    b.screenshot("console-overview.png").await;
    // Back: up again, still without a reload.
    site.faults("a-util-meter", json!({ "down": null })).await;
    let back = Instant::now();
    wait_until("the meter shows as up again", Duration::from_secs(10), || async {
        b.attr(state, "data-state").await.as_deref() == Some("up")
    })
    .await;
    let shown_up = back.elapsed();
    let mark = b.client.execute("return window.fieldgateMark === 42;", vec![]).await.unwrap();
    assert_eq!(mark, json!(true), "the page was not reloaded");
    // Measured, not asserted (a loaded machine is not a slow console): the live stream
    // checks the devices' states every 200 ms and sends a change at once (console/live.rs).
    eprintln!("console: device shown down {shown_down:?} after the kill, up {shown_up:?} after its return");

    // A sensor page draws its chart from history (the last minute: one-second buckets).
    // For a picture, a chart worth looking at: half a minute of data.
    let chart = format!("{base}/console/sensors/A_LINE1_001?from=-1m");
    let enough = if std::env::var_os("FIELDGATE_SCREENSHOTS").is_some() { 30 } else { 2 };
    wait_for("a chart with data", Duration::from_secs(15 + enough), || async {
        b.client.goto(&chart).await.ok()?;
        let n: u64 = b.attr("svg#chart", "data-buckets").await?.parse().ok()?;
        (n >= enough).then_some(())
    })
    .await;
    assert!(b.exists("svg#chart polyline.avg").await && b.exists("svg#chart polygon.band").await);
    b.screenshot("console-sensor.png").await;

    // An order the agent created over the API, approved by the operator with a note.
    let id = site.order("browser-approve-1", "A_LINE1_003").await;
    b.client.goto(&format!("{base}/console/work-orders")).await.unwrap();
    assert!(b.exists(&format!("#wo-{id}")).await, "the order is queued");
    b.screenshot("console-queue.png").await;
    let note = "Checked on site; schedule for Tuesday";
    b.client
        .find(Locator::Css(&format!("#wo-{id} textarea[name=note]")))
        .await
        .unwrap()
        .send_keys(note)
        .await
        .unwrap();
    b.client.find(Locator::Id(&format!("approve-{id}"))).await.unwrap().click().await.unwrap();
    wait_until("the order page shows it approved", Duration::from_secs(10), || async {
        b.attr(&format!("#wo-{id}"), "data-status").await.as_deref() == Some("approved")
    })
    .await;
    let order = site.work_order(&id).await;
    assert_eq!(order["status"], "approved", "{order}");
    let last = order["history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["by"].as_str(), last["note"].as_str()), (Some("ops"), Some(note)), "{order}");

    // With an agent's token the control is disabled, and forcing it is refused.
    b.client.find(Locator::Css("header form button")).await.unwrap().click().await.unwrap();
    b.sign_in(&base, AGENT).await;
    let id = site.order("browser-refuse-1", "A_LINE1_004").await;
    b.client.goto(&format!("{base}/console/work-orders")).await.unwrap();
    assert!(b.exists("#actions-refused").await);
    let button = format!("approve-{id}");
    let disabled = b.client.find(Locator::Id(&button)).await.unwrap().prop("disabled").await.unwrap();
    assert_eq!(disabled.as_deref(), Some("true"), "the approve control is disabled");
    let force =
        format!("var b = document.getElementById('{button}'); b.disabled = false; b.click(); return null;");
    b.client.execute(&force, vec![]).await.unwrap();
    wait_until("the refusal page", Duration::from_secs(10), || async {
        b.exists("h1").await && b.text("h1").await == "Refused"
    })
    .await;
    assert!(b.text("main").await.contains("agent token"));
    assert_eq!(site.work_order(&id).await["status"], "pending_approval");
    let _ = &site.sim;
    b.client.clone().close().await.unwrap();
}

/// Script that would leave a mark on the page if any of it ran.
const HOSTILE: [&str; 5] = [
    "<script>window.pwned='script'</script>",
    "\"><img src=x onerror=\"window.pwned='img'\">",
    "javascript:window.pwned='link'",
    "'><svg onload=\"window.pwned='svg'\"></svg>",
    "</td></tr><a href=\"javascript:window.pwned='a'\">click</a>",
];

/// Whether anything hostile ran on the page shown now.
async fn pwned(b: &Browser) -> Value {
    b.client.execute("return window.pwned === undefined ? null : window.pwned;", vec![]).await.unwrap()
}

/// Text from the agent (work-order summaries, tool arguments, refused ones included) and
/// an operator's note, all hostile, shown on the queue, an order's page, the activity page
/// and pushed live into an open page: nothing runs (a page-global mark stays unset), the
/// text is shown as text, and every console page carries a policy that forbids inline script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_from_the_agent_is_shown_as_text_and_never_runs() {
    let b = Browser::start().await;
    let site = site().await;
    let base = site.base();
    let agent = || async { site.api(AGENT).await };
    // Orders whose summaries carry each hostile string.
    let mut ids = Vec::new();
    for (i, h) in HOSTILE.iter().enumerate() {
        // One sensor each: an open order for the same sensor and kind is the same order.
        let args = json!({ "sensor_id": format!("A_LINE1_00{}", i + 3), "type": "inspection", "priority": "high",
                           "summary": format!("Pump seal {h} leaking"), "idempotency_key": format!("hostile-{i}-key") });
        let r = agent().await.post("/v1/tools/create_work_order", args.to_string().as_bytes()).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        ids.push(r.json()["data"]["work_order"]["id"].as_str().unwrap().to_string());
    }
    // Calls that are refused still show on the activity page, with their arguments.
    let long = format!("{}{}", HOSTILE[1], "x".repeat(10 * 1024));
    for args in [
        json!({ "sensor_id": HOSTILE[0] }),
        json!({ "sensor_id": long }),
        json!({ "sensor_id": "A_LINE1_001\u{202e}gnp.exe" }),
    ] {
        let r =
            agent().await.post("/v1/tools/get_sensor_reading", args.to_string().as_bytes()).await.unwrap();
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    }

    b.sign_in(&base, OPERATOR).await;
    b.client.goto(&format!("{base}/console/work-orders")).await.unwrap();
    for id in &ids {
        assert!(b.exists(&format!("#wo-{id}")).await, "{id} is queued");
    }
    let queue = b.text("main").await;
    for h in HOSTILE {
        assert!(queue.contains(h), "shown as text on the queue: {h} in {queue}");
    }
    assert_eq!(pwned(&b).await, Value::Null, "the queue");
    // An operator's note as hostile as the rest, on the order's own page.
    let id = &ids[0];
    b.client
        .find(Locator::Css(&format!("#wo-{id} textarea[name=note]")))
        .await
        .unwrap()
        .send_keys(HOSTILE[3])
        .await
        .unwrap();
    b.client.find(Locator::Id(&format!("reject-{id}"))).await.unwrap().click().await.unwrap();
    wait_until("the order rejected", Duration::from_secs(10), || async {
        b.attr(&format!("#wo-{id}"), "data-status").await.as_deref() == Some("rejected")
    })
    .await;
    b.client.goto(&format!("{base}/console/work-orders/{id}")).await.unwrap();
    let page = b.text("main").await;
    assert!(page.contains(HOSTILE[0]) && page.contains(HOSTILE[3]), "{page}");
    assert_eq!(pwned(&b).await, Value::Null, "an order's page");

    b.client.goto(&format!("{base}/console/activity")).await.unwrap();
    wait_until("live updates arrive", Duration::from_secs(10), || async {
        b.text("#live-state").await == "live"
    })
    .await;
    let activity = b.text("main").await;
    assert!(activity.contains("window.pwned='script'"), "{activity}");
    assert!(
        activity.contains("\\u{202e}") || activity.contains("U+202E"),
        "the override shown escaped: {activity}"
    );
    assert_eq!(pwned(&b).await, Value::Null, "the activity page");
    // Pushed live into the open page: a new hostile call appears without a reload.
    let marker = format!("{}-live", HOSTILE[4]);
    let r = agent()
        .await
        .post("/v1/tools/get_sensor_reading", json!({ "sensor_id": marker }).to_string().as_bytes())
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    wait_until("the live call on the page", Duration::from_secs(10), || async {
        b.text("main").await.contains("click</a>-live")
    })
    .await;
    assert_eq!(pwned(&b).await, Value::Null, "after the live update");
    b.client.goto(&format!("{base}/console")).await.unwrap();
    wait_until("live updates arrive", Duration::from_secs(10), || async {
        b.text("#live-state").await == "live"
    })
    .await;
    assert_eq!(pwned(&b).await, Value::Null, "the overview");

    // Every page forbids inline script (what would run if escaping ever failed).
    let mut c = HttpClient::connect(site.served.addr).await.unwrap();
    for page in ["/console/login", "/console/nowhere"] {
        let r = c.get(page).await.unwrap();
        let csp = r.header("content-security-policy").unwrap_or_default().to_string();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{page}: {csp}");
    }
    b.client.clone().close().await.unwrap();
}
