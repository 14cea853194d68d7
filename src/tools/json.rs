//! A few JSON writers for the one output written by hand: the readings of a batch.
//!
//! The document is built as a `String` from `str` pieces, so it needs no UTF-8 check at
//! the end. Numbers are written as serde_json writes them (a test holds the whole reading
//! equal to serde's); strings skip the escape pass when they need none.

use std::fmt::Write as _;

/// A JSON string, quoted and escaped exactly as serde_json escapes it.
pub(crate) fn string(out: &mut String, s: &str) {
    // serde_json escapes `"`, `\` and control characters, nothing else.
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        plain(out, s);
    } else {
        // Rare (units and texts with quotes or control characters): serde's own escaping.
        out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "null".into()));
    }
}

/// A string that needs no escaping by construction (IDs of a checked grammar, timestamps
/// written by chrono): quoted without looking at it again.
pub(crate) fn plain(out: &mut String, s: &str) {
    debug_assert!(s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\'), "{s}");
    out.push('"');
    out.push_str(s);
    out.push('"');
}

/// A number as serde_json writes an `f64` (null when not finite).
pub(crate) fn number(out: &mut String, v: f64) {
    out.push_str(&serde_json::to_string(&v).unwrap_or_else(|_| "null".into()));
}

pub(crate) fn signed(out: &mut String, v: i64) {
    let _ = write!(out, "{v}");
}

pub(crate) fn unsigned(out: &mut String, v: u64) {
    let _ = write!(out, "{v}");
}

pub(crate) fn boolean(out: &mut String, b: bool) {
    out.push_str(if b { "true" } else { "false" });
}

/// ±digits·10^-scale: a value rounded to significant digits, whose digits are known.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decimal {
    pub negative: bool,
    pub digits: u64,
    pub scale: i32,
}

/// Writes `d` as serde_json writes the f64 nearest to it, when that f64's shortest form is
/// d's digits (see `reading_json::rounded`) and serde_json would write it without an exponent
/// (first digit from 10^-5 to 10^15). Writes nothing and returns false otherwise.
pub(crate) fn decimal(out: &mut String, d: Decimal) -> bool {
    if d.digits == 0 {
        return false;
    }
    let mut buf = itoa::Buffer::new();
    let all = buf.format(d.digits);
    let digits = all.trim_end_matches('0');
    let n = digits.len() as i32;
    // The decimal exponent of the first digit.
    let e = all.len() as i32 - 1 - d.scale;
    if !(-5..=15).contains(&e) {
        return false;
    }
    if d.negative {
        out.push('-');
    }
    if n - 1 <= e {
        // 1234e2 → 123400.0
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', (e + 1 - n) as usize));
        out.push_str(".0");
    } else if e >= 0 {
        // 1234e-2 → 12.34
        let (whole, part) = digits.split_at(e as usize + 1);
        out.push_str(whole);
        out.push('.');
        out.push_str(part);
    } else {
        // 1234e-6 → 0.001234
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-e - 1) as usize));
        out.push_str(digits);
    }
    true
}

/// A document written here, as tool data.
pub(crate) fn into_data(out: String) -> super::ToolResult {
    Ok(super::envelope::Data::written(out))
}
