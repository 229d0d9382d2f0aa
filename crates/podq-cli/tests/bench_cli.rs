//! `podq bench` end to end with tiny sizes: every workload runs and its JSON has the
//! documented fields. Timing values are not checked; benchmarks are not tests.

use std::process::{Command, Output};

use serde_json::Value;

fn podq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(args)
        .output()
        .expect("the podq binary runs")
}

fn json_of(args: &[&str]) -> Value {
    let out = podq(args);
    assert!(
        out.status.success(),
        "podq {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Checks the fields every result carries and returns the results.
fn results(report: &Value, workload: &str) -> Vec<Value> {
    assert_eq!(report["schema_version"], 2);
    assert_eq!(report["workload"], workload);
    assert!(report["topology"]["cpus"].as_u64().unwrap() >= 1);
    assert!(report["settings"].is_object());
    let results = report["results"].as_array().expect("results array").clone();
    assert!(!results.is_empty());
    for r in &results {
        for key in [
            "test",
            "system",
            "producers",
            "items",
            "seconds",
            "items_per_sec",
        ] {
            assert!(!r[key].is_null(), "{key} missing in {r}");
        }
        assert!(r["items"].as_u64().unwrap() > 0, "{r}");
        assert!(r["items_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        let l = &r["latency_ns"];
        for key in [
            "count", "min", "mean", "stdev", "max", "p50", "p90", "p95", "p99", "p999",
        ] {
            assert!(l[key].is_number(), "latency_ns.{key} missing in {r}");
        }
        assert_eq!(l["percentiles"].as_array().unwrap().len(), 17);
        assert!(l["p50"].as_u64() <= l["p99"].as_u64());
    }
    results
}

const FAST: [&str; 6] = ["--items", "300", "--rounds", "1", "--json", "-"];

#[test]
fn queue_workload_counts_every_item() {
    let report = json_of(
        &[
            &["bench", "queue", "--systems", "crossbeam-channel,std-mpsc"][..],
            &["--producers", "3"],
            &FAST,
        ]
        .concat(),
    );
    let results = results(&report, "queue");
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!(r["test"], "queue");
        assert_eq!(r["producers"], 3);
        // --items is per producer; every one of them ran.
        assert_eq!(r["items"], 900);
        assert!(r["scope"].is_null() && r["strict"].is_null());
        // The producers' and workers' context switches, and the round's rate of them;
        // other tests have none.
        let switches = r["context_switches"].as_u64().unwrap() as f64;
        let per_kitem = r["rounds"][0]["switches_per_kitem"].as_f64().unwrap();
        assert!((per_kitem - switches * 1000.0 / 900.0).abs() < 1e-9, "{r}");
    }
}

#[test]
fn latency_workload_reports_slat_and_clat() {
    let report = json_of(
        &[
            &["bench", "latency", "--systems", "rayon", "--think", "50us"][..],
            &["--duration", "200ms", "--rounds", "1", "--json", "-"],
        ]
        .concat(),
    );
    let results = results(&report, "latency");
    assert_eq!(results[0]["producers"], 1);
    assert!(results[0]["submit_ns"]["p50"].is_number());
    assert!(results[0]["context_switches"].is_null());
    assert_eq!(report["settings"]["think"], "50us");
}

#[test]
fn peers_workload_runs_every_peer_on_both_tests() {
    let report = json_of(
        &[
            &["bench", "peers"][..],
            &[
                "--systems",
                "rayon,tokio-spawn-blocking,crossbeam-channel,std-mpsc,pernode-threads",
            ],
            &["--think", "20us"],
            &FAST,
        ]
        .concat(),
    );
    let results = results(&report, "peers");
    for test in [
        "queue",
        "latency",
        "throughput_spawn",
        "throughput_execute",
        "throughput_work",
    ] {
        let systems: Vec<&str> = results
            .iter()
            .filter(|r| r["test"] == test)
            .map(|r| r["system"].as_str().unwrap())
            .collect();
        assert_eq!(
            systems,
            [
                "rayon",
                "tokio-spawn-blocking",
                "crossbeam-channel",
                "std-mpsc",
                "pernode-threads"
            ],
            "{test}"
        );
    }
    assert!(report["ratios"].is_array());
}

/// A quick `throughput` run of podq on `cpu` and one peer, with `extra` options.
fn throughput_report(extra: &[&str]) -> Value {
    json_of(
        &[
            &["bench", "throughput", "--systems", "podq,crossbeam-channel"][..],
            &["--scopes", "cpu", "--strict", "off", "--producers", "2"],
            extra,
            &FAST,
        ]
        .concat(),
    )
}

#[test]
fn throughput_workload_counts_calls_accepted_calls_and_runs() {
    let report = throughput_report(&["--works", "4"]);
    let results = results(&report, "throughput");
    assert_eq!(results.len(), 6);
    for r in &results {
        let t = &r["throughput"];
        let (calls, accepted, runs) = (
            t["calls"].as_u64().unwrap(),
            t["accepted"].as_u64().unwrap(),
            t["runs"].as_u64().unwrap(),
        );
        // Every accepted call ran once, and items are runs.
        assert_eq!(runs, accepted, "{r}");
        assert_eq!(r["items"], runs, "{r}");
        match r["test"].as_str().unwrap() {
            // Every producer spawns 300 closures.
            "throughput_spawn" | "throughput_execute" => {
                assert_eq!((calls, accepted), (600, 600), "{r}")
            }
            // Producers stop once the driver has counted 2 x 300 runs, so at least
            // that many ran; calls on pending items were coalesced, for podq and for
            // the peer alike.
            "throughput_work" => {
                assert!(runs >= 600, "{r}");
                assert!(calls >= accepted, "{r}");
                assert!(r["rounds"][0]["accepted_per_sec"].is_f64(), "{r}");
            }
            other => panic!("unexpected result {other:?}"),
        }
        let mode = match r["test"].as_str().unwrap() {
            "throughput_spawn" => "spawn",
            "throughput_execute" => "execute",
            _ => "work",
        };
        assert_eq!(t["mode"], mode);
        // The context switches of producers and workers, and the round's rate of them.
        let switches = t["context_switches"].as_u64().unwrap() as f64;
        let per_kitem = r["rounds"][0]["switches_per_kitem"].as_f64().unwrap();
        assert!(
            (per_kitem - switches * 1000.0 / runs as f64).abs() < 1e-9,
            "{r}"
        );
    }
    assert_eq!(report["settings"]["works"], 4);
}

#[test]
fn throughput_with_flush_ends_podqs_runs_with_its_flush_and_counts_every_run() {
    let report = throughput_report(&["--flush"]);
    let results = results(&report, "throughput");
    assert_eq!(results.len(), 6);
    for r in &results {
        let t = &r["throughput"];
        assert_eq!(t["runs"], t["accepted"], "{r}");
        // Only podq has a flush; the peer's runs end when its count is complete.
        assert_eq!(t["flushed"], r["system"] == "podq", "{r}");
    }
}

#[test]
fn scale_workload_runs_each_pod_count_on_its_own_fake_topology() {
    let report = json_of(
        &[
            &["bench", "scale", "--pods", "1,8", "--strict", "off"][..],
            &["--items", "100", "--rounds", "2", "--json", "-"],
        ]
        .concat(),
    );
    let results = results(&report, "scale");
    assert_eq!(results.len(), 2);
    let real = report["topology"]["real_cpus"].as_array().unwrap().len() as u64;
    for (r, pods) in results.iter().zip([1u64, 8]) {
        assert_eq!(r["test"], "scale");
        assert_eq!(r["scope"], "cpu");
        let t = &r["throughput"];
        assert_eq!(t["pods"]["pods"], pods, "{r}");
        assert_eq!(t["pods"]["topology"], format!("fake:1s{pods}c1t"));
        // At least one producer per real CPU; the 100 x real items of a run are
        // shared among them (rounded up), every one ran, in each of the 2 rounds.
        let producers = pods.max(real);
        assert_eq!(r["producers"], producers, "{r}");
        let per_round = (100 * real).div_ceil(producers) * producers;
        assert_eq!(r["items"], 2 * per_round, "{r}");
        assert_eq!(r["rounds"].as_array().unwrap().len(), 2);
    }
}

#[test]
fn memory_workload_counts_what_queued_items_hold() {
    let report = json_of(&[
        "bench",
        "memory",
        "--systems",
        "podq,crossbeam-channel",
        "--scopes",
        "cpu",
        "--strict",
        "off",
        "--items",
        "2000",
        "--rounds",
        "1",
        "--json",
        "-",
    ]);
    let results = results(&report, "memory");
    assert_eq!(results.len(), 4);
    for r in &results {
        let m = &r["memory"];
        assert_eq!(m["queued"], 2000, "{r}");
        assert_eq!(r["items"], 2000, "{r}");
        let per_item = m["bytes_per_item"].as_f64().unwrap();
        let closure = m["closure_bytes"].as_f64().unwrap();
        assert_eq!(m["beyond_closure"].as_f64().unwrap(), per_item - closure);
        match (r["test"].as_str().unwrap(), r["system"].as_str().unwrap()) {
            // A boxed closure of 8 bytes at least is queued per spawn, in one
            // allocation or more.
            ("memory_spawn", _) => {
                assert_eq!(closure, 8.0, "{r}");
                assert!(per_item >= 8.0, "{r}");
                assert!(m["allocs_per_item"].as_f64().unwrap() >= 1.0, "{r}");
                assert!(m["prepared_bytes_per_item"].is_null(), "{r}");
            }
            // Prepared items are counted apart, and each holds its body's pointer.
            ("memory_work", _) => {
                assert_eq!(closure, 0.0, "{r}");
                assert!(m["prepared_bytes_per_item"].as_f64().unwrap() >= 8.0, "{r}");
            }
            other => panic!("unexpected result {other:?}"),
        }
        assert!(r["rounds"][0]["bytes_per_item"].is_f64(), "{r}");
    }
    // tokio's blocking pool grows with waiting items: nothing to hold back.
    let out = podq(&[
        "bench",
        "memory",
        "--systems",
        "tokio-spawn-blocking",
        "--items",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hold back"));
}

#[test]
fn idle_workload_reports_the_threads_and_pools_of_idle_pods() {
    let report = json_of(&[
        "bench",
        "idle",
        "--pods",
        "1,4",
        "--strict",
        "off",
        "--duration",
        "100ms",
        "--rounds",
        "1",
        "--json",
        "-",
    ]);
    let results = results(&report, "idle");
    assert_eq!(results.len(), 2);
    for (r, pods) in results.iter().zip([1u64, 4]) {
        let d = &r["idle"];
        assert_eq!(d["pods"], pods, "{r}");
        assert_eq!(d["topology"], format!("fake:1s{pods}c1t"));
        // Every pod ran an item, so every pod's pool started a worker.
        assert!(d["pools"].as_u64().unwrap() >= pods, "{r}");
        assert!(d["threads"].as_u64().unwrap() >= pods, "{r}");
        assert!(d["heap_bytes"].as_i64().unwrap() > 0, "{r}");
        assert!(d["window_seconds"].as_f64().unwrap() >= 0.1, "{r}");
        assert!(r["rounds"][0]["idle_cpu_share"].is_f64(), "{r}");
    }
}

#[test]
fn footprint_scale_and_compare_refuse_what_they_cannot_run() {
    for (args, needle) in [
        (&["bench", "scale", "--pods", "0"][..], "--pods 0"),
        (&["bench", "scale", "--pods", "2000"], "--pods 2000"),
        (&["bench", "scale", "--systems", "rayon"], "peers"),
        (&["bench", "scale", "--scopes", "smt"], "cpu scope"),
        (&["bench", "scale", "--synthetic", "1s2c1t"], "--topology"),
        (&["bench", "memory", "--duration", "1s"], "--items"),
        (&["bench", "idle", "--systems", "rayon"], "peers"),
        (&["bench", "memory", "--plot", "m.svg"], "table only"),
        (&["bench", "queue", "--base", "a.json"], "compare"),
        (
            &[
                "bench",
                "compare",
                "--base",
                "/nonexistent.json",
                "--new",
                "b.json",
            ],
            "cannot read",
        ),
    ] {
        let out = podq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn completion_workload_on_a_fake_two_node_topology() {
    let report = json_of(
        &[
            &["bench", "completion", "--systems", "pernode-threads"][..],
            &[
                "--topology",
                "fake:2s2c1t",
                "--cq-placement",
                "split",
                "--depth",
                "4",
            ],
            &FAST,
        ]
        .concat(),
    );
    assert_eq!(report["topology"]["nodes"], 2);
    assert_eq!(report["topology"]["fake"], true);
    let results = results(&report, "completion");
    let r = &results[0];
    // 4 CQs (one per virtual CPU) x 300 I/Os each, all accounted for.
    assert_eq!(r["producers"], 4);
    assert_eq!(r["items"], 1200);
    let c = &r["completion"];
    assert!(c["mb_per_sec"].as_f64().unwrap() > 0.0);
    // Every I/O frees two objects; with the CPU rule each is local or remote.
    let a = &c["allocator"];
    let frees = a["fast_frees"].as_u64().unwrap()
        + a["remote_frees"].as_u64().unwrap()
        + a["overflow_frees"].as_u64().unwrap();
    assert_eq!(frees, 2400);
    assert_eq!(
        a["fast_allocs"].as_u64().unwrap() + a["slow_allocs"].as_u64().unwrap(),
        2400
    );
    for key in [
        "idle_per_cpu",
        "idle_per_node",
        "context_switches",
        "migrations",
    ] {
        assert!(!c[key].is_null(), "{key}");
    }
}

#[test]
fn plot_and_json_files_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("ladder.svg");
    let json = dir.path().join("out.json");
    let out = podq(&[
        "bench",
        "peers",
        "--systems",
        "crossbeam-channel,rayon",
        "--items",
        "200",
        "--rounds",
        "1",
        "--think",
        "10us",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("crossbeam-channel"), "{table}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // queue, latency and the three throughput tests, for each of the two systems.
    assert_eq!(results(&report, "peers").len(), 10);
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    // A bar label and a latency legend entry with its sample count for each peer.
    for peer in ["crossbeam-channel", "rayon"] {
        assert!(texts.contains(&peer), "{peer} missing in {texts:?}");
        assert!(
            texts
                .iter()
                .any(|t| t.starts_with(&format!("{peer} (n=200)"))),
            "{peer} legend missing in {texts:?}"
        );
    }
}

#[test]
fn rounds_and_sample_counts_are_reported() {
    let report = json_of(&[
        "bench",
        "queue",
        "--systems",
        "crossbeam-channel",
        "--items",
        "300",
        "--rounds",
        "3",
        "--json",
        "-",
        "--quiet",
    ]);
    let r = &results(&report, "queue")[0];
    let rounds = r["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 3);
    for round in rounds {
        // Two producers (one per CPU at most) of 300 items each, every round.
        assert_eq!(round["items"], r["items"].as_u64().unwrap() / 3, "{round}");
        assert!(round["wall_seconds"].as_f64().unwrap() >= round["seconds"].as_f64().unwrap());
    }
    let summed: u64 = rounds.iter().map(|x| x["samples"].as_u64().unwrap()).sum();
    assert_eq!(summed, r["latency_ns"]["count"].as_u64().unwrap());
    assert!(report["warnings"].is_array());
}

#[test]
fn percentiles_without_enough_samples_print_a_dash() {
    // 30 items: p50 (20 needed) is shown, p90 (100) and above are not.
    let out = podq(&[
        "bench",
        "latency",
        "--systems",
        "crossbeam-channel",
        "--items",
        "30",
        "--rounds",
        "1",
        "--think",
        "10us",
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("crossbeam-channel"))
        .unwrap_or_else(|| panic!("no row in {text}"));
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    // system, scope, n, p50, p50 rounds, p90, p99, p99.9, max, slat stdev
    assert_eq!(cells[2], "30", "{row}");
    assert_ne!(cells[3], "-", "{row}");
    assert_eq!(&cells[4..8], ["-", "-", "-", "-"], "{row}");
    assert!(text.contains("p90 needs 100"), "{text}");
}

#[test]
fn output_paths_are_checked_before_the_run() {
    let started = std::time::Instant::now();
    let out = podq(&[
        "bench",
        "queue",
        "--duration",
        "1h",
        "--json",
        "/nonexistent/dir/x.json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/dir/x.json"), "{err}");
    // An hour-long run would not have ended by now.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn a_bad_default_scope_in_the_environment_is_warned_about() {
    let out = Command::new(env!("CARGO_BIN_EXE_podq"))
        .args([
            "bench",
            "queue",
            "--systems",
            "podq,crossbeam-channel",
            "--scopes",
            "cpu",
            "--strict",
            "off",
            "--items",
            "50",
            "--rounds",
            "1",
            "--quiet",
            "--json",
            "-",
        ])
        .env("PODQ_DEFAULT_AFFINITY_SCOPE", "bogus")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("warning").count(), 1, "{err}");
    assert!(
        err.contains("PODQ_DEFAULT_AFFINITY_SCOPE") && err.contains("bogus"),
        "{err}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings = report["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].as_str().unwrap().contains("bogus"));
}

#[test]
fn bad_input_is_a_usage_error_that_names_it() {
    let cases: [(&[&str], &str); 17] = [
        (&["bench", "queue", "--duration", "10y"], "longer than 1h"),
        (
            &["bench", "queue", "--flush"],
            "--flush applies to the throughput and peers workloads only",
        ),
        (
            &["bench", "throughput", "--duration", "1s"],
            "throughput runs a number of items per producer (--items), not for a --duration",
        ),
        (
            &["bench", "scale", "--duration", "1s"],
            "scale runs a number of items",
        ),
        (&["bench", "queue", "--duration", "-1"], "negative"),
        (
            &["bench", "queue", "--duration", "abc"],
            "`abc` is not a duration",
        ),
        (&["bench", "latency", "--think", "11s"], "longer than 10s"),
        (&["bench", "queue", "--plot", "out.png"], "SVG"),
        (
            &["bench", "completion", "--object-size", "0"],
            "--object-size",
        ),
        (&["bench", "completion", "--depth", "0"], "--depth"),
        (&["bench", "queue", "--systems", "nope"], "nope"),
        (&["bench", "queue", "--topology", "fake:2x"], "`2x`"),
        (
            &["bench", "queue", "--scopes", "cache_sharded"],
            "cache_sharded",
        ),
        (&["bench", "queue", "--rounds", "0"], "--rounds"),
        (
            &["bench", "latency", "--systems", "rayon", "--cpu", "999"],
            "999",
        ),
        (
            &[
                "bench",
                "completion",
                "--systems",
                "rayon",
                "--toggle",
                "smt,cache",
            ],
            "rayon",
        ),
        (
            &[
                "bench",
                "completion",
                "--systems",
                "rayon",
                "--cq-placement",
                "0-900",
            ],
            "CPU",
        ),
    ];
    for (args, needle) in cases {
        let out = podq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn podq_runs_every_scope_and_strictness_on_a_fake_topology() {
    let report = json_of(
        &[
            &[
                "bench",
                "ladder",
                "--topology",
                "fake:2s2c2t",
                "--think",
                "20us",
            ][..],
            &FAST,
        ]
        .concat(),
    );
    let results = results(&report, "ladder");
    // 6 scopes x 2 strictness x (queue, latency).
    assert_eq!(results.len(), 24);
    for r in &results {
        assert_eq!(r["system"], "podq");
        assert!(r["scope"].is_string() && r["strict"].is_boolean(), "{r}");
        assert!(r["pool_locks"]["enqueue"]["acquisitions"].is_u64(), "{r}");
    }
    // The queue test has one producer per virtual CPU: 8 x 300 items.
    let queue = results.iter().find(|r| r["test"] == "queue").unwrap();
    assert_eq!(queue["items"], 2400);
}

#[test]
fn completion_toggle_reports_each_segment_with_its_scope() {
    let report = json_of(&[
        "bench",
        "completion",
        "--topology",
        "fake:2s2c2t",
        "--toggle",
        "smt,cache_shard,smt",
        "--strict",
        "off",
        "--duration",
        "600ms",
        "--rounds",
        "1",
        "--depth",
        "2",
        "--json",
        "-",
    ]);
    let results = results(&report, "completion");
    let segments: Vec<(u64, &str)> = results
        .iter()
        .map(|r| (r["segment"].as_u64().unwrap(), r["scope"].as_str().unwrap()))
        .collect();
    assert_eq!(segments, [(0, "smt"), (1, "cache_shard"), (2, "smt")]);
    for r in &results {
        assert!(r["completion"]["nfsiod_pool_locks"].is_object(), "{r}");
    }
}

#[test]
fn a_failed_run_leaves_no_new_file_and_keeps_an_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.json");
    std::fs::write(&old, "previous results").unwrap();
    let new = dir.path().join("new.svg");
    // Both paths are fine; the run then fails (no CPU 999 in the topology).
    let out = podq(&[
        "bench",
        "latency",
        "--systems",
        "rayon",
        "--cpu",
        "999",
        "--json",
        old.to_str().unwrap(),
        "--plot",
        new.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "previous results");
    assert!(!new.exists());
}

/// `--scopes auto`: a `queue`, `latency` or `throughput_*` result on `auto` carries what
/// its controller did (a fixed scope's carries nothing), and the text output lists it.
/// Under thresholds that call every window a problem, on two nodes, it switches.
#[test]
fn auto_runs_report_where_the_controller_went() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("auto.json");
    std::fs::write(
        &config,
        r#"{"min_items": 1, "min_acquisitions": 1, "confirm_windows": 1,
            "min_dwell_windows": 1, "max_switches": 1000, "rate_windows": 1,
            "lock_wait_enter": 0.0, "lock_wait_exit": 0.0, "saturated_busy": 1e-9,
            "idle_busy": 0.0, "min_idle_share": 0.0}"#,
    )
    .unwrap();
    let json = dir.path().join("run.json");
    let out = podq(&[
        "bench",
        "queue",
        "--systems",
        "podq",
        "--topology",
        "fake:2s2c1t",
        "--scopes",
        "auto,cpu",
        "--strict",
        "off",
        "--duration",
        "300ms",
        "--rounds",
        "1",
        "--auto-window",
        "2ms",
        "--auto-config",
        config.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let results = results(&report, "queue");
    assert_eq!(results.len(), 2);
    for r in &results {
        if r["scope"] == "cpu" {
            assert!(r["auto"].is_null(), "{r}");
            continue;
        }
        assert_eq!(r["scope"], "auto", "{r}");
        let auto = &r["auto"];
        assert_eq!(auto["window_ns"], 2_000_000, "{r}");
        assert!(auto["last_reason"]["kind"].is_string(), "{r}");
        let switches = auto["switches"].as_array().unwrap();
        let made = auto["switches_made"].as_u64().unwrap() as usize;
        assert!(made > 0, "every window is a problem: {r}");
        assert_eq!(switches.len(), made.min(64), "the history's last 64: {r}");
        // Each switch leaves the scope the one before it reached (the first, the
        // built-in default, if the history reaches back to it), and the last one's
        // scope is where the controller stood at the end.
        let start = Value::from("cache_shard");
        let mut scope = if made == switches.len() {
            &start
        } else {
            &switches[0]["from"]
        };
        for s in switches {
            assert_eq!(&s["from"], scope, "{r}");
            assert_ne!(s["to"], s["from"], "{r}");
            assert!(s["reason"]["kind"].is_string(), "{r}");
            scope = &s["to"];
        }
        assert_eq!(&auto["scope_at_end"], scope, "{r}");
        assert_eq!(
            r["rounds"][0]["auto_scope_at_end"], auto["scope_at_end"],
            "{r}"
        );
    }
    assert!(
        text.contains("auto: where the controller went") && text.contains("last window"),
        "{text}"
    );
}
