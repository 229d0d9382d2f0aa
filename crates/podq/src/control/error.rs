//! The control plane's error type. Each variant's text says what went wrong at its own
//! level only; a cause is kept as its `source` and printed once, by whoever walks the
//! chain ([`chain_text`], or `anyhow`'s `{:#}`).

use std::error::Error as StdError;
use std::path::PathBuf;
use std::time::Duration;

use super::attr::Attr;
use super::untrusted::escape_controls;

/// A boxed cause, whatever error type the runtime or a target reports.
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// Everything the control server, its protocol and its client can refuse or fail at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// No visible workqueue has this name.
    #[error("unknown workqueue `{name}`")]
    UnknownQueue {
        /// The name asked for.
        name: String,
    },
    /// The attribute name is not one of the sysfs files.
    #[error(
        "unknown attribute `{name}` (expected one of affinity_scope, affinity_strict, \
         cpumask, max_active, min_active, nice)"
    )]
    UnknownAttr {
        /// The name asked for.
        name: String,
    },
    /// The parameter name is not one of the module parameters podq has.
    #[error(
        "unknown parameter `{name}` (expected one of cpu_intensive_thresh_us, watchdog_thresh)"
    )]
    UnknownParam {
        /// The name asked for.
        name: String,
    },
    /// A live visible workqueue already has this name.
    #[error("a visible workqueue named `{name}` already exists")]
    NameTaken {
        /// The name.
        name: String,
    },
    /// The value cannot be written to the attribute.
    #[error("invalid value `{value}` for {attr}: {reason}")]
    InvalidValue {
        /// The attribute (or `default_affinity_scope`, or a parameter).
        attr: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The attribute cannot be written on this workqueue.
    #[error("{attr} of workqueue `{queue}` is read-only: {reason}")]
    ReadOnly {
        /// The workqueue.
        queue: String,
        /// The attribute.
        attr: Attr,
        /// Why.
        reason: &'static str,
    },
    /// The runtime refused a change that parsed fine; `source` says why.
    #[error("cannot set {what}")]
    Rejected {
        /// What was being changed (`affinity_scope of rpciod`).
        what: String,
        /// The runtime's refusal.
        #[source]
        source: Cause,
    },
    /// Re-reading the usable CPUs failed; `source` says why.
    #[error("cannot re-read the usable CPUs")]
    Refresh {
        /// The runtime's error.
        #[source]
        source: Cause,
    },
    /// A request line is not valid JSON, or not a request.
    #[error("malformed request")]
    Malformed {
        /// What the JSON parser or the request schema refused.
        #[source]
        source: serde_json::Error,
    },
    /// A request object names a field its command does not have.
    #[error("malformed request: unknown field `{field}`")]
    UnknownField {
        /// The field.
        field: String,
    },
    /// A request object names one field twice.
    #[error("malformed request: duplicate field `{field}`")]
    DuplicateField {
        /// The field.
        field: String,
    },
    /// A request line is longer than the limit.
    #[error("request larger than {limit} bytes")]
    TooLarge {
        /// The limit, [`super::MAX_REQUEST_BYTES`].
        limit: usize,
    },
    /// The connecting process may not use this server.
    #[error(
        "permission denied: peer uid {peer_uid} is neither the server's uid {server_uid} nor root"
    )]
    PeerRefused {
        /// The server's effective uid.
        server_uid: u32,
        /// The peer's uid.
        peer_uid: u32,
    },
    /// The server replied with an error; its message is shown with control characters
    /// escaped.
    #[error("{}", escape_controls(message))]
    Remote {
        /// The server's message, as sent.
        message: String,
        /// The server closed the connection after it (see the `closing` field of [`super::Reply`]).
        closing: bool,
    },
    /// No process has this pid.
    #[error("no process with pid {pid}")]
    NoProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// The process belongs to another user; only that user or root may control it.
    #[error("process {pid} runs as uid {owner}; only that uid or root may control it")]
    NotPermitted {
        /// The pid asked for.
        pid: u32,
        /// Its uid.
        owner: u32,
    },
    /// No candidate socket of the process passed the checks.
    #[error(
        "process {pid} has no usable control socket ({}); does it start the control server?",
        tried.join("; ")
    )]
    NoServer {
        /// The pid asked for.
        pid: u32,
        /// Each candidate path and why it was not used.
        tried: Vec<String>,
    },
    /// The reply is not a protocol reply.
    #[error("bad reply from {}: `{}`", path.display(), escape_controls(excerpt))]
    BadReply {
        /// The socket.
        path: PathBuf,
        /// The start of the reply, at most 80 characters.
        excerpt: String,
        /// What the parser refused.
        #[source]
        source: serde_json::Error,
    },
    /// The reply did not end within the size limit.
    #[error("reply from {} larger than {limit} bytes", path.display())]
    ReplyTooLarge {
        /// The socket.
        path: PathBuf,
        /// The limit.
        limit: usize,
    },
    /// No complete reply arrived before the deadline.
    #[error("no reply from {} within {}", path.display(), seconds(*after))]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// The time allowed for the whole reply.
        after: Duration,
    },
    /// The server closed the connection before a reply arrived.
    #[error("{} closed the connection without replying", path.display())]
    Closed {
        /// The socket.
        path: PathBuf,
    },
    /// The process at the other end is not the server the client looked for.
    #[error("{} is not a trusted control server: {reason}", path.display())]
    Untrusted {
        /// The socket.
        path: PathBuf,
        /// Which check failed.
        reason: String,
    },
    /// A socket or file operation failed; `source` is the operating system's error.
    #[error("{what}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The socket path or its directory is unusable.
    #[error("control socket {}: {reason}", path.display())]
    SocketPath {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A server setting out of range.
    #[error("invalid control server setting {setting}: {reason}")]
    Setting {
        /// The builder method.
        setting: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl ControlError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> ControlError {
        ControlError::Io {
            what: what.into(),
            source,
        }
    }
}

/// `2 s`, `500 ms`: a timeout as people write it.
pub(crate) fn seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// An error and every cause below it, joined by `: ` — the text of an error reply.
pub(crate) fn chain_text(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::mock::Reason;
    use super::*;

    #[test]
    fn causes_print_once() {
        let e = ControlError::io(
            "cannot connect to /x.sock",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(e.to_string(), "cannot connect to /x.sock");
        assert_eq!(
            chain_text(&e),
            "cannot connect to /x.sock: No such file or directory (os error 2)"
        );
        let e = ControlError::Rejected {
            what: "nice of rpciod".into(),
            source: Box::new(Reason("no".into())),
        };
        assert_eq!(chain_text(&e), "cannot set nice of rpciod: no");
    }

    #[test]
    fn timeouts_read_as_people_write_them() {
        let e = |after| ControlError::Timeout {
            path: "/s".into(),
            after,
        };
        assert_eq!(
            e(Duration::from_secs(10)).to_string(),
            "no reply from /s within 10 s"
        );
        assert_eq!(
            e(Duration::from_millis(250)).to_string(),
            "no reply from /s within 250 ms"
        );
    }

    #[test]
    fn remote_text_is_escaped() {
        let e = ControlError::Remote {
            message: "bad\x1b[2Jthing\u{9b}".into(),
            closing: false,
        };
        assert_eq!(e.to_string(), r"bad\u{1b}[2Jthing\u{9b}");
    }
}
