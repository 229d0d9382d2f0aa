//! `podq topo` end to end: fixture pods through `--json`, the terminal form, errors and
//! exit codes, and a capture read back.

use std::process::{Command, Output};

use serde_json::Value;

#[path = "../../podq-topology/tests/support/fixtures_dir.rs"]
mod fixtures_dir;
use fixtures_dir::fixtures_dir;

fn podq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(args)
        .env_remove("PODQ_DEFAULT_AFFINITY_SCOPE")
        .output()
        .expect("run podq")
}

fn stdout_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

#[test]
fn json_on_a_fixture_matches_its_pods_file() {
    let dir = fixtures_dir();
    let name = "memorysidecaches";
    let tarball = dir.join(format!("{name}.tar.gz"));
    let got = stdout_json(&podq(&[
        "topo",
        "--sysfs-root",
        tarball.to_str().unwrap(),
        "--json",
    ]));
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.pods.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(got["cpus"], want["cpus"]);
    assert_eq!(got["scopes"], want["scopes"]);
    assert_eq!(got["default_scope"], "cache_shard");
}

#[test]
fn terminal_form_shows_every_scope_with_pods_and_nodes() {
    let out = podq(&["topo", "--synthetic", "2s2n4c2t"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for header in [
        "CPU: 32 pods",
        "SMT: 16 pods",
        "CACHE: 4 pods",
        "CACHE_SHARD (default): 4 pods",
        "NUMA: 4 pods",
        "SYSTEM: 1 pod",
    ] {
        assert!(text.contains(header), "missing `{header}` in\n{text}");
    }
    // Node 3's pod holds the last core of each thread row: CPUs 12-15 and 28-31.
    assert!(text.contains("12-15,28-31"), "{text}");
}

#[test]
fn shard_size_and_default_scope_apply() {
    let got = stdout_json(&podq(&[
        "topo",
        "--synthetic",
        "1s12c",
        "--shard-size",
        "4",
        "--json",
    ]));
    assert_eq!(got["scopes"]["cache_shard"].as_array().unwrap().len(), 3);
    assert_eq!(got["shard_size"], 4);
    let out = Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(["topo", "--synthetic", "1s4c"])
        .env("PODQ_DEFAULT_AFFINITY_SCOPE", "numa")
        .output()
        .unwrap();
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("NUMA (default)"));
    let out = Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(["topo", "--synthetic", "1s4c"])
        .env("PODQ_DEFAULT_AFFINITY_SCOPE", "cach")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PODQ_DEFAULT_AFFINITY_SCOPE"));
}

#[test]
fn a_bad_root_exits_1_naming_the_path() {
    let out = podq(&["topo", "--sysfs-root", "/no/such/podq-root"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/no/such/podq-root"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let out = podq(&["topo", "--sysfs-root", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sys/devices/system/cpu"), "{err}");
}

#[test]
fn a_bad_shape_and_other_usage_errors_exit_2() {
    // The same rule as `podq bench --synthetic 2s0c`: a bad command-line value.
    for args in [
        &["topo", "--synthetic", "2s0c"][..],
        &["bench", "queue", "--synthetic", "2s0c"][..],
    ] {
        let out = podq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("`2s0c`"));
    }
    assert_eq!(podq(&["topo", "--scope", "cach"]).status.code(), Some(2));
    assert_eq!(
        podq(&["topo", "--summary", "--json"]).status.code(),
        Some(2)
    );
    assert_eq!(podq(&["topo", "--shard-size", "0"]).status.code(), Some(2));
    assert_eq!(podq(&["topo", "--bogus"]).status.code(), Some(2));
    assert_eq!(
        podq(&["topo", "--synthetic", "1s2c", "--sysfs-root", "/"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn capture_then_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("machine.tar.gz");
    let out = podq(&["topo", "--capture", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let back = stdout_json(&podq(&[
        "topo",
        "--sysfs-root",
        file.to_str().unwrap(),
        "--json",
    ]));
    let live = stdout_json(&podq(&["topo", "--json"]));
    // The live view may be narrowed by affinity or cgroup; every live CPU is captured.
    let captured: Vec<u64> = back["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    for cpu in live["cpus"].as_array().unwrap() {
        assert!(captured.contains(&cpu.as_u64().unwrap()));
    }
    if back["cpus"] == live["cpus"] {
        assert_eq!(back["scopes"], live["scopes"]);
    }
}

#[test]
fn json_names_its_schema_and_source() {
    let got = stdout_json(&podq(&["topo", "--synthetic", "1s4c", "--json"]));
    assert_eq!(got["schema_version"], 1);
    assert_eq!(got["source"], "synthetic:1s4c");
    assert_eq!(stdout_json(&podq(&["topo", "--json"]))["source"], "live");
}

#[test]
fn one_scope_and_the_summary_for_big_machines() {
    let got = stdout_json(&podq(&[
        "topo",
        "--synthetic",
        "2s4c2t",
        "--scope",
        "smt",
        "--json",
    ]));
    let scopes: Vec<&String> = got["scopes"].as_object().unwrap().keys().collect();
    assert_eq!(scopes, ["smt"]);
    assert_eq!(got["scopes"]["smt"][0], serde_json::json!([0, 8]));
    // `default` is the scope it resolves to.
    let got = stdout_json(&podq(&[
        "topo",
        "--synthetic",
        "2s4c2t",
        "--scope",
        "default",
        "--json",
    ]));
    assert!(got["scopes"]["cache_shard"].is_array(), "{got}");

    let out = podq(&["topo", "--synthetic", "64s64c4t", "--summary"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // A heading of 4 lines, a blank, the table's header and one row per scope.
    assert_eq!(text.lines().count(), 4 + 1 + 1 + 6, "{text}");
    let smt = text.lines().find(|l| l.starts_with("smt ")).unwrap();
    let cells: Vec<&str> = smt.split_whitespace().collect();
    assert_eq!(&cells[..4], ["smt", "4096", "4", "0-63"], "{smt}");
    assert!(text.contains("cache_shard (default)"), "{text}");
}
