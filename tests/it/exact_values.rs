//! Integers stay exact end to end: 64-bit registers of the raw-socket Modbus peer (framed by
//! hand, `raw_modbus::Peer`), read by the real binary, come back as JSON integers with every
//! digit: in a reading, in raw history points and in the min and max of history buckets.
//! Before, a `u64` of 2^64 − 1 came back from history as -1.0, and an `i64` of
//! 1234567890123 as 1234567890120.0.

use std::time::Duration;

use fieldgate::transport::client::HttpClient;
use serde_json::Value;

use super::raw_modbus::{Framing, Peer};
use super::support::{self, device_dir};

const T: Duration = Duration::from_secs(20);

/// (sensor, type, address, the exact integer the peer's registers hold).
const EXACT: [(&str, &str, u16, &str); 5] = [
    ("T_EXACT_001", "u64", 10, "18446744073709551615"),
    ("T_EXACT_002", "i64", 20, "1234567890123"),
    ("T_EXACT_003", "u64", 30, "9223372036854775808"),
    ("T_EXACT_004", "i64", 40, "9007199254740993"),
    ("T_EXACT_005", "i32", 50, "-7"),
];

fn device_file(port: u16) -> String {
    let mut text = format!(
        "id = \"t-exact\"\nplant = \"T\"\nzone = \"EXACT\"\ndescription = \"Raw-socket peer\"\n\
         protocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:{port}\"\nunit_id = 17\ntimeout_ms = 500\n\
         poll_interval_ms = 200\n"
    );
    for (id, ty, address, _) in EXACT {
        text += &format!(
            "\n[[sensors]]\nid = \"{id}\"\ndescription = \"Counter\"\nkind = \"count\"\nunit = \"count\"\n\
             table = \"holding\"\naddress = {address}\ntype = \"{ty}\"\n"
        );
    }
    text
}

/// The `"value":…` of each reading (or point) in a body, as written.
fn written(body: &str, key: &str) -> Vec<String> {
    body.match_indices(&format!("\"{key}\":"))
        .map(|(i, m)| body[i + m.len()..].chars().take_while(|c| !matches!(c, ',' | '}')).collect())
        .collect()
}

async fn post(client: &mut HttpClient, tool: &str, args: Value) -> String {
    let res = client.post(&format!("/v1/tools/{tool}"), args.to_string().as_bytes()).await.unwrap();
    let body = String::from_utf8(res.body).unwrap();
    assert_eq!(res.status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_stay_exact_in_readings_history_and_buckets() {
    let peer = Peer::start(Framing::Tcp).await;
    let devices = device_dir(&[("t-exact.toml", &device_file(peer.port))]);
    let data = tempfile::tempdir().unwrap();
    let mut served = support::serve_binary(devices.path(), data.path(), &[]).await;
    let _stderr = served.drain_stderr();
    let mut client = HttpClient::connect(served.addr).await.unwrap();
    let ids: Vec<&str> = EXACT.iter().map(|e| e.0).collect();
    let want: Vec<String> = EXACT.iter().map(|e| e.3.to_string()).collect();

    let body = post(&mut client, "get_sensor_readings", serde_json::json!({"sensor_ids": ids})).await;
    assert_eq!(written(&body, "value"), want, "{body}");
    let body =
        post(&mut client, "get_sensor_readings", serde_json::json!({"sensor_ids": ids, "unit": "raw"})).await;
    assert_eq!(written(&body, "value"), want, "raw: {body}");

    for (id, _, _, exact) in EXACT {
        // The poller's first point of each sensor, from history.
        let history = support::wait_for(&format!("a stored point of {id}"), T, || {
            let addr = served.addr;
            async move {
                let mut client = HttpClient::connect(addr).await.ok()?;
                let args = serde_json::json!({"sensor_id": id, "from": "-1h"});
                let res =
                    client.post("/v1/tools/get_sensor_history", args.to_string().as_bytes()).await.ok()?;
                let body = String::from_utf8(res.body).ok()?;
                (!written(&body, "value").is_empty()).then_some(body)
            }
        })
        .await;
        let points = written(&history, "value");
        assert!(points.iter().all(|v| v == exact), "{id}: {history}");
        let buckets = post(
            &mut client,
            "get_sensor_history",
            serde_json::json!({"sensor_id": id, "from": "-1h", "bucket": "1h"}),
        )
        .await;
        for key in ["min", "max", "first", "last"] {
            let got = written(&buckets, key);
            assert!(!got.is_empty() && got.iter().all(|v| v == exact), "{id} {key}: {buckets}");
        }
        // The mean of a constant is that constant, as near as a float gets (it was rounded
        // to 12 digits, outside min and max).
        let want: f64 = exact.parse().unwrap();
        for avg in written(&buckets, "avg") {
            assert_eq!(avg.parse::<f64>().unwrap(), want, "{id} avg: {buckets}");
        }
    }
    served.child.start_kill().unwrap();
    let _ = crate::support::exited(&mut served.child, "served").await;
}
