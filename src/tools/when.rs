//! Instants as agents write them: an RFC 3339 instant, `now`, or a duration before now
//! (`-15m`, `-2h`, `-7d`, `-30s`, and ISO 8601 `PT15M`, `P1D`, `P1DT12H`). Agents rarely know
//! the current time, so "the last hour" must not need it. Months and years are refused:
//! their length depends on the calendar.

use chrono::DateTime;

use super::envelope::ToolError;

/// What `param` accepts, for error messages and schema descriptions.
pub const EXPECTED: &str = "an RFC 3339 instant with a zone (2026-11-29T08:00:00Z), now, or a duration before now (-15m, -2h, -7d, PT15M, P1D)";

/// How far ahead of this clock a caller's `to` may be (clocks differ by a little).
pub const SKEW_MS: i64 = 5_000;

/// `from` and `to` (default now) resolved against `now_ms` and checked: from 1970 on,
/// `to` not in the future, `from` before `to`.
pub fn range(from: &str, to: Option<&str>, now_ms: i64) -> Result<(i64, i64), ToolError> {
    let start = instant("from", from, now_ms)?;
    let end = match to {
        Some(raw) => instant("to", raw, now_ms)?,
        None => now_ms,
    };
    checked(start, end, from, to.unwrap_or(""), now_ms)
}

/// A resolved range checked as [`range`] does (`from_raw`, `to_raw`: what was sent).
fn checked(from: i64, to: i64, from_raw: &str, to_raw: &str, now_ms: i64) -> Result<(i64, i64), ToolError> {
    let invalid = |param: &str, raw: &str, expected: &str, message: String, hint: &str| {
        ToolError::invalid(param, Some(raw), expected, message, hint)
    };
    // Nothing is kept from before 1970 (and range arithmetic stays in range).
    for (param, t, raw) in [("from", from, from_raw), ("to", to, to_raw)] {
        if t < 0 {
            return Err(invalid(
                param,
                raw,
                "an instant from 1970-01-01T00:00:00Z to now",
                format!("`{param}` is before 1970-01-01T00:00:00Z."),
                "Send an instant since 1970, such as -7d or 2026-11-29T08:00:00Z.",
            ));
        }
    }
    if to > now_ms + SKEW_MS {
        return Err(invalid(
            "to",
            to_raw,
            "an instant not in the future",
            "`to` is in the future.".into(),
            "Omit `to` to mean now.",
        ));
    }
    if from >= to {
        return Err(invalid(
            "from",
            from_raw,
            "an instant before `to`",
            "`from` must be before `to`.".into(),
            "Swap the two, or widen the range.",
        ));
    }
    Ok((from, to))
}

/// `raw` as milliseconds since the epoch, durations taken back from `now_ms`.
pub fn instant(param: &str, raw: &str, now_ms: i64) -> Result<i64, ToolError> {
    let s = raw.trim();
    let parsed = if s.eq_ignore_ascii_case("now") {
        Some(now_ms)
    } else if let Some(short) = s.strip_prefix('-') {
        short_duration(short).map(|d| now_ms.saturating_sub(d))
    } else if s.starts_with('P') || s.starts_with('p') {
        iso_duration(s).map(|d| now_ms.saturating_sub(d))
    } else {
        DateTime::parse_from_rfc3339(s).ok().map(|d| d.timestamp_millis())
    };
    parsed.ok_or_else(|| {
        ToolError::invalid(
            param,
            Some(raw),
            EXPECTED,
            format!("`{param}` is not an instant fieldgate understands."),
            "Send an RFC 3339 instant such as 2026-11-29T08:00:00Z, or a time before now such as -1h (no months or years).",
        )
    })
}

/// `15m`, `2h`, `7d`, `30s`, `500ms`: a count and a unit.
fn short_duration(s: &str) -> Option<i64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: i64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "w" => 7 * 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms)
}

/// ISO 8601 `PnWnDTnHnMnS` (whole numbers; seconds may have a fraction), without years
/// and months.
fn iso_duration(s: &str) -> Option<i64> {
    let body = s.get(1..)?.to_ascii_uppercase();
    let (date, time) = match body.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d.to_string(), Some(t.to_string())),
        Some(_) => return None,
        None => (body, None),
    };
    let mut total: i64 = 0;
    let mut any = false;
    let mut take = |part: &str, units: &[(char, i64)]| -> Option<()> {
        let mut rest = part;
        let mut last_rank = None;
        while !rest.is_empty() {
            let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
            let (num, tail) = rest.split_at(end);
            let unit = tail.chars().next()?;
            let rank = units.iter().position(|(u, _)| *u == unit)?;
            // Units in order, each once.
            if last_rank.is_some_and(|r| rank <= r) {
                return None;
            }
            last_rank = Some(rank);
            let ms = units[rank].1;
            let value = if num.contains('.') {
                if unit != 'S' {
                    return None;
                }
                let f: f64 = num.parse().ok()?;
                (f * ms as f64).round() as i64
            } else {
                num.parse::<i64>().ok()?.checked_mul(ms)?
            };
            total = total.checked_add(value)?;
            any = true;
            rest = &tail[1..];
        }
        Some(())
    };
    take(&date, &[('W', 7 * 86_400_000), ('D', 86_400_000)])?;
    if let Some(t) = time {
        take(&t, &[('H', 3_600_000), ('M', 60_000), ('S', 1_000)])?;
    }
    any.then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_000_000_000;

    #[test]
    fn relative_and_absolute_instants() {
        let at = |s: &str| instant("from", s, NOW).ok();
        assert_eq!(at("now"), Some(NOW));
        assert_eq!(at("-15m"), Some(NOW - 15 * 60_000));
        assert_eq!(at("-2h"), Some(NOW - 2 * 3_600_000));
        assert_eq!(at("-7d"), Some(NOW - 7 * 86_400_000));
        assert_eq!(at("-30s"), Some(NOW - 30_000));
        assert_eq!(at("PT15M"), Some(NOW - 15 * 60_000));
        assert_eq!(at("P1D"), Some(NOW - 86_400_000));
        assert_eq!(at("P1DT12H"), Some(NOW - 36 * 3_600_000));
        assert_eq!(at("PT1H30M"), Some(NOW - 90 * 60_000));
        assert_eq!(at("PT0.5S"), Some(NOW - 500));
        assert_eq!(at("2026-11-29T08:00:00Z"), Some(1_795_939_200_000));
        assert_eq!(at(" now "), Some(NOW));
    }

    #[test]
    fn months_years_and_nonsense_are_refused() {
        for bad in [
            "P1M",
            "P1Y",
            "PT",
            "P",
            "-",
            "-15",
            "-15x",
            "15m",
            "PT1M1H",
            "P1DT",
            "-9999999999999999999d",
            "yesterday",
            "",
        ] {
            let e = instant("from", bad, NOW).expect_err(bad);
            assert_eq!(e.parameter.as_deref(), Some("from"));
            assert_eq!(e.expected.as_deref(), Some(EXPECTED));
        }
    }
}
