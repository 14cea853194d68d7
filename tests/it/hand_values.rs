//! Bits, coils and strings against hand-written expected values.
//!
//! The simulator's `expected()` is the function the other Modbus tests compare against, and
//! it shares their assumptions (it counts characters, not bytes, and knows nothing of NUL
//! termination). Here the registers and bits are written out by hand, served by a
//! hand-framed Modbus TCP peer (no tokio-modbus on the serving side), and every expected
//! value is a literal.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use fieldgate::config::Config;
use fieldgate::registry::Registry;
use fieldgate::tools::ToolService;
use fieldgate_sim::Wave;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::support::*;

/// What the peer serves: registers by address, and the bits that are on.
#[derive(Default)]
struct Image {
    holding: HashMap<u16, u16>,
    input: HashMap<u16, u16>,
    coils: HashSet<u16>,
    discrete: HashSet<u16>,
}

/// Registers holding these bytes, two per register, the first in the high byte.
fn text_regs(at: u16, bytes: &[u8]) -> Vec<(u16, u16)> {
    assert!(bytes.len().is_multiple_of(2));
    bytes.chunks(2).enumerate().map(|(i, c)| (at + i as u16, u16::from_be_bytes([c[0], c[1]]))).collect()
}

/// Serves `image` over Modbus TCP on a free loopback port; returns the port.
async fn serve(image: Image) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let image = Arc::new(image);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let image = image.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 7];
                while stream.read_exact(&mut head).await.is_ok() {
                    let mut pdu = [0u8; 5];
                    if stream.read_exact(&mut pdu).await.is_err() {
                        return;
                    }
                    let start = u16::from_be_bytes([pdu[1], pdu[2]]);
                    let count = u16::from_be_bytes([pdu[3], pdu[4]]);
                    let data: Vec<u8> = match pdu[0] {
                        // Bits: the first one in the least significant bit of the first byte.
                        f @ (1 | 2) => {
                            let on = if f == 1 { &image.coils } else { &image.discrete };
                            let mut bytes = vec![0u8; usize::from(count).div_ceil(8)];
                            for i in 0..count {
                                if on.contains(&(start + i)) {
                                    bytes[usize::from(i / 8)] |= 1 << (i % 8);
                                }
                            }
                            bytes
                        }
                        f => {
                            let table = if f == 3 { &image.holding } else { &image.input };
                            (start..start + count)
                                .flat_map(|a| table.get(&a).copied().unwrap_or(0).to_be_bytes())
                                .collect()
                        }
                    };
                    let mut frame = vec![head[0], head[1], 0, 0];
                    frame.extend_from_slice(&(3 + data.len() as u16).to_be_bytes());
                    frame.extend_from_slice(&[head[6], pdu[0], data.len() as u8]);
                    frame.extend_from_slice(&data);
                    if stream.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A sensor of the peer's device file.
fn sensor(id: &str, table: &str, address: u16, rest: &str) -> String {
    format!(
        "\n[[sensors]]\nid = \"{id}\"\ndescription = \"{id}\"\nkind = \"status\"\nunit = \"\"\n\
         table = \"{table}\"\naddress = {address}\n{rest}\n"
    )
}

async fn read_all(service: &ToolService, ids: &[&str]) -> HashMap<String, Value> {
    let e = service.call("get_sensor_readings", json!({ "sensor_ids": ids })).await.unwrap();
    assert!(e.ok, "{:?}", e.error);
    let data = e.json();
    data["readings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["quality"], "good", "{r}");
            (r["sensor_id"].as_str().unwrap().to_string(), r["value"].clone())
        })
        .collect()
}

#[tokio::test]
async fn coils_discrete_inputs_register_bits_and_strings_decode_to_hand_written_values() {
    let mut image = Image {
        // Coils 0, 9 and 16 on: a reader packing bits from the high end, or off by a byte,
        // reads 7 or 8 instead.
        coils: [0, 9, 16].into(),
        discrete: [10].into(),
        ..Default::default()
    };
    image.holding.insert(40, 0x8002); // bits 15 and 1
    image.input.insert(3, 0x0100); // bit 8
    // Strings, byte by byte.
    image.holding.extend(text_regs(100, b"PUMP-1\0X")); // ends at the NUL
    image.holding.extend(text_regs(110, b"UPPM1-")); // BADC: characters swapped per register
    image.holding.extend(text_regs(120, "Grö\u{df}e-".as_bytes())); // 8 bytes, 6 characters
    image.holding.extend(text_regs(130, b"\0ABC")); // empty
    image.holding.extend(text_regs(140, b"AB  ")); // trailing spaces dropped
    image.holding.extend(text_regs(150, b"A B\x7f")); // DEL is not printable
    image.holding.extend(text_regs(160, b"ABCDEFGH")); // all bytes used, no NUL
    let port = serve(image).await;

    let mut file = format!(
        "id = \"t-img\"\nplant = \"T\"\nzone = \"IMG\"\ndescription = \"Hand-written image\"\n\
         protocol = \"modbus-tcp\"\nendpoint = \"127.0.0.1:{port}\"\n"
    );
    for (id, table, address, rest) in [
        ("T_IMG_001", "coil", 0, "type = \"bool\""),
        ("T_IMG_002", "coil", 7, "type = \"bool\""),
        ("T_IMG_003", "coil", 8, "type = \"bool\""),
        ("T_IMG_004", "coil", 9, "type = \"bool\""),
        ("T_IMG_005", "coil", 16, "type = \"bool\""),
        ("T_IMG_006", "discrete", 1, "type = \"bool\""),
        ("T_IMG_007", "discrete", 10, "type = \"bool\""),
        ("T_IMG_010", "holding", 40, "type = \"bool\"\nbit = 0"),
        ("T_IMG_011", "holding", 40, "type = \"bool\"\nbit = 1"),
        ("T_IMG_012", "holding", 40, "type = \"bool\"\nbit = 15"),
        ("T_IMG_013", "input", 3, "type = \"bool\"\nbit = 8"),
        ("T_IMG_014", "input", 3, "type = \"bool\"\nbit = 7"),
        ("T_IMG_020", "holding", 100, "type = \"string\"\nlength = 4"),
        ("T_IMG_021", "holding", 110, "type = \"string\"\nlength = 3\nword_order = \"BADC\""),
        ("T_IMG_022", "holding", 120, "type = \"string\"\nlength = 4"),
        ("T_IMG_023", "holding", 130, "type = \"string\"\nlength = 2"),
        ("T_IMG_024", "holding", 140, "type = \"string\"\nlength = 2"),
        ("T_IMG_025", "holding", 150, "type = \"string\"\nlength = 2"),
        ("T_IMG_026", "holding", 160, "type = \"string\"\nlength = 4"),
        ("T_IMG_027", "holding", 160, "type = \"string\"\nlength = 2"),
    ] {
        file.push_str(&sensor(id, table, address, rest));
    }
    let dir = device_dir(&[("t-img.toml", &file)]);
    let service = ToolService::new(Arc::new(Registry::load(dir.path()).unwrap()), Config::default());

    let want = [
        ("T_IMG_001", json!(true)),
        ("T_IMG_002", json!(false)),
        ("T_IMG_003", json!(false)),
        ("T_IMG_004", json!(true)),
        ("T_IMG_005", json!(true)),
        ("T_IMG_006", json!(false)),
        ("T_IMG_007", json!(true)),
        ("T_IMG_010", json!(false)),
        ("T_IMG_011", json!(true)),
        ("T_IMG_012", json!(true)),
        ("T_IMG_013", json!(true)),
        ("T_IMG_014", json!(false)),
        ("T_IMG_020", json!("PUMP-1")),
        ("T_IMG_021", json!("PUMP-1")),
        // Each byte outside printable ASCII is one `?`: ö and ß are two bytes each.
        ("T_IMG_022", json!("Gr????e-")),
        ("T_IMG_023", json!("")),
        ("T_IMG_024", json!("AB")),
        ("T_IMG_025", json!("A B?")),
        ("T_IMG_026", json!("ABCDEFGH")),
        ("T_IMG_027", json!("ABCD")),
    ];
    let ids: Vec<&str> = want.iter().map(|(id, _)| *id).collect();
    // Together (coalesced reads) and one by one (a read of exactly the point).
    let together = read_all(&service, &ids).await;
    for (id, value) in &want {
        assert_eq!(&together[*id], value, "{id} read in a batch");
        let alone = read_all(&service, &[id]).await;
        assert_eq!(&alone[*id], value, "{id} read alone");
    }
}

/// The demo plant's bit and string sensors through the simulator, with values set here and
/// results written out (not the simulator's own idea of what a master reads back).
#[tokio::test]
async fn demo_bits_and_strings_read_the_values_written_here() {
    let plant = demo_plant().await;
    plant.sim.freeze(Some(1.0));
    let on = |v: bool| Wave::Constant { value: if v { 1.0 } else { 0.0 } };
    let text = |t: &str| Wave::Text { text: t.into() };
    let bits = ["A_LINE1_008", "A_LINE1_009", "A_LINE1_010", "A_LINE1_011", "B_BOILER_006", "B_BOILER_007"];
    // Two patterns, so no bit reads right by being stuck.
    for pattern in [[true, false, true, false, true, false], [false, true, false, true, false, true]] {
        for (id, v) in bits.iter().zip(pattern) {
            plant.sim.set_wave(id, on(v));
        }
        let got = read_all(&plant.service, &bits).await;
        for (id, v) in bits.iter().zip(pattern) {
            assert_eq!(got[*id], json!(v), "{id} set to {v}");
        }
    }
    // A_LINE1_013 is 8 registers (16 bytes), B_BOILER_008 4 registers (8 bytes): the
    // limit is in bytes, and every non-ASCII byte reads as one `?`.
    for (line, boiler, want_line, want_boiler) in [
        ("RCP-0042 Saft", "V2.14", "RCP-0042 Saft", "V2.14"),
        ("Größe-12345678", "V2.14-rc3", "Gr????e-12345678", "V2.14-rc"),
        ("Größe-123456789", "Ölbad", "Gr????e-12345678", "??lbad"),
        ("AB\0CD", "  x  ", "AB", "  x"),
    ] {
        plant.sim.set_wave("A_LINE1_013", text(line));
        plant.sim.set_wave("B_BOILER_008", text(boiler));
        let got = read_all(&plant.service, &["A_LINE1_013", "B_BOILER_008"]).await;
        assert_eq!(got["A_LINE1_013"], json!(want_line), "{line:?}");
        assert_eq!(got["B_BOILER_008"], json!(want_boiler), "{boiler:?}");
    }
}
