//! The `auto` scope on real workqueues: where it starts, what the stats and the control
//! plane say, and every item run exactly once while the sampler switches scopes under
//! a load that moves between the nodes of a fake topology. Needs the `stats` feature
//! (a build without it refuses `auto`: `auto_without_stats.rs`).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podq::policy::auto::{AutoConfig, Reason};
use podq::testing::fake_topology;
use podq::{Scope, Workqueue};

mod common;

#[test]
fn auto_starts_at_the_builtin_default_and_reports_itself() {
    // 2 nodes × 2 LLCs × 2 cores × SMT2: cache_shard is the per-LLC layout.
    let wq = Workqueue::builder("auto-start")
        .topology(fake_topology(2, 2, 2, 2))
        .scope(Scope::Auto)
        .build()
        .unwrap();
    assert_eq!(wq.attrs().scope, Scope::Auto);
    assert_eq!(wq.effective_scope(), Scope::CacheShard);
    let stats = wq.stats();
    assert_eq!(stats.pools.len(), 5, "a pool per LLC and the default pwq's");
    let auto = stats.auto.expect("on auto");
    assert_eq!(
        (auto.scope, auto.strict, auto.switches),
        (Scope::CacheShard, false, 0)
    );
    assert_eq!(auto.window_ns, 100_000_000);
    let json = serde_json::to_value(wq.stats()).unwrap();
    assert_eq!(json["auto"]["scope"], "cache_shard");

    // Leaving auto drops the controller; coming back starts at the scope in force.
    wq.set_scope(Scope::Smt).unwrap();
    assert!(wq.stats().auto.is_none());
    wq.set_scope(Scope::Auto).unwrap();
    assert_eq!(wq.effective_scope(), Scope::Smt);
    let auto = wq.stats().auto.unwrap();
    assert_eq!(
        (auto.scope, &auto.last_reason),
        (Scope::Smt, &Reason::Start)
    );

    let err = Workqueue::builder("auto-bad-window")
        .scope(Scope::Auto)
        .auto_window(Duration::from_micros(10))
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("auto window") && err.contains("10µs"), "{err}");
}

#[cfg(feature = "control")]
#[test]
fn control_plane_sets_and_shows_auto() {
    use common::{control, get_attr, set_attr};

    let mut ctl = control();
    let wq = Workqueue::builder("auto_ctl")
        .topology(fake_topology(1, 1, 4, 2))
        .scope(Scope::Smt)
        .build()
        .unwrap();
    wq.expose().unwrap();
    let set = ctl
        .client
        .call(&set_attr("auto_ctl", "affinity_scope", "auto"))
        .unwrap();
    assert!(set.ok, "{set:?}");
    assert_eq!(wq.attrs().scope, Scope::Auto);
    let got = ctl
        .client
        .call(&get_attr("auto_ctl", "affinity_scope"))
        .unwrap();
    assert_eq!(got.value.as_deref(), Some("auto (smt)"));
}

/// A load that moves between the two nodes of a fake topology, under thresholds low
/// enough that the sampler switches on what it measures here: every item runs exactly
/// once, whatever the switches.
#[test]
fn items_run_exactly_once_across_auto_switches() {
    let topology = fake_topology(2, 2, 2, 2);
    let node_cpus = [topology.node_cpus(0), topology.node_cpus(1)];
    let config = AutoConfig {
        min_items: 1,
        min_acquisitions: 1,
        confirm_windows: 1,
        min_dwell_windows: 2,
        max_switches: 1_000,
        rate_windows: 1,
        // Any lock wait is contention, any busy pod saturated, any unused pod idle.
        lock_wait_enter: 0.0,
        lock_wait_exit: 0.0,
        saturated_busy: 1e-9,
        idle_busy: 0.0,
        min_idle_share: 0.0,
        ..AutoConfig::default()
    };
    let wq = Workqueue::builder("auto-once")
        .topology(topology)
        .scope(Scope::Auto)
        .auto_window(Duration::from_millis(5))
        .auto_config(config)
        .build()
        .unwrap();
    const PER_PHASE: usize = 4_000;
    let mut all_runs: Vec<Arc<Vec<AtomicU32>>> = Vec::new();
    let started = Instant::now();
    let mut phase = 0;
    // Alternate the producers' node until the sampler has switched at least twice
    // (bounded: a loaded machine may give it little CPU time).
    while phase < 4
        || (wq.stats().auto.unwrap().switches < 2 && started.elapsed() < Duration::from_secs(30))
    {
        let cpus = &node_cpus[phase % 2];
        let counts: Arc<Vec<AtomicU32>> =
            Arc::new((0..PER_PHASE).map(|_| AtomicU32::new(0)).collect());
        for i in 0..PER_PHASE {
            podq::set_thread_cpu(cpus.nth(i % cpus.len()));
            let counts = Arc::clone(&counts);
            drop(wq.spawn(move || {
                let spin = Instant::now();
                while spin.elapsed() < Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
                counts[i].fetch_add(1, Relaxed);
            }));
        }
        podq::set_thread_cpu(None);
        all_runs.push(counts);
        phase += 1;
    }
    wq.flush();
    for (p, counts) in all_runs.iter().enumerate() {
        for (i, c) in counts.iter().enumerate() {
            assert_eq!(c.load(Relaxed), 1, "phase {p} item {i}");
        }
    }
    let stats = wq.stats();
    let auto = stats.auto.unwrap();
    let items = (phase * PER_PHASE) as u64;
    assert_eq!(stats.totals.queued, items);
    assert_eq!(stats.totals.completed, items);
    assert!(auto.switches >= 2, "{auto:?}");
    assert_eq!(auto.switch_failures, 0);
    assert!(auto.last_switch.is_some());
}

/// `auto` as the process default: workqueues on `default` choose their scope
/// themselves, each with its own controller; a named scope is left alone.
#[test]
fn auto_as_the_process_default() {
    let follows = Workqueue::builder("auto-follows")
        .topology(fake_topology(1, 2, 2, 1))
        .build()
        .unwrap();
    let fixed = Workqueue::builder("auto-fixed")
        .topology(fake_topology(1, 2, 2, 1))
        .scope(Scope::Cpu)
        .build()
        .unwrap();
    let before = podq::default_scope();
    podq::set_default_scope(Scope::Auto).unwrap();
    assert_eq!(podq::default_scope(), Scope::Auto);
    assert_eq!(follows.attrs().scope, Scope::Default);
    let auto = follows.stats().auto.expect("default resolves to auto");
    assert_eq!(auto.scope, before);
    assert!(fixed.stats().auto.is_none());
    podq::set_default_scope(Scope::Numa).unwrap();
    assert!(follows.stats().auto.is_none());
    assert_eq!(follows.effective_scope(), Scope::Numa);
    podq::set_default_scope(before).unwrap();
}
