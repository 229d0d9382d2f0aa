//! `memory`: bytes per queued item. The queue's workers are held back (podq:
//! `max_active(1)` behind one blocker; the fixed-size peers: a blocker on every
//! worker), then one thread queues `items` tiny items and the process's counting
//! allocator tells what the queueing added. Two modes, as in `throughput`:
//!
//! - `spawn`: one-shot closures capturing 8 bytes (their sequence number), handles
//!   dropped; what a queued item costs beyond those 8 bytes is the executor's.
//! - `work`: `items` prepared items, allocated first and counted apart, then each
//!   queued once: what queueing a prepared item adds (podq's `Work` embeds its queue
//!   link, so ideally nothing).
//!
//! Then the gate opens, every item runs, and what stays allocated is reported as
//! retained (capacity the queue keeps, counted about 50 ms after the last run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::throughput::{tally, Mode};
use super::{empty_sample, Sample};
use crate::bench::counting_alloc::Counter;
use crate::bench::system::{Item, QueueConfig, System};

/// Items queued per run when `--items` is not given.
pub const DEFAULT_ITEMS: u64 = 1_000_000;

/// How long frees on the workers get to land after the last run.
const SETTLE: Duration = Duration::from_millis(50);

/// Parameters of the `memory` test.
#[derive(Clone, Debug)]
pub struct MemoryParams {
    /// Items queued per run.
    pub items: u64,
    /// `spawn` or `work`.
    pub mode: Mode,
}

/// What one run measured (averaged over rounds when merged).
#[derive(Clone, Debug, Serialize)]
pub struct MemoryDetail {
    /// `spawn` or `work`.
    pub mode: Mode,
    /// Items queued while the workers were held back, summed over rounds.
    pub queued: u64,
    /// What the item itself captures: 8 bytes (`spawn`), 0 (`work`: the prepared
    /// item is counted in `prepared_bytes_per_item`).
    pub closure_bytes: u64,
    /// Live bytes the queueing calls added, per item.
    pub bytes_per_item: f64,
    /// `bytes_per_item - closure_bytes`: the executor's share.
    pub beyond_closure: f64,
    /// Allocations the queueing calls made, per item.
    pub allocs_per_item: f64,
    /// `work`: live bytes of one prepared item, before it is queued.
    pub prepared_bytes_per_item: Option<f64>,
    /// Live bytes still allocated once every item ran (prepared items and the queue
    /// itself still alive), relative to before the first item was made.
    pub retained_bytes: f64,
}

impl MemoryDetail {
    /// Folds in another run: per-item figures averaged by items queued.
    pub fn merge(&mut self, other: &MemoryDetail) {
        let (wa, wb) = (self.queued as f64, other.queued as f64);
        let avg = |a: f64, b: f64| (a * wa + b * wb) / (wa + wb);
        self.queued += other.queued;
        self.bytes_per_item = avg(self.bytes_per_item, other.bytes_per_item);
        self.beyond_closure = avg(self.beyond_closure, other.beyond_closure);
        self.allocs_per_item = avg(self.allocs_per_item, other.allocs_per_item);
        self.prepared_bytes_per_item = self
            .prepared_bytes_per_item
            .zip(other.prepared_bytes_per_item)
            .map(|(a, b)| avg(a, b));
        self.retained_bytes = avg(self.retained_bytes, other.retained_bytes);
    }
}

/// Runs the test once.
pub fn run(system: &dyn System, config: QueueConfig, params: &MemoryParams) -> Result<Sample> {
    let (queue, gate) = system.new_held_queue("bench_memory", config)?;
    let n = params.items;
    let base = tally::total();
    let counter = Counter::start();
    let start_reading = counter.read();
    let mut prepared_bytes = None;
    let mut works: Vec<Box<dyn Item>> = Vec::new();
    if params.mode == Mode::Work {
        works.reserve_exact(n as usize);
        let reserved = counter.read();
        works.extend((0..n).map(|_| queue.prepare(Arc::new(tally::bump))));
        prepared_bytes = Some(counter.read().since(reserved).live as f64 / n as f64);
    }
    let before = counter.read();
    let started = Instant::now();
    match params.mode {
        Mode::Spawn => (0..n).for_each(|seq| queue.spawn_tiny(seq)),
        Mode::Execute => (0..n).for_each(|seq| queue.execute_tiny(seq)),
        Mode::Work => {
            for work in &works {
                work.submit();
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let queued = counter.read().since(before);
    gate.open();
    tally::wait_for(base + n);
    std::thread::sleep(SETTLE);
    let retained = counter.read().since(start_reading).live;
    drop(counter);
    let closure_bytes = match params.mode {
        Mode::Spawn | Mode::Execute => 8,
        Mode::Work => 0,
    };
    let bytes_per_item = queued.live as f64 / n as f64;
    let mut sample = empty_sample();
    sample.items = n;
    sample.seconds = seconds;
    sample.memory = Some(MemoryDetail {
        mode: params.mode,
        queued: n,
        closure_bytes,
        bytes_per_item,
        beyond_closure: bytes_per_item - closure_bytes as f64,
        allocs_per_item: queued.allocs as f64 / n as f64,
        prepared_bytes_per_item: prepared_bytes,
        retained_bytes: retained as f64,
    });
    drop(works);
    Ok(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(queued: u64, bytes: f64, prepared: Option<f64>) -> MemoryDetail {
        MemoryDetail {
            mode: Mode::Work,
            queued,
            closure_bytes: 0,
            bytes_per_item: bytes,
            beyond_closure: bytes,
            allocs_per_item: 1.0,
            prepared_bytes_per_item: prepared,
            retained_bytes: 100.0,
        }
    }

    #[test]
    fn merging_averages_the_rounds_by_items() {
        let mut a = detail(10, 10.0, Some(40.0));
        a.merge(&detail(10, 40.0, Some(70.0)));
        a.merge(&detail(20, 100.0, Some(100.0)));
        assert_eq!(a.queued, 40);
        // (10*10 + 10*40 + 20*100) / 40 and (10*40 + 10*70 + 20*100) / 40.
        assert_eq!(a.bytes_per_item, 62.5);
        assert_eq!(a.prepared_bytes_per_item, Some(77.5));
        assert_eq!(a.retained_bytes, 100.0);
    }
}
