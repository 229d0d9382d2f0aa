//! An in-memory [`ControlTarget`] for tests: three queues, a default scope, the
//! parameters, and a runtime-style refusal (`nice` -7) to exercise the `Rejected` path.

use crate::sync::unmodelled::Mutex;

use std::time::Duration;

use super::{AttrValue, ControlError, ControlTarget, Param, QueueAttrs, QueueInfo};
use crate::stats::{Totals, WorkqueueStats};
use crate::topology::{CpuSet, Scope};
use crate::Attrs;

/// A cause given as plain text (a target's refusal).
#[derive(Debug)]
pub(crate) struct Reason(pub(crate) String);

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Reason {}

/// A stats snapshot with the queue's attributes and no pools.
pub(crate) fn stats_of(name: &str, a: &QueueAttrs) -> WorkqueueStats {
    WorkqueueStats {
        name: name.to_owned(),
        attrs: Attrs {
            scope: a.scope,
            strict: a.strict,
            cpumask: a.cpumask.clone(),
            nice: a.nice,
            max_active: a.max_active,
            min_active: a.min_active,
            ordered: a.ordered,
        },
        effective_scope: a.effective_scope,
        auto: None,
        totals: Totals::default(),
        pools: Vec::new(),
        watchdog: Default::default(),
    }
}

/// Lock-guarded state (L: the mutex).
struct State {
    /// L: the queues, sorted by name; `effective_scope` is recomputed on read.
    queues: Vec<QueueInfo>,
    /// L: the process default.
    default_scope: Scope,
    /// L: the parameters, in [`Param::ALL`]'s order (the process's are left alone).
    params: [Option<Duration>; 2],
}

pub(crate) struct MockTarget {
    state: Mutex<State>,
}

impl MockTarget {
    pub(crate) fn new() -> MockTarget {
        let attrs = |scope, ordered| QueueAttrs {
            scope,
            effective_scope: scope,
            strict: false,
            cpumask: CpuSet::first_n(2),
            nice: 0,
            max_active: if ordered { 1 } else { 256 },
            min_active: if ordered { 1 } else { 8 },
            ordered,
        };
        let queue = |name: &str, a| QueueInfo {
            name: name.to_owned(),
            attrs: a,
            nr_cpu_ids: 2,
            frozen: false,
        };
        MockTarget {
            state: Mutex::new(State {
                queues: vec![
                    queue("nfsiod", attrs(Scope::Cache, false)),
                    queue("ordered_wq", attrs(Scope::System, true)),
                    queue("rpciod", attrs(Scope::Default, false)),
                ],
                default_scope: Scope::CacheShard,
                params: [
                    Some(Duration::from_millis(10)),
                    Some(Duration::from_secs(30)),
                ],
            }),
        }
    }
}

impl ControlTarget for MockTarget {
    fn queues(&self) -> Vec<QueueInfo> {
        let state = self.state.lock().unwrap();
        let default = state.default_scope;
        state
            .queues
            .iter()
            .cloned()
            .map(|mut q| {
                q.attrs.effective_scope = q.attrs.scope.resolve(default);
                q
            })
            .collect()
    }

    fn set_attr(&self, queue: &str, value: AttrValue) -> Result<(), ControlError> {
        let mut state = self.state.lock().unwrap();
        let q = state
            .queues
            .iter_mut()
            .find(|q| q.name == queue)
            .ok_or_else(|| ControlError::UnknownQueue {
                name: queue.to_owned(),
            })?;
        let a = &mut q.attrs;
        match value {
            AttrValue::AffinityScope(s) => a.scope = s,
            AttrValue::AffinityStrict(s) => a.strict = s,
            AttrValue::Cpumask(m) => a.cpumask = m,
            AttrValue::MaxActive(m) => {
                a.max_active = m;
                a.min_active = a.min_active.min(m);
            }
            AttrValue::MinActive(m) if m > a.max_active => {
                return Err(ControlError::Rejected {
                    what: format!("min_active of {queue}"),
                    source: Box::new(Reason(format!("above max_active {}", a.max_active))),
                })
            }
            AttrValue::MinActive(m) => a.min_active = m,
            AttrValue::Nice(-7) => {
                return Err(ControlError::Rejected {
                    what: format!("nice of {queue}"),
                    source: Box::new(Reason("the mock refuses -7".into())),
                })
            }
            AttrValue::Nice(n) => a.nice = n,
        }
        Ok(())
    }

    fn default_scope(&self) -> Scope {
        self.state.lock().unwrap().default_scope
    }

    fn set_default_scope(&self, scope: Scope) -> Result<(), ControlError> {
        self.state.lock().unwrap().default_scope = scope;
        Ok(())
    }

    fn param(&self, param: Param) -> Option<Duration> {
        self.state.lock().unwrap().params[param as usize]
    }

    fn set_param(&self, param: Param, value: Option<Duration>) -> Result<(), ControlError> {
        self.state.lock().unwrap().params[param as usize] = value;
        Ok(())
    }

    fn stats(&self, queue: Option<&str>) -> Result<Vec<WorkqueueStats>, ControlError> {
        Ok(self
            .queues()
            .iter()
            .filter(|q| queue.map_or(true, |n| n == q.name))
            .map(|q| stats_of(&q.name, &q.attrs))
            .collect())
    }
}
