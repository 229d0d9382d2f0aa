//! The `auto` scope at run time: every window, one process-wide sampler thread
//! (`podq/auto`) turns each auto workqueue's statistics into a [`Window`], asks the
//! controller ([`crate::policy::auto::decide`]) and applies a switch through the live
//! attribute change, the path of [`crate::Workqueue::set_scope`]: new items go to the
//! new pools at once, queued and running ones finish on the old pools, flush covers
//! both, so nothing is lost or run twice.
//!
//! A workqueue is on `auto` when its scope is [`Scope::Auto`], or [`Scope::Default`]
//! while the process default is `auto`. It starts at the scope in force (the built-in
//! default, `cache_shard`, when built on `auto`) and keeps its own controller state;
//! setting strictness or the cpumask restarts the controller from the scope in force.
//!
//! What a window holds, from the statistics (so `auto` needs the `stats` feature: a
//! build without it refuses `auto` with [`Error::AutoNeedsStats`] wherever a scope is
//! set): per pool of the scope in force, items queued and started, backlog (queued
//! minus started), busy time (the run time of finished items, estimated from the
//! run-time histogram's weighted sample of them), and pool-lock
//! acquisitions, contended acquisitions and wait, enqueue and dequeue together; per
//! workqueue, items finished and where items ran. Pools are shared by workqueues with equal pool attributes, so
//! a pool's numbers include other workqueues' items. A pool first seen in a window (a
//! switch just made it) only sets its baseline.
//!
//! Legend (the crate's letters): I set at init; M guarded by the workqueue's `config`
//! lock (as everything in its `Config`); Y guarded by `SAMPLER.state`.
//!
//! Lock order: Y is a leaf, never held while a workqueue's lock is taken; the sampler
//! takes a workqueue's `config`, then what an attribute change takes.

use crate::sync::unmodelled::{Condvar, Mutex};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use podq_topology::{CpuSet, Scope, Topology};
use serde::{Deserialize, Serialize};

use crate::policy::auto::{
    decide, AutoConfig, AutoState, Ladder, PlaceCounts, PodWindow, PoolCounts, Reason, Switch,
    Window,
};
use crate::stats::PoolStats;
use crate::sync::{lock_std as lock, wait_std};
use crate::Error;

/// Refuses [`Scope::Auto`] in a build without the `stats` feature ([`Error::AutoNeedsStats`]).
///
/// Without the statistics every window would be quiet and the workqueue would stay at
/// its starting scope for good while reporting `auto`: a silent fixed scope. Refusing it
/// where it is asked for (builder, `set_scope`, `set_attrs`, the control plane,
/// `set_default_scope`, `PODQ_DEFAULT_AFFINITY_SCOPE`) tells the caller at once.
pub(crate) fn available(scope: Scope) -> Result<(), Error> {
    if scope == Scope::Auto && !cfg!(feature = "stats") {
        return Err(Error::AutoNeedsStats);
    }
    Ok(())
}

/// Switches kept in [`AutoStats::history`].
pub const HISTORY: usize = 64;

/// The window of a workqueue on `auto` unless its builder names one.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);

/// How a workqueue's `auto` controller runs (I: fixed at build time).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) window: Duration,
    pub(crate) config: AutoConfig,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            window: DEFAULT_WINDOW,
            config: AutoConfig::default(),
        }
    }
}

/// What `auto` reports in a workqueue's statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AutoStats {
    /// The concrete scope in force.
    pub scope: Scope,
    /// Whether its pools are strict.
    pub strict: bool,
    /// Windows judged so far.
    pub windows: u64,
    /// Switches made.
    pub switches: u64,
    /// Switches the attribute change refused (the scope stayed).
    pub switch_failures: u64,
    /// The last switch, with its reason.
    pub last_switch: Option<Switch>,
    /// The last [`HISTORY`] switches, oldest first.
    pub history: Vec<Switch>,
    /// The reason of the last window's decision.
    pub last_reason: Reason,
    /// Window length in nanoseconds.
    pub window_ns: u64,
}

/// Cumulative counts of one pool at the last sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Tally {
    counts: PoolCounts,
    same_llc: u64,
    off_llc: u64,
}

impl Tally {
    fn of(p: &PoolStats) -> Tally {
        // The run-time histogram holds a weighted sample of the items: its count and
        // mean are those of the items it stands for (`stats::Latency`).
        let run = &p.run_time_ns;
        Tally {
            counts: PoolCounts {
                queued: p.totals.queued,
                started: p.totals.started,
                finished: p.totals.completed,
                measured: run.count,
                measured_run_ns: (run.mean * run.count as f64) as u64,
                lock_acquisitions: p.enqueue_lock.acquisitions + p.dequeue_lock.acquisitions,
                lock_contended: p.enqueue_lock.contended + p.dequeue_lock.contended,
                lock_wait_ns: p.enqueue_lock.wait_ns + p.dequeue_lock.wait_ns,
            },
            same_llc: p.locality.same_cpu + p.locality.same_smt + p.locality.same_llc,
            off_llc: p.locality.same_node + p.locality.remote,
        }
    }
}

/// One pool's statistics as the sampler read them.
pub(crate) struct PoolSample {
    pub(crate) id: u64,
    /// Its pod mask.
    pub(crate) pod: CpuSet,
    /// The real CPUs the pod's CPUs run on.
    pub(crate) capacity: usize,
    pub(crate) stats: PoolStats,
}

/// A workqueue's `auto` controller and its sampling (all M).
#[derive(Clone, Debug)]
pub(crate) struct AutoRun {
    ladder: Ladder,
    /// The effective cpumask the ladder covers.
    mask: CpuSet,
    /// The requested strictness it started from.
    requested_strict: bool,
    settings: Settings,
    state: AutoState,
    last_reason: Reason,
    switch_failures: u64,
    /// The last switches, oldest first (at most [`HISTORY`]).
    history: Vec<Switch>,
    /// When the last sample was taken, and the next is due.
    last_at: Instant,
    next_at: Instant,
    /// Per pool id, its counts at the last sample.
    seen: HashMap<u64, Tally>,
    /// The workqueue's finished items at the last sample.
    completed: u64,
}

impl AutoRun {
    /// The controller for the next attribute change: `previous` carried over when it
    /// still covers `mask` with the same requested strictness, otherwise a new one
    /// starting at `in_force` (or the built-in default when that is not concrete).
    pub(crate) fn plan(
        previous: Option<&AutoRun>,
        settings: &Settings,
        in_force: Scope,
        strict: bool,
        topology: &Topology,
        mask: &CpuSet,
    ) -> Result<AutoRun, Error> {
        if let Some(run) = previous.filter(|r| &r.mask == mask && r.requested_strict == strict) {
            return Ok(run.clone());
        }
        let ladder = Ladder::new(topology, mask)?;
        let start = previous.map_or(in_force, AutoRun::scope);
        let now = Instant::now();
        Ok(AutoRun {
            state: ladder.start(start, strict),
            ladder,
            mask: mask.clone(),
            requested_strict: strict,
            settings: settings.clone(),
            last_reason: Reason::Start,
            switch_failures: 0,
            history: Vec::new(),
            last_at: now,
            next_at: now + settings.window,
            seen: HashMap::new(),
            completed: 0,
        })
    }

    /// The concrete scope in force.
    pub(crate) fn scope(&self) -> Scope {
        self.ladder.rungs()[self.state.rung()].scope
    }

    /// Whether its pools are strict.
    pub(crate) fn strict(&self) -> bool {
        self.state.strict()
    }

    /// When the next sample is due.
    pub(crate) fn next_at(&self) -> Instant {
        self.next_at
    }

    /// Takes the sample due at `now`: `completed` is the workqueue's finished items,
    /// `pools` every pool its pwqs use, with its pod mask and the number of real CPUs
    /// the pod runs on. Returns whether the controller switched.
    pub(crate) fn sample(&mut self, now: Instant, completed: u64, pools: &[PoolSample]) -> bool {
        let mut window = Window {
            duration_ns: u64::try_from((now - self.last_at).as_nanos()).unwrap_or(u64::MAX),
            completed: completed.saturating_sub(self.completed),
            pods: Vec::new(),
            places: PlaceCounts::default(),
        };
        let mut seen = HashMap::with_capacity(pools.len());
        for PoolSample {
            id,
            pod,
            capacity,
            stats,
        } in pools
        {
            let now_tally = Tally::of(stats);
            seen.insert(*id, now_tally);
            let Some(before) = self.seen.get(id) else {
                continue;
            };
            window.places.same_llc += now_tally.same_llc.saturating_sub(before.same_llc);
            window.places.off_llc += now_tally.off_llc.saturating_sub(before.off_llc);
            let (before, now) = (&before.counts, &now_tally.counts);
            let backlog = now.queued.saturating_sub(now.started);
            window.pods.push(PodWindow::between(
                pod.clone(),
                *capacity,
                backlog,
                before,
                now,
            ));
        }
        self.seen = seen;
        self.completed = completed;
        self.last_at = now;
        self.next_at = now + self.settings.window;
        let state = self.state.clone();
        let (state, decision) = decide(&self.ladder, &self.settings.config, state, &window);
        self.state = state;
        self.last_reason = decision.reason;
        if let (true, Some(switch)) = (decision.switched, self.state.last_switch()) {
            if self.history.len() == HISTORY {
                self.history.remove(0);
            }
            self.history.push(switch.clone());
        }
        decision.switched
    }

    /// Counts a switch the attribute change refused, restoring `before`'s controller
    /// state (the scope in force did not change) but keeping the new baseline.
    pub(crate) fn refused(&mut self, before: AutoRun) {
        self.state = before.state;
        self.history = before.history;
        self.switch_failures += 1;
    }

    pub(crate) fn stats(&self) -> AutoStats {
        AutoStats {
            scope: self.scope(),
            strict: self.strict(),
            windows: self.state.windows(),
            switches: self.state.switches(),
            switch_failures: self.switch_failures,
            last_switch: self.state.last_switch().cloned(),
            history: self.history.clone(),
            last_reason: self.last_reason.clone(),
            window_ns: u64::try_from(self.settings.window.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

/// The sampler thread's state.
struct Sampler {
    /// Y: whether the thread runs, and how many times it was woken (so that a wake-up
    /// between its scan and its wait is not lost).
    state: Mutex<(bool, u64)>,
    /// Y: signalled when a workqueue goes on `auto`.
    wake: Condvar,
}

static SAMPLER: Sampler = Sampler {
    state: Mutex::new((false, 0)),
    wake: Condvar::new(),
};

/// Starts the sampler if it does not run, and makes it look at the workqueues again
/// (one just went on `auto`).
pub(crate) fn wake_sampler() -> Result<(), Error> {
    let mut state = lock(&SAMPLER.state);
    if !state.0 {
        std::thread::Builder::new()
            .name("podq/auto".to_owned())
            .spawn(sample_forever)
            .map_err(|source| Error::Os {
                call: "spawn the podq/auto thread",
                source,
            })?;
        state.0 = true;
    }
    state.1 += 1;
    SAMPLER.wake.notify_all();
    Ok(())
}

fn sample_forever() {
    loop {
        let woken = lock(&SAMPLER.state).1;
        let next = crate::workqueue::live_workqueues()
            .iter()
            .filter_map(|wq| wq.auto_sample(Instant::now()))
            .min();
        let state = lock(&SAMPLER.state);
        if state.1 != woken {
            continue;
        }
        match next {
            // No workqueue on `auto`: sleep until one appears.
            None => drop(wait_std(&SAMPLER.wake, state)),
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                drop(
                    SAMPLER
                        .wake
                        .wait_timeout(state, wait)
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                );
            }
        }
    }
}

#[cfg(all(test, feature = "stats", not(loom)))]
mod tests {
    use super::*;

    /// On a real pool: 64 items of at least 200 µs each, of which the histogram holds a
    /// sample, still count as at least 64 × 200 µs of busy time.
    ///
    /// Whether the sample leaves items out depends on how fast the queuer ran (its
    /// period adapts to its rate, `stats::sample`): the items wait at a gate until all
    /// are queued, so that no worker competes with the queuer, and each attempt queues
    /// from a fresh thread (whose first item is always measured). An attempt whose
    /// sample happened to hold every item still checks the busy time, and is repeated.
    #[test]
    fn busy_time_of_a_real_pool_counts_the_items_the_histogram_did_not_sample() {
        const ITEMS: u64 = 64;
        const ATTEMPTS: usize = 8;
        // A topology no other test uses, so that the pool is this test's alone.
        let wq = crate::Workqueue::builder("auto-busy")
            .topology(crate::testing::fake_topology(1, 1, 7, 1))
            .scope(Scope::System)
            .build()
            .unwrap();
        let item = Duration::from_micros(200);
        let pool_counts = || {
            let stats = wq.stats();
            let [pool] = stats.pools.as_slice() else {
                panic!("one pool in scope system: {:?}", stats.pools);
            };
            Tally::of(pool).counts
        };
        for _ in 0..ATTEMPTS {
            let before = pool_counts();
            let gate =
                std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
            std::thread::scope(|s| {
                s.spawn(|| {
                    for _ in 0..ITEMS {
                        let gate = gate.clone();
                        wq.spawn(move || {
                            let (open, opened) = &*gate;
                            let guard = open.lock().unwrap();
                            drop(opened.wait_while(guard, |open| !*open).unwrap());
                            let start = Instant::now();
                            while start.elapsed() < item {}
                        });
                    }
                });
            });
            *gate.0.lock().unwrap() = true;
            gate.1.notify_all();
            wq.flush();
            let after = pool_counts();
            assert_eq!(after.finished - before.finished, ITEMS);
            let busy = after.busy_since(&before);
            assert!(busy >= ITEMS * 200_000 * 99 / 100, "busy {busy} ns");
            if after.measured - before.measured < ITEMS {
                return;
            }
        }
        panic!("in {ATTEMPTS} attempts the histogram measured every item");
    }
}
