//! The stall watchdog (the kernel's workqueue lockup detector) and long-item counting.
//!
//! One process-wide thread, `podq/watchdog`, looks at every pool and every running item
//! a few times per threshold (a quarter of the smallest threshold in force, between
//! 1 ms and 1 s). It finds:
//!
//! - a **pending stall**: a pool with items on its worklist where no worker started or
//!   finished an item for the stall threshold (default 30 s, the kernel's
//!   `workqueue.watchdog_thresh`);
//! - a **running stall**: one item running for the stall threshold;
//! - a **long item**: one item running for the long-item threshold (default 1 s;
//!   counted per workqueue, the first [`FIRST_LONG_ITEMS`] kept with their label);
//! - a **CPU-intensive item**: one item running on a pool worker for the CPU-intensive
//!   threshold (default 10 ms, the kernel's `wq_cpu_intensive_thresh_us`): its worker
//!   stops counting towards the pool's running workers, so that the pool may run
//!   another for the items behind it ([`set_cpu_intensive_threshold`]). It looks for
//!   these every half threshold while workers run items, and as rarely as for the
//!   rest once no worker has started one for 100 ms (the next worker woken from idle
//!   wakes it): `pool/README.md`, "Long items".
//!
//! Each stall is reported once (until the pool makes progress or the item ends) through
//! the error hook ([`crate::set_error_hook`], [`Error::Stall`]) and counted in the
//! workqueue's stats ([`WatchdogStats`]); with [`set_panic_on_stall`] the process
//! prints the stall and aborts instead, as the kernel's `panic_on_stall`.
//!
//! The hot path pays nothing for it beyond the two stores per item of `busy.rs`: the
//! watchdog compares each worker's run counter between its looks, so durations are
//! known to within one look (a quarter of the threshold) and count from the first look
//! that saw the item running.
//!
//! Departures from the kernel: the kernel's CPU-intensive rule applies to its per-CPU
//! pools (its unbound pools have no cap to leave) and is checked at the scheduler tick;
//! podq applies it to every pool, from this thread, so a run leaves the count between
//! one and one and a half thresholds after the watchdog first saw it. The long-item
//! threshold only reports, and defaults to 1 s.
//!
//! Legend: A atomic (`Relaxed` settings, pairing with nothing: the watchdog reads them
//! again at every look); WD guarded by its own mutex (`WqWatch::found`, the
//! watchdog's remembered state `state()`; leaves, never held while calling hooks).

use crate::sync::unmodelled::{AtomicBool, AtomicU64, Mutex};
use crate::sync::Ordering::Relaxed;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use podq_topology::CpuSet;
use serde::{Deserialize, Serialize};

use crate::busy::{self, Look};
use crate::pool::{self, LongRuns};
use crate::sync::lock_std as lock;
use crate::workqueue::watch::{watched, Watched};
use crate::workqueue::WqShared;
use crate::Error;

/// The default stall threshold (the kernel's `watchdog_thresh`, 30 s).
pub const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_secs(30);
/// The default long-item threshold.
pub const DEFAULT_LONG_ITEM_THRESHOLD: Duration = Duration::from_secs(1);
/// The shortest threshold accepted.
pub const MIN_THRESHOLD: Duration = Duration::from_millis(1);
/// How many long items a workqueue's stats keep (the first ones).
pub const FIRST_LONG_ITEMS: usize = 8;

/// A: the stall threshold in nanoseconds (0: off).
static STALL_NS: AtomicU64 = AtomicU64::new(DEFAULT_STALL_THRESHOLD.as_nanos() as u64);
/// A: the long-item threshold in nanoseconds (0: off).
static LONG_NS: AtomicU64 = AtomicU64::new(DEFAULT_LONG_ITEM_THRESHOLD.as_nanos() as u64);
/// A: the CPU-intensive threshold in nanoseconds (0: off).
static INTENSIVE_NS: AtomicU64 =
    AtomicU64::new(crate::policy::CPU_INTENSIVE_THRESHOLD.as_nanos() as u64);
/// A: the thresholds changed: the next look at the stalls comes at once.
static RETHINK: AtomicBool = AtomicBool::new(false);
/// A: abort the process on a stall.
static PANIC_ON_STALL: AtomicBool = AtomicBool::new(false);

/// Sets the process-wide stall threshold (`None`: no stall detection), for workqueues
/// without their own ([`crate::WorkqueueBuilder::stall_threshold`]). Refused below
/// 1 ms ([`Error::InvalidWatchdogThreshold`]).
pub fn set_stall_threshold(threshold: Option<Duration>) -> Result<(), Error> {
    store(&STALL_NS, "stall", threshold)
}

/// The process-wide stall threshold.
pub fn stall_threshold() -> Option<Duration> {
    load(&STALL_NS)
}

/// Sets the process-wide long-item threshold (`None`: no long-item counting), for
/// workqueues without their own ([`crate::WorkqueueBuilder::long_item_threshold`]).
/// Refused below 1 ms.
pub fn set_long_item_threshold(threshold: Option<Duration>) -> Result<(), Error> {
    store(&LONG_NS, "long-item", threshold)
}

/// The process-wide long-item threshold.
pub fn long_item_threshold() -> Option<Duration> {
    load(&LONG_NS)
}

/// Sets the process-wide CPU-intensive threshold (`None`: off): a pool worker that has
/// run one item this long stops counting towards its pool's running workers (at most
/// one per pod CPU), so that another worker may run the items queued behind it, as the
/// kernel does for its per-CPU pools (`policy::cpu_intensive`). Default 10 ms; refused
/// below 1 ms. Counted per pool in [`crate::stats::PoolStats::cpu_intensive`].
///
/// The items the worker had taken with that item and not started go back to the front
/// of the pool's worklist for the other workers (counted in
/// [`crate::stats::PoolStats::handed_back`]). At most as many workers as the pool has
/// CPUs are out of the count at a time; an item that waits for another item should
/// still wrap the wait in [`crate::blocking`], which has no such bound and no delay.
pub fn set_cpu_intensive_threshold(threshold: Option<Duration>) -> Result<(), Error> {
    store(&INTENSIVE_NS, "cpu-intensive", threshold)
}

/// The process-wide CPU-intensive threshold.
pub fn cpu_intensive_threshold() -> Option<Duration> {
    load(&INTENSIVE_NS)
}

/// Whether a stall aborts the process (after printing it on stderr) instead of being
/// reported through the error hook (default: false).
pub fn set_panic_on_stall(panic: bool) {
    PANIC_ON_STALL.store(panic, Relaxed);
}

/// Checks a threshold (at least [`MIN_THRESHOLD`]).
pub(crate) fn check(what: &'static str, threshold: Duration) -> Result<(), Error> {
    if threshold < MIN_THRESHOLD {
        return Err(Error::InvalidWatchdogThreshold { what, threshold });
    }
    Ok(())
}

fn store(cell: &AtomicU64, what: &'static str, threshold: Option<Duration>) -> Result<(), Error> {
    let ns = match threshold {
        None => 0,
        Some(t) => {
            check(what, t)?;
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
        }
    };
    cell.store(ns, Relaxed);
    RETHINK.store(true, Relaxed);
    wake();
    Ok(())
}

fn load(cell: &AtomicU64) -> Option<Duration> {
    match cell.load(Relaxed) {
        0 => None,
        ns => Some(Duration::from_nanos(ns)),
    }
}

/// What a stall is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum StallKind {
    /// Items wait on the pool's worklist and no worker started or finished one.
    Pending {
        /// Items on the worklist when it was found.
        items: usize,
    },
    /// One item has been running that long.
    Running {
        /// Its workqueue.
        workqueue: String,
        /// Its label ([`crate::Work::named`]).
        label: Option<String>,
        /// The thread running it.
        thread: String,
    },
}

/// A stall the watchdog found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Stall {
    /// The pool (as in [`crate::stats::PoolStats::id`]).
    pub pool: u64,
    /// What is stuck.
    pub kind: StallKind,
    /// For how long, when found (at least the threshold).
    pub stalled_for: Duration,
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            StallKind::Pending { items } => write!(
                f,
                "pool {} stalled: {items} items pending and none started for {:?}",
                self.pool, self.stalled_for
            ),
            StallKind::Running {
                workqueue,
                label,
                thread,
            } => write!(
                f,
                "pool {} stalled: an item of `{workqueue}`{} has been running on thread \
                 `{thread}` for {:?}",
                self.pool,
                label
                    .as_deref()
                    .map_or(String::new(), |l| format!(" (`{l}`)")),
                self.stalled_for
            ),
        }
    }
}

/// An item that ran longer than the long-item threshold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LongItem {
    /// Its label ([`crate::Work::named`]).
    pub label: Option<String>,
    /// How long it had run when found (at least the threshold).
    pub ran_for: Duration,
    /// The thread that ran it.
    pub thread: String,
}

/// The watchdog's findings for one workqueue (in [`crate::WorkqueueStats::watchdog`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WatchdogStats {
    /// Stalls found on its pools or its items.
    pub stalls: u64,
    /// The latest of them.
    pub last_stall: Option<Stall>,
    /// Its items that ran longer than the long-item threshold.
    pub long_items: u64,
    /// The first [`FIRST_LONG_ITEMS`] of them.
    pub first_long_items: Vec<LongItem>,
}

/// A workqueue's watchdog settings and findings.
#[derive(Default)]
pub(crate) struct WqWatch {
    /// I: its own stall threshold (`None`: the process-wide one).
    pub(crate) stall: Option<Duration>,
    /// I: its own long-item threshold (`None`: the process-wide one).
    pub(crate) long: Option<Duration>,
    /// WD: what was found.
    found: Mutex<WatchdogStats>,
}

impl WqWatch {
    pub(crate) fn new(stall: Option<Duration>, long: Option<Duration>) -> WqWatch {
        WqWatch {
            stall,
            long,
            found: Mutex::default(),
        }
    }

    pub(crate) fn snapshot(&self) -> WatchdogStats {
        lock(&self.found).clone()
    }

    fn stall_threshold(&self) -> Option<Duration> {
        self.stall.or_else(stall_threshold)
    }

    fn long_threshold(&self) -> Option<Duration> {
        self.long.or_else(long_item_threshold)
    }
}

/// The watchdog thread's handle, once started.
static THREAD: OnceLock<std::thread::Thread> = OnceLock::new();

/// Starts the watchdog thread if it is not running.
pub(crate) fn start() -> Result<(), Error> {
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = lock(&STARTED);
    if *started {
        return Ok(());
    }
    let handle = std::thread::Builder::new()
        .name("podq/watchdog".to_owned())
        .spawn(run)
        .map_err(|source| Error::Os {
            call: "spawn the podq/watchdog thread",
            source,
        })?;
    let _ = THREAD.set(handle.thread().clone());
    *started = true;
    Ok(())
}

/// Makes the watchdog look again now (its thresholds changed).
fn wake() {
    if let Some(t) = THREAD.get() {
        t.unpark();
    }
}

/// WD: what the watchdog remembers between looks, also read by `Workqueue::dump`.
fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(Mutex::default)
}

fn run() {
    // The heavy fence's one-time registration takes milliseconds (the kernel waits for
    // a grace period): done here, so that it does not delay the first demotion's
    // hand-back.
    crate::fence::prepare();
    let me = std::thread::current();
    let mut long_runs = LongRuns::default();
    let mut next_look = Instant::now();
    loop {
        let now = Instant::now();
        let intensive = cpu_intensive_threshold();
        let mut soon = intensive.is_some_and(|t| long_runs.look(t, now));
        if RETHINK.swap(false, Relaxed) || now >= next_look {
            let watched = watched();
            next_look = now + period(&watched);
            let found = lock(state()).look(&watched, now);
            // Hooks run with no podq lock held.
            for (wqs, pod, stall) in found {
                report(&wqs, &pod, stall);
            }
        }
        let until_look = next_look.saturating_duration_since(Instant::now());
        // Dozing for want of runs: a second look once the flag is set catches a run
        // that started since the first (`pool::doze`).
        let dozing = match intensive {
            Some(t) if !soon => {
                let dozes = pool::doze(&me, || long_runs.look(t, Instant::now()));
                soon = !dozes;
                dozes
            }
            _ => false,
        };
        let sleep = match intensive {
            Some(t) if soon => crate::policy::cpu_intensive_look_period(t).min(until_look),
            _ => until_look,
        };
        std::thread::park_timeout(sleep);
        if pool::watcher_woke(dozing) {
            long_runs.worker_woke(Instant::now());
        }
    }
}

/// Since when the watchdog has seen a beat's run `word` running (`None`: not seen yet,
/// so it has run for less than one watchdog period).
pub(crate) fn running_since(beat: usize, word: u64) -> Option<Instant> {
    lock(state()).items.get(&(beat, word)).map(|s| s.since)
}

/// Since when pool `pool` has had pending items and no progress, as of the last look
/// (`None`: it made progress or had nothing pending).
pub(crate) fn stuck_since(pool: u64) -> Option<Instant> {
    lock(state())
        .pools
        .get(&pool)
        .and_then(|p| p.pending.then_some(p.progress_at))
}

/// A stall to report: the workqueues it concerns, the pool's pod, the stall.
type Found = (Vec<Arc<WqShared>>, CpuSet, Stall);

/// A quarter of the smallest threshold in force, between 1 ms and 1 s.
fn period(watched: &Watched) -> Duration {
    let smallest = watched
        .wqs
        .iter()
        .flat_map(|wq| [wq.watch.stall_threshold(), wq.watch.long_threshold()])
        .chain([stall_threshold(), long_item_threshold()])
        .flatten()
        .min()
        .unwrap_or(Duration::from_secs(4));
    (smallest / 4).clamp(MIN_THRESHOLD, Duration::from_secs(1))
}

/// What the watchdog remembers between looks.
#[derive(Default)]
struct State {
    /// Running items by (beat, word): when first seen, and what was reported.
    items: HashMap<(usize, u64), Seen>,
    /// Per pool: the sum of its workers' run words, when it last changed (or the
    /// worklist was empty), and whether its stall was reported.
    pools: HashMap<u64, PoolSeen>,
}

struct Seen {
    since: Instant,
    long_counted: bool,
    stall_reported: bool,
}

struct PoolSeen {
    signature: u64,
    progress_at: Instant,
    /// It had items on its worklist at the last look.
    pending: bool,
    reported: bool,
}

impl State {
    fn look(&mut self, watched: &Watched, now: Instant) -> Vec<Found> {
        let looks = busy::looks();
        let mut found = Vec::new();
        self.look_at_items(watched, &looks, now, &mut found);
        self.look_at_pools(watched, &looks, now, &mut found);
        found
    }

    fn look_at_items(
        &mut self,
        watched: &Watched,
        looks: &[Look],
        now: Instant,
        found: &mut Vec<Found>,
    ) {
        let running: Vec<&Look> = looks.iter().filter(|l| l.running()).collect();
        self.items
            .retain(|key, _| running.iter().any(|l| (l.beat, l.word) == *key));
        for look in running {
            let seen = self.items.entry((look.beat, look.word)).or_insert(Seen {
                since: now,
                long_counted: false,
                stall_reported: false,
            });
            let ran = now - seen.since;
            let Some(wq) = watched.wqs.iter().find(|w| w.id == look.wq) else {
                continue;
            };
            let label = look.label.as_deref().map(str::to_owned);
            if !seen.long_counted && wq.watch.long_threshold().is_some_and(|t| ran >= t) {
                seen.long_counted = true;
                let mut found = lock(&wq.watch.found);
                found.long_items += 1;
                if found.first_long_items.len() < FIRST_LONG_ITEMS {
                    found.first_long_items.push(LongItem {
                        label: label.clone(),
                        ran_for: ran,
                        thread: look.thread.clone(),
                    });
                }
            }
            if !seen.stall_reported && wq.watch.stall_threshold().is_some_and(|t| ran >= t) {
                seen.stall_reported = true;
                let stall = Stall {
                    pool: look.pool,
                    kind: StallKind::Running {
                        workqueue: wq.name.clone(),
                        label,
                        thread: look.thread.clone(),
                    },
                    stalled_for: ran,
                };
                let pod = watched
                    .pools
                    .iter()
                    .find(|(c, _)| c.id == look.pool)
                    .map(|(c, _)| c.key.pod.clone())
                    .unwrap_or_default();
                found.push((vec![Arc::clone(wq)], pod, stall));
            }
        }
    }

    fn look_at_pools(
        &mut self,
        watched: &Watched,
        looks: &[Look],
        now: Instant,
        found: &mut Vec<Found>,
    ) {
        self.pools
            .retain(|id, _| watched.pools.iter().any(|(c, _)| c.id == *id));
        for (core, users) in &watched.pools {
            let signature = looks
                .iter()
                .filter(|l| l.pool == core.id)
                .fold(0u64, |sum, l| sum.wrapping_add(l.word));
            let pending = core.worklist_len();
            let seen = self.pools.entry(core.id).or_insert(PoolSeen {
                signature,
                progress_at: now,
                pending: false,
                reported: false,
            });
            seen.pending = pending > 0;
            if pending == 0 || seen.signature != signature {
                seen.signature = signature;
                seen.progress_at = now;
                seen.reported = false;
                continue;
            }
            let users: Vec<Arc<WqShared>> =
                users.iter().map(|&i| Arc::clone(&watched.wqs[i])).collect();
            let threshold = users
                .iter()
                .filter_map(|wq| wq.watch.stall_threshold())
                .min();
            let waited = now - seen.progress_at;
            if seen.reported || !threshold.is_some_and(|t| waited >= t) {
                continue;
            }
            seen.reported = true;
            let stall = Stall {
                pool: core.id,
                kind: StallKind::Pending { items: pending },
                stalled_for: waited,
            };
            found.push((users, core.key.pod.clone(), stall));
        }
    }
}

/// Counts `stall` for each of `wqs`, then tells their error hooks (each once) and the
/// process-wide one (if one of them has none), or aborts with `panic_on_stall`.
fn report(wqs: &[Arc<WqShared>], pod: &CpuSet, stall: Stall) {
    for wq in wqs {
        let mut found = lock(&wq.watch.found);
        found.stalls += 1;
        found.last_stall = Some(stall.clone());
    }
    let pool = stall.pool;
    let error = Error::Stall(stall);
    if PANIC_ON_STALL.load(Relaxed) {
        eprintln!("podq: {error}; aborting (panic_on_stall)");
        std::process::abort();
    }
    let hooks: Vec<_> = wqs.iter().filter_map(|wq| wq.error_hook.clone()).collect();
    let process_wide = wqs.iter().any(|wq| wq.error_hook.is_none());
    crate::fault::report_error(&hooks, process_wide, pool, pod, &error);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn thresholds_below_a_millisecond_are_refused() {
        let err = check("stall", Duration::from_micros(999)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid stall threshold 999µs: must be at least 1ms"
        );
        assert!(check("long-item", MIN_THRESHOLD).is_ok());
    }

    #[test]
    fn stalls_read_as_sentences() {
        let pending = Stall {
            pool: 3,
            kind: StallKind::Pending { items: 2 },
            stalled_for: Duration::from_secs(31),
        };
        assert_eq!(
            pending.to_string(),
            "pool 3 stalled: 2 items pending and none started for 31s"
        );
        let running = Stall {
            pool: 4,
            kind: StallKind::Running {
                workqueue: "nfsiod".into(),
                label: Some("rpc_release".into()),
                thread: "podq/u4:0".into(),
            },
            stalled_for: Duration::from_millis(1500),
        };
        assert_eq!(
            running.to_string(),
            "pool 4 stalled: an item of `nfsiod` (`rpc_release`) has been running on \
             thread `podq/u4:0` for 1.5s"
        );
    }
}
