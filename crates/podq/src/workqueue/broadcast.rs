//! Broadcast: one run of a closure in every pod of a workqueue
//! ([`Workqueue::broadcast`]), or for every CPU of its cpumask
//! ([`Workqueue::broadcast_cpus`], the kernel's `schedule_on_each_cpu`), waiting for
//! all of them.
//!
//! The runs are queued with `config` held, the lock every attribute change holds
//! from start to finish: all of them go to the pwqs of one table, the one current
//! when the call took the lock. A concurrent change therefore lands wholly before
//! (the broadcast sees the new pods) or wholly after (the runs finish on the old
//! pools, which retire afterwards, as any queued item does). The wait happens after
//! the lock is released, so a change never waits for the runs themselves.

use std::sync::Arc;

use podq_topology::CpuSet;

use super::{lock, WqShared};
use crate::entry::Task;
use crate::join::{self, JoinHandle, Panicked};
use crate::pool;
use crate::{Error, Workqueue};

/// One pod's run of a [`Workqueue::broadcast`].
#[derive(Debug)]
pub struct PodRun<T> {
    /// The CPUs of the workqueue's cpumask that the pod serves.
    pub cpus: CpuSet,
    /// What the closure returned, or how it failed.
    pub result: Result<T, Panicked>,
}

/// One CPU's run of a [`Workqueue::broadcast_cpus`].
#[derive(Debug)]
pub struct CpuRun<T> {
    /// The CPU the run was queued for.
    pub cpu: usize,
    /// What the closure returned, or how it failed.
    pub result: Result<T, Panicked>,
}

impl Workqueue {
    /// Runs `f` once in every pod of this workqueue (on the pool serving that pod),
    /// passing the pod's CPUs, and waits for all of them. The runs come back in the
    /// order of their pods' first CPUs; a run that panicked gives its [`Panicked`]
    /// while the others still run.
    ///
    /// Across a concurrent attribute change (scope, strictness, cpumask, nice, or a
    /// topology refresh) each run goes to the pods of one configuration: the one in
    /// force before the change or the one after, never a mix, so the pods' CPUs always
    /// partition the effective cpumask of that configuration. Runs queued before a
    /// change finish on the old pools.
    ///
    /// Refused ([`Error::Draining`]) while the workqueue drains, unless called from one
    /// of its own items. Called from one of its own items, it waits for runs that
    /// need a free active slot, so it must leave `max_active` room for them.
    ///
    /// ```
    /// use podq::{Scope, Topology, Workqueue};
    ///
    /// let wq = Workqueue::builder("doc-broadcast")
    ///     .topology(Topology::synthetic("2s4c2t")?)
    ///     .scope(Scope::Numa)
    ///     .build()?;
    /// let runs = wq.broadcast(|cpus| cpus.len())?;
    /// let sizes: Vec<usize> = runs.into_iter().map(|r| r.result.unwrap()).collect();
    /// assert_eq!(sizes, [8, 8]); // two nodes of 8 CPUs each
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast<T, F>(&self, f: F) -> Result<Vec<PodRun<T>>, Error>
    where
        T: Send + 'static,
        F: Fn(&CpuSet) -> T + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let queued = self.shared().queue_each(pods, |cpus| {
            let f = Arc::clone(&f);
            move || f(&cpus)
        })?;
        Ok(pool::blocking(|| {
            queued
                .into_iter()
                .map(|(cpus, handle)| PodRun {
                    cpus,
                    result: handle.join(),
                })
                .collect()
        }))
    }

    /// Runs `f` once for every CPU of this workqueue's effective cpumask, passing the
    /// CPU, and waits for all of them (the kernel's `schedule_on_each_cpu`). Runs come
    /// back in CPU order; across a concurrent attribute change they cover the cpumask of
    /// one configuration, as [`Workqueue::broadcast`] does.
    ///
    /// # Departure from the kernel
    /// The kernel runs each call on its CPU's bound per-CPU worker. podq has only
    /// unbound pools: each run is queued on the pod of its CPU, as
    /// [`Workqueue::queue_on`] does, and runs on a worker of that pod's pool, which is
    /// not pinned to the CPU (with `strict`, it stays inside the pod).
    ///
    /// ```
    /// use podq::{Scope, Topology, Workqueue};
    ///
    /// let wq = Workqueue::builder("doc-broadcast-cpus")
    ///     .topology(Topology::synthetic("1s2c2t")?)
    ///     .scope(Scope::Smt)
    ///     .build()?;
    /// let runs = wq.broadcast_cpus(|cpu| cpu * 10)?;
    /// let got: Vec<(usize, usize)> = runs.into_iter().map(|r| (r.cpu, r.result.unwrap())).collect();
    /// assert_eq!(got, [(0, 0), (1, 10), (2, 20), (3, 30)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast_cpus<T, F>(&self, f: F) -> Result<Vec<CpuRun<T>>, Error>
    where
        T: Send + 'static,
        F: Fn(usize) -> T + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let queued = self.shared().queue_each(
            |cpu_pwq, effective| {
                effective
                    .iter()
                    .filter(|&c| cpu_pwq.get(c).is_some_and(Option::is_some))
                    .map(|c| (c, CpuSet::single(c)))
                    .collect()
            },
            |cpus| {
                let f = Arc::clone(&f);
                let cpu = cpus.first().expect("a target has a CPU");
                move || f(cpu)
            },
        )?;
        Ok(pool::blocking(|| {
            queued
                .into_iter()
                .map(|(cpus, handle)| CpuRun {
                    cpu: cpus.first().expect("a target has a CPU"),
                    result: handle.join(),
                })
                .collect()
        }))
    }
}

/// The pods of a CPU → pwq table over the effective cpumask: per distinct pwq, the
/// CPU to queue on (its first) and every CPU of `effective` it serves, in order of
/// first CPU. CPUs outside `effective` are left out: the table sends them to the
/// default pwq, which is no pod of theirs.
fn pods<P>(cpu_pwq: &[Option<Arc<P>>], effective: &CpuSet) -> Vec<(usize, CpuSet)> {
    let mut pods: Vec<(usize, CpuSet, &Arc<P>)> = Vec::new();
    for cpu in effective.iter() {
        let Some(Some(pwq)) = cpu_pwq.get(cpu) else {
            continue;
        };
        match pods.iter_mut().find(|(_, _, p)| Arc::ptr_eq(p, pwq)) {
            Some((_, cpus, _)) => {
                cpus.insert(cpu);
            }
            None => pods.push((cpu, CpuSet::single(cpu), pwq)),
        }
    }
    pods.into_iter().map(|(cpu, cpus, _)| (cpu, cpus)).collect()
}

impl WqShared {
    /// Queues one run per target that `targets` reads off the current table (a CPU to
    /// queue on and the CPUs it stands for), built by `make`, all under `config` so
    /// that no attribute change comes between them (module docs).
    fn queue_each<T, R>(
        self: &Arc<Self>,
        targets: impl FnOnce(&[Option<Arc<super::Pwq>>], &CpuSet) -> Vec<(usize, CpuSet)>,
        mut make: impl FnMut(CpuSet) -> R,
    ) -> Result<Vec<(CpuSet, JoinHandle<T>)>, Error>
    where
        T: Send + 'static,
        R: FnOnce() -> T + Send + 'static,
    {
        self.check_accepting()?;
        let cfg = lock(&self.config);
        let table = self.table.load();
        let mut queued = Vec::new();
        for (cpu, cpus) in targets(&table.cpu_pwq, &table.unbound) {
            let (handle, task) = join::pair(make(cpus.clone()));
            // As in `try_spawn`: past the check the run counts as queued before any
            // drain that began since; only teardown could refuse it, which cannot happen
            // while `self` is held by a handle, and the handle would then report it
            // dropped without running.
            let _ = self.enqueue_any(Task::Once(task), Some(cpu), true);
            queued.push((cpus, handle));
        }
        drop(table);
        drop(cfg);
        Ok(queued)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::{AtomicBool, Ordering::Relaxed};
    use crate::testing::fake_topology;
    use podq_topology::Scope;

    /// The pod of the pool the calling worker serves.
    fn worker_pod() -> Option<CpuSet> {
        crate::context::WORKER_POOL.with(|p| p.borrow().as_ref().map(|c| c.key.pod.clone()))
    }

    fn set(list: &str) -> CpuSet {
        CpuSet::parse_list(list).unwrap()
    }

    #[test]
    fn pods_groups_cpus_by_pwq() {
        let (a, b) = (Arc::new(1), Arc::new(2));
        let table = [
            Some(Arc::clone(&a)),
            Some(Arc::clone(&b)),
            None,
            Some(Arc::clone(&a)),
            Some(Arc::clone(&b)),
        ];
        assert_eq!(
            pods(&table, &set("0-4")),
            [(0, set("0,3")), (1, set("1,4"))]
        );
        assert_eq!(pods(&table, &set("1,3")), [(1, set("1")), (3, set("3"))]);
        assert_eq!(pods::<u8>(&[None, None], &set("0-1")), []);
    }

    #[test]
    fn one_run_per_pod_with_its_cpus() {
        // 2 nodes × 2 LLCs × 2 cores × 2 threads: 16 CPUs.
        let wq = Workqueue::builder("bcast-pods")
            .topology(fake_topology(2, 2, 2, 2))
            .scope(Scope::Cache)
            .build()
            .unwrap();
        let runs = wq
            .broadcast(|_| worker_pod().map(|pod| pod.to_list()))
            .unwrap();
        let got: Vec<(String, Option<String>)> = runs
            .into_iter()
            .map(|r| (r.cpus.to_list(), r.result.unwrap()))
            .collect();
        let want = ["0-3", "4-7", "8-11", "12-15"];
        assert_eq!(
            got,
            want.map(|c| (c.to_owned(), Some(c.to_owned()))).to_vec()
        );
    }

    #[test]
    fn follows_the_cpumask() {
        let wq = Workqueue::builder("bcast-mask")
            .topology(fake_topology(2, 1, 2, 1))
            .scope(Scope::Cpu)
            .cpumask(set("1,3"))
            .build()
            .unwrap();
        let cpus: Vec<usize> = wq
            .broadcast_cpus(|cpu| cpu)
            .unwrap()
            .into_iter()
            .map(|r| r.result.unwrap())
            .collect();
        assert_eq!(cpus, [1, 3]);
        let pods: Vec<String> = wq
            .broadcast(|_| ())
            .unwrap()
            .into_iter()
            .map(|r| r.cpus.to_list())
            .collect();
        assert_eq!(pods, ["1", "3"]);
    }

    #[test]
    fn a_panicking_pod_does_not_hide_the_others() {
        let wq = Workqueue::builder("bcast-panic")
            .topology(fake_topology(3, 1, 1, 1))
            .scope(Scope::Numa)
            .build()
            .unwrap();
        let runs = wq
            .broadcast(|cpus| {
                assert!(!cpus.contains(1), "pod 1 fails");
                cpus.first().unwrap()
            })
            .unwrap();
        assert_eq!(runs.len(), 3);
        assert_eq!(*runs[0].result.as_ref().unwrap(), 0);
        let failed = runs[1].result.as_ref().unwrap_err();
        assert!(failed.ran());
        assert_eq!(*runs[2].result.as_ref().unwrap(), 2);
    }

    #[test]
    fn refused_while_draining() {
        let wq = Workqueue::builder("bcast-drain")
            .topology(fake_topology(2, 1, 1, 1))
            .build()
            .unwrap();
        let gate = Arc::new(std::sync::Barrier::new(2));
        let release = Arc::clone(&gate);
        let blocker = wq.spawn(move || {
            release.wait();
        });
        let drainer = {
            let wq = wq.clone();
            std::thread::spawn(move || wq.drain())
        };
        while wq.shared().draining.load(crate::sync::Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let err = wq.broadcast(|_| ()).unwrap_err();
        assert!(matches!(err, Error::Draining { .. }), "{err}");
        gate.wait();
        blocker.join().unwrap();
        drainer.join().unwrap();
    }

    /// Broadcasts while another thread flips the scope between `numa` (2 pods of 4
    /// CPUs) and `cpu` (8 pods of one): every broadcast must see one configuration
    /// whole, each pod's run exactly once.
    #[test]
    fn covers_one_configuration_across_scope_changes() {
        let wq = Workqueue::builder("bcast-change")
            .topology(fake_topology(2, 1, 2, 2))
            .scope(Scope::Numa)
            .build()
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (wq, stop) = (wq.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut flips = 0usize;
                while !stop.load(Relaxed) {
                    let scope = if flips % 2 == 0 {
                        Scope::Cpu
                    } else {
                        Scope::Numa
                    };
                    wq.set_scope(scope).unwrap();
                    flips += 1;
                }
                flips
            })
        };
        let (mut numa, mut cpu) = (0, 0);
        for _ in 0..200 {
            // Each run reports the pod of the pool it actually ran on.
            let runs = wq.broadcast(|_| worker_pod()).unwrap();
            let pods: Vec<String> = runs
                .into_iter()
                .map(|r| {
                    assert_eq!(r.result.unwrap(), Some(r.cpus.clone()));
                    r.cpus.to_list()
                })
                .collect();
            if pods == ["0-3", "4-7"] {
                numa += 1;
            } else {
                assert_eq!(pods, ["0", "1", "2", "3", "4", "5", "6", "7"]);
                cpu += 1;
            }
        }
        stop.store(true, Relaxed);
        let flips = flipper.join().unwrap();
        assert_eq!(numa + cpu, 200);
        assert!(flips > 0);
        wq.flush();
    }
}
