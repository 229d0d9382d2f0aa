//! A small slab allocator model: what made `__slab_free` the top lock in the NFS
//! experiments (reference/nfs-experiments.md E1f/E1h).
//!
//! Each CPU has a small cache of free objects; each NUMA node has a partial list behind
//! one lock. Allocation takes from the CPU cache and refills half of it from the node
//! list when empty. A local free goes back to the CPU cache; a *remote* free (the
//! object was allocated elsewhere) or an overflowing cache takes the node lock, as
//! `__slab_free` does. The node lock is timed with try-lock-then-lock, so contention
//! is counted the way podq counts its pool locks.
//!
//! Field rules: I = set at init; A = atomic, Relaxed (statistics only, read after the
//! threads that update them were joined or at sampling points where staleness is fine);
//! C = guarded by the CPU cache mutex; N = guarded by the node list mutex.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use anyhow::{bail, Result};
use podq_topology::Topology;
use serde::Serialize;

use super::system::LockCounts;
use super::usage;

/// When a free takes the node lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RemoteRule {
    /// Freed on another CPU than the one it was allocated on (SLUB's common case:
    /// the object's slab is not the freeing CPU's active slab).
    Cpu,
    /// Freed on another NUMA node.
    Node,
}

/// Knobs of the model.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AllocConfig {
    /// Bytes written into an object when it is allocated.
    pub object_size: usize,
    /// Objects a CPU cache holds.
    pub cache_size: usize,
    /// Which frees are remote.
    pub remote: RemoteRule,
}

/// Checks `--object-size` and `--alloc-cache`, for `podq bench` and `podq sim` alike.
pub fn check_options(object_size: usize, cache_size: usize) -> Result<()> {
    if !(1..=MAX_OBJECT_SIZE).contains(&object_size) {
        return Err(usage(format!(
            "--object-size {object_size} is out of range 1..={MAX_OBJECT_SIZE} bytes"
        )));
    }
    if cache_size < MIN_CACHE_SIZE {
        return Err(usage(format!(
            "--alloc-cache must be at least {MIN_CACHE_SIZE} objects"
        )));
    }
    Ok(())
}

/// The largest object the model writes: a page.
const MAX_OBJECT_SIZE: usize = 4096;

/// A CPU cache refills and flushes in halves, so it holds at least two objects.
const MIN_CACHE_SIZE: usize = 2;

/// Counters, as sampled by [`AllocModel::counts`]: the allocator's own counts (the
/// simulator's type, whose slab model is this one on a virtual clock) and the node
/// list locks'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocCounts {
    /// Allocations and frees by path (fields of their own in the JSON).
    #[serde(flatten)]
    pub ops: podq_sim::AllocCounts,
    /// The node list locks.
    pub node_lock: LockCounts,
}

impl AllocCounts {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &AllocCounts) {
        self.ops.add(&other.ops);
        self.node_lock.add(&other.node_lock);
    }

    /// `self - earlier`.
    pub fn since(&self, earlier: &AllocCounts) -> AllocCounts {
        AllocCounts {
            ops: self.ops.since(&earlier.ops),
            node_lock: self.node_lock.since(&earlier.node_lock),
        }
    }
}

/// An allocated object; give it back with [`AllocModel::free`].
#[derive(Debug)]
#[must_use = "an object must be freed"]
pub struct Object(u32);

/// A mutex whose acquisitions are counted and whose waits are timed.
struct TimedMutex<T> {
    inner: Mutex<T>,
    /// A: acquisitions.
    acquisitions: AtomicU64,
    /// A: acquisitions that found the lock held.
    contended: AtomicU64,
    /// A: nanoseconds spent waiting.
    wait_ns: AtomicU64,
}

impl<T> TimedMutex<T> {
    fn new(value: T) -> Self {
        TimedMutex {
            inner: Mutex::new(value),
            acquisitions: AtomicU64::new(0),
            contended: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
        match self.inner.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => {
                let start = Instant::now();
                let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                self.contended.fetch_add(1, Ordering::Relaxed);
                self.wait_ns
                    .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                guard
            }
            // The lists stay consistent whatever panicked while holding the lock: each
            // push or pop is a single Vec operation.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        }
    }

    fn counts(&self) -> LockCounts {
        LockCounts {
            acquisitions: self.acquisitions.load(Ordering::Relaxed),
            contended: self.contended.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
        }
    }
}

/// The allocator model.
pub struct AllocModel {
    /// I.
    config: AllocConfig,
    /// I: index into `nodes` of each virtual CPU.
    node_of_cpu: Vec<usize>,
    /// C: free objects cached per CPU.
    caches: Vec<Mutex<Vec<u32>>>,
    /// N: free objects per node.
    nodes: Vec<TimedMutex<Vec<u32>>>,
    /// A: CPU each object was last allocated on.
    home_cpu: Vec<AtomicU32>,
    /// A: object payloads, `words_per_object` words each.
    payload: Vec<AtomicU64>,
    /// I.
    words_per_object: usize,
    /// A: see [`AllocCounts`].
    fast_allocs: AtomicU64,
    slow_allocs: AtomicU64,
    fast_frees: AtomicU64,
    remote_frees: AtomicU64,
    overflow_frees: AtomicU64,
}

impl AllocModel {
    /// A model over `topology`'s CPUs and nodes with `capacity` objects, spread evenly
    /// over the node lists. `capacity` must cover the objects in flight plus what the
    /// CPU caches can hold, or allocation waits for frees.
    pub fn new(topology: &Topology, config: AllocConfig, capacity: usize) -> Result<AllocModel> {
        check_options(config.object_size, config.cache_size)?;
        let Ok(capacity_u32) = u32::try_from(capacity) else {
            bail!("allocator capacity {capacity} is too large");
        };
        let node_ids = topology.nodes();
        let size = topology.usable().last().map_or(0, |c| c + 1);
        let node_of_cpu = (0..size)
            .map(|c| {
                topology
                    .node_of(c)
                    .and_then(|n| node_ids.iter().position(|&x| x == n))
                    .unwrap_or(0)
            })
            .collect();
        let mut lists = vec![Vec::new(); node_ids.len()];
        for id in 0..capacity_u32 {
            lists[id as usize % node_ids.len()].push(id);
        }
        let words_per_object = config.object_size.div_ceil(8);
        Ok(AllocModel {
            config,
            node_of_cpu,
            caches: (0..size)
                .map(|_| Mutex::new(Vec::with_capacity(config.cache_size)))
                .collect(),
            nodes: lists.into_iter().map(TimedMutex::new).collect(),
            home_cpu: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            payload: (0..capacity * words_per_object)
                .map(|_| AtomicU64::new(0))
                .collect(),
            words_per_object,
            fast_allocs: AtomicU64::new(0),
            slow_allocs: AtomicU64::new(0),
            fast_frees: AtomicU64::new(0),
            remote_frees: AtomicU64::new(0),
            overflow_frees: AtomicU64::new(0),
        })
    }

    /// Allocates an object on virtual CPU `cpu` and writes its payload there.
    pub fn alloc(&self, cpu: usize) -> Object {
        let cache = &self.caches[cpu];
        let cached = cache.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let id = match cached {
            Some(id) => {
                self.fast_allocs.fetch_add(1, Ordering::Relaxed);
                id
            }
            None => {
                self.slow_allocs.fetch_add(1, Ordering::Relaxed);
                self.refill(cpu)
            }
        };
        self.home_cpu[id as usize].store(cpu as u32, Ordering::Relaxed);
        let start = id as usize * self.words_per_object;
        for (i, word) in self.payload[start..start + self.words_per_object]
            .iter()
            .enumerate()
        {
            word.store((cpu + i) as u64, Ordering::Relaxed);
        }
        Object(id)
    }

    /// Takes a batch from the CPU's node list (other nodes' when it is empty), keeps
    /// one object and caches the rest.
    fn refill(&self, cpu: usize) -> u32 {
        let home = self.node_of_cpu[cpu];
        let batch = self.config.cache_size / 2;
        loop {
            for offset in 0..self.nodes.len() {
                let node = (home + offset) % self.nodes.len();
                let mut list = self.nodes[node].lock();
                if let Some(id) = list.pop() {
                    let take = batch.saturating_sub(1).min(list.len());
                    let at = list.len() - take;
                    let moved: Vec<u32> = list.drain(at..).collect();
                    drop(list);
                    let mut cache = self.caches[cpu].lock().unwrap_or_else(|p| p.into_inner());
                    cache.extend(moved);
                    return id;
                }
            }
            // Every object is in flight or in another CPU's cache: wait for frees.
            std::thread::yield_now();
        }
    }

    /// Frees `object` on virtual CPU `cpu`.
    pub fn free(&self, object: Object, cpu: usize) {
        let id = object.0;
        let home = self.home_cpu[id as usize].load(Ordering::Relaxed) as usize;
        let remote = match self.config.remote {
            RemoteRule::Cpu => home != cpu,
            RemoteRule::Node => self.node_of_cpu[home] != self.node_of_cpu[cpu],
        };
        if remote {
            self.remote_frees.fetch_add(1, Ordering::Relaxed);
            self.nodes[self.node_of_cpu[home]].lock().push(id);
            return;
        }
        let mut cache = self.caches[cpu].lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() < self.config.cache_size {
            cache.push(id);
            self.fast_frees.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Overflow: give half the cache back to the node, as a slab flush does.
        let keep = self.config.cache_size / 2;
        let mut spill: Vec<u32> = cache.drain(keep..).collect();
        drop(cache);
        spill.push(id);
        self.overflow_frees.fetch_add(1, Ordering::Relaxed);
        self.nodes[self.node_of_cpu[cpu]].lock().extend(spill);
    }

    /// Current counters.
    pub fn counts(&self) -> AllocCounts {
        let mut node_lock = LockCounts::default();
        for node in &self.nodes {
            let c = node.counts();
            node_lock.acquisitions += c.acquisitions;
            node_lock.contended += c.contended;
            node_lock.wait_ns += c.wait_ns;
        }
        AllocCounts {
            ops: podq_sim::AllocCounts {
                fast_allocs: self.fast_allocs.load(Ordering::Relaxed),
                slow_allocs: self.slow_allocs.load(Ordering::Relaxed),
                fast_frees: self.fast_frees.load(Ordering::Relaxed),
                remote_frees: self.remote_frees.load(Ordering::Relaxed),
                overflow_frees: self.overflow_frees.load(Ordering::Relaxed),
            },
            node_lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(remote: RemoteRule) -> AllocModel {
        let t = podq_topology::Topology::synthetic("2s2c1t").unwrap();
        let config = AllocConfig {
            object_size: 64,
            cache_size: 4,
            remote,
        };
        AllocModel::new(&t, config, 64).unwrap()
    }

    #[test]
    fn local_frees_stay_in_the_cpu_cache() {
        let m = model(RemoteRule::Cpu);
        let a = m.alloc(0);
        let c = m.counts();
        assert_eq!((c.ops.slow_allocs, c.ops.fast_allocs), (1, 0));
        m.free(a, 0);
        let b = m.alloc(0);
        m.free(b, 0);
        let c = m.counts();
        assert_eq!(c.ops.fast_allocs, 1);
        assert_eq!(c.ops.fast_frees, 2);
        assert_eq!(c.ops.remote_frees, 0);
        // Only the one refill took a node lock.
        assert_eq!(c.node_lock.acquisitions, 1);
    }

    #[test]
    fn remote_frees_take_the_node_lock() {
        let m = model(RemoteRule::Cpu);
        for _ in 0..10 {
            let o = m.alloc(0);
            m.free(o, 1);
        }
        let c = m.counts();
        assert_eq!(c.ops.remote_frees, 10);
        assert_eq!(c.ops.fast_frees, 0);
        // 10 remote frees + refills of the CPU 0 cache (batches of 2 objects).
        assert_eq!(c.node_lock.acquisitions, 10 + c.ops.slow_allocs);
        assert_eq!(c.ops.slow_allocs + c.ops.fast_allocs, 10);
        assert!(c.ops.slow_allocs >= 5, "{c:?}");
    }

    #[test]
    fn node_rule_only_counts_cross_node_frees() {
        let m = model(RemoteRule::Node);
        // CPUs 0,1 are node 0; 2,3 node 1.
        let o = m.alloc(0);
        m.free(o, 1);
        let o = m.alloc(0);
        m.free(o, 2);
        let c = m.counts();
        assert_eq!(c.ops.remote_frees, 1);
        assert_eq!(c.ops.fast_frees, 1);
    }

    #[test]
    fn a_full_cache_overflows_to_the_node() {
        let m = model(RemoteRule::Cpu);
        let objects: Vec<Object> = (0..6).map(|_| m.alloc(0)).collect();
        for o in objects {
            m.free(o, 0);
        }
        let c = m.counts();
        assert_eq!(c.ops.fast_frees + c.ops.overflow_frees, 6);
        assert!(c.ops.overflow_frees >= 1, "{c:?}");
    }

    #[test]
    fn contention_is_counted_under_threads() {
        let m = model(RemoteRule::Cpu);
        std::thread::scope(|s| {
            for cpu in 0..4 {
                let m = &m;
                s.spawn(move || {
                    for _ in 0..2000 {
                        let o = m.alloc(cpu);
                        m.free(o, (cpu + 1) % 4);
                    }
                });
            }
        });
        let c = m.counts();
        assert_eq!(c.ops.remote_frees, 8000);
        assert_eq!(c.ops.fast_allocs + c.ops.slow_allocs, 8000);
        assert!(c.node_lock.contended <= c.node_lock.acquisitions);
    }

    #[test]
    fn bad_knobs_are_refused() {
        let t = podq_topology::Topology::synthetic("1s2c1t").unwrap();
        let mut config = AllocConfig {
            object_size: 64,
            cache_size: 1,
            remote: RemoteRule::Cpu,
        };
        assert!(AllocModel::new(&t, config, 8).is_err());
        config.cache_size = 4;
        config.object_size = 0;
        assert!(AllocModel::new(&t, config, 8).is_err());
    }
}
