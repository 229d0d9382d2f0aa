//! A pool's worklist: runnable items, FIFO for each queuer, apart from the pool lock
//! that guards the workers. While it is *open*, queuers push onto a lock-free ring and
//! workers take batches from it; whatever needs the whole list (the ring full, items
//! given back in front, the rescuer's scan) closes the ring under the worklist lock and
//! moves its items to the locked `spill` list, which then serves every call until it
//! runs dry and the ring opens again. Protocol: `pool/README.md` ("Worklist").
//!
//! Legend: K guarded by `Worklist::spill` (the worklist lock, held for a spill push, a
//! batch take from the spill or a scan, never while running anything); A atomic; I set
//! at init. Invariant at every release of the worklist lock: the ring is closed exactly
//! when the spill holds items, and a closed ring holds no item.

use crossbeam_utils::CachePadded;

use super::fifo::Fifo;
use super::ring::{Refused, Ring};
use crate::sync::{lock, AtomicUsize, Mutex, MutexGuard, Ordering::SeqCst};

/// Slots in the ring of a pool of several CPUs: 48 bytes each with the runtime's
/// entries, 12 KiB per pool.
/// A flood beyond them (the default `max_active` lets 1024 items per node be active)
/// spills and goes through the lock until the spill runs dry; 1024 slots ran the
/// floods of `podq bench throughput` no faster here.
pub(crate) const RING_SLOTS: usize = 256;

/// Spill capacity kept once the spill runs dry (48 KiB of entries): a one-CPU pool's
/// whole list in the default `max_active` share; a larger flood's list is freed.
const KEPT_SPILL: usize = 1024;

/// How the worklist is claimed: its lock taken, or a ring position claimed, plainly or
/// counting contention (`stats.rs`).
pub(crate) trait Acquire {
    /// Locks `mutex`.
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X>;

    /// When this claim's first retry began (a reading of the statistics' clock, in
    /// nanoseconds), if its wait is to be timed (with `stats`, a sample of them, as of
    /// the lock's contended acquisitions).
    fn retry_clock(&self) -> Option<u64> {
        None
    }

    /// Counts a claim of ring positions; `retried`: another thread's claim came first;
    /// `since`: the `retry_clock` reading at its first retry, if timed.
    fn claimed(&self, retried: bool, since: Option<u64>);
}

/// Takes the lock with nothing counted (the models and unit tests).
#[cfg(test)]
pub(crate) struct Plain;

#[cfg(test)]
impl Acquire for Plain {
    fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X> {
        lock(mutex)
    }

    fn claimed(&self, _retried: bool, _since: Option<u64>) {}
}

/// Runnable items of one pool. `T` is a queue entry in the runtime and a plain value
/// in the loom models.
pub(crate) struct Worklist<T> {
    /// A, I: the items while it is open (see the module docs); none in a one-CPU pool.
    ring: Option<Box<Ring<T>>>,
    /// K: the items while the ring is closed, oldest first. On a line of its own, as
    /// `len`: a flood past the ring takes this lock for every push.
    spill: CachePadded<Mutex<Fifo<T>>>,
    /// A: items waiting, ring and spill: added after an item is in, taken off after
    /// it is out, so a moment below the truth and even below 0 (read as 0).
    /// `SeqCst`: a queuer's increment and its `SeqCst` load of the pool's running and
    /// spinning counts pair with a worker's decrement of those counts and its load of
    /// this length (the Dekker pair of the sleep/wake protocol, `pool.rs`: all
    /// `SeqCst`, so at least one side sees the other; `sync::seqcst_pair_fence`). A
    /// queuer whose increment is late still makes its own look at the counts after it.
    /// On a line of its own: every push and take writes it, and beside the ring's
    /// pointer (read-only) it made a call miss on that pointer before its own claim.
    len: CachePadded<AtomicUsize>,
}

impl<T> Default for Worklist<T> {
    fn default() -> Self {
        Worklist::with_capacity(RING_SLOTS)
    }
}

impl<T> Worklist<T> {
    /// The worklist of a pool of `pod_cpus` CPUs. A one-CPU pod's queuers and workers
    /// share its CPU, so its lock is rarely contended, and a ring there would only add
    /// its slots to the caches (with many such pools, the pools' rings outgrow them:
    /// `podq bench scale` ran 6–18% slower with them): it has none, and every call
    /// takes the lock.
    pub(crate) fn for_pod(pod_cpus: usize) -> Self {
        Worklist::with_capacity(if pod_cpus > 1 { RING_SLOTS } else { 0 })
    }

    /// A worklist whose ring has `slots` slots (a power of two), or without a ring
    /// (0: the lock only).
    pub(crate) fn with_capacity(slots: usize) -> Self {
        Worklist {
            ring: (slots > 0).then(|| Box::new(Ring::new(slots))),
            spill: CachePadded::new(Mutex::new(Fifo::new())),
            len: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Appends an item.
    pub(crate) fn push(&self, item: T, how: &impl Acquire) {
        let item = if let Some(ring) = &self.ring {
            let mut since = None;
            match ring.push(item, &mut || since = how.retry_clock()) {
                Ok(retried) => {
                    how.claimed(retried, since);
                    self.len.fetch_add(1, SeqCst);
                    return;
                }
                Err(Refused::Full(item) | Refused::Closed(item)) => item,
            }
        } else {
            item
        };
        let mut spill = how.acquire(&self.spill);
        self.push_locked(item, &mut spill);
    }

    /// Appends `item` under the worklist lock: onto the ring if it is open again and
    /// has room, else onto the spill, closing the ring first.
    fn push_locked(&self, item: T, spill: &mut Fifo<T>) {
        let item = match self.ring.as_ref().filter(|r| !r.is_closed()) {
            None => item,
            // Counted as the lock's acquisition, which the caller made.
            Some(ring) => match ring.push(item, &mut || {}) {
                Ok(_) => {
                    self.len.fetch_add(1, SeqCst);
                    return;
                }
                Err(Refused::Full(item) | Refused::Closed(item)) => {
                    // The spill is empty while the ring is open: its items go first.
                    ring.close_into(spill);
                    item
                }
            },
        };
        spill.push_back(item);
        self.len.fetch_add(1, SeqCst);
    }

    /// Under the worklist lock: once the spill ran dry, gives a flood's memory back
    /// and opens the ring again.
    fn settle(&self, spill: &mut Fifo<T>) {
        if spill.is_empty() && spill.capacity() > KEPT_SPILL {
            spill.shrink_to(KEPT_SPILL);
        }
        if let Some(ring) = self
            .ring
            .as_ref()
            .filter(|r| spill.is_empty() && r.is_closed())
        {
            ring.reopen();
        }
    }

    /// Under the worklist lock: closes the ring, moving what it holds to the spill
    /// (empty while the ring is open, so the ring's items go first).
    fn close(&self, spill: &mut Fifo<T>) {
        if let Some(ring) = &self.ring {
            ring.close_into(spill);
        }
    }

    /// Appends items in order (activation's turn): runs of ring slots, one claim each,
    /// then the lock for what the ring does not take.
    pub(crate) fn push_many(&self, batch: impl ExactSizeIterator<Item = T>, how: &impl Acquire) {
        let mut batch = batch.into_iter();
        while let Some(ring) = self.ring.as_ref().filter(|_| batch.len() > 0) {
            let mut since = None;
            let (n, retried) = ring.push_run(&mut batch, &mut || since = how.retry_clock());
            if n == 0 {
                break;
            }
            how.claimed(retried, since);
            self.len.fetch_add(n, SeqCst);
        }
        let n = batch.len();
        if n > 0 {
            let mut spill = how.acquire(&self.spill);
            // The ring is full or closed (or there is none): the rest goes after what
            // it holds.
            self.close(&mut spill);
            spill.extend(batch);
            self.len.fetch_add(n, SeqCst);
        }
    }

    /// Puts `batch` back in front, in its order: items a worker took and has not
    /// started, given back when it blocks.
    pub(crate) fn push_front_all(&self, batch: &mut Fifo<T>) {
        if batch.is_empty() {
            return;
        }
        let mut spill = lock(&self.spill);
        self.close(&mut spill);
        let n = batch.len();
        while let Some(item) = batch.pop_back() {
            spill.push_front(item);
        }
        self.len.fetch_add(n, SeqCst);
    }

    /// Items waiting now.
    pub(crate) fn len(&self) -> usize {
        let len = self.len.load(SeqCst);
        if len as isize > 0 {
            len
        } else {
            0
        }
    }

    /// Moves up to `want(len)` of the oldest items into `into` (its end), the batch
    /// size decided from the length before the take (a moment behind, at most).
    /// Returns how many it moved.
    pub(crate) fn take_batch(
        &self,
        want: impl FnOnce(usize) -> usize,
        into: &mut Fifo<T>,
        how: &impl Acquire,
    ) -> usize {
        let waiting = self.len();
        if waiting == 0 {
            return 0;
        }
        let max = want(waiting).max(1);
        if let Some(ring) = &self.ring {
            // The ring first, whose `head` is the workers' line: it takes nothing
            // once the ring is closed.
            let mut since = None;
            let (n, retried) = ring.take(max, into, &mut || since = how.retry_clock());
            if n > 0 {
                how.claimed(retried, since);
                self.len.fetch_sub(n, SeqCst);
                return n;
            }
            if !ring.is_closed() {
                return 0;
            }
        }
        let mut spill = how.acquire(&self.spill);
        let n = spill.move_front_to(max, into);
        self.settle(&mut spill);
        self.len.fetch_sub(n, SeqCst);
        n
    }

    /// Takes the oldest item that `pick` accepts (the rescuer's scan).
    pub(crate) fn take_where(&self, pick: impl Fn(&T) -> bool) -> Option<T> {
        let mut spill = lock(&self.spill);
        self.close(&mut spill);
        let at = spill.iter().position(pick);
        let item = at.and_then(|at| spill.remove(at));
        self.settle(&mut spill);
        if item.is_some() {
            self.len.fetch_sub(1, SeqCst);
        }
        item
    }

    /// Applies `f` to every waiting item, oldest first.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&T)) {
        let mut spill = lock(&self.spill);
        self.close(&mut spill);
        spill.iter().for_each(&mut f);
        self.settle(&mut spill);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn batches_keep_fifo_order_and_given_back_items_go_first() {
        let list = Worklist::default();
        for i in 0..10 {
            list.push(i, &Plain);
        }
        let mut mine = Fifo::new();
        assert_eq!(list.take_batch(|len| len / 2, &mut mine, &Plain), 5);
        assert_eq!(mine, [0, 1, 2, 3, 4]);
        assert_eq!(list.len(), 5);
        mine.pop_front();
        list.push_front_all(&mut mine);
        assert!(mine.is_empty());
        assert_eq!(list.len(), 9);
        assert_eq!(list.take_where(|&i| i > 6), Some(7));
        let mut all = Fifo::new();
        assert_eq!(list.take_batch(|_| 100, &mut all, &Plain), 8);
        assert_eq!(all, [1, 2, 3, 4, 5, 6, 8, 9]);
        assert_eq!(list.take_batch(|_| 100, &mut all, &Plain), 0);
        assert_eq!(list.take_where(|_| true), None);
    }

    /// Counts lock acquisitions and ring claims.
    #[derive(Default)]
    struct Counting {
        locks: std::cell::Cell<usize>,
        claims: std::cell::Cell<usize>,
    }

    impl Acquire for Counting {
        fn acquire<'a, X>(&self, mutex: &'a Mutex<X>) -> MutexGuard<'a, X> {
            self.locks.set(self.locks.get() + 1);
            lock(mutex)
        }

        fn claimed(&self, _retried: bool, _since: Option<u64>) {
            self.claims.set(self.claims.get() + 1);
        }
    }

    #[test]
    fn a_flood_gives_its_spill_memory_back_once_taken() {
        // A one-CPU pool's list is the spill alone; a pool with a ring spills past it.
        for slots in [0, 4] {
            let list = Worklist::with_capacity(slots);
            let how = Counting::default();
            list.push_many(0..20 * KEPT_SPILL, &how);
            assert!(lock(&list.spill).capacity() >= 19 * KEPT_SPILL);
            let mut out = Fifo::new();
            while list.take_batch(|n| n.min(100), &mut out, &how) > 0 {}
            assert!(out.iter().copied().eq(0..20 * KEPT_SPILL), "{slots}");
            assert!(
                lock(&list.spill).capacity() <= KEPT_SPILL,
                "kept {} entries",
                lock(&list.spill).capacity()
            );
        }
    }

    #[test]
    fn a_full_ring_spills_in_order_and_opens_again_once_the_spill_runs_dry() {
        let list = Worklist::with_capacity(4);
        let how = Counting::default();
        for i in 0..4 {
            list.push(i, &how);
        }
        assert_eq!(
            (how.locks.get(), how.claims.get()),
            (0, 4),
            "no lock while open"
        );
        list.push_many(4..8, &how);
        assert!(list.ring.as_ref().unwrap().is_closed());
        assert_eq!(
            how.locks.get(),
            1,
            "one acquisition for the rest of the batch"
        );
        assert_eq!(list.len(), 8);
        let mut out = Fifo::new();
        assert_eq!(list.take_batch(|_| 3, &mut out, &how), 3);
        list.push(8, &how);
        assert!(
            list.ring.as_ref().unwrap().is_closed(),
            "closed until the spill runs dry"
        );
        assert_eq!(list.take_batch(|_| 100, &mut out, &how), 6);
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(!list.ring.as_ref().unwrap().is_closed());
        let locks = how.locks.get();
        list.push(9, &how);
        assert_eq!(list.take_batch(|_| 100, &mut out, &how), 1);
        assert_eq!(how.locks.get(), locks, "open again: no lock");
        assert_eq!(list.len(), 0);
    }

    #[test]
    fn a_one_cpu_pods_worklist_takes_the_lock_for_everything() {
        let list = Worklist::for_pod(1);
        let how = Counting::default();
        list.push(0, &how);
        list.push_many(1..3, &how);
        let mut out = Fifo::new();
        assert_eq!(list.take_batch(|_| 2, &mut out, &how), 2);
        list.push_front_all(&mut out);
        assert_eq!(list.take_batch(|_| 9, &mut out, &how), 3);
        assert_eq!(out, [0, 1, 2]);
        assert_eq!((how.locks.get(), how.claims.get()), (4, 0));
        assert_eq!(list.take_batch(|_| 9, &mut out, &how), 0);
    }

    #[test]
    fn a_scan_sees_the_rings_items_and_leaves_them_in_order() {
        let list = Worklist::with_capacity(8);
        for i in 0..5 {
            list.push(i, &Plain);
        }
        let mut seen = Vec::new();
        list.for_each(|&i| seen.push(i));
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        list.push(5, &Plain);
        assert_eq!(list.take_where(|&i| i == 2), Some(2));
        let mut out = Fifo::new();
        assert_eq!(list.take_batch(|_| 100, &mut out, &Plain), 5);
        assert_eq!(out, [0, 1, 3, 4, 5]);
        assert!(!list.ring.as_ref().unwrap().is_closed());
    }

    /// Queuers on every CPU against workers taking batches, the ring small enough to
    /// fill: every item comes out once, each queuer's in its order.
    #[test]
    fn concurrent_queuers_and_workers_lose_nothing_and_keep_each_queuers_order() {
        const QUEUERS: usize = 3;
        const ITEMS: usize = 20_000;
        let list = std::sync::Arc::new(Worklist::with_capacity(16));
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (list, taken) = (list.clone(), taken.clone());
                std::thread::spawn(move || {
                    let mut last = [None; QUEUERS];
                    let mut batch = Fifo::new();
                    while taken.load(SeqCst) < QUEUERS * ITEMS {
                        let n = list.take_batch(|len| len.div_ceil(2).min(8), &mut batch, &Plain);
                        if n == 0 {
                            std::thread::yield_now();
                            continue;
                        }
                        taken.fetch_add(n, SeqCst);
                        while let Some((q, i)) = batch.pop_front() {
                            let q: usize = q;
                            assert!(
                                last[q].map_or(true, |l| i > l),
                                "queuer {q}: {i} after {last:?}"
                            );
                            last[q] = Some(i);
                        }
                    }
                })
            })
            .collect();
        let queuers: Vec<_> = (0..QUEUERS)
            .map(|q| {
                let list = list.clone();
                std::thread::spawn(move || {
                    for i in 0..ITEMS {
                        if i % 1000 == 999 {
                            // A scan now and then closes the ring under the queuers.
                            list.for_each(|_| ());
                        }
                        list.push((q, i), &Plain);
                    }
                })
            })
            .collect();
        for t in queuers.into_iter().chain(workers) {
            t.join().unwrap();
        }
        assert_eq!(taken.load(SeqCst), QUEUERS * ITEMS);
        assert_eq!(list.len(), 0);
    }
}

/// Loom models of the worklist on its own: every item is taken exactly once and each
/// queuer's items stay in order, through a ring that fills (two slots for four items)
/// and through items given back in front. The worker takes twice while the queuers run,
/// then joins them and takes the rest: a worker that polled until it had every item
/// would spin beside a closer waiting for a preempted queuer's write, and loom, which
/// does not schedule fairly between two yielding threads, would never run that queuer.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    type Item = (u32, u32);

    /// Two queuers push two items each (one item by item, one as a run) while `work`
    /// runs on this thread; then the rest is taken. Returns every item in the order taken.
    fn run(slots: usize, work: impl FnOnce(&Worklist<Item>, &mut Fifo<Item>)) -> Fifo<Item> {
        let list = Arc::new(Worklist::with_capacity(slots));
        let queuers: Vec<_> = (0..2)
            .map(|q| {
                let list = list.clone();
                loom::thread::spawn(move || {
                    if q == 0 {
                        list.push((q, 0), &Plain);
                        list.push((q, 1), &Plain);
                    } else {
                        // Activation's way: one claim for a run.
                        list.push_many([(q, 0), (q, 1)].into_iter(), &Plain);
                    }
                })
            })
            .collect();
        let mut taken = Fifo::new();
        work(&list, &mut taken);
        for q in queuers {
            q.join().unwrap();
        }
        while list.take_batch(|len| len, &mut taken, &Plain) > 0 {}
        assert_eq!(list.len(), 0);
        taken
    }

    fn check(taken: &Fifo<Item>) {
        assert_eq!(taken.len(), 4, "{taken:?}");
        for q in 0..2 {
            let seq: Vec<u32> = taken.iter().filter(|e| e.0 == q).map(|e| e.1).collect();
            assert_eq!(seq, [0, 1], "{taken:?}");
        }
    }

    /// Explores [`run`] on a ring of `slots` and checks every item is taken once, each
    /// queuer's in order.
    fn model(
        slots: usize,
        work: impl Fn(&Worklist<Item>, &mut Fifo<Item>) + Send + Sync + 'static,
    ) {
        loom::model(move || check(&run(slots, &work)));
    }

    #[test]
    fn loom_batches_take_every_item_once_in_order() {
        model(2, |list, taken| {
            for _ in 0..2 {
                list.take_batch(|len| len.div_ceil(2), taken, &Plain);
            }
        });
    }

    /// A one-CPU pod's worklist: no ring, the lock for everything.
    #[test]
    fn loom_a_lock_only_worklist_takes_every_item_once_in_order() {
        model(0, |list, taken| {
            list.take_batch(|len| len.div_ceil(2), taken, &Plain);
        });
    }

    #[test]
    fn loom_items_given_back_go_first_and_none_is_lost() {
        model(4, |list, taken| {
            let mut batch = Fifo::new();
            list.take_batch(|len| len, &mut batch, &Plain);
            list.push_front_all(&mut batch);
            list.take_batch(|len| len.div_ceil(2), taken, &Plain);
        });
    }
}
