//! A few JSON writers for the one output written by hand: the readings of a batch.
//!
//! Numbers go through serde_json's own serializer, so a hand-written document has the
//! same bytes as a derived one; strings skip the escape pass when they need none.

use serde::Serializer as _;

/// A JSON string, quoted and escaped exactly as serde_json escapes it.
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    // serde_json escapes `"`, `\` and control characters, nothing else.
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::Serializer::new(&mut *out).serialize_str(s);
    }
}

/// A string that needs no escaping by construction (IDs of a checked grammar, timestamps
/// written by chrono): quoted without looking at it again.
pub(crate) fn plain(out: &mut Vec<u8>, s: &str) {
    debug_assert!(s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\'), "{s}");
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// A number as serde_json writes an `f64` (null when not finite).
pub(crate) fn number(out: &mut Vec<u8>, v: f64) {
    let _ = serde_json::Serializer::new(&mut *out).serialize_f64(v);
}

/// ±digits·10^-scale: a value rounded to significant digits, whose digits are known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decimal {
    pub negative: bool,
    pub digits: u64,
    pub scale: i32,
}

/// Writes `d` as serde_json writes the f64 nearest to it, when that f64's shortest form is
/// d's digits (see `readings::rounded`) and serde_json would write it without an exponent
/// (first digit from 10^-5 to 10^15). Writes nothing and returns false otherwise.
pub(crate) fn decimal(out: &mut Vec<u8>, d: Decimal) -> bool {
    let (mut m, mut scale) = (d.digits, d.scale);
    if m == 0 {
        return false;
    }
    while m % 10 == 0 {
        m /= 10;
        scale -= 1;
    }
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    while m > 0 {
        at -= 1;
        buf[at] = b'0' + (m % 10) as u8;
        m /= 10;
    }
    let digits = &buf[at..];
    let n = digits.len() as i32;
    // The decimal exponent of the first digit.
    let e = n - 1 - scale;
    if !(-5..=15).contains(&e) {
        return false;
    }
    if d.negative {
        out.push(b'-');
    }
    if n - 1 <= e {
        // 1234e2 → 123400.0
        out.extend_from_slice(digits);
        out.resize(out.len() + (e + 1 - n) as usize, b'0');
        out.extend_from_slice(b".0");
    } else if e >= 0 {
        // 1234e-2 → 12.34
        let (whole, part) = digits.split_at(e as usize + 1);
        out.extend_from_slice(whole);
        out.push(b'.');
        out.extend_from_slice(part);
    } else {
        // 1234e-6 → 0.001234
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-e - 1) as usize, b'0');
        out.extend_from_slice(digits);
    }
    true
}

pub(crate) fn unsigned(out: &mut Vec<u8>, v: u64) {
    let _ = serde_json::Serializer::new(&mut *out).serialize_u64(v);
}

pub(crate) fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// A document written here, as tool data.
pub(crate) fn into_data(out: Vec<u8>) -> super::ToolResult {
    // Everything written here is UTF-8 already (str slices and ASCII); this is the check.
    let text = String::from_utf8(out).map_err(|_| super::ToolError::internal())?;
    Ok(super::envelope::Data::written(text))
}
