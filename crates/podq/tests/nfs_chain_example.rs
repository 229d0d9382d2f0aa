//! Runs `examples/nfs_chain` and changes its queues' scopes live through the control
//! socket while it runs; it must still run every completion once on each queue.
//! (`cargo test` builds the examples next to the test binaries.)

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use podq::control::{Client, Request};

mod common;

/// The `nfs_chain` example (`common::example` refuses a missing or stale one).
fn example() -> PathBuf {
    common::example("nfs_chain")
}

#[test]
fn scopes_change_live_under_load() {
    let mut child = Command::new(example())
        .args(["--seconds", "3", "--topology", "1s2c2t", "--rate", "300"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let socket = first
        .split_once(" socket ")
        .map(|(_, path)| PathBuf::from(path))
        .unwrap_or_else(|| panic!("unexpected first line: {first}"));
    let pid = first.split_whitespace().nth(2).unwrap();
    assert_eq!(pid, child.id().to_string());

    let mut client = Client::connect(&socket, Duration::from_secs(10)).unwrap();
    let names: Vec<String> = client
        .call(&Request::List)
        .unwrap()
        .queues
        .unwrap()
        .into_iter()
        .map(|q| q.name)
        .collect();
    assert_eq!(names, ["nfsiod", "rpciod"]);
    for (queue, attr, value) in [
        ("rpciod", "affinity_scope", "cpu"),
        ("nfsiod", "affinity_scope", "smt"),
        ("rpciod", "affinity_strict", "1"),
        ("nfsiod", "affinity_scope", "system"),
        ("rpciod", "affinity_scope", "default"),
    ] {
        let set = Request::Set {
            queue: queue.into(),
            attr: attr.into(),
            value: value.into(),
        };
        client.call(&set).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let get = Request::Get {
        queue: "nfsiod".into(),
        attr: "affinity_scope".into(),
    };
    assert_eq!(client.call(&get).unwrap().value.unwrap(), "system");
    let stats = client
        .call(&Request::Stats { queue: None })
        .unwrap()
        .stats
        .unwrap();
    assert_eq!(stats.len(), 2);
    if cfg!(feature = "stats") {
        assert!(stats.iter().all(|s| s.totals.started > 0));
    }
    drop(client);

    let status = child.wait().unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(status.success(), "{rest:?}");
    assert!(
        rest.iter()
            .any(|l| l == "nfs_chain: every completion ran once on each queue"),
        "{rest:?}"
    );
    assert!(!socket.exists(), "the socket is removed at exit");
}

#[test]
fn help_prints_the_options() {
    let out = Command::new(example()).arg("--help").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--seconds",
        "--producers",
        "--rate",
        "--topology",
        "Examples:",
    ] {
        assert!(text.contains(option), "{option} missing in:\n{text}");
    }
}

#[test]
fn a_closed_stdout_does_not_stop_the_check() {
    // The reader has gone before the first line: every write meets a broken pipe.
    let mut child = Command::new(example())
        .args(["--seconds", "0.3", "--rate", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
