//! Worker thread options: names, stack size, start/stop hooks.

use std::collections::HashSet;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};

use podq::{Error, Topology, Workqueue};

mod common;

/// The stack size of the calling thread, from pthread.
fn my_stack_size() -> usize {
    // SAFETY: `attr` is initialised by pthread_getattr_np before it is read, and
    // destroyed once; `size` is a valid out-parameter.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let mut size = 0usize;
        assert_eq!(libc::pthread_attr_getstacksize(&attr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        size
    }
}

#[test]
fn the_name_function_names_every_worker_from_its_pool_and_index() {
    let asked: Arc<Mutex<Vec<(u64, usize)>>> = Arc::default();
    let a = asked.clone();
    let wq = Workqueue::builder("th-name")
        .topology(Topology::synthetic("1s2c1t").unwrap())
        .thread_name(move |pool, index| {
            a.lock().unwrap().push((pool, index));
            format!("io{pool}.{index}")
        })
        .build()
        .unwrap();
    let (name, me) = wq
        .spawn(|| {
            let name = std::thread::current().name().map(str::to_owned);
            (name, podq::current().unwrap())
        })
        .join()
        .unwrap();
    let asked = asked.lock().unwrap().clone();
    assert!(asked.iter().all(|&(pool, _)| pool == me.pool), "{asked:?}");
    let expected: HashSet<String> = asked.iter().map(|(p, i)| format!("io{p}.{i}")).collect();
    assert!(
        expected.contains(name.as_deref().unwrap()),
        "{name:?} not in {expected:?}"
    );
}

#[test]
fn the_default_name_is_kernel_style_and_a_nul_cuts_a_custom_one() {
    let wq = Workqueue::builder("th-default").build().unwrap();
    let (name, pool) = wq
        .spawn(|| {
            let name = std::thread::current().name().map(str::to_owned);
            (name.unwrap(), podq::current().unwrap().pool)
        })
        .join()
        .unwrap();
    assert!(name.starts_with(&format!("podq/u{pool}:")), "{name}");

    let wq = Workqueue::builder("th-nul")
        .thread_name(|_, _| "cut\0here".to_owned())
        .build()
        .unwrap();
    let name = wq
        .spawn(|| std::thread::current().name().map(str::to_owned))
        .join()
        .unwrap();
    assert_eq!(name.as_deref(), Some("cut"));
}

#[test]
fn a_panicking_name_function_falls_back_to_the_default_name_and_is_reported() {
    let reports: Arc<Mutex<Vec<String>>> = Arc::default();
    let r = reports.clone();
    let wq = Workqueue::builder("th-name-panic")
        .thread_name(|_, _| panic!("expected test panic"))
        .panic_hook(move |p| r.lock().unwrap().push(p.message.to_owned()))
        .build()
        .unwrap();
    let name = wq
        .spawn(|| std::thread::current().name().map(str::to_owned))
        .join()
        .unwrap()
        .unwrap();
    assert!(name.starts_with("podq/u"), "{name}");
    let reports = reports.lock().unwrap();
    assert!(
        reports
            .iter()
            .any(|m| m.contains("thread name function panicked")),
        "{reports:?}"
    );
}

#[test]
fn stack_size_reaches_the_workers_and_zero_is_refused() {
    const BYTES: usize = 9 << 20;
    let wq = Workqueue::builder("th-stack")
        .stack_size(BYTES)
        .build()
        .unwrap();
    let size = wq.spawn(my_stack_size).join().unwrap();
    assert!(size >= BYTES, "worker stack {size} < {BYTES}");
    let default = Workqueue::builder("th-stack-default").build().unwrap();
    assert!(default.spawn(my_stack_size).join().unwrap() < BYTES);

    let err = Workqueue::builder("th-stack-0")
        .stack_size(0)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidStackSize { bytes: 0 }));
    assert!(err.to_string().contains("stack size 0"), "{err}");
}

#[derive(Default)]
struct Seen {
    started: Vec<(Option<u64>, usize, String, bool)>,
    stopped: Vec<(Option<u64>, usize)>,
}

#[test]
fn start_and_stop_hooks_run_on_every_worker_and_the_rescuer() {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (s1, s2) = (seen.clone(), seen.clone());
    let wq = Workqueue::builder("th-hooks")
        .topology(Topology::synthetic("1s4c1t").unwrap())
        .rescuer(true)
        .on_thread_start(move |t| {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            s1.lock().unwrap().started.push((
                t.pool,
                t.index,
                name,
                t.workqueue == "th-hooks" && !t.cpus.is_empty(),
            ));
        })
        .on_thread_stop(move |t| s2.lock().unwrap().stopped.push((t.pool, t.index)))
        .build()
        .unwrap();
    let pools: HashSet<u64> = (0..32)
        .map(|_| wq.spawn(|| podq::current().unwrap().pool))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    drop(wq); // stops the pools and the rescuer, and joins them
    let seen = seen.lock().unwrap();
    assert!(seen.started.iter().all(|s| s.3), "{:?}", seen.started);
    let rescuers: Vec<_> = seen.started.iter().filter(|s| s.0.is_none()).collect();
    assert_eq!(rescuers.len(), 1, "{:?}", seen.started);
    assert_eq!(rescuers[0].2, "podq/R-th-hooks");
    for pool in &pools {
        assert!(
            seen.started.iter().any(|s| s.0 == Some(*pool)),
            "no start hook on pool {pool}"
        );
    }
    let mut started: Vec<_> = seen.started.iter().map(|s| (s.0, s.1)).collect();
    let mut stopped = seen.stopped.clone();
    started.sort();
    stopped.sort();
    assert_eq!(started, stopped, "every started thread stopped once");
}

#[test]
fn a_panicking_start_hook_is_reported_and_the_worker_still_runs_items() {
    let reports = common::counter();
    let r = reports.clone();
    let wq = Workqueue::builder("th-hook-panic")
        .on_thread_start(|_| panic!("expected test panic"))
        .panic_hook(move |p| {
            if p.message.contains("on_thread_start panicked") {
                r.fetch_add(1, SeqCst);
            }
        })
        .build()
        .unwrap();
    assert_eq!(wq.spawn(|| 42).join().unwrap(), 42);
    assert!(reports.load(SeqCst) >= 1);
}

#[test]
fn workqueues_with_thread_options_get_pools_of_their_own() {
    let topo = Topology::synthetic("1s2c1t").unwrap();
    let build = |name: &str| Workqueue::builder(name).topology(topo.clone());
    let ids = |wq: &Workqueue| -> Vec<u64> { wq.stats().pools.iter().map(|p| p.id).collect() };
    let a = build("th-share-a").build().unwrap();
    let b = build("th-share-b").build().unwrap();
    assert_eq!(ids(&a), ids(&b), "default options share pools");
    let c = build("th-share-c").stack_size(4 << 20).build().unwrap();
    assert!(ids(&c).iter().all(|id| !ids(&a).contains(id)));
}
