//! Text that came from another process is escaped before it reaches a terminal: a
//! server (or something posing as one) must not be able to move the cursor, retitle the
//! window or hide text with escape sequences in a name, a value or an error message.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` can change what a terminal shows beyond printing itself: C0 and C1
/// controls, DEL, and the bidirectional overrides and isolates that reorder text.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character (and bidi override) written as `\u{..}`;
/// borrowed when there is none, as is almost always the case.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(
            escape_controls("default (cache_shard) é ✓"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn controls_are_escaped() {
        assert_eq!(
            escape_controls("a\x1b]0;owned\x07b\nc\td\x7f\u{202e}e"),
            r"a\u{1b}]0;owned\u{7}b\u{a}c\u{9}d\u{7f}\u{202e}e"
        );
    }
}
