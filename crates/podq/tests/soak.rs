//! Soak: mixed traffic for a set time, counting every item, watching memory and threads.
//!
//! Depth knob: `PODQ_SOAK_SECS` (default 60 s in release builds, 8 s in debug builds).
//! CI runs `PODQ_SOAK_SECS=60 cargo test -p podq --release --test soak`; full depth is
//! hours, e.g. `PODQ_SOAK_SECS=14400`.
//!
//! Traffic, on a fake 16-CPU, 2-node topology (pods mapped onto the real CPUs), from
//! [`PRODUCERS`] threads queueing from random virtual CPUs:
//! - one-shot `spawn`s (1% panic; one in [`LONG_ITEM_ODDS`] sleeps [`LONG_ITEM`] without
//!   `podq::blocking`, so the CPU-intensive rule takes its worker out of the running
//!   count while attributes change; some joined, checking the result), re-queueable `Work`
//!   items queued, cancelled, `cancel_sync`ed and flushed, `DelayedWork` items armed,
//!   re-armed (`mod_delayed`), cancelled and flushed, `flush`es of the whole queue, and
//!   now and then a short-lived workqueue built, loaded and dropped;
//! - one ordered queue fed by one producer, its order checked;
//! - a changer thread flipping scope, strictness, cpumask and `max_active` every 2 ms,
//!   and draining the queue about once in a hundred changes.
//!
//! Checks:
//! - every accepted queue call ran exactly once or was reported cancelled: per item,
//!   `runs == accepted - cancelled`, where `cancelled` counts `cancel`/`cancel_sync`
//!   calls that returned true and `mod_delayed` calls that replaced a pending instance;
//!   every accepted `spawn` ran; a `flush` returned only after the caller's earlier
//!   spawns ran; joined results match; injected panics equal the counted ones;
//! - the workqueues' own totals add up (`queued == started + cancelled`,
//!   `started == completed`);
//! - memory: resident set growth from the end of warm-up to the end stays under
//!   [`RSS_GROWTH_LIMIT`];
//! - threads: once traffic stops, the thread count falls to the idle floor (the test's
//!   own threads plus at most two idle workers per live pool) within a few idle
//!   timeouts, and back to the starting count once the workqueues are dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podq::testing::fake_topology;
use podq::{DelayedWork, JoinHandle, Scope, Work, Workqueue};

mod common;
use common::{changer_masks, changer_scopes};

const PRODUCERS: usize = 6;
const WORKS_PER_PRODUCER: usize = 16;
const DELAYED_PER_PRODUCER: usize = 8;
const IDLE_TIMEOUT: Duration = Duration::from_millis(100);
/// Bound on resident-set growth after warm-up: generous for allocator noise, far below
/// what a leak of one allocation per item would reach over a run.
const RSS_GROWTH_LIMIT: u64 = 64 << 20;
const PANIC_TAG: &str = "soak-panic";
/// One spawn in this many is a long item.
const LONG_ITEM_ODDS: u64 = 2000;
/// How long a long item sleeps: past the CPU-intensive threshold (10 ms) plus the
/// watchdog's look period, so its worker leaves the running count.
const LONG_ITEM: Duration = Duration::from_millis(25);
/// How long producers may take to settle (flush everything) once the run is over.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

fn soak_secs() -> u64 {
    let default = if cfg!(debug_assertions) { 8 } else { 60 };
    match std::env::var("PODQ_SOAK_SECS") {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            panic!("PODQ_SOAK_SECS must be a whole number of seconds, got `{v}`")
        }),
        Err(_) => default,
    }
}

/// xorshift64*: a deterministic per-thread generator (the seed is printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm has a resident field");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .count()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// Figures shared by every thread of the run.
#[derive(Default)]
struct Tally {
    spawned: AtomicU64,
    spawn_ran: AtomicU64,
    work_accepted: AtomicU64,
    work_ran: AtomicU64,
    cancelled: AtomicU64,
    panics_injected: AtomicU64,
    panics_seen: AtomicU64,
    long_items: AtomicU64,
    joins: AtomicU64,
    flushes: AtomicU64,
    churn_wqs: AtomicU64,
    refused: AtomicU64,
}

/// A re-queueable item owned by one producer, with its accounting.
struct Tracked<W> {
    item: W,
    runs: Arc<AtomicU64>,
    accepted: u64,
    cancelled: u64,
}

impl<W> Tracked<W> {
    fn check(&self, what: &str) {
        let runs = self.runs.load(SeqCst);
        assert_eq!(
            runs,
            self.accepted - self.cancelled,
            "{what}: ran {runs} times, accepted {} queue calls, {} cancelled",
            self.accepted,
            self.cancelled
        );
    }
}

/// A work function counting its runs; every 100th run panics (after counting).
fn counted(runs: &Arc<AtomicU64>, tally: &Arc<Tally>, salt: u64) -> impl Fn() + Send + Sync {
    let (runs, tally) = (runs.clone(), tally.clone());
    move || {
        let n = runs.fetch_add(1, SeqCst);
        tally.work_ran.fetch_add(1, SeqCst);
        if (n + salt) % 100 == 99 {
            tally.panics_injected.fetch_add(1, SeqCst);
            panic!("{PANIC_TAG} work");
        }
    }
}

struct Producer<'a> {
    wq: &'a Workqueue,
    tally: &'a Arc<Tally>,
    rng: Rng,
    works: Vec<Tracked<Work>>,
    delayed: Vec<Tracked<DelayedWork>>,
    my_spawned: u64,
    my_ran: Arc<AtomicU64>,
    joins: Vec<(JoinHandle<u64>, bool, u64)>,
}

impl Producer<'_> {
    fn spawn_one(&mut self) {
        let panic = self.rng.below(100) == 0;
        let long = self.rng.below(LONG_ITEM_ODDS) == 0;
        let value = self.rng.next();
        let (mine, tally) = (self.my_ran.clone(), self.tally.clone());
        let result = self.wq.try_spawn(move || {
            if long {
                std::thread::sleep(LONG_ITEM);
            }
            mine.fetch_add(1, SeqCst);
            tally.spawn_ran.fetch_add(1, SeqCst);
            if panic {
                panic!("{PANIC_TAG} spawn");
            }
            value
        });
        match result {
            Ok(handle) => {
                self.my_spawned += 1;
                self.tally.spawned.fetch_add(1, SeqCst);
                if panic {
                    self.tally.panics_injected.fetch_add(1, SeqCst);
                }
                if long {
                    self.tally.long_items.fetch_add(1, SeqCst);
                }
                if self.rng.below(10) == 0 {
                    self.joins.push((handle, panic, value));
                }
            }
            Err(_) => {
                self.tally.refused.fetch_add(1, SeqCst);
            }
        }
        if self.joins.len() >= 32 {
            self.join_all();
        }
    }

    fn join_all(&mut self) {
        for (handle, panic, value) in self.joins.drain(..) {
            match handle.join() {
                Ok(v) => {
                    assert!(!panic, "a panicking spawn returned");
                    assert_eq!(v, value);
                }
                Err(_) => assert!(panic, "a spawn panicked that should not have"),
            }
            self.tally.joins.fetch_add(1, SeqCst);
        }
    }

    fn step(&mut self) {
        podq::set_thread_cpu(Some(self.rng.below(16) as usize));
        let roll = self.rng.below(1000);
        let k = self.rng.below(WORKS_PER_PRODUCER as u64) as usize;
        let d = self.rng.below(DELAYED_PER_PRODUCER as u64) as usize;
        match roll {
            0..=499 => self.spawn_one(),
            500..=699 => {
                let w = &mut self.works[k];
                if self.wq.queue(&w.item) {
                    w.accepted += 1;
                    self.tally.work_accepted.fetch_add(1, SeqCst);
                }
            }
            700..=739 => {
                let w = &mut self.works[k];
                if w.item.cancel() {
                    w.cancelled += 1;
                    self.tally.cancelled.fetch_add(1, SeqCst);
                }
            }
            740..=759 => {
                let w = &mut self.works[k];
                if w.item.cancel_sync() {
                    w.cancelled += 1;
                    self.tally.cancelled.fetch_add(1, SeqCst);
                }
                assert!(!w.item.is_pending(), "cancel_sync left it pending");
            }
            760..=779 => {
                self.works[k].item.flush();
            }
            780..=839 => {
                let delay = Duration::from_micros(self.rng.below(3000));
                let w = &mut self.delayed[d];
                if self.wq.queue_delayed(&w.item, delay) {
                    w.accepted += 1;
                    self.tally.work_accepted.fetch_add(1, SeqCst);
                }
            }
            840..=869 => {
                let delay = Duration::from_micros(self.rng.below(3000));
                let w = &mut self.delayed[d];
                // Refused (the queue is draining): nothing changed.
                if let Ok(replaced) = self.wq.try_mod_delayed(&w.item, delay) {
                    w.accepted += 1;
                    self.tally.work_accepted.fetch_add(1, SeqCst);
                    if replaced {
                        w.cancelled += 1;
                        self.tally.cancelled.fetch_add(1, SeqCst);
                    }
                }
            }
            870..=889 => {
                let w = &mut self.delayed[d];
                let sync = self.rng.below(2) == 0;
                let removed = if sync {
                    w.item.cancel_sync()
                } else {
                    w.item.cancel()
                };
                if removed {
                    w.cancelled += 1;
                    self.tally.cancelled.fetch_add(1, SeqCst);
                }
            }
            890..=899 => {
                self.delayed[d].item.flush();
            }
            900..=989 => {
                self.wq.flush();
                self.tally.flushes.fetch_add(1, SeqCst);
                let ran = self.my_ran.load(SeqCst);
                assert!(
                    ran >= self.my_spawned,
                    "flush returned before this thread's spawns ran ({ran} of {})",
                    self.my_spawned
                );
            }
            _ => self.churn(),
        }
    }

    /// A short-lived workqueue: loaded with spawns, work and long timers, then dropped.
    /// Drop drains queued items and cancels what is on the timer.
    fn churn(&mut self) {
        let topo = self.wq.topology().clone();
        let wq = Workqueue::builder("soak-churn")
            .topology(topo)
            .scope(Scope::Cache)
            .idle_timeout(IDLE_TIMEOUT)
            .build()
            .unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let n = 1 + self.rng.below(64);
        for _ in 0..n {
            let ran = ran.clone();
            wq.spawn(move || {
                ran.fetch_add(1, SeqCst);
            });
        }
        let runs = Arc::new(AtomicU64::new(0));
        let r = runs.clone();
        let on_timer = DelayedWork::new(move || {
            r.fetch_add(1, SeqCst);
        });
        assert!(wq.queue_delayed(&on_timer, Duration::from_secs(3600)));
        drop(wq);
        assert_eq!(ran.load(SeqCst), n, "dropping a workqueue drains it");
        assert!(!on_timer.is_pending(), "drop cancels what is on the timer");
        assert_eq!(runs.load(SeqCst), 0);
        self.tally.churn_wqs.fetch_add(1, SeqCst);
    }

    /// Waits for everything of this producer: timers flushed, queue flushed.
    fn settle(&mut self) {
        for w in &self.delayed {
            w.item.flush();
        }
        for w in &self.works {
            w.item.flush();
        }
        self.wq.flush();
        self.join_all();
        for (i, w) in self.works.iter().enumerate() {
            w.check(&format!("work {i}"));
        }
        for (i, w) in self.delayed.iter().enumerate() {
            w.check(&format!("delayed {i}"));
        }
        assert_eq!(
            self.my_ran.load(SeqCst),
            self.my_spawned,
            "spawns of a producer"
        );
    }
}

fn quiet_panics(tally: &Arc<Tally>) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains(PANIC_TAG) {
            default(info);
        }
    }));
    let t = tally.clone();
    podq::set_panic_hook(move |r| {
        if r.message.contains(PANIC_TAG) {
            t.panics_seen.fetch_add(1, SeqCst);
        }
    });
}

/// Waits until `done()` or `limit` passes; returns whether `done()` held.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn soak_mixed_traffic_counts_every_item() {
    let secs = soak_secs();
    let seed = std::env::var("PODQ_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("soak: {secs} s, seed {seed} (PODQ_SOAK_SEED to replay a thread's choices)");
    let tally = Arc::new(Tally::default());
    quiet_panics(&tally);

    // Start the process timer thread before counting the starting threads.
    {
        let wq = Workqueue::builder("soak-warm").build().unwrap();
        let d = DelayedWork::new(|| {});
        wq.queue_delayed(&d, Duration::from_millis(1));
        d.flush();
    }
    let threads_start = threads();

    let topo = fake_topology(2, 2, 2, 2);
    let all = topo.usable().clone();
    let wq = Workqueue::builder("soak")
        .topology(topo.clone())
        .max_active(64)
        .idle_timeout(IDLE_TIMEOUT)
        .build()
        .unwrap();
    let ordered = Workqueue::builder("soak-ordered")
        .topology(topo.clone())
        .ordered(true)
        .idle_timeout(IDLE_TIMEOUT)
        .build()
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(secs);
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicUsize::new(0));
    let changer = {
        let (wq, ordered, stop, changes) =
            (wq.clone(), ordered.clone(), stop.clone(), changes.clone());
        let masks = changer_masks(&all);
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        std::thread::spawn(move || {
            let scopes = changer_scopes();
            while !stop.load(SeqCst) {
                let pick = rng.below(64) as usize;
                match rng.below(101) {
                    // Now and then a drain: other threads' queue calls are refused
                    // meanwhile (counted as not accepted) and must not be lost.
                    100 => wq.drain(),
                    n if n % 5 == 0 => wq.set_scope(scopes[pick % scopes.len()]).unwrap(),
                    n if n % 5 == 1 => wq.set_strict(pick % 2 == 0).unwrap(),
                    n if n % 5 == 2 => wq.set_cpumask(masks[pick % masks.len()].clone()).unwrap(),
                    n if n % 5 == 3 => ordered
                        .set_cpumask(masks[pick % masks.len()].clone())
                        .unwrap(),
                    _ => wq.set_max_active(1 + pick).unwrap(),
                }
                changes.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
            // Leave the queue on its widest setting for the thread-floor check.
            wq.set_cpumask(all).unwrap();
        })
    };

    let order_errors = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (wq, ordered, tally) = (wq.clone(), ordered.clone(), tally.clone());
            let order_errors = order_errors.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(seed.wrapping_add(p as u64 * 0x1000_0001) | 1);
                let works = (0..WORKS_PER_PRODUCER)
                    .map(|k| {
                        let runs = Arc::new(AtomicU64::new(0));
                        Tracked {
                            item: Work::new(counted(&runs, &tally, k as u64 * 7)),
                            runs,
                            accepted: 0,
                            cancelled: 0,
                        }
                    })
                    .collect();
                let delayed = (0..DELAYED_PER_PRODUCER)
                    .map(|k| {
                        let runs = Arc::new(AtomicU64::new(0));
                        Tracked {
                            item: DelayedWork::new(counted(&runs, &tally, k as u64 * 13)),
                            runs,
                            accepted: 0,
                            cancelled: 0,
                        }
                    })
                    .collect();
                let rng_seed = rng.next();
                let mut me = Producer {
                    wq: &wq,
                    tally: &tally,
                    rng: Rng(rng_seed | 1),
                    works,
                    delayed,
                    my_spawned: 0,
                    my_ran: Arc::new(AtomicU64::new(0)),
                    joins: Vec::new(),
                };
                let next = Arc::new(AtomicU64::new(0));
                let mut ordered_seq = 0u64;
                let mut steps = 0u64;
                while Instant::now() < deadline {
                    me.step();
                    if p == 0 && steps % 4 == 0 {
                        let (expect, next, errors) =
                            (ordered_seq, next.clone(), order_errors.clone());
                        ordered_seq += 1;
                        ordered.spawn(move || {
                            if next.swap(expect + 1, SeqCst) != expect {
                                errors.fetch_add(1, SeqCst);
                            }
                        });
                    }
                    steps += 1;
                }
                me.settle();
                podq::set_thread_cpu(None);
                steps
            })
        })
        .collect();

    // Monitor: memory and threads once a second; warm-up is the first fifth of the run.
    let warm_up = Duration::from_secs(secs / 5).max(Duration::from_secs(1));
    let started = Instant::now();
    let mut rss_warm = None;
    let (mut rss_max, mut threads_max) = (0u64, 0usize);
    while Instant::now() < deadline {
        std::thread::sleep(
            Duration::from_millis(250).min(deadline.saturating_duration_since(Instant::now())),
        );
        let rss = rss_bytes();
        rss_max = rss_max.max(rss);
        threads_max = threads_max.max(threads());
        if rss_warm.is_none() && started.elapsed() >= warm_up {
            rss_warm = Some(rss);
        }
    }
    // A flush or drain that never returns means an item counted in flight was lost:
    // fail with the queues' totals instead of hanging.
    let settled = wait_for(SETTLE_LIMIT, || producers.iter().all(|h| h.is_finished()));
    if !settled {
        podq::clear_panic_hook();
        // Pools holding items that neither started nor were cancelled, with their workers.
        let stuck: Vec<String> = wq
            .stats()
            .pools
            .iter()
            .filter(|p| p.totals.queued != p.totals.started + p.totals.cancelled)
            .map(|p| {
                format!(
                    "pool {} pod {} strict {}: queued {} started {} cancelled {} \
                     max_active_waits {} workers {} idle {}",
                    p.id,
                    p.pod_cpus,
                    p.strict,
                    p.totals.queued,
                    p.totals.started,
                    p.totals.cancelled,
                    p.totals.max_active_waits,
                    p.workers,
                    p.idle
                )
            })
            .collect();
        panic!(
            "producers did not settle within {SETTLE_LIMIT:?} after the run: a flush or drain \
             is stuck; totals {:?} / ordered {:?}; pools {stuck:#?}",
            wq.stats().totals,
            ordered.stats().totals
        );
    }
    let steps: u64 = producers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, SeqCst);
    changer.join().unwrap();
    wq.flush();
    ordered.flush();
    let rss_end = rss_bytes();
    rss_max = rss_max.max(rss_end);
    let rss_warm = rss_warm.unwrap_or(rss_end);

    // Accounting.
    let t = &tally;
    let get = |a: &AtomicU64| a.load(SeqCst);
    assert_eq!(
        get(&t.spawn_ran),
        get(&t.spawned),
        "every accepted spawn ran once"
    );
    assert_eq!(
        get(&t.work_ran),
        get(&t.work_accepted) - get(&t.cancelled),
        "every accepted queue call ran or was cancelled"
    );
    assert_eq!(order_errors.load(SeqCst), 0, "ordered queue out of order");
    assert_eq!(
        get(&t.panics_seen),
        get(&t.panics_injected),
        "panics reported"
    );
    // The runtime's own counts agree, where it keeps them.
    if cfg!(feature = "stats") {
        for stats in [wq.stats(), ordered.stats()] {
            let s = &stats.totals;
            assert_eq!(s.queued, s.started + s.cancelled, "{}: {s:?}", stats.name);
            assert_eq!(s.started, s.completed, "{}: {s:?}", stats.name);
        }
        let totals = wq.stats().totals;
        assert_eq!(totals.panicked, get(&t.panics_injected), "panics counted");
    }

    // Memory.
    let growth = rss_end.saturating_sub(rss_warm);
    assert!(
        growth < RSS_GROWTH_LIMIT,
        "resident set grew {:.1} MiB after warm-up ({:.1} -> {:.1} MiB)",
        mib(growth),
        mib(rss_warm),
        mib(rss_end)
    );

    // Threads: idle floor with the queues alive, starting count once they are gone.
    let pools = || wq.stats().pools.len() + ordered.stats().pools.len();
    let mut threads_idle = 0;
    let live_pools = pools();
    let floor_reached = wait_for(IDLE_TIMEOUT * 100, || {
        threads_idle = threads();
        threads_idle <= threads_start + 2 * pools()
    });
    assert!(
        floor_reached,
        "threads stayed at {threads_idle}, above the idle floor {} + 2 x {} pools",
        threads_start,
        pools()
    );
    drop((wq, ordered));
    let mut threads_end = 0;
    let back = wait_for(Duration::from_secs(10), || {
        threads_end = threads();
        threads_end <= threads_start
    });
    assert!(
        back,
        "threads {threads_end} after dropping the queues, {threads_start} before"
    );
    podq::clear_panic_hook();

    eprintln!(
        "soak: {secs} s, {steps} steps, {} spawns + {} work runs ({} accepted, {} cancelled), \
         {} panics injected and counted, {} long items, {} flushes, {} joins, \
         {} attribute changes, \
         {} workqueues built and dropped, {} refused while draining; \
         RSS warm {:.1} MiB, end {:.1} MiB, max {:.1} MiB (growth {:.1} MiB); \
         threads start {threads_start}, max {threads_max}, idle {threads_idle} \
         ({live_pools} live pools), end {threads_end}",
        get(&t.spawned),
        get(&t.work_ran),
        get(&t.work_accepted),
        get(&t.cancelled),
        get(&t.panics_injected),
        get(&t.long_items),
        get(&t.flushes),
        get(&t.joins),
        changes.load(SeqCst),
        get(&t.churn_wqs),
        get(&t.refused),
        mib(rss_warm),
        mib(rss_end),
        mib(rss_max),
        mib(growth),
    );
}
