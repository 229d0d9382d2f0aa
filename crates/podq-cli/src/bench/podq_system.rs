//! podq itself as a benchmarked system: one `Workqueue` per queue, items are re-queued
//! `Work`s, scopes and strictness from the configuration, live scope changes through
//! `Workqueue::set_scope`, pool lock counters from `Workqueue::stats`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use std::time::Duration;

use podq::policy::auto::AutoConfig;
use podq::{Scope, Topology, Work, Workqueue};

use super::system::{Gate, Item, LockCounts, PoolLockCounts, Queue, QueueConfig, System, Task};
use super::workloads::throughput::tiny;

/// podq on one topology (virtual CPUs of a fake one are mapped onto the real CPUs by
/// podq itself).
pub struct Podq {
    topology: Topology,
    auto_window: Duration,
    auto_config: AutoConfig,
}

impl Podq {
    /// podq on `topology`; workqueues on `auto` use this window and controller config.
    pub fn new(topology: Topology, auto_window: Duration, auto_config: AutoConfig) -> Podq {
        Podq {
            topology,
            auto_window,
            auto_config,
        }
    }
}

impl Podq {
    fn podq_queue(
        &self,
        name: &str,
        config: QueueConfig,
        max_active: Option<usize>,
    ) -> Result<PodqQueue> {
        let mut builder = Workqueue::builder(name)
            .scope(config.scope.unwrap_or(Scope::Default))
            .strict(config.strict.unwrap_or(false))
            .topology(self.topology.clone())
            .auto_window(self.auto_window)
            .auto_config(self.auto_config.clone());
        if let Some(n) = max_active {
            builder = builder.max_active(n);
        }
        let wq = builder
            .build()
            .with_context(|| format!("building podq workqueue `{name}` ({})", config.label()))?;
        Ok(PodqQueue {
            wq,
            seen: Mutex::new(BTreeMap::new()),
        })
    }
}

impl System for Podq {
    fn name(&self) -> &'static str {
        "podq"
    }

    fn configs(&self, scopes: &[Scope], strict: &[bool]) -> Vec<QueueConfig> {
        scopes
            .iter()
            .flat_map(|&scope| {
                strict.iter().map(move |&strict| QueueConfig {
                    scope: Some(scope),
                    strict: Some(strict),
                })
            })
            .collect()
    }

    fn new_queue(&self, name: &str, config: QueueConfig) -> Result<Arc<dyn Queue>> {
        Ok(Arc::new(self.podq_queue(name, config, None)?))
    }

    fn new_held_queue(&self, name: &str, config: QueueConfig) -> Result<(Arc<dyn Queue>, Gate)> {
        // podq's pools start workers while items wait, so blocking the workers would
        // not hold items back; `max_active(1)` and one blocker do: everything queued
        // after it waits on the node's inactive list, where all but the first
        // `max_active` items of any flood wait.
        let queue = self.podq_queue(name, config, Some(1))?;
        let gate = Gate::new();
        let blocker = queue.prepare(Arc::new({
            let gate = gate.clone();
            move || gate.enter()
        }));
        blocker.submit();
        gate.wait_entered(1);
        Ok((Arc::new(queue), gate))
    }

    fn enter_cpu(&self, vcpu: usize) {
        // The bench already pinned the thread to the real CPU `vcpu` maps onto; this
        // makes podq pick the pod of the virtual CPU.
        podq::set_thread_cpu(Some(vcpu));
    }

    fn leave_cpu(&self) {
        podq::set_thread_cpu(None);
    }

    fn cpu_probe(&self) -> fn() -> usize {
        podq::current_cpu
    }
}

struct PodqQueue {
    wq: Workqueue,
    /// The last counters seen of every pool this queue ever used, by pool id: a scope
    /// change retires pools, and their counts must not vanish from the totals.
    seen: Mutex<BTreeMap<u64, PoolLockCounts>>,
}

impl Queue for PodqQueue {
    fn prepare(&self, task: Task) -> Box<dyn Item> {
        Box::new(PodqItem {
            wq: self.wq.clone(),
            work: Work::new(move || task()),
        })
    }

    fn spawn_tiny(&self, seq: u64) {
        drop(self.wq.spawn(move || tiny(seq)));
    }

    fn execute_tiny(&self, seq: u64) {
        self.wq.execute(move || {
            tiny(seq);
        });
    }

    fn flush(&self) -> bool {
        self.wq.flush();
        true
    }

    fn set_scope(&self, scope: Scope) -> Result<()> {
        self.wq
            .set_scope(scope)
            .with_context(|| format!("setting {}'s scope to {scope}", self.wq.name()))
    }

    fn lock_counts(&self) -> Option<PoolLockCounts> {
        let convert = |l: &podq::stats::LockStats| LockCounts {
            acquisitions: l.acquisitions,
            contended: l.contended,
            wait_ns: l.wait_ns,
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for pool in &self.wq.stats().pools {
            seen.insert(
                pool.id,
                PoolLockCounts {
                    enqueue: convert(&pool.enqueue_lock),
                    dequeue: convert(&pool.dequeue_lock),
                },
            );
        }
        let mut total = PoolLockCounts::default();
        for counts in seen.values() {
            total.add(counts);
        }
        Some(total)
    }

    fn auto(&self) -> Option<podq::auto::AutoStats> {
        self.wq.stats().auto
    }

    fn totals(&self) -> Option<podq::stats::Totals> {
        Some(self.wq.stats().totals)
    }

    fn coalesces(&self) -> bool {
        true
    }

    fn pools(&self) -> Option<usize> {
        Some(self.wq.stats().pools.len())
    }
}

struct PodqItem {
    wq: Workqueue,
    work: Work,
}

impl Item for PodqItem {
    fn submit(&self) -> bool {
        // The closed-loop workloads re-queue an item only after its run signalled
        // completion, and the PENDING bit clears before the function runs, so there
        // this always queues; the open-loop `throughput` counts coalesced calls.
        self.wq.queue(&self.work)
    }
}
