//! The `auto` scope's controller: which concrete scope (and strictness) a workqueue on
//! `Scope::Auto` uses, decided from windowed statistics.
//!
//! The runtime and the simulator measure a [`Window`] (per pod of the scope in force:
//! arrivals, starts, backlog, busy time, pool-lock contention; per workqueue: items
//! finished and where they ran) and call [`decide`] with the [`AutoState`] the previous
//! call returned. The state is a plain value: no clock, thread or global here; the
//! caller owns the window length.
//!
//! # What it looks at
//! The scopes of a machine form a *ladder* ([`Ladder`]): their distinct pod layouts,
//! narrowest first (`cpu`, `smt`, `cache_shard`, `cache`, `numa`, `system` where they
//! differ). Three problems move a workqueue along it:
//! - **Lock contention** (too wide): one pool's workers and producers spend a share of
//!   the pod's CPU time waiting for its lock (the 12-core single-L3 case, 17–39% of
//!   cycles). One rung narrower splits the pool.
//! - **Imbalance** (too narrow): pods are saturated (busy near their CPUs, or a backlog
//!   larger than what they ran in the window) while other CPUs of the workqueue idle
//!   (the 2-node case with every completion queue on node 0). The controller jumps to
//!   the narrowest wider rung whose pods join saturated CPUs with idle ones; a strict
//!   workqueue is first made non-strict, since strict pods cannot spill ("strict makes
//!   it worse").
//! - **Spill** (wider than needed): nothing is saturated, yet most items run outside
//!   the LLC they were queued in; one rung narrower keeps them local.
//!
//! # Why it does not oscillate
//! - *Hysteresis*: a problem must be seen in [`AutoConfig::confirm_windows`] windows; a
//!   lock-wait share between the exit and the enter thresholds neither counts nor resets
//!   the count.
//! - *Dwell*: no switch within [`AutoConfig::min_dwell_windows`] of the previous one.
//! - *Rate*: at most [`AutoConfig::max_switches`] switches in any
//!   [`AutoConfig::rate_windows`] windows.
//! - *Memory*: every switch remembers the load it was made under (the share of arrivals
//!   per NUMA node and the arrival rate). A switch that would undo one made under the
//!   same load is refused ([`Reason::Held`]); so is another step in the direction of a
//!   step that did not reduce the problem it was made for ([`Reason::Ineffective`]).
//!   A different load (the completion queues moved, the rate changed) lifts both.
//! - *Outcome*: after the dwell, a switch that cost more than [`AutoConfig::regression`]
//!   of the items/s measured before it is reverted and remembered; one that fell below
//!   [`AutoConfig::collapse`] of it is reverted as soon as the confirmation windows show
//!   it. Signals say where a problem is, not what a switch costs elsewhere (a narrower
//!   scope can cost more in hand-offs than its lock saved): the outcome says that.

use std::collections::HashMap;
use std::fmt;

use podq_topology::{CpuSet, Scope};
use serde::{Deserialize, Serialize};

mod config;
mod ladder;
mod window;

pub use config::AutoConfig;
pub use ladder::{Ladder, Rung};
pub use window::{PlaceCounts, PodWindow, PoolCounts, Window};

/// Why the controller decided what it did; the numbers are those that triggered it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Reason {
    /// The scope it started at.
    Start,
    /// Too few items finished to judge.
    Quiet {
        /// Items finished in the window.
        completed: u64,
    },
    /// No problem seen.
    Steady,
    /// Within the minimum dwell after a switch.
    Dwelling {
        /// Windows still to wait.
        left: u64,
    },
    /// A problem seen, not yet in enough consecutive windows.
    Confirming {
        /// The scope it points to.
        toward: Scope,
        /// Windows seen so far.
        seen: u32,
    },
    /// The switch rate limit is reached.
    RateLimited {
        /// Switches in the last `rate_windows` windows.
        switches: u32,
    },
    /// The switch would undo one made under the same load.
    Held {
        /// The scope it would have switched to.
        toward: Scope,
    },
    /// The last step in this direction did not reduce its problem under this load.
    Ineffective {
        /// The scope it would have switched to.
        toward: Scope,
    },
    /// Lock contention and imbalance at once, of similar weight: each fix worsens the
    /// other.
    Conflict {
        /// The hot lock's wait share.
        wait_share: f64,
        /// What spreading could gain: the busy gap times the idle share of the CPUs.
        spread_gain: f64,
    },
    /// Narrower: a pool's lock is contended.
    LockContention {
        /// CPUs of the pool.
        pool_cpus: usize,
        /// Share of the pod's CPU time spent waiting for the lock.
        wait_share: f64,
        /// Share of acquisitions that found it held.
        contended_share: f64,
    },
    /// Wider: saturated pods while CPUs that a wider pod would join idle.
    Imbalance {
        /// CPUs of saturated pods.
        saturated_cpus: usize,
        /// Idle CPUs.
        idle_cpus: usize,
        /// Mean busy share of the saturated pods.
        saturated_busy: f64,
        /// Mean busy share of the idle pods.
        idle_busy: f64,
    },
    /// Non-strict: strict pods are saturated while CPUs idle.
    StrictStarves {
        /// CPUs of saturated pods.
        saturated_cpus: usize,
        /// Idle CPUs.
        idle_cpus: usize,
    },
    /// Narrower: nothing saturated, yet most items ran outside their LLC.
    Spill {
        /// Share of items that ran outside the LLC they were queued in.
        off_llc_share: f64,
    },
    /// Back: the previous switch cost throughput.
    Regressed {
        /// Items/s before the switch.
        before: f64,
        /// Items/s after it.
        after: f64,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |x: f64| x * 100.0;
        match self {
            Reason::Start => write!(f, "start"),
            Reason::Quiet { completed } => write!(f, "quiet ({completed} items)"),
            Reason::Steady => write!(f, "steady"),
            Reason::Dwelling { left } => write!(f, "dwelling ({left} windows left)"),
            Reason::Confirming { toward, seen } => {
                write!(f, "confirming {toward} ({seen} windows)")
            }
            Reason::RateLimited { switches } => write!(f, "rate limited ({switches} switches)"),
            Reason::Held { toward } => write!(f, "held: {toward} was left under this load"),
            Reason::Ineffective { toward } => {
                write!(f, "held: the last step toward {toward} did not help")
            }
            Reason::Conflict {
                wait_share,
                spread_gain,
            } => write!(
                f,
                "conflict: lock wait {:.1}% against {:.1}% to gain by spreading",
                pct(*wait_share),
                pct(*spread_gain)
            ),
            Reason::LockContention {
                pool_cpus,
                wait_share,
                contended_share,
            } => write!(
                f,
                "lock contention: pool of {pool_cpus} CPUs waits {:.1}% (contended {:.0}%)",
                pct(*wait_share),
                pct(*contended_share)
            ),
            Reason::Imbalance {
                saturated_cpus,
                idle_cpus,
                saturated_busy,
                idle_busy,
            } => write!(
                f,
                "imbalance: {saturated_cpus} CPUs {:.0}% busy, {idle_cpus} CPUs {:.0}% busy",
                pct(*saturated_busy),
                pct(*idle_busy)
            ),
            Reason::StrictStarves {
                saturated_cpus,
                idle_cpus,
            } => write!(
                f,
                "strict starves: {saturated_cpus} CPUs saturated, {idle_cpus} idle"
            ),
            Reason::Spill { off_llc_share } => {
                write!(
                    f,
                    "spill: {:.0}% of items ran off their LLC",
                    pct(*off_llc_share)
                )
            }
            Reason::Regressed { before, after } => {
                write!(f, "regressed: {before:.0} -> {after:.0} items/s")
            }
        }
    }
}

/// A switch the controller made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Switch {
    /// The window (counted from 1) it was made in.
    pub window: u64,
    /// Scope before.
    pub from: Scope,
    /// Scope after.
    pub to: Scope,
    /// Strictness after.
    pub strict: bool,
    /// Why.
    pub reason: Reason,
}

/// What to use after a window.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The concrete scope to use.
    pub scope: Scope,
    /// Whether pools are strict.
    pub strict: bool,
    /// Whether this differs from what was in force.
    pub switched: bool,
    /// Why.
    pub reason: Reason,
}

/// The load a switch was made under: arrival share per node and arrival rate.
#[derive(Clone, Debug, PartialEq)]
struct Load {
    shares: Vec<f64>,
    rate: f64,
}

impl Load {
    fn same(&self, other: &Load, tolerance: f64) -> bool {
        let spread: f64 = self
            .shares
            .iter()
            .zip(&other.shares)
            .map(|(a, b)| (a - b).abs())
            .sum();
        let (lo, hi) = (self.rate.min(other.rate), self.rate.max(other.rate));
        spread <= tolerance && (hi == 0.0 || lo / hi >= 1.0 - tolerance)
    }
}

/// Which way a switch went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Narrower,
    Wider,
    /// Strict to non-strict, same rung.
    Relax,
    /// Back to where a regressed switch came from.
    Revert,
}

/// The problem a switch addresses, measured before and after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Problem {
    /// The hottest lock's wait share.
    Lock,
    /// Busy share of the busiest pod minus that of the idlest.
    Spread,
    /// Share of items run outside their LLC.
    Spill,
    /// Nothing to measure (a revert).
    None,
}

impl Problem {
    fn size(self, s: &Signals) -> f64 {
        match self {
            Problem::Lock => s.hot_lock.map_or(0.0, |(_, wait, _)| wait),
            Problem::Spread => s.busy_spread,
            Problem::Spill => s.off_llc_share,
            Problem::None => 0.0,
        }
    }
}

/// A switch remembered with its load.
#[derive(Clone, Debug, PartialEq)]
struct Memory {
    from: usize,
    from_strict: bool,
    to: usize,
    to_strict: bool,
    direction: Direction,
    /// The load measured after the switch (before it, until the dwell has passed).
    load: Load,
    /// Whether the switch reduced the problem it was made for.
    effective: bool,
    /// What the switch fixed, to refuse later switches that would bring it back.
    fixed: Fixed,
}

/// What a switch fixed.
#[derive(Clone, Debug, PartialEq)]
enum Fixed {
    /// A wider scope joined these saturated CPUs with these idle ones: a narrower rung
    /// with no pod that joins them would split them again.
    Joined { saturated: CpuSet, idle: CpuSet },
    /// A narrower scope split a hot pool of this many CPUs: a wider rung with pods this
    /// large would bring it back.
    Split { width: usize },
    /// Nothing beyond the switch itself.
    Switch,
}

/// A switch whose outcome is still to be judged.
#[derive(Clone, Debug, PartialEq)]
struct Eval {
    from: usize,
    from_strict: bool,
    items_per_s_before: f64,
    problem: Problem,
    problem_before: f64,
}

/// Items/s and problem size summed over the windows judged since the last switch.
#[derive(Clone, Debug, Default, PartialEq)]
struct Judged {
    windows: u64,
    items_per_s: f64,
    problem: f64,
    arrivals: Vec<f64>,
    rate: f64,
}

impl Judged {
    fn mean(&self) -> f64 {
        if self.windows == 0 {
            0.0
        } else {
            self.items_per_s / self.windows as f64
        }
    }

    fn load(&self) -> Load {
        let n = self.windows.max(1) as f64;
        Load {
            shares: self.arrivals.iter().map(|a| a / n).collect(),
            rate: self.rate / n,
        }
    }
}

/// A proposal being confirmed.
#[derive(Clone, Debug, PartialEq)]
struct Pending {
    to: usize,
    strict: bool,
    seen: u32,
}

/// The controller's state between windows: a plain value, passed to [`decide`] and
/// returned by it. Start one with [`Ladder::start`].
#[derive(Clone, Debug, PartialEq)]
pub struct AutoState {
    rung: usize,
    strict: bool,
    windows: u64,
    since_switch: u64,
    switches: u64,
    pending: Option<Pending>,
    /// Windows of the switches within the rate limit's span.
    recent: Vec<u64>,
    last: Option<Switch>,
    judged: Judged,
    eval: Option<Eval>,
    /// Items/s of the last `confirm_windows` judged windows: the baseline a switch is
    /// judged against is measured under the load that asked for it, not under an
    /// earlier one.
    recent_rates: Vec<f64>,
    memory: Vec<Memory>,
}

impl AutoState {
    /// A controller at `rung` with strictness `strict` that has seen no window.
    fn at(rung: usize, strict: bool) -> AutoState {
        AutoState {
            rung,
            strict,
            windows: 0,
            since_switch: u64::MAX / 2,
            switches: 0,
            pending: None,
            recent: Vec::new(),
            last: None,
            judged: Judged::default(),
            eval: None,
            recent_rates: Vec::new(),
            memory: Vec::new(),
        }
    }

    /// The rung in force.
    pub fn rung(&self) -> usize {
        self.rung
    }

    /// Whether pools are strict.
    pub fn strict(&self) -> bool {
        self.strict
    }

    /// Switches made.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Windows seen.
    pub fn windows(&self) -> u64 {
        self.windows
    }

    /// The last switch.
    pub fn last_switch(&self) -> Option<&Switch> {
        self.last.as_ref()
    }
}

/// What one window shows.
#[derive(Clone, Debug, PartialEq)]
struct Signals {
    items_per_s: f64,
    /// The hottest lock: (pod CPUs, wait share, contended share).
    hot_lock: Option<(usize, f64, f64)>,
    /// Saturated pods' CPUs and mean busy share.
    saturated: CpuSet,
    saturated_busy: f64,
    /// Idle pods' CPUs and mean busy share.
    idle: CpuSet,
    idle_busy: f64,
    /// Busy share spread between the busiest and the idlest pod.
    busy_spread: f64,
    off_llc_share: f64,
    arrivals: Vec<f64>,
    arrival_rate: f64,
}

fn signals(ladder: &Ladder, rung: usize, config: &AutoConfig, window: &Window) -> Signals {
    let secs = window.duration_ns.max(1) as f64 / 1e9;
    let capacity = |w: &PodWindow| window.duration_ns.max(1) as f64 * w.capacity.max(1) as f64;
    let pods = &ladder.rungs[rung].pods;
    let by_cpus: HashMap<&CpuSet, &PodWindow> = window.pods.iter().map(|w| (&w.cpus, w)).collect();
    let measured = |pod: &CpuSet| by_cpus.get(pod).copied();
    let mut hot_lock: Option<(usize, f64, f64)> = None;
    let (mut saturated, mut idle) = (CpuSet::new(), CpuSet::new());
    let (mut sat_busy, mut idle_busy) = (0.0, 0.0);
    let (mut busiest, mut idlest) = (0.0f64, f64::MAX);
    let mut arrivals = vec![0.0; ladder.nodes.len()];
    let mut queued_total = 0u64;
    for pod in pods {
        let w = measured(pod);
        let busy = w.map_or(0.0, |w| w.busy_ns as f64 / capacity(w));
        busiest = busiest.max(busy);
        idlest = idlest.min(busy);
        let Some(w) = w else {
            idle = idle.union(pod);
            continue;
        };
        if w.lock_acquisitions >= config.min_acquisitions {
            let wait = w.lock_wait_ns as f64 / capacity(w);
            if hot_lock.map_or(true, |(_, best, _)| wait > best) {
                let contended = w.lock_contended as f64 / w.lock_acquisitions as f64;
                hot_lock = Some((pod.len(), wait, contended));
            }
        }
        if busy >= config.saturated_busy || w.backlog > w.started.max(pod.len() as u64) {
            sat_busy += busy * pod.len() as f64;
            saturated = saturated.union(pod);
        } else if busy <= config.idle_busy && w.backlog == 0 {
            idle_busy += busy * pod.len() as f64;
            idle = idle.union(pod);
        }
        queued_total += w.queued;
        if let Some(i) = ladder
            .node_of(pod)
            .and_then(|n| ladder.nodes.iter().position(|&m| m == n))
        {
            arrivals[i] += w.queued as f64;
        }
    }
    if queued_total > 0 {
        for a in &mut arrivals {
            *a /= queued_total as f64;
        }
    }
    let placed = window.places.same_llc + window.places.off_llc;
    Signals {
        items_per_s: window.completed as f64 / secs,
        hot_lock,
        saturated_busy: sat_busy / saturated.len().max(1) as f64,
        saturated,
        idle_busy: idle_busy / idle.len().max(1) as f64,
        idle,
        busy_spread: if idlest == f64::MAX {
            0.0
        } else {
            busiest - idlest
        },
        off_llc_share: if placed == 0 {
            0.0
        } else {
            window.places.off_llc as f64 / placed as f64
        },
        arrivals,
        arrival_rate: queued_total as f64 / secs,
    }
}

/// What the signals ask for: a target rung, strictness, the reason, which way it goes
/// and the problem it addresses (to judge the outcome).
struct Proposal {
    to: usize,
    strict: bool,
    reason: Reason,
    direction: Direction,
    problem: Problem,
    fixed: Fixed,
}

fn propose(
    ladder: &Ladder,
    state: &AutoState,
    config: &AutoConfig,
    s: &Signals,
) -> Result<Proposal, Reason> {
    let rung = state.rung;
    let mut hot = s
        .hot_lock
        .filter(|&(_, wait, _)| wait >= config.lock_wait_enter);
    let idle_enough = s.idle.len() as f64 >= config.min_idle_share * s.saturated.len() as f64;
    let mut imbalanced = !s.saturated.is_empty() && !s.idle.is_empty() && idle_enough;
    // The narrowest wider rung with a pod joining saturated CPUs and idle ones.
    let joining = (rung + 1..ladder.rungs.len()).find(|&r| {
        ladder.rungs[r]
            .pods
            .iter()
            .any(|p| p.intersects(&s.saturated) && p.intersects(&s.idle))
    });
    // Both at once: each fix worsens the other. Weigh what the lock costs (the share of
    // the pool's time spent waiting) against what spreading could gain (the busy gap
    // times the idle share of the CPUs); act only on a clear winner.
    if let (Some((_, wait, _)), true) = (hot, imbalanced && (state.strict || joining.is_some())) {
        let idle_share = s.idle.len() as f64 / (s.idle.len() + s.saturated.len()) as f64;
        let spread_gain = (s.saturated_busy - s.idle_busy).max(0.0) * idle_share;
        if spread_gain >= 2.0 * wait {
            hot = None;
        } else if wait >= 2.0 * spread_gain {
            imbalanced = false;
        } else {
            return Err(Reason::Conflict {
                wait_share: wait,
                spread_gain,
            });
        }
    }
    if imbalanced && state.strict {
        return Ok(Proposal {
            to: rung,
            strict: false,
            reason: Reason::StrictStarves {
                saturated_cpus: s.saturated.len(),
                idle_cpus: s.idle.len(),
            },
            direction: Direction::Relax,
            problem: Problem::Spread,
            fixed: Fixed::Switch,
        });
    }
    if let (true, Some(to)) = (imbalanced, joining) {
        return Ok(Proposal {
            to,
            strict: state.strict,
            reason: Reason::Imbalance {
                saturated_cpus: s.saturated.len(),
                idle_cpus: s.idle.len(),
                saturated_busy: s.saturated_busy,
                idle_busy: s.idle_busy,
            },
            direction: Direction::Wider,
            problem: Problem::Spread,
            fixed: Fixed::Joined {
                saturated: s.saturated.clone(),
                idle: s.idle.clone(),
            },
        });
    }
    if let (Some((pool_cpus, wait_share, contended_share)), true) = (hot, rung > 0) {
        return Ok(Proposal {
            to: rung - 1,
            strict: state.strict,
            reason: Reason::LockContention {
                pool_cpus,
                wait_share,
                contended_share,
            },
            direction: Direction::Narrower,
            problem: Problem::Lock,
            fixed: Fixed::Split { width: pool_cpus },
        });
    }
    if s.saturated.is_empty() && s.off_llc_share >= config.spill_share && rung > 0 {
        return Ok(Proposal {
            to: rung - 1,
            strict: state.strict,
            reason: Reason::Spill {
                off_llc_share: s.off_llc_share,
            },
            direction: Direction::Narrower,
            problem: Problem::Spill,
            fixed: Fixed::Switch,
        });
    }
    Err(Reason::Steady)
}

/// One window's decision: feed the window measured under the scope in force and the
/// state the previous call returned; use the returned decision until the next window.
pub fn decide(
    ladder: &Ladder,
    config: &AutoConfig,
    mut state: AutoState,
    window: &Window,
) -> (AutoState, Decision) {
    state.windows += 1;
    state.since_switch = state.since_switch.saturating_add(1);
    let rung = state.rung.min(ladder.rungs.len().saturating_sub(1));
    state.rung = rung;
    let stay = |state: AutoState, reason: Reason| {
        let decision = Decision {
            scope: ladder.rungs[state.rung].scope,
            strict: state.strict,
            switched: false,
            reason,
        };
        (state, decision)
    };
    if window.completed < config.min_items {
        state.pending = None;
        let completed = window.completed;
        return stay(state, Reason::Quiet { completed });
    }
    let s = signals(ladder, rung, config, window);
    state.judged.windows += 1;
    state.judged.items_per_s += s.items_per_s;
    if state.recent_rates.len() >= config.confirm_windows.max(1) as usize {
        state.recent_rates.remove(0);
    }
    state.recent_rates.push(s.items_per_s);
    state.judged.problem += state.eval.as_ref().map_or(0.0, |e| e.problem.size(&s));
    if state.judged.arrivals.len() != s.arrivals.len() {
        state.judged.arrivals = vec![0.0; s.arrivals.len()];
    }
    for (sum, a) in state.judged.arrivals.iter_mut().zip(&s.arrivals) {
        *sum += a;
    }
    state.judged.rate += s.arrival_rate;
    let dwell = u64::from(config.min_dwell_windows);
    let collapsed = state.eval.as_ref().is_some_and(|e| {
        state.judged.windows >= u64::from(config.confirm_windows)
            && state.judged.mean() < e.items_per_s_before * config.collapse
    });
    if state.since_switch < dwell && !collapsed {
        let left = dwell - state.since_switch;
        return stay(state, Reason::Dwelling { left });
    }
    // The dwell after a switch is over: judge it.
    if let Some(eval) = state.eval.take() {
        let after = state.judged.mean();
        let load = state.judged.load();
        let problem_after = state.judged.problem / state.judged.windows.max(1) as f64;
        if let Some(m) = state.memory.last_mut() {
            m.load = load;
            m.effective = problem_after <= eval.problem_before * (1.0 - config.min_gain);
        }
        let reverting = state.memory.last().map(|m| m.direction) == Some(Direction::Revert);
        let regressed = after < eval.items_per_s_before * (1.0 - config.regression);
        if regressed && !reverting {
            let reason = Reason::Regressed {
                before: eval.items_per_s_before,
                after,
            };
            let proposal = Proposal {
                to: eval.from,
                strict: eval.from_strict,
                reason,
                direction: Direction::Revert,
                problem: Problem::None,
                fixed: Fixed::Switch,
            };
            if let Some(limited) = rate_limited(&mut state, config) {
                return stay(state, limited);
            }
            return switch(ladder, state, proposal, &s);
        }
    }
    // Only a collapse ends the dwell early, and only to revert.
    if state.since_switch < dwell {
        let left = dwell - state.since_switch;
        return stay(state, Reason::Dwelling { left });
    }
    let proposal = match propose(ladder, &state, config, &s) {
        Ok(p) => p,
        Err(reason) => {
            // Hysteresis: a lock between the exit and enter thresholds keeps the count.
            let lukewarm = s
                .hot_lock
                .is_some_and(|(_, w, _)| w >= config.lock_wait_exit)
                && reason == Reason::Steady;
            if !lukewarm {
                state.pending = None;
            }
            return stay(state, reason);
        }
    };
    let now = Load {
        shares: s.arrivals.clone(),
        rate: s.arrival_rate,
    };
    let toward = ladder.rungs[proposal.to].scope;
    let target = &ladder.rungs[proposal.to];
    let undoes = state.memory.iter().any(|m| {
        if !m.load.same(&now, config.same_load) {
            return false;
        }
        let exact = m.from == proposal.to
            && m.from_strict == proposal.strict
            && m.to == rung
            && m.to_strict == state.strict;
        exact
            || match (&m.fixed, proposal.direction) {
                (Fixed::Joined { saturated, idle }, Direction::Narrower) => !target
                    .pods
                    .iter()
                    .any(|p| p.intersects(saturated) && p.intersects(idle)),
                (Fixed::Split { width }, Direction::Wider) => {
                    target.pods.iter().any(|p| p.len() >= *width)
                }
                _ => false,
            }
    });
    if undoes {
        state.pending = None;
        return stay(state, Reason::Held { toward });
    }
    let futile = state.memory.last().is_some_and(|m| {
        m.to == rung
            && m.direction == proposal.direction
            && !m.effective
            && m.load.same(&now, config.same_load)
    });
    if futile {
        state.pending = None;
        return stay(state, Reason::Ineffective { toward });
    }
    let seen = match &state.pending {
        Some(p) if p.to == proposal.to && p.strict == proposal.strict => p.seen + 1,
        _ => 1,
    };
    state.pending = Some(Pending {
        to: proposal.to,
        strict: proposal.strict,
        seen,
    });
    if seen < config.confirm_windows {
        return stay(state, Reason::Confirming { toward, seen });
    }
    if let Some(limited) = rate_limited(&mut state, config) {
        return stay(state, limited);
    }
    switch(ladder, state, proposal, &s)
}

/// `Some(reason)` when the rate limit forbids a switch now.
fn rate_limited(state: &mut AutoState, config: &AutoConfig) -> Option<Reason> {
    let span = u64::from(config.rate_windows);
    let now = state.windows;
    state.recent.retain(|&w| now - w < span);
    let switches = state.recent.len() as u32;
    (switches >= config.max_switches).then_some(Reason::RateLimited { switches })
}

fn switch(
    ladder: &Ladder,
    mut state: AutoState,
    proposal: Proposal,
    s: &Signals,
) -> (AutoState, Decision) {
    let from = state.rung;
    let before = state.judged.load();
    state.eval = Some(Eval {
        from,
        from_strict: state.strict,
        items_per_s_before: state.recent_rates.iter().sum::<f64>()
            / state.recent_rates.len().max(1) as f64,
        problem: proposal.problem,
        problem_before: proposal.problem.size(s),
    });
    let from_strict = state.strict;
    state.memory.retain(|m| {
        !(m.from == from
            && m.from_strict == from_strict
            && m.to == proposal.to
            && m.to_strict == proposal.strict)
    });
    state.memory.push(Memory {
        from,
        from_strict,
        to: proposal.to,
        to_strict: proposal.strict,
        direction: proposal.direction,
        load: before,
        effective: true,
        fixed: proposal.fixed,
    });
    // One memory per pair of (rung, strictness): bounded by the ladder's size.
    let bound = 4 * ladder.rungs.len() * ladder.rungs.len() + 2;
    if state.memory.len() > bound {
        state.memory.remove(0);
    }
    state.rung = proposal.to;
    state.strict = proposal.strict;
    state.since_switch = 0;
    state.switches += 1;
    state.recent.push(state.windows);
    state.pending = None;
    state.judged = Judged::default();
    state.recent_rates.clear();
    let record = Switch {
        window: state.windows,
        from: ladder.rungs[from].scope,
        to: ladder.rungs[proposal.to].scope,
        strict: proposal.strict,
        reason: proposal.reason.clone(),
    };
    state.last = Some(record);
    let decision = Decision {
        scope: ladder.rungs[state.rung].scope,
        strict: state.strict,
        switched: true,
        reason: proposal.reason,
    };
    (state, decision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use podq_topology::Topology;
    use proptest::prelude::*;

    const WINDOW_NS: u64 = 100_000_000;

    fn ladder(shape: &str) -> (Topology, Ladder) {
        let topology = Topology::synthetic(shape).unwrap();
        let ladder = Ladder::new(&topology, topology.usable()).unwrap();
        (topology, ladder)
    }

    /// A pod's window: busy share, backlog, lock-wait share, contended share, arrivals.
    fn pod(cpus: &CpuSet, busy: f64, backlog: u64, wait: f64, contended: f64) -> PodWindow {
        let capacity = WINDOW_NS as f64 * cpus.len() as f64;
        let queued = if busy > 0.0 { 1000 } else { 0 };
        PodWindow {
            cpus: cpus.clone(),
            capacity: cpus.len(),
            queued,
            started: queued,
            backlog,
            busy_ns: (busy * capacity) as u64,
            lock_acquisitions: 2 * queued,
            lock_contended: (contended * 2.0 * queued as f64) as u64,
            lock_wait_ns: (wait * capacity) as u64,
        }
    }

    /// Items a plant's workload finishes per window, whatever the scope.
    const ITEMS: u64 = 10_000;

    /// The window of a workload under the rung in force: `f` gives each pod's numbers;
    /// the `ITEMS` arrivals are shared out in proportion to the pods' busy time.
    fn window(ladder: &Ladder, state: &AutoState, f: impl Fn(&CpuSet) -> PodWindow) -> Window {
        let mut pods: Vec<PodWindow> = ladder.rungs()[state.rung()].pods.iter().map(f).collect();
        let busy: u64 = pods.iter().map(|p| p.busy_ns).sum();
        for p in &mut pods {
            let queued = (ITEMS as u128 * p.busy_ns as u128 / busy.max(1) as u128) as u64;
            let contended = p.lock_contended as f64 / p.lock_acquisitions.max(1) as f64;
            p.queued = queued;
            p.started = queued;
            p.lock_acquisitions = 2 * queued;
            p.lock_contended = (contended * 2.0 * queued as f64) as u64;
        }
        Window {
            duration_ns: WINDOW_NS,
            completed: ITEMS,
            pods,
            places: PlaceCounts::default(),
        }
    }

    /// Runs `n` windows of `plant` and returns the state and every switch.
    fn run(
        ladder: &Ladder,
        config: &AutoConfig,
        mut state: AutoState,
        n: usize,
        plant: impl Fn(&AutoState) -> Window,
    ) -> (AutoState, Vec<Switch>) {
        let mut switches = Vec::new();
        for _ in 0..n {
            let w = plant(&state);
            let (next, decision) = decide(ladder, config, state, &w);
            state = next;
            if decision.switched {
                switches.push(state.last_switch().unwrap().clone());
            }
        }
        (state, switches)
    }

    /// The 12-core single-L3 case: one pool whose lock costs 20% of its CPUs' time,
    /// shrinking with the pool's size. Narrower twice, then steady.
    #[test]
    fn contention_on_one_wide_pool_narrows() {
        let (_, ladder) = ladder("1s12c");
        let config = AutoConfig::default();
        let plant = |s: &AutoState| {
            window(&ladder, s, |p| {
                let wait = 0.2 * (p.len() - 1) as f64 / 11.0;
                pod(p, 0.6, 0, wait, 0.5)
            })
        };
        let mut st = ladder.start(Scope::System, false);
        let mut reasons = Vec::new();
        for _ in 0..3 {
            let w = plant(&st);
            let (next, d) = decide(&ladder, &config, st, &w);
            st = next;
            reasons.push((d.scope, d.switched, d.reason));
        }
        assert_eq!(
            reasons,
            [
                (
                    Scope::Cache,
                    false,
                    Reason::Confirming {
                        toward: Scope::CacheShard,
                        seen: 1
                    }
                ),
                (
                    Scope::Cache,
                    false,
                    Reason::Confirming {
                        toward: Scope::CacheShard,
                        seen: 2
                    }
                ),
                (
                    Scope::CacheShard,
                    true,
                    Reason::LockContention {
                        pool_cpus: 12,
                        wait_share: 0.2,
                        contended_share: 0.5
                    }
                ),
            ]
        );
        let (st, switches) = run(&ladder, &config, st, 10_000, plant);
        assert_eq!(switches.len(), 1, "{switches:?}");
        assert_eq!(switches[0].window, 15);
        assert_eq!(
            (switches[0].from, switches[0].to),
            (Scope::CacheShard, Scope::Cpu)
        );
        assert!(matches!(
            switches[0].reason,
            Reason::LockContention { pool_cpus: 6, .. }
        ));
        assert_eq!(st.switches(), 2);
    }

    /// A pile on node 0: its pods saturated with a backlog, node 1 idle. Under a scope
    /// whose pods span both nodes the same work is spread over them.
    fn piled_on_node0(topology: &Topology) -> impl Fn(&CpuSet) -> PodWindow + '_ {
        move |p: &CpuSet| {
            let nodes: Vec<usize> = p.iter().filter_map(|c| topology.node_of(c)).collect();
            if nodes.iter().all(|&n| n == 0) {
                pod(p, 0.875, 500, 0.0, 0.0)
            } else if nodes.iter().all(|&n| n == 1) {
                pod(p, 0.0625, 0, 0.0, 0.0)
            } else {
                pod(p, 0.5, 0, 0.01, 0.1)
            }
        }
    }

    /// Every completion queue on node 0 of 2 × 24c × SMT2 under `smt`: wider, straight
    /// to the narrowest scope that joins node 0 with node 1.
    #[test]
    fn saturated_node_beside_an_idle_one_widens() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let plant = |s: &AutoState| window(&ladder, s, piled_on_node0(&topology));
        let (st, switches) = run(
            &ladder,
            &config,
            ladder.start(Scope::Smt, false),
            10_000,
            plant,
        );
        assert_eq!(switches.len(), 1, "{switches:?}");
        assert_eq!(
            switches[0],
            Switch {
                window: 3,
                from: Scope::Smt,
                to: Scope::System,
                strict: false,
                reason: Reason::Imbalance {
                    saturated_cpus: 48,
                    idle_cpus: 48,
                    saturated_busy: 0.875,
                    idle_busy: 0.0625,
                },
            }
        );
        assert_eq!(st.switches(), 1);
    }

    /// The same pile with strict pods: first non-strict (the pods may then spill), then
    /// wider once the dwell has passed and the imbalance is still there.
    #[test]
    fn strict_pods_that_starve_are_relaxed_first() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let plant = |s: &AutoState| window(&ladder, s, piled_on_node0(&topology));
        let (_, switches) = run(&ladder, &config, ladder.start(Scope::Smt, true), 100, plant);
        let got: Vec<(u64, Scope, Scope, bool)> = switches
            .iter()
            .map(|s| (s.window, s.from, s.to, s.strict))
            .collect();
        assert_eq!(
            got,
            [
                (3, Scope::Smt, Scope::Smt, false),
                (15, Scope::Smt, Scope::System, false)
            ]
        );
        assert_eq!(
            switches[0].reason,
            Reason::StrictStarves {
                saturated_cpus: 48,
                idle_cpus: 48
            }
        );
    }

    /// Relaxing strictness that costs throughput is reverted once and not tried again
    /// under the same load.
    #[test]
    fn a_regressing_relax_is_not_retried() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let piled = piled_on_node0(&topology);
        let plant = |s: &AutoState| {
            let mut w = window(&ladder, s, &piled);
            w.completed = if s.strict() { ITEMS } else { 9_000 };
            w
        };
        let (st, switches) = run(
            &ladder,
            &config,
            ladder.start(Scope::Smt, true),
            10_000,
            plant,
        );
        let got: Vec<(u64, bool)> = switches.iter().map(|s| (s.window, s.strict)).collect();
        assert_eq!(got, [(3, false), (13, true)], "{switches:?}");
        let (_, d) = decide(&ladder, &config, st.clone(), &plant(&st));
        assert_eq!(d.reason, Reason::Held { toward: Scope::Smt });
    }

    /// A balanced load that fits: nothing to fix, under every scope.
    #[test]
    fn a_balanced_load_never_switches() {
        let (_, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        for scope in Scope::CONCRETE {
            let plant = |s: &AutoState| window(&ladder, s, |p| pod(p, 0.6, 0, 0.01, 0.05));
            let (st, switches) = run(&ladder, &config, ladder.start(scope, false), 2_000, plant);
            assert!(switches.is_empty(), "{scope}: {switches:?}");
            let (_, d) = decide(&ladder, &config, st, &plant(&ladder.start(scope, false)));
            assert_eq!(d.reason, Reason::Steady);
        }
    }

    type PodFn<'a> = Box<dyn Fn(&CpuSet) -> PodWindow + 'a>;

    /// 10 000 windows of one steady signal, fed literally (the same numbers whatever the
    /// scope), give at most one switch: for each classic signal and starting scope.
    #[test]
    fn a_steady_signal_switches_at_most_once() {
        for shape in ["2s24c2t", "1s12c"] {
            let (topology, ladder) = ladder(shape);
            let config = AutoConfig::default();
            let signals: [(&str, PodFn<'_>); 4] = [
                ("contended", Box::new(|p| pod(p, 0.6, 0, 0.2, 0.5))),
                ("piled", Box::new(piled_on_node0(&topology))),
                ("saturated", Box::new(|p| pod(p, 0.99, 10_000, 0.0, 0.0))),
                ("lukewarm", Box::new(|p| pod(p, 0.5, 0, 0.04, 0.3))),
            ];
            for (name, signal) in &signals {
                for scope in Scope::CONCRETE {
                    let plant = |s: &AutoState| window(&ladder, s, signal);
                    let start = ladder.start(scope, false);
                    let (_, switches) = run(&ladder, &config, start, 10_000, plant);
                    assert!(
                        switches.len() <= 1,
                        "{shape} {name} from {scope}: {switches:?}"
                    );
                }
            }
        }
    }

    /// A load where narrow scopes starve a node and the one scope that joins the nodes
    /// has a hot lock: it settles after one switch instead of going back and forth.
    #[test]
    fn opposing_problems_do_not_oscillate() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let piled = piled_on_node0(&topology);
        let plant = |s: &AutoState| {
            window(&ladder, s, |p| {
                if p.len() == 96 {
                    pod(p, 0.6, 0, 0.15, 0.6)
                } else {
                    piled(p)
                }
            })
        };
        let (st, switches) = run(
            &ladder,
            &config,
            ladder.start(Scope::Smt, false),
            10_000,
            plant,
        );
        assert_eq!(switches.len(), 1, "{switches:?}");
        let (_, d) = decide(&ladder, &config, st.clone(), &plant(&st));
        assert_eq!(
            d.reason,
            Reason::Held {
                toward: Scope::Cache
            }
        );
    }

    /// Contention and imbalance at once: the heavier one decides, a tie holds.
    #[test]
    fn contention_against_imbalance_is_weighed() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let start = ladder.start(Scope::CacheShard, false);
        let decide_with = |wait: f64| {
            let w = window(&ladder, &start, |p| {
                let mut pod = piled_on_node0(&topology)(p);
                if pod.busy_ns > 0 && pod.backlog > 0 {
                    pod.lock_wait_ns = (wait * WINDOW_NS as f64 * p.len() as f64) as u64;
                }
                pod
            });
            let mut st = start.clone();
            let mut last = None;
            for _ in 0..3 {
                let (next, d) = decide(&ladder, &config, st, &w);
                st = next;
                last = Some(d);
            }
            last.unwrap()
        };
        // Spreading gains (0.875 - 0.0625) * 1/2 = 40.6%.
        let widen = decide_with(0.1);
        assert_eq!((widen.switched, widen.scope), (true, Scope::System));
        let narrow = decide_with(0.9);
        assert_eq!((narrow.switched, narrow.scope), (true, Scope::Smt));
        let tie = decide_with(0.4);
        assert!(!tie.switched);
        assert!(
            matches!(tie.reason, Reason::Conflict { .. }),
            "{:?}",
            tie.reason
        );
    }

    /// The 12-core box's one pool, contended at 12 CPUs, whose narrower pools finish
    /// only `narrower` items a window (a plant where the lock is not what limits
    /// throughput).
    fn contended_but_narrower_is_slower(
        ladder: &Ladder,
        narrower: u64,
    ) -> impl Fn(&AutoState) -> Window + Copy + '_ {
        move |s: &AutoState| {
            let mut w = window(ladder, s, |p| {
                pod(p, 0.6, 0, if p.len() == 12 { 0.2 } else { 0.0 }, 0.5)
            });
            w.completed = if s.rung() == 2 { ITEMS } else { narrower };
            w
        }
    }

    /// A switch that costs throughput is reverted after the dwell, and not tried again
    /// under the same load.
    #[test]
    fn a_regressing_switch_is_reverted_once() {
        let (_, ladder) = ladder("1s12c");
        let config = AutoConfig::default();
        let plant = contended_but_narrower_is_slower(&ladder, 8_000);
        let (st, switches) = run(
            &ladder,
            &config,
            ladder.start(Scope::Cache, false),
            10_000,
            plant,
        );
        let got: Vec<(u64, Scope, Scope)> =
            switches.iter().map(|s| (s.window, s.from, s.to)).collect();
        assert_eq!(
            got,
            [
                (3, Scope::Cache, Scope::CacheShard),
                (13, Scope::CacheShard, Scope::Cache)
            ]
        );
        assert_eq!(
            switches[1].reason,
            Reason::Regressed {
                before: 100_000.0,
                after: 80_000.0
            }
        );
        let (_, d) = decide(&ladder, &config, st.clone(), &plant(&st));
        assert_eq!(
            d.reason,
            Reason::Held {
                toward: Scope::CacheShard
            }
        );
    }

    /// A switch that collapses throughput is reverted after the confirmation windows,
    /// before the dwell is over, and not tried again under the same load.
    #[test]
    fn a_collapsing_switch_is_reverted_at_once() {
        let (_, ladder) = ladder("1s12c");
        let config = AutoConfig::default();
        let plant = contended_but_narrower_is_slower(&ladder, 3_000);
        let (_, switches) = run(
            &ladder,
            &config,
            ladder.start(Scope::Cache, false),
            10_000,
            plant,
        );
        let got: Vec<(u64, Scope)> = switches.iter().map(|s| (s.window, s.to)).collect();
        assert_eq!(got, [(3, Scope::CacheShard), (6, Scope::Cache)]);
        assert_eq!(
            switches[1].reason,
            Reason::Regressed {
                before: 100_000.0,
                after: 30_000.0
            }
        );
    }

    /// The baseline of a switch is measured under the load that asked for it: a load
    /// that moved (and lowered items/s) before the switch does not make the switch look
    /// like a regression.
    #[test]
    fn a_switch_is_judged_against_the_load_that_asked_for_it() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let piled = piled_on_node0(&topology);
        let spread = |s: &AutoState| {
            let mut w = window(&ladder, s, |p| pod(p, 0.6, 0, 0.0, 0.0));
            w.completed = 2 * ITEMS;
            w
        };
        let (st, before) = run(
            &ladder,
            &config,
            ladder.start(Scope::Cache, false),
            300,
            spread,
        );
        assert!(before.is_empty());
        // Piled: fewer items/s under every scope, a few more once spread over both nodes.
        let plant = |s: &AutoState| {
            let mut w = window(&ladder, s, &piled);
            w.completed = if s.rung() == 4 { ITEMS + 500 } else { ITEMS };
            w
        };
        let (_, after) = run(&ladder, &config, st, 1_000, plant);
        let got: Vec<(u64, Scope)> = after.iter().map(|s| (s.window, s.to)).collect();
        assert_eq!(got, [(303, Scope::System)], "{after:?}");
    }

    /// Quiet windows are not judged and break a confirmation.
    #[test]
    fn quiet_windows_are_not_judged() {
        let (_, ladder) = ladder("1s12c");
        let config = AutoConfig::default();
        let st = ladder.start(Scope::Cache, false);
        let hot = window(&ladder, &st, |p| pod(p, 0.6, 0, 0.2, 0.5));
        let quiet = Window {
            completed: 10,
            ..hot.clone()
        };
        let mut st = st;
        let mut reasons = Vec::new();
        for w in [&hot, &hot, &quiet, &hot, &hot] {
            let (next, d) = decide(&ladder, &config, st, w);
            st = next;
            reasons.push(d.reason);
        }
        let toward = Scope::CacheShard;
        assert_eq!(
            reasons[..4],
            [
                Reason::Confirming { toward, seen: 1 },
                Reason::Confirming { toward, seen: 2 },
                Reason::Quiet { completed: 10 },
                Reason::Confirming { toward, seen: 1 },
            ]
        );
        assert_eq!(st.switches(), 0);
    }

    /// Hysteresis: a lock between the exit and enter thresholds keeps a confirmation
    /// going; one below the exit threshold restarts it.
    #[test]
    fn lock_thresholds_have_hysteresis() {
        let (_, ladder) = ladder("1s12c");
        let config = AutoConfig::default();
        let at = |wait: f64| {
            window(&ladder, &ladder.start(Scope::Cache, false), |p| {
                pod(p, 0.6, 0, wait, 0.5)
            })
        };
        let run_seq = |waits: &[f64]| {
            let mut st = ladder.start(Scope::Cache, false);
            for &wait in waits {
                st = decide(&ladder, &config, st, &at(wait)).0;
            }
            st.switches()
        };
        assert_eq!(run_seq(&[0.2, 0.2, 0.03, 0.2]), 1);
        assert_eq!(run_seq(&[0.2, 0.2, 0.01, 0.2]), 0);
        assert_eq!(run_seq(&[0.04, 0.04, 0.04, 0.04]), 0);
    }

    /// A load that moves from spread over both nodes to piled on node 0: `auto` follows
    /// within the confirmation windows.
    #[test]
    fn a_moving_load_is_followed() {
        let (topology, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let piled = piled_on_node0(&topology);
        let (st, before) = run(
            &ladder,
            &config,
            ladder.start(Scope::Smt, false),
            500,
            |s| window(&ladder, s, |p| pod(p, 0.5, 0, 0.0, 0.0)),
        );
        assert!(before.is_empty());
        let (_, after) = run(&ladder, &config, st, 500, |s| window(&ladder, s, &piled));
        assert_eq!(after.len(), 1);
        assert_eq!((after[0].window, after[0].to), (503, Scope::System));
    }

    /// Nothing saturated and most items run off their LLC under a wide scope: narrower.
    #[test]
    fn spill_without_saturation_narrows() {
        let (_, ladder) = ladder("2s24c2t");
        let config = AutoConfig::default();
        let plant = |s: &AutoState| {
            let mut w = window(&ladder, s, |p| pod(p, 0.3, 0, 0.0, 0.0));
            w.places = if s.rung() == 4 {
                PlaceCounts {
                    same_llc: 300,
                    off_llc: 700,
                }
            } else {
                PlaceCounts {
                    same_llc: 1000,
                    off_llc: 0,
                }
            };
            w
        };
        let (_, switches) = run(
            &ladder,
            &config,
            ladder.start(Scope::System, false),
            1000,
            plant,
        );
        assert_eq!(switches.len(), 1);
        assert_eq!(switches[0].to, Scope::Cache);
        assert_eq!(switches[0].reason, Reason::Spill { off_llc_share: 0.7 });
    }

    proptest! {
        /// Whatever the windows say, switches keep the dwell and the rate limit, and the
        /// decision names the rung in force.
        #[test]
        fn switches_keep_dwell_and_rate(
            seq in proptest::collection::vec((0u8..4, 0u8..3, any::<bool>()), 1..400),
        ) {
            let (topology, ladder) = ladder("2s4l8c2t");
            let config = AutoConfig {
                confirm_windows: 1,
                min_dwell_windows: 3,
                max_switches: 2,
                rate_windows: 40,
                ..AutoConfig::default()
            };
            let piled = piled_on_node0(&topology);
            let mut st = ladder.start(Scope::CacheShard, false);
            let mut at: Vec<u64> = Vec::new();
            for (kind, wait, quiet) in seq {
                let w = window(&ladder, &st, |p| match kind {
                    0 => pod(p, 0.6, 0, f64::from(wait) * 0.1, 0.5),
                    1 => piled(p),
                    2 => pod(p, 0.99, 10_000, 0.0, 0.0),
                    _ => pod(p, 0.1, 0, 0.0, 0.0),
                });
                let w = if quiet { Window { completed: 0, ..w } } else { w };
                let (next, d) = decide(&ladder, &config, st, &w);
                st = next;
                prop_assert_eq!(d.scope, ladder.rungs()[st.rung()].scope);
                if d.switched {
                    if let Some(&prev) = at.last() {
                        prop_assert!(st.windows() - prev >= 3);
                    }
                    at.push(st.windows());
                    let span = at.iter().filter(|&&w| st.windows() - w < 40).count();
                    prop_assert!(span <= 2, "{:?}", at);
                }
            }
        }
    }
}
