//! The wire protocol: one JSON object per line each way. Requests are bounded to
//! [`MAX_REQUEST_BYTES`]; [`LineFramer`] splits a byte stream into request lines without
//! ever holding more than that, and [`parse_request`] turns a line into a [`Request`] or
//! an error naming what was wrong. Both are pure and never panic on any input.

use serde::{Deserialize, Serialize};

use super::attr::{self, Attr};
use super::QueueInfo;
use crate::Error;

/// The longest request line accepted, without its newline. Requests are a few dozen
/// bytes; the bound keeps a misbehaving client from making the server buffer without end.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// A request, as `{"cmd": "<name>", ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// `{"cmd":"list"}`: every visible workqueue with its attributes.
    List,
    /// `{"cmd":"get","queue":Q,"attr":A}`: one attribute's value string.
    Get {
        /// The workqueue.
        queue: String,
        /// The attribute (sysfs file name).
        attr: String,
    },
    /// `{"cmd":"set","queue":Q,"attr":A,"value":V}`: write a value string; the reply
    /// carries the value read back.
    Set {
        /// The workqueue.
        queue: String,
        /// The attribute (sysfs file name).
        attr: String,
        /// The value, as written to the sysfs file.
        value: String,
    },
    /// `{"cmd":"get_default_scope"}`: the process-wide default scope.
    GetDefaultScope,
    /// `{"cmd":"set_default_scope","value":S}`: change it (`default` is refused).
    SetDefaultScope {
        /// The new default scope's name.
        value: String,
    },
    /// `{"cmd":"refresh"}`: re-read the usable CPUs and re-pod live workqueues
    /// ([`crate::topology::refresh`]); the reply's value is the usable CPU list.
    Refresh,
    /// `{"cmd":"stats"}` or `{"cmd":"stats","queue":Q}`: stats snapshots.
    Stats {
        /// Only this workqueue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
    },
}

impl Request {
    /// The request as one line of JSON, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }
}

/// A workqueue in a `list` reply: every attribute as its sysfs value string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSummary {
    /// The workqueue's name.
    pub name: String,
    /// `affinity_scope`, e.g. `default (cache_shard)`.
    pub affinity_scope: String,
    /// `affinity_strict`: `0` or `1`.
    pub affinity_strict: String,
    /// `cpumask` as a hex bitmap.
    pub cpumask: String,
    /// `max_active`.
    pub max_active: String,
    /// `nice`.
    pub nice: String,
    /// Whether the workqueue is ordered.
    pub ordered: bool,
}

impl QueueSummary {
    /// The summary of `info`.
    pub fn new(info: &QueueInfo) -> QueueSummary {
        let value = |a: Attr| attr::format_value(a, &info.attrs, info.nr_cpu_ids);
        QueueSummary {
            name: info.name.clone(),
            affinity_scope: value(Attr::AffinityScope),
            affinity_strict: value(Attr::AffinityStrict),
            cpumask: value(Attr::Cpumask),
            max_active: value(Attr::MaxActive),
            nice: value(Attr::Nice),
            ordered: info.attrs.ordered,
        }
    }

    /// The value string of one attribute.
    pub fn get(&self, attr: Attr) -> &str {
        match attr {
            Attr::AffinityScope => &self.affinity_scope,
            Attr::AffinityStrict => &self.affinity_strict,
            Attr::Cpumask => &self.cpumask,
            Attr::MaxActive => &self.max_active,
            Attr::Nice => &self.nice,
        }
    }
}

/// A reply: `{"ok":true, ...}` with exactly one payload field for the request's kind,
/// or `{"ok":false,"error":"..."}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    /// Whether the request succeeded.
    pub ok: bool,
    /// What went wrong (only when `ok` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The workqueues (`list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<QueueSummary>>,
    /// A value string (`get`, `set`, `get_default_scope`, `set_default_scope`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Stats snapshots (`stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Vec<serde_json::Value>>,
}

impl Reply {
    /// An error reply.
    pub fn error(message: String) -> Reply {
        Reply {
            error: Some(message),
            ..Reply::default()
        }
    }

    /// A `list` reply.
    pub fn queues(queues: Vec<QueueSummary>) -> Reply {
        Reply {
            ok: true,
            queues: Some(queues),
            ..Reply::default()
        }
    }

    /// A value reply.
    pub fn value(value: String) -> Reply {
        Reply {
            ok: true,
            value: Some(value),
            ..Reply::default()
        }
    }

    /// A `stats` reply.
    pub fn stats(stats: Vec<serde_json::Value>) -> Reply {
        Reply {
            ok: true,
            stats: Some(stats),
            ..Reply::default()
        }
    }

    /// The error message of an error reply.
    pub fn error_text(&self) -> Option<&str> {
        (!self.ok).then(|| {
            self.error
                .as_deref()
                .unwrap_or("error reply without a message")
        })
    }

    /// The reply as one line of JSON, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }

    /// Parses a reply line.
    pub fn from_line(line: &str) -> Result<Reply, Error> {
        serde_json::from_str(line).map_err(|e| Error::BadReply(format!("{e}: `{line}`")))
    }
}

/// Parses one request line (without its newline).
pub fn parse_request(line: &[u8]) -> Result<Request, Error> {
    if line.len() > MAX_REQUEST_BYTES {
        return Err(Error::TooLarge {
            limit: MAX_REQUEST_BYTES,
        });
    }
    let bad = |reason: String| Error::BadRequest(reason);
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| bad("expected a JSON object such as {\"cmd\":\"list\"}".into()))?;
    // serde's `deny_unknown_fields` does not reach unit variants of a tagged enum, so
    // extra fields are checked here: a misspelt `queue` must not be silently ignored.
    let fields: Option<&[&str]> = match object.get("cmd").and_then(serde_json::Value::as_str) {
        Some("list" | "get_default_scope") => Some(&[]),
        Some("get") => Some(&["queue", "attr"]),
        Some("set") => Some(&["queue", "attr", "value"]),
        Some("set_default_scope") => Some(&["value"]),
        Some("stats") => Some(&["queue"]),
        // A missing or unknown `cmd`: serde names it below.
        _ => None,
    };
    if let Some(fields) = fields {
        if let Some(extra) = object
            .keys()
            .find(|k| *k != "cmd" && !fields.contains(&k.as_str()))
        {
            return Err(bad(format!("unknown field `{extra}`")));
        }
    }
    serde_json::from_value(value).map_err(|e| bad(e.to_string()))
}

/// One unit cut from the byte stream by [`LineFramer`].
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, without its newline; never longer than the limit.
    Line(Vec<u8>),
    /// A line that exceeded the limit; its bytes were dropped.
    TooLong,
}

/// Splits a byte stream into lines, holding at most `limit` bytes: an over-long line is
/// dropped as it arrives and reported as [`Frame::TooLong`] when its newline comes, so
/// the next line is read normally. Blank lines are skipped.
#[derive(Debug)]
pub struct LineFramer {
    /// The current line so far (empty while dropping an over-long line).
    buf: Vec<u8>,
    /// Whether the current line already exceeded `limit`.
    overflowed: bool,
    /// The longest line accepted.
    limit: usize,
}

impl LineFramer {
    /// A framer accepting lines of at most `limit` bytes.
    pub fn new(limit: usize) -> LineFramer {
        LineFramer {
            buf: Vec::new(),
            overflowed: false,
            limit,
        }
    }

    /// Whether a line has started and not yet ended.
    pub fn in_line(&self) -> bool {
        self.overflowed || !self.buf.is_empty()
    }

    /// Feeds bytes; returns the frames they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        for piece in bytes.split_inclusive(|&b| b == b'\n') {
            let (data, complete) = match piece.split_last() {
                Some((b'\n', data)) => (data, true),
                _ => (piece, false),
            };
            if !self.overflowed {
                if self.buf.len() + data.len() > self.limit {
                    self.overflowed = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(data);
                }
            }
            if complete {
                if let Some(frame) = self.take() {
                    frames.push(frame);
                }
            }
        }
        frames
    }

    /// Ends the stream: a last line without a newline still counts.
    pub fn finish(&mut self) -> Option<Frame> {
        self.take()
    }

    fn take(&mut self) -> Option<Frame> {
        let frame = if std::mem::take(&mut self.overflowed) {
            Some(Frame::TooLong)
        } else if self.buf.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(Frame::Line(std::mem::take(&mut self.buf)))
        };
        self.buf.clear();
        frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip() {
        let all = [
            Request::List,
            Request::Get {
                queue: "rpciod".into(),
                attr: "nice".into(),
            },
            Request::Set {
                queue: "rpciod".into(),
                attr: "affinity_scope".into(),
                value: "numa\n".into(),
            },
            Request::GetDefaultScope,
            Request::SetDefaultScope {
                value: "smt".into(),
            },
            Request::Refresh,
            Request::Stats { queue: None },
            Request::Stats {
                queue: Some("nfsiod".into()),
            },
        ];
        for request in all {
            let line = request.to_line();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            let back = parse_request(line.trim_end().as_bytes()).unwrap();
            assert_eq!(back, request);
        }
        assert_eq!(
            Request::List.to_line(),
            "{\"cmd\":\"list\"}\n",
            "documented form"
        );
        assert_eq!(
            parse_request(br#"{"cmd":"stats"}"#).unwrap(),
            Request::Stats { queue: None }
        );
    }

    #[test]
    fn replies_round_trip() {
        for reply in [
            Reply::error("unknown workqueue `x`".into()),
            Reply::value("default (cache_shard)".into()),
            Reply::queues(vec![]),
            Reply::stats(vec![serde_json::json!({"name": "a", "pools": []})]),
        ] {
            let line = reply.to_line();
            assert_eq!(Reply::from_line(line.trim_end()).unwrap(), reply);
        }
        assert_eq!(
            Reply::error("boom".into()).to_line(),
            "{\"ok\":false,\"error\":\"boom\"}\n"
        );
        assert!(Reply::from_line("nope").is_err());
    }

    #[test]
    fn malformed_requests_are_named() {
        for (line, needle) in [
            (&b"not json"[..], "malformed request"),
            (br#"{"cmd":"dance"}"#, "unknown variant `dance`"),
            (br#"{"cmd":"get","queue":"a"}"#, "missing field `attr`"),
            (br#"{"cmd":"list","extra":1}"#, "unknown field `extra`"),
            (br#"{"cmd":"stats","queu":"a"}"#, "unknown field `queu`"),
            (br#"{"cmd":"dance","x":1}"#, "unknown variant `dance`"),
            (br#"{"cmd":7}"#, "malformed request"),
            (br#"{"queue":"a"}"#, "missing field `cmd`"),
            (b"\xff\xfe", "malformed request"),
            (br#"["list"]"#, "malformed request"),
        ] {
            let err = parse_request(line).unwrap_err().to_string();
            assert!(
                err.contains(needle),
                "{:?}: {err}",
                String::from_utf8_lossy(line)
            );
        }
        let big = vec![b' '; MAX_REQUEST_BYTES + 1];
        assert!(matches!(parse_request(&big), Err(Error::TooLarge { .. })));
    }

    #[test]
    fn framer_bounds_lines() {
        let mut f = LineFramer::new(8);
        assert_eq!(f.push(b"abc\n\n  \nde"), vec![Frame::Line(b"abc".to_vec())]);
        assert!(f.in_line());
        assert_eq!(f.push(b"f\n"), vec![Frame::Line(b"def".to_vec())]);
        assert!(!f.in_line());
        assert_eq!(f.push(b"0123456"), vec![]);
        assert_eq!(f.push(b"789abc"), vec![]);
        assert!(f.buf.is_empty(), "over-long bytes are not kept");
        assert_eq!(
            f.push(b"def\nok\n"),
            vec![Frame::TooLong, Frame::Line(b"ok".to_vec())]
        );
        assert_eq!(
            f.push(b"12345678\n"),
            vec![Frame::Line(b"12345678".to_vec())]
        );
        assert_eq!(f.push(b"tail"), vec![]);
        assert_eq!(f.finish(), Some(Frame::Line(b"tail".to_vec())));
        assert_eq!(f.finish(), None);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Err(e) = parse_request(&bytes) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn framer_matches_split(chunks in proptest::collection::vec(
            proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'a'), Just(b' ')], 0..30), 0..10)) {
            let limit = 6;
            let mut f = LineFramer::new(limit);
            let mut got = Vec::new();
            for c in &chunks {
                got.extend(f.push(c));
            }
            got.extend(f.finish());
            let all: Vec<u8> = chunks.concat();
            let want: Vec<Frame> = all
                .split(|&b| b == b'\n')
                .filter_map(|l| {
                    if l.len() > limit {
                        Some(Frame::TooLong)
                    } else if l.iter().all(u8::is_ascii_whitespace) {
                        None
                    } else {
                        Some(Frame::Line(l.to_vec()))
                    }
                })
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
