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
//! counts, read by snapshots: `LockCounters`. AS atomic, written (a load and a store)
//! only by the thread holding the lease on that shard of a `ShardedCounter` or of
//! `ItemCounters`, read by snapshots. R guarded by `PoolCounters::workers` (a std
//! mutex). A snapshot taken while items run is not a consistent cut (e.g.
//! `started` may exceed `queued` read a moment earlier); readers derive rates from
//! successive snapshots.
//!
//! What a worker records for the items of its own pool (starts, completions, locality,
//! latencies, dequeue lock acquisitions) goes to its own `WorkerCounters`: shared
//! counters would cost a locked add per event on a cache line every worker writes. A
//! snapshot sums the live workers' counters with the pool's shared ones, into which an
//! exiting worker folds its own. Other recorders (rescuers, a worker running a handed-off
//! item of another pool) use the shared atomics.
//!
//! One mechanism per file: `counters.rs` (the counters and the sets of them a worker,
//! a pool and a workqueue keep), `histogram.rs` (the latency histograms), `sample.rs`
//! (which items' latency and which lock waits are measured), `clock.rs` (the clock
//! item latency is measured by), `snapshot.rs` (the serialisable snapshots).

#[cfg(feature = "stats")]
mod clock;
mod counters;
mod histogram;
mod sample;
mod snapshot;

#[cfg(feature = "stats")]
pub(crate) use clock::{elapsed_since, init as init_clock, now_ns};
pub(crate) use counters::{
    Item, ItemCounters, OwnedCounter, PoolCounters, Recorder, WorkerCounters,
};
use histogram::Histogram;
#[cfg(feature = "stats")]
pub(crate) use sample::{sample_lock_wait, sample_stamp, Sample, Stamp, WEIGHT_BITS};
pub use snapshot::{all, Latency, Locality, LockStats, PoolStats, Totals, WorkqueueStats};
