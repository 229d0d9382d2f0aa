//! Which workqueues are visible: the opt-in of the kernel's `WQ_SYSFS`. A workqueue
//! registers itself under its name; the registry keeps only a `Weak` reference to its
//! shared state, never a user handle, so being visible (or a request in progress)
//! never keeps a workqueue alive; the drop of its last handle takes it off the
//! registry before anything else.
//!
//! Field legend: L: guarded by the mutex that holds it.

use crate::sync::unmodelled::Mutex;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, PoisonError, Weak};

use super::{AttrValue, ControlError, ControlTarget, QueueAttrs, QueueInfo};
use crate::stats::WorkqueueStats;
use crate::topology::Scope;

/// A workqueue as the control plane drives it; the runtime implements this for its
/// shared workqueue state.
pub(crate) trait ControlledQueue: Send + Sync {
    /// The requested attributes, with `effective_scope` resolved.
    fn attrs(&self) -> QueueAttrs;
    /// The highest possible CPU of the queue's topology plus one.
    fn nr_cpu_ids(&self) -> usize;
    /// Whether it is frozen.
    fn frozen(&self) -> bool;
    /// Applies one attribute; a refusal is [`ControlError::Rejected`] with the reason.
    /// (By `Arc`: an attribute change makes pwqs that hold the queue.)
    fn apply(self: Arc<Self>, value: AttrValue) -> Result<(), ControlError>;
    /// The stats snapshot.
    fn stats(&self) -> WorkqueueStats;
    /// The state dump ([`crate::Workqueue::dump`]).
    fn dump(&self) -> crate::WorkqueueDump;
}

/// The process-wide default scope, as the control plane reads and changes it.
pub(crate) trait DefaultScope: Send + Sync {
    /// The current default (never `Default`).
    fn get(&self) -> Scope;
    /// Changes it; queues on `default` follow.
    fn set(&self, scope: Scope) -> Result<(), ControlError>;
}

/// The visible workqueues of a process, by name.
#[derive(Default)]
pub(crate) struct Registry {
    /// L: name → queue; entries whose queue is gone are pruned on the next access.
    entries: Mutex<BTreeMap<String, Weak<dyn ControlledQueue>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.live().iter().map(|(n, _)| n))
            .finish()
    }
}

impl Registry {
    /// The process's registry, which the control server serves.
    pub(crate) fn global() -> &'static Arc<Registry> {
        static GLOBAL: OnceLock<Arc<Registry>> = OnceLock::new();
        GLOBAL.get_or_init(Arc::default)
    }

    /// Makes `queue` visible as `name`. A live queue already holding the name keeps it
    /// and this one is refused, as the kernel refuses a second `WQ_SYSFS` device of the
    /// same name.
    pub(crate) fn register(
        &self,
        name: &str,
        queue: Weak<dyn ControlledQueue>,
    ) -> Result<(), ControlError> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|_, q| q.strong_count() > 0);
        if entries.contains_key(name) {
            return Err(ControlError::NameTaken {
                name: name.to_owned(),
            });
        }
        entries.insert(name.to_owned(), queue);
        Ok(())
    }

    /// Hides `queue` if it is the one registered as `name` (a no-op otherwise: another
    /// queue may hold the name since this one was hidden).
    pub(crate) fn unregister(&self, name: &str, queue: *const ()) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries
            .get(name)
            .is_some_and(|q| std::ptr::eq(q.as_ptr().cast::<()>(), queue))
        {
            entries.remove(name);
        }
    }

    /// The live queues, sorted by name.
    fn live(&self) -> Vec<(String, Arc<dyn ControlledQueue>)> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|_, q| q.strong_count() > 0);
        entries
            .iter()
            .filter_map(|(name, q)| Some((name.clone(), q.upgrade()?)))
            .collect()
    }

    /// The queue registered as `name`, for one request.
    pub(crate) fn get(&self, name: &str) -> Result<Arc<dyn ControlledQueue>, ControlError> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .and_then(Weak::upgrade)
            .ok_or_else(|| ControlError::UnknownQueue {
                name: name.to_owned(),
            })
    }
}

/// A [`ControlTarget`] over a registry and the process default scope.
#[derive(Debug)]
pub(crate) struct RegistryTarget<D> {
    registry: Arc<Registry>,
    defaults: D,
}

impl<D: DefaultScope> RegistryTarget<D> {
    /// Serves the queues of `registry`, and `defaults` for the default scope.
    pub(crate) fn new(registry: Arc<Registry>, defaults: D) -> Self {
        RegistryTarget { registry, defaults }
    }
}

fn info(name: String, queue: &dyn ControlledQueue) -> QueueInfo {
    QueueInfo {
        name,
        attrs: queue.attrs(),
        nr_cpu_ids: queue.nr_cpu_ids(),
        frozen: queue.frozen(),
    }
}

impl<D: DefaultScope> ControlTarget for RegistryTarget<D> {
    fn queues(&self) -> Vec<QueueInfo> {
        self.registry
            .live()
            .into_iter()
            .map(|(name, q)| info(name, &*q))
            .collect()
    }

    fn queue(&self, name: &str) -> Option<QueueInfo> {
        let q = self.registry.get(name).ok()?;
        Some(info(name.to_owned(), &*q))
    }

    fn set_attr(&self, queue: &str, value: AttrValue) -> Result<(), ControlError> {
        self.registry.get(queue)?.apply(value)
    }

    fn default_scope(&self) -> Scope {
        self.defaults.get()
    }

    fn set_default_scope(&self, scope: Scope) -> Result<(), ControlError> {
        self.defaults.set(scope)
    }

    fn stats(&self, queue: Option<&str>) -> Result<Vec<WorkqueueStats>, ControlError> {
        match queue {
            Some(name) => Ok(vec![self.registry.get(name)?.stats()]),
            None => Ok(self
                .registry
                .live()
                .iter()
                .map(|(_, q)| q.stats())
                .collect()),
        }
    }

    fn pools(&self) -> Result<Vec<crate::WorkerPool>, ControlError> {
        Ok(crate::worker_pools())
    }

    fn dump(&self, queue: Option<&str>) -> Result<Vec<crate::WorkqueueDump>, ControlError> {
        match queue {
            Some(name) => Ok(vec![self.registry.get(name)?.dump()]),
            None => Ok(self.registry.live().iter().map(|(_, q)| q.dump()).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::mock::{stats_of, Reason};
    use super::super::{dispatch, protocol::parse_request, Reply};
    use super::*;
    use crate::topology::CpuSet;

    /// L: the attributes.
    struct FakeQueue {
        name: &'static str,
        attrs: Mutex<QueueAttrs>,
    }

    impl ControlledQueue for FakeQueue {
        fn attrs(&self) -> QueueAttrs {
            self.attrs.lock().unwrap().clone()
        }
        fn nr_cpu_ids(&self) -> usize {
            16
        }
        fn frozen(&self) -> bool {
            false
        }
        fn apply(self: Arc<Self>, value: AttrValue) -> Result<(), ControlError> {
            match value {
                AttrValue::Nice(n) => self.attrs.lock().unwrap().nice = n,
                other => {
                    return Err(ControlError::Rejected {
                        what: format!("{} of {}", other.attr(), self.name),
                        source: Box::new(Reason("the fake only changes nice".into())),
                    })
                }
            }
            Ok(())
        }
        fn stats(&self) -> WorkqueueStats {
            stats_of(self.name, &self.attrs())
        }
        fn dump(&self) -> crate::WorkqueueDump {
            let a = self.attrs();
            crate::WorkqueueDump {
                name: self.name.to_owned(),
                ordered: a.ordered,
                frozen: false,
                max_active: a.max_active,
                min_active: a.min_active,
                in_flight: 0,
                pwqs: Vec::new(),
                running: Vec::new(),
                pools: Vec::new(),
                cpu_pools: Vec::new(),
                default_pool: None,
                nodes: Vec::new(),
            }
        }
    }

    struct FixedDefault;

    impl DefaultScope for FixedDefault {
        fn get(&self) -> Scope {
            Scope::Numa
        }
        fn set(&self, scope: Scope) -> Result<(), ControlError> {
            Err(ControlError::Rejected {
                what: "the default scope".into(),
                source: Box::new(Reason(format!("fixed, not {scope}"))),
            })
        }
    }

    fn queue(name: &'static str) -> Arc<FakeQueue> {
        Arc::new(FakeQueue {
            name,
            attrs: Mutex::new(QueueAttrs {
                scope: Scope::Default,
                effective_scope: Scope::Numa,
                strict: false,
                cpumask: CpuSet::first_n(16),
                nice: 0,
                max_active: 8,
                min_active: 8,
                ordered: false,
            }),
        })
    }

    fn run(target: &dyn ControlTarget, line: &str) -> Reply {
        dispatch(target, parse_request(line.as_bytes()).unwrap())
    }

    #[test]
    fn visibility_follows_registration_and_lifetime() {
        let registry = Arc::new(Registry::default());
        let target = RegistryTarget::new(Arc::clone(&registry), FixedDefault);
        let a = queue("a");
        let b = queue("b");
        let weak_a: Weak<dyn ControlledQueue> = Arc::downgrade(&a) as Weak<dyn ControlledQueue>;
        registry.register("a", weak_a.clone()).unwrap();
        registry
            .register("b", Arc::downgrade(&b) as Weak<dyn ControlledQueue>)
            .unwrap();
        let err = registry.register("a", weak_a).unwrap_err().to_string();
        assert!(err.contains("`a`"), "{err}");
        let names =
            |t: &dyn ControlTarget| t.queues().into_iter().map(|q| q.name).collect::<Vec<_>>();
        assert_eq!(names(&target), ["a", "b"]);
        assert_eq!(target.queue("a").unwrap().nr_cpu_ids, 16);
        assert_eq!(
            run(&target, r#"{"cmd":"get","queue":"a","attr":"cpumask"}"#),
            Reply::value("ffff".into())
        );
        drop(b);
        assert_eq!(names(&target), ["a"], "a dropped queue disappears");
        let b2 = queue("b");
        registry
            .register("b", Arc::downgrade(&b2) as Weak<dyn ControlledQueue>)
            .unwrap();
        // Only the queue registered under the name is hidden by its own call.
        registry.unregister("a", Arc::as_ptr(&b2).cast());
        assert_eq!(names(&target), ["a", "b"]);
        registry.unregister("a", Arc::as_ptr(&a).cast());
        assert_eq!(names(&target), ["b"]);
        let err = run(&target, r#"{"cmd":"stats","queue":"a"}"#);
        assert_eq!(err.error_text(), Some("unknown workqueue `a`"));
        assert_eq!(run(&target, r#"{"cmd":"stats"}"#).stats.unwrap().len(), 1);
    }

    #[test]
    fn one_call_serves_the_global_registry() {
        let q = queue("registry_test_queue");
        Registry::global()
            .register(
                "registry_test_queue",
                Arc::downgrade(&q) as Weak<dyn ControlledQueue>,
            )
            .unwrap();
        let server = super::super::start().unwrap();
        let expected = super::super::socket_path_for_pid(std::process::id());
        assert_eq!(server.path(), expected);
        let mut client =
            super::super::Client::connect(server.path(), std::time::Duration::from_secs(10))
                .unwrap();
        let list = client
            .call(&super::super::Request::List)
            .unwrap()
            .queues
            .unwrap();
        assert!(list.iter().any(|s| s.name == "registry_test_queue"));
        Registry::global().unregister("registry_test_queue", Arc::as_ptr(&q).cast());
    }

    #[test]
    fn changes_and_refusals_reach_the_queue() {
        let registry = Arc::new(Registry::default());
        let target = RegistryTarget::new(Arc::clone(&registry), FixedDefault);
        let q = queue("rpciod");
        registry
            .register("rpciod", Arc::downgrade(&q) as Weak<dyn ControlledQueue>)
            .unwrap();
        assert_eq!(
            run(
                &target,
                r#"{"cmd":"set","queue":"rpciod","attr":"nice","value":"5"}"#
            ),
            Reply::value("5".into())
        );
        assert_eq!(q.attrs().nice, 5);
        let reply = run(
            &target,
            r#"{"cmd":"set","queue":"rpciod","attr":"affinity_strict","value":"1"}"#,
        );
        assert_eq!(
            reply.error_text(),
            Some("cannot set affinity_strict of rpciod: the fake only changes nice")
        );
        let reply = run(&target, r#"{"cmd":"set_default_scope","value":"smt"}"#);
        assert_eq!(
            reply.error_text(),
            Some("cannot set the default scope: fixed, not smt")
        );
        assert_eq!(
            run(
                &target,
                r#"{"cmd":"get","queue":"rpciod","attr":"affinity_scope"}"#
            ),
            Reply::value("default (numa)".into())
        );
    }
}
