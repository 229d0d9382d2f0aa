//! The workloads, and the runner that interleaves systems and configurations in rounds
//! so that drift (frequency, other load) spreads over all of them alike.

pub mod completion;
pub mod idle;
pub mod latency;
pub mod memory;
pub mod queue;
pub mod throughput;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;

use super::report::{
    self, new_histogram, AutoTrace, CompletionDetail, LatencySummary, Round, RunResult,
};
use super::system::placement::CpuMap;
use super::system::{PoolLockCounts, Queue, QueueConfig, System};

/// How long one measured run lasts.
#[derive(Clone, Copy, Debug)]
pub enum RunLength {
    /// Wall time per run.
    Duration(Duration),
    /// Items per producer per run.
    Items(u64),
}

/// Which test a case runs.
#[derive(Clone, Debug)]
pub enum Test {
    /// test_workqueue's shape.
    Queue(queue::QueueParams),
    /// One synchronous submitter with think time.
    Latency(latency::LatencyParams),
    /// The NFS-over-RDMA miniature.
    Completion(Arc<completion::CompletionParams>),
    /// Open loop: producers submit as fast as they can.
    Throughput(throughput::ThroughputParams),
    /// Open-loop spawn on a fake topology of its own (the `scale` workload).
    Scale(Arc<throughput::ScaleParams>),
    /// Bytes per queued item, the workers held back.
    Memory(memory::MemoryParams),
    /// Idle pools on a fake topology of their own, watched for this long.
    Idle(Arc<throughput::ScaleParams>, Duration),
}

impl Test {
    /// The test's name in tables and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Test::Queue(_) => "queue",
            Test::Latency(_) => "latency",
            Test::Completion(_) => "completion",
            Test::Throughput(p) => match p.mode {
                throughput::Mode::Spawn => "throughput_spawn",
                throughput::Mode::Execute => "throughput_execute",
                throughput::Mode::Work => "throughput_work",
            },
            Test::Scale(_) => "scale",
            Test::Idle(..) => "idle",
            Test::Memory(p) => match p.mode {
                throughput::Mode::Spawn => "memory_spawn",
                throughput::Mode::Execute => "memory_execute",
                throughput::Mode::Work => "memory_work",
            },
        }
    }
}

/// One system in one configuration running one test.
pub struct Case {
    /// The system.
    pub system: Arc<dyn System>,
    /// Its configuration.
    pub config: QueueConfig,
    /// The test.
    pub test: Test,
}

/// What one measured run (or one toggle segment of it) produced.
pub struct Sample {
    /// Items completed.
    pub items: u64,
    /// Wall time.
    pub seconds: f64,
    /// The test's main latency.
    pub latency: Histogram<u64>,
    /// Submit-call latency (latency test).
    pub submit: Option<Histogram<u64>>,
    /// Pool lock counters over the run.
    pub pool_locks: Option<PoolLockCounts>,
    /// Completion-test extras.
    pub completion: Option<CompletionDetail>,
    /// The scope in force during a toggle segment.
    pub segment_scope: Option<podq_topology::Scope>,
    /// Throughput-test extras.
    pub throughput: Option<throughput::ThroughputDetail>,
    /// Memory-test extras.
    pub memory: Option<memory::MemoryDetail>,
    /// Idle-test extras.
    pub idle: Option<idle::IdleDetail>,
    /// `queue` only: the producers' and workers' context switches (the driver's left
    /// out).
    pub context_switches: Option<u64>,
    /// What an `auto` controller did over the run (not `completion`'s, which is per
    /// segment in its extras).
    pub auto: Option<AutoTrace>,
}

impl Sample {
    /// This sample's figures as one round of a run that took `wall_seconds`.
    fn round(&self, wall_seconds: f64) -> Round {
        Round {
            items: self.items,
            seconds: self.seconds,
            wall_seconds,
            items_per_sec: rate(self.items, self.seconds),
            samples: self.latency.len(),
            p50_ns: self.latency.value_at_quantile(0.5),
            p99_ns: self.latency.value_at_quantile(0.99),
            mb_per_sec: self.completion.as_ref().map(|c| c.mb_per_sec),
            accepted_per_sec: self.throughput.as_ref().map(|t| t.accepted_per_sec),
            calls_per_sec: self.throughput.as_ref().map(|t| t.calls_per_sec),
            switches_per_kitem: self
                .throughput
                .as_ref()
                .map(|t| t.context_switches)
                .or(self.context_switches)
                .map(|n| report::per_kitem(n, self.items)),
            bytes_per_item: self.memory.as_ref().map(|m| m.bytes_per_item),
            idle_cpu_share: self.idle.as_ref().map(idle::IdleDetail::cpu_share),
            auto_scope_at_end: self.auto.as_ref().map(|a| a.scope_at_end),
        }
    }

    /// Adds what the run's own `queue` recorded: its pool locks since `locks_before`,
    /// and what its `auto` controller did (all of it: the queue lived for this run).
    fn record_queue(&mut self, queue: &dyn Queue, locks_before: Option<PoolLockCounts>) {
        self.pool_locks = queue
            .lock_counts()
            .zip(locks_before)
            .map(|(after, before)| after.since(&before));
        self.auto = queue.auto().map(|at_end| AutoTrace::between(None, &at_end));
    }

    fn merge(&mut self, other: Sample) {
        let total = self.seconds + other.seconds;
        self.items += other.items;
        // Both histograms share bounds, so adding cannot fail.
        let _ = self.latency.add(&other.latency);
        if let (Some(a), Some(b)) = (self.submit.as_mut(), other.submit.as_ref()) {
            let _ = a.add(b);
        }
        if let (Some(a), Some(b)) = (self.pool_locks.as_mut(), other.pool_locks) {
            a.add(&b);
        }
        if let (Some(a), Some(b)) = (self.completion.as_mut(), other.completion) {
            a.merge(b, self.seconds, other.seconds);
        }
        if let (Some(a), Some(b)) = (self.throughput.as_mut(), other.throughput) {
            a.merge(b, self.seconds, other.seconds);
        }
        if let (Some(a), Some(b)) = (self.memory.as_mut(), other.memory) {
            a.merge(&b);
        }
        if let (Some(a), Some(b)) = (self.idle.as_mut(), other.idle) {
            a.merge(&b);
        }
        if let (Some(a), Some(b)) = (self.context_switches.as_mut(), other.context_switches) {
            *a += b;
        }
        if let (Some(a), Some(b)) = (self.auto.as_mut(), other.auto) {
            a.merge(b);
        }
        self.seconds = total;
    }
}

/// Runs every case `rounds` times, rotating the order each round, and returns one
/// result per case (and per toggle segment).
pub fn run_cases(
    cases: &[Case],
    map: &CpuMap,
    length: RunLength,
    rounds: usize,
    progress: &ProgressBar,
) -> Result<Vec<RunResult>> {
    let mut totals: Vec<Option<Vec<Sample>>> = (0..cases.len()).map(|_| None).collect();
    // Per case, per segment: each round's figures.
    let mut rounds_of: Vec<Vec<Vec<Round>>> = vec![Vec::new(); cases.len()];
    for round in 0..rounds {
        for k in 0..cases.len() {
            let index = (k + round) % cases.len();
            let case = &cases[index];
            progress.set_message(format!(
                "{} {} {}",
                case.test.name(),
                case.system.name(),
                case.config.label()
            ));
            let started = std::time::Instant::now();
            let samples = run_case(case, map, length)?;
            let wall = started.elapsed().as_secs_f64();
            progress.inc(1);
            let rounds = &mut rounds_of[index];
            rounds.resize_with(samples.len(), Vec::new);
            for (segment, s) in samples.iter().enumerate() {
                rounds[segment].push(s.round(wall));
            }
            match &mut totals[index] {
                slot @ None => *slot = Some(samples),
                Some(acc) => {
                    for (a, s) in acc.iter_mut().zip(samples) {
                        a.merge(s);
                    }
                }
            }
        }
    }
    let mut results = Vec::new();
    for ((case, samples), mut rounds) in cases.iter().zip(totals).zip(rounds_of) {
        let samples = samples.unwrap_or_default();
        let segmented = samples.len() > 1;
        rounds.resize_with(samples.len(), Vec::new);
        for ((segment, s), rounds) in samples.into_iter().enumerate().zip(rounds) {
            results.push(RunResult {
                test: case.test.name(),
                system: case.system.name().to_owned(),
                scope: s.segment_scope.or(case.config.scope),
                strict: case.config.strict,
                segment: segmented.then_some(segment),
                producers: producers_of(&case.test, map),
                items: s.items,
                seconds: s.seconds,
                items_per_sec: rate(s.items, s.seconds),
                latency_ns: LatencySummary::of(&s.latency),
                submit_ns: s.submit.as_ref().map(LatencySummary::of),
                completion: s.completion,
                throughput: s.throughput,
                memory: s.memory,
                idle: s.idle,
                context_switches: s.context_switches,
                pool_locks: s.pool_locks,
                auto: s.auto,
                rounds,
                histogram: s.latency,
            });
        }
    }
    Ok(results)
}

fn rate(items: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        items as f64 / seconds
    } else {
        0.0
    }
}

fn producers_of(test: &Test, map: &CpuMap) -> usize {
    match test {
        Test::Queue(p) => p.producer_cpus(map).len(),
        Test::Latency(_) => 1,
        Test::Completion(p) => p.producer_cpus.len(),
        Test::Throughput(p) => p.producer_cpus(map).len(),
        Test::Scale(p) => p.throughput.producer_cpus(&p.map).len(),
        Test::Memory(_) | Test::Idle(..) => 1,
    }
}

fn run_case(case: &Case, map: &CpuMap, length: RunLength) -> Result<Vec<Sample>> {
    match &case.test {
        Test::Queue(p) => Ok(vec![queue::run(
            &*case.system,
            case.config,
            map,
            p,
            length,
        )?]),
        Test::Latency(p) => Ok(vec![latency::run(
            &*case.system,
            case.config,
            map,
            p,
            length,
        )?]),
        Test::Completion(p) => completion::run(&*case.system, case.config, map, p, length),
        Test::Throughput(p) => Ok(vec![throughput::run(&*case.system, case.config, map, p)?]),
        Test::Scale(p) => Ok(vec![throughput::run_scale(&*case.system, case.config, p)?]),
        Test::Memory(p) => Ok(vec![memory::run(&*case.system, case.config, p)?]),
        Test::Idle(p, window) => Ok(vec![idle::run(&*case.system, case.config, p, *window)?]),
    }
}

/// An empty sample to fill.
fn empty_sample() -> Sample {
    Sample {
        items: 0,
        seconds: 0.0,
        latency: new_histogram(),
        submit: None,
        pool_locks: None,
        completion: None,
        segment_scope: None,
        throughput: None,
        memory: None,
        idle: None,
        context_switches: None,
        auto: None,
    }
}
