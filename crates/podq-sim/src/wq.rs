//! Workqueues, pool_workqueues and worker pools, driven by `podq-policy`: pwq selection
//! (`select_cpu`), pod masks, per-node `max_active` and admission, kicks, LIFO idle
//! workers with repatriation, idle spinning, reaping and live attribute changes.

use std::collections::VecDeque;
use std::time::Duration;

use podq_policy::{
    admission, kick, may_activate, min_active, node_max_active, pick_idle, pod_cpumask,
    pool_node, select_cpu, should_reap, Admission, Kick, PoolLoad, IDLE_SPIN,
    IDLE_WORKER_TIMEOUT,
};
use podq_topology::{CpuSet, Scope};

use crate::engine::{Op, Role, Sim, Tid};
use crate::events::Ns;
use crate::lock::Side;
use crate::programs::{Act, Item};
use crate::workload::QueueSpec;

/// A per-node (or fallback) active-item counter of one workqueue.
pub struct NodeSlot {
    /// Active items.
    pub nr: usize,
    /// Their limit.
    pub max: usize,
    /// pwqs with inactive items waiting for this counter, in activation order.
    pub pending: VecDeque<usize>,
}

/// A workqueue.
pub struct Wq {
    /// Its attributes.
    pub spec: QueueSpec,
    /// The pwq each CPU's queue calls use, by CPU id.
    pub cpu_pwq: Vec<usize>,
    /// Its unbound cpumask.
    pub unbound: CpuSet,
    /// Round-robin position of `select_cpu`.
    pub rr_last: Option<usize>,
    /// Node counters; the last one is the fallback for pods spanning nodes.
    pub slots: Vec<NodeSlot>,
    /// Every pool it has used (for its lock counts).
    pub pools: Vec<usize>,
}

/// A pool_workqueue: one workqueue's link to one pool.
pub struct Pwq {
    /// Its workqueue.
    pub wq: usize,
    /// Its pool.
    pub pool: usize,
    /// Items waiting for an active slot.
    pub inactive: VecDeque<Item>,
    /// Its node counter.
    pub slot: usize,
    /// On its node counter's pending list.
    pub pending: bool,
}

/// A worker pool, shared by every workqueue with the same pod mask and strictness.
pub struct Pool {
    /// Its pod's CPUs.
    pub pod: CpuSet,
    /// Strict: workers stay in the pod.
    pub strict: bool,
    /// Where its workers may run.
    pub allowed: CpuSet,
    /// Its lock.
    pub lock: usize,
    /// Active items and their pwqs.
    pub worklist: VecDeque<(Item, usize)>,
    /// Idle workers, oldest first, with when they went idle.
    pub idle: Vec<(Tid, Ns)>,
    /// Workers.
    pub nr_workers: usize,
    /// Workers running or about to.
    pub nr_running: usize,
    /// Workers polling the worklist.
    pub nr_spinning: usize,
    /// Spinners not yet told of a push.
    pub spinners: Vec<Tid>,
}

/// What a kick decided, done after the lock is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KickOut {
    /// Nothing.
    Nothing,
    /// Wake this idle worker (and whether it is repatriated).
    Wake(Tid, bool),
    /// Start a worker.
    Create,
}

impl Sim<'_> {
    /// Creates a workqueue with `spec`; returns its index.
    pub fn new_wq(&mut self, spec: QueueSpec) -> usize {
        let usable = self.topo.usable().clone();
        let total = usable.len();
        let max_active = if spec.ordered { 1 } else { spec.max_active };
        let mut slots: Vec<NodeSlot> = self
            .topo
            .nodes()
            .into_iter()
            .map(|n| NodeSlot {
                nr: 0,
                max: node_max_active(
                    max_active,
                    min_active(max_active),
                    self.topo.node_cpus(n).intersection(&usable).len(),
                    total,
                ),
                pending: VecDeque::new(),
            })
            .collect();
        slots.push(NodeSlot {
            nr: 0,
            max: max_active,
            pending: VecDeque::new(),
        });
        let (scope, strict) = (spec.scope, spec.strict);
        self.world.wqs.push(Wq {
            spec,
            cpu_pwq: vec![usize::MAX; self.cpus.len()],
            unbound: usable,
            rr_last: None,
            slots,
            pools: Vec::new(),
        });
        let wq = self.world.wqs.len() - 1;
        self.apply_attrs(wq, scope, strict);
        wq
    }

    /// Installs new pwqs for `scope`/`strict` (the live attribute change). Old pwqs
    /// keep their items and finish them; new queue calls use the new ones.
    pub fn apply_attrs(&mut self, wq: usize, scope: Scope, strict: bool) {
        let ordered = self.world.wqs[wq].spec.ordered;
        let scope = if ordered { Scope::System } else { scope };
        let layout = self
            .topo
            .pods(scope.resolve(Scope::BUILTIN_DEFAULT))
            .expect("a concrete scope of a valid topology has pods");
        let effective = self.world.wqs[wq].unbound.clone();
        let nodes = self.topo.nodes();
        let mut pod_pwq = Vec::with_capacity(layout.len());
        for pod in &layout.pod_cpus {
            let mask = pod_cpumask(pod, &effective);
            let pool = self.pool_for(&mask, strict);
            let slot = pool_node(&mask, |c| self.topo.node_of(c))
                .and_then(|n| nodes.iter().position(|&x| x == n))
                .unwrap_or(nodes.len());
            self.world.pwqs.push(Pwq {
                wq,
                pool,
                inactive: VecDeque::new(),
                slot,
                pending: false,
            });
            pod_pwq.push(self.world.pwqs.len() - 1);
            if !self.world.wqs[wq].pools.contains(&pool) {
                self.world.wqs[wq].pools.push(pool);
            }
        }
        let w = &mut self.world.wqs[wq];
        w.spec.scope = scope;
        w.spec.strict = strict;
        for cpu in effective.iter() {
            if let Some(pod) = layout.pod_of(cpu) {
                w.cpu_pwq[cpu] = pod_pwq[pod];
            }
        }
    }

    fn pool_for(&mut self, pod: &CpuSet, strict: bool) -> usize {
        if let Some(i) = self
            .world
            .pools
            .iter()
            .position(|p| &p.pod == pod && p.strict == strict)
        {
            return i;
        }
        let home = pod.first().and_then(|c| self.topo.node_of(c)).unwrap_or(0);
        let lock = self.new_lock(home);
        let allowed = if strict {
            pod.clone()
        } else {
            self.topo.usable().clone()
        };
        self.world.pools.push(Pool {
            pod: pod.clone(),
            strict,
            allowed,
            lock,
            worklist: VecDeque::new(),
            idle: Vec::new(),
            nr_workers: 0,
            nr_running: 0,
            nr_spinning: 0,
            spinners: Vec::new(),
        });
        self.world.pools.len() - 1
    }

    /// Prepends `ops` (in order) to thread `tid`'s operations.
    pub fn push_ops(&mut self, tid: Tid, ops: &[Op]) {
        let t = &mut self.threads[tid];
        for op in ops.iter().rev() {
            t.ops.push_front(*op);
        }
    }

    /// Start of a queue call by `tid`: the pwq its CPU maps to, then the pool lock.
    pub fn queue_start(&mut self, tid: Tid, wq: usize, item: Item) {
        let cpu = self.threads[tid].cpu;
        let w = &mut self.world.wqs[wq];
        let target = select_cpu(cpu, &w.unbound, w.rr_last);
        if target != cpu {
            w.rr_last = Some(target);
        }
        let pwq = w.cpu_pwq[target];
        let lock = self.world.pools[self.world.pwqs[pwq].pool].lock;
        let call = self.cost.queue_call;
        self.push_ops(
            tid,
            &[
                Op::Compute(call),
                Op::Lock(lock, Side::Enqueue),
                Op::Do(Act::Enqueue { pwq, item }),
            ],
        );
    }

    /// Under the pool lock: admission, then the kick.
    pub fn enqueue(&mut self, tid: Tid, pwq: usize, item: Item) {
        let p = &self.world.pwqs[pwq];
        let (wq, slot, pool) = (p.wq, p.slot, p.pool);
        let s = &self.world.wqs[wq].slots[slot];
        let verdict = admission(
            p.inactive.is_empty(),
            false,
            p.pending,
            may_activate(s.nr, s.max),
        );
        match verdict {
            Admission::Activate => {
                self.world.wqs[wq].slots[slot].nr += 1;
                self.push_item(tid, pool, item, pwq);
            }
            Admission::Wait => {
                let p = &mut self.world.pwqs[pwq];
                p.inactive.push_back(item);
                if !p.pending {
                    p.pending = true;
                    self.world.wqs[wq].slots[slot].pending.push_back(pwq);
                }
            }
        }
        let out = self.kick_locked(pool);
        let lock = self.world.pools[pool].lock;
        let hold = self.cost.pool_hold;
        self.push_ops(
            tid,
            &[
                Op::Compute(hold),
                Op::Unlock(lock),
                Op::Do(Act::Kicked { pool, out }),
                Op::Do(Act::QueueEnd),
            ],
        );
    }

    /// Appends an active item and tells a spinner.
    fn push_item(&mut self, tid: Tid, pool: usize, item: Item, pwq: usize) {
        let cpu = self.threads[tid].cpu;
        let p = &mut self.world.pools[pool];
        p.worklist.push_back((item, pwq));
        if !p.spinners.is_empty() {
            let spinner = p.spinners.remove(0);
            let ns = self.c2c(cpu, self.threads[spinner].cpu);
            self.step_after(spinner, ns);
        }
    }

    fn load(&self, pool: usize) -> PoolLoad {
        let p = &self.world.pools[pool];
        PoolLoad {
            worklist: p.worklist.len(),
            idle: p.idle.len(),
            running: p.nr_running,
            workers: p.nr_workers,
            concurrency: p.pod.len().max(1),
            spinning: p.nr_spinning,
        }
    }

    /// `kick_pool` under the lock: the decision, and the pool's bookkeeping for it.
    pub fn kick_locked(&mut self, pool: usize) -> KickOut {
        match kick(self.load(pool)) {
            Kick::Nothing => KickOut::Nothing,
            Kick::Wake => {
                let p = &self.world.pools[pool];
                let threads = &self.threads;
                let Some((at, repatriate)) =
                    pick_idle(p.idle.len(), |i| threads[p.idle[i].0].cpu, &p.pod, p.strict)
                else {
                    return KickOut::Nothing;
                };
                let p = &mut self.world.pools[pool];
                let (tid, _) = p.idle.remove(at);
                p.nr_running += 1;
                if repatriate {
                    self.counters.repatriations += 1;
                }
                KickOut::Wake(tid, repatriate)
            }
            Kick::Create => {
                let p = &mut self.world.pools[pool];
                p.nr_workers += 1;
                p.nr_running += 1;
                KickOut::Create
            }
        }
    }

    /// After the lock: wake or start the worker the kick chose.
    pub fn kicked(&mut self, tid: Tid, pool: usize, out: KickOut) {
        let cpu = self.threads[tid].cpu;
        match out {
            KickOut::Nothing => {}
            KickOut::Wake(worker, repatriate) => {
                self.wake_worker(worker, cpu, pool, repatriate);
                let call = self.cost.wake_call;
                self.push_ops(tid, &[Op::Compute(call)]);
            }
            KickOut::Create => {
                let create = self.cost.thread_create;
                self.push_ops(
                    tid,
                    &[Op::Compute(create), Op::Do(Act::SpawnWorker { pool })],
                );
            }
        }
    }

    fn wake_worker(&mut self, worker: Tid, waker: usize, pool: usize, repatriate: bool) {
        if repatriate {
            // The worker narrows itself to the pod for this wake-up: the kernel's
            // `wake_cpu` nudge.
            let pod = self.world.pools[pool].pod.clone();
            let hint = pod.first().unwrap_or(waker);
            self.wake(worker, waker, hint, Some(&pod));
        } else {
            let hint = self.threads[worker].cpu;
            self.wake(worker, waker, hint, None);
        }
    }

    /// Starts a worker thread for `pool`, placed in the pod near `creator`'s CPU.
    pub fn spawn_worker(&mut self, creator: Tid, pool: usize) {
        let cpu = self.threads[creator].cpu;
        let p = &self.world.pools[pool];
        let (allowed, pod, lock) = (p.allowed.clone(), p.pod.clone(), p.lock);
        let hint = if pod.contains(cpu) {
            cpu
        } else {
            pod.first().unwrap_or(cpu)
        };
        let tid = self.spawn(
            Role::Worker(pool),
            allowed,
            hint,
            vec![Op::Lock(lock, Side::Dequeue), Op::Do(Act::WorkerTake)],
        );
        self.counters.workers_created += 1;
        self.wake(tid, cpu, hint, Some(&pod));
    }

    /// Under the pool lock: take the next item, or spin once, or go idle.
    pub fn worker_take(&mut self, tid: Tid) {
        let Role::Worker(pool) = self.threads[tid].role else {
            unreachable!("only workers take items")
        };
        let lock = self.world.pools[pool].lock;
        let hold = self.cost.pool_hold;
        if let Some((item, pwq)) = self.world.pools[pool].worklist.pop_front() {
            let out = self.kick_locked(pool);
            self.push_ops(
                tid,
                &[
                    Op::Compute(hold),
                    Op::Unlock(lock),
                    Op::Do(Act::Kicked { pool, out }),
                    Op::Do(Act::RunItem { item, pwq }),
                ],
            );
            return;
        }
        let cpu = self.threads[tid].cpu;
        // podq's spinner yields to other runnable threads on its CPU; the model lets
        // it skip the spin then.
        if !self.threads[tid].spun && self.cpus[cpu].rq.is_empty() {
            self.threads[tid].spun = true;
            self.world.pools[pool].nr_spinning += 1;
            self.push_ops(
                tid,
                &[
                    Op::Compute(hold),
                    Op::Unlock(lock),
                    Op::Spin(pool),
                    Op::Lock(lock, Side::Dequeue),
                    Op::Do(Act::AfterSpin),
                ],
            );
            return;
        }
        self.threads[tid].spun = true;
        let now = self.now;
        let p = &mut self.world.pools[pool];
        p.idle.push((tid, now));
        p.nr_running -= 1;
        self.push_ops(
            tid,
            &[
                Op::Compute(hold),
                Op::Unlock(lock),
                Op::Block,
                Op::Lock(lock, Side::Dequeue),
                Op::Do(Act::WorkerTake),
            ],
        );
    }

    /// The spin itself: poll for `IDLE_SPIN`, cut short by a push.
    pub fn spin(&mut self, tid: Tid, pool: usize) {
        self.world.pools[pool].spinners.push(tid);
        self.step_after(tid, IDLE_SPIN.as_nanos() as f64);
    }

    /// Under the pool lock after a spin.
    pub fn after_spin(&mut self, tid: Tid) {
        let Role::Worker(pool) = self.threads[tid].role else {
            unreachable!("only workers spin")
        };
        let p = &mut self.world.pools[pool];
        p.nr_spinning -= 1;
        p.spinners.retain(|&t| t != tid);
        self.worker_take(tid);
    }

    /// Under the pool lock after an item: release its active slot, activate the next
    /// waiting item of that node counter, then look for more work.
    pub fn item_done(&mut self, tid: Tid, pwq: usize) {
        let (wq, slot) = (self.world.pwqs[pwq].wq, self.world.pwqs[pwq].slot);
        self.world.wqs[wq].slots[slot].nr -= 1;
        self.activate_pending(tid, wq, slot);
        self.worker_take(tid);
    }

    fn activate_pending(&mut self, tid: Tid, wq: usize, slot: usize) {
        let s = &self.world.wqs[wq].slots[slot];
        if !may_activate(s.nr, s.max) {
            return;
        }
        let Some(&pwq) = s.pending.front() else {
            return;
        };
        let Some(item) = self.world.pwqs[pwq].inactive.pop_front() else {
            return;
        };
        let s = &mut self.world.wqs[wq].slots[slot];
        s.nr += 1;
        s.pending.pop_front();
        if self.world.pwqs[pwq].inactive.is_empty() {
            self.world.pwqs[pwq].pending = false;
        } else {
            s.pending.push_back(pwq);
        }
        let pool = self.world.pwqs[pwq].pool;
        self.push_item(tid, pool, item, pwq);
        // The other pool's kick is done at once, its lock's cost not modelled.
        let out = self.kick_locked(pool);
        let cpu = self.threads[tid].cpu;
        match out {
            KickOut::Nothing => {}
            KickOut::Wake(worker, repatriate) => self.wake_worker(worker, cpu, pool, repatriate),
            KickOut::Create => self.spawn_worker(tid, pool),
        }
    }

    /// Reaps idle workers the policy says are too many and idle too long.
    pub fn reap(&mut self) {
        for pool in 0..self.world.pools.len() {
            loop {
                let p = &self.world.pools[pool];
                let Some(&(oldest, since)) = p.idle.first() else {
                    break;
                };
                let busy = p.nr_workers - p.idle.len();
                let idle_for = Duration::from_nanos(self.now - since);
                if !should_reap(p.idle.len(), busy, idle_for, IDLE_WORKER_TIMEOUT) {
                    break;
                }
                let p = &mut self.world.pools[pool];
                p.idle.remove(0);
                p.nr_workers -= 1;
                self.exit(oldest);
                self.counters.workers_reaped += 1;
            }
        }
    }
}
