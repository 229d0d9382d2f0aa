//! The machine: virtual CPUs, threads and the scheduler model, and the interpreter
//! that runs each thread's operations on the virtual clock.
//!
//! A thread is a queue of [`Op`]s. `Compute` takes CPU time (slower while the SMT
//! sibling is busy); `Lock` and `Unlock` go through the queued locks of `lock.rs`;
//! `Do` runs a logical action at that instant (the workqueue and workload code), which
//! may push more operations; `Block` and `Sleep` give up the CPU.
//!
//! Scheduler model (non-strict workers, and every wake-up): a run queue per CPU; a
//! woken thread goes to its hint CPU if idle, else an idle SMT sibling, else an idle
//! CPU of the hint's LLC, else of the waker's LLC (wake-affine), else it queues on the
//! hint CPU; with `idle_scan_pct` set (0, off, in every profile) an LLC's scan covers
//! only as many CPUs as its busy share leaves (the kernel's `SIS_UTIL`). A CPU that
//! goes idle pulls a waiting thread from the nearest CPU (LLC, node, machine), but with
//! `cache_hot` set (0, off, in every profile) not one that gave up a CPU less than that
//! long ago unless it waits on a sibling (the kernel's `task_hot()`); every
//! `balance_interval` waiting threads move to idle CPUs, hot or not (the kernel's
//! periodic balance moves hot tasks once its attempts have failed, `cache_nice_tries`). A
//! thread waits behind a running one until that one blocks or has run one `slice`,
//! except a high-priority thread (a `WQ_HIGHPRI` kworker's nice -20: EEVDF gives it the
//! earlier deadline), which preempts a computing normal thread at once and queues ahead
//! of normal ones otherwise. Switching threads costs `context_switch`; running on a new
//! CPU costs a migration.

use std::collections::VecDeque;

use podq_topology::{CpuSet, Topology};

use crate::cost::CostParams;
use crate::distance::{c2c, Distance, Distances};
use crate::events::{to_ns, Event, EventQueue, Ns};
use crate::lock::{Lock, Side};
use crate::programs::{Act, Item, World};
use crate::rng::Rng;

/// Thread id.
pub type Tid = usize;

/// One operation of a thread.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// CPU time, ns at full speed.
    Compute(f64),
    /// Acquire a lock (spinning while it is held).
    Lock(usize, Side),
    /// Release it.
    Unlock(usize),
    /// A logical action.
    Do(Act),
    /// Sleep until woken (a wake-up that came first is consumed instead).
    Block,
    /// Sleep for a time.
    Sleep(Ns),
    /// Poll pool `usize`'s worklist for `IDLE_SPIN` or until an item is pushed.
    Spin(usize),
}

/// What a thread is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Producer number `usize`.
    Producer(usize),
    /// A worker of pool `usize`.
    Worker(usize),
}

/// Where a thread is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// On its CPU.
    Running,
    /// On a run queue.
    Runnable,
    /// On its way to a run queue.
    Arriving,
    /// Asleep.
    Blocked,
    /// Reaped.
    Exited,
}

/// A virtual thread.
pub struct Thread {
    /// What it is.
    pub role: Role,
    /// CPUs it may run on.
    pub allowed: CpuSet,
    /// Its current or last CPU.
    pub cpu: usize,
    /// Where it is.
    pub state: State,
    /// Step generation: a scheduled `Step` is stale once this moved on.
    pub generation: u64,
    /// Operations still to run.
    pub ops: VecDeque<Op>,
    /// A wake-up arrived while it was not blocked.
    pub wake_pending: bool,
    /// When it last got its CPU.
    pub ran_since: Ns,
    /// When it last gave up its CPU (`None`: it never ran): the cache-hot test.
    pub stopped: Option<Ns>,
    /// Worker: polled the worklist since its last item.
    pub spun: bool,
    /// Worker: polling its pool's worklist (an `Op::Spin` in progress).
    pub spinning: bool,
    /// Locks it holds: a holder is not preempted (the critical sections are short and
    /// a preempted holder would stall every spinning waiter).
    pub held: u32,
    /// Worker: when its current item started.
    pub item_since: Ns,
    /// Worker: runs an item (from its start to the lock after it).
    pub in_item: bool,
    /// Worker: out of its pool's running count for a long item ([`crate::long_items`]).
    pub out_of_count: bool,
    /// Worker: items it took beyond the one it runs, with their pwqs, oldest first.
    pub batch: VecDeque<(Item, usize)>,
    /// When it became runnable without a CPU (queued or migrating), if it is.
    pub runnable_since: Option<Ns>,
    /// High priority (a `WQ_HIGHPRI` kworker's nice -20): preempts a normal thread on
    /// waking, and a normal thread never preempts it.
    pub high: bool,
    /// The `Compute` in progress: when it ends and the speed it runs at, so that a
    /// preemption can put back what is left.
    pub computing: Option<(Ns, f64)>,
}

/// A virtual CPU.
pub struct Cpu {
    /// The running thread.
    pub running: Option<Tid>,
    /// Threads waiting for it.
    pub rq: VecDeque<Tid>,
    /// Threads on their way to its run queue.
    pub incoming: u32,
    /// The thread that ran last.
    pub last: Option<Tid>,
    /// Busy nanoseconds so far (closed intervals).
    pub busy_ns: Ns,
    /// Start of the current busy or idle interval.
    pub since: Ns,
    /// Its NUMA node.
    pub node: usize,
    /// Its SMT siblings (itself excluded).
    pub siblings: Vec<usize>,
    /// Its LLC, starting after itself (scan order).
    pub llc: Vec<usize>,
    /// Its node's CPUs, starting after itself.
    pub node_cpus: Vec<usize>,
    /// How many CPUs of `llc` a wake-up's scan for an idle CPU looks at (the whole LLC
    /// unless `idle_scan_pct` is set; updated at each periodic balance).
    pub idle_scan: usize,
    /// `busy_ns` at the last periodic balance.
    pub busy_at_balance: Ns,
}

/// Cumulative counters, sampled at segment boundaries.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Items (or I/Os) completed.
    pub items: u64,
    /// Thread switches on a CPU.
    pub context_switches: u64,
    /// Threads starting to run on a CPU other than their last.
    pub migrations: u64,
    /// Wake-ups of sleeping threads.
    pub wakeups: u64,
    /// Items by where they ran relative to where they were queued: same CPU, SMT, LLC,
    /// node, remote.
    pub locality: [u64; 5],
    /// Idle workers woken by a non-strict pool outside their pod.
    pub repatriations: u64,
    /// Workers created.
    pub workers_created: u64,
    /// Workers reaped.
    pub workers_reaped: u64,
    /// Time threads spent runnable on a run queue or migrating, not running (schedstat's
    /// `run_delay`), ns: producers, workers.
    pub run_delay_ns: [u64; 2],
    /// Normal threads preempted by a waking high-priority one.
    pub preemptions: u64,
    /// Workers taken out of their pool's running count for a long item
    /// ([`crate::long_items`]).
    pub cpu_intensive: u64,
    /// Items such a worker had taken and not started, put back at the front of the
    /// worklist as it left the count.
    pub handed_back: u64,
}

/// The whole simulated machine.
pub struct Sim<'t> {
    /// The topology.
    pub topo: &'t Topology,
    /// The parameters.
    pub cost: CostParams,
    /// The clock.
    pub now: Ns,
    /// Pending events.
    pub events: EventQueue,
    /// Random numbers.
    pub rng: Rng,
    /// CPUs, by id (unusable ids are never used).
    pub cpus: Vec<Cpu>,
    /// Threads, by id.
    pub threads: Vec<Thread>,
    /// Locks, by id.
    pub locks: Vec<Lock>,
    /// Distance classes.
    pub dist: Distances,
    /// Threads sitting on run queues.
    pub waiting: usize,
    /// Counters.
    pub counters: Counters,
    /// Workqueues, pools, producers, the allocator.
    pub world: World,
}

impl<'t> Sim<'t> {
    /// An idle machine.
    pub fn new(topo: &'t Topology, cost: CostParams, seed: u64, world: World) -> Sim<'t> {
        let n = topo.usable().last().map_or(0, |c| c + 1);
        let rotate = |set: &CpuSet, me: usize| -> Vec<usize> {
            let all: Vec<usize> = set.intersection(topo.usable()).iter().collect();
            let at = all.iter().position(|&c| c == me).unwrap_or(0);
            all[at + 1..]
                .iter()
                .chain(&all[..at])
                .copied()
                .filter(|&c| c != me)
                .collect()
        };
        let cpus = (0..n)
            .map(|c| {
                let (node, siblings, llc, node_cpus) = match topo.get(c) {
                    Some(f) if topo.usable().contains(c) => (
                        f.node,
                        rotate(f.smt, c),
                        rotate(f.llc, c),
                        rotate(&topo.node_cpus(f.node), c),
                    ),
                    _ => (0, Vec::new(), Vec::new(), Vec::new()),
                };
                Cpu {
                    running: None,
                    rq: VecDeque::new(),
                    incoming: 0,
                    last: None,
                    busy_ns: 0,
                    since: 0,
                    node,
                    siblings,
                    idle_scan: llc.len(),
                    llc,
                    node_cpus,
                    busy_at_balance: 0,
                }
            })
            .collect();
        Sim {
            topo,
            cost,
            now: 0,
            events: EventQueue::default(),
            rng: Rng::new(seed),
            cpus,
            threads: Vec::new(),
            locks: Vec::new(),
            dist: Distances::new(topo, n),
            waiting: 0,
            counters: Counters::default(),
            world,
        }
    }

    /// A line transfer from `a` to `b`.
    pub fn c2c(&self, a: usize, b: usize) -> f64 {
        c2c(&self.cost, self.dist.get(a, b))
    }

    /// The distance from `a` to `b`.
    pub fn distance(&self, a: usize, b: usize) -> Distance {
        self.dist.get(a, b)
    }

    /// A new blocked thread.
    pub fn spawn(&mut self, role: Role, allowed: CpuSet, cpu: usize, ops: Vec<Op>) -> Tid {
        self.threads.push(Thread {
            role,
            allowed,
            cpu,
            state: State::Blocked,
            generation: 0,
            ops: ops.into(),
            wake_pending: false,
            ran_since: 0,
            stopped: None,
            spun: false,
            spinning: false,
            held: 0,
            item_since: 0,
            in_item: false,
            out_of_count: false,
            batch: VecDeque::new(),
            runnable_since: None,
            high: false,
            computing: None,
        });
        self.threads.len() - 1
    }

    /// Schedules thread `tid`'s next step `after` ns from now.
    pub fn step_after(&mut self, tid: Tid, after: f64) {
        let t = &mut self.threads[tid];
        t.generation += 1;
        t.computing = None;
        let at = self.now + to_ns(after);
        self.events.push(
            at,
            Event::Step {
                tid,
                generation: t.generation,
            },
        );
    }

    /// Handles a `Step` event.
    pub fn on_step(&mut self, tid: Tid, generation: u64) {
        let t = &self.threads[tid];
        if t.generation == generation && t.state == State::Running {
            self.run(tid);
        }
    }

    fn idle(&self, cpu: usize) -> bool {
        let c = &self.cpus[cpu];
        c.running.is_none() && c.rq.is_empty() && c.incoming == 0
    }

    /// Runs thread `tid` (running on its CPU) until it waits for something.
    pub fn run(&mut self, tid: Tid) {
        loop {
            if self.threads[tid].state != State::Running {
                return;
            }
            let Some(op) = self.threads[tid].ops.pop_front() else {
                self.next_ops(tid);
                continue;
            };
            match op {
                Op::Compute(ns) => {
                    let cpu = self.threads[tid].cpu;
                    let high_waits = self.cpus[cpu]
                        .rq
                        .front()
                        .is_some_and(|&w| self.threads[w].high);
                    let yields = if self.threads[tid].high {
                        high_waits
                    } else {
                        !self.cpus[cpu].rq.is_empty()
                    };
                    let t = &self.threads[tid];
                    if t.held == 0
                        && ((yields && self.now - t.ran_since >= self.cost.slice as Ns)
                            || (high_waits && !t.high))
                    {
                        self.threads[tid].ops.push_front(op);
                        self.preempt(tid);
                        return;
                    }
                    let sibling_busy = self.cpus[cpu]
                        .siblings
                        .iter()
                        .any(|&s| self.cpus[s].running.is_some());
                    let speed = if sibling_busy {
                        self.cost.smt_speed
                    } else {
                        1.0
                    };
                    let jitter = self.cost.jitter;
                    let ns = self.rng.jitter(to_ns(ns / speed), jitter);
                    self.step_after(tid, ns as f64);
                    self.threads[tid].computing = Some((self.now + ns, speed));
                    return;
                }
                Op::Lock(lock, side) => {
                    if self.lock_acquire(tid, lock, side) {
                        return;
                    }
                }
                Op::Unlock(lock) => self.lock_release(tid, lock),
                Op::Do(act) => self.act(tid, act),
                Op::Block => {
                    let t = &mut self.threads[tid];
                    if t.wake_pending {
                        t.wake_pending = false;
                    } else {
                        self.block(tid);
                        return;
                    }
                }
                Op::Sleep(ns) => {
                    self.block(tid);
                    self.threads[tid].generation += 1;
                    let generation = self.threads[tid].generation;
                    // The timer wakes the thread through a Step on a blocked thread.
                    self.events.push(
                        self.now + ns,
                        Event::Step {
                            tid,
                            generation: generation | TIMER_BIT,
                        },
                    );
                    return;
                }
                Op::Spin(pool) => {
                    self.spin(tid, pool);
                    return;
                }
            }
        }
    }

    /// Handles a timer `Step` (generation tagged with [`TIMER_BIT`]).
    pub fn on_timer(&mut self, tid: Tid, generation: u64) {
        if self.threads[tid].generation == generation && self.threads[tid].state == State::Blocked {
            let cpu = self.threads[tid].cpu;
            self.wake(tid, cpu, cpu, None);
        }
    }

    fn next_ops(&mut self, tid: Tid) {
        match self.threads[tid].role {
            Role::Producer(p) => self.producer_next(tid, p),
            Role::Worker(_) => unreachable!("a worker's loop always has a next operation"),
        }
    }

    fn set_running(&mut self, cpu: usize, tid: Option<Tid>) {
        let now = self.now;
        if let Some(old) = self.cpus[cpu].running.filter(|&old| Some(old) != tid) {
            self.threads[old].stopped = Some(now);
        }
        let c = &mut self.cpus[cpu];
        match (c.running.is_some(), tid.is_some()) {
            (false, true) => c.since = now,
            (true, false) => {
                c.busy_ns += now - c.since;
                c.since = now;
            }
            _ => {}
        }
        c.running = tid;
    }

    /// Busy nanoseconds of `cpu` up to now.
    pub fn busy_ns(&self, cpu: usize) -> Ns {
        let c = &self.cpus[cpu];
        c.busy_ns
            + if c.running.is_some() {
                self.now - c.since
            } else {
                0
            }
    }

    fn block(&mut self, tid: Tid) {
        let cpu = self.threads[tid].cpu;
        self.threads[tid].state = State::Blocked;
        self.cpus[cpu].last = Some(tid);
        self.set_running(cpu, None);
        self.dispatch(cpu);
    }

    fn preempt(&mut self, tid: Tid) {
        let cpu = self.threads[tid].cpu;
        self.threads[tid].state = State::Runnable;
        self.threads[tid].runnable_since = Some(self.now);
        self.cpus[cpu].last = Some(tid);
        self.cpus[cpu].rq.push_back(tid);
        self.waiting += 1;
        self.set_running(cpu, None);
        self.dispatch(cpu);
    }

    /// Gives an idle `cpu` its next thread: its run queue's first, else one pulled from
    /// the nearest CPU with waiting threads (newidle balance).
    fn dispatch(&mut self, cpu: usize) {
        if self.cpus[cpu].running.is_some() {
            return;
        }
        let Some(tid) = self.cpus[cpu].rq.pop_front() else {
            if self.waiting > 0 && self.cpus[cpu].incoming == 0 {
                self.pull(cpu);
            }
            return;
        };
        self.waiting -= 1;
        self.start(cpu, tid);
    }

    fn start(&mut self, cpu: usize, tid: Tid) {
        self.set_running(cpu, Some(tid));
        let mut charge = 0.0;
        if self.cpus[cpu].last != Some(tid) {
            self.counters.context_switches += 1;
            charge += self.cost.context_switch;
        }
        let t = &mut self.threads[tid];
        if let Some(since) = t.runnable_since.take() {
            let role = usize::from(matches!(t.role, Role::Worker(_)));
            self.counters.run_delay_ns[role] += self.now - since;
        }
        let from = t.cpu;
        t.state = State::Running;
        t.cpu = cpu;
        t.ran_since = self.now;
        if from != cpu {
            self.counters.migrations += 1;
            charge += self.cost.hot_lines * self.c2c(from, cpu) / self.cost.mlp;
        }
        if charge > 0.0 {
            self.threads[tid].ops.push_front(Op::Compute(charge));
        }
        self.run(tid);
    }

    /// Wakes `tid`, queued by a thread on `waker`, towards `hint`, within `mask` if given
    /// (else the thread's allowed CPUs).
    pub fn wake(&mut self, tid: Tid, waker: usize, hint: usize, mask: Option<&CpuSet>) {
        let t = &mut self.threads[tid];
        if t.state != State::Blocked {
            t.wake_pending = true;
            return;
        }
        self.counters.wakeups += 1;
        let target = self.select_cpu(tid, waker, hint, mask);
        let mut latency = if self.idle(target) {
            let idle_for = self.now - self.cpus[target].since;
            self.cost.wake
                + if idle_for as f64 >= self.cost.cstate_after {
                    self.cost.cstate_exit
                } else {
                    0.0
                }
        } else {
            self.cost.wake_call
        };
        latency = self.rng.jitter(to_ns(latency), self.cost.jitter) as f64;
        self.threads[tid].state = State::Arriving;
        self.cpus[target].incoming += 1;
        self.events
            .push(self.now + latency as Ns, Event::Arrive { tid, cpu: target });
    }

    /// Handles an `Arrive` event.
    pub fn on_arrive(&mut self, tid: Tid, cpu: usize) {
        self.cpus[cpu].incoming -= 1;
        let free = self.cpus[cpu].running.is_none() && self.cpus[cpu].rq.is_empty();
        if free || self.preempt_for(tid, cpu) {
            self.start(cpu, tid);
        } else {
            let high = self.threads[tid].high;
            let t = &mut self.threads[tid];
            t.state = State::Runnable;
            t.runnable_since.get_or_insert(self.now);
            // A high-priority thread goes ahead of the normal ones (EEVDF: its
            // deadline is earlier by the weight ratio).
            let rq = &mut self.cpus[cpu].rq;
            match rq.iter().position(|&w| high && !self.threads[w].high) {
                Some(at) => rq.insert(at, tid),
                None => rq.push_back(tid),
            }
            self.waiting += 1;
            // podq's spinner yields to a runnable thread on its CPU: its spin ends now.
            if let Some(running) = self.cpus[cpu].running {
                if self.threads[running].spinning {
                    self.threads[running].spinning = false;
                    self.step_after(running, 0.0);
                }
            }
        }
    }

    /// A high-priority `tid` arriving on `cpu` preempts the normal thread computing
    /// there (not one holding or waiting for a lock: spinlocks disable preemption);
    /// the preempted thread keeps what is left of its computation and runs next.
    /// Returns whether `cpu` is now free for `tid`.
    fn preempt_for(&mut self, tid: Tid, cpu: usize) -> bool {
        let Some(running) = self.cpus[cpu].running else {
            return false;
        };
        let r = &self.threads[running];
        let Some((end, speed)) = r.computing else {
            return false;
        };
        let high_waits = self.cpus[cpu]
            .rq
            .front()
            .is_some_and(|&w| self.threads[w].high);
        if !self.threads[tid].high || r.high || r.held > 0 || high_waits {
            return false;
        }
        let left = end.saturating_sub(self.now) as f64 * speed;
        let r = &mut self.threads[running];
        r.generation += 1;
        r.computing = None;
        r.ops.push_front(Op::Compute(left));
        r.state = State::Runnable;
        r.runnable_since = Some(self.now);
        self.cpus[cpu].last = Some(running);
        self.cpus[cpu].rq.push_front(running);
        self.waiting += 1;
        self.counters.preemptions += 1;
        self.set_running(cpu, None);
        true
    }

    fn select_cpu(&self, tid: Tid, waker: usize, hint: usize, mask: Option<&CpuSet>) -> usize {
        let allowed = mask.unwrap_or(&self.threads[tid].allowed);
        if allowed.len() == 1 {
            return allowed.first().unwrap_or(hint);
        }
        let ok = |c: usize| allowed.contains(c) && self.idle(c);
        let hint = if allowed.contains(hint) {
            hint
        } else {
            allowed.first().unwrap_or(hint)
        };
        if ok(hint) {
            return hint;
        }
        // The SMT siblings, then the LLC from the next CPU on, as far as the scan goes.
        let near = |of: usize| {
            let c = &self.cpus[of];
            c.siblings
                .iter()
                .chain(c.llc.iter().take(c.idle_scan))
                .copied()
                .find(|&x| ok(x))
        };
        if let Some(c) = near(hint) {
            return c;
        }
        if !self.topo.facts(hint).llc.contains(waker) && self.topo.usable().contains(waker) {
            if ok(waker) {
                return waker;
            }
            if let Some(c) = near(waker) {
                return c;
            }
        }
        hint
    }

    /// Where a waiting thread's run queue is.
    fn queue_of(&self, tid: Tid) -> Option<usize> {
        (0..self.cpus.len()).find(|&c| self.cpus[c].rq.contains(&tid))
    }

    /// Newidle balance: `cpu` pulls the first waiting thread that may run on it and is
    /// not cache-hot there ([`Sim::cache_hot`]), from its LLC, then its node, then
    /// anywhere.
    fn pull(&mut self, cpu: usize) {
        let order: Vec<usize> = {
            let c = &self.cpus[cpu];
            let mut order: Vec<usize> = c.llc.clone();
            order.extend(c.node_cpus.iter().filter(|x| !c.llc.contains(x)));
            order.extend(
                self.topo
                    .usable()
                    .iter()
                    .filter(|&x| x != cpu && self.cpus[x].node != c.node),
            );
            order
        };
        for from in order {
            if self.cpus[from].rq.is_empty() {
                continue;
            }
            let found = self.cpus[from].rq.iter().position(|&t| {
                self.threads[t].allowed.contains(cpu) && !self.cache_hot(t, from, cpu)
            });
            if let Some(at) = found {
                let tid = self.cpus[from].rq.remove(at).unwrap_or(usize::MAX);
                self.waiting -= 1;
                self.migrate(tid, cpu);
                return;
            }
        }
    }

    /// Whether thread `tid`, waiting on `from`, is cache-hot for a pull to `cpu` (the
    /// kernel's `task_hot()`): it gave up a CPU less than `cache_hot` ago, and `from` is
    /// not an SMT sibling of `cpu` (siblings share their caches).
    fn cache_hot(&self, tid: Tid, from: usize, cpu: usize) -> bool {
        !self.cpus[cpu].siblings.contains(&from)
            && self.threads[tid]
                .stopped
                .is_some_and(|at| ((self.now - at) as f64) < self.cost.cache_hot)
    }

    fn migrate(&mut self, tid: Tid, to: usize) {
        self.threads[tid].state = State::Arriving;
        self.cpus[to].incoming += 1;
        let delay = self.cost.migration_fixed.round() as Ns;
        self.events
            .push(self.now + delay, Event::Arrive { tid, cpu: to });
    }

    /// Periodic balance: every waiting thread that an idle CPU may run moves to the
    /// nearest such CPU.
    pub fn on_balance(&mut self) {
        self.update_idle_scan();
        if self.waiting > 0 {
            let busy: Vec<usize> = self
                .topo
                .usable()
                .iter()
                .filter(|&c| self.cpus[c].rq.len() > usize::from(self.cpus[c].running.is_none()))
                .collect();
            for from in busy {
                let waiting: Vec<Tid> = self.cpus[from].rq.iter().copied().collect();
                for tid in waiting {
                    let target = {
                        let c = &self.cpus[from];
                        c.llc
                            .iter()
                            .chain(c.node_cpus.iter())
                            .copied()
                            .chain(self.topo.usable().iter())
                            .find(|&x| self.threads[tid].allowed.contains(x) && self.idle(x))
                    };
                    if let Some(to) = target {
                        if let Some(at) = self.cpus[from].rq.iter().position(|&t| t == tid) {
                            self.cpus[from].rq.remove(at);
                            self.waiting -= 1;
                            self.migrate(tid, to);
                        }
                    }
                }
            }
        }
        self.reap();
        let next = self.now + self.cost.balance_interval.round() as Ns;
        self.events.push(next, Event::Balance);
    }

    /// Sets each CPU's wake-up scan depth from its LLC's busy share since the last
    /// balance (the kernel's `SIS_UTIL`): `idle_scan_pct` 0 leaves every scan whole.
    fn update_idle_scan(&mut self) {
        let pct = self.cost.idle_scan_pct;
        if pct <= 0.0 {
            return;
        }
        let usable: Vec<usize> = self.topo.usable().iter().collect();
        // Busy time since the last balance, by CPU number.
        let mut since = vec![0; self.cpus.len()];
        for &c in &usable {
            let busy = self.busy_ns(c);
            since[c] = busy - self.cpus[c].busy_at_balance;
            self.cpus[c].busy_at_balance = busy;
        }
        // One depth per LLC, set on each of its CPUs.
        let mut done = vec![false; self.cpus.len()];
        for &c in &usable {
            if done[c] {
                continue;
            }
            let members: Vec<usize> = std::iter::once(c)
                .chain(self.cpus[c].llc.iter().copied())
                .collect();
            let llc = members.len();
            let sum: Ns = members.iter().map(|&x| since[x]).sum();
            let util = sum as f64 / (llc as f64 * self.cost.balance_interval);
            let scan = llc as f64 * (1.0 - (util * pct / 100.0).powi(2));
            // The CPUs after the one a scan starts from, which it never counts.
            let depth = (scan.max(0.0) as usize).min(llc - 1);
            for x in members {
                self.cpus[x].idle_scan = depth;
                done[x] = true;
            }
        }
    }

    /// Removes a waiting or blocked thread for good (a reaped worker).
    pub fn exit(&mut self, tid: Tid) {
        if let Some(cpu) = self.queue_of(tid) {
            self.cpus[cpu].rq.retain(|&t| t != tid);
            self.waiting -= 1;
        }
        self.threads[tid].state = State::Exited;
        self.threads[tid].ops.clear();
    }
}

/// Marks a `Step` event's generation as a sleep timer.
pub const TIMER_BIT: u64 = 1 << 63;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::programs::World;
    use crate::workload::Workload;

    /// Runs the events up to `until` (all of them with `Ns::MAX`).
    fn drain(sim: &mut Sim, until: Ns) {
        sim.events.push(until, Event::End);
        while let Some((at, event)) = sim.events.pop() {
            match event {
                Event::Step { tid, generation } => {
                    sim.now = at;
                    sim.on_step(tid, generation)
                }
                Event::Arrive { tid, cpu } => {
                    sim.now = at;
                    sim.on_arrive(tid, cpu)
                }
                _ => return,
            }
        }
    }

    /// A simulator on `topo` with `xeon-12c`'s costs, no jitter and `tune` applied,
    /// and a world with nothing queued.
    fn quiet_sim(topo: &Topology, tune: impl FnOnce(&mut CostParams)) -> Sim<'_> {
        let mut cost = crate::cost::machine("xeon-12c").unwrap().params;
        cost.jitter = 0.0;
        tune(&mut cost);
        let world = World::new(Workload::Queue {
            producer_cpus: vec![0],
            item_ns: 0,
        });
        Sim::new(topo, cost, 1, world)
    }

    /// A simulator on `topo` with two producer threads pinned to CPU 0, the first
    /// computing 10 us and the second 1 us before they block; returns it and their ids.
    fn two_threads_on_one_cpu(topo: &Topology) -> (Sim<'_>, Tid, Tid) {
        let mut sim = quiet_sim(topo, |_| {});
        let one = CpuSet::single(0);
        let first = sim.spawn(
            Role::Producer(0),
            one.clone(),
            0,
            vec![Op::Compute(10_000.0), Op::Block],
        );
        let second = sim.spawn(
            Role::Producer(1),
            one,
            0,
            vec![Op::Compute(1_000.0), Op::Block],
        );
        (sim, first, second)
    }

    /// A high-priority thread waking onto a CPU where a normal one computes runs at
    /// once; the normal one keeps what was left of its computation and runs after it.
    #[test]
    fn a_high_priority_wake_up_preempts_a_computing_normal_thread() {
        let topo = Topology::synthetic("1s2c1t").unwrap();
        let (mut sim, normal, high) = two_threads_on_one_cpu(&topo);
        sim.threads[high].high = true;
        // Wake-up 2 us, context switch 1.1 us: the normal thread computes 3.1-13.1 us.
        sim.wake(normal, 0, 0, None);
        drain(&mut sim, 5_000);
        sim.now = 5_000;
        // The CPU is busy: the waker's 500 ns call, arrival at 5.5 us, 7.6 us left.
        sim.wake(high, 0, 0, None);
        drain(&mut sim, Ns::MAX);
        assert_eq!(sim.counters.preemptions, 1);
        // 5.5 + 1.1 + 1 = 7.6 us, then 1.1 + 7.6 us for the preempted thread.
        assert_eq!(sim.now, 16_300);
        assert_eq!(sim.counters.run_delay_ns, [2_100, 0]);
        assert_eq!(sim.busy_ns(0), 16_300 - 2_000);
    }

    /// Without the priority the woken thread waits for the running one to block.
    #[test]
    fn a_normal_wake_up_waits_for_the_running_thread() {
        let topo = Topology::synthetic("1s2c1t").unwrap();
        let (mut sim, first, second) = two_threads_on_one_cpu(&topo);
        sim.wake(first, 0, 0, None);
        drain(&mut sim, 5_000);
        sim.now = 5_000;
        sim.wake(second, 0, 0, None);
        drain(&mut sim, Ns::MAX);
        assert_eq!(sim.counters.preemptions, 0);
        // The second waits 5.5-13.1 us, then 1.1 + 1 us.
        assert_eq!(sim.now, 15_200);
        assert_eq!(sim.counters.run_delay_ns, [7_600, 0]);
    }

    /// Where a thread that waits on a busy CPU ends up when the other CPU goes idle, on
    /// the two-CPU `shape` with the cache-hot rule at `cache_hot` ns: the thread ran on
    /// CPU 0 until 4.1 us, waits there from 10.5 us behind a 200 us computation, and
    /// CPU 1 goes idle at about 58 us. Returns its last CPU and the migrations counted.
    fn waiting_thread_after_newidle(shape: &str, cache_hot: f64) -> (usize, u64) {
        let topo = Topology::synthetic(shape).unwrap();
        let mut sim = quiet_sim(&topo, |c| c.cache_hot = cache_hot);
        let both = CpuSet::from_iter([0, 1]);
        let waiting = sim.spawn(
            Role::Producer(0),
            both,
            0,
            vec![
                Op::Compute(1_000.0),
                Op::Block,
                Op::Compute(1_000.0),
                Op::Block,
            ],
        );
        let on = |cpu: usize, ns: f64| (CpuSet::single(cpu), vec![Op::Compute(ns), Op::Block]);
        let (one, ops) = on(1, 50_000.0);
        let short = sim.spawn(Role::Producer(1), one, 1, ops);
        let (zero, ops) = on(0, 200_000.0);
        let long = sim.spawn(Role::Producer(2), zero, 0, ops);
        sim.wake(waiting, 0, 0, None);
        drain(&mut sim, 5_000);
        sim.now = 5_000;
        sim.wake(short, 1, 1, None);
        sim.wake(long, 0, 0, None);
        drain(&mut sim, 10_000);
        sim.now = 10_000;
        sim.wake(waiting, 0, 0, None);
        drain(&mut sim, Ns::MAX);
        (sim.threads[waiting].cpu, sim.counters.migrations)
    }

    /// Newidle balance pulls a waiting thread at once without the rule, not while it is
    /// cache-hot (it stopped less than `cache_hot` ago), and again once it is not; an
    /// SMT sibling, which shares the caches, pulls it hot or not.
    #[test]
    fn newidle_balance_leaves_a_cache_hot_thread_where_it_waits() {
        assert_eq!(waiting_thread_after_newidle("1s2c1t", 0.0), (1, 1));
        assert_eq!(waiting_thread_after_newidle("1s2c1t", 500_000.0), (0, 0));
        assert_eq!(waiting_thread_after_newidle("1s2c1t", 20_000.0), (1, 1));
        assert_eq!(waiting_thread_after_newidle("1s1c2t", 500_000.0), (1, 1));
    }

    /// Four one-CPU cores of one LLC, `busy` of them computing through the first 1 ms
    /// balance interval, with the scan limited by `pct`: each CPU's scan depth after
    /// that balance, and where a thread woken towards busy CPU 0 lands.
    fn scan_after_busy_interval(busy: usize, pct: f64) -> (Vec<usize>, usize) {
        let topo = Topology::synthetic("1s4c1t").unwrap();
        let mut sim = quiet_sim(&topo, |c| {
            c.balance_interval = 1_000_000.0;
            c.idle_scan_pct = pct;
        });
        for cpu in 0..busy {
            let t = sim.spawn(
                Role::Producer(cpu),
                CpuSet::single(cpu),
                cpu,
                vec![Op::Compute(5_000_000.0), Op::Block],
            );
            sim.wake(t, cpu, cpu, None);
        }
        drain(&mut sim, 1_000_000);
        sim.now = 1_000_000;
        sim.on_balance();
        let woken = sim.spawn(
            Role::Producer(busy),
            CpuSet::from_iter(0..4),
            0,
            vec![Op::Block],
        );
        let scans = (0..4).map(|c| sim.cpus[c].idle_scan).collect();
        (scans, sim.select_cpu(woken, 0, 0, None))
    }

    /// The scan covers 4 × (1 − (u × 1.17)²) CPUs after the one it starts from: all three
    /// at u = 0.25 (3.65), two at u = 0.5 (2.63), none at u = 0.75 (0.92 → 0), when a
    /// wake-up towards busy CPU 0 stays there though CPU 3 idles; without the limit it
    /// finds CPU 3.
    #[test]
    fn a_busy_llc_limits_the_wake_up_scan_for_an_idle_cpu() {
        assert_eq!(scan_after_busy_interval(1, 117.0).0, vec![3; 4]);
        assert_eq!(scan_after_busy_interval(2, 117.0), (vec![2; 4], 2));
        assert_eq!(scan_after_busy_interval(3, 117.0), (vec![0; 4], 0));
        assert_eq!(scan_after_busy_interval(3, 0.0), (vec![3; 4], 3));
    }
}
