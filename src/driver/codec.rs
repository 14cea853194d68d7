//! Decoding Modbus registers into values: types, word orders, bits, strings, scaling.
//!
//! Word orders are two independent switches (docs/device-files.md): `CDAB` reverses the
//! register order, `BADC` swaps the two bytes inside each register, `DCBA` does both.
//! Decoding undoes them to get the big-endian bytes `A B C D …`, then reads the type.

use crate::registry::{DataType, ModbusPoint, WordOrder};

/// A decoded value before scale and offset.
#[derive(Debug, Clone, PartialEq)]
pub enum RawValue {
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Text(String),
}

impl RawValue {
    /// The value as a number, when it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            RawValue::Int(i) => Some(*i as f64),
            RawValue::UInt(u) => Some(*u as f64),
            RawValue::Float(f) => Some(*f),
            RawValue::Bool(_) | RawValue::Text(_) => None,
        }
    }
}

/// The device's registers do not hold a value of the declared shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected} registers, got {got}")]
pub struct DecodeError {
    pub expected: usize,
    pub got: usize,
}

/// Big-endian bytes `A B C D …` from up to four registers as they came off the wire, in
/// the first `2 * regs.len()` bytes (numbers span at most four registers).
fn canonical_bytes(regs: &[u16], order: WordOrder) -> [u8; 8] {
    let mut bytes = [0u8; 8];
    let n = regs.len().min(4);
    for (k, r) in regs[..n].iter().enumerate() {
        let [hi, lo] = r.to_be_bytes();
        let pair = if order.swaps_bytes() { [lo, hi] } else { [hi, lo] };
        let at = if order.swaps_words() { n - 1 - k } else { k };
        bytes[2 * at..2 * at + 2].copy_from_slice(&pair);
    }
    bytes
}

/// Decodes a register-table point from exactly `point.count` registers.
#[inline]
pub fn decode_registers(point: &ModbusPoint, regs: &[u16]) -> Result<RawValue, DecodeError> {
    if regs.len() != point.count as usize {
        return Err(DecodeError { expected: point.count as usize, got: regs.len() });
    }
    if let Some(bit) = point.bit {
        return Ok(RawValue::Bool(regs[0] >> bit & 1 == 1));
    }
    if point.data_type != DataType::String && regs.len() > 4 {
        // No number is wider than four registers; the registry never declares one.
        return Err(DecodeError {
            expected: point.data_type.registers().unwrap_or(4) as usize,
            got: regs.len(),
        });
    }
    let b = canonical_bytes(regs, point.word_order);
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[8 - n..].copy_from_slice(&b[..n]);
        a
    };
    Ok(match point.data_type {
        DataType::Bool => RawValue::Bool(regs[0] != 0),
        DataType::U16 => RawValue::UInt(u64::from(u16::from_be_bytes([b[0], b[1]]))),
        DataType::I16 => RawValue::Int(i64::from(i16::from_be_bytes([b[0], b[1]]))),
        DataType::U32 => RawValue::UInt(u64::from_be_bytes(arr(4))),
        DataType::I32 => RawValue::Int(i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))),
        DataType::U64 => RawValue::UInt(u64::from_be_bytes(arr(8))),
        DataType::I64 => RawValue::Int(i64::from_be_bytes(arr(8))),
        DataType::F32 => RawValue::Float(f64::from(f32::from_be_bytes([b[0], b[1], b[2], b[3]]))),
        DataType::F64 => RawValue::Float(f64::from_be_bytes(arr(8))),
        DataType::String => RawValue::Text(decode_string(regs, point.word_order)),
    })
}

/// Strings: two characters per register, first character in the high byte; `BADC` and
/// `DCBA` swap the two characters of each register (register order is never reversed).
/// The text ends at the first NUL; trailing spaces are dropped; anything but printable
/// ASCII becomes `?`, so no device can send control characters to the agent.
pub fn decode_string(regs: &[u16], order: WordOrder) -> String {
    let mut out = String::with_capacity(regs.len() * 2);
    'regs: for r in regs {
        let [hi, lo] = r.to_be_bytes();
        let pair = if order.swaps_bytes() { [lo, hi] } else { [hi, lo] };
        for c in pair {
            if c == 0 {
                break 'regs;
            }
            out.push(if (0x20..0x7f).contains(&c) { c as char } else { '?' });
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// Applies scale and offset to a numeric value; booleans and strings pass unchanged.
pub fn normalize(point: &ModbusPoint, raw: &RawValue) -> RawValue {
    match raw.as_f64() {
        Some(v) => RawValue::Float(scaled(point, v)),
        None => raw.clone(),
    }
}

/// A decoded number in engineering units: scale, then offset.
pub fn scaled(point: &ModbusPoint, v: f64) -> f64 {
    v * point.scale + point.offset
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RegisterTable;
    use WordOrder::*;

    fn point(t: DataType, order: WordOrder) -> ModbusPoint {
        let count = t.registers().unwrap_or(4);
        ModbusPoint {
            table: RegisterTable::Holding,
            address: 0,
            data_type: t,
            word_order: order,
            bit: None,
            count,
            scale: 1.0,
            offset: 0.0,
        }
    }

    /// Registers as they appear on the wire, written out by hand from the byte sequence.
    fn regs(bytes: &[u8]) -> Vec<u16> {
        bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect()
    }

    #[test]
    fn a_number_wider_than_four_registers_is_refused_not_truncated() {
        let mut p = point(DataType::F64, ABCD);
        p.count = 5;
        assert_eq!(decode_registers(&p, &[0; 5]), Err(DecodeError { expected: 4, got: 5 }));
        p.count = 4;
        assert_eq!(decode_registers(&p, &[0x3ff0, 0, 0, 0]), Ok(RawValue::Float(1.0)));
    }

    #[test]
    fn f32_123_456_in_every_word_order() {
        // 123.456f32 = 0x42F6E979: A=42 B=F6 C=E9 D=79.
        for (order, wire) in [
            (ABCD, [0x42, 0xF6, 0xE9, 0x79]),
            (BADC, [0xF6, 0x42, 0x79, 0xE9]),
            (CDAB, [0xE9, 0x79, 0x42, 0xF6]),
            (DCBA, [0x79, 0xE9, 0xF6, 0x42]),
        ] {
            let v = decode_registers(&point(DataType::F32, order), &regs(&wire)).unwrap();
            assert_eq!(v, RawValue::Float(f64::from(123.456f32)), "{order:?}");
        }
    }

    #[test]
    fn f64_123_456_in_every_word_order() {
        // 123.456f64 = 0x405EDD2F1A9FBE77.
        let abcd = [0x40, 0x5E, 0xDD, 0x2F, 0x1A, 0x9F, 0xBE, 0x77];
        for (order, wire) in [
            (ABCD, abcd),
            (BADC, [0x5E, 0x40, 0x2F, 0xDD, 0x9F, 0x1A, 0x77, 0xBE]),
            (CDAB, [0xBE, 0x77, 0x1A, 0x9F, 0xDD, 0x2F, 0x40, 0x5E]),
            (DCBA, [0x77, 0xBE, 0x9F, 0x1A, 0x2F, 0xDD, 0x5E, 0x40]),
        ] {
            let v = decode_registers(&point(DataType::F64, order), &regs(&wire)).unwrap();
            assert_eq!(v, RawValue::Float(123.456), "{order:?}");
        }
    }

    #[test]
    fn integers_in_every_word_order() {
        // 0x12345678 as u32 and -2 as i32 (0xFFFFFFFE).
        let cases: [(WordOrder, [u8; 4], [u8; 4]); 4] = [
            (ABCD, [0x12, 0x34, 0x56, 0x78], [0xFF, 0xFF, 0xFF, 0xFE]),
            (BADC, [0x34, 0x12, 0x78, 0x56], [0xFF, 0xFF, 0xFE, 0xFF]),
            (CDAB, [0x56, 0x78, 0x12, 0x34], [0xFF, 0xFE, 0xFF, 0xFF]),
            (DCBA, [0x78, 0x56, 0x34, 0x12], [0xFE, 0xFF, 0xFF, 0xFF]),
        ];
        for (order, u, i) in cases {
            assert_eq!(
                decode_registers(&point(DataType::U32, order), &regs(&u)).unwrap(),
                RawValue::UInt(0x1234_5678)
            );
            assert_eq!(decode_registers(&point(DataType::I32, order), &regs(&i)).unwrap(), RawValue::Int(-2));
        }
        // 64-bit: 0x0102030405060708.
        let abcd = [1, 2, 3, 4, 5, 6, 7, 8];
        for (order, wire) in [
            (ABCD, abcd),
            (BADC, [2, 1, 4, 3, 6, 5, 8, 7]),
            (CDAB, [7, 8, 5, 6, 3, 4, 1, 2]),
            (DCBA, [8, 7, 6, 5, 4, 3, 2, 1]),
        ] {
            assert_eq!(
                decode_registers(&point(DataType::U64, order), &regs(&wire)).unwrap(),
                RawValue::UInt(0x0102_0304_0506_0708)
            );
        }
        let minus_three = (-3i64).to_be_bytes();
        assert_eq!(
            decode_registers(&point(DataType::I64, ABCD), &regs(&minus_three)).unwrap(),
            RawValue::Int(-3)
        );
        // 16-bit values: a single register; byte swap applies, word swap cannot.
        assert_eq!(decode_registers(&point(DataType::I16, ABCD), &[0xFF38]).unwrap(), RawValue::Int(-200));
        assert_eq!(decode_registers(&point(DataType::I16, CDAB), &[0xFF38]).unwrap(), RawValue::Int(-200));
        assert_eq!(decode_registers(&point(DataType::I16, BADC), &[0x38FF]).unwrap(), RawValue::Int(-200));
        assert_eq!(decode_registers(&point(DataType::U16, ABCD), &[0xFFFF]).unwrap(), RawValue::UInt(65535));
    }

    #[test]
    fn bits_of_a_register() {
        let mut p = point(DataType::Bool, ABCD);
        for (bit, want) in [(0, true), (1, false), (3, true), (15, true), (14, false)] {
            p.bit = Some(bit);
            assert_eq!(
                decode_registers(&p, &[0b1000_0000_0000_1001]).unwrap(),
                RawValue::Bool(want),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn a_bool_without_a_bit_is_true_when_its_register_is_not_zero() {
        let p = point(DataType::Bool, ABCD);
        for (reg, want) in [(0x0000, false), (0x0001, true), (0x0100, true), (0x8000, true), (0xFFFF, true)] {
            assert_eq!(decode_registers(&p, &[reg]).unwrap(), RawValue::Bool(want), "{reg:#06x}");
        }
    }

    #[test]
    fn strings() {
        let mut p = point(DataType::String, ABCD);
        p.count = 4;
        // "PUMP-1" then NUL padding.
        assert_eq!(decode_registers(&p, &regs(b"PUMP-1\0\0")).unwrap(), RawValue::Text("PUMP-1".into()));
        // Space padding is trimmed; byte-swapped devices send "UPPM1-".
        assert_eq!(decode_string(&regs(b"AB  "), ABCD), "AB");
        assert_eq!(decode_string(&regs(b"UPPM1-"), BADC), "PUMP-1");
        // Control characters never reach the agent.
        assert_eq!(decode_string(&regs(b"A\x1bB\n"), ABCD), "A?B?");
    }

    #[test]
    fn scale_and_offset() {
        let mut p = point(DataType::I16, ABCD);
        p.scale = 0.1;
        p.offset = -40.0;
        let raw = decode_registers(&p, &[723]).unwrap();
        assert_eq!(raw, RawValue::Int(723));
        let RawValue::Float(v) = normalize(&p, &raw) else { panic!() };
        assert!((v - 32.3).abs() < 1e-9, "{v}");
        // Booleans and strings are not scaled.
        assert_eq!(normalize(&p, &RawValue::Bool(true)), RawValue::Bool(true));
    }

    #[test]
    fn wrong_register_count_is_an_error() {
        let e = decode_registers(&point(DataType::F32, ABCD), &[1]).unwrap_err();
        assert_eq!(e, DecodeError { expected: 2, got: 1 });
    }
}
