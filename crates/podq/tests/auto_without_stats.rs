//! A build without the `stats` feature refuses the `auto` scope wherever a scope is set:
//! `auto` chooses from the statistics, which that build does not record, so it would
//! sit at its starting scope while reporting `auto`. (With the feature, `auto.rs` tests
//! what it does; this binary is then empty.)
#![cfg(not(feature = "stats"))]

use podq::testing::fake_topology;
use podq::{Error, Scope, Workqueue};

mod common;

#[test]
fn builder_and_live_changes_refuse_auto() {
    let refused = Workqueue::builder("nostats-auto")
        .topology(fake_topology(1, 1, 2, 1))
        .scope(Scope::Auto)
        .build();
    let err = refused.unwrap_err();
    assert!(matches!(err, Error::AutoNeedsStats), "{err:?}");
    assert!(err.to_string().contains("`stats` feature"), "{err}");

    let wq = Workqueue::builder("nostats-smt")
        .topology(fake_topology(1, 1, 2, 2))
        .scope(Scope::Smt)
        .build()
        .unwrap();
    assert!(matches!(
        wq.set_scope(Scope::Auto),
        Err(Error::AutoNeedsStats)
    ));
    assert_eq!(
        wq.attrs().scope,
        Scope::Smt,
        "a refused change changes nothing"
    );
    assert_eq!(wq.effective_scope(), Scope::Smt);
    assert_eq!(wq.spawn(|| 5).join().unwrap(), 5);
}

#[test]
fn the_process_default_refuses_auto() {
    let before = podq::default_scope();
    assert!(matches!(
        podq::set_default_scope(Scope::Auto),
        Err(Error::AutoNeedsStats)
    ));
    assert_eq!(podq::default_scope(), before);
}

/// Run by `auto_from_the_environment_is_refused` in a child process with
/// `PODQ_DEFAULT_AFFINITY_SCOPE=auto`; does nothing otherwise.
#[test]
fn auto_env_child() {
    if std::env::var_os("PODQ_TEST_AUTO_ENV_CHILD").is_none() {
        return;
    }
    assert_eq!(podq::default_scope(), Scope::CacheShard);
    let refused = Workqueue::builder("nostats-env-default")
        .topology(fake_topology(1, 1, 2, 1))
        .build();
    assert!(matches!(refused, Err(Error::AutoNeedsStats)), "{refused:?}");
    let named = Workqueue::builder("nostats-env-named")
        .topology(fake_topology(1, 1, 2, 1))
        .scope(Scope::Cpu)
        .build()
        .unwrap();
    assert_eq!(named.spawn(|| 1).join().unwrap(), 1);
}

#[test]
fn auto_from_the_environment_is_refused() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "auto_env_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PODQ_TEST_AUTO_ENV_CHILD", "1")
        .env("PODQ_DEFAULT_AFFINITY_SCOPE", "auto")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stderr}");
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("`stats` feature"))
            .count(),
        1,
        "one warning saying why:\n{stderr}"
    );
}

#[cfg(feature = "control")]
#[test]
fn the_control_plane_refuses_auto() {
    use common::{control, request};

    let mut ctl = control();
    let wq = Workqueue::builder("nostats_ctl")
        .topology(fake_topology(1, 1, 4, 2))
        .scope(Scope::Smt)
        .build()
        .unwrap();
    wq.expose().unwrap();
    for line in [
        r#"{"cmd":"set","queue":"nostats_ctl","attr":"affinity_scope","value":"auto"}"#,
        r#"{"cmd":"set_default_scope","value":"auto"}"#,
    ] {
        let refused = ctl.client.call(&request(line));
        let error = refused.expect_err(line).to_string();
        assert!(error.contains("`stats` feature"), "{line}: {error}");
    }
    assert_eq!(wq.attrs().scope, Scope::Smt);
}
