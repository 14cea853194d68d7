//! The one cursor codec of the paging tools (`list_sensors`, `get_sensor_history`,
//! `list_work_orders`). A cursor is URL-safe base64 of a JSON object: the tool's own
//! position fields plus `f`, a fingerprint of the query it was issued for, so a cursor is
//! refused by any other query; then `.` and a tag of those bytes, keyed with a secret this
//! process drew at start (SipHash), so a cursor edited by hand (another range, another
//! position) is refused as not issued here. Cursors of an earlier process are refused the
//! same way: the agent starts the query over.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::envelope::ToolError;

/// FNV-1a of a query's text: the fingerprint a cursor carries.
pub(crate) fn fingerprint(query: &str) -> u64 {
    query.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

#[derive(Serialize, serde::Deserialize)]
struct Wrapped<T> {
    f: u64,
    #[serde(flatten)]
    at: T,
}

/// This process's key for cursor tags.
static KEY: std::sync::LazyLock<std::hash::RandomState> =
    std::sync::LazyLock::new(std::hash::RandomState::new);

fn tag(bytes: &[u8]) -> String {
    use std::hash::BuildHasher;
    URL_SAFE_NO_PAD.encode(KEY.hash_one(bytes).to_le_bytes())
}

/// The cursor for position `at` in the query with fingerprint `f`.
pub(crate) fn encode<T: Serialize>(at: T, f: u64) -> String {
    let body = serde_json::to_vec(&Wrapped { f, at }).unwrap_or_default();
    format!("{}.{}", URL_SAFE_NO_PAD.encode(&body), tag(&body))
}

/// How a tool names what it pages, in its refusals.
pub(crate) struct Paging {
    /// "this query": completes "the next_cursor of the previous page of …".
    pub this: &'static str,
    /// "another query": completes "`cursor` belongs to …".
    pub other: &'static str,
}

/// The position in `cursor`, when it was issued for the query with fingerprint `f`.
/// Anything else is an `INVALID_ARGUMENT` naming `cursor`, saying whether it is no
/// cursor of ours or one of another query.
pub(crate) fn decode<T: DeserializeOwned>(cursor: &str, f: u64, paging: &Paging) -> Result<T, ToolError> {
    let refuse = |message: &str| {
        ToolError::invalid(
            "cursor",
            Some(cursor),
            format!("the next_cursor of the previous page of {}", paging.this),
            message.to_string(),
            "Pass next_cursor from the previous page unchanged with the same arguments, or omit cursor to start over.",
        )
    };
    let wrapped: Wrapped<T> = cursor
        .split_once('.')
        .and_then(|(body, t)| URL_SAFE_NO_PAD.decode(body).ok().filter(|b| tag(b) == t))
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| refuse("`cursor` is not a cursor this service issued."))?;
    if wrapped.f != f {
        return Err(refuse(&format!("`cursor` belongs to {}.", paging.other)));
    }
    Ok(wrapped.at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct At {
        t: i64,
    }

    const P: Paging = Paging { this: "this query", other: "another query" };

    #[test]
    fn a_cursor_pages_only_its_own_query() {
        let c = encode(At { t: 42 }, fingerprint("q"));
        assert_eq!(decode::<At>(&c, fingerprint("q"), &P).unwrap(), At { t: 42 });
        let other = decode::<At>(&c, fingerprint("other"), &P).unwrap_err();
        assert_eq!(other.message, "`cursor` belongs to another query.");
        assert_eq!(other.expected.as_deref(), Some("the next_cursor of the previous page of this query"));
        // Edited by hand: the same query's cursor at another position.
        let (_, t) = c.split_once('.').unwrap();
        let edited = format!("{}.{t}", URL_SAFE_NO_PAD.encode(br#"{"f":0,"t":7}"#));
        let forged =
            format!("{}.{t}", URL_SAFE_NO_PAD.encode(format!(r#"{{"f":{},"t":7}}"#, fingerprint("q"))));
        for garbage in ["", "!!", "e30", "e30.", &URL_SAFE_NO_PAD.encode(b"{\"f\":1}"), &edited, &forged] {
            let e = decode::<At>(garbage, fingerprint("q"), &P).unwrap_err();
            assert!(e.message.contains("not a cursor this service issued"), "{garbage}: {}", e.message);
        }
    }
}
