//! Worker threads that cannot be created: injected with `podq::fault::fail_worker_spawns`
//! (the failure the OS gives at a thread limit, `EAGAIN`). Injection is process-wide, so
//! these tests run one at a time in their own test binary.
//!
//! Each test builds its workqueue with an idle timeout no other test uses: pools are
//! shared by key, and the timeout is part of it, so the pools start with no worker.
//!
//! What the tests see holds with and without the `stats` feature: the error hook's
//! calls and the worker threads in `/proc` always; the pool counters where they are
//! recorded.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use podq::fault::{fail_worker_spawns, set_create_cooldown, CREATE_COOLDOWN};
use podq::testing::fake_topology;
use podq::{Error, Scope, Workqueue};

mod common;
use common::{
    counter, counting_delayed, counting_work, flush_within, pool_threads, spawn_counting,
};

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests and restores the process settings when dropped.
struct Faults {
    hook_calls: Arc<AtomicUsize>,
    _serial: MutexGuard<'static, ()>,
}

impl Faults {
    fn new(cooldown: Duration) -> Faults {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        set_create_cooldown(cooldown);
        let hook_calls = Arc::new(AtomicUsize::new(0));
        let calls = hook_calls.clone();
        podq::set_error_hook(move |report| {
            assert!(
                matches!(report.error, Error::Os { source, .. }
                    if source.raw_os_error() == Some(libc::EAGAIN)),
                "unexpected report {report:?}"
            );
            calls.fetch_add(1, SeqCst);
        });
        Faults {
            hook_calls,
            _serial: serial,
        }
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        fail_worker_spawns(0);
        set_create_cooldown(CREATE_COOLDOWN);
        podq::clear_error_hook();
    }
}

/// Fails the next `n` worker creations (`u64::MAX`: all) until dropped. Taken after
/// the workqueue is built, it is dropped before it: a failing assertion then drops a
/// workqueue whose pools can start workers again, and the test fails instead of hanging
/// in the drop's drain.
struct Injected;

fn inject(n: u64) -> Injected {
    fail_worker_spawns(n);
    Injected
}

impl Drop for Injected {
    fn drop(&mut self) {
        fail_worker_spawns(0);
    }
}

/// Sums one counter over the pools of a snapshot.
fn pool_sum(stats: &podq::stats::WorkqueueStats, f: fn(&podq::stats::PoolStats) -> u64) -> u64 {
    stats.pools.iter().map(f).sum()
}

/// Worker threads of the pools `wq` uses now.
fn worker_threads(wq: &Workqueue) -> usize {
    wq.stats().pools.iter().map(|p| pool_threads(p.id)).sum()
}

#[test]
fn rescuer_runs_the_items_while_no_worker_can_start() {
    let faults = Faults::new(CREATE_COOLDOWN);
    let wq = Workqueue::builder("fault-rescued")
        .topology(fake_topology(2, 1, 2, 1))
        .scope(Scope::Numa)
        .max_active(8)
        .idle_timeout(Duration::from_millis(1001))
        .rescuer(true)
        .build()
        .unwrap();
    let _injected = inject(u64::MAX);
    let runs = counter();
    for i in 0..200 {
        podq::set_thread_cpu(Some(i % 4));
        spawn_counting(&wq, &runs);
    }
    podq::set_thread_cpu(None);
    let work_runs = counter();
    let work = counting_work(&work_runs);
    assert!(wq.queue(&work));
    let delayed = counting_delayed(&work_runs);
    assert!(wq.queue_delayed(&delayed, Duration::from_millis(5)));
    let joined = wq.spawn(|| 42);
    assert_eq!(joined.join().unwrap(), 42, "a joined item completes");
    assert!(
        flush_within(&wq, Duration::from_secs(20)),
        "flush completed with every spawn failing"
    );
    delayed.flush();
    assert_eq!(runs.load(SeqCst), 200);
    assert_eq!(work_runs.load(SeqCst), 2);
    assert_eq!(worker_threads(&wq), 0, "no worker ever started");
    assert!(
        faults.hook_calls.load(SeqCst) >= 1,
        "failure reported to the hook"
    );
    let stats = wq.stats();
    let sum = |f| pool_sum(&stats, f);
    if cfg!(feature = "stats") {
        assert_eq!(sum(|p| p.workers_created), 0, "no worker ever started");
        assert!(sum(|p| p.worker_spawn_failures) >= 1);
        assert!(sum(|p| p.maydays) >= 1);
        assert_eq!(sum(|p| p.rescued), 203, "the rescuer ran every item");
        assert_eq!(stats.totals.completed, 203);
    }
    eprintln!(
        "rescued: {} items, {} spawn failures, {} maydays, {} hook calls",
        sum(|p| p.rescued),
        sum(|p| p.worker_spawn_failures),
        sum(|p| p.maydays),
        faults.hook_calls.load(SeqCst)
    );
}

#[test]
fn without_a_rescuer_items_wait_and_run_once_creation_recovers() {
    let cooldown = Duration::from_millis(20);
    let faults = Faults::new(cooldown);
    let wq = Workqueue::builder("fault-waiting")
        .idle_timeout(Duration::from_millis(1002))
        .build()
        .unwrap();
    let injected = inject(u64::MAX);
    let runs = counter();
    for _ in 0..100 {
        spawn_counting(&wq, &runs);
    }
    // Nothing can run; the pool retries every cooldown and reports each failure.
    let start = Instant::now();
    while faults.hook_calls.load(SeqCst) < 4 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(runs.load(SeqCst), 0, "no worker, no rescuer: nothing ran");
    let hook_calls = faults.hook_calls.load(SeqCst);
    assert!(
        hook_calls >= 4,
        "retried after each cooldown ({hook_calls} failures reported)"
    );
    assert_eq!(worker_threads(&wq), 0);
    if cfg!(feature = "stats") {
        let stats = wq.stats();
        let failures = pool_sum(&stats, |p| p.worker_spawn_failures);
        assert!(failures >= 4, "{failures} failures counted");
        assert_eq!(stats.totals.queued, 100, "every item is still held");
        assert_eq!(stats.totals.started, 0);
    }
    // The limit lifts: the next retry starts a worker and everything runs, once.
    drop(injected);
    assert!(
        flush_within(&wq, Duration::from_secs(20)),
        "items ran once creation recovered"
    );
    assert_eq!(runs.load(SeqCst), 100);
    assert!(worker_threads(&wq) >= 1, "a worker started");
    if cfg!(feature = "stats") {
        let stats = wq.stats();
        assert!(pool_sum(&stats, |p| p.workers_created) >= 1);
        assert_eq!(stats.totals.completed, 100);
    }
    eprintln!("waited out {hook_calls} spawn failures, then ran 100 items");
}

#[test]
fn a_few_failures_are_absorbed_by_the_retry() {
    let faults = Faults::new(Duration::from_millis(10));
    let wq = Workqueue::builder("fault-few")
        .topology(fake_topology(1, 1, 4, 1))
        .scope(Scope::Cpu)
        .idle_timeout(Duration::from_millis(1003))
        .build()
        .unwrap();
    let _injected = inject(3);
    let runs = counter();
    for i in 0..400 {
        podq::set_thread_cpu(Some(i % 4));
        spawn_counting(&wq, &runs);
    }
    podq::set_thread_cpu(None);
    assert!(flush_within(&wq, Duration::from_secs(20)));
    assert_eq!(runs.load(SeqCst), 400);
    assert_eq!(faults.hook_calls.load(SeqCst), 3);
    if cfg!(feature = "stats") {
        assert_eq!(pool_sum(&wq.stats(), |p| p.worker_spawn_failures), 3);
    }
}

#[test]
fn a_workqueue_error_hook_replaces_the_process_wide_one() {
    let faults = Faults::new(Duration::from_millis(20));
    let own_calls = counter();
    let calls = own_calls.clone();
    let wq = Workqueue::builder("fault-own-hook")
        .idle_timeout(Duration::from_millis(1004))
        .error_hook(move |report| {
            assert!(matches!(report.error, Error::Os { .. }), "{report:?}");
            calls.fetch_add(1, SeqCst);
        })
        .build()
        .unwrap();
    let _injected = inject(1);
    let runs = counter();
    spawn_counting(&wq, &runs);
    assert!(
        flush_within(&wq, Duration::from_secs(20)),
        "the retry ran it"
    );
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(
        own_calls.load(SeqCst),
        1,
        "the workqueue's own hook was told"
    );
    assert_eq!(
        faults.hook_calls.load(SeqCst),
        0,
        "the process-wide hook was not"
    );
}
