//! Statistics: monotonic counters, lock contention, locality and latency per pool and
//! per workqueue, and their serialisable snapshots.
//!
//! Recording is compiled out without the `stats` cargo feature (the snapshot types stay,
//! with zeros), so a benchmark can compare the two builds.
//!
//! Legend: A atomic with `Relaxed` ordering: counters are monotonic, read only by
//! snapshots, and never decide control flow, so they pair with nothing. AW atomic,
//! written by one worker only (a load and a store, no locked instruction) and read by
//! snapshots. AL atomic, written (a load and a store) only while holding the lock it
//! counts, read by snapshots: `LockCounters`. R guarded by `PoolCounters::workers` (a
//! std mutex). A snapshot taken while
//! items run is not a consistent cut (e.g. `started` may exceed `queued` read a moment
//! earlier); readers derive rates from successive snapshots.
//!
//! What a worker records for the items of its own pool (starts, completions, locality,
//! latencies, dequeue lock acquisitions) goes to its own `WorkerCounters`: shared
//! counters would cost a locked add per event on a cache line every worker writes. A
//! snapshot sums the live workers' counters with the pool's shared ones, into which an
//! exiting worker folds its own. Other recorders (rescuers, a worker running a handed-off
//! item of another pool) use the shared atomics.
//!
//! Latency histograms are written here rather than taken from `hdrhistogram`: recording
//! must be a few plain or relaxed atomic operations from any thread, with no lock.
//! Buckets are log-linear with 16 sub-buckets per power of two: values below 16 ns are
//! exact, others are reported with at most 1/16 relative error, in 7.8 KiB per histogram.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
#[cfg(feature = "stats")]
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::policy::Locality as Place;
use crate::sync::{Mutex, MutexGuard};
use crate::Attrs;

/// A monotonic event counter.
#[derive(Default, Debug)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    #[inline]
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        #[cfg(feature = "stats")]
        self.0.fetch_add(n, Relaxed);
        #[cfg(not(feature = "stats"))]
        let _ = n;
    }

    /// Adds `n` with a load and a store (no locked instruction): only while holding the
    /// mutex this counter counts, which orders its writers.
    #[inline]
    fn add_locked(&self, n: u64) {
        #[cfg(feature = "stats")]
        self.0.store(self.0.load(Relaxed) + n, Relaxed);
        #[cfg(not(feature = "stats"))]
        let _ = n;
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A monotonic event counter written by one thread only (AW).
#[derive(Default, Debug)]
pub(crate) struct OwnedCounter(AtomicU64);

impl OwnedCounter {
    /// Adds one. Only the owning worker calls this.
    #[inline]
    pub(crate) fn inc(&self) {
        #[cfg(feature = "stats")]
        self.0.store(self.0.load(Relaxed) + 1, Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// What one worker records for items of its own pool (all AW).
#[derive(Default, Debug)]
pub(crate) struct WorkerCounters {
    started: OwnedCounter,
    completed: OwnedCounter,
    dequeue_acquisitions: OwnedCounter,
    locality: [OwnedCounter; 5],
    queue_to_start: Histogram,
    run_time: Histogram,
}

impl WorkerCounters {
    /// Counts one acquisition of the pool lock to take an item.
    #[inline]
    pub(crate) fn dequeue_acquisition(&self) -> &OwnedCounter {
        &self.dequeue_acquisitions
    }
}

/// Where an item's accounting goes: the running worker's own counters, or the pool's
/// shared ones.
#[derive(Clone, Copy)]
pub(crate) enum Recorder<'a> {
    /// A worker of the item's pool.
    Worker(&'a WorkerCounters),
    /// Anyone else.
    Shared(&'a PoolCounters),
}

#[cfg_attr(not(feature = "stats"), allow(dead_code))]
impl Recorder<'_> {
    #[inline]
    pub(crate) fn started(self) {
        match self {
            Recorder::Worker(w) => w.started.inc(),
            Recorder::Shared(p) => p.items.started.inc(),
        }
    }

    #[inline]
    pub(crate) fn completed(self) {
        match self {
            Recorder::Worker(w) => w.completed.inc(),
            Recorder::Shared(p) => p.items.completed.inc(),
        }
    }

    #[inline]
    pub(crate) fn locality(self, place: Place) {
        let i = locality_index(place);
        match self {
            Recorder::Worker(w) => w.locality[i].inc(),
            Recorder::Shared(p) => p.locality[i].inc(),
        }
    }

    #[inline]
    pub(crate) fn queue_to_start(self, ns: u64) {
        match self {
            Recorder::Worker(w) => w.queue_to_start.record_owned(ns),
            Recorder::Shared(p) => p.queue_to_start.record(ns),
        }
    }

    #[inline]
    pub(crate) fn run_time(self, ns: u64) {
        match self {
            Recorder::Worker(w) => w.run_time.record_owned(ns),
            Recorder::Shared(p) => p.run_time.record(ns),
        }
    }
}

fn locality_index(place: Place) -> usize {
    match place {
        Place::SameCpu => 0,
        Place::SameSmt => 1,
        Place::SameLlc => 2,
        Place::SameNode => 3,
        Place::Remote => 4,
    }
}

/// Shards of a [`ShardedCounter`].
const SHARDS: usize = 8;

/// One shard, alone on its cache line.
#[derive(Default, Debug)]
#[repr(align(64))]
struct Shard(Counter);

/// A monotonic counter that queuers and workers of many CPUs bump: each thread adds
/// into one of [`SHARDS`] cache lines (chosen once per thread, round-robin), so
/// threads rarely write the same line; reading sums the shards (A, relaxed).
#[derive(Default, Debug)]
pub(crate) struct ShardedCounter([Shard; SHARDS]);

impl ShardedCounter {
    /// Adds one.
    #[inline]
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0[shard_index()].0.add(n);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.get()).sum()
    }
}

/// The calling thread's shard (W once chosen; the chooser is a relaxed ID counter).
#[inline]
fn shard_index() -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    MINE.with(|m| *m)
}

/// Item counters, kept per pool and per workqueue.
#[derive(Default, Debug)]
pub(crate) struct ItemCounters {
    pub(crate) queued: ShardedCounter,
    pub(crate) started: ShardedCounter,
    pub(crate) completed: ShardedCounter,
    pub(crate) panicked: ShardedCounter,
    pub(crate) cancelled: ShardedCounter,
    pub(crate) repatriated: ShardedCounter,
    pub(crate) max_active_waits: ShardedCounter,
}

impl ItemCounters {
    pub(crate) fn snapshot(&self) -> Totals {
        Totals {
            queued: self.queued.get(),
            started: self.started.get(),
            completed: self.completed.get(),
            panicked: self.panicked.get(),
            cancelled: self.cancelled.get(),
            repatriated: self.repatriated.get(),
            max_active_waits: self.max_active_waits.get(),
        }
    }
}

/// Contention of one lock at one kind of call site. Every field is written only while
/// holding that lock (after acquiring it), so by one thread at a time.
#[derive(Default, Debug)]
pub(crate) struct LockCounters {
    acquisitions: Counter,
    contended: Counter,
    wait_ns: Counter,
}

/// Counts acquisitions in the lock's own counters (queuers).
impl crate::pool::Acquire for LockCounters {
    /// Locks `mutex`: a try-lock first, and only a contended acquisition is timed.
    #[inline]
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X> {
        let guard = self.lock_uncounted(mutex);
        self.acquisitions.add_locked(1);
        guard
    }
}

/// [`LockCounters`] with the acquisition counted in a worker's own counter.
pub(crate) struct OwnedAcquire<'a> {
    lock: &'a LockCounters,
    acquisitions: &'a OwnedCounter,
}

impl crate::pool::Acquire for OwnedAcquire<'_> {
    #[inline]
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X> {
        self.acquisitions.inc();
        self.lock.lock_uncounted(mutex)
    }
}

impl LockCounters {
    /// Takes the lock counting the acquisition in a worker's own counter.
    #[inline]
    pub(crate) fn owned<'a>(&'a self, acquisitions: &'a OwnedCounter) -> OwnedAcquire<'a> {
        OwnedAcquire {
            lock: self,
            acquisitions,
        }
    }

    #[inline]
    fn lock_uncounted<'a, T>(&self, mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
        #[cfg(feature = "stats")]
        {
            if let Ok(guard) = mutex.try_lock() {
                return guard;
            }
            let start = Instant::now();
            let guard = crate::sync::lock(mutex);
            self.contended.add_locked(1);
            self.wait_ns.add_locked(elapsed_ns(start));
            guard
        }
        #[cfg(not(feature = "stats"))]
        crate::sync::lock(mutex)
    }

    fn snapshot(&self) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions.get(),
            contended: self.contended.get(),
            wait_ns: self.wait_ns.get(),
        }
    }
}

/// Latency is measured on one item in [`SAMPLE_EVERY`] per queueing thread: a clock
/// read costs about as much as the rest of queueing a tiny item, and each measured
/// item takes three (queued, started, finished). The first item a thread queues is
/// always measured. The histograms then hold a systematic 1-in-16 sample: their
/// `count` is the sample size, not the item count (the item counters are exact), and a
/// percentile's rank error from sampling is about `sqrt(p (1 - p) / samples)`, e.g.
/// ±0.04 points for p99 after 1 M items; latency that depends on an item's position
/// modulo 16 in its thread's sequence would bias it.
#[cfg(feature = "stats")]
pub(crate) const SAMPLE_EVERY: u32 = 16;

/// The queueing time of an item if it is one to measure ([`SAMPLE_EVERY`]).
#[cfg(feature = "stats")]
#[inline]
pub(crate) fn sample_stamp() -> Option<Instant> {
    thread_local! {
        /// W: queue calls of this thread, modulo `SAMPLE_EVERY`.
        static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    CALLS.with(|c| {
        let n = c.get();
        c.set(if n + 1 == SAMPLE_EVERY { 0 } else { n + 1 });
        (n == 0).then(Instant::now)
    })
}

/// Nanoseconds from `from` to `to`, saturating (0 if `to` is earlier).
#[cfg(feature = "stats")]
pub(crate) fn ns_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds since `start`, saturating.
#[cfg(feature = "stats")]
pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counters of one pool (shared by every workqueue whose items it runs).
#[derive(Default, Debug)]
pub(crate) struct PoolCounters {
    pub(crate) items: ItemCounters,
    pub(crate) workers_created: Counter,
    pub(crate) workers_reaped: Counter,
    pub(crate) worker_spawn_failures: Counter,
    pub(crate) maydays: Counter,
    pub(crate) rescued: Counter,
    pub(crate) affinity_failures: Counter,
    pub(crate) nice_failures: Counter,
    pub(crate) enqueue_lock: LockCounters,
    pub(crate) dequeue_lock: LockCounters,
    pub(crate) locality: [Counter; 5],
    pub(crate) queue_to_start: Histogram,
    pub(crate) run_time: Histogram,
    pub(crate) cpu_time_ns: Counter,
    /// Dequeue lock acquisitions of workers that exited (kept apart from
    /// `dequeue_lock`, whose fields are written under the pool lock only).
    retired_dequeues: Counter,
    /// R: the counters of the pool's live workers.
    workers: std::sync::Mutex<Vec<Arc<WorkerCounters>>>,
}

impl PoolCounters {
    /// New counters for a worker starting in this pool.
    pub(crate) fn register_worker(&self) -> Arc<WorkerCounters> {
        let mine = Arc::new(WorkerCounters::default());
        crate::sync::lock_std(&self.workers).push(Arc::clone(&mine));
        mine
    }

    /// A worker exits: its counts move into the shared counters, in one step as seen by
    /// snapshots (both under the workers lock).
    pub(crate) fn retire_worker(&self, mine: &Arc<WorkerCounters>) {
        let mut workers = crate::sync::lock_std(&self.workers);
        workers.retain(|w| !Arc::ptr_eq(w, mine));
        self.items.started.add(mine.started.get());
        self.items.completed.add(mine.completed.get());
        self.retired_dequeues.add(mine.dequeue_acquisitions.get());
        for (shared, own) in self.locality.iter().zip(&mine.locality) {
            shared.add(own.get());
        }
        self.queue_to_start.absorb(&mine.queue_to_start);
        self.run_time.absorb(&mine.run_time);
    }
}

const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// A lock-free log-linear histogram of nanosecond values.
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
            max: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count.load(Relaxed))
            .finish()
    }
}

#[cfg_attr(not(feature = "stats"), allow(dead_code))]
fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let mantissa = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
    (exp - SUB_BITS + 1) as usize * SUB + mantissa
}

/// The largest value that falls in bucket `i`.
fn bucket_high(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let exp = (i / SUB) as u32 + SUB_BITS - 1;
    let mantissa = (i % SUB) as u64;
    let low = (SUB as u64 + mantissa) << (exp - SUB_BITS);
    low + ((1u64 << (exp - SUB_BITS)) - 1)
}

impl Histogram {
    /// Records one value.
    #[inline]
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    pub(crate) fn record(&self, v: u64) {
        #[cfg(feature = "stats")]
        {
            self.buckets[bucket_of(v)].fetch_add(1, Relaxed);
            self.count.fetch_add(1, Relaxed);
            self.sum.fetch_add(v, Relaxed);
            self.min.fetch_min(v, Relaxed);
            self.max.fetch_max(v, Relaxed);
        }
        #[cfg(not(feature = "stats"))]
        let _ = v;
    }

    /// Records one value; only the histogram's one writer may call this (AW).
    #[inline]
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    pub(crate) fn record_owned(&self, v: u64) {
        #[cfg(feature = "stats")]
        {
            let bump = |a: &AtomicU64, n: u64| a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
            bump(&self.buckets[bucket_of(v)], 1);
            bump(&self.count, 1);
            bump(&self.sum, v);
            if v < self.min.load(Relaxed) {
                self.min.store(v, Relaxed);
            }
            if v > self.max.load(Relaxed) {
                self.max.store(v, Relaxed);
            }
        }
        #[cfg(not(feature = "stats"))]
        let _ = v;
    }

    /// Adds `other`'s values to this histogram.
    fn absorb(&self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter().zip(other.buckets.iter()) {
            let n = theirs.load(Relaxed);
            if n > 0 {
                mine.fetch_add(n, Relaxed);
            }
        }
        self.count.fetch_add(other.count.load(Relaxed), Relaxed);
        self.sum.fetch_add(other.sum.load(Relaxed), Relaxed);
        self.min.fetch_min(other.min.load(Relaxed), Relaxed);
        self.max.fetch_max(other.max.load(Relaxed), Relaxed);
    }

    #[cfg(all(test, feature = "stats"))]
    fn snapshot(&self) -> Latency {
        Histogram::merged_snapshot(std::iter::once(self))
    }

    /// The distribution of all values recorded in `parts`.
    fn merged_snapshot<'a>(parts: impl Iterator<Item = &'a Histogram> + Clone) -> Latency {
        let mut counts = vec![0u64; BUCKETS];
        let (mut recorded, mut sum, mut min, mut max) = (0u64, 0u64, u64::MAX, 0u64);
        for h in parts {
            for (c, b) in counts.iter_mut().zip(h.buckets.iter()) {
                *c += b.load(Relaxed);
            }
            recorded += h.count.load(Relaxed);
            sum = sum.wrapping_add(h.sum.load(Relaxed));
            min = min.min(h.min.load(Relaxed));
            max = max.max(h.max.load(Relaxed));
        }
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return Latency::default();
        }
        let min = min.min(max);
        let mean = sum as f64 / recorded.max(1) as f64;
        let var = counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| {
                let low = if i == 0 { 0 } else { bucket_high(i - 1) + 1 };
                let mid = (low as f64 + bucket_high(i) as f64) / 2.0;
                n as f64 * (mid - mean) * (mid - mean)
            })
            .sum::<f64>()
            / count as f64;
        let quantile = |q: f64| {
            let rank = ((q * count as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, &n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return bucket_high(i).min(max).max(min);
                }
            }
            max
        };
        Latency {
            count,
            min,
            mean,
            stdev: var.sqrt(),
            max,
            p50: quantile(0.5),
            p90: quantile(0.9),
            p99: quantile(0.99),
            p999: quantile(0.999),
        }
    }
}

/// Item totals of a workqueue or pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Totals {
    /// Items accepted by a queue call (and `spawn`).
    pub queued: u64,
    /// Items whose function started.
    pub started: u64,
    /// Items whose function returned (panicked ones included).
    pub completed: u64,
    /// Items whose function panicked.
    pub panicked: u64,
    /// Queued items dropped without running: cancelled, superseded by `mod_delayed`,
    /// or still on the timer when their workqueue was dropped.
    pub cancelled: u64,
    /// Wake-ups of an idle worker that last ran outside the pod (non-strict pools).
    pub repatriated: u64,
    /// Items that had to wait for a `max_active` slot.
    pub max_active_waits: u64,
}

/// Contention of a pool lock at one kind of call site.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Times it was already held (the try-lock failed).
    pub contended: u64,
    /// Total time spent waiting in contended acquisitions.
    pub wait_ns: u64,
}

/// Where items ran relative to where they were queued, in the workqueue's topology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Locality {
    /// On the queueing CPU.
    pub same_cpu: u64,
    /// On another thread of its core.
    pub same_smt: u64,
    /// On another core of its last-level cache.
    pub same_llc: u64,
    /// On another LLC of its NUMA node.
    pub same_node: u64,
    /// On another node.
    pub remote: u64,
}

/// A latency distribution in nanoseconds (quantiles within 1/16 relative error).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Latency {
    /// Values recorded.
    pub count: u64,
    /// Smallest value.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation (from bucket midpoints).
    pub stdev: f64,
    /// Largest value.
    pub max: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
}

/// A snapshot of one pool. Pools are shared by workqueues with equal pool attributes,
/// so these numbers cover every workqueue that uses the pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolStats {
    /// Process-unique pool id (as in worker names `podq/u<id>:<n>`).
    pub id: u64,
    /// The pod's CPUs as a cpulist.
    pub pod_cpus: String,
    /// Whether workers are confined to the pod.
    pub strict: bool,
    /// Nice value of the workers.
    pub nice: i32,
    /// Items queued onto this pool.
    pub queued: u64,
    /// Items started.
    pub started: u64,
    /// Items finished (panicked ones included).
    pub completed: u64,
    /// Items that panicked.
    pub panicked: u64,
    /// Items dropped without running.
    pub cancelled: u64,
    /// Repatriating wake-ups.
    pub repatriated: u64,
    /// Worker threads started.
    pub workers_created: u64,
    /// Worker threads that exited after idling too long.
    pub workers_reaped: u64,
    /// Worker threads that could not be started (each retried after the create
    /// cooldown and reported to the error hook).
    pub worker_spawn_failures: u64,
    /// Calls for help sent to rescuers while no worker could be started.
    pub maydays: u64,
    /// Items run by rescuers.
    pub rescued: u64,
    /// Workers whose CPU affinity could not be set.
    pub affinity_failures: u64,
    /// Workers whose nice value could not be set (e.g. EPERM for negative nice).
    pub nice_failures: u64,
    /// Workers now.
    pub workers: usize,
    /// Idle workers now.
    pub idle: usize,
    /// Items that waited for a `max_active` slot.
    pub max_active_waits: u64,
    /// Pool-lock contention when queueing.
    pub enqueue_lock: LockStats,
    /// Pool-lock contention when workers take items.
    pub dequeue_lock: LockStats,
    /// Where items ran relative to where they were queued.
    pub locality: Locality,
    /// Time from the queue call to the start (waiting for a `max_active` slot included).
    pub queue_to_start_ns: Latency,
    /// Time items ran.
    pub run_time_ns: Latency,
    /// CPU time of the workers, added when a worker goes idle or exits.
    pub cpu_time_ns: u64,
}

impl PoolStats {
    pub(crate) fn from_counters(c: &PoolCounters) -> PoolStats {
        let workers = crate::sync::lock_std(&c.workers);
        let items = c.items.snapshot();
        let own = |f: fn(&WorkerCounters) -> &OwnedCounter| -> u64 {
            workers.iter().map(|w| f(w).get()).sum()
        };
        let mut dequeue_lock = c.dequeue_lock.snapshot();
        dequeue_lock.acquisitions += c.retired_dequeues.get() + own(|w| &w.dequeue_acquisitions);
        let place = |i: usize| {
            c.locality[i].get() + workers.iter().map(|w| w.locality[i].get()).sum::<u64>()
        };
        let latency = |f: fn(&WorkerCounters) -> &Histogram, shared: &Histogram| {
            Histogram::merged_snapshot(std::iter::once(shared).chain(workers.iter().map(|w| f(w))))
        };
        PoolStats {
            queued: items.queued,
            started: items.started + own(|w| &w.started),
            completed: items.completed + own(|w| &w.completed),
            panicked: items.panicked,
            cancelled: items.cancelled,
            repatriated: items.repatriated,
            max_active_waits: items.max_active_waits,
            workers_created: c.workers_created.get(),
            workers_reaped: c.workers_reaped.get(),
            worker_spawn_failures: c.worker_spawn_failures.get(),
            maydays: c.maydays.get(),
            rescued: c.rescued.get(),
            affinity_failures: c.affinity_failures.get(),
            nice_failures: c.nice_failures.get(),
            enqueue_lock: c.enqueue_lock.snapshot(),
            dequeue_lock,
            locality: Locality {
                same_cpu: place(0),
                same_smt: place(1),
                same_llc: place(2),
                same_node: place(3),
                remote: place(4),
            },
            queue_to_start_ns: latency(|w| &w.queue_to_start, &c.queue_to_start),
            run_time_ns: latency(|w| &w.run_time, &c.run_time),
            cpu_time_ns: c.cpu_time_ns.get(),
            ..PoolStats::default()
        }
    }
}

/// A snapshot of one workqueue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkqueueStats {
    /// The workqueue's name.
    pub name: String,
    /// Its requested attributes.
    pub attrs: Attrs,
    /// Its scope with `default` resolved, and for `auto` the scope its controller chose.
    pub effective_scope: podq_topology::Scope,
    /// The `auto` controller, while the scope resolves to `auto`.
    pub auto: Option<crate::auto::AutoStats>,
    /// This workqueue's own item counts (its share of the pools' counts).
    pub totals: Totals,
    /// The pools its current and retiring pool_workqueues use, by id.
    pub pools: Vec<PoolStats>,
    /// What the stall watchdog found (stalls and long items).
    #[serde(default)]
    pub watchdog: crate::watchdog::WatchdogStats,
}

/// Snapshots of every live workqueue, in creation order.
pub fn all() -> Vec<WorkqueueStats> {
    crate::workqueue::live_workqueues()
        .iter()
        .map(|wq| wq.stats_snapshot())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b >= last, "{v}");
            last = b;
            assert!(
                bucket_high(b) >= v,
                "{v} above its bucket {}",
                bucket_high(b)
            );
            let low = if b == 0 { 0 } else { bucket_high(b - 1) + 1 };
            assert!(low <= v, "{v} below its bucket");
            assert!((bucket_high(b) - low) as f64 <= (v as f64 / 16.0).max(0.0) + 1.0);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[cfg(feature = "stats")]
    #[test]
    fn histogram_quantiles() {
        let h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let l = h.snapshot();
        assert_eq!(l.count, 1000);
        assert_eq!(l.min, 1000);
        assert_eq!(l.max, 1_000_000);
        assert!((l.mean - 500_500.0).abs() < 1.0);
        for (got, want) in [(l.p50, 500_000.0), (l.p90, 900_000.0), (l.p99, 990_000.0)] {
            let err = (got as f64 - want).abs() / want;
            assert!(err <= 1.0 / 16.0, "{got} vs {want}");
        }
        assert!(l.stdev > 280_000.0 && l.stdev < 300_000.0, "{}", l.stdev);
        assert_eq!(Histogram::default().snapshot(), Latency::default());
    }

    /// Per-worker recording: a snapshot sums live workers with the shared counters, and
    /// a retiring worker's counts move to the shared ones without changing the sum.
    #[cfg(feature = "stats")]
    #[test]
    fn worker_counters_merge_and_retire() {
        let pool = PoolCounters::default();
        let all = Histogram::default();
        let (a, b) = (pool.register_worker(), pool.register_worker());
        for v in 1..=300u64 {
            let record = match v % 3 {
                0 => Recorder::Worker(&a),
                1 => Recorder::Worker(&b),
                _ => Recorder::Shared(&pool),
            };
            record.started();
            record.completed();
            record.locality(Place::SameLlc);
            record.queue_to_start(v * 7);
            record.run_time(v * 1000);
            all.record(v * 1000);
        }
        let mutex = Mutex::new(());
        {
            use crate::pool::Acquire;
            drop(
                pool.dequeue_lock
                    .owned(a.dequeue_acquisition())
                    .acquire(&mutex),
            );
        }
        let before = PoolStats::from_counters(&pool);
        assert_eq!((before.started, before.completed), (300, 300));
        assert_eq!(before.locality.same_llc, 300);
        assert_eq!(before.dequeue_lock.acquisitions, 1);
        assert_eq!(before.run_time_ns, all.snapshot());
        assert_eq!(before.queue_to_start_ns.count, 300);
        assert_eq!(
            (before.queue_to_start_ns.min, before.queue_to_start_ns.max),
            (7, 2100)
        );
        pool.retire_worker(&a);
        assert_eq!(PoolStats::from_counters(&pool), before);
        assert_eq!(crate::sync::lock_std(&pool.workers).len(), 1);
    }
}
