//! Workqueues, pool_workqueues and worker pools, driven by `podq-policy`: pwq selection
//! (`select_cpu`), pod masks, per-node `max_active` and admission, kicks, LIFO idle
//! workers with repatriation, idle spinning, reaping and live attribute changes.

use std::collections::VecDeque;
use std::time::Duration;

use podq_policy::{
    activation, admit, batch_take_after_long_items, free_slots, idle_step, kick, may_activate,
    node_limits, pick_idle, pick_pwq, pod_cpumask, pool_key, pool_node, reap, Activation,
    Admission, IdleStep, IdleWorkers, Kick, PoolAttrs, PoolKey, PoolLoad, PwqChoice, PwqQueue,
    IDLE_SPIN, IDLE_WORKER_TIMEOUT,
};
use podq_topology::{CpuSet, Scope};

use crate::engine::{Op, Role, Sim, Tid};
use crate::events::Ns;
use crate::lock::Side;
use crate::programs::{Act, Item};
use crate::workload::{QueueSpec, WorkerCap, Worklist};

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
    /// The most items that were active at once.
    pub peak_active: usize,
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

/// A worker pool, shared by every workqueue whose pod maps to an equal key.
pub struct Pool {
    /// Its key (pod, strictness, cpumask when not strict).
    pub key: PoolKey,
    /// Its pod's CPUs.
    pub pod: CpuSet,
    /// Strict: workers stay in the pod.
    pub strict: bool,
    /// Where its workers may run.
    pub allowed: CpuSet,
    /// The lock its queuers take: the pool lock, or with the ring model
    /// ([`Worklist::Ring`]) in a pool of several CPUs the ring's tail line.
    pub lock: usize,
    /// The lock its workers take: `lock` itself, or the ring's head line.
    pub take_lock: usize,
    /// How many of its workers may run at once ([`WorkerCap`]): `kick`'s concurrency.
    pub running_cap: usize,
    /// Its workers take their share of the waiting items per acquisition
    /// (`batch_take`, the runtime's), not one (the kernel's).
    pub batches: bool,
    /// Items pushed onto the worklist so far.
    pub pushed: u64,
    /// Items workers took from it so far.
    pub taken: u64,
    /// Time its workers spent in items so far (start to the lock after the item).
    pub busy_ns: Ns,
    /// Items its workers finished so far (each one's time is in `busy_ns`).
    pub finished: u64,
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
    /// The spin budget `idle_step` gave.
    pub spin_for: Duration,
    /// The CPU-intensive threshold its workers' items are held to, if any.
    pub cpu_intensive: Option<Duration>,
    /// Workers out of `nr_running` for a long item.
    pub out_for_long_items: usize,
    /// Claims left that take one item each after a long item.
    pub single_takes: u32,
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
        let max_active = if spec.ordered { 1 } else { spec.max_active };
        let limits = node_limits(max_active, &usable, self.topo);
        let slot = |max| NodeSlot {
            nr: 0,
            max,
            pending: VecDeque::new(),
        };
        let mut slots: Vec<NodeSlot> = limits.per_node.iter().map(|&(_, m)| slot(m)).collect();
        slots.push(slot(limits.fallback));
        let (scope, strict) = (spec.scope, spec.strict);
        self.world.wqs.push(Wq {
            spec,
            cpu_pwq: vec![usize::MAX; self.cpus.len()],
            unbound: usable,
            rr_last: None,
            slots,
            pools: Vec::new(),
            peak_active: 0,
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
        let (worklist, worker_cap, cpu_intensive) = {
            let spec = &self.world.wqs[wq].spec;
            (spec.worklist, spec.worker_cap, spec.cpu_intensive)
        };
        let mut pod_pwq = Vec::with_capacity(layout.len());
        for pod in &layout.pod_cpus {
            let mask = pod_cpumask(pod, &effective);
            let pool = self.pool_for(
                mask.clone(),
                strict,
                &effective,
                (worklist, worker_cap, cpu_intensive),
            );
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

    fn pool_for(
        &mut self,
        pod: CpuSet,
        strict: bool,
        effective: &CpuSet,
        (worklist, worker_cap, cpu_intensive): (Worklist, WorkerCap, Option<Duration>),
    ) -> usize {
        let attrs = PoolAttrs {
            topology: 0,
            strict,
            nice: 0,
            idle_timeout: IDLE_WORKER_TIMEOUT,
        };
        let key = pool_key(pod.clone(), &attrs, effective);
        if let Some(i) = self.world.pools.iter().position(|p| p.key == key) {
            return i;
        }
        let home = pod.first().and_then(|c| self.topo.node_of(c)).unwrap_or(0);
        let lock = self.new_lock(home);
        // As the runtime's `Worklist::for_pod`: a ring only where several CPUs share it.
        let take_lock = if worklist == Worklist::Ring && key.concurrency() > 1 {
            self.new_lock(home)
        } else {
            lock
        };
        let allowed = key.allowed_cpus().clone();
        // The kernel's unbound pools, which `Unlimited` models, have no count to leave.
        let (running_cap, cpu_intensive) = match worker_cap {
            WorkerCap::PodCpus => (key.concurrency(), cpu_intensive),
            WorkerCap::Unlimited => (usize::MAX, None),
        };
        self.world.pools.push(Pool {
            running_cap,
            key,
            pod,
            strict,
            allowed,
            lock,
            take_lock,
            batches: worklist == Worklist::Ring,
            pushed: 0,
            taken: 0,
            busy_ns: 0,
            finished: 0,
            worklist: VecDeque::new(),
            idle: Vec::new(),
            nr_workers: 0,
            nr_running: 0,
            nr_spinning: 0,
            spinners: Vec::new(),
            spin_for: IDLE_SPIN,
            cpu_intensive,
            out_for_long_items: 0,
            single_takes: 0,
        });
        self.world.pools.len() - 1
    }

    /// The critical section of `pool`'s lock: none for a ring's claim.
    fn hold(&self, pool: usize) -> f64 {
        let p = &self.world.pools[pool];
        if p.take_lock == p.lock {
            self.cost.pool_hold
        } else {
            0.0
        }
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
        let pick = pick_pwq(
            None,
            |c| w.cpu_pwq.get(c).is_some_and(|&p| p != usize::MAX),
            cpu,
            &w.unbound,
            w.rr_last,
        );
        if pick.rr_last.is_some() {
            w.rr_last = pick.rr_last;
        }
        let pwq = match pick.pwq {
            PwqChoice::Cpu(c) => w.cpu_pwq[c],
            // Every usable CPU has a pwq in the simulator: the table covers the mask.
            PwqChoice::Default => unreachable!("every CPU of the mask has a pwq"),
        };
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
        let queue = PwqQueue {
            inactive: p.inactive.len(),
            plugged: false,
            on_pending: p.pending,
        };
        let s = &mut self.world.wqs[wq].slots[slot];
        let verdict = admit(queue, || {
            let free = may_activate(s.nr, s.max);
            s.nr += usize::from(free);
            free
        });
        match verdict.admission {
            Admission::Activate => {
                self.note_active(wq);
                self.push_item(tid, pool, item, pwq);
            }
            Admission::Wait => {
                self.world.pwqs[pwq].inactive.push_back(item);
                if verdict.join_pending {
                    self.world.pwqs[pwq].pending = true;
                    self.world.wqs[wq].slots[slot].pending.push_back(pwq);
                    // A slot may have been freed before the pwq joined the list.
                    self.activate_pending(tid, wq, slot);
                }
            }
        }
        let out = self.kick_locked(pool);
        let lock = self.world.pools[pool].lock;
        let hold = self.hold(pool);
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

    fn note_active(&mut self, wq: usize) {
        let w = &mut self.world.wqs[wq];
        let active: usize = w.slots.iter().map(|s| s.nr).sum();
        w.peak_active = w.peak_active.max(active);
    }

    /// Appends an active item and tells a spinner.
    fn push_item(&mut self, tid: Tid, pool: usize, item: Item, pwq: usize) {
        let cpu = self.threads[tid].cpu;
        let p = &mut self.world.pools[pool];
        p.worklist.push_back((item, pwq));
        p.pushed += 1;
        if !p.spinners.is_empty() {
            let spinner = p.spinners.remove(0);
            self.threads[spinner].spinning = false;
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
            concurrency: p.running_cap,
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
        let (allowed, pod, lock) = (p.allowed.clone(), p.pod.clone(), p.take_lock);
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
        let lock = self.world.pools[pool].take_lock;
        let hold = self.hold(pool);
        let p = &mut self.world.pools[pool];
        if let Some((item, pwq)) = p.worklist.pop_front() {
            let share = if p.batches {
                let one_at_a_time = p.single_takes > 0;
                p.single_takes = p.single_takes.saturating_sub(1);
                batch_take_after_long_items(
                    p.worklist.len() + 1,
                    p.key.concurrency(),
                    one_at_a_time,
                )
            } else {
                1
            };
            let rest = p.worklist.drain(..share - 1);
            self.threads[tid].batch.extend(rest);
            self.world.pools[pool].taken += share as u64;
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
        let budget = if self.cpus[cpu].rq.is_empty() {
            IDLE_SPIN
        } else {
            Duration::ZERO
        };
        let step = idle_step(self.threads[tid].spun, budget);
        self.threads[tid].spun = true;
        if let IdleStep::Spin(budget) = step {
            self.world.pools[pool].spin_for = budget;
            self.world.pools[pool].nr_spinning += 1;
            self.push_ops(
                tid,
                &[
                    Op::Compute(hold),
                    Op::Unlock(lock),
                    Op::Spin(pool),
                    Op::Do(Act::SpinEnd),
                    Op::Lock(lock, Side::Dequeue),
                    Op::Do(Act::AfterSpin),
                ],
            );
            return;
        }
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

    /// The spin itself: poll for `IDLE_SPIN`, cut short by a push, or by a thread
    /// that may run on this CPU: one already waiting when the spin starts (it may have
    /// arrived since `worker_take` looked), or one arriving during it (`on_arrive`).
    pub fn spin(&mut self, tid: Tid, pool: usize) {
        self.world.pools[pool].spinners.push(tid);
        self.threads[tid].spinning = true;
        let budget = if self.cpus[self.threads[tid].cpu].rq.is_empty() {
            self.world.pools[pool].spin_for.as_nanos() as f64
        } else {
            0.0
        };
        self.step_after(tid, budget);
    }

    /// The spin is over (timed out or told of a push): no more notifications.
    pub fn spin_end(&mut self, tid: Tid) {
        self.threads[tid].spinning = false;
        if let Role::Worker(pool) = self.threads[tid].role {
            self.world.pools[pool].spinners.retain(|&t| t != tid);
        }
    }

    /// Under the pool lock after a spin.
    pub fn after_spin(&mut self, tid: Tid) {
        let Role::Worker(pool) = self.threads[tid].role else {
            unreachable!("only workers spin")
        };
        self.world.pools[pool].nr_spinning -= 1;
        self.worker_take(tid);
    }

    /// After an item (under the pool lock unless the worker's batch has more): release
    /// its active slot, activate the next waiting item of that node counter, then run
    /// the batch's next item or look for more work.
    pub fn item_done(&mut self, tid: Tid, pwq: usize) {
        let pool = self.world.pwqs[pwq].pool;
        self.world.pools[pool].busy_ns += self.now - self.threads[tid].item_since;
        self.long_item_ended(tid, pool);
        self.world.pools[pool].finished += 1;
        let (wq, slot) = (self.world.pwqs[pwq].wq, self.world.pwqs[pwq].slot);
        self.world.wqs[wq].slots[slot].nr -= 1;
        self.activate_pending(tid, wq, slot);
        let take_lock = self.world.pools[pool].take_lock;
        match self.threads[tid].batch.pop_front() {
            Some((item, pwq)) => self.push_ops(tid, &[Op::Do(Act::RunItem { item, pwq })]),
            // The watchdog handed its batch back during the item (`long_items.rs`), so
            // it ended the item without the lock `run_item` plans for an empty batch.
            None if !self.locks[take_lock].held_by(tid) => self.push_ops(
                tid,
                &[
                    Op::Lock(take_lock, crate::lock::Side::Dequeue),
                    Op::Do(Act::WorkerTake),
                ],
            ),
            None => self.worker_take(tid),
        }
    }

    fn activate_pending(&mut self, tid: Tid, wq: usize, slot: usize) {
        let s = &self.world.wqs[wq].slots[slot];
        let slots = free_slots(s.nr, s.max);
        if slots == 0 {
            return;
        }
        let Some(&pwq) = s.pending.front() else {
            return;
        };
        let queue = PwqQueue {
            inactive: self.world.pwqs[pwq].inactive.len(),
            plugged: false,
            on_pending: true,
        };
        let s = &mut self.world.wqs[wq].slots[slot];
        s.pending.pop_front();
        let (count, requeue) = match activation(queue, slots) {
            Activation::Leave => {
                self.world.pwqs[pwq].pending = false;
                return;
            }
            Activation::Take { count, requeue } => (count, requeue),
        };
        if requeue {
            s.pending.push_back(pwq);
        } else {
            self.world.pwqs[pwq].pending = false;
        }
        let pool = self.world.pwqs[pwq].pool;
        for _ in 0..count {
            self.world.wqs[wq].slots[slot].nr += 1;
            self.note_active(wq);
            let Some(item) = self.world.pwqs[pwq].inactive.pop_front() else {
                unreachable!("activation takes only items a pwq has")
            };
            self.push_item(tid, pool, item, pwq);
        }
        // The other pool's kick is done at once, its lock's cost not modelled.
        self.kick_now(tid, pool);
    }

    /// Kicks `pool` for `by` and wakes or starts the worker chosen at once, with no
    /// cost to `by`: a kick made outside the pool's own queuers and workers.
    pub fn kick_now(&mut self, by: Tid, pool: usize) {
        let out = self.kick_locked(pool);
        let cpu = self.threads[by].cpu;
        match out {
            KickOut::Nothing => {}
            KickOut::Wake(worker, repatriate) => self.wake_worker(worker, cpu, pool, repatriate),
            KickOut::Create => self.spawn_worker(by, pool),
        }
    }

    /// Reaps idle workers the policy says are too many and idle too long.
    pub fn reap(&mut self) {
        for pool in 0..self.world.pools.len() {
            loop {
                let p = &self.world.pools[pool];
                let Some(&(_, since)) = p.idle.first() else {
                    break;
                };
                let idle = IdleWorkers {
                    idle: p.idle.len(),
                    workers: p.nr_workers,
                    oldest_idle_for: Duration::from_nanos(self.now - since),
                };
                let Some(at) = reap(idle, p.key.idle_timeout) else {
                    break;
                };
                let p = &mut self.world.pools[pool];
                let (oldest, _) = p.idle.remove(at);
                p.nr_workers -= 1;
                self.exit(oldest);
                self.counters.workers_reaped += 1;
            }
        }
    }
}
