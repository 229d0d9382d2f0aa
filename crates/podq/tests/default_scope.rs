//! The process default scope (its own test binary: it changes process-wide state).

use podq::testing::fake_topology;
use podq::{Error, Scope, Workqueue};

#[test]
fn default_scope_follows_live_changes() {
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
