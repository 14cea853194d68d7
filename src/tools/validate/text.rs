//! Text from outside that a person will read (a work order's summary, an operator's note,
//! any argument the console's activity page shows): no control characters (a tab and line
//! breaks only where a field is multi-line) and no bidirectional formatting characters,
//! which can make "Pump KCOLB overheat" read as something else on the operator's screen.

use serde_json::Value;

use crate::tools::ToolError;
use crate::tools::envelope;

/// Fields that may hold several lines (a tab and line breaks allowed).
const MULTI_LINE: [&str; 2] = ["summary", "note"];

/// Why `c` cannot stand in text a person reads, if it cannot. A line break is a line feed
/// alone (a lone carriage return rewrites the line it stands in on a terminal).
fn refused(c: char, multi_line: bool) -> Option<&'static str> {
    match c {
        '\t' | '\n' if multi_line => None,
        c if envelope::is_control(c) => Some("a control character"),
        c if envelope::is_bidi(c) => Some("a bidirectional formatting character"),
        c if envelope::is_invisible(c) => Some("an invisible formatting character"),
        _ => None,
    }
}

/// Checks one text argument.
pub fn check(parameter: &str, text: &str) -> Result<(), ToolError> {
    // Printable ASCII (sensor IDs, most arguments) holds nothing to refuse: one pass over bytes.
    if text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Ok(());
    }
    let multi_line = MULTI_LINE.contains(&parameter);
    // A CRLF line break is one line feed; a lone CR is refused below.
    let joined;
    let text = if multi_line && text.contains("\r\n") {
        joined = text.replace("\r\n", "\n");
        joined.as_str()
    } else {
        text
    };
    let Some((at, c, what)) =
        text.chars().enumerate().find_map(|(i, c)| refused(c, multi_line).map(|w| (i, c, w)))
    else {
        return Ok(());
    };
    let allowed = if multi_line { " (tab and line breaks are allowed)" } else { "" };
    Err(ToolError::invalid(
        parameter,
        // Shown escaped (ToolError::invalid): the received text must not do on the console
        // what it was refused for.
        Some(text),
        format!("text without control, bidirectional or invisible formatting characters{allowed}"),
        format!("`{parameter}` holds {what} (U+{:04X}) at character {}.", c as u32, at + 1),
        format!("Remove U+{:04X} from `{parameter}` and call again; write plain text.", c as u32),
    ))
}

/// Checks every string of a tool call's arguments (top-level strings and arrays of them).
pub fn check_arguments(args: &Value) -> Result<(), ToolError> {
    let Some(fields) = args.as_object() else { return Ok(()) };
    for (name, value) in fields {
        match value {
            Value::String(s) => check(name, s)?,
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::String(s) = item {
                        check(name, s).map_err(|mut e| {
                            e.parameter = Some(format!("{name}/{i}"));
                            e
                        })?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_refused_with_where_and_what() {
        for bad in ["Pump \u{202e}kcolb overheat", "a\u{0}b", "bell\u{7}", "x\u{2066}y", "esc\u{1b}[31m"] {
            let e = check("summary", bad).unwrap_err();
            assert_eq!(e.code.as_str(), "INVALID_ARGUMENT");
            assert!(
                !e.received.as_deref().unwrap_or("").chars().any(|c| refused(c, false).is_some()),
                "{e:?}"
            );
        }
        let e = check("summary", "Pump \u{202e}kcolb").unwrap_err();
        assert!(e.message.contains("U+202E") && e.message.contains("character 6"), "{}", e.message);
        check("summary", "Line one\nline two\twith a tab, «Ümlaut» 漢字 עברית").unwrap();
        assert!(check("text", "two\nlines").is_err(), "a line break only where a field is multi-line");
        assert!(check("note", "ok\r\nok").is_ok());
        assert!(check("summary", "Line one\rfake line two").is_err(), "a lone CR rewrites the line");
        // Invisible ones: tag characters (hidden ASCII), zero-width space, BOM, soft hyphen,
        // annotation marks, line and paragraph separators; joiners that scripts need pass.
        for bad in [
            "Case TAG: \u{e0041}\u{e0042}",
            "a\u{200b}b",
            "\u{feff}x",
            "soft\u{ad}hyphen",
            "\u{fff9}a",
            "a\u{2028}b",
            "byte\u{e0100}x",
            "vs\u{fe00}x",
            "\u{3164}filler",
            "non\u{ffff}char",
            "cgj\u{34f}x",
        ] {
            let e = check("summary", bad).unwrap_err();
            assert!(e.message.contains("invisible"), "{bad:?}: {}", e.message);
            assert!(!e.received.as_deref().unwrap_or("").chars().any(envelope::is_hidden), "{e:?}");
        }
        check("summary", "می\u{200c}خواهم क्\u{200d}ष, pump ok ❤\u{fe0f} 👍\u{fe0e}").unwrap();
    }

    #[test]
    fn every_string_argument_is_checked() {
        let args = serde_json::json!({"sensor_ids": ["A_LINE1_001", "A\u{202e}"], "limit": 3});
        assert_eq!(check_arguments(&args).unwrap_err().parameter.as_deref(), Some("sensor_ids/1"));
        assert!(check_arguments(&serde_json::json!({"zone": "LINE1", "n": [1, 2]})).is_ok());
    }
}
