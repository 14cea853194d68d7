//! Work orders through crashes: `fieldgate serve` killed with SIGKILL at random moments
//! while creating orders; every acknowledged order survives exactly once.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};

use super::support::*;

/// Starts `fieldgate serve` on a free port with this data directory and these device
/// files, and nothing of the caller's environment.
async fn serve(
    data: &std::path::Path,
    devices: &std::path::Path,
) -> (tokio::process::Child, std::net::SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fieldgate"))
        .arg("serve")
        .arg("--devices")
        .arg(devices)
        .env_clear()
        .env("FIELDGATE_SERVER_LISTEN", "127.0.0.1:0")
        .env("FIELDGATE_STORAGE_DATA_DIR", data.to_str().unwrap())
        .env("FIELDGATE_SERVER_RATE_LIMIT_PER_MINUTE", "1000000")
        .env("FIELDGATE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line =
            tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
        if let Some(rest) = line.strip_prefix("fieldgate listening on http://") {
            let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return (child, addr);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_random_moments_no_acknowledged_work_order_is_lost_or_doubled() {
    let data = tempfile::tempdir().unwrap();
    // The demo's sensors, on no device: work orders need the registry, not readings.
    let closed = ClosedPort::new();
    let devices = demo_devices_unreachable(&closed);
    let sensors: Vec<String> = demo_registry().sensors().iter().map(|s| s.id.to_string()).collect();
    let types = ["inspection", "calibration", "repair", "replacement", "cleaning"];
    // Acknowledged: idempotency key → (arguments, work order ID).
    let mut acked: HashMap<String, (Value, String)> = HashMap::new();
    let mut seed = 0x2545_F491_4F6C_DD1D_u64;
    let mut n = 0usize;
    for round in 0..50 {
        let (mut child, addr) = serve(data.path(), devices.path()).await;
        let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
        // Everything acknowledged before survives and comes back for its key.
        if round % 10 == 9 {
            for (key, (args, id)) in &acked {
                let r =
                    c.post("/v1/tools/create_work_order", &serde_json::to_vec(args).unwrap()).await.unwrap();
                assert_eq!(r.json()["data"]["work_order"]["id"].as_str(), Some(id.as_str()), "{key}");
            }
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let create = |n: usize| {
            let key = format!("crash-{n:06}");
            let args = json!({"sensor_id": sensors[n % sensors.len()], "type": types[(n / sensors.len()) % types.len()],
                "priority": "low", "summary": format!("Crash test order number {n}."), "idempotency_key": key});
            (key, args)
        };
        // A few acknowledged for certain before the killer is armed, so how many orders
        // the test covers is counted, not a matter of how fast this box is.
        for _ in 0..2 + seed % 3 {
            n += 1;
            let (key, args) = create(n);
            let r = c.post("/v1/tools/create_work_order", &serde_json::to_vec(&args).unwrap()).await.unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            acked.insert(key, (args, r.json()["data"]["work_order"]["id"].as_str().unwrap().to_string()));
        }
        let kill_after = Duration::from_micros(seed % 40_000);
        let pid = child.id().unwrap().to_string();
        let killer = tokio::spawn(async move {
            tokio::time::sleep(kill_after).await;
            std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap();
        });
        loop {
            n += 1;
            let (key, args) = create(n);
            match c.post("/v1/tools/create_work_order", &serde_json::to_vec(&args).unwrap()).await {
                Ok(r) if r.status == 200 => {
                    let id = r.json()["data"]["work_order"]["id"].as_str().unwrap().to_string();
                    acked.insert(key, (args, id));
                }
                Ok(r) => panic!("unexpected answer {}: {}", r.status, String::from_utf8_lossy(&r.body)),
                Err(_) => break, // killed mid-call: not acknowledged
            }
        }
        killer.await.unwrap();
        let _ = crate::support::exited(&mut child, "child").await;
    }
    // After the last crash: every acknowledged order exists exactly once and its key
    // returns it.
    let (mut child, addr) = serve(data.path(), devices.path()).await;
    let mut c = fieldgate::transport::client::HttpClient::connect(addr).await.unwrap();
    let mut all = Vec::new();
    let mut args = json!({"limit": 500});
    loop {
        let d = c
            .post("/v1/tools/list_work_orders", &serde_json::to_vec(&args).unwrap())
            .await
            .unwrap()
            .json()["data"]
            .clone();
        all.extend(
            d["work_orders"].as_array().unwrap().iter().map(|o| o["id"].as_str().unwrap().to_string()),
        );
        match d["next_cursor"].as_str() {
            Some(cur) => args["cursor"] = json!(cur),
            None => break,
        }
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "an ID appears twice");
    for (key, (args, id)) in &acked {
        assert!(unique.contains(id), "{id} ({key}) was acknowledged and lost");
        let r = c.post("/v1/tools/create_work_order", &serde_json::to_vec(args).unwrap()).await.unwrap();
        assert_eq!(r.json()["data"]["work_order"]["id"].as_str(), Some(id.as_str()));
        assert_eq!(r.json()["data"]["created"], false);
    }
    assert!(acked.len() >= 100, "only {} orders acknowledged over 50 rounds", acked.len());
    eprintln!("crash test: 50 SIGKILLs, {} acknowledged work orders, {} stored", acked.len(), all.len());
    child.kill().await.unwrap();
}
