//! `throughput`: open loop. One producer pinned to each usable CPU (or `--producers`),
//! released together, submits as fast as it can without waiting for any item. Two
//! modes:
//!
//! - `spawn`: each producer submits `items` one-shot tiny closures through each
//!   system's spawn-like API, the handle (if any) dropped at once; the run lasts until
//!   the last one ran.
//! - `work`: each producer cycles through `works` prepared items, re-queueing them,
//!   until the driver has counted `items` runs per producer; then the producers stop
//!   and the run lasts until every accepted call ran. A call on an item whose previous
//!   call has not started running yet is coalesced with it (it returns false), so the
//!   items in flight never exceed `works` per producer, and runs, accepted calls and
//!   calls are counted apart. podq does this itself (a `Work`'s PENDING bit); for the
//!   peers, which accept every call, the benchmark adds the same rule around their
//!   submit, as a user of a channel pool would write it: a flag per item, set by the
//!   call that queues it (`swap`), cleared by the worker just before the item runs.
//!   The comparison is then between executors that do the same thing per run. A
//!   producer whose whole pass over its items was coalesced yields its CPU
//!   (`sched_yield`): spinning on, it would only keep the workers that share its CPU
//!   from running, and the figure would be the scheduler's time slice.
//!
//! With `--flush`, podq's runs end as a program that floods a workqueue ends its
//! flood: the driver calls `Workqueue::flush` once the producers are done, and the run
//! lasts until it returns. The peers have no such call; their runs end as without it,
//! when their count of runs is complete.
//!
//! A tiny item bumps a counter owned by the thread that runs it (a load and a store on
//! that thread's own cache line), so the items themselves share nothing: what is
//! measured is the executor's hand-off.

use std::cell::Cell;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Relaxed},
};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::{empty_sample, Sample};
use crate::bench::system::placement::{self, CpuMap};
use crate::bench::system::{Item, Queue, QueueConfig, System};
use crate::procinfo::Switches;

/// Items each producer submits (and waits for) before the clock starts, so workers
/// exist and queues have their capacity.
const WARMUP_ITEMS: u64 = 2_000;

/// How often the driver looks whether every item ran. The run's end is known to
/// within this much (plus the sleep's overshoot): under 1% of a run of 0.1 s or more.
const POLL: Duration = Duration::from_micros(200);

/// Items per producer when `--items` is not given: spawns in `spawn`, runs in `work`.
pub const DEFAULT_ITEMS: u64 = 500_000;

/// Items per producer in the `work` mode when `--works` is not given.
pub const DEFAULT_WORKS: usize = 64;

/// What a producer submits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One-shot closures, handles dropped.
    Spawn,
    /// One-shot closures with no handle at all (podq's `execute`; the peers' spawn,
    /// which has none).
    Execute,
    /// Re-queued prepared items.
    Work,
}

/// Parameters of the `throughput` test.
#[derive(Clone, Debug)]
pub struct ThroughputParams {
    /// Producer count; `None`: one per usable CPU of the topology.
    pub producers: Option<usize>,
    /// `spawn`: spawns per producer per run; `work`: runs per producer after which the
    /// producers stop.
    pub items: u64,
    /// The mode.
    pub mode: Mode,
    /// `work` mode: prepared items each producer cycles through.
    pub works: usize,
    /// `work` mode: CPU time each item spends.
    pub work: Duration,
    /// Pin producer *i* to the *i*-th real CPU (round robin) whatever its virtual CPU,
    /// so that a topology with fewer virtual than real CPUs still uses them all.
    pub spread_real: bool,
    /// End each run with the system's flush, where it has one (`--flush`).
    pub flush: bool,
}

impl ThroughputParams {
    /// The virtual CPU of each producer, as in `queue`.
    pub fn producer_cpus(&self, map: &CpuMap) -> Vec<usize> {
        let vcpus = map.vcpus();
        let n = self.producers.unwrap_or(vcpus.len());
        vcpus.iter().copied().cycle().take(n).collect()
    }

    /// Each producer's virtual CPU and the real CPU it is pinned to.
    fn producer_pins(&self, map: &CpuMap) -> Vec<(usize, usize)> {
        let real = map.real_cpus();
        self.producer_cpus(map)
            .into_iter()
            .enumerate()
            .map(|(i, vcpu)| {
                let cpu = if self.spread_real {
                    real[i % real.len()]
                } else {
                    map.real_of(vcpu)
                };
                (vcpu, cpu)
            })
            .collect()
    }
}

/// The `throughput` results beyond items/s.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputDetail {
    /// `spawn` or `work`.
    pub mode: Mode,
    /// Submit calls made.
    pub calls: u64,
    /// Calls that queued a run (`spawn` and peers: all).
    pub accepted: u64,
    /// Runs of the item function, counted by the items (equals `accepted`: the run
    /// ends once every accepted call ran).
    pub runs: u64,
    /// Time until the last producer made its last call, seconds (summed over rounds).
    pub submit_seconds: f64,
    /// `calls / submit_seconds`.
    pub calls_per_sec: f64,
    /// `accepted / seconds`: accepted calls over the whole run.
    pub accepted_per_sec: f64,
    /// Context switches of the process's threads from the start to the last run
    /// (summed over rounds), the driver thread's own left out (it polls for the end):
    /// how often producers and workers traded their CPUs.
    pub context_switches: u64,
    /// `scale` only: the topology this result ran on and its `cpu`-scope pods.
    pub pods: Option<ScalePods>,
    /// The run ended with the system's flush (`--flush` on podq), not with the driver
    /// counting the runs.
    pub flushed: bool,
}

/// The fake topology of one `scale` result.
#[derive(Clone, Debug, Serialize)]
pub struct ScalePods {
    /// `fake:SHAPE`.
    pub topology: String,
    /// Pods of the `cpu` scope (one per virtual CPU).
    pub pods: usize,
}

impl ThroughputDetail {
    /// Folds in another run; `seconds` are the two runs' whole durations.
    pub fn merge(&mut self, other: ThroughputDetail, seconds: f64, other_seconds: f64) {
        self.calls += other.calls;
        self.accepted += other.accepted;
        self.runs += other.runs;
        self.submit_seconds += other.submit_seconds;
        self.context_switches += other.context_switches;
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

/// One shape of the `scale` workload: open-loop spawn with one producer per virtual
/// CPU (at least one per real CPU, pinned round robin) of a fake topology whose `cpu`
/// scope has one pod per CPU.
#[derive(Debug)]
pub struct ScaleParams {
    /// The test, with spawns per producer such that every shape runs the same total.
    pub throughput: ThroughputParams,
    /// `fake:SHAPE`.
    pub spec: String,
    /// The fake topology's CPUs mapped onto the real ones.
    pub map: CpuMap,
}

impl ScaleParams {
    /// `pods` single-CPU pods (`fake:1s{pods}c1t`), `total` spawns per run shared by one
    /// producer per pod, at least one per real CPU (rounded up to a multiple of the
    /// producers).
    pub fn new(pods: usize, total: u64) -> Result<ScaleParams> {
        let spec = format!("fake:1s{pods}c1t");
        let map = CpuMap::new(crate::bench::topo::load(&spec)?)?;
        // At least one producer per real CPU, so that every shape keeps them all busy.
        let producers = pods.max(map.real_cpus().len());
        Ok(ScaleParams {
            throughput: ThroughputParams {
                producers: Some(producers),
                items: total.div_ceil(producers as u64).max(1),
                mode: Mode::Spawn,
                works: DEFAULT_WORKS,
                work: Duration::ZERO,
                spread_real: true,
                flush: false,
            },
            spec,
            map,
        })
    }
}

/// Runs one `scale` shape once.
pub fn run_scale(system: &dyn System, config: QueueConfig, params: &ScaleParams) -> Result<Sample> {
    let mut sample = run(system, config, &params.map, &params.throughput)?;
    if let Some(t) = sample.throughput.as_mut() {
        t.pods = Some(ScalePods {
            topology: params.spec.clone(),
            pods: params.map.vcpus().len(),
        });
    }
    Ok(sample)
}

/// Runs the test once.
pub fn run(
    system: &dyn System,
    config: QueueConfig,
    map: &CpuMap,
    params: &ThroughputParams,
) -> Result<Sample> {
    let queue = system.new_queue("bench_throughput", config)?;
    let cpus = params.producer_pins(map);
    let producers = cpus.len() as u64;
    // Released twice: after the warm-up (the driver then waits for its runs), and to
    // start the measured phase.
    let warmed = Barrier::new(cpus.len() + 1);
    let go = Barrier::new(cpus.len() + 1);
    // `work`: raised once enough runs were counted; the producers then stop calling.
    let stop = AtomicBool::new(false);
    // Producers that returned, so that the driver never waits for runs of producers
    // that failed.
    let finished = AtomicUsize::new(0);
    let base = tally::total();
    let (outcomes, seconds, submit_seconds, runs, locks_before, switches, flushed) =
        std::thread::scope(|s| {
            let handles: Vec<_> = cpus
                .iter()
                .map(|&pin| {
                    let (queue, warmed, go, stop, finished) =
                        (&*queue, &warmed, &go, &stop, &finished);
                    s.spawn(move || {
                        let outcome = producer(system, queue, pin, params, warmed, go, stop);
                        finished.fetch_add(1, Relaxed);
                        outcome
                    })
                })
                .collect();
            warmed.wait();
            tally::wait_for(base + WARMUP_ITEMS * producers);
            let before = tally::total();
            let locks_before = queue.lock_counts();
            let switches_before = Switches::now();
            go.wait();
            // Only if no producer got to its first call; else the run starts with the
            // first producer's first call: the driver may get its CPU back much later
            // than the producers, which ran meanwhile.
            let released = Instant::now();
            if params.mode == Mode::Work {
                let target = before + params.items * producers;
                while tally::total() < target && finished.load(Relaxed) < cpus.len() {
                    std::thread::sleep(POLL);
                }
                stop.store(true, Relaxed);
            }
            let outcomes: Vec<Result<Outcome>> = handles
                .into_iter()
                .map(|h| h.join().expect("producer threads do not panic"))
                .collect();
            let accepted: u64 = outcomes.iter().flatten().map(|o| o.accepted).sum();
            let submit_seconds = outcomes
                .iter()
                .flatten()
                .map(|o| o.elapsed.as_secs_f64())
                .fold(0.0, f64::max);
            let flushed = params.flush && queue.flush();
            if outcomes.iter().all(Result::is_ok) {
                tally::wait_for(before + accepted);
            }
            let start = outcomes
                .iter()
                .flatten()
                .map(|o| o.started)
                .min()
                .unwrap_or(released);
            let seconds = start.elapsed().as_secs_f64();
            let runs = tally::total() - before;
            let switches = switches_before.and_then(|b| Switches::now().map(|a| a.since(b)));
            (
                outcomes,
                seconds,
                submit_seconds,
                runs,
                locks_before,
                switches,
                flushed,
            )
        });
    let context_switches = switches?;
    let mut calls = 0;
    let mut accepted = 0;
    for outcome in outcomes {
        let o = outcome?;
        calls += o.calls;
        accepted += o.accepted;
    }
    let mut sample = empty_sample();
    sample.seconds = seconds;
    sample.items = runs;
    sample.throughput = Some(ThroughputDetail {
        mode: params.mode,
        calls,
        accepted,
        runs,
        submit_seconds,
        calls_per_sec: rate(calls, submit_seconds),
        accepted_per_sec: rate(accepted, seconds),
        context_switches,
        pods: None,
        flushed,
    });
    sample.record_queue(&*queue, locks_before);
    Ok(sample)
}

/// What one producer did in the measured phase.
struct Outcome {
    calls: u64,
    accepted: u64,
    /// When it made its first call.
    started: Instant,
    /// From its first call to its last.
    elapsed: Duration,
}

/// A peer's prepared item with podq's PENDING rule added: a call while the previous
/// one has not started running is coalesced with it.
struct Coalescing {
    pending: Arc<AtomicBool>,
    item: Box<dyn Item>,
}

impl Coalescing {
    fn new(queue: &dyn Queue, work: Duration) -> Coalescing {
        let pending = Arc::new(AtomicBool::new(false));
        let item = queue.prepare(item_body(work, Some(Arc::clone(&pending))));
        Coalescing { pending, item }
    }
}

/// The body of a `work`-mode item: clears the peer's pending flag if it has one, then
/// spends `work` and counts the run.
fn item_body(work: Duration, pending: Option<Arc<AtomicBool>>) -> crate::bench::system::Task {
    Arc::new(move || {
        if let Some(flag) = &pending {
            // AcqRel: acquires the writes of every call coalesced into this run (their
            // swaps form a release sequence with the one that queued it), and releases
            // to the next call that queues.
            flag.swap(false, AcqRel);
        }
        crate::bench::define::spin(work);
        tally::bump();
    })
}

impl Item for Coalescing {
    fn submit(&self) -> bool {
        // AcqRel pairs with the worker's clearing swap above.
        if self.pending.swap(true, AcqRel) {
            return false;
        }
        self.item.submit()
    }
}

/// One producer: warm-up, then the measured calls.
#[allow(clippy::too_many_arguments)]
fn producer(
    system: &dyn System,
    queue: &dyn Queue,
    (vcpu, real): (usize, usize),
    params: &ThroughputParams,
    warmed: &Barrier,
    go: &Barrier,
    stop: &AtomicBool,
) -> Result<Outcome> {
    let pinned = placement::pin_to_real(&[real]);
    if pinned.is_ok() {
        placement::set_current_vcpu(Some(vcpu));
    }
    let works: Vec<Box<dyn Item>> = match params.mode {
        Mode::Spawn | Mode::Execute => Vec::new(),
        Mode::Work if queue.coalesces() => (0..params.works.max(1))
            .map(|_| queue.prepare(item_body(params.work, None)))
            .collect(),
        Mode::Work => (0..params.works.max(1))
            .map(|_| Box::new(Coalescing::new(queue, params.work)) as Box<dyn Item>)
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
    let (calls, accepted) = match params.mode {
        Mode::Spawn => {
            for seq in 0..params.items {
                queue.spawn_tiny(seq);
            }
            (params.items, params.items)
        }
        Mode::Execute => {
            for seq in 0..params.items {
                queue.execute_tiny(seq);
            }
            (params.items, params.items)
        }
        Mode::Work => {
            let (mut calls, mut accepted) = (0, 0);
            'calls: loop {
                let before = accepted;
                for work in &works {
                    if stop.load(Relaxed) {
                        break 'calls;
                    }
                    calls += 1;
                    accepted += u64::from(work.submit());
                }
                if accepted == before {
                    // Every item is still pending: give the CPU to whoever runs them,
                    // as an event source with nothing new would wait.
                    std::thread::yield_now();
                }
            }
            (calls, accepted)
        }
    };
    Ok(Outcome {
        calls,
        accepted,
        started: start,
        elapsed: start.elapsed(),
    })
}
