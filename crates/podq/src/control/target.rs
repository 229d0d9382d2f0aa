//! What the server acts on ([`ControlTarget`]) and the whole request → reply mapping
//! ([`dispatch`]). The server proper is written against the trait, so it does not care
//! what it controls; the runtime's target is the registry of exposed workqueues.

use super::attr::{self, Attr, AttrValue, QueueAttrs};
use super::error::chain_text;
use super::param::{self, Param};
use super::protocol::{PoolsView, WorkqueueLimits};
use super::{ControlError, QueueSummary, Reply, Request};
use crate::stats::WorkqueueStats;
use crate::topology::Scope;
use std::time::Duration;

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
    /// Whether it is frozen ([`crate::Workqueue::freeze`]).
    pub frozen: bool,
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

    /// Applies one attribute to a workqueue. Errors: [`ControlError::UnknownQueue`],
    /// [`ControlError::Rejected`] with the runtime's reason.
    fn set_attr(&self, queue: &str, value: AttrValue) -> Result<(), ControlError>;

    /// The process-wide default scope (never `Default`).
    fn default_scope(&self) -> Scope;

    /// Changes the process-wide default scope; workqueues on `default` follow it.
    /// `scope` is never `Default` (the server refuses it before calling).
    fn set_default_scope(&self, scope: Scope) -> Result<(), ControlError>;

    /// Stats snapshots: of every visible workqueue, or of the one named.
    fn stats(&self, queue: Option<&str>) -> Result<Vec<WorkqueueStats>, ControlError>;

    /// State dumps: of every visible workqueue, or of the one named. By default none:
    /// a target that runs no work items has no state to show.
    fn dump(&self, queue: Option<&str>) -> Result<Vec<crate::WorkqueueDump>, ControlError> {
        let _ = queue;
        Ok(Vec::new())
    }

    /// Every worker pool of the process. By default none: a target that runs no
    /// work items has no pools.
    fn pools(&self) -> Result<Vec<crate::WorkerPool>, ControlError> {
        Ok(Vec::new())
    }

    /// A process-wide parameter (`None`: its check is off). By default the process's
    /// own watchdog's.
    fn param(&self, param: Param) -> Option<Duration> {
        match param {
            Param::CpuIntensiveThreshUs => crate::watchdog::cpu_intensive_threshold(),
            Param::WatchdogThresh => crate::watchdog::stall_threshold(),
        }
    }

    /// Sets a process-wide parameter (`None` turns its check off), already parsed and
    /// range-checked. By default the process's own watchdog's.
    fn set_param(&self, param: Param, value: Option<Duration>) -> Result<(), ControlError> {
        match param {
            Param::CpuIntensiveThreshUs => crate::watchdog::set_cpu_intensive_threshold(value),
            Param::WatchdogThresh => crate::watchdog::set_stall_threshold(value),
        }
        .map_err(|e| ControlError::Rejected {
            what: param.name().to_owned(),
            source: Box::new(e),
        })
    }

    /// Re-reads the usable CPUs and re-pods live workqueues; says what it did.
    /// By default the process's own [`crate::topology::refresh`].
    fn refresh(&self) -> Result<crate::topology::Refreshed, ControlError> {
        crate::topology::refresh().map_err(|e| ControlError::Refresh {
            source: Box::new(e),
        })
    }
}

/// Answers one request against `target`. Never panics on any request; every failure is
/// an error reply.
pub(crate) fn dispatch(target: &dyn ControlTarget, request: Request) -> Reply {
    match try_dispatch(target, request) {
        Ok(reply) => reply,
        Err(e) => Reply::error(chain_text(&e)),
    }
}

fn try_dispatch(target: &dyn ControlTarget, request: Request) -> Result<Reply, ControlError> {
    let find = |name: &str| {
        target
            .queue(name)
            .ok_or_else(|| ControlError::UnknownQueue {
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
            if matches!(attr, Attr::MaxActive | Attr::MinActive) && info.attrs.ordered {
                return Err(ControlError::ReadOnly {
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
        Request::GetParam { name } => {
            let param: Param = name.parse()?;
            Ok(Reply::value(param::format_param(
                param,
                target.param(param),
            )))
        }
        Request::SetParam { name, value } => {
            let param: Param = name.parse()?;
            target.set_param(param, param::parse_param(param, &value)?)?;
            Ok(Reply::value(param::format_param(
                param,
                target.param(param),
            )))
        }
        Request::Refresh => Ok(Reply::refreshed(&target.refresh()?)),
        Request::Stats { queue } => {
            if let Some(name) = &queue {
                find(name)?;
            }
            Ok(Reply::stats(target.stats(queue.as_deref())?))
        }
        Request::Pools => Ok(Reply::pools(PoolsView {
            pools: target.pools()?,
            workqueues: target
                .dump(None)?
                .into_iter()
                .map(WorkqueueLimits::of)
                .collect(),
        })),
        Request::Dump { queue } => {
            if let Some(name) = &queue {
                find(name)?;
            }
            Ok(Reply::dumps(target.dump(queue.as_deref())?))
        }
    }
}
