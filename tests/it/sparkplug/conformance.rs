//! Sparkplug 3.0's normative statements for an edge node, checked on one life of the real
//! binary as parts fieldgate did not write recorded it: Mosquitto's own log (each CONNECT
//! with its clean-session flag and will, each SUBSCRIBE, PUBLISH and DISCONNECT in order),
//! `mosquitto_sub` (every message that crossed the broker, with its QoS and retain flag as
//! published) and Eclipse Tahu's decoder (every payload). Nothing of fieldgate's reads them.
//!
//! The life: first births on a fresh data directory; a rebirth asked by an NCMD that Tahu
//! encoded and `mosquitto_pub` sent; a device's death and return; a stop by SIGTERM; a restart;
//! a `kill -9`. Each check names the statement's `tck-id`; docs/sparkplug.md lists every
//! edge-node statement with what covers it, and this test fails when the two disagree.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{ChildStdout, Command};

use super::broker::{Broker, Host, counter};
use super::edge::{demo_sim, fast_devices, mqtt_config, rig_with};
use super::external_decoder::decode_js;
use crate::support;

const T: Duration = Duration::from_secs(30);
const CLIENT: &str = "fieldgate-gw";

/// One message as `mosquitto_sub` received it.
struct Seen {
    topic: String,
    qos: u8,
    retain: bool,
    payload: Vec<u8>,
}

impl Seen {
    fn kind(&self) -> &str {
        self.topic.split('/').nth(2).unwrap_or("")
    }

    fn device(&self) -> Option<&str> {
        self.topic.split('/').nth(4)
    }
}

/// `mosquitto_sub` on `spBv1.0/#` (MQTT 5, QoS 2, retain as published).
struct Recorder {
    _child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    seen: Vec<Seen>,
}

async fn mosquitto_pub(port: u16, topic: &str, file: &Path, retain: bool) {
    let mut c = Command::new("mosquitto_pub");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-i", "test-pub", "-q", "1", "-t", topic, "-f"])
        .arg(file);
    if retain {
        c.arg("-r");
    }
    let status = tokio::time::timeout(T, c.status())
        .await
        .expect("mosquitto_pub finished within 30 s")
        .expect("mosquitto_pub runs (scripts/test-deps installs mosquitto-clients)");
    assert!(status.success(), "mosquitto_pub to {topic} failed");
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex from mosquitto_sub"))
        .collect()
}

impl Recorder {
    async fn start(port: u16, dir: &Path) -> Recorder {
        // A retained marker first: the recorder's first line once its subscription is in place.
        let marker = dir.join("ready");
        std::fs::write(&marker, "ready").unwrap();
        mosquitto_pub(port, "fieldgate-test/ready", &marker, true).await;
        let mut child = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-i", "test-rec", "-V", "mqttv5"])
            .args(["--retain-as-published", "-q", "2", "-t", "spBv1.0/#", "-t", "fieldgate-test/ready"])
            .args(["-F", "%t %q %r %x"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("mosquitto_sub runs (scripts/test-deps installs mosquitto-clients)");
        let lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
        let mut r = Recorder { _child: child, lines, seen: Vec::new() };
        r.until("the recorder's subscription", |s| s.topic == "fieldgate-test/ready").await;
        r.seen.clear();
        r
    }

    /// Reads until a message matches `pred`; its index in `seen`.
    async fn until(&mut self, what: &str, pred: impl Fn(&Seen) -> bool) -> usize {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(l))) => l,
                Ok(_) => panic!("mosquitto_sub stopped while waiting for {what}"),
                Err(_) => panic!("timed out after {T:?} waiting for {what}"),
            };
            let f: Vec<&str> = line.split(' ').collect();
            let [topic, qos, retain, payload] = f.as_slice() else {
                panic!("unexpected mosquitto_sub line: {line}")
            };
            self.seen.push(Seen {
                topic: topic.to_string(),
                qos: qos.parse().expect("QoS from mosquitto_sub"),
                retain: *retain == "1",
                payload: hex(payload),
            });
            if pred(self.seen.last().unwrap()) {
                return self.seen.len() - 1;
            }
        }
    }
}

/// The outcome of each statement checked.
#[derive(Default)]
struct Checks {
    seen: BTreeSet<&'static str>,
    failed: Vec<String>,
}

impl Checks {
    fn check(&mut self, ids: &[&'static str], ok: bool, detail: impl FnOnce() -> String) {
        self.seen.extend(ids);
        if !ok {
            self.failed.push(format!("{}: {}", ids.join(", "), detail()));
        }
    }
}

/// A message with its payload as Tahu decoded it.
struct Msg<'a> {
    seen: &'a Seen,
    p: &'a Value,
}

impl Msg<'_> {
    fn metrics(&self) -> &[Value] {
        self.p["metrics"].as_array().map_or(&[], Vec::as_slice)
    }

    fn metric(&self, name: &str) -> Option<&Value> {
        self.metrics().iter().find(|m| m["name"] == name)
    }

    fn bd_seq(&self) -> Option<i64> {
        self.metric("bdSeq").filter(|m| m["type"] == "Int64").and_then(|m| m["value"].as_i64())
    }
}

/// An NCMD asking for a rebirth, as Eclipse Tahu's encoder writes it: the file it is in.
pub(super) fn tahu_rebirth(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("ncmd.bin");
    std::fs::write(&file, super::tahu::command("Node Control/Rebirth")).unwrap();
    file
}

/// The device files in `dir` without their limit alarms: the demo's waves cross some limit
/// within seconds, and an alarm's change is an NDATA, which the node's statements checked
/// here do not cover (tests/it/sparkplug/alarms.rs checks the NDATA's).
fn without_alarms(dir: &Path) {
    for f in fieldgate::registry::device_files(dir).unwrap() {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut kept = String::new();
        let mut skipping = false;
        for line in text.lines() {
            if line.starts_with('[') {
                skipping = line.trim() == "[[sensors.alarms]]";
            }
            if !skipping {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        std::fs::write(&f, kept).unwrap();
    }
    let registry = fieldgate::registry::Registry::load(dir).unwrap();
    assert!(registry.sensors().iter().all(|s| s.alarms.is_empty()), "no alarm left");
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The statements of docs/sparkplug.md's table whose "covered by" cell names this test.
fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(support::root().join("docs/sparkplug.md")).unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| `") && l.contains("`conformance::every_edge_node_statement"))
        .flat_map(|l| {
            l.split('`').filter(|w| w.starts_with("tck-id-")).map(str::to_string).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_edge_node_statement_holds_on_what_crossed_the_broker() {
    let started = now_ms();
    let broker = Broker::start().await;
    let scratch = tempfile::tempdir().unwrap();
    let mut rec = Recorder::start(broker.port, scratch.path()).await;
    let sim = demo_sim().await;
    let devices = fast_devices(&sim);
    without_alarms(devices.path());
    let ids: Vec<String> = support::demo_registry().devices().iter().map(|d| d.id.to_string()).collect();
    let data = tempfile::tempdir().unwrap();
    let brokers = format!("[\"{}\"]", broker.url());
    let mut env = super::edge::node_env(&brokers);
    env.extend([
        ("FIELDGATE_BREAKER_FAILURE_THRESHOLD", "2"),
        ("FIELDGATE_BREAKER_OPEN_MS", "200"),
        ("FIELDGATE_BREAKER_MAX_OPEN_MS", "400"),
    ]);
    let born = |rec: &Recorder, from: usize, id: &str| {
        rec.seen[from..].iter().any(|s| s.kind() == "DBIRTH" && s.device() == Some(id))
    };

    // 1. First births, then data.
    let mut served = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = served.drain_stderr();
    let first = rec.until("the first NBIRTH", |s| s.kind() == "NBIRTH").await;
    for id in &ids {
        if !born(&rec, first, id) {
            rec.until(&format!("DBIRTH of {id}"), |s| s.kind() == "DBIRTH" && s.device() == Some(id)).await;
        }
    }
    rec.until("DDATA after the births", |s| s.kind() == "DDATA").await;

    // 2. A rebirth asked by an NCMD Tahu encoded.
    let ncmd = tahu_rebirth(scratch.path());
    let ncmd_sent = now_ms();
    mosquitto_pub(broker.port, "spBv1.0/plant/NCMD/gw", &ncmd, false).await;
    let reborn = rec.until("the NBIRTH the NCMD asked for", |s| s.kind() == "NBIRTH").await;
    for id in &ids {
        if !born(&rec, reborn, id) {
            rec.until(&format!("DBIRTH of {id} again"), |s| s.kind() == "DBIRTH" && s.device() == Some(id))
                .await;
        }
    }
    rec.until("DDATA after the rebirth", |s| s.kind() == "DDATA").await;

    // 3. A device dies and comes back.
    sim.set_faults("a-util-meter", fieldgate_sim::Faults { down: true, ..Default::default() }).unwrap();
    rec.until("DDEATH of the meter", |s| s.kind() == "DDEATH" && s.device() == Some("a-util-meter")).await;
    sim.set_faults("a-util-meter", fieldgate_sim::Faults::default()).unwrap();
    rec.until("DBIRTH of the meter again", |s| s.kind() == "DBIRTH" && s.device() == Some("a-util-meter"))
        .await;
    rec.until("the meter's DDATA again", |s| s.kind() == "DDATA" && s.device() == Some("a-util-meter")).await;

    // 4. Stopped by SIGTERM: NDEATH, then DISCONNECT.
    let pid = served.child.id().expect("running").to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    rec.until("the NDEATH of the stop", |s| s.kind() == "NDEATH").await;
    tokio::time::timeout(T, served.child.wait())
        .await
        .expect("fieldgate stopped within 30 s on SIGTERM")
        .unwrap();

    // 5. Restarted, then killed: the broker sends the will.
    let mut again = support::serve_binary(devices.path(), data.path(), &env).await;
    let _stderr = again.drain_stderr();
    let third = rec.until("the NBIRTH after the restart", |s| s.kind() == "NBIRTH").await;
    for id in &ids {
        if !born(&rec, third, id) {
            rec.until(&format!("DBIRTH of {id} after the restart"), |s| {
                s.kind() == "DBIRTH" && s.device() == Some(id)
            })
            .await;
        }
    }
    rec.until("DDATA after the restart", |s| s.kind() == "DDATA").await;
    again.child.start_kill().unwrap();
    crate::support::exited(&mut again.child, "again").await;
    rec.until("the NDEATH of the will", |s| s.kind() == "NDEATH").await;
    let ended = now_ms();

    let decoded = decode_js(&rec.seen.iter().map(|s| s.payload.clone()).collect::<Vec<_>>());
    let msgs: Vec<Msg> = rec.seen.iter().zip(&decoded).map(|(seen, p)| Msg { seen, p }).collect();
    let mut c = Checks::default();
    topics(&mut c, &msgs, &ids);
    flags(&mut c, &msgs);
    connects(&mut c, &broker.log());
    sessions(&mut c, &msgs, &ids, ncmd_sent);
    payloads(&mut c, &msgs, (started, ended));

    let documented = documented();
    let checked: BTreeSet<String> = c.seen.iter().map(|s| s.to_string()).collect();
    let undocumented: Vec<_> = checked.difference(&documented).collect();
    let unchecked: Vec<_> = documented.difference(&checked).collect();
    assert!(c.failed.is_empty(), "Sparkplug statements broken:\n{}", c.failed.join("\n"));
    assert!(
        undocumented.is_empty() && unchecked.is_empty(),
        "docs/sparkplug.md and this test disagree: checked here but not listed there as covered by it: {undocumented:?}; listed but not checked: {unchecked:?}"
    );
}

/// Topic structure, on every message.
fn topics(c: &mut Checks, msgs: &[Msg], ids: &[String]) {
    for m in msgs {
        let parts: Vec<&str> = m.seen.topic.split('/').collect();
        let kind = parts.get(2).copied().unwrap_or("");
        let ours = !matches!(kind, "NCMD" | "DCMD");
        c.check(
            &[
                "tck-id-topic-structure",
                "tck-id-topic-structure-namespace-a",
                "tck-id-topics-nbirth-topic",
                "tck-id-topics-ndeath-topic",
                "tck-id-topics-dbirth-topic",
                "tck-id-topics-ddata-topic",
                "tck-id-topics-ddeath-topic",
                "tck-id-message-flow-edge-node-birth-publish-nbirth-topic",
                "tck-id-message-flow-device-birth-publish-dbirth-topic",
                "tck-id-message-flow-device-birth-publish-dbirth-match-edge-node-topic",
            ],
            !ours
                || (parts.len() >= 4
                    && parts[..2] == ["spBv1.0", "plant"]
                    && ["NBIRTH", "NDEATH", "DBIRTH", "DDEATH", "DDATA"].contains(&kind)
                    && parts[3] == "gw"),
            || format!("topic {}", m.seen.topic),
        );
        let by_device = kind.starts_with('D') && kind != "DCMD";
        c.check(
            &["tck-id-topic-structure-namespace-device-id-associated-message-types"],
            !by_device || (parts.len() == 5 && ids.iter().any(|i| i == parts[4])),
            || format!("topic {}", m.seen.topic),
        );
        c.check(
            &["tck-id-topic-structure-namespace-device-id-non-associated-message-types"],
            !kind.starts_with('N') || parts.len() == 4,
            || format!("topic {}", m.seen.topic),
        );
    }
    let lower: HashSet<String> = ids.iter().map(|i| i.to_lowercase()).collect();
    c.check(
        &["tck-id-case-sensitivity-sparkplug-ids", "tck-id-topic-structure-namespace-unique-device-id"],
        lower.len() == ids.len(),
        || format!("device ids {ids:?}"),
    );
}

/// QoS and retain flag of each message as published (the will's as the broker sent it).
fn flags(c: &mut Checks, msgs: &[Msg]) {
    for m in msgs {
        let (q, r) = (m.seen.qos, m.seen.retain);
        let what = || format!("{} with QoS {q}, retain {r}", m.seen.topic);
        match m.seen.kind() {
            "NBIRTH" => c.check(
                &[
                    "tck-id-topics-nbirth-mqtt",
                    "tck-id-payloads-nbirth-qos",
                    "tck-id-payloads-nbirth-retain",
                    "tck-id-message-flow-edge-node-birth-publish-nbirth-qos",
                    "tck-id-message-flow-edge-node-birth-publish-nbirth-retained",
                ],
                q == 0 && !r,
                what,
            ),
            "DBIRTH" => c.check(
                &[
                    "tck-id-topics-dbirth-mqtt",
                    "tck-id-payloads-dbirth-qos",
                    "tck-id-payloads-dbirth-retain",
                    "tck-id-message-flow-device-birth-publish-dbirth-qos",
                    "tck-id-message-flow-device-birth-publish-dbirth-retained",
                ],
                q == 0 && !r,
                what,
            ),
            "DDATA" => c.check(
                &["tck-id-topics-ddata-mqtt", "tck-id-payloads-ddata-qos", "tck-id-payloads-ddata-retain"],
                q == 0 && !r,
                what,
            ),
            "DDEATH" => c.check(&["tck-id-topics-ddeath-mqtt"], q == 0 && !r, what),
            "NDEATH" => c.check(
                &[
                    "tck-id-payloads-ndeath-will-message-qos",
                    "tck-id-payloads-ndeath-will-message-retain",
                    "tck-id-message-flow-edge-node-birth-publish-will-message-qos",
                    "tck-id-message-flow-edge-node-birth-publish-will-message-will-retained",
                ],
                q == 1 && !r,
                what,
            ),
            _ => {}
        }
    }
}

/// What the broker logged of fieldgate's connections: flags, will, subscriptions, and the
/// order of its packets.
fn connects(c: &mut Checks, log: &str) {
    // Each line without the broker's time prefix.
    let lines: Vec<&str> = log.lines().map(|l| l.split_once(": ").map_or(l, |(_, r)| r)).collect();
    let mut connections = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("New client connected") && l.contains(&format!(" as {CLIENT} ")) {
            connections += 1;
            c.check(&["tck-id-principles-persistence-clean-session-311"], l.contains("(p2, c1,"), || {
                format!("CONNECT logged as {l}")
            });
            let will = lines.get(i + 1).copied().unwrap_or("");
            let topic = lines.get(i + 2).copied().unwrap_or("").trim();
            c.check(
                &[
                    "tck-id-message-flow-edge-node-birth-publish-will-message",
                    "tck-id-payloads-ndeath-will-message",
                ],
                will.starts_with("Will message specified"),
                || format!("after the CONNECT: {will}"),
            );
            c.check(
                &[
                    "tck-id-message-flow-edge-node-birth-publish-will-message-qos",
                    "tck-id-message-flow-edge-node-birth-publish-will-message-will-retained",
                    "tck-id-payloads-ndeath-will-message-qos",
                    "tck-id-payloads-ndeath-will-message-retain",
                ],
                will.ends_with("(r0, q1)."),
                || format!("will logged as {will}"),
            );
            c.check(
                &["tck-id-message-flow-edge-node-birth-publish-will-message-topic"],
                topic == "spBv1.0/plant/NDEATH/gw",
                || format!("will topic {topic}"),
            );
            // This connection's packets, up to the next CONNECT of the same client.
            let end = lines[i + 1..]
                .iter()
                .position(|l| l.starts_with("New client connected") && l.contains(&format!(" as {CLIENT} ")))
                .map_or(lines.len(), |p| i + 1 + p);
            let own = &lines[i..end];
            let publishes: Vec<&&str> =
                own.iter().filter(|l| l.starts_with(&format!("Received PUBLISH from {CLIENT} "))).collect();
            let connack = own.iter().position(|l| l.starts_with(&format!("Sending CONNACK to {CLIENT} ")));
            let first_publish =
                own.iter().position(|l| l.starts_with(&format!("Received PUBLISH from {CLIENT} ")));
            c.check(
                &[
                    "tck-id-message-flow-edge-node-birth-publish-connect",
                    "tck-id-principles-birth-certificates-order",
                ],
                publishes.first().is_none_or(|p| p.contains("'spBv1.0/plant/NBIRTH/gw'"))
                    && first_publish.is_none_or(|p| connack.is_some_and(|a| a < p)),
                || format!("first PUBLISH of a connection: {:?}", publishes.first()),
            );
            let subscribed = own.windows(2).any(|w| {
                w[0].starts_with(&format!("Received SUBSCRIBE from {CLIENT}"))
                    && w[1].trim().starts_with("spBv1.0/plant/NCMD/gw ")
            }) || own.iter().any(|l| l.trim() == "spBv1.0/plant/NCMD/gw (QoS 1)");
            c.check(&["tck-id-message-flow-edge-node-ncmd-subscribe"], subscribed, || {
                "no SUBSCRIBE to spBv1.0/plant/NCMD/gw".into()
            });
            // A connection that ended with DISCONNECT sent its NDEATH just before.
            if let Some(d) =
                own.iter().position(|l| l.starts_with(&format!("Received DISCONNECT from {CLIENT}")))
            {
                let last = own[..d]
                    .iter()
                    .rev()
                    .find(|l| l.starts_with(&format!("Received PUBLISH from {CLIENT} ")));
                c.check(
                    &[
                        "tck-id-operational-behavior-edge-node-intentional-disconnect-ndeath",
                        "tck-id-payloads-ndeath-will-message-publisher",
                        "tck-id-payloads-ndeath-will-message-publisher-disconnect-mqtt311",
                    ],
                    last.is_some_and(|l| l.contains("'spBv1.0/plant/NDEATH/gw'")),
                    || format!("last PUBLISH before DISCONNECT: {last:?}"),
                );
            }
        }
    }
    c.check(&["tck-id-principles-persistence-clean-session-311"], connections == 2, || {
        format!("{connections} connections of {CLIENT} logged, 2 expected")
    });
    let disconnects =
        lines.iter().filter(|l| l.starts_with(&format!("Received DISCONNECT from {CLIENT}"))).count();
    c.check(
        &["tck-id-operational-behavior-edge-node-intentional-disconnect-packet"],
        disconnects == 1,
        || format!("{disconnects} DISCONNECTs logged, 1 expected (the SIGTERM)"),
    );
}

/// Sequence numbers, bdSeq, birth order and aliases, session by session (a session runs from
/// an NBIRTH to the next NBIRTH or NDEATH).
fn sessions(c: &mut Checks, msgs: &[Msg], ids: &[String], ncmd_sent: i64) {
    let ours: Vec<&Msg> = msgs.iter().filter(|m| !matches!(m.seen.kind(), "NCMD" | "DCMD")).collect();
    c.check(
        &["tck-id-principles-birth-certificates-order"],
        ours.first().is_some_and(|m| m.seen.kind() == "NBIRTH"),
        || format!("first message {:?}", ours.first().map(|m| &m.seen.topic)),
    );
    let mut connection_bd: Option<i64> = None;
    let mut bd_seqs = Vec::new();
    let mut prev_seq: Option<i64> = None;
    // Per device: the aliases of its current DBIRTH; None when dead or not born.
    let mut births: HashMap<String, Option<HashSet<i64>>> = HashMap::new();
    let mut after_nbirth_data = false;
    let mut unborn_at_nbirth: HashSet<String> = HashSet::new();
    let mut aliases: HashMap<i64, String> = HashMap::new();
    let mut session = 0;
    let ncmd_at = msgs.iter().position(|m| m.seen.kind() == "NCMD");
    for (i, m) in msgs.iter().enumerate() {
        let kind = m.seen.kind();
        let seq = m.p["seq"].as_i64();
        match kind {
            "NCMD" | "DCMD" => continue,
            "NDEATH" => {
                c.check(&["tck-id-topics-ndeath-seq", "tck-id-payloads-ndeath-seq"], seq.is_none(), || {
                    format!("NDEATH with seq {seq:?}")
                });
                c.check(
                    &["tck-id-topics-ndeath-payload"],
                    m.metrics().len() == 1 && m.bd_seq().is_some(),
                    || format!("NDEATH payload {}", m.p),
                );
                c.check(
                    &[
                        "tck-id-payloads-ndeath-bdseq",
                        "tck-id-topics-nbirth-bdseq-matching",
                        "tck-id-payloads-nbirth-bdseq-repeat",
                        "tck-id-message-flow-edge-node-birth-publish-will-message-payload",
                    ],
                    m.bd_seq().is_some() && m.bd_seq() == connection_bd,
                    || {
                        format!(
                            "NDEATH bdSeq {:?}, the connection's NBIRTH had {connection_bd:?}",
                            m.bd_seq()
                        )
                    },
                );
                connection_bd = None;
                prev_seq = None;
                births.clear();
                continue;
            }
            _ => {}
        }
        c.check(
            &["tck-id-payloads-sequence-num-always-included"],
            seq.is_some_and(|s| (0..=255).contains(&s)),
            || format!("{} with seq {seq:?}", m.seen.topic),
        );
        if kind == "NBIRTH" {
            session += 1;
            c.check(
                &[
                    "tck-id-topics-nbirth-seq-num",
                    "tck-id-payloads-nbirth-seq",
                    "tck-id-payloads-sequence-num-req-nbirth",
                    "tck-id-message-flow-edge-node-birth-publish-nbirth-payload-seq",
                ],
                seq == Some(0),
                || format!("NBIRTH seq {seq:?}"),
            );
            let bd = m.bd_seq();
            c.check(
                &[
                    "tck-id-topics-nbirth-bdseq-included",
                    "tck-id-payloads-nbirth-bdseq",
                    "tck-id-message-flow-edge-node-birth-publish-nbirth-payload-bdSeq",
                ],
                bd.is_some(),
                || format!("NBIRTH without an Int64 bdSeq: {}", m.p),
            );
            match connection_bd {
                // A rebirth on the same connection: the same bdSeq.
                Some(was) => c.check(
                    &["tck-id-operational-behavior-data-commands-rebirth-action-3"],
                    bd == Some(was),
                    || format!("rebirth bdSeq {bd:?}, the connection's {was}"),
                ),
                None => {
                    connection_bd = bd;
                    bd_seqs.extend(bd);
                }
            }
            let rebirth = m.metric("Node Control/Rebirth");
            c.check(
                &[
                    "tck-id-topics-nbirth-rebirth-metric",
                    "tck-id-payloads-nbirth-rebirth-req",
                    "tck-id-operational-behavior-data-commands-rebirth-name",
                    "tck-id-operational-behavior-data-commands-rebirth-datatype",
                    "tck-id-operational-behavior-data-commands-rebirth-value",
                    "tck-id-operational-behavior-data-commands-rebirth-name-aliases",
                ],
                rebirth.is_some_and(|r| {
                    r["type"] == "Boolean" && r["value"] == false && r.get("alias").is_none()
                }),
                || format!("Node Control/Rebirth is {rebirth:?}"),
            );
            if session == 2 {
                // The rebirth the NCMD asked for; nothing read after it arrived went out before.
                let late =
                    msgs[ncmd_at.unwrap_or(i)..i].iter().filter(|d| d.seen.kind() == "DDATA").any(|d| {
                        d.metrics()
                            .iter()
                            .any(|x| x["timestamp"].as_i64().is_some_and(|t| t > ncmd_sent + 2000))
                    });
                c.check(
                    &["tck-id-operational-behavior-data-commands-rebirth-action-1"],
                    ncmd_at.is_some_and(|n| n < i) && !late,
                    || "data read after the NCMD went out before the NBIRTH".into(),
                );
            }
            births = ids.iter().map(|d| (d.clone(), None)).collect();
            unborn_at_nbirth = ids.iter().cloned().collect();
            after_nbirth_data = false;
            aliases.clear();
        } else {
            c.check(
                &[
                    "tck-id-payloads-sequence-num-incrementing",
                    "tck-id-topics-dbirth-seq",
                    "tck-id-payloads-dbirth-seq",
                    "tck-id-payloads-dbirth-seq-inc",
                    "tck-id-message-flow-device-birth-publish-dbirth-payload-seq",
                    "tck-id-topics-ddata-seq-num",
                    "tck-id-payloads-ddata-seq",
                    "tck-id-payloads-ddata-seq-inc",
                    "tck-id-topics-ddeath-seq-num",
                    "tck-id-payloads-ddeath-seq",
                    "tck-id-payloads-ddeath-seq-inc",
                    "tck-id-payloads-ddeath-seq-number",
                ],
                prev_seq.is_some_and(|p| seq == Some((p + 1) % 256)),
                || format!("{} seq {seq:?} after {prev_seq:?}", m.seen.topic),
            );
        }
        prev_seq = seq;
        let device = m.seen.device().map(str::to_string);
        match (kind, device) {
            ("DBIRTH", Some(d)) => {
                c.check(
                    &["tck-id-message-flow-device-birth-publish-nbirth-wait"],
                    connection_bd.is_some(),
                    || format!("DBIRTH of {d} before any NBIRTH of the connection"),
                );
                let mut own = HashSet::new();
                let mut lower = HashSet::new();
                for x in m.metrics() {
                    let (name, alias) = (x["name"].as_str(), x["alias"].as_i64());
                    c.check(
                        &["tck-id-payloads-alias-birth-requirement"],
                        name.is_some() && alias.is_some(),
                        || format!("DBIRTH metric {x}"),
                    );
                    if let Some(a) = alias {
                        let other = aliases.insert(a, name.unwrap_or("").to_string());
                        c.check(
                            &["tck-id-payloads-alias-uniqueness"],
                            other.is_none_or(|o| o == name.unwrap_or("")),
                            || format!("alias {a} of {name:?} and of another metric"),
                        );
                        own.insert(a);
                    }
                    c.check(
                        &["tck-id-case-sensitivity-metric-names"],
                        lower.insert(name.unwrap_or("").to_lowercase()),
                        || format!("{name:?} repeats another metric's name but for case"),
                    );
                }
                if unborn_at_nbirth.remove(&d) {
                    c.check(
                        &["tck-id-payloads-dbirth-order", "tck-id-payloads-ddata-order"],
                        !after_nbirth_data,
                        || format!("DBIRTH of {d} after DDATA of the session"),
                    );
                }
                births.insert(d, Some(own));
            }
            ("DDEATH", Some(d)) => {
                c.check(
                    &["tck-id-operational-behavior-device-ddeath"],
                    births.get(&d).is_some_and(Option::is_some),
                    || format!("DDEATH of {d}, which was not born"),
                );
                births.insert(d, None);
            }
            ("DDATA", Some(d)) => {
                after_nbirth_data = true;
                let own = births.get(&d).cloned().flatten();
                c.check(
                    &[
                        "tck-id-topics-dbirth-metric-reqs",
                        "tck-id-operational-behavior-data-publish-dbirth",
                        "tck-id-topics-ddata-payload",
                        "tck-id-payloads-ddata-order",
                    ],
                    own.as_ref().is_some_and(|own| {
                        m.metrics().iter().all(|x| x["alias"].as_i64().is_some_and(|a| own.contains(&a)))
                    }),
                    || format!("DDATA of {d} with a metric its DBIRTH did not carry, or before it: {}", m.p),
                );
            }
            _ => {}
        }
    }
    c.check(
        &[
            "tck-id-topics-nbirth-bdseq-increment",
            "tck-id-message-flow-edge-node-birth-publish-will-message-payload-bdSeq",
        ],
        bd_seqs == [0, 1],
        || format!("bdSeq of the two connections {bd_seqs:?}, [0, 1] expected (a fresh data directory)"),
    );
    c.check(&["tck-id-operational-behavior-data-commands-rebirth-action-2"], session == 3, || {
        format!("{session} NBIRTHs, 3 expected")
    });
}

/// Timestamps, datatypes, values and properties of every payload.
fn payloads(c: &mut Checks, msgs: &[Msg], (from, to): (i64, i64)) {
    // Timestamps are UTC ms: within the test's own clock, with a second's slack.
    let in_utc = |t: Option<i64>| t.is_some_and(|t| t >= from - 1000 && t <= to + 1000);
    const KNOWN: [&str; 12] = [
        "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double",
        "Boolean", "String",
    ];
    for m in msgs.iter().filter(|m| !matches!(m.seen.kind(), "NCMD" | "DCMD")) {
        let kind = m.seen.kind();
        c.check(
            &[
                "tck-id-topics-nbirth-timestamp",
                "tck-id-payloads-nbirth-timestamp",
                "tck-id-topics-dbirth-timestamp",
                "tck-id-payloads-dbirth-timestamp",
                "tck-id-topics-ddata-timestamp",
                "tck-id-payloads-ddata-timestamp",
                "tck-id-payloads-ddeath-timestamp",
                "tck-id-payloads-timestamp-in-UTC",
            ],
            in_utc(m.p["timestamp"].as_i64()),
            || format!("{} payload timestamp {}", m.seen.topic, m.p["timestamp"]),
        );
        let birth = kind.ends_with("BIRTH");
        c.check(
            &[
                "tck-id-message-flow-edge-node-birth-publish-nbirth-payload",
                "tck-id-message-flow-device-birth-publish-dbirth-payload",
            ],
            !birth || !m.metrics().is_empty(),
            || format!("{} did not decode to a Sparkplug payload with metrics: {}", m.seen.topic, m.p),
        );
        let mut by_alias: HashMap<i64, i64> = HashMap::new();
        for x in m.metrics() {
            if kind != "NDEATH" {
                c.check(
                    &[
                        "tck-id-payloads-name-birth-data-requirement",
                        "tck-id-payloads-metric-timestamp-in-UTC",
                    ],
                    in_utc(x["timestamp"].as_i64()),
                    || format!("{} metric without a UTC timestamp: {x}", m.seen.topic),
                );
            }
            c.check(
                &[
                    "tck-id-payloads-metric-datatype-value-type",
                    "tck-id-payloads-metric-datatype-value",
                    "tck-id-payloads-metric-datatype-req",
                ],
                x["type"].as_str().is_some_and(|t| KNOWN.contains(&t)),
                || format!("{} metric datatype {}", m.seen.topic, x["type"]),
            );
            if birth {
                c.check(
                    &[
                        "tck-id-topics-nbirth-metrics",
                        "tck-id-topics-dbirth-metrics",
                        "tck-id-payloads-name-requirement",
                        "tck-id-operational-behavior-data-publish-nbirth-values",
                        "tck-id-operational-behavior-data-publish-dbirth-values",
                    ],
                    x["name"].is_string() && x.get("value").is_some(),
                    || format!("birth metric {x}"),
                );
            }
            if kind == "DDATA" {
                c.check(
                    &["tck-id-payloads-alias-data-cmd-requirement", "tck-id-payloads-name-requirement"],
                    x.get("name").is_none() && x["alias"].is_i64(),
                    || format!("DDATA metric {x}"),
                );
                if x.get("isHistorical") != Some(&Value::Bool(true))
                    && let (Some(a), Some(t)) = (x["alias"].as_i64(), x["timestamp"].as_i64())
                {
                    let before = by_alias.insert(a, t);
                    c.check(
                        &["tck-id-operational-behavior-data-publish-dbirth-order"],
                        before.is_none_or(|b| b <= t),
                        || format!("alias {a} at {t} after {before:?} in one DDATA"),
                    );
                }
            }
            if let Some(props) = x["properties"].as_object() {
                for (k, v) in props {
                    c.check(
                        &[
                            "tck-id-payloads-metric-propertyvalue-type-req",
                            "tck-id-payloads-metric-propertyvalue-type-type",
                            "tck-id-payloads-metric-propertyvalue-type-value",
                        ],
                        v["type"].as_str().is_some_and(|t| KNOWN.contains(&t)),
                        || format!("property {k} = {v}"),
                    );
                }
                if let Some(q) = props.get("Quality") {
                    c.check(
                        &[
                            "tck-id-payloads-propertyset-quality-value-type",
                            "tck-id-payloads-propertyset-quality-value-value",
                        ],
                        q["type"] == "Int32" && [0, 192, 500].contains(&q["value"].as_i64().unwrap_or(-1)),
                        || format!("Quality {q}"),
                    );
                }
            }
        }
    }
}

/// The primary host's STATE is taken only from its own topic, when it is JSON with a
/// timestamp no older than the last one taken: a stale `online`, another host's, or a
/// malformed one does not bring births, and a stale `offline` does not end them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_host_state_is_checked_for_its_host_its_flag_and_its_time() {
    let broker = Broker::start().await;
    let mut host = Host::connect(broker.port).await;
    let data = tempfile::tempdir().unwrap();
    let mut c = mqtt_config(&broker, data.path());
    c.mqtt.primary_host_id = "scada".into();
    let state = |online: bool, ts: i64| format!("{{\"online\":{online},\"timestamp\":{ts}}}").into_bytes();
    let t0 = now_ms();
    host.publish("spBv1.0/STATE/scada", state(false, t0), true).await;
    let rig = rig_with(c, demo_sim().await, data).await;
    let tools = rig.running.tools.clone();
    counter(&tools, "fieldgate_sparkplug_connected", T, |v| v == 1).await;
    // In order, on the node's one connection: each ignored one, had it been taken, would
    // show as an NBIRTH before the NDEATH the offline after it brings.
    host.publish("spBv1.0/STATE/scada", state(true, t0 - 1000), true).await;
    host.publish("spBv1.0/STATE/other", state(true, t0 + 1), true).await;
    host.publish("spBv1.0/STATE/scada", b"{\"online\":true}".to_vec(), true).await;
    host.publish("spBv1.0/STATE/scada", state(false, t0 + 2), true).await;
    host.publish("spBv1.0/STATE/scada", state(true, t0 + 3), true).await;
    host.until("NBIRTH once the host is online", T, |m| m.kind() == "NBIRTH").await;
    let kinds: Vec<&str> = host.seen.iter().map(|m| m.kind()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "NBIRTH" || **k == "NDEATH").count(), 1, "{kinds:?}");
    host.until("DDATA", T, |m| m.kind() == "DDATA").await;

    // A stale offline is ignored: the rebirth asked after it comes with no NDEATH before it.
    host.publish("spBv1.0/STATE/scada", state(false, t0 + 1), true).await;
    let scratch = tempfile::tempdir().unwrap();
    let ncmd = std::fs::read(tahu_rebirth(scratch.path())).unwrap();
    host.publish("spBv1.0/plant/NCMD/gw", ncmd, false).await;
    let from = host.seen.len();
    host.until("the NBIRTH of the rebirth", T, |m| m.kind() == "NBIRTH").await;
    let kinds: Vec<&str> = host.seen[from..].iter().map(|m| m.kind()).collect();
    assert!(!kinds.contains(&"NDEATH"), "a stale offline STATE ended the session: {kinds:?}");
    // Every STATE above was taken before that rebirth: one connection all along (one of the
    // ignored ones taken would have meant births, an NDEATH and a new connection).
    let connects = super::broker::metric(&tools, "fieldgate_sparkplug_connects_total");
    assert_eq!(
        connects,
        Some(1),
        "an ignored STATE was taken: {:?}",
        host.seen.iter().map(|m| m.kind()).collect::<Vec<_>>()
    );
    // A newer offline ends it.
    host.publish("spBv1.0/STATE/scada", state(false, now_ms()), true).await;
    host.until("NDEATH once the host is offline", T, |m| m.kind() == "NDEATH").await;
    rig.running.stop().await.unwrap();
}
