//! The `auto` scope on the virtual clock: every window, the queue under test's pools
//! are measured as the runtime measures them (`podq::auto`), the same controller
//! decides ([`podq_policy::auto::decide`]) and a switch goes through the simulator's
//! live attribute change ([`Sim::apply_attrs`]).
//!
//! As in the runtime, a pod's busy time is its pool's workers' time in items, and its
//! capacity its CPUs (the most workers the pool runs at once): a pool is saturated when
//! its workers are, whatever else its CPUs run.

use podq_policy::auto::{
    decide, AutoConfig, AutoState, Ladder, PlaceCounts, PodWindow, PoolCounts, Switch, Window,
};
use podq_topology::{Scope, Topology};

use crate::engine::Sim;
use crate::events::Ns;

/// How the simulated `auto` controller runs.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoSpec {
    /// Window of virtual time, ns.
    pub window_ns: Ns,
    /// Thresholds and limits.
    pub config: AutoConfig,
}

impl Default for AutoSpec {
    /// 10 ms windows: virtual runs last a second or two, and the simulator's counters
    /// have no sampling noise to smooth.
    fn default() -> Self {
        AutoSpec {
            window_ns: 10_000_000,
            config: AutoConfig::default(),
        }
    }
}

/// A switch, with the virtual time it was made at.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedSwitch {
    /// Virtual time, ns.
    pub at: Ns,
    /// The switch.
    pub switch: Switch,
}

/// The controller of the queue under test.
pub struct SimAuto {
    ladder: Ladder,
    spec: AutoSpec,
    state: AutoState,
    last_at: Ns,
    /// Per pool index, its counts at the last sample (`None`: not seen yet).
    seen: Vec<Option<PoolCounts>>,
    items: u64,
    locality: [u64; 5],
    /// Every switch made.
    pub switches: Vec<TimedSwitch>,
}

impl SimAuto {
    /// A controller over `topology`'s usable CPUs, starting at the built-in default.
    pub fn new(
        topology: &Topology,
        strict: bool,
        spec: AutoSpec,
    ) -> Result<SimAuto, podq_topology::Error> {
        let ladder = Ladder::new(topology, topology.usable())?;
        let state = ladder.start(Scope::BUILTIN_DEFAULT, strict);
        Ok(SimAuto {
            ladder,
            spec,
            state,
            last_at: 0,
            seen: Vec::new(),
            items: 0,
            locality: [0; 5],
            switches: Vec::new(),
        })
    }

    /// The concrete scope in force.
    pub fn scope(&self) -> Scope {
        self.ladder.rungs()[self.state.rung()].scope
    }

    /// Whether its pools are strict.
    pub fn strict(&self) -> bool {
        self.state.strict()
    }

    /// The window, ns.
    pub fn window_ns(&self) -> Ns {
        self.spec.window_ns
    }

    /// Measures workqueue `wq` over the window ending now and decides; `Some` with the
    /// scope and strictness to apply when the controller switched.
    pub fn sample(&mut self, sim: &Sim<'_>, wq: usize) -> Option<(Scope, bool)> {
        let now = sim.now;
        let counters = &sim.counters;
        let off = counters.locality[3] + counters.locality[4] - self.locality[3] - self.locality[4];
        let all: u64 = counters.locality.iter().sum::<u64>() - self.locality.iter().sum::<u64>();
        let mut window = Window {
            duration_ns: now - self.last_at,
            completed: counters.items - self.items,
            pods: Vec::new(),
            places: PlaceCounts {
                same_llc: all - off,
                off_llc: off,
            },
        };
        let w = &sim.world.wqs[wq];
        for &p in &w.pools {
            let pool = &sim.world.pools[p];
            let (enqueue, dequeue) = (
                &sim.locks[pool.lock].counts[0],
                &sim.locks[pool.take_lock].counts[1],
            );
            // Every item's run time is known here: measured = finished, busy exact.
            let now_counts = PoolCounts {
                queued: pool.pushed,
                started: pool.taken,
                finished: pool.finished,
                measured: pool.finished,
                measured_run_ns: pool.busy_ns,
                lock_acquisitions: enqueue.acquisitions + dequeue.acquisitions,
                lock_contended: enqueue.contended + dequeue.contended,
                lock_wait_ns: enqueue.wait_ns + dequeue.wait_ns,
            };
            if self.seen.len() <= p {
                self.seen.resize(p + 1, None);
            }
            let Some(before) = self.seen[p].replace(now_counts) else {
                continue;
            };
            let inactive: usize = sim
                .world
                .pwqs
                .iter()
                .filter(|q| q.wq == wq && q.pool == p)
                .map(|q| q.inactive.len())
                .sum();
            let backlog = (pool.worklist.len() + inactive) as u64;
            let cpus = pool.pod.clone();
            let capacity = pool.pod.len();
            window.pods.push(PodWindow::between(
                cpus,
                capacity,
                backlog,
                &before,
                &now_counts,
            ));
        }
        self.last_at = now;
        self.items = counters.items;
        self.locality = counters.locality;
        let state = self.state.clone();
        let (state, decision) = decide(&self.ladder, &self.spec.config, state, &window);
        self.state = state;
        if !decision.switched {
            return None;
        }
        if let Some(switch) = self.state.last_switch() {
            self.switches.push(TimedSwitch {
                at: now,
                switch: switch.clone(),
            });
        }
        Some((decision.scope, decision.strict))
    }
}
