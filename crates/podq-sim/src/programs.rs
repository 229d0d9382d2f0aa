//! The workloads' threads: what producers do, what each item costs, and the logical
//! actions ([`Act`]) the interpreter runs.

use hdrhistogram::Histogram;
use podq_policy::locality;

use crate::distance::buf4k;
use crate::engine::{Op, Role, Sim, Tid};
use crate::events::{to_ns, Event, Ns};
use crate::slab::{Slab, Which};
use crate::workload::Workload;
use crate::wq::{KickOut, Pool, Pwq, Wq};

/// What an item does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    /// `queue`/`latency`: wake producer `usize` when done.
    Wake(usize),
    /// `throughput`: give producer `usize` its slot back.
    Slot(usize),
    /// `completion`: the rpciod stage of I/O `usize`.
    Rpc(usize),
    /// `completion`: the nfsiod stage of I/O `usize`.
    Nfs(usize),
}

/// A queued item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    /// What it does.
    pub kind: ItemKind,
    /// The CPU that queued it.
    pub queued_cpu: usize,
}

/// A logical action, run at an instant by the interpreter.
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// Start a queue call on workqueue `wq`.
    QueueStart {
        /// The workqueue.
        wq: usize,
        /// The item.
        item: Item,
    },
    /// Under the pool lock: admit the item.
    Enqueue {
        /// Its pwq.
        pwq: usize,
        /// The item.
        item: Item,
    },
    /// After the lock: act on a kick.
    Kicked {
        /// The pool.
        pool: usize,
        /// What the kick decided.
        out: KickOut,
    },
    /// End of a queue call.
    QueueEnd,
    /// Start a worker for a pool.
    SpawnWorker {
        /// The pool.
        pool: usize,
    },
    /// Under the pool lock: next item, spin or idle.
    WorkerTake,
    /// A spin ended.
    SpinEnd,
    /// Under the pool lock after a spin.
    AfterSpin,
    /// Run an item.
    RunItem {
        /// The item.
        item: Item,
        /// Its pwq.
        pwq: usize,
    },
    /// Under the pool lock after an item.
    ItemDone {
        /// The item's pwq.
        pwq: usize,
    },
    /// An item of `queue`, `latency` or `throughput` finished its work.
    ItemEnd(Item),
    /// A completion producer posts I/O `usize` (its buffer is written).
    Post(usize),
    /// Allocate an object for an I/O.
    Alloc(usize, Which),
    /// Free an I/O's object.
    Free(usize, Which),
    /// The I/O is done (nfsiod finished).
    IoDone(usize),
}

/// A producer.
pub struct Producer {
    /// Its thread.
    pub tid: Tid,
    /// Its CPU.
    pub cpu: usize,
    /// When its current queue call (or `latency` submission) began.
    pub t0: Ns,
    /// Items or I/Os in flight.
    pub inflight: usize,
    /// Blocked waiting for a slot.
    pub waiting: bool,
    /// Free I/O slots (`completion`).
    pub free_slots: Vec<usize>,
    /// Items (I/Os) issued so far.
    pub issued: u64,
}

/// One I/O of `completion`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Io {
    /// Its producer.
    pub producer: usize,
    /// The CPU that wrote its buffer.
    pub writer: usize,
    /// When it was posted.
    pub posted: Ns,
    /// The CPU its request object was allocated on.
    pub request_cpu: usize,
    /// The CPU its task object was allocated on.
    pub task_cpu: usize,
}

/// The distributions of one segment.
pub struct Hists {
    /// `queue`/`throughput`: the producers' queue calls.
    pub queue: Histogram<u64>,
    /// `latency`: clat; `completion`: posted to nfsiod done.
    pub latency: Histogram<u64>,
    /// `latency`: slat.
    pub submit: Histogram<u64>,
}

impl Hists {
    /// Empty histograms.
    pub fn new() -> Hists {
        // Up to an hour in ns, 3 significant digits: bounds hdrhistogram accepts.
        let h = || Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds");
        Hists {
            queue: h(),
            latency: h(),
            submit: h(),
        }
    }
}

impl Default for Hists {
    fn default() -> Self {
        Hists::new()
    }
}

/// Everything the workload and the workqueues own.
pub struct World {
    /// The workload.
    pub workload: Workload,
    /// Workqueues: 0 is the queue under test (rpciod), 1 is nfsiod in `completion`.
    pub wqs: Vec<Wq>,
    /// Pools.
    pub pools: Vec<Pool>,
    /// pwqs.
    pub pwqs: Vec<Pwq>,
    /// Producers.
    pub producers: Vec<Producer>,
    /// `completion` I/Os.
    pub ios: Vec<Io>,
    /// The allocator model.
    pub slab: Slab,
    /// Distributions per segment.
    pub hists: Vec<Hists>,
    /// Items each producer issues, if the run is bounded by items.
    pub per_producer: Option<u64>,
    /// Items after which the run ends, if bounded by items.
    pub target_items: Option<u64>,
    /// The run is over.
    pub stop: bool,
    /// `completion`: when the transport's port is done with the payloads sent so far,
    /// ns (fractional: a 4 KiB payload takes 163.84 ns at 25 GB/s).
    pub port_free: f64,
}

impl World {
    /// An empty world for `workload`: no queue, producer or I/O yet.
    pub fn new(workload: Workload) -> World {
        World {
            workload,
            wqs: Vec::new(),
            pools: Vec::new(),
            pwqs: Vec::new(),
            producers: Vec::new(),
            ios: Vec::new(),
            slab: Slab::default(),
            hists: vec![Hists::new()],
            per_producer: None,
            target_items: None,
            stop: false,
            port_free: 0.0,
        }
    }
}

fn record(h: &mut Histogram<u64>, ns: Ns) {
    h.saturating_record(ns.max(1));
}

impl Sim<'_> {
    /// Runs a logical action for thread `tid`.
    pub fn act(&mut self, tid: Tid, act: Act) {
        match act {
            Act::QueueStart { wq, item } => {
                if let Role::Producer(p) = self.threads[tid].role {
                    self.world.producers[p].t0 = self.now;
                }
                self.queue_start(tid, wq, item);
            }
            Act::Enqueue { pwq, item } => self.enqueue(tid, pwq, item),
            Act::Kicked { pool, out } => self.kicked(tid, pool, out),
            Act::QueueEnd => self.queue_end(tid),
            Act::SpawnWorker { pool } => self.spawn_worker(tid, pool),
            Act::WorkerTake => self.worker_take(tid),
            Act::SpinEnd => self.spin_end(tid),
            Act::AfterSpin => self.after_spin(tid),
            Act::RunItem { item, pwq } => self.run_item(tid, item, pwq),
            Act::ItemDone { pwq } => self.item_done(tid, pwq),
            Act::ItemEnd(item) => self.item_end(tid, item),
            Act::Post(io) => {
                let io = &mut self.world.ios[io];
                io.writer = self.threads[tid].cpu;
                io.posted = self.now;
            }
            Act::Alloc(io, which) => self.alloc(tid, io, which),
            Act::Free(io, which) => self.free(tid, io, which),
            Act::IoDone(io) => self.io_done(io),
        }
    }

    fn segment_hists(&mut self) -> &mut Hists {
        self.world
            .hists
            .last_mut()
            .expect("a run has at least one segment")
    }

    fn queue_end(&mut self, tid: Tid) {
        let Role::Producer(p) = self.threads[tid].role else {
            return;
        };
        let took = self.now - self.world.producers[p].t0;
        match self.world.workload {
            Workload::Queue { .. } | Workload::Throughput { .. } => {
                record(&mut self.segment_hists().queue, took)
            }
            Workload::Latency { .. } => record(&mut self.segment_hists().submit, took),
            Workload::Completion(_) => {}
        }
    }

    fn count_item(&mut self) {
        self.counters.items += 1;
        if self
            .world
            .target_items
            .is_some_and(|t| self.counters.items >= t)
        {
            self.world.stop = true;
        }
    }

    /// What a producer does next, once its operations ran out.
    pub fn producer_next(&mut self, tid: Tid, p: usize) {
        let cpu = self.threads[tid].cpu;
        let item = |kind| Item {
            kind,
            queued_cpu: cpu,
        };
        let producer = &mut self.world.producers[p];
        if self
            .world
            .per_producer
            .is_some_and(|n| producer.issued >= n)
        {
            // Done issuing: sleep for the rest of the run.
            producer.waiting = false;
            self.push_ops(tid, &[Op::Block]);
            return;
        }
        producer.issued += 1;
        match &self.world.workload {
            Workload::Queue { .. } => self.push_ops(
                tid,
                &[
                    Op::Do(Act::QueueStart {
                        wq: 0,
                        item: item(ItemKind::Wake(p)),
                    }),
                    Op::Block,
                ],
            ),
            Workload::Latency { think_ns, .. } => {
                let think = *think_ns;
                self.push_ops(
                    tid,
                    &[
                        Op::Do(Act::QueueStart {
                            wq: 0,
                            item: item(ItemKind::Wake(p)),
                        }),
                        Op::Block,
                        Op::Sleep(think),
                    ],
                )
            }
            Workload::Throughput { depth, .. } => {
                if producer.inflight < *depth {
                    producer.inflight += 1;
                    self.push_ops(
                        tid,
                        &[Op::Do(Act::QueueStart {
                            wq: 0,
                            item: item(ItemKind::Slot(p)),
                        })],
                    );
                } else {
                    producer.issued -= 1;
                    producer.waiting = true;
                    self.push_ops(tid, &[Op::Block]);
                }
            }
            Workload::Completion(c) => {
                let work = c.producer_ns as f64 + self.cost.buf4k_local;
                if let Some(io) = producer.free_slots.pop() {
                    producer.inflight += 1;
                    self.push_ops(
                        tid,
                        &[
                            Op::Do(Act::Alloc(io, Which::Request)),
                            Op::Compute(work),
                            Op::Do(Act::Post(io)),
                            Op::Do(Act::QueueStart {
                                wq: 0,
                                item: item(ItemKind::Rpc(io)),
                            }),
                        ],
                    );
                } else {
                    producer.issued -= 1;
                    producer.waiting = true;
                    self.push_ops(tid, &[Op::Block]);
                }
            }
        }
    }

    fn run_item(&mut self, tid: Tid, item: Item, pwq: usize) {
        let cpu = self.threads[tid].cpu;
        let class = locality(self.topo, item.queued_cpu, cpu) as usize;
        self.counters.locality[class] += 1;
        self.threads[tid].spun = false;
        self.threads[tid].item_since = self.now;
        self.threads[tid].in_item = true;
        // The next item of the worker's batch follows without a look at the worklist.
        let done = Op::Do(Act::ItemDone { pwq });
        if self.threads[tid].batch.is_empty() {
            let lock = self.world.pools[self.world.pwqs[pwq].pool].take_lock;
            self.push_ops(tid, &[Op::Lock(lock, crate::lock::Side::Dequeue), done]);
        } else {
            self.push_ops(tid, &[done]);
        }
        // The worker's own per-item work joins the item's compute step: no extra event.
        let dispatch = self.cost.item_dispatch;
        match (item.kind, &self.world.workload) {
            (
                ItemKind::Wake(_) | ItemKind::Slot(_),
                Workload::Queue { item_ns, .. }
                | Workload::Latency { item_ns, .. }
                | Workload::Throughput { item_ns, .. },
            ) => {
                let ns = dispatch + *item_ns as f64;
                self.push_ops(tid, &[Op::Compute(ns), Op::Do(Act::ItemEnd(item))]);
            }
            (ItemKind::Rpc(io), Workload::Completion(c)) => {
                let read = buf4k(&self.cost, self.distance(self.world.ios[io].writer, cpu));
                let work = dispatch + read + c.rpciod_ns as f64;
                self.push_ops(
                    tid,
                    &[
                        Op::Do(Act::Free(io, Which::Request)),
                        Op::Do(Act::Alloc(io, Which::Task)),
                        Op::Compute(work),
                        Op::Do(Act::QueueStart {
                            wq: 1,
                            item: Item {
                                kind: ItemKind::Nfs(io),
                                queued_cpu: cpu,
                            },
                        }),
                    ],
                );
            }
            (ItemKind::Nfs(io), Workload::Completion(c)) => {
                let work = dispatch + c.nfsiod_ns as f64;
                self.push_ops(
                    tid,
                    &[
                        Op::Do(Act::Free(io, Which::Task)),
                        Op::Compute(work),
                        Op::Do(Act::IoDone(io)),
                    ],
                );
            }
            _ => unreachable!("items match their workload"),
        }
    }

    fn item_end(&mut self, tid: Tid, item: Item) {
        self.count_item();
        let cpu = self.threads[tid].cpu;
        match item.kind {
            ItemKind::Wake(p) => {
                if matches!(self.world.workload, Workload::Latency { .. }) {
                    let clat = self.now - self.world.producers[p].t0;
                    record(&mut self.segment_hists().latency, clat);
                }
                let producer = self.world.producers[p].tid;
                let home = self.world.producers[p].cpu;
                self.wake(producer, cpu, home, None);
                let call = self.cost.wake_call;
                self.push_ops(tid, &[Op::Compute(call)]);
            }
            ItemKind::Slot(p) => self.return_slot(tid, p),
            ItemKind::Rpc(_) | ItemKind::Nfs(_) => {}
        }
    }

    fn return_slot(&mut self, tid: Tid, p: usize) {
        let cpu = self.threads[tid].cpu;
        let producer = &mut self.world.producers[p];
        producer.inflight -= 1;
        if producer.waiting {
            producer.waiting = false;
            let (ptid, home) = (producer.tid, producer.cpu);
            self.wake(ptid, cpu, home, None);
            let call = self.cost.wake_call;
            self.push_ops(tid, &[Op::Compute(call)]);
        }
    }

    fn io_done(&mut self, io: usize) {
        self.count_item();
        let took = self.now - self.world.ios[io].posted;
        record(&mut self.segment_hists().latency, took);
        self.transmit(io);
    }

    /// Sends I/O `io` over the transport: its request reaches the server after the
    /// adapter's latency, its payload crosses the port after those queued before it,
    /// and its reply reaches the CQ one latency later (an [`Event::Wire`]).
    pub fn transmit(&mut self, io: usize) {
        let Workload::Completion(c) = &self.world.workload else {
            return;
        };
        let latency = self.cost.nic_latency;
        // GB/s is bytes per ns.
        let wire = c.io_bytes as f64 / self.cost.nic_rate;
        let start = (self.now as f64 + latency).max(self.world.port_free);
        self.world.port_free = start + wire;
        let at = to_ns(self.world.port_free + latency).max(self.now);
        self.events.push(at, Event::Wire(io));
    }

    /// Handles an [`Event::Wire`]: the I/O is its CQ's to handle, and a CQ waiting for
    /// one is woken (by the adapter's interrupt: no thread pays for the wake-up).
    pub fn on_wire(&mut self, io: usize) {
        let p = self.world.ios[io].producer;
        let producer = &mut self.world.producers[p];
        producer.inflight -= 1;
        producer.free_slots.push(io);
        if producer.waiting {
            producer.waiting = false;
            let (ptid, home) = (producer.tid, producer.cpu);
            self.wake(ptid, home, home, None);
        }
    }
}
