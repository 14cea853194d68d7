//! What text a person reads must not carry raw: control characters, bidirectional
//! formatting characters and invisible formatting characters. Tools refuse them in
//! arguments and escape them when echoing; drivers replace them in text a device sends.

/// Whether `c` is a control, bidirectional formatting or invisible formatting character:
/// text a person reads must not carry it as it is (tools refuse it in arguments and
/// escape it when echoing; drivers replace it in device text: [`shown`]).
pub fn is_hidden(c: char) -> bool {
    if c.is_ascii() {
        return is_control(c);
    }
    is_control(c) || is_bidi(c) || is_invisible(c)
}

pub fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// Embeddings, overrides and isolates (and their ends), and the implicit marks.
pub fn is_bidi(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// Characters that show nothing: format characters (Unicode's `Cf`, but the zero-width
/// joiner and non-joiner that some scripts need), variation selectors (but the text and
/// emoji ones), fillers, noncharacters, and the line and paragraph separators: text could
/// hide in them (tag characters and variation selectors spell bytes no one sees) or break a
/// line unseen.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{600}'..='\u{605}' | '\u{6dd}' | '\u{70f}' | '\u{890}'..='\u{891}' | '\u{8e2}'
        | '\u{180e}' | '\u{200b}' | '\u{2028}' | '\u{2029}' | '\u{2060}'..='\u{2064}'
        | '\u{206a}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{110bd}' | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0001}' | '\u{e0020}'..='\u{e007f}'
        // Variation selectors (but the text and emoji ones, which emoji need): 256 of them
        // spell a hidden byte each; Hangul fillers and the grapheme joiner show nothing.
        | '\u{fe00}'..='\u{fe0d}' | '\u{e0100}'..='\u{e01ef}' | '\u{34f}' | '\u{115f}' | '\u{1160}'
        | '\u{17b4}' | '\u{17b5}' | '\u{3164}' | '\u{ffa0}'
        // Noncharacters.
        | '\u{fdd0}'..='\u{fdef}')
        || (c as u32) & 0xfffe == 0xfffe
}

/// Device text as an agent may read it: every hidden character replaced by U+FFFD.
pub fn shown(s: &str) -> String {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return s.to_string();
    }
    s.chars().map(|c| if is_hidden(c) { '\u{fffd}' } else { c }).collect()
}
