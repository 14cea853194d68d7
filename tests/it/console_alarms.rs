//! The console's alarm page through the real binary: an operator signed in sees the
//! standing alarms (values as a person reads them), acknowledges one and shelves another
//! with the page's own forms, and the journal names the operator; an agent's session and a
//! form without the session's CSRF token act on nothing.

use std::net::SocketAddr;
use std::time::Duration;

use fieldgate_sim::Wave;
use serde_json::{Value, json};

use super::support::{self, wait_for};

const AGENT: &str = "agent-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";
const T: Duration = Duration::from_secs(30);

/// An answer: status, the cookies it sets (`name=value`), its body.
struct Answer {
    status: u16,
    cookies: Vec<String>,
    location: Option<String>,
    body: String,
}

impl Answer {
    fn cookie(&self, name: &str) -> Option<String> {
        self.cookies.iter().find(|c| c.starts_with(&format!("{name}="))).cloned()
    }

    /// The value of the first hidden input `name` after `from` in the page.
    fn hidden_after(&self, from: &str, name: &str) -> Option<String> {
        let start = self.body.find(from)?;
        let body = &self.body[start..];
        let at = body.find(&format!(r#"name="{name}" value=""#))?;
        let rest = &body[at + name.len() + 15..];
        Some(rest[..rest.find('"')?].to_string())
    }
}

fn client() -> reqwest::Client {
    fieldgate::tls::install_crypto_provider();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(T).build().unwrap()
}

async fn answer(res: reqwest::Response) -> Answer {
    let status = res.status().as_u16();
    let cookies = res
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").to_string())
        .collect();
    let location = res.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_string);
    Answer { status, cookies, location, body: res.text().await.unwrap() }
}

async fn get(addr: SocketAddr, path: &str, cookie: &str) -> Answer {
    answer(client().get(format!("http://{addr}{path}")).header("cookie", cookie).send().await.unwrap()).await
}

async fn post_form(addr: SocketAddr, path: &str, cookie: &str, form: &[(&str, &str)]) -> Answer {
    let res = client()
        .post(format!("http://{addr}{path}"))
        .header("cookie", cookie)
        .header("origin", format!("http://{addr}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(form))
        .send()
        .await
        .unwrap();
    answer(res).await
}

/// `form` URL-encoded, as a browser sends it.
fn encoded(form: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    form.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

/// Signs in with `token`: the session cookie and its CSRF token.
async fn sign_in(addr: SocketAddr, token: &str) -> (String, String) {
    let form = get(addr, "/console/login", "").await;
    let nonce = form.hidden_after("", "csrf").expect("the sign-in form carries a CSRF token");
    let login = form.cookie("fieldgate_login").expect("a sign-in cookie");
    let a = post_form(addr, "/console/login", &login, &[("token", token), ("csrf", &nonce)]).await;
    assert_eq!(a.status, 303, "{}", a.body);
    let cookie = a.cookie("fieldgate_session").expect("a session cookie");
    let page = get(addr, "/console/alarms", &cookie).await;
    (cookie, page.hidden_after("", "csrf").expect("a form with the session's CSRF token"))
}

async fn alarm(addr: SocketAddr, id: &str) -> Value {
    let (_, e) = support::post_as(addr, "/v1/tools/list_alarms", AGENT, json!({ "limit": 1000 })).await;
    e["data"]["alarms"].as_array().unwrap().iter().find(|a| a["alarm_id"] == id).cloned().expect("listed")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_acknowledges_and_shelves_from_the_alarm_page() {
    let sim = support::sim_for(&support::demo_dir()).await;
    let devices = support::demo_devices_for(&sim);
    let data = tempfile::tempdir().unwrap();
    // Past both limits, with a value a person would not type out in full.
    sim.set_wave("B_BOILER_001", Wave::Constant { value: 91.123_456_789 });
    let env = [
        ("FIELDGATE_TOKEN_REPORTER", "agent:agent-token-0123456789"),
        ("FIELDGATE_TOKEN_SHIFT_LEAD", "operator:operator-token-0123456789"),
        ("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000"),
    ];
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _log = served.drain_stderr();
    let addr = served.addr;
    let (op, op_csrf) = sign_in(addr, OPERATOR).await;
    let page = wait_for("HIHI active on the alarm page", T, || async {
        let page = get(addr, "/console/alarms", &op).await;
        page.body.contains(r#"id="ack-B_BOILER_001-HIHI""#).then_some(page)
    })
    .await;
    assert_eq!(page.status, 200);
    // The register holds tenths: 911 × 0.1 is 91.10000000000001 in binary.
    assert!(page.body.contains(" at 91.1</p>"), "the value rounded for a person: {}", page.body);
    let event = page.hidden_after(r#"id="alarm-B_BOILER_001-HIHI""#, "event_id").expect("the card's event");
    let path = "/console/alarms/B_BOILER_001.HIHI";
    let ack =
        [("csrf", op_csrf.as_str()), ("action", "acknowledge"), ("event_id", &event), ("comment", "pump")];

    // Neither an agent's session nor a form without this session's CSRF token acts.
    let (agent, agent_csrf) = sign_in(addr, AGENT).await;
    let as_agent = [("csrf", agent_csrf.as_str()), ("action", "acknowledge"), ("event_id", &event)];
    assert_eq!(post_form(addr, path, &agent, &as_agent).await.status, 403);
    let forged = [("csrf", "0000"), ("action", "acknowledge"), ("event_id", event.as_str())];
    assert_eq!(post_form(addr, path, &op, &forged).await.status, 403);
    assert_eq!(alarm(addr, "B_BOILER_001.HIHI").await["state"], "active_unacknowledged");

    let a = post_form(addr, path, &op, &ack).await;
    assert_eq!((a.status, a.location.as_deref()), (303, Some("/console/alarms")), "{}", a.body);
    let hihi = alarm(addr, "B_BOILER_001.HIHI").await;
    assert_eq!(
        (hihi["state"].as_str(), hihi["acknowledged_by"].as_str()),
        (Some("active_acknowledged"), Some("shift-lead")),
        "{hihi}"
    );
    // Again: nothing left to acknowledge, said on a page.
    let again = post_form(addr, path, &op, &ack).await;
    assert_eq!(again.status, 409, "{}", again.body);

    // Shelving takes the page's duration and a reason; one past the tool's bound is refused.
    let shelve = |duration: &'static str| {
        [
            ("csrf", op_csrf.clone()),
            ("action", "shelve".into()),
            ("duration_s", duration.into()),
            ("comment", "drift known".into()),
        ]
    };
    let path = "/console/alarms/B_BOILER_001.HI";
    let too_long = shelve("99999999");
    let too_long: Vec<(&str, &str)> = too_long.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = post_form(addr, path, &op, &too_long).await;
    assert_eq!(a.status, 400, "{}", a.body);
    assert!(a.body.contains("7 days"), "{}", a.body);
    let hour = shelve("3600");
    let hour: Vec<(&str, &str)> = hour.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(post_form(addr, path, &op, &hour).await.status, 303);
    let hi = alarm(addr, "B_BOILER_001.HI").await;
    assert!(hi["shelved_until"].is_string(), "{hi}");
    let shelved = get(addr, "/console/alarms?state=shelved", &op).await;
    assert!(shelved.body.contains(r#"id="unshelve-B_BOILER_001-HI""#), "{}", shelved.body);
    served.child.start_kill().unwrap();
    let _ = support::exited(&mut served.child, "served").await;
}
