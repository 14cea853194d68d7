//! Values to registers: the reverse of what a Modbus master decodes.
//!
//! Independent of fieldgate's decoder on purpose (see `plant.rs`).

use crate::plant::{Kind, Order, Point};
use crate::wave::SimValue;

/// Registers as sent on the wire for a value, per the point's type and word order.
/// Numbers are first turned back into raw units: `raw = (value - offset) / scale`,
/// rounded and clamped for integer types.
pub fn encode(p: &Point, order: Order, value: &SimValue) -> Vec<u16> {
    match p.kind {
        Some(Kind::String) => {
            let text = match value {
                SimValue::Text(t) => t.clone(),
                SimValue::Num(n) => format!("{n}"),
                SimValue::Bool(b) => b.to_string(),
            };
            encode_string(&text, p.width(), order)
        }
        _ => {
            let (regs, n) = encode_number(p, order, value);
            regs[..n].to_vec()
        }
    }
}

/// The registers of a point that is not a string, without allocating: they are the first
/// `n` of the array (a string point gives none).
pub fn encode_number(p: &Point, order: Order, value: &SimValue) -> ([u16; 4], usize) {
    let num = match value {
        SimValue::Num(n) => *n,
        SimValue::Bool(b) => f64::from(u8::from(*b)),
        SimValue::Text(_) => 0.0,
    };
    let raw = (num - p.offset()) / p.scale();
    let mut be = [0u8; 8];
    let n = match p.kind.unwrap_or(Kind::U16) {
        Kind::Bool => put(&mut be, &[0, u8::from(num >= 0.5)]),
        Kind::U16 => put(&mut be, &(clamp(raw, 0.0, 65535.0) as u16).to_be_bytes()),
        Kind::I16 => put(&mut be, &(clamp(raw, -32768.0, 32767.0) as i16).to_be_bytes()),
        Kind::U32 => put(&mut be, &(clamp(raw, 0.0, 4_294_967_295.0) as u32).to_be_bytes()),
        Kind::I32 => put(&mut be, &(clamp(raw, -2_147_483_648.0, 2_147_483_647.0) as i32).to_be_bytes()),
        Kind::U64 => put(&mut be, &(raw.round().max(0.0) as u64).to_be_bytes()),
        Kind::I64 => put(&mut be, &(raw.round() as i64).to_be_bytes()),
        Kind::F32 => put(&mut be, &(raw as f32).to_be_bytes()),
        Kind::F64 => put(&mut be, &raw.to_be_bytes()),
        Kind::String => 0,
    };
    let mut regs = [0u16; 4];
    let n = wire_into(&be[..n], order, &mut regs);
    (regs, n)
}

/// Copies `bytes` to the front of `buf`; how many.
fn put(buf: &mut [u8; 8], bytes: &[u8]) -> usize {
    buf[..bytes.len()].copy_from_slice(bytes);
    bytes.len()
}

fn clamp(raw: f64, lo: f64, hi: f64) -> f64 {
    raw.round().clamp(lo, hi)
}

/// Big-endian bytes A B C D … to registers in the given order.
pub fn wire(be: &[u8], order: Order) -> Vec<u16> {
    let mut regs = vec![0u16; be.len().div_ceil(2)];
    wire_into(be, order, &mut regs);
    regs
}

/// [`wire`] into the front of `regs`, which must hold them; how many registers.
fn wire_into(be: &[u8], order: Order, regs: &mut [u16]) -> usize {
    let n = be.len().div_ceil(2);
    for (r, c) in regs.iter_mut().zip(be.chunks(2)) {
        let (hi, lo) = (c[0], c.get(1).copied().unwrap_or(0));
        *r = match order {
            Order::BADC | Order::DCBA => u16::from_be_bytes([lo, hi]),
            Order::ABCD | Order::CDAB => u16::from_be_bytes([hi, lo]),
        };
    }
    if matches!(order, Order::CDAB | Order::DCBA) {
        regs[..n].reverse();
    }
    n
}

/// Two characters per register, first in the high byte (swapped for BADC and DCBA),
/// NUL-padded to `width` registers.
pub fn encode_string(text: &str, width: u16, order: Order) -> Vec<u16> {
    let mut bytes: Vec<u8> = text.bytes().take(width as usize * 2).collect();
    bytes.resize(width as usize * 2, 0);
    bytes
        .chunks(2)
        .map(|c| match order {
            Order::BADC | Order::DCBA => u16::from_be_bytes([c[1], c[0]]),
            _ => u16::from_be_bytes([c[0], c[1]]),
        })
        .collect()
}

/// What a correct master reads back for `value` through this point: the value after
/// the register round trip (integer rounding, f32 precision, string length), scaled.
pub fn expected(p: &Point, value: &SimValue) -> SimValue {
    if p.node_id.is_some() {
        // OPC UA carries the value itself: no registers, no quantisation.
        return match (value, p.kind_name.as_deref()) {
            (SimValue::Num(n), Some("status" | "alarm")) => SimValue::Bool(*n >= 0.5),
            (v, _) => v.clone(),
        };
    }
    let kind = p.kind.unwrap_or(Kind::U16);
    if p.bit.is_some()
        || p.table.is_some_and(|t| matches!(t, crate::plant::Table::Coil | crate::plant::Table::Discrete))
        || kind == Kind::Bool
    {
        return SimValue::Bool(match value {
            SimValue::Bool(b) => *b,
            SimValue::Num(n) => *n >= 0.5,
            SimValue::Text(_) => false,
        });
    }
    if kind == Kind::String {
        let SimValue::Text(t) = value else { return SimValue::Text(String::new()) };
        let cut: String = t.chars().take(p.width() as usize * 2).collect();
        return SimValue::Text(cut.trim_end().to_string());
    }
    let num = match value {
        SimValue::Num(n) => *n,
        SimValue::Bool(b) => f64::from(u8::from(*b)),
        SimValue::Text(_) => 0.0,
    };
    let raw = (num - p.offset()) / p.scale();
    let back = match kind {
        Kind::U16 => clamp(raw, 0.0, 65535.0),
        Kind::I16 => clamp(raw, -32768.0, 32767.0),
        Kind::U32 => clamp(raw, 0.0, 4_294_967_295.0),
        Kind::I32 => clamp(raw, -2_147_483_648.0, 2_147_483_647.0),
        Kind::U64 => raw.round().max(0.0) as u64 as f64,
        Kind::I64 => raw.round() as i64 as f64,
        Kind::F32 => f64::from(raw as f32),
        _ => raw,
    };
    SimValue::Num(back * p.scale() + p.offset())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_orders_of_a_float() {
        let be = 123.456f32.to_be_bytes(); // 42 F6 E9 79
        assert_eq!(wire(&be, Order::ABCD), [0x42F6, 0xE979]);
        assert_eq!(wire(&be, Order::CDAB), [0xE979, 0x42F6]);
        assert_eq!(wire(&be, Order::BADC), [0xF642, 0x79E9]);
        assert_eq!(wire(&be, Order::DCBA), [0x79E9, 0xF642]);
    }

    #[test]
    fn strings_pad_and_swap() {
        assert_eq!(encode_string("AB", 2, Order::ABCD), [0x4142, 0]);
        assert_eq!(encode_string("AB", 1, Order::BADC), [0x4241]);
    }
}
