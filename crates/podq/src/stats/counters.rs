//! Event counters: plain, worker-owned and sharded atomics, the per-worker, per-pool and
//! per-item sets built from them, and lock-contention counting (legend in `stats.rs`).

use crate::lease::{self, LEASES};
use crate::sync::unmodelled;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[cfg(feature = "stats")]
use super::{clock, elapsed_since, now_ns, sample_lock_wait, Sample};
use super::{Histogram, LockStats, Totals};
use crate::policy::Locality as Place;
use crate::sync::{Mutex, MutexGuard};
use crate::Topology;

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

    /// Adds `n` with a load and a store (no locked instruction): only where one writer
    /// at a time is guaranteed (the mutex this counter counts is held, or the shard's
    /// lease), which orders its writers.
    #[inline]
    fn add_exclusive(&self, n: u64) {
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

    pub(super) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// What one worker records for items of its own pool (all AW).
#[derive(Default, Debug)]
pub(crate) struct WorkerCounters {
    pub(super) started: OwnedCounter,
    pub(super) completed: OwnedCounter,
    pub(super) dequeue_acquisitions: OwnedCounter,
    pub(super) locality: [OwnedCounter; 5],
    pub(super) queue_to_start: Histogram,
    pub(super) run_time: Histogram,
    last_locality: LastLocality,
    /// The worker's shard of sharded counts ([`my_shard`], the same for its life),
    /// looked up once at registration: `Shared(0)` as made by `default`.
    shard: (usize, bool),
}

/// The last locality class a worker found, kept for the next item queued from the same
/// CPU while the worker runs on the same CPU: the classification reads the topology's
/// CPU slots and sets, which a flood's stream of items pushes out of the cache (in a
/// profile it took nearly as long as the rest of the worker's statistics). Valid for the
/// worker's life: its pool's topology does not change, and the class is a function of
/// the two CPUs (an unknown CPU, `usize::MAX`, included). Written and read by the
/// owning worker only (AW), so the fields need not change together.
#[derive(Debug)]
struct LastLocality {
    /// The queueing CPU.
    queued: unmodelled::AtomicUsize,
    /// The running CPU.
    ran: unmodelled::AtomicUsize,
    /// Their class, as `locality_index`.
    index: unmodelled::AtomicUsize,
}

impl LastLocality {
    /// The class index of an item queued on `queued` and run on `ran`, classified in
    /// `topology` unless it is the last one's.
    #[inline]
    fn index(&self, topology: &Topology, queued: usize, ran: usize) -> usize {
        if self.queued.load(Relaxed) == queued && self.ran.load(Relaxed) == ran {
            return self.index.load(Relaxed);
        }
        let index = classify(topology, queued, ran);
        self.queued.store(queued, Relaxed);
        self.ran.store(ran, Relaxed);
        self.index.store(index, Relaxed);
        index
    }
}

impl Default for LastLocality {
    /// Two unknown CPUs, whose class is the same CPU's (as `policy::locality` has it
    /// for two equal CPUs).
    fn default() -> Self {
        LastLocality {
            queued: unmodelled::AtomicUsize::new(usize::MAX),
            ran: unmodelled::AtomicUsize::new(usize::MAX),
            index: unmodelled::AtomicUsize::new(locality_index(Place::SameCpu)),
        }
    }
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
    /// Counts an item started, here and in its workqueue's counts `wq`: a worker's
    /// count there goes to the shard it looked up once.
    #[inline]
    pub(crate) fn started(self, wq: &ItemCounters) {
        match self {
            Recorder::Worker(w) => {
                w.started.inc();
                wq.add_in(w.shard, Item::Started, 1);
            }
            Recorder::Shared(p) => ItemCounters::inc_both(&p.items, wq, Item::Started),
        }
    }

    #[inline]
    pub(crate) fn completed(self) {
        match self {
            Recorder::Worker(w) => w.completed.inc(),
            Recorder::Shared(p) => p.items.inc(Item::Completed),
        }
    }

    /// Counts the locality class of an item queued on CPU `queued` and run on `ran`.
    #[inline]
    pub(crate) fn locality(self, topology: &Topology, queued: usize, ran: usize) {
        match self {
            Recorder::Worker(w) => w.locality[w.last_locality.index(topology, queued, ran)].inc(),
            Recorder::Shared(p) => p.locality[classify(topology, queued, ran)].inc(),
        }
    }

    /// A measured item's wait, standing for `weight` items (`stats/sample.rs`).
    #[inline]
    pub(super) fn queue_to_start(self, ns: u64, weight: u64) {
        match self {
            Recorder::Worker(w) => w.queue_to_start.record_owned(ns, weight),
            Recorder::Shared(p) => p.queue_to_start.record(ns, weight),
        }
    }

    /// A measured item's run time, standing for `weight` items.
    #[inline]
    pub(super) fn run_time(self, ns: u64, weight: u64) {
        match self {
            Recorder::Worker(w) => w.run_time.record_owned(ns, weight),
            Recorder::Shared(p) => p.run_time.record(ns, weight),
        }
    }

    /// A measured item starts now: its wait since it was queued is recorded, and the
    /// start is kept for [`measured_end`](Self::measured_end).
    #[cfg(feature = "stats")]
    #[inline]
    pub(crate) fn measured_start(self, sample: Sample) -> MeasuredStart {
        let at = clock::now();
        let weight = 1 << sample.weight_log2;
        self.queue_to_start(sample.stamp.ns_until(at.ns()), weight);
        MeasuredStart { at, weight }
    }

    /// A measured item ended now: its run time since `start` is recorded.
    #[cfg(feature = "stats")]
    #[inline]
    pub(crate) fn measured_end(self, start: MeasuredStart) {
        self.run_time(start.at.elapsed_ns(), start.weight);
    }
}

/// When a measured item started (a reading of the statistics' clock) and how many
/// items it stands for.
#[cfg(feature = "stats")]
pub(crate) struct MeasuredStart {
    at: clock::Reading,
    weight: u64,
}

/// The class index (`locality_index`) of an item queued on `queued` and run on `ran`.
fn classify(topology: &Topology, queued: usize, ran: usize) -> usize {
    locality_index(crate::policy::locality(topology, queued, ran))
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

/// Shards of a [`ShardedCounter`]: one per thread lease.
const SHARDS: usize = LEASES;

/// The calling thread's shard, and whether it holds that shard's lease: the lease's
/// code (`lease::code`) below `LEASES` is the lessee of that shard, above it a thread
/// without a lease that shares the shard `code - LEASES`.
#[inline]
fn my_shard() -> (usize, bool) {
    let code = usize::from(lease::code());
    (code % SHARDS, code < SHARDS)
}

/// One shard, alone on its cache line: the lessee's part and everyone else's.
#[derive(Default, Debug)]
#[repr(align(64))]
struct Shard {
    /// AS: written by the thread holding this shard's lease only.
    leased: Counter,
    /// A: threads without a lease whose shard this is (locked adds).
    shared: Counter,
}

/// A monotonic counter that queuers and workers of many CPUs bump. A thread holding
/// one of the [`LEASES`] (`lease.rs`) adds into its shard's `leased` part with a load
/// and a store: no locked instruction, on a line no other thread writes. Threads
/// beyond the leases add into the `shared` part of a shard chosen per thread (a locked
/// add). Reading sums both parts of every shard.
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
        let (i, leased) = my_shard();
        if leased {
            self.0[i].leased.add_exclusive(n);
        } else {
            self.0[i].shared.add(n);
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.iter().map(|s| s.leased.get() + s.shared.get()).sum()
    }
}

/// What an item count counts (the fields of [`Totals`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Item {
    Queued,
    Started,
    Completed,
    Panicked,
    Cancelled,
    Repatriated,
    MaxActiveWaits,
}

/// Kinds of [`Item`] counts.
const ITEM_KINDS: usize = Item::MaxActiveWaits as usize + 1;

/// One thread's part of every item count, alone on its cache line (7 words).
#[derive(Default, Debug)]
#[repr(align(64))]
struct ItemShard([Counter; ITEM_KINDS]);

/// Item counters, kept per pool and per workqueue, sharded as a [`ShardedCounter`] is
/// but by thread first: a thread's parts of all seven counts share one line, so a
/// queue call that counts an item queued and waiting in its workqueue and in its pool
/// writes two lines, not four, and a set takes 1 KiB instead of 3.5.
#[derive(Default, Debug)]
pub(crate) struct ItemCounters {
    /// AS: the lessee of each shard's parts.
    leased: [ItemShard; SHARDS],
    /// A: threads without a lease, `code - LEASES` choosing the shard (locked adds).
    shared: [ItemShard; SHARDS],
}

impl ItemCounters {
    /// Counts one `item` event.
    #[inline]
    pub(crate) fn inc(&self, item: Item) {
        self.add(item, 1);
    }

    /// Counts `n` `item` events.
    #[inline]
    pub(crate) fn add(&self, item: Item, n: u64) {
        self.add_in(my_shard(), item, n);
    }

    /// Counts one `item` event in two sets (a workqueue's and its pool's) with one
    /// lookup of the calling thread's shard: the lookup was a third of what a queue
    /// call's counts cost (`PERFORMANCE.md`, "At 9c0fd0c").
    #[inline]
    pub(crate) fn inc_both(a: &ItemCounters, b: &ItemCounters, item: Item) {
        let shard = my_shard();
        a.add_in(shard, item, 1);
        b.add_in(shard, item, 1);
    }

    /// Counts `n` `item` events in the calling thread's shard, as [`my_shard`] gave it.
    #[inline]
    fn add_in(&self, (i, leased): (usize, bool), item: Item, n: u64) {
        if leased {
            self.leased[i].0[item as usize].add_exclusive(n);
        } else {
            self.shared[i].0[item as usize].add(n);
        }
    }

    pub(crate) fn get(&self, item: Item) -> u64 {
        let i = item as usize;
        self.leased
            .iter()
            .chain(&self.shared)
            .map(|s| s.0[i].get())
            .sum()
    }

    pub(crate) fn snapshot(&self) -> Totals {
        Totals {
            queued: self.get(Item::Queued),
            started: self.get(Item::Started),
            completed: self.get(Item::Completed),
            panicked: self.get(Item::Panicked),
            cancelled: self.get(Item::Cancelled),
            repatriated: self.get(Item::Repatriated),
            max_active_waits: self.get(Item::MaxActiveWaits),
        }
    }
}

/// Contention of a worklist at one kind of call site: of its lock, and of its ring's
/// positions (`pool/ring.rs`), which count as acquisitions too, contended when another
/// thread's claim made one retry, and waiting from that retry until the claim
/// succeeds. The lock's fields are written only while holding that lock (after
/// acquiring it), so by one thread at a time (AL); the ring's counts are sharded, and
/// its timed waits are locked adds.
#[derive(Default, Debug)]
pub(crate) struct LockCounters {
    acquisitions: Counter,
    contended: Counter,
    /// Contended acquisitions whose wait was timed (`sample_lock_wait`), and their wait.
    timed: Counter,
    timed_wait_ns: Counter,
    /// Ring claims by queuers (workers count theirs in their own counters).
    claims: ShardedCounter,
    /// Ring claims that retried.
    claims_retried: ShardedCounter,
    /// Retried claims whose wait was timed (`sample_lock_wait`, from the first retry to
    /// the claim), and their wait: locked adds by any thread, a sample of contended
    /// events only, so not sharded (a pool keeps its counters small).
    claims_timed: Counter,
    claims_timed_wait_ns: Counter,
}

/// Counts acquisitions in the lock's own counters (queuers).
impl crate::pool::Acquire for LockCounters {
    /// Locks `mutex`: a try-lock first, and only a sample of the contended acquisitions
    /// is timed.
    #[inline]
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X> {
        let guard = self.lock_uncounted(mutex);
        self.acquisitions.add_exclusive(1);
        guard
    }

    #[inline]
    fn retry_clock(&self) -> Option<u64> {
        retry_clock()
    }

    #[inline]
    fn claimed(&self, retried: bool, since: Option<u64>) {
        self.claims.inc();
        if retried {
            self.retried(since);
        }
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

    #[inline]
    fn retry_clock(&self) -> Option<u64> {
        retry_clock()
    }

    #[inline]
    fn claimed(&self, retried: bool, since: Option<u64>) {
        self.acquisitions.inc();
        if retried {
            self.lock.retried(since);
        }
    }
}

/// A clock reading for a sample of the retried ring claims (as of the lock's contended
/// acquisitions, one in `LOCK_WAIT_EVERY` of the thread's), none without `stats`.
#[inline]
fn retry_clock() -> Option<u64> {
    #[cfg(feature = "stats")]
    return sample_lock_wait().then(now_ns);
    #[cfg(not(feature = "stats"))]
    None
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

    /// Counts a ring claim that retried, and its wait if its first retry was timed.
    #[inline]
    fn retried(&self, since: Option<u64>) {
        self.claims_retried.inc();
        #[cfg(feature = "stats")]
        if let Some(since) = since {
            self.claims_timed.inc();
            self.claims_timed_wait_ns.add(elapsed_since(since));
        }
        #[cfg(not(feature = "stats"))]
        let _ = since;
    }

    #[inline]
    fn lock_uncounted<'a, T>(&self, mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
        #[cfg(feature = "stats")]
        {
            if let Ok(guard) = mutex.try_lock() {
                return guard;
            }
            self.lock_contended(mutex)
        }
        #[cfg(not(feature = "stats"))]
        crate::sync::lock(mutex)
    }

    /// [`lock_uncounted`](Self::lock_uncounted) once the try-lock failed: out of line,
    /// so that the uncontended acquisition stays as short as without statistics.
    #[cfg(feature = "stats")]
    #[cold]
    #[inline(never)]
    fn lock_contended<'a, T>(&self, mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
        let start = sample_lock_wait().then(now_ns);
        let guard = crate::sync::lock(mutex);
        self.contended.add_exclusive(1);
        if let Some(start) = start {
            self.timed.add_exclusive(1);
            self.timed_wait_ns.add_exclusive(elapsed_since(start));
        }
        guard
    }

    pub(super) fn snapshot(&self) -> LockStats {
        let contended = self.contended.get();
        let retried = self.claims_retried.get();
        LockStats {
            acquisitions: self.acquisitions.get() + self.claims.get(),
            contended: contended + retried,
            wait_ns: scaled_wait(self.timed_wait_ns.get(), self.timed.get(), contended)
                + scaled_wait(
                    self.claims_timed_wait_ns.get(),
                    self.claims_timed.get(),
                    retried,
                ),
        }
    }
}

/// The wait of `contended` acquisitions from the `timed_wait_ns` of the `timed` ones
/// among them: their mean times the count (0 before the first timed one). Read
/// without the lock, the three may be a moment apart: never more than `contended`
/// times the largest mean.
fn scaled_wait(timed_wait_ns: u64, timed: u64, contended: u64) -> u64 {
    if timed == 0 {
        return 0;
    }
    let wait = u128::from(timed_wait_ns) * u128::from(contended.max(timed)) / u128::from(timed);
    u64::try_from(wait).unwrap_or(u64::MAX)
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
    pub(crate) cpu_intensive: Counter,
    pub(crate) handed_back: Counter,
    /// Dequeue lock acquisitions of workers that exited (kept apart from
    /// `dequeue_lock`, whose fields are written under the pool lock only).
    pub(super) retired_dequeues: Counter,
    /// R: the counters of the pool's live workers.
    pub(super) workers: unmodelled::Mutex<Vec<Arc<WorkerCounters>>>,
}

impl PoolCounters {
    /// New counters for a worker starting in this pool.
    pub(crate) fn register_worker(&self) -> Arc<WorkerCounters> {
        // Called on the worker's thread: its shard is its own.
        let mine = Arc::new(WorkerCounters {
            shard: my_shard(),
            ..WorkerCounters::default()
        });
        crate::sync::lock_std(&self.workers).push(Arc::clone(&mine));
        mine
    }

    /// A worker exits: its counts move into the shared counters, in one step as seen by
    /// snapshots (both under the workers lock).
    pub(crate) fn retire_worker(&self, mine: &Arc<WorkerCounters>) {
        let mut workers = crate::sync::lock_std(&self.workers);
        workers.retain(|w| !Arc::ptr_eq(w, mine));
        self.items.add(Item::Started, mine.started.get());
        self.items.add(Item::Completed, mine.completed.get());
        self.retired_dequeues.add(mine.dequeue_acquisitions.get());
        for (shared, own) in self.locality.iter().zip(&mine.locality) {
            shared.add(own.get());
        }
        self.queue_to_start.absorb(&mine.queue_to_start);
        self.run_time.absorb(&mine.run_time);
    }
}

#[cfg(all(test, feature = "stats"))]
mod tests {
    use super::*;
    use crate::lease::Slot;

    /// The kept class is only reused for the same pair of CPUs: every item of a
    /// sequence that moves both CPUs is classified as the topology says.
    #[test]
    fn the_last_locality_is_reused_only_for_the_same_cpus() {
        // 2 nodes x 2 cores x 2 threads.
        let topology = Topology::synthetic("2s2c2t").unwrap();
        let last = LastLocality::default();
        let pairs = [
            (0, 0),
            (0, 0),
            (0, 4),
            (0, 4),
            (4, 0),
            (1, 0),
            (0, 1),
            (3, 1),
            (3, 1),
        ];
        for (queued, ran) in pairs
            .into_iter()
            .chain((0..8).flat_map(|q| (0..8).map(move |r| (q, r))))
        {
            let expected = classify(&topology, queued, ran);
            assert_eq!(
                last.index(&topology, queued, ran),
                expected,
                "{queued} -> {ran}"
            );
        }
        // Unknown CPUs, as a fresh worker's cache starts with them, then again.
        let fresh = LastLocality::default();
        for _ in 0..2 {
            for (queued, ran) in [(usize::MAX, usize::MAX), (usize::MAX, 0), (0, usize::MAX)] {
                let expected = classify(&topology, queued, ran);
                assert_eq!(
                    fresh.index(&topology, queued, ran),
                    expected,
                    "{queued} -> {ran}"
                );
            }
        }
    }

    #[test]
    fn a_lock_wait_is_the_timed_mean_times_the_contended_count() {
        assert_eq!(scaled_wait(0, 0, 0), 0);
        assert_eq!(scaled_wait(0, 0, 12), 0, "nothing timed yet");
        // 2 of 16 contended acquisitions timed, 300 ns in all: 150 ns each.
        assert_eq!(scaled_wait(300, 2, 16), 2400);
        // A snapshot that read `contended` before the last timed one's count.
        assert_eq!(scaled_wait(300, 2, 1), 300);
        assert_eq!(scaled_wait(u64::MAX, 1, u64::MAX), u64::MAX);
    }

    /// A retried ring claim is contended, and its wait from the first retry counts in
    /// `wait_ns` apart from the lock's: a thread's first is always timed, so the mean
    /// of the timed ones stands for every retried claim.
    #[test]
    fn a_retried_ring_claim_counts_its_wait_from_the_first_retry() {
        use crate::pool::Acquire;
        let counters = LockCounters::default();
        counters.claimed(false, None);
        assert_eq!(counters.snapshot().wait_ns, 0, "{:?}", counters.snapshot());
        // A fresh thread: its first sampled retry is timed.
        let since = std::thread::scope(|s| s.spawn(|| counters.retry_clock()).join().unwrap());
        let since = since.expect("a thread's first retry is timed");
        std::thread::sleep(std::time::Duration::from_millis(2));
        counters.claimed(true, Some(since));
        // A second retried claim whose wait was not timed: estimated from the first.
        counters.claimed(true, None);
        let stats = counters.snapshot();
        assert_eq!((stats.acquisitions, stats.contended), (3, 2), "{stats:?}");
        assert!(
            stats.wait_ns >= 4_000_000,
            "two waits of at least 2 ms: {stats:?}"
        );
    }

    /// Every contended acquisition is counted and its wait estimated from the timed
    /// ones: a thread's first is always timed.
    #[test]
    fn contended_acquisitions_are_all_counted_and_their_wait_estimated() {
        use crate::pool::Acquire;
        // Each try holds the lock while a new thread asks for it; a try in which that
        // thread came late (the lock already free) does not count.
        for _ in 0..100 {
            let counters = Arc::new(LockCounters::default());
            let mutex = Arc::new(Mutex::new(0u64));
            let asking = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let held = crate::sync::lock(&*mutex);
            let waiter = {
                let (counters, mutex, asking) = (counters.clone(), mutex.clone(), asking.clone());
                std::thread::spawn(move || {
                    asking.store(true, Relaxed);
                    *counters.acquire(&*mutex) += 1;
                })
            };
            while !asking.load(Relaxed) {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
            drop(held);
            waiter.join().unwrap();
            let stats = counters.snapshot();
            assert_eq!(stats.acquisitions, 1);
            if stats.contended == 1 {
                assert!(stats.wait_ns > 0, "{stats:?}");
                return;
            }
        }
        panic!("the waiter never found the lock held in 100 tries");
    }

    /// More threads than leases, in waves so that leases are given back and taken
    /// again: every add is counted once, whether it went to a leased or a shared part.
    #[test]
    fn a_sharded_counter_loses_no_add_across_leases_and_exits() {
        let counter = Arc::new(ShardedCounter::default());
        let mut expected = [(0u64, 0u64); SHARDS];
        for wave in 0..3u64 {
            let threads: Vec<_> = (0..2 * SHARDS as u64)
                .map(|t| {
                    let counter = Arc::clone(&counter);
                    std::thread::spawn(move || {
                        for _ in 0..1000 + t {
                            counter.inc();
                        }
                        (lease::slot(), 1000 + t)
                    })
                })
                .collect();
            for t in threads {
                match t.join().unwrap() {
                    (Slot::Leased(i), adds) => expected[i].0 += adds,
                    (Slot::Shared(i), adds) => expected[i].1 += adds,
                }
            }
            let per_wave: u64 = (0..2 * SHARDS as u64).map(|t| 1000 + t).sum();
            assert_eq!(counter.get(), (wave + 1) * per_wave);
        }
        // Each part holds exactly the adds of the threads that used it (other tests'
        // threads may hold some leases meanwhile, so which parts is not fixed).
        let parts: Vec<(u64, u64)> = counter
            .0
            .iter()
            .map(|s| (s.leased.get(), s.shared.get()))
            .collect();
        assert_eq!(parts, expected);
    }

    /// The same for the item counts, each thread adding to one kind per wave and
    /// another kind once: every kind sums its own adds, leased and shared parts
    /// together, and none leaks into another.
    #[test]
    fn item_counts_lose_no_add_and_keep_their_kinds_apart() {
        let kinds = [
            Item::Queued,
            Item::Started,
            Item::Completed,
            Item::Panicked,
            Item::Cancelled,
            Item::Repatriated,
            Item::MaxActiveWaits,
        ];
        let counters = Arc::new(ItemCounters::default());
        let mut expected = [0u64; ITEM_KINDS];
        for wave in 0..3usize {
            let threads: Vec<_> = (0..2 * SHARDS)
                .map(|t| {
                    let counters = Arc::clone(&counters);
                    let (kind, other) = (kinds[(t + wave) % ITEM_KINDS], kinds[wave]);
                    std::thread::spawn(move || {
                        for _ in 0..100 + t {
                            counters.inc(kind);
                        }
                        counters.add(other, 7);
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            for t in 0..2 * SHARDS {
                expected[(t + wave) % ITEM_KINDS] += 100 + t as u64;
                expected[wave] += 7;
            }
        }
        for kind in kinds {
            assert_eq!(counters.get(kind), expected[kind as usize], "{kind:?}");
        }
        let totals = counters.snapshot();
        assert_eq!(
            [totals.queued, totals.max_active_waits],
            [expected[0], expected[6]]
        );
    }
}
