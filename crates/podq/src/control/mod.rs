//! The control plane: a Unix-socket server through which another process (the
//! `podq ctl` and `podq monitor` commands, or any client speaking the protocol) lists
//! the workqueues that opted in, reads and writes their attributes with the kernel's
//! sysfs value strings, changes the process-wide default scope and parameters (the
//! kernel's workqueue module parameters) and reads stats.
//!
//! A service makes its workqueues visible and keeps the server's guard alive:
//!
//! ```no_run
//! let rpciod = podq::Workqueue::builder("rpciod").build()?;
//! rpciod.expose()?; // visible as `rpciod` (the kernel's WQ_SYSFS)
//! let _server = podq::control::start()?; // serves until dropped
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! and a client talks to it with [`Client`]:
//!
//! ```no_run
//! use podq::control::{Client, Request};
//! use std::time::Duration;
//!
//! let mut client = Client::connect_to_pid(1234, Duration::from_secs(10))?;
//! for queue in client.call(&Request::List)?.queues.unwrap_or_default() {
//!     println!("{} {}", queue.name, queue.affinity_scope);
//! }
//! # Ok::<(), podq::control::ControlError>(())
//! ```
//!
//! The protocol, the socket path rules, the access rules and the server's limits are in
//! this module's `README.md`. Built with the `control` feature (on by default).

mod attr;
mod client;
mod connection;
mod error;
mod event_loop;
mod framer;
#[cfg(feature = "test-util")]
pub mod fuzzing;
mod param;
mod protocol;
mod registry;
mod runtime;
mod server;
mod socket;
mod target;
mod untrusted;

pub use attr::Attr;
#[cfg(feature = "test-util")]
pub use attr::{AttrValue, QueueAttrs};
#[cfg(not(feature = "test-util"))]
pub(crate) use attr::{AttrValue, QueueAttrs};
pub use client::{Client, MAX_REPLY_BYTES};
pub use error::{Cause, ControlError};
pub use param::{Param, MAX_PARAM};
pub use protocol::{
    parse_request, LeftAlone, PoolsView, QueueSummary, Reply, Request, WorkqueueLimits,
    MAX_REQUEST_BYTES,
};
pub(crate) use registry::{ControlledQueue, Registry};
pub use runtime::start;
pub use server::{ControlServer, ControlServerBuilder};
pub use socket::{socket_path_for_pid, PeerCredentials};
pub(crate) use target::dispatch;
#[cfg(not(feature = "test-util"))]
pub(crate) use target::{ControlTarget, QueueInfo};
#[cfg(feature = "test-util")]
pub use target::{ControlTarget, QueueInfo};
pub use untrusted::escape_controls;

#[cfg(test)]
pub(crate) mod mock;

#[cfg(test)]
mod tests {
    use super::mock::MockTarget;
    use super::*;
    use crate::topology::{CpuSet, Scope};

    fn req(line: &str) -> Reply {
        let target = MockTarget::new();
        dispatch(&target, protocol::parse_request(line.as_bytes()).unwrap())
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads /sys and /proc")]
    fn refresh_reports_the_usable_cpus_and_what_it_left_alone() {
        let fake = crate::Workqueue::builder("refresh-reply-fake")
            .topology(crate::testing::fake_topology(2, 1, 2, 1))
            .build()
            .unwrap();
        let reply = req(r#"{"cmd":"refresh"}"#);
        let live = crate::topology::Topology::live().unwrap();
        assert!(reply.ok, "{reply:?}");
        assert_eq!(reply.value, Some(live.usable().to_list()));
        let left = reply
            .not_repodded
            .expect("a refresh reply lists what it left alone");
        let mine: Vec<&LeftAlone> = left
            .iter()
            .filter(|l| l.workqueue == "refresh-reply-fake")
            .collect();
        assert_eq!(mine.len(), 1, "{left:?}");
        assert!(
            mine[0].reason.contains("not this machine"),
            "{}",
            mine[0].reason
        );
        drop(fake);
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
    fn parameters_are_read_and_written_in_their_units() {
        let target = MockTarget::new();
        let run = |line: &str| dispatch(&target, protocol::parse_request(line.as_bytes()).unwrap());
        assert_eq!(
            run(r#"{"cmd":"get_param","name":"cpu_intensive_thresh_us"}"#),
            Reply::value("10000".into())
        );
        assert_eq!(
            run(r#"{"cmd":"set_param","name":"cpu_intensive_thresh_us","value":"25000\n"}"#),
            Reply::value("25000".into())
        );
        assert_eq!(
            target.param(Param::CpuIntensiveThreshUs),
            Some(std::time::Duration::from_millis(25))
        );
        assert_eq!(
            run(r#"{"cmd":"set_param","name":"watchdog_thresh","value":"0"}"#),
            Reply::value("0".into())
        );
        assert_eq!(target.param(Param::WatchdogThresh), None);
        for (line, error) in [
            (
                r#"{"cmd":"set_param","name":"cpu_intensive_thresh_us","value":"500"}"#,
                "invalid value `500` for cpu_intensive_thresh_us: expected 0 (off) or a \
                 decimal integer in [1000, 86400000000]",
            ),
            (
                r#"{"cmd":"get_param","name":"wq_watchdog_thresh"}"#,
                "unknown parameter `wq_watchdog_thresh` (expected one of \
                 cpu_intensive_thresh_us, watchdog_thresh)",
            ),
        ] {
            assert_eq!(run(line).error_text(), Some(error), "{line}");
        }
        // A refused write changed nothing.
        assert_eq!(
            run(r#"{"cmd":"get_param","name":"cpu_intensive_thresh_us"}"#),
            Reply::value("25000".into())
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
                r#"{"cmd":"set","queue":"ordered_wq","attr":"min_active","value":"1"}"#,
                "min_active of workqueue `ordered_wq` is read-only",
            ),
            (
                r#"{"cmd":"set","queue":"rpciod","attr":"min_active","value":"300"}"#,
                "cannot set min_active of rpciod: above max_active 256",
            ),
            (
                r#"{"cmd":"set","queue":"rpciod","attr":"min_active","value":"-1"}"#,
                "invalid value `-1` for min_active",
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
        assert!(queues.iter().all(|q| !q.frozen));
        let reply = req(r#"{"cmd":"stats","queue":"rpciod"}"#);
        let stats = reply.stats.unwrap();
        assert_eq!(stats.len(), 1);
        assert_eq!(stats[0].name, "rpciod");
        assert_eq!(req(r#"{"cmd":"stats"}"#).stats.unwrap().len(), 3);
    }

    #[test]
    fn pools_of_a_target_without_pools_are_empty() {
        let view = req(r#"{"cmd":"pools"}"#).pools.unwrap();
        assert!(view.pools.is_empty());
        assert!(view.workqueues.is_empty(), "the mock has no dumps");
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
                    Err(e) => Reply::error(error::chain_text(&e)),
                };
                assert_eq!(reply.to_line().trim_end(), expected, "reply to {sent}");
                pairs += 1;
            }
        }
        assert!(pairs >= 10, "only {pairs} exchanges found");
    }
}
