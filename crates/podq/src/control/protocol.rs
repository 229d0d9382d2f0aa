//! The wire protocol: one JSON object per line each way. Requests are bounded to
//! [`MAX_REQUEST_BYTES`]; [`parse_request`] turns a line into a [`Request`] or an error
//! naming what was wrong, and never panics on any input. [`Request`] and [`Reply`] are
//! the whole vocabulary, for `podq ctl` and for any other client.

use std::collections::HashSet;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::attr::{self, Attr};
use super::{ControlError, QueueInfo};
use crate::stats::WorkqueueStats;

/// The longest request line accepted, without its newline. Requests are a few dozen
/// bytes; the bound keeps a misbehaving client from making the server buffer without end.
pub const MAX_REQUEST_BYTES: usize = 4096;

/// A request, as `{"cmd": "<name>", ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
#[non_exhaustive]
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
    /// `{"cmd":"get_param","name":P}`: a process-wide parameter's value string (the
    /// kernel's workqueue module parameters: `cpu_intensive_thresh_us`,
    /// `watchdog_thresh`).
    GetParam {
        /// The parameter.
        name: String,
    },
    /// `{"cmd":"set_param","name":P,"value":V}`: write it; the reply carries the value
    /// read back.
    SetParam {
        /// The parameter.
        name: String,
        /// The value, as written to the module parameter's file.
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
    /// `{"cmd":"dump"}` or `{"cmd":"dump","queue":Q}`: state dumps
    /// ([`crate::Workqueue::dump`]).
    Dump {
        /// Only this workqueue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
    },
    /// `{"cmd":"pools"}`: every worker pool of the process, and each visible
    /// workqueue's CPU → pool map and `max_active` limits (the kernel's `wq_dump.py`).
    Pools,
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
#[non_exhaustive]
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
    /// `min_active` (empty from a server that does not report it).
    #[serde(default)]
    pub min_active: String,
    /// `nice`.
    pub nice: String,
    /// Whether the workqueue is ordered.
    pub ordered: bool,
    /// Whether it is frozen (false from a server that does not report it).
    #[serde(default)]
    pub frozen: bool,
}

impl QueueSummary {
    /// The summary of `info`.
    pub(crate) fn new(info: &QueueInfo) -> QueueSummary {
        let value = |a: Attr| attr::format_value(a, &info.attrs, info.nr_cpu_ids);
        QueueSummary {
            name: info.name.clone(),
            affinity_scope: value(Attr::AffinityScope),
            affinity_strict: value(Attr::AffinityStrict),
            cpumask: value(Attr::Cpumask),
            max_active: value(Attr::MaxActive),
            min_active: value(Attr::MinActive),
            nice: value(Attr::Nice),
            ordered: info.attrs.ordered,
            frozen: info.frozen,
        }
    }
}

/// A reply: `{"ok":true, ...}` with exactly one payload field for the request's kind,
/// or `{"ok":false,"error":"..."}`. `"closing":true` marks the server's last line on
/// the connection (idle, evicted, refused, stopping): the request sent after the last
/// answered one was not acted on, and a new connection may send it again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Reply {
    /// Whether the request succeeded.
    pub ok: bool,
    /// What went wrong (only when `ok` is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The server closes the connection after this line.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closing: bool,
    /// The workqueues (`list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<QueueSummary>>,
    /// A value string (`get`, `set`, `get_default_scope`, `set_default_scope`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Stats snapshots (`stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Vec<WorkqueueStats>>,
    /// State dumps (`dump`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<Vec<crate::WorkqueueDump>>,
    /// Live workqueues a `refresh` left on their pods, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_repodded: Option<Vec<LeftAlone>>,
    /// The pools and limits views (`pools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<PoolsView>,
}

/// A `pools` reply's payload: the pools and limits views of the kernel's `wq_dump.py`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolsView {
    /// Every worker pool of the process ([`crate::worker_pools`]), by id.
    pub pools: Vec<crate::WorkerPool>,
    /// Each visible workqueue's pools and limits, by name.
    pub workqueues: Vec<WorkqueueLimits>,
}

/// One workqueue's CPU → pool map and `max_active` limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkqueueLimits {
    /// The workqueue.
    pub name: String,
    /// Its `max_active`.
    pub max_active: usize,
    /// Its `min_active`.
    pub min_active: usize,
    /// The pool serving each CPU of its effective cpumask.
    pub cpu_pools: Vec<crate::CpuPool>,
    /// The pool of its pwq spanning the whole cpumask (`dfl_pwq`).
    pub default_pool: Option<u64>,
    /// Active items against each node's share of `max_active` (`node_nr/max`).
    pub nodes: Vec<crate::NodeActiveDump>,
}

impl WorkqueueLimits {
    /// The limits part of a state dump.
    pub(crate) fn of(dump: crate::WorkqueueDump) -> WorkqueueLimits {
        WorkqueueLimits {
            name: dump.name,
            max_active: dump.max_active,
            min_active: dump.min_active,
            cpu_pools: dump.cpu_pools,
            default_pool: dump.default_pool,
            nodes: dump.nodes,
        }
    }
}

/// A workqueue a `refresh` deliberately did not re-pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeftAlone {
    /// Its name.
    pub workqueue: String,
    /// Why it was left alone.
    pub reason: String,
}

impl Reply {
    /// An error reply.
    pub fn error(message: String) -> Reply {
        Reply {
            error: Some(message),
            ..Reply::default()
        }
    }

    /// The server's last line on a connection: an error reply saying why it closes.
    pub(crate) fn closing_notice(message: String) -> Reply {
        Reply {
            closing: true,
            ..Reply::error(message)
        }
    }

    /// A `list` reply.
    pub(crate) fn queues(queues: Vec<QueueSummary>) -> Reply {
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

    /// A `refresh` reply: the usable CPUs, and the workqueues left alone.
    pub(crate) fn refreshed(report: &crate::topology::Refreshed) -> Reply {
        Reply {
            not_repodded: Some(
                report
                    .not_repodded
                    .iter()
                    .map(|n| LeftAlone {
                        workqueue: n.workqueue.clone(),
                        reason: n.reason.to_string(),
                    })
                    .collect(),
            ),
            ..Reply::value(report.usable.to_list())
        }
    }

    /// A `stats` reply.
    pub(crate) fn stats(stats: Vec<WorkqueueStats>) -> Reply {
        Reply {
            ok: true,
            stats: Some(stats),
            ..Reply::default()
        }
    }

    /// A `pools` reply.
    pub(crate) fn pools(view: PoolsView) -> Reply {
        Reply {
            ok: true,
            pools: Some(view),
            ..Reply::default()
        }
    }

    /// A `dump` reply.
    pub(crate) fn dumps(dumps: Vec<crate::WorkqueueDump>) -> Reply {
        Reply {
            ok: true,
            dump: Some(dumps),
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
    pub fn from_line(line: &str) -> Result<Reply, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// A JSON object's members in order, duplicates kept, so that they can be refused:
/// `serde_json`'s own map keeps the last of two equal keys without a word.
struct Members(Vec<(String, serde_json::Value)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object such as {\"cmd\":\"list\"}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// Parses one request line (without its newline).
pub fn parse_request(line: &[u8]) -> Result<Request, ControlError> {
    if line.len() > MAX_REQUEST_BYTES {
        return Err(ControlError::TooLarge {
            limit: MAX_REQUEST_BYTES,
        });
    }
    let malformed = |source| ControlError::Malformed { source };
    let Members(members) = serde_json::from_slice(line).map_err(malformed)?;
    let mut seen = HashSet::new();
    if let Some((key, _)) = members.iter().find(|(key, _)| !seen.insert(key.as_str())) {
        return Err(ControlError::DuplicateField { field: key.clone() });
    }
    let object: serde_json::Map<String, serde_json::Value> = members.into_iter().collect();
    // serde's `deny_unknown_fields` does not reach unit variants of a tagged enum, so
    // extra fields are checked here: a misspelt `queue` must not be silently ignored.
    let fields: Option<&[&str]> = match object.get("cmd").and_then(serde_json::Value::as_str) {
        Some("list" | "get_default_scope" | "refresh" | "pools") => Some(&[]),
        Some("get") => Some(&["queue", "attr"]),
        Some("set") => Some(&["queue", "attr", "value"]),
        Some("set_default_scope") => Some(&["value"]),
        Some("get_param") => Some(&["name"]),
        Some("set_param") => Some(&["name", "value"]),
        Some("stats" | "dump") => Some(&["queue"]),
        // A missing or unknown `cmd`: serde names it below.
        _ => None,
    };
    if let Some(fields) = fields {
        if let Some(extra) = object
            .keys()
            .find(|k| *k != "cmd" && !fields.contains(&k.as_str()))
        {
            return Err(ControlError::UnknownField {
                field: extra.clone(),
            });
        }
    }
    serde_json::from_value(serde_json::Value::Object(object)).map_err(malformed)
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
            Request::GetParam {
                name: "watchdog_thresh".into(),
            },
            Request::SetParam {
                name: "cpu_intensive_thresh_us".into(),
                value: "20000\n".into(),
            },
            Request::Refresh,
            Request::Pools,
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
            Reply::closing_notice("closing idle connection after 60 s".into()),
        ] {
            let line = reply.to_line();
            assert_eq!(Reply::from_line(line.trim_end()).unwrap(), reply);
        }
        assert_eq!(
            Reply::error("boom".into()).to_line(),
            "{\"ok\":false,\"error\":\"boom\"}\n"
        );
        assert_eq!(
            Reply::closing_notice("bye".into()).to_line(),
            "{\"ok\":false,\"error\":\"bye\",\"closing\":true}\n"
        );
        assert!(Reply::from_line("nope").is_err());
        assert!(Reply::from_line(r#"{"ok":true,"surprise":1}"#).is_err());
    }

    #[test]
    fn malformed_requests_are_named() {
        for (line, needle) in [
            (&b"not json"[..], "malformed request"),
            (br#"{"cmd":"dance"}"#, "unknown variant `dance`"),
            (br#"{"cmd":"get","queue":"a"}"#, "missing field `attr`"),
            (br#"{"cmd":"list","extra":1}"#, "unknown field `extra`"),
            (br#"{"cmd":"pools","queue":"q"}"#, "unknown field `queue`"),
            (br#"{"cmd":"dump","qeue":"q"}"#, "unknown field `qeue`"),
            (br#"{"cmd":"stats","queu":"a"}"#, "unknown field `queu`"),
            (br#"{"cmd":"dance","x":1}"#, "unknown variant `dance`"),
            (br#"{"cmd":7}"#, "malformed request"),
            (br#"{"queue":"a"}"#, "missing field `cmd`"),
            (b"\xff\xfe", "malformed request"),
            (br#"["list"]"#, "expected a JSON object"),
            (br#"{"cmd":"refresh","queue":"a"}"#, "unknown field `queue`"),
            (br#"{"cmd":"get_param"}"#, "missing field `name`"),
            (
                br#"{"cmd":"get_param","queue":"a","name":"x"}"#,
                "unknown field `queue`",
            ),
            (
                br#"{"cmd":"set_param","name":"watchdog_thresh"}"#,
                "missing field `value`",
            ),
            (
                br#"{"cmd":"list","cmd":"refresh"}"#,
                "malformed request: duplicate field `cmd`",
            ),
            (
                br#"{"cmd":"get","queue":"a","attr":"nice","queue":"b"}"#,
                "duplicate field `queue`",
            ),
        ] {
            let err = super::super::error::chain_text(&parse_request(line).unwrap_err());
            assert!(
                err.contains(needle),
                "{:?}: {err}",
                String::from_utf8_lossy(line)
            );
        }
        let big = vec![b' '; MAX_REQUEST_BYTES + 1];
        assert!(matches!(
            parse_request(&big),
            Err(ControlError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Err(e) = parse_request(&bytes) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
