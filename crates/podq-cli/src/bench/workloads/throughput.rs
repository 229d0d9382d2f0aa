//! `throughput`: open loop. One producer pinned to each usable CPU (or `--producers`),
//! released together, submits its items as fast as it can without waiting for any of
//! them; the run lasts until the last item ran. Two modes:
//!
//! - `spawn`: a one-shot tiny closure per item through each system's spawn-like API,
//!   the handle (if any) dropped at once;
//! - `work`: each producer cycles through `works` prepared items and makes `items`
//!   submit calls. podq coalesces a queue call on a still-pending `Work` (it returns
//!   false: the run it asks for is the pending one), so calls, accepted calls and runs
//!   are counted apart, and the result's rate is calls handled per second (each call
//!   either queued a run or joined a pending one); peers accept every call. (Making
//!   producers spin until `items` calls are accepted instead measures the scheduler:
//!   spinning producers hold both CPUs and workers run one batch per time slice.)
//!
//! A tiny item bumps a counter owned by the thread that runs it (a load and a store on
//! that thread's own cache line), so the items themselves share nothing: what is
//! measured is the executor's hand-off.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::{empty_sample, Sample};
use crate::bench::system::placement::CpuMap;
use crate::bench::system::{Item, Queue, QueueConfig, System};

/// Items each producer submits (and waits for) before the clock starts, so workers
/// exist and queues have their capacity.
const WARMUP_ITEMS: u64 = 2_000;

/// How often the driver looks whether every item ran. The run's end is known to
/// within this much (plus the sleep's overshoot): under 1% of a run of 0.1 s or more.
const POLL: Duration = Duration::from_micros(200);

/// Items per producer when `--items` is not given.
pub const DEFAULT_ITEMS: u64 = 500_000;

/// Items per producer in the `work` mode when `--works` is not given.
pub const DEFAULT_WORKS: usize = 64;

/// What a producer submits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One-shot closures, handles dropped.
    Spawn,
    /// Re-queued prepared items.
    Work,
}

/// Parameters of the `throughput` test.
#[derive(Clone, Debug)]
pub struct ThroughputParams {
    /// Producer count; `None`: one per usable CPU of the topology.
    pub producers: Option<usize>,
    /// Submit calls per producer per run.
    pub items: u64,
    /// The mode.
    pub mode: Mode,
    /// `work` mode: prepared items each producer cycles through.
    pub works: usize,
    /// `work` mode: CPU time each item spends.
    pub work: Duration,
}

impl ThroughputParams {
    /// The virtual CPU of each producer, as in `queue`.
    pub fn producer_cpus(&self, map: &CpuMap) -> Vec<usize> {
        let vcpus = map.vcpus();
        let n = self.producers.unwrap_or(vcpus.len());
        vcpus.iter().copied().cycle().take(n).collect()
    }
}

/// The `throughput` results beyond items/s.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ThroughputDetail {
    /// `spawn` or `work`.
    pub mode: Mode,
    /// Submit calls made.
    pub calls: u64,
    /// Calls that queued a run (`spawn` and peers: all).
    pub accepted: u64,
    /// Runs of the item function (equals `accepted`).
    pub runs: u64,
    /// Time until the last producer made its last call, seconds (summed over rounds).
    pub submit_seconds: f64,
    /// `calls / submit_seconds`.
    pub calls_per_sec: f64,
    /// `accepted / seconds`: accepted calls over the whole run.
    pub accepted_per_sec: f64,
}

impl ThroughputDetail {
    /// Folds in another run; `seconds` are the two runs' whole durations.
    pub fn merge(&mut self, other: ThroughputDetail, seconds: f64, other_seconds: f64) {
        self.calls += other.calls;
        self.accepted += other.accepted;
        self.runs += other.runs;
        self.submit_seconds += other.submit_seconds;
        self.calls_per_sec = rate(self.calls, self.submit_seconds);
        self.accepted_per_sec = rate(self.accepted, seconds + other_seconds);
    }
}

fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// Counts item runs per running thread, summed on demand.
pub mod tally {
    use super::*;

    /// One thread's count, alone on its cache line.
    #[repr(align(128))]
    struct Slot(AtomicU64);

    /// Every slot ever registered; slots of exited threads keep their final count.
    static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

    thread_local! {
        static MINE: Cell<Option<&'static Slot>> = const { Cell::new(None) };
    }

    /// Counts one run on the calling thread.
    #[inline]
    pub fn bump() {
        let slot = MINE.with(|m| {
            m.get().unwrap_or_else(|| {
                // Once per thread: a slot that lives as long as the process.
                let slot: &'static Slot = Box::leak(Box::new(Slot(AtomicU64::new(0))));
                SLOTS.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
                m.set(Some(slot));
                slot
            })
        });
        // Only this thread writes its slot: a load and a store, no locked instruction.
        slot.0.store(slot.0.load(Relaxed) + 1, Relaxed);
    }

    /// Runs counted so far on every thread.
    pub fn total() -> u64 {
        let slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        slots.iter().map(|s| s.0.load(Relaxed)).sum()
    }

    /// Waits until `total()` reaches `target`.
    pub fn wait_for(target: u64) {
        while total() < target {
            std::thread::sleep(POLL);
        }
    }
}

/// The tiny one-shot item of the `spawn` mode. It captures its sequence number, so a
/// system that boxes closures allocates for it as for any real item.
#[inline]
pub fn tiny(seq: u64) {
    std::hint::black_box(seq);
    tally::bump();
}

/// Runs the test once.
pub fn run(
    system: &dyn System,
    config: QueueConfig,
    map: &CpuMap,
    params: &ThroughputParams,
) -> Result<Sample> {
    let queue = system.new_queue("bench_throughput", config)?;
    let cpus = params.producer_cpus(map);
    let producers = cpus.len() as u64;
    // Released twice: after the warm-up (the driver then waits for its runs), and to
    // start the measured phase.
    let warmed = Barrier::new(cpus.len() + 1);
    let go = Barrier::new(cpus.len() + 1);
    let base = tally::total();
    let (outcomes, seconds, submit_seconds, locks_before) = std::thread::scope(|s| {
        let handles: Vec<_> = cpus
            .iter()
            .map(|&vcpu| {
                let (queue, warmed, go) = (&*queue, &warmed, &go);
                s.spawn(move || producer(system, queue, map, vcpu, params, warmed, go))
            })
            .collect();
        warmed.wait();
        tally::wait_for(base + WARMUP_ITEMS * producers);
        let before = tally::total();
        let locks_before = queue.lock_counts();
        go.wait();
        let start = Instant::now();
        let outcomes: Vec<Result<(u64, u64, Duration)>> = handles
            .into_iter()
            .map(|h| h.join().expect("producer threads do not panic"))
            .collect();
        let accepted: u64 = outcomes.iter().flatten().map(|o| o.1).sum();
        let submit_seconds = outcomes
            .iter()
            .flatten()
            .map(|o| o.2.as_secs_f64())
            .fold(0.0, f64::max);
        if outcomes.iter().all(Result::is_ok) {
            tally::wait_for(before + accepted);
        }
        let seconds = start.elapsed().as_secs_f64();
        (outcomes, seconds, submit_seconds, locks_before)
    });
    let mut calls = 0;
    let mut accepted = 0;
    for outcome in outcomes {
        let (c, a, _) = outcome?;
        calls += c;
        accepted += a;
    }
    let mut sample = empty_sample();
    sample.seconds = seconds;
    // Items handled: runs for spawn; calls for work (coalesced calls are handled by
    // the pending run they joined).
    sample.items = match params.mode {
        Mode::Spawn => accepted,
        Mode::Work => calls,
    };
    sample.throughput = Some(ThroughputDetail {
        mode: params.mode,
        calls,
        accepted,
        runs: accepted,
        submit_seconds,
        calls_per_sec: rate(calls, submit_seconds),
        accepted_per_sec: rate(accepted, seconds),
    });
    sample.pool_locks = queue
        .lock_counts()
        .zip(locks_before)
        .map(|(after, before)| after.since(&before));
    Ok(sample)
}

/// One producer: warm-up, then the measured calls. Returns calls, accepted calls and
/// the time from the start to its last call.
fn producer(
    system: &dyn System,
    queue: &dyn Queue,
    map: &CpuMap,
    vcpu: usize,
    params: &ThroughputParams,
    warmed: &Barrier,
    go: &Barrier,
) -> Result<(u64, u64, Duration)> {
    let pinned = map.pin_current(vcpu);
    let works: Vec<Box<dyn Item>> = match params.mode {
        Mode::Spawn => Vec::new(),
        Mode::Work => (0..params.works.max(1))
            .map(|_| {
                let work = params.work;
                queue.prepare(Arc::new(move || {
                    crate::bench::define::spin(work);
                    tally::bump();
                }))
            })
            .collect(),
    };
    if pinned.is_ok() {
        system.enter_cpu(vcpu);
    }
    // Even unpinned (the run then fails), since the driver waits for these runs. The
    // warm-up goes through spawn in both modes: it must run exactly WARMUP_ITEMS items,
    // which coalescing would not.
    for seq in 0..WARMUP_ITEMS {
        queue.spawn_tiny(seq);
    }
    // Always reach both barriers, or the others would wait forever.
    warmed.wait();
    go.wait();
    pinned?;
    let start = Instant::now();
    let mut accepted = 0;
    match params.mode {
        Mode::Spawn => {
            for seq in 0..params.items {
                queue.spawn_tiny(seq);
            }
            accepted = params.items;
        }
        Mode::Work => {
            for (_, work) in (0..params.items).zip(works.iter().cycle()) {
                accepted += u64::from(work.submit());
            }
        }
    }
    Ok((params.items, accepted, start.elapsed()))
}
