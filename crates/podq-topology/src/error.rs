//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong reading or building a topology. Each variant names
/// the text, file or shape at fault; a message quotes at most the first 64 characters
/// of rejected text, control characters escaped, so a hostile file is never echoed
/// whole.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A cpulist (`0-3,8`) could not be parsed.
    #[error("malformed cpulist {}: {reason}", quote(text))]
    CpuList {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A hex cpumask (`0000ffff`) could not be parsed.
    #[error("malformed cpumask {}: {reason}", quote(text))]
    CpuMask {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A scope name is not one of the kernel's.
    #[error("unknown affinity scope {}: {reason}", quote(text))]
    Scope {
        /// The offending text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An environment variable holds a bad value.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// A file could not be read (the cause is the error's `source()`).
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written (the cause is the error's `source()`).
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file was read but its content makes no sense.
    #[error("{}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A synthetic shape string could not be understood.
    #[error("bad synthetic shape {}: {reason}", quote(shape))]
    Shape {
        /// The offending shape.
        shape: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The parts given to build a topology are inconsistent.
    #[error("inconsistent topology: {0}")]
    Inconsistent(String),
    /// A parameter is out of range.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The parameter.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// How many characters of rejected text an error quotes.
pub(crate) const QUOTE_CHARS: usize = 64;

/// `text` in backquotes for an error message: control characters escaped, and past
/// [`QUOTE_CHARS`] characters cut with `…` and the total length, so that neither a
/// megabyte of input nor a terminal escape sequence reaches the user's screen.
pub(crate) fn quote(text: &str) -> String {
    let mut out = String::from("`");
    for c in text.chars().take(QUOTE_CHARS) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.push('`');
    if text.chars().nth(QUOTE_CHARS).is_some() {
        out.insert(out.len() - 1, '…');
        out.push_str(&format!(" ({} bytes)", text.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole() {
        assert_eq!(quote("0-3,x"), "`0-3,x`");
        assert_eq!(quote(""), "``");
    }

    #[test]
    fn long_text_is_cut_with_its_length() {
        let text = "0-65535,".repeat(100_000);
        let q = quote(&text);
        assert_eq!(q, format!("`{}…` (800000 bytes)", &text[..64]));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(quote("a\u{1b}[2Jb\n\0"), "`a\\u{1b}[2Jb\\n\\u{0}`");
    }

    #[test]
    fn the_message_of_a_huge_cpulist_stays_short() {
        let text = "0-65535,".repeat(200_000) + "x";
        let msg = crate::CpuSet::parse_list(&text).unwrap_err().to_string();
        assert!(msg.len() < 300, "{} bytes: {}", msg.len(), &msg[..300]);
        assert!(msg.contains("(1600001 bytes)"), "{msg}");
    }
}
