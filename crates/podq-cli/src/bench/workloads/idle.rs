//! `idle`: what podq's pools cost when nothing is queued. For each `--pods` count a
//! workqueue on `fake:1sNc1t` (`cpu` scope: one pool per pod) runs one item in every
//! pod, so that every pool has started its worker, and is left alone; then the run
//! counts the threads it added, the heap bytes (counting allocator) and resident
//! memory it added, and over `--duration` the CPU time and context switches of those
//! threads (`/proc/self/task/*`: `schedstat`, or `stat` ticks where the kernel lacks
//! schedstats).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::throughput::{tally, ScaleParams};
use super::{empty_sample, Sample};
use crate::bench::counting_alloc::Counter;
use crate::bench::system::placement;
use crate::bench::system::{QueueConfig, System};
use crate::procinfo::{self, CpuTimeSource, ThreadSched};

/// How long the pools get to go idle (spinning workers park within microseconds)
/// before the window starts.
const SETTLE: Duration = Duration::from_millis(200);

/// What one run measured (summed over rounds when merged, except the counts of
/// things, which every round has the same of).
#[derive(Clone, Debug, Serialize)]
pub struct IdleDetail {
    /// `fake:SHAPE`.
    pub topology: String,
    /// Pods of the `cpu` scope.
    pub pods: usize,
    /// Pools the workqueue lists (its pod pools and the fallback pool).
    pub pools: usize,
    /// Threads the workqueue added.
    pub threads: usize,
    /// Heap bytes the workqueue added (its pools, workers' bookkeeping), last round.
    pub heap_bytes: i64,
    /// Resident memory the process grew by (`VmRSS`), last round: heap plus the
    /// touched pages of the new threads' stacks.
    pub rss_bytes: i64,
    /// CPU time of the added threads over the window, nanoseconds (summed over
    /// rounds).
    pub cpu_ns: u64,
    /// Context switches of the added threads over the window (summed over rounds).
    pub context_switches: u64,
    /// The window, seconds (summed over rounds).
    pub window_seconds: f64,
    /// `schedstat` (exact) or `stat_ticks` (10 ms steps).
    pub cpu_time_source: CpuTimeSource,
}

impl IdleDetail {
    /// Folds in another round.
    pub fn merge(&mut self, other: &IdleDetail) {
        self.cpu_ns += other.cpu_ns;
        self.context_switches += other.context_switches;
        self.window_seconds += other.window_seconds;
        self.heap_bytes = other.heap_bytes;
        self.rss_bytes = other.rss_bytes;
    }

    /// CPU time of the idle threads as a share of one CPU.
    pub fn cpu_share(&self) -> f64 {
        if self.window_seconds > 0.0 {
            self.cpu_ns as f64 / 1e9 / self.window_seconds
        } else {
            0.0
        }
    }
}

fn rss_bytes() -> Result<i64> {
    let status = procfs::process::Process::myself()
        .and_then(|p| p.status())
        .context("cannot read /proc/self/status")?;
    Ok(status.vmrss.map_or(0, |kb| kb as i64 * 1024))
}

fn threads() -> Result<Vec<ThreadSched>> {
    procinfo::read_threads(std::process::id())
}

/// Runs one pod count once: `window` of idleness measured.
pub fn run(
    system: &dyn System,
    config: QueueConfig,
    shape: &ScaleParams,
    window: Duration,
) -> Result<Sample> {
    let before: BTreeSet<u32> = threads()?.iter().map(|t| t.tid).collect();
    let rss_before = rss_bytes()?;
    let counter = Counter::start();
    let heap_before = counter.read();
    let queue = system.new_queue("bench_idle", config)?;
    let base = tally::total();
    let vcpus = shape.map.vcpus();
    // One item in each pod, queued as if from its virtual CPU.
    for (seq, &vcpu) in vcpus.iter().enumerate() {
        placement::set_current_vcpu(Some(vcpu));
        system.enter_cpu(vcpu);
        queue.spawn_tiny(seq as u64);
    }
    placement::set_current_vcpu(None);
    system.leave_cpu();
    tally::wait_for(base + vcpus.len() as u64);
    std::thread::sleep(SETTLE);
    let heap = counter.read().since(heap_before).live;
    drop(counter);
    let rss = rss_bytes()? - rss_before;
    let added = |all: Vec<ThreadSched>| -> Vec<ThreadSched> {
        all.into_iter()
            .filter(|t| !before.contains(&t.tid))
            .collect()
    };
    let start_threads = added(threads()?);
    let started = Instant::now();
    std::thread::sleep(window);
    let end_threads = added(threads()?);
    let seconds = started.elapsed().as_secs_f64();
    // Threads present at both ends; one that exits in the window takes its time along.
    let mut cpu_ns = 0;
    let mut switches = 0;
    for t in &end_threads {
        if let Some(s) = start_threads.iter().find(|s| s.tid == t.tid) {
            cpu_ns += t.cpu_time_ns.saturating_sub(s.cpu_time_ns);
            switches += (t.voluntary_ctxt_switches + t.nonvoluntary_ctxt_switches)
                .saturating_sub(s.voluntary_ctxt_switches + s.nonvoluntary_ctxt_switches);
        }
    }
    let pools = queue.pools().unwrap_or(0);
    drop(queue);
    let mut sample = empty_sample();
    sample.items = vcpus.len() as u64;
    sample.seconds = seconds;
    sample.idle = Some(IdleDetail {
        topology: shape.spec.clone(),
        pods: vcpus.len(),
        pools,
        threads: start_threads.len(),
        heap_bytes: heap,
        rss_bytes: rss,
        cpu_ns,
        context_switches: switches,
        window_seconds: seconds,
        cpu_time_source: start_threads
            .first()
            .map_or(CpuTimeSource::Schedstat, |t| t.cpu_time_source),
    });
    Ok(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(cpu_ns: u64, window: f64) -> IdleDetail {
        IdleDetail {
            topology: "fake:1s8c1t".to_owned(),
            pods: 8,
            pools: 9,
            threads: 8,
            heap_bytes: 1000,
            rss_bytes: 4096,
            cpu_ns,
            context_switches: 2,
            window_seconds: window,
            cpu_time_source: CpuTimeSource::Schedstat,
        }
    }

    #[test]
    fn rounds_add_their_windows_and_cpu_time() {
        let mut a = detail(1_000_000, 1.0);
        a.merge(&detail(3_000_000, 3.0));
        assert_eq!(a.cpu_ns, 4_000_000);
        assert_eq!(a.context_switches, 4);
        // 4 ms over 4 s: a thousandth of a CPU.
        assert!((a.cpu_share() - 0.001).abs() < 1e-12);
        assert_eq!(detail(5, 0.0).cpu_share(), 0.0);
    }
}
