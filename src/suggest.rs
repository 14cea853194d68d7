//! Nearest-value suggestions ("did you mean A_LINE1_042?") by edit distance.

/// Levenshtein distance over bytes (IDs and keys are ASCII; other input only costs more).
pub fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The largest distance still worth suggesting for an input of this length.
fn threshold(len: usize) -> usize {
    len.div_ceil(3).max(2)
}

/// The single closest candidate within the threshold (used for unknown config keys).
/// A candidate that extends the input (`baud` → `baud_rate`) counts as one edit away.
pub fn closest<'c>(input: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    candidates
        .into_iter()
        .map(|c| {
            let prefix = input.len() >= 3 && c.starts_with(input);
            (if prefix { 1 } else { distance(input, c) }, c)
        })
        .filter(|(d, _)| *d <= threshold(input.len()))
        .min()
        .map(|(_, c)| c)
}

/// Names agents give parameters that fieldgate calls otherwise, each with the parameters
/// it may mean, most likely first (only those of the tool at hand are offered).
const PARAMETER_SYNONYMS: &[(&str, &[&str])] = &[
    ("start", &["from", "since"]),
    ("from", &["since"]),
    ("start_time", &["from", "since"]),
    ("begin", &["from", "since"]),
    ("after", &["since", "from"]),
    ("end", &["to"]),
    ("end_time", &["to"]),
    ("until", &["to"]),
    ("stop", &["to"]),
    ("before", &["to"]),
    ("id", &["sensor_id", "work_order_id", "device_id"]),
    ("sensor", &["sensor_id", "sensor_ids"]),
    ("sensors", &["sensor_ids"]),
    ("ids", &["sensor_ids"]),
    ("order_id", &["work_order_id"]),
    ("key", &["idempotency_key"]),
    ("max", &["limit"]),
    ("count", &["limit"]),
    ("size", &["limit"]),
    ("page_size", &["limit"]),
    ("max_results", &["limit"]),
    ("top", &["limit"]),
    ("page", &["cursor"]),
    ("page_token", &["cursor"]),
    ("next_cursor", &["cursor"]),
    ("offset", &["cursor"]),
    ("interval", &["bucket"]),
    ("resolution", &["bucket"]),
    ("granularity", &["bucket"]),
    ("step", &["bucket"]),
    ("window", &["bucket"]),
    ("mode", &["unit"]),
    ("max_age", &["max_age_ms"]),
    ("state", &["status"]),
    ("query", &["text"]),
    ("search", &["text"]),
    ("q", &["text"]),
    ("category", &["kind"]),
    ("severity", &["priority"]),
    ("description", &["summary"]),
    ("reason", &["summary"]),
    ("work_type", &["type"]),
];

/// The parameter an unknown argument name most likely meant, among `params`: the same
/// name in snake case (`sensorId`), a synonym (`start` → `from`), or the nearest by edit
/// distance (`zonee` → `zone`).
pub fn closest_parameter<'c>(input: &str, params: &[&'c str]) -> Option<&'c str> {
    let mut snake = String::with_capacity(input.len() + 4);
    let mut after_lower = false;
    for c in input.trim().chars() {
        match c {
            '-' | ' ' | '.' => snake.push('_'),
            // camelCase and sensorID: a word starts at an upper-case letter after a lower one.
            c if c.is_ascii_uppercase() => {
                if after_lower {
                    snake.push('_');
                }
                snake.push(c.to_ascii_lowercase());
            }
            c => snake.push(c),
        }
        after_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
    }
    if let Some(same) = params.iter().find(|p| **p == snake) {
        return Some(same);
    }
    // A known synonym before edit distance, which finds `to` two edits from `id`.
    PARAMETER_SYNONYMS
        .iter()
        .find(|(alias, _)| *alias == snake)
        .and_then(|(_, meant)| meant.iter().find_map(|m| params.iter().find(|p| *p == m).copied()))
        .or_else(|| closest(&snake, params.iter().copied()))
}

/// What a person probably meant by a malformed sensor ID: upper case, `_` for other
/// separators, and a number padded to three digits (`a-line1-42` → `A_LINE1_042`).
pub fn normalize_sensor_id(input: &str) -> String {
    let up: String = input
        .trim()
        .chars()
        .map(|c| if matches!(c, '-' | ' ' | '.' | '/' | ':') { '_' } else { c.to_ascii_uppercase() })
        .collect();
    match up.rsplit_once('_') {
        Some((head, num)) if !num.is_empty() && num.len() < 3 && num.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{head}_{num:0>3}")
        }
        _ => up,
    }
}

/// Up to `max` registered IDs nearest to `input`, preferring the same plant and zone.
///
/// `ids` yields `(id, plant, zone)`.
pub fn nearest_ids<'c>(
    input: &str,
    ids: impl IntoIterator<Item = (&'c str, &'c str, &'c str)>,
    max: usize,
) -> Vec<String> {
    let norm = normalize_sensor_id(input);
    let mut parts = norm.split('_');
    let (plant, zone) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let number = |s: &str| s.rsplit('_').next().and_then(|n| n.parse::<i64>().ok());
    let wanted = number(&norm);
    let limit = threshold(norm.len());
    let mut scored: Vec<(usize, i64, &str)> = ids
        .into_iter()
        .filter_map(|(id, p, z)| {
            let d = distance(&norm, id);
            // Same plant and zone is worth one edit; same plant alone half of that.
            let locality = usize::from(p != plant) + usize::from(z != zone);
            // Among equals, the numerically nearest sensor of the same zone comes first.
            let near = match (wanted, number(id)) {
                (Some(a), Some(b)) if locality == 0 => (a - b).abs(),
                _ => i64::MAX,
            };
            (d <= limit).then_some((d * 2 + locality, near, id))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(max).map(|(_, _, id)| id.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn normalizes_what_people_type() {
        assert_eq!(normalize_sensor_id("a_line1_042"), "A_LINE1_042");
        assert_eq!(normalize_sensor_id(" a-line1-42 "), "A_LINE1_042");
        assert_eq!(normalize_sensor_id("A.LINE1.7"), "A_LINE1_007");
    }

    #[test]
    fn closest_key() {
        let keys = ["word_order", "unit_id", "timeout_ms"];
        assert_eq!(closest("wordorder", keys), Some("word_order"));
        assert_eq!(closest("timeout", keys), Some("timeout_ms"));
        assert_eq!(closest("zzzzzzzz", keys), None);
    }

    #[test]
    fn closest_parameter_knows_case_typos_and_synonyms() {
        let history = ["sensor_id", "from", "to", "bucket", "limit", "cursor"];
        assert_eq!(closest_parameter("start", &history), Some("from"));
        assert_eq!(closest_parameter("end", &history), Some("to"));
        assert_eq!(closest_parameter("sensorId", &history), Some("sensor_id"));
        assert_eq!(closest_parameter("sensorID", &history), Some("sensor_id"));
        assert_eq!(closest_parameter("ID", &history), Some("sensor_id"));
        assert_eq!(closest_parameter("limt", &history), Some("limit"));
        assert_eq!(closest_parameter("interval", &history), Some("bucket"));
        // A synonym only names parameters the tool has.
        let orders = ["status", "sensor_id", "since", "limit", "cursor"];
        assert_eq!(closest_parameter("start", &orders), Some("since"));
        assert_eq!(closest_parameter("end", &orders), None);
        assert_eq!(closest_parameter("zzzzzzzz", &orders), None);
    }

    #[test]
    fn nearest_prefers_same_zone() {
        let ids = [
            ("A_LINE1_001", "A", "LINE1"),
            ("A_LINE2_001", "A", "LINE2"),
            ("B_LINE1_001", "B", "LINE1"),
            ("A_LINE1_011", "A", "LINE1"),
        ];
        let got = nearest_ids("A_LINE1_012", ids, 3);
        assert_eq!(got[0], "A_LINE1_011");
        assert_eq!(got[1], "A_LINE1_001");
        assert_eq!(nearest_ids("a_line1_001", ids, 3)[0], "A_LINE1_001");
        assert!(nearest_ids("ZZZZ_QQQQQ_999", ids, 3).is_empty());
    }
}
