//! Runs the example programs briefly: each must finish its own check. (`cargo test`
//! builds the examples next to the test binaries; `common::example` refuses a stale
//! one.)

use std::process::Command;

mod common;

use common::example;

fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(example(name)).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn pipeline_completes_every_request_once() {
    let out = run("pipeline", &["--requests", "3000", "--scope", "cpu"]);
    assert!(out.starts_with("pipeline: 3000 of 3000 requests"), "{out}");
    // The per-stage lines print the statistics, which a build without them reads as 0.
    if !cfg!(feature = "stats") {
        return;
    }
    for stage in ["parse", "compute", "reply"] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(stage))
            .unwrap_or_else(|| panic!("no {stage} line in {out}"));
        assert!(line.contains(" 3000 items"), "{line}");
    }
}

#[test]
fn service_writes_everything_it_ingested() {
    let out = run("service", &["--seconds", "1", "--rate", "300"]);
    assert!(out.starts_with("service: pid "), "{out}");
    let last = out.lines().last().unwrap();
    let counts: Vec<u64> = last
        .trim_start_matches("service: ingested ")
        .split(", written ")
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 2, "{last}");
    assert!(counts[0] > 0 && counts[0] == counts[1], "{last}");
}

#[test]
fn blocking_times_both_kinds() {
    let out = run(
        "blocking",
        &["--items", "4", "--sleep-ms", "5", "--rounds", "1"],
    );
    assert!(out.contains("without"), "{out}");
    assert!(out.contains("with podq::blocking"), "{out}");
}

#[test]
fn examples_print_help() {
    for name in ["pipeline", "service", "blocking"] {
        let out = run(name, &["--help"]);
        assert!(out.contains("Examples:"), "{name}: {out}");
    }
}
