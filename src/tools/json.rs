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
