//! The control plane: a Unix-socket server through which another process (the
//! `podq ctl` and `podq monitor` commands, or any client speaking the protocol) lists
//! the workqueues that opted in, reads and writes their attributes with the kernel's
//! sysfs value strings, changes the process-wide default scope and reads stats.
//!
//! The protocol, the socket path rules and the access rules are in this module's
//! `README.md`. The server is written against [`ControlTarget`], so it does not care
//! what it controls; [`dispatch`] is the whole request → reply logic.

pub mod attr;
mod client;
pub mod protocol;
mod registry;
mod runtime;
mod server;

use std::sync::Arc;

use crate::topology::Scope;
use crate::Error;

pub use attr::{Attr, AttrValue, QueueAttrs};
pub use client::Client;
pub use protocol::{QueueSummary, Reply, Request, MAX_REQUEST_BYTES};
pub use registry::{ControlledQueue, DefaultScope, Registry, RegistryTarget};
pub use runtime::{start, RuntimeDefaultScope};
pub use server::{
    peer_allowed, peer_credentials, socket_candidates_for_pid, socket_path_for_pid, ControlServer,
    ControlServerBuilder, PeerCredentials,
};

/// Starts the control server on the default socket path (see the README), serving the
/// workqueues in [`Registry::global`] and `defaults` for the process default scope.
pub fn start_with<D: DefaultScope + 'static>(defaults: D) -> Result<ControlServer, Error> {
    ControlServer::builder().build(Arc::new(RegistryTarget::new(
        Arc::clone(Registry::global()),
        defaults,
    )))
}

/// One visible workqueue: its name and requested attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueInfo {
    /// The name it was registered under.
    pub name: String,
    /// Its attributes.
    pub attrs: QueueAttrs,
    /// The highest possible CPU of its topology plus one: the width of its cpumask
    /// values (a queue on a synthetic topology has its own CPU numbering).
    pub nr_cpu_ids: usize,
}

/// What the control server controls: the workqueues that opted in, and the process-wide
/// default scope. Implementations must be cheap to call from several threads at once;
/// they never see unparsed text — values arrive already validated as [`AttrValue`].
pub trait ControlTarget: Send + Sync {
    /// The visible workqueues, sorted by name.
    fn queues(&self) -> Vec<QueueInfo>;

    /// One visible workqueue by name.
    fn queue(&self, name: &str) -> Option<QueueInfo> {
        self.queues().into_iter().find(|q| q.name == name)
    }

    /// Applies one attribute to a workqueue. Errors: [`Error::UnknownQueue`],
    /// [`Error::Rejected`] with the runtime's reason.
    fn set_attr(&self, queue: &str, value: AttrValue) -> Result<(), Error>;

    /// The process-wide default scope (never `Default`).
    fn default_scope(&self) -> Scope;

    /// Changes the process-wide default scope; workqueues on `default` follow it.
    /// `scope` is never `Default` (the server refuses it before calling).
    fn set_default_scope(&self, scope: Scope) -> Result<(), Error>;

    /// Stats snapshots as JSON objects, each with at least a `name`: of every visible
    /// workqueue, or of the one named.
    fn stats(&self, queue: Option<&str>) -> Result<Vec<serde_json::Value>, Error>;

    /// Re-reads the usable CPUs and re-pods live workqueues; returns the usable CPUs.
    /// By default the process's own [`crate::topology::refresh`].
    fn refresh(&self) -> Result<crate::topology::CpuSet, Error> {
        crate::topology::refresh().map(|r| r.usable)
    }
}

/// Answers one request against `target`. Never panics on any request; every failure is
/// an error reply.
pub fn dispatch(target: &dyn ControlTarget, request: Request) -> Reply {
    match try_dispatch(target, request) {
        Ok(reply) => reply,
        Err(e) => Reply::error(e.to_string()),
    }
}

fn try_dispatch(target: &dyn ControlTarget, request: Request) -> Result<Reply, Error> {
    let find = |name: &str| {
        target.queue(name).ok_or_else(|| Error::UnknownQueue {
            name: name.to_owned(),
        })
    };
    match request {
        Request::List => Ok(Reply::queues(
            target.queues().iter().map(QueueSummary::new).collect(),
        )),
        Request::Get { queue, attr } => {
            let attr: Attr = attr.parse()?;
            let info = find(&queue)?;
            Ok(Reply::value(attr::format_value(
                attr,
                &info.attrs,
                info.nr_cpu_ids,
            )))
        }
        Request::Set { queue, attr, value } => {
            let attr: Attr = attr.parse()?;
            let info = find(&queue)?;
            let parsed = attr::parse_value(attr, &value, info.nr_cpu_ids)?;
            if attr == Attr::MaxActive && info.attrs.ordered {
                return Err(Error::ReadOnly {
                    queue,
                    attr,
                    reason: "the workqueue is ordered",
                });
            }
            target.set_attr(&queue, parsed)?;
            let now = find(&queue)?;
            Ok(Reply::value(attr::format_value(
                attr,
                &now.attrs,
                now.nr_cpu_ids,
            )))
        }
        Request::GetDefaultScope => Ok(Reply::value(target.default_scope().name().to_owned())),
        Request::SetDefaultScope { value } => {
            let scope = attr::parse_default_scope(&value)?;
            target.set_default_scope(scope)?;
            Ok(Reply::value(target.default_scope().name().to_owned()))
        }
        Request::Refresh => Ok(Reply::value(target.refresh()?.to_list())),
        Request::Stats { queue } => {
            if let Some(name) = &queue {
                find(name)?;
            }
            Ok(Reply::stats(target.stats(queue.as_deref())?))
        }
    }
}

#[cfg(test)]
pub(crate) mod mock;

#[cfg(test)]
mod tests {
    use super::mock::MockTarget;
    use super::*;
    use crate::topology::CpuSet;

    fn req(line: &str) -> Reply {
        let target = MockTarget::new();
        dispatch(&target, protocol::parse_request(line.as_bytes()).unwrap())
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads /sys and /proc")]
    fn refresh_reports_the_usable_cpus() {
        let reply = req(r#"{"cmd":"refresh"}"#);
        let live = crate::topology::Topology::live().unwrap();
        assert_eq!(reply, Reply::value(live.usable().to_list()));
    }

    #[test]
    fn get_and_set_through_a_target() {
        let target = MockTarget::new();
        let run = |line: &str| dispatch(&target, protocol::parse_request(line.as_bytes()).unwrap());
        assert_eq!(
            run(r#"{"cmd":"get","queue":"rpciod","attr":"affinity_scope"}"#),
            Reply::value("default (cache_shard)".into())
        );
        assert_eq!(
            run(r#"{"cmd":"set","queue":"rpciod","attr":"affinity_scope","value":"numa\n"}"#),
            Reply::value("numa".into())
        );
        assert_eq!(target.queue("rpciod").unwrap().attrs.scope, Scope::Numa);
        assert_eq!(
            run(r#"{"cmd":"set","queue":"nfsiod","attr":"cpumask","value":"1"}"#),
            Reply::value("1".into())
        );
        assert_eq!(
            target.queue("nfsiod").unwrap().attrs.cpumask,
            CpuSet::single(0)
        );
        assert_eq!(
            run(r#"{"cmd":"set","queue":"nfsiod","attr":"max_active","value":"9999"}"#),
            Reply::value("2048".into())
        );
        assert_eq!(
            run(r#"{"cmd":"set","queue":"nfsiod","attr":"affinity_strict","value":"5"}"#),
            Reply::value("1".into())
        );
    }

    #[test]
    fn default_scope_is_followed_live() {
        let target = MockTarget::new();
        let run = |line: &str| dispatch(&target, protocol::parse_request(line.as_bytes()).unwrap());
        assert_eq!(
            run(r#"{"cmd":"set_default_scope","value":"smt"}"#),
            Reply::value("smt".into())
        );
        assert_eq!(
            run(r#"{"cmd":"get","queue":"rpciod","attr":"affinity_scope"}"#),
            Reply::value("default (smt)".into())
        );
        let err = run(r#"{"cmd":"set_default_scope","value":"default"}"#);
        assert!(err.error_text().unwrap().contains("`default`"), "{err:?}");
        assert_eq!(
            run(r#"{"cmd":"get_default_scope"}"#),
            Reply::value("smt".into())
        );
    }

    #[test]
    fn errors_name_what_was_wrong() {
        for (line, needle) in [
            (
                r#"{"cmd":"get","queue":"nope","attr":"nice"}"#,
                "unknown workqueue `nope`",
            ),
            (
                r#"{"cmd":"get","queue":"rpciod","attr":"bogus"}"#,
                "unknown attribute `bogus`",
            ),
            (
                r#"{"cmd":"set","queue":"rpciod","attr":"nice","value":"40"}"#,
                "invalid value `40` for nice",
            ),
            (
                r#"{"cmd":"set","queue":"ordered_wq","attr":"max_active","value":"4"}"#,
                "max_active of workqueue `ordered_wq` is read-only",
            ),
            (
                r#"{"cmd":"set","queue":"rpciod","attr":"nice","value":"-7"}"#,
                "cannot set nice of rpciod: the mock refuses -7",
            ),
            (
                r#"{"cmd":"stats","queue":"nope"}"#,
                "unknown workqueue `nope`",
            ),
        ] {
            let reply = req(line);
            let text = reply
                .error_text()
                .unwrap_or_else(|| panic!("{line}: {reply:?}"));
            assert!(text.contains(needle), "{line}: {text}");
        }
    }

    #[test]
    fn list_and_stats() {
        let reply = req(r#"{"cmd":"list"}"#);
        let queues = reply.queues.unwrap();
        let names: Vec<_> = queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(names, ["nfsiod", "ordered_wq", "rpciod"]);
        assert_eq!(queues[2].affinity_scope, "default (cache_shard)");
        assert_eq!(queues[2].cpumask, "3");
        let reply = req(r#"{"cmd":"stats","queue":"rpciod"}"#);
        let stats = reply.stats.unwrap();
        assert_eq!(stats.len(), 1);
        assert_eq!(stats[0]["name"], "rpciod");
        assert_eq!(req(r#"{"cmd":"stats"}"#).stats.unwrap().len(), 3);
    }
}

#[cfg(test)]
mod readme_tests {
    use super::mock::MockTarget;
    use super::*;

    /// The session in README.md is replayed against the in-memory target: every `<`
    /// line must be exactly the reply to the `>` line before it.
    #[test]
    fn readme_session_is_real() {
        let readme = include_str!("README.md");
        let target = MockTarget::new();
        let mut pairs = 0;
        let mut request = None;
        for line in readme.lines() {
            if let Some(sent) = line.strip_prefix("> ") {
                request = Some(sent);
            } else if let Some(expected) = line.strip_prefix("< ") {
                let sent = request.take().expect("a `<` line follows a `>` line");
                let reply = match protocol::parse_request(sent.as_bytes()) {
                    Ok(r) => dispatch(&target, r),
                    Err(e) => Reply::error(e.to_string()),
                };
                assert_eq!(reply.to_line().trim_end(), expected, "reply to {sent}");
                pairs += 1;
            }
        }
        assert!(pairs >= 10, "only {pairs} exchanges found");
    }
}
