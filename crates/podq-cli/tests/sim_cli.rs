//! `podq sim` from the command line: tables, JSON in bench's schema, determinism, and
//! the errors for input it refuses.

use std::process::{Command, Output};

fn podq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(args)
        .output()
        .expect("podq runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `podq sim ARGS --json - -q`, which must succeed, as JSON.
fn sim_json(args: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = ["sim"]
        .iter()
        .chain(args)
        .chain(&["--json", "-", "-q"])
        .copied()
        .collect();
    let out = podq(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Drops the `wall` objects: the only fields that differ between identical runs.
fn without_wall(mut v: serde_json::Value) -> serde_json::Value {
    for r in v["results"].as_array_mut().unwrap() {
        r["sim"].as_object_mut().unwrap().remove("wall").unwrap();
    }
    v
}

const SMALL: &[&str] = &[
    "sim",
    "completion",
    "--machine",
    "xeon-12c",
    "--cq",
    "3",
    "--scopes",
    "smt,cache",
    "--strict",
    "off",
    "--duration",
    "2ms",
    "--warmup",
    "1ms",
    "--json",
    "-",
    "-q",
];

#[test]
fn json_follows_the_bench_schema_and_is_reproducible() {
    let a = podq(SMALL);
    assert!(a.status.success(), "{}", stderr(&a));
    let json: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(json["schema_version"], 2);
    assert_eq!(json["workload"], "completion");
    assert_eq!(json["topology"]["cpus"], 24);
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["system"], "podq-sim");
        assert_eq!(r["test"], "completion");
        assert!(r["items"].as_u64().unwrap() > 0);
        assert!(r["completion"]["mb_per_sec"].as_f64().unwrap() > 0.0);
        assert!(r["pool_locks"]["enqueue"]["acquisitions"].as_u64().unwrap() > 0);
        let sim = &r["sim"];
        assert_eq!(sim["machine"], "xeon-12c");
        assert_eq!(sim["parameters"]["c2c_llc"], 43.0);
        assert!(sim["events"].as_u64().unwrap() > 1000);
        assert!(sim["wall"]["events_per_sec"].as_f64().unwrap() > 0.0);
    }
    // The tables went to stderr.
    assert!(stderr(&a).contains("rpciod scope"), "{}", stderr(&a));
    let b = podq(SMALL);
    let b: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
    assert_eq!(
        serde_json::to_string(&without_wall(json.clone())).unwrap(),
        serde_json::to_string(&without_wall(b)).unwrap()
    );
    let mut other = SMALL.to_vec();
    other.extend(["--seed", "9"]);
    let c: serde_json::Value = serde_json::from_slice(&podq(&other).stdout).unwrap();
    // Another seed, another run: its jitter gives other event counts.
    assert_ne!(
        json["results"][0]["sim"]["events"],
        c["results"][0]["sim"]["events"]
    );
}

#[test]
fn the_ring_model_is_chosen_and_recorded() {
    let run = |worklist: &str| {
        sim_json(&[
            "queue",
            "--machine",
            "grace-72c",
            "--scopes",
            "cache",
            "--strict",
            "off",
            "--duration",
            "1ms",
            "--warmup",
            "200us",
            "--worklist",
            worklist,
        ])
    };
    let (locked, ring) = (run("locked"), run("ring"));
    assert_eq!(locked["settings"]["worklist"], "locked");
    assert_eq!(ring["settings"]["worklist"], "ring");
    // A different model of the one `cache` pool: a different run.
    assert_ne!(locked["results"][0]["items"], ring["results"][0]["items"]);
    let bad = podq(&["sim", "queue", "--worklist", "spinlock"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("spinlock"), "{}", stderr(&bad));
}

#[test]
fn the_worker_cap_is_chosen_and_recorded() {
    let run = |cap: &str| {
        sim_json(&[
            "completion",
            "--cq",
            "8",
            "--scopes",
            "smt",
            "--strict",
            "off",
            "--duration",
            "2ms",
            "--warmup",
            "500us",
            "--worker-cap",
            cap,
        ])
    };
    let (podq_cap, kernel) = (run("pod-cpus"), run("unlimited"));
    assert_eq!(podq_cap["settings"]["worker_cap"], "pod-cpus");
    assert_eq!(kernel["settings"]["worker_cap"], "unlimited");
    let created = |json: &serde_json::Value| json["results"][0]["sim"]["workers_created"].as_u64();
    assert!(created(&kernel) > created(&podq_cap), "{kernel} {podq_cap}");
    let bad = podq(&["sim", "queue", "--worker-cap", "none"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("none"), "{}", stderr(&bad));
}

#[test]
fn the_cpu_intensive_threshold_is_chosen_and_recorded() {
    // Items of 20 ms on the two CPUs of a one-pod `cache` pool, four in flight.
    let run = |threshold: &str| {
        sim_json(&[
            "throughput",
            "--synthetic",
            "1s2c1t",
            "--scopes",
            "cache",
            "--strict",
            "off",
            "--producers",
            "1",
            "--depth",
            "4",
            "--item-work",
            "20ms",
            "--duration",
            "100ms",
            "--warmup",
            "0s",
            "--cpu-intensive",
            threshold,
        ])
    };
    let (on, off) = (run("5ms"), run("off"));
    assert_eq!(on["settings"]["cpu_intensive"], "5ms");
    assert_eq!(off["settings"]["cpu_intensive"], serde_json::Value::Null);
    let demoted = |json: &serde_json::Value| json["results"][0]["sim"]["cpu_intensive"].as_u64();
    assert_eq!(demoted(&off), Some(0));
    assert!(demoted(&on) > Some(0), "{on}");
    for bad in ["500us", "soon", "-1ms"] {
        let out = podq(&["sim", "queue", &format!("--cpu-intensive={bad}")]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(stderr(&out).contains(bad), "{}", stderr(&out));
    }
}

#[test]
fn ladder_prints_queue_and_latency_tables() {
    let out = podq(&[
        "sim",
        "--machine",
        "grace-72c",
        "--scopes",
        "cache_shard",
        "--strict",
        "on",
        "--duration",
        "1ms",
        "--warmup",
        "0s",
        "-q",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("queue: 72 producer(s)"), "{text}");
    assert!(text.contains("ctxsw/1k items"), "{text}");
    assert!(text.contains("latency: one submitter"), "{text}");
    assert!(text.contains("cache_shard strict"), "{text}");
    assert!(text.contains("M events/s"), "{text}");
}

#[test]
fn print_cost_lists_every_parameter_with_its_source() {
    let out = podq(&["sim", "--print-cost", "--machine", "epyc-2s32c"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("machine epyc-2s32c"));
    assert!(text
        .lines()
        .any(|l| l.starts_with("c2c_cross_llc") && l.contains("103")));
    assert!(text.contains("§1.2"));
    assert!(text
        .lines()
        .any(|l| l.starts_with("nic_rate") && l.contains(" 25 ") && l.contains("ConnectX-6")));
}

#[test]
fn sensitivity_names_the_parameters_it_cannot_move() {
    let out = podq(&[
        "sim",
        "queue",
        "--machine",
        "xeon-12c",
        "--scopes",
        "cache",
        "--strict",
        "off",
        "--producers",
        "2",
        "--duration",
        "200us",
        "--warmup",
        "0ms",
        "--sensitivity",
        "-q",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    // Both are 0 on a single-socket profile.
    assert!(
        text.contains(
            "not swept, 0 here (set them with --cost to try): remote_home, lock_spinner_factor"
        ),
        "{text}"
    );
    assert!(text.contains("queue cache: base"), "{text}");
    assert!(text.contains("(seed +1, +2: noise)"), "{text}");
}

#[test]
fn cost_files_override_and_bad_ones_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let good = file("good.json", r#"{"wake": 4000}"#);
    let out = podq(&["sim", "--print-cost", "--cost", &good]);
    assert!(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with("wake ") && l.contains(" 4000 ")));
    for (text, expect) in [
        (r#"{"wake": -5}"#, "`wake` = -5 is out of range: negative"),
        (r#"{"wake": "soon"}"#, "`wake` is not a number"),
        (r#"{"wakeup": 1}"#, "unknown parameter `wakeup`"),
        ("not json", "not valid JSON"),
    ] {
        let path = file("bad.json", text);
        let out = podq(&["sim", "queue", "--cost", &path]);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(stderr(&out).contains(expect), "{text}: {}", stderr(&out));
    }
}

#[test]
fn input_the_simulator_refuses_is_named() {
    for (args, expect) in [
        (
            &["sim", "--machine", "pdp-11"][..],
            "unknown machine `pdp-11`",
        ),
        (
            &["sim", "queue", "--rounds", "3"][..],
            "--rounds makes no sense for the simulator",
        ),
        (
            &["sim", "queue", "--systems", "rayon"][..],
            "--systems makes no sense",
        ),
        (
            &["sim", "queue", "--toggle", "smt,cache"][..],
            "--toggle makes no sense",
        ),
        (
            &["sim", "latency", "--depth", "4"][..],
            "--depth makes no sense",
        ),
        (
            &["sim", "queue", "--duration", "20s"][..],
            "at most 10 s of virtual time",
        ),
        (
            &["sim", "queue", "--synthetic", "4s64c8t"][..],
            "at most 1024",
        ),
        (
            &["sim", "latency", "--cpu", "500"][..],
            "--cpu 500 is not a usable CPU",
        ),
        (
            &["sim", "completion", "--cq-placement", "0-3,999"][..],
            "CPU 999",
        ),
        (
            &["sim", "queue", "--io-size", "65536"][..],
            "--io-size makes no sense",
        ),
        (
            &["sim", "completion", "--io-size", "0"][..],
            "--io-size 0: an I/O's payload is 1 to 1073741824 bytes",
        ),
        // The allocator model's limits, as `podq bench` has them.
        (
            &["sim", "completion", "--object-size", "0"][..],
            "--object-size 0 is out of range 1..=4096 bytes",
        ),
        (
            &["sim", "completion", "--alloc-cache", "1"][..],
            "--alloc-cache must be at least 2 objects",
        ),
    ] {
        let out = podq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn bench_with_sim_prints_real_and_simulated_side_by_side() {
    let out = podq(&[
        "bench",
        "queue",
        "--topology",
        "fake:1s2c1t",
        "--scopes",
        "cpu",
        "--strict",
        "off",
        "--duration",
        "50ms",
        "--rounds",
        "1",
        "--sim",
        "xeon-12c",
        "-q",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("real against simulated"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("queue  cpu"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        row.split_whitespace().filter(|c| *c == "-").count(),
        0,
        "{row}"
    );
    // One definition for both: the item work bench spins is the simulated items' CPU time.
    let out = podq(&[
        "bench",
        "latency",
        "--topology",
        "fake:1s2c1t",
        "--scopes",
        "cpu",
        "--strict",
        "off",
        "--duration",
        "30ms",
        "--rounds",
        "1",
        "--item-work",
        "300us",
        "--sim",
        "xeon-12c",
        "-q",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .skip_while(|l| !l.contains("real against simulated"))
        .find(|l| l.starts_with("latency"))
        .unwrap_or_else(|| panic!("{text}"));
    // test, scope, real items/s, sim items/s, real p50 (value unit), sim p50 (value unit).
    let cells: Vec<&str> = row.split_whitespace().collect();
    for (value, unit) in [(cells[4], cells[5]), (cells[6], cells[7])] {
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("{row}"));
        let us = match unit {
            "µs" => v,
            "ms" => v * 1000.0,
            _ => panic!("{row}"),
        };
        assert!(us >= 300.0, "a clat below the item's work: {row}");
    }
    for (args, expect) in [
        (
            &["bench", "peers", "--sim", "xeon-12c"][..],
            "no simulated counterpart",
        ),
        (
            &["bench", "queue", "--sim", "vax"][..],
            "unknown machine `vax`",
        ),
    ] {
        let out = podq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(expect), "{}", stderr(&out));
    }
}

/// The output of a `podq` run that must succeed.
fn stdout_of(args: &[&str]) -> String {
    let out = podq(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first line of `text` that starts with `prefix`.
fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starts with {prefix:?}:\n{text}"))
}

/// The side-by-side table names the `podq sim` options where its defaults differ from
/// bench's; `podq sim` given them reproduces the simulated figure exactly.
#[test]
fn bench_with_sim_names_the_sim_command_that_reproduces_it() {
    let length = ["--scopes", "cpu", "--strict", "off", "--items", "3000"];
    let mut bench = vec!["bench", "throughput", "--systems", "podq", "--rounds", "1"];
    bench.extend(["--topology", "fake:1s2c1t", "--sim", "xeon-12c", "-q"]);
    bench.extend(length);
    let text = stdout_of(&bench);
    let header = line_starting(&text, "real against simulated");
    let command = header
        .split_once("(podq ")
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(command, _)| command)
        .unwrap_or_else(|| panic!("{header}"));
    assert!(command.contains("--item-work 0s"), "{header}");
    // test, scope, real items/s (value unit), sim items/s (value unit), ...
    let rate = |row: &str| row.split_whitespace().nth(4).unwrap().to_owned();
    let simulated = text
        .lines()
        .skip_while(|l| !l.starts_with("real against simulated"))
        .find(|l| l.starts_with("throughput_work  cpu"))
        .map(|row| format!("{} M", rate(row)))
        .unwrap_or_else(|| panic!("{text}"));
    let mut sim: Vec<&str> = command.split_whitespace().collect();
    sim.insert(1, "throughput");
    sim.extend(length);
    sim.push("-q");
    let table = stdout_of(&sim);
    let direct: Vec<&str> = line_starting(&table, "cpu ").split_whitespace().collect();
    assert_eq!(
        format!("{} {}", direct[1], direct[2]),
        simulated,
        "{sim:?}\n{table}\n{text}"
    );
}

#[test]
fn output_paths_are_checked_before_the_simulation() {
    // Checked after the run, these would print a table first (and take minutes).
    let out = podq(&[
        "sim",
        "queue",
        "--duration",
        "5s",
        "--json",
        "/nonexistent/dir/x.json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/dir/x.json"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty(), "the simulation ran first");
    let out = podq(&["sim", "queue", "--duration", "5s", "--plot", "out.png"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("SVG"), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "the simulation ran first");
    assert!(!std::path::Path::new("out.png").exists());
}
