//! Every Modbus register type × word order × scaling, end to end: the real binary reads the
//! raw-socket peer (`raw_modbus::Peer`, frames built by hand: Modbus TCP, and RTU with its
//! CRC over TCP), and each value an agent gets is compared with one computed here from the
//! bytes with the standard library (`from_be_bytes`), never with the driver's decoder.
//!
//! The registers for each word order are laid out from the value's big-endian bytes by the
//! documented rule (docs/device-files.md, "Word orders"): "backwards" orders (`CDAB`,
//! `DCBA`) reverse the registers, "swapped" ones (`BADC`, `DCBA`) swap the two bytes of each.

use std::time::Duration;

use fieldgate::transport::client::HttpClient;
use serde_json::{Value, json};

use super::raw_modbus::{Framing, Peer};
use super::support::{self, device_dir};

/// A type, the value's big-endian bytes, and the value they hold as the test computes it.
struct Case {
    ty: &'static str,
    bytes: Vec<u8>,
    /// The exact value as JSON text, for integers; the number, for floats.
    exact: Option<String>,
    number: f64,
}

fn cases() -> Vec<Case> {
    let int = |ty, bytes: Vec<u8>, exact: String, number: f64| Case { ty, bytes, exact: Some(exact), number };
    let u16v = u16::from_be_bytes([0xBE, 0xEF]);
    let i16v = i16::from_be_bytes([0xFF, 0x85]);
    let u32v = u32::from_be_bytes([0xDE, 0xAD, 0xBE, 0xEF]);
    let i32v = i32::from_be_bytes([0xFF, 0xFF, 0xCF, 0xC7]);
    let u64b = [0xFE, 0xDC, 0xBA, 0x98, 0x76, 0x54, 0x32, 0x10];
    let i64b = (-1_234_567_890_123_456_789i64).to_be_bytes();
    let f32b = [0x42, 0xF6, 0xE9, 0x79];
    let f64b = (-9876.54321f64).to_be_bytes();
    vec![
        int("u16", vec![0xBE, 0xEF], u16v.to_string(), f64::from(u16v)),
        int("i16", vec![0xFF, 0x85], i16v.to_string(), f64::from(i16v)),
        int("u32", vec![0xDE, 0xAD, 0xBE, 0xEF], u32v.to_string(), f64::from(u32v)),
        int("i32", vec![0xFF, 0xFF, 0xCF, 0xC7], i32v.to_string(), f64::from(i32v)),
        int("u64", u64b.to_vec(), u64::from_be_bytes(u64b).to_string(), u64::from_be_bytes(u64b) as f64),
        int("i64", i64b.to_vec(), i64::from_be_bytes(i64b).to_string(), i64::from_be_bytes(i64b) as f64),
        Case { ty: "f32", bytes: f32b.to_vec(), exact: None, number: f64::from(f32::from_be_bytes(f32b)) },
        Case { ty: "f64", bytes: f64b.to_vec(), exact: None, number: f64::from_be_bytes(f64b) },
    ]
}

const ORDERS: [&str; 4] = ["ABCD", "BADC", "CDAB", "DCBA"];
/// (scale, offset): none, and one of each.
const SCALINGS: [Option<(f64, f64)>; 2] = [None, Some((0.1, -40.0))];

/// The registers that carry `bytes` (big-endian) in `order`.
fn registers(bytes: &[u8], order: &str) -> Vec<u16> {
    let swapped = matches!(order, "BADC" | "DCBA");
    let backwards = matches!(order, "CDAB" | "DCBA");
    let mut regs: Vec<u16> = bytes
        .chunks(2)
        .map(|c| if swapped { u16::from_le_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], c[1]]) })
        .collect();
    if backwards {
        regs.reverse();
    }
    regs
}

/// What one sensor must read as.
enum Want {
    /// This JSON text exactly.
    Exact(String),
    /// This number, to `rel` relative precision (the significant digits readings keep).
    Near(f64, f64),
}

/// Per sensor ID what it must read: normalized, then raw.
type Wants = Vec<(String, Want, Want)>;

/// The device file, the registers to serve, and what each sensor must read.
fn table(peer: &Peer, framing: Framing) -> (String, Vec<(u16, u16)>, Wants) {
    let port = peer.port;
    let line = match (peer.serial_path(), framing) {
        (Some(path), _) => format!("protocol = \"modbus-rtu\"\nendpoint = \"{path}\"\n"),
        (None, Framing::Tcp) => format!("protocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:{port}\"\n"),
        (None, Framing::Rtu) => {
            format!("protocol = \"modbus-rtu-over-tcp\"\nendpoint = \"127.0.0.1:{port}\"\n")
        }
    };
    let serial =
        if peer.serial_path().is_some() { "[serial]\nbaud_rate = 115200\nparity = \"none\"\n" } else { "" };
    let mut file = format!(
        "id = \"t-table\"\nplant = \"T\"\nzone = \"TABLE\"\ndescription = \"Raw-socket peer\"\n\
         {line}unit_id = 17\ntimeout_ms = 1000\npoll_interval_ms = 0\nmax_gap = 0\n{serial}"
    );
    let (mut regs, mut wants) = (Vec::new(), Vec::new());
    let mut address = 100u16;
    for case in cases() {
        for order in ORDERS {
            for scaling in SCALINGS {
                let id = format!("T_TABLE_{:03}", wants.len() + 1);
                let mut extra = String::new();
                if let Some((scale, offset)) = scaling {
                    extra = format!("scale = {scale}\noffset = {offset}\n");
                }
                file += &format!(
                    "\n[[sensors]]\nid = \"{id}\"\ndescription = \"{} {order} {scaling:?}\"\nkind = \"count\"\n\
                     unit = \"count\"\ntable = \"holding\"\naddress = {address}\ntype = \"{}\"\n\
                     word_order = \"{order}\"\n{extra}",
                    case.ty, case.ty
                );
                for (i, r) in registers(&case.bytes, order).into_iter().enumerate() {
                    regs.push((address + i as u16, r));
                }
                address += 4;
                // f32 values keep 7 significant digits; scaled integers 12; f64 as decoded.
                let digits = match case.ty {
                    "f32" => 5e-7,
                    "f64" => 1e-15,
                    _ => 5e-12,
                };
                let raw = match &case.exact {
                    Some(text) => Want::Exact(text.clone()),
                    None => Want::Near(case.number, digits),
                };
                let normalized = match (scaling, &case.exact) {
                    (None, Some(text)) => Want::Exact(text.clone()),
                    (None, None) => Want::Near(case.number, digits),
                    (Some((scale, offset)), _) => Want::Near(case.number * scale + offset, digits.max(5e-12)),
                };
                wants.push((id, normalized, raw));
            }
        }
    }
    // Bits of one register, and a text.
    let word = 0b1000_0000_0010_0101u16;
    regs.push((address, word));
    for bit in [0u16, 1, 2, 5, 15] {
        let id = format!("T_TABLE_{:03}", wants.len() + 1);
        file += &format!(
            "\n[[sensors]]\nid = \"{id}\"\ndescription = \"bit {bit}\"\nkind = \"state\"\nunit = \"\"\n\
             table = \"holding\"\naddress = {address}\ntype = \"bool\"\nbit = {bit}\n"
        );
        let on = (word >> bit) & 1 == 1;
        wants.push((id, Want::Exact(on.to_string()), Want::Exact(on.to_string())));
    }
    address += 1;
    let text = b"PUMP-07A";
    for (i, c) in text.chunks(2).enumerate() {
        regs.push((address + i as u16, u16::from_be_bytes([c[0], c[1]])));
    }
    let id = format!("T_TABLE_{:03}", wants.len() + 1);
    file += &format!(
        "\n[[sensors]]\nid = \"{id}\"\ndescription = \"tag\"\nkind = \"state\"\nunit = \"\"\n\
         table = \"holding\"\naddress = {address}\ntype = \"string\"\nlength = 4\n"
    );
    let shown = format!("\"{}\"", std::str::from_utf8(text).unwrap());
    wants.push((id, Want::Exact(shown.clone()), Want::Exact(shown)));
    (file, regs, wants)
}

/// Each reading's `"value":…` as written, by sensor ID.
fn values(body: &str) -> Vec<(String, String)> {
    let v: Value = serde_json::from_str(body).unwrap();
    let readings = v["data"]["readings"].as_array().unwrap_or_else(|| panic!("readings: {body}"));
    // The text as written, not re-serialized: integers must keep every digit.
    let written: Vec<String> = body
        .match_indices("\"value\":")
        .map(|(i, m)| body[i + m.len()..].chars().take_while(|c| !matches!(c, ',' | '}')).collect())
        .collect();
    assert_eq!(written.len(), readings.len(), "one value per reading: {body}");
    readings.iter().zip(written).map(|(r, w)| (r["sensor_id"].as_str().unwrap().to_string(), w)).collect()
}

fn check(id: &str, got: &str, want: &Want, form: &str) -> Option<String> {
    match want {
        Want::Exact(text) if got == text => None,
        Want::Near(x, rel) if got.parse::<f64>().is_ok_and(|g| (g - x).abs() <= x.abs() * rel) => None,
        Want::Exact(text) => Some(format!("{id} {form}: {got}, want {text}")),
        Want::Near(x, rel) => Some(format!("{id} {form}: {got}, want {x} (±{rel} relative)")),
    }
}

async fn run(peer: Peer, framing: Framing) {
    let (file, regs, wants) = table(&peer, framing);
    peer.set_registers(&regs);
    let devices = device_dir(&[("t-table.toml", &file)]);
    let data = tempfile::tempdir().unwrap();
    let mut served = support::serve_binary(devices.path(), data.path(), &[]).await;
    let _stderr = served.drain_stderr();
    let mut client = HttpClient::connect(served.addr).await.unwrap();
    let ids: Vec<&str> = wants.iter().map(|w| w.0.as_str()).collect();
    let mut wrong = Vec::new();
    for (unit, form) in [(None, "normalized"), (Some("raw"), "raw")] {
        let mut args = json!({"sensor_ids": ids});
        if let Some(u) = unit {
            args["unit"] = json!(u);
        }
        let res = tokio::time::timeout(
            Duration::from_secs(30),
            client.post("/v1/tools/get_sensor_readings", args.to_string().as_bytes()),
        )
        .await
        .expect("the readings within 30 s")
        .unwrap();
        let body = String::from_utf8(res.body).unwrap();
        assert_eq!(res.status, 200, "{body}");
        let got = values(&body);
        assert_eq!(got.len(), wants.len(), "{body}");
        for ((id, value), (want_id, normalized, raw)) in got.iter().zip(&wants) {
            assert_eq!(id, want_id);
            let want = if form == "raw" { raw } else { normalized };
            wrong.extend(check(id, value, want, form));
        }
    }
    assert!(wrong.is_empty(), "{} of {} wrong:\n{}", wrong.len(), 2 * wants.len(), wrong.join("\n"));
    served.child.start_kill().unwrap();
    let _ = crate::support::exited(&mut served.child, "served").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_word_order_and_scaling_over_modbus_tcp() {
    run(Peer::start(Framing::Tcp).await, Framing::Tcp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_word_order_and_scaling_over_rtu_over_tcp() {
    run(Peer::start(Framing::Rtu).await, Framing::Rtu).await;
}

/// RTU with its CRC on a serial line: a pseudo-terminal pair, the raw peer on one end and
/// `fieldgate serve` on the other (as it would open /dev/ttyUSB0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_word_order_and_scaling_over_rtu_on_a_serial_line() {
    run(Peer::start_serial(), Framing::Rtu).await;
}

/// The rule the table lays registers out by, against the documentation's own example
/// (123.456 as f32 is 42 F6 E9 79).
#[test]
fn registers_follow_the_documented_example() {
    let bytes = [0x42, 0xF6, 0xE9, 0x79];
    assert_eq!(registers(&bytes, "ABCD"), [0x42F6, 0xE979]);
    assert_eq!(registers(&bytes, "CDAB"), [0xE979, 0x42F6]);
    assert_eq!(registers(&bytes, "BADC"), [0xF642, 0x79E9]);
    assert_eq!(registers(&bytes, "DCBA"), [0x79E9, 0xF642]);
}
