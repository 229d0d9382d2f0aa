//! The process default scope (its own test binary: it changes process-wide state).

use std::sync::Mutex;

use podq::testing::fake_topology;
use podq::{Error, Scope, Workqueue};

/// Serialises the tests that change the process default.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn default_scope_follows_live_changes() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let topo = fake_topology(2, 1, 2, 1);
    let follows = Workqueue::builder("d-follows")
        .topology(topo.clone())
        .build()
        .unwrap();
    let fixed = Workqueue::builder("d-fixed")
        .topology(topo)
        .scope(Scope::Cpu)
        .build()
        .unwrap();
    assert_eq!(follows.attrs().scope, Scope::Default);
    assert_eq!(follows.effective_scope(), podq::default_scope());

    podq::set_default_scope(Scope::Numa).unwrap();
    assert_eq!(podq::default_scope(), Scope::Numa);
    assert_eq!(follows.effective_scope(), Scope::Numa);
    assert_eq!(
        fixed.effective_scope(),
        Scope::Cpu,
        "only `default` queues follow"
    );
    let pods: Vec<String> = follows
        .stats()
        .pools
        .iter()
        .map(|p| p.pod_cpus.clone())
        .collect();
    assert!(
        pods.contains(&"0-1".to_owned()) && pods.contains(&"2-3".to_owned()),
        "{pods:?}"
    );

    podq::set_default_scope(Scope::System).unwrap();
    assert_eq!(follows.effective_scope(), Scope::System);
    assert_eq!(follows.spawn(|| 3).join().unwrap(), 3);
    follows.flush();

    assert!(matches!(
        podq::set_default_scope(Scope::Default),
        Err(Error::DefaultScope { .. })
    ));
    assert_eq!(
        podq::default_scope(),
        Scope::System,
        "a refused change changes nothing"
    );
}

/// Run by `a_bad_environment_default_warns_once` in a child process with
/// `PODQ_DEFAULT_AFFINITY_SCOPE=bogus`; does nothing otherwise.
#[test]
fn bad_env_child() {
    if std::env::var_os("PODQ_TEST_BAD_ENV_CHILD").is_none() {
        return;
    }
    let wq = Workqueue::builder("d-bad-env")
        .topology(fake_topology(1, 1, 2, 1))
        .scope(Scope::Cpu)
        .build()
        .unwrap();
    assert_eq!(podq::default_scope(), Scope::CacheShard);
    assert_eq!(podq::default_scope(), Scope::CacheShard);
    assert_eq!(wq.spawn(|| 1).join().unwrap(), 1);
    let refused = Workqueue::builder("d-bad-env-default").build();
    assert!(matches!(refused, Err(Error::Topology(_))), "{refused:?}");
}

#[test]
fn a_bad_environment_default_warns_once() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "bad_env_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PODQ_TEST_BAD_ENV_CHILD", "1")
        .env("PODQ_DEFAULT_AFFINITY_SCOPE", "bogus")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stderr}");
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("PODQ_DEFAULT_AFFINITY_SCOPE") && l.contains("bogus"))
        .count();
    assert_eq!(
        warnings, 1,
        "one warning naming the variable and value:\n{stderr}"
    );
}

/// `set_default_scope` while workqueues on `default` are dropped: a workqueue being
/// torn down is left alone (it gets no new pools), every live one follows, every item
/// runs once, and the pools of the dropped ones go with them.
#[test]
fn default_scope_changes_racing_teardown() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    let topo = fake_topology(2, 1, 2, 1);
    // Worker threads (`podq/u…`); the process-wide manager and watchdog may start
    // meanwhile and stay.
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                let comm = t.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).is_ok_and(|c| c.starts_with("podq/u"))
            })
            .count()
    };
    let before_threads = threads();
    let stop = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let droppers: Vec<_> = (0..2)
        .map(|d| {
            let (topo, stop, runs) = (topo.clone(), stop.clone(), runs.clone());
            std::thread::spawn(move || {
                let mut built = 0;
                while !stop.load(SeqCst) {
                    let wq = Workqueue::builder(format!("d-race-{d}"))
                        .topology(topo.clone())
                        .idle_timeout(std::time::Duration::from_millis(2001))
                        .build()
                        .unwrap();
                    for _ in 0..20 {
                        let runs = runs.clone();
                        drop(wq.spawn(move || {
                            runs.fetch_add(1, SeqCst);
                        }));
                    }
                    drop(wq);
                    built += 1;
                }
                built
            })
        })
        .collect();
    let scopes = [Scope::Cpu, Scope::Numa, Scope::System, Scope::CacheShard];
    let start = std::time::Instant::now();
    let mut changes = 0;
    while start.elapsed() < std::time::Duration::from_millis(500) {
        podq::set_default_scope(scopes[changes % scopes.len()]).unwrap();
        changes += 1;
    }
    stop.store(true, SeqCst);
    let built: usize = droppers.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(runs.load(SeqCst), 20 * built, "every item ran once");
    podq::set_default_scope(Scope::CacheShard).unwrap();
    assert!(
        podq::stats::all()
            .iter()
            .all(|s| !s.name.starts_with("d-race-")),
        "a dropped workqueue stays gone"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while threads() > before_threads && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        threads() <= before_threads,
        "{} threads after {built} workqueues and {changes} changes, {before_threads} before: {:?}",
        threads(),
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .collect::<Vec<_>>()
    );
}
