//! `podq ctl` and `podq monitor` against a control server started in this test process
//! over an in-memory target.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use podq::control::{AttrValue, ControlError, ControlServer, ControlTarget, QueueAttrs, QueueInfo};
use podq::topology::{CpuSet, Scope};
use podq::WorkqueueStats;
use serde_json::{json, Value};

/// Two queues whose attributes live in a mutex (L: the mutex guards both fields).
struct Target {
    state: Mutex<(Vec<QueueInfo>, Scope)>,
}

impl Target {
    fn new() -> Arc<Target> {
        let queue = |name: &str, scope| QueueInfo {
            name: name.into(),
            attrs: QueueAttrs {
                scope,
                effective_scope: scope,
                strict: false,
                cpumask: CpuSet::first_n(2),
                nice: 0,
                max_active: 256,
                min_active: 8,
                ordered: false,
            },
            nr_cpu_ids: 2,
            frozen: false,
        };
        Arc::new(Target {
            state: Mutex::new((
                vec![
                    queue("nfsiod", Scope::Cache),
                    queue("rpciod", Scope::Default),
                ],
                Scope::CacheShard,
            )),
        })
    }
}

impl ControlTarget for Target {
    fn queues(&self) -> Vec<QueueInfo> {
        let state = self.state.lock().unwrap();
        let mut queues = state.0.clone();
        for q in &mut queues {
            q.attrs.effective_scope = q.attrs.scope.resolve(state.1);
        }
        queues
    }

    fn set_attr(&self, queue: &str, value: AttrValue) -> Result<(), ControlError> {
        let mut state = self.state.lock().unwrap();
        let q = state.0.iter_mut().find(|q| q.name == queue).unwrap();
        match value {
            AttrValue::AffinityScope(s) => q.attrs.scope = s,
            AttrValue::AffinityStrict(s) => q.attrs.strict = s,
            AttrValue::Cpumask(m) => q.attrs.cpumask = m,
            AttrValue::MaxActive(m) => q.attrs.max_active = m,
            AttrValue::MinActive(m) => q.attrs.min_active = m,
            AttrValue::Nice(n) => q.attrs.nice = n,
        }
        Ok(())
    }

    fn default_scope(&self) -> Scope {
        self.state.lock().unwrap().1
    }

    fn set_default_scope(&self, scope: Scope) -> Result<(), ControlError> {
        self.state.lock().unwrap().1 = scope;
        Ok(())
    }

    // Field by field: the snapshot types are meant to grow (`non_exhaustive`).
    #[allow(clippy::field_reassign_with_default)]
    fn stats(&self, queue: Option<&str>) -> Result<Vec<WorkqueueStats>, ControlError> {
        let mut pool = podq::stats::PoolStats::default();
        pool.totals.started = 40;
        pool.totals.completed = 38;
        pool.totals.repatriated = 1;
        pool.cpu_time_ns = 2_000_000;
        pool.enqueue_lock.acquisitions = 40;
        pool.enqueue_lock.contended = 4;
        pool.dequeue_lock.acquisitions = 40;
        (
            pool.locality.same_cpu,
            pool.locality.same_llc,
            pool.locality.same_node,
        ) = (30, 6, 2);
        pool.queue_to_start_ns.count = 38;
        pool.queue_to_start_ns.p50 = 2500;
        pool.queue_to_start_ns.p99 = 80000;
        Ok(self
            .queues()
            .iter()
            .filter(|q| queue.map_or(true, |n| n == q.name))
            .map(|q| {
                serde_json::from_value(json!({
                    "name": q.name,
                    "attrs": { "scope": q.attrs.scope, "strict": false, "cpumask": [0, 1],
                               "nice": 0, "max_active": 256, "ordered": false },
                    "effective_scope": q.attrs.effective_scope,
                    "totals": { "queued": 40, "started": 40, "completed": 38, "panicked": 0,
                                "cancelled": 0, "repatriated": 1, "max_active_waits": 0 },
                    "pools": [pool.clone()],
                }))
                .unwrap()
            })
            .collect())
    }
}

fn podq<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(args)
        .output()
        .unwrap()
}

fn ok<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> String {
    let out = podq(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail with `code` and returns its stderr.
fn fails<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S], code: i32) -> String {
    let out = podq(args);
    assert_eq!(out.status.code(), Some(code), "{args:?}");
    assert!(out.stdout.is_empty(), "{args:?}");
    String::from_utf8(out.stderr).unwrap()
}

/// The arguments of `podq ctl --socket SOCK REST...`.
fn ctl_args(sock: &str, rest: &[&str]) -> Vec<String> {
    ["ctl", "--socket", sock]
        .iter()
        .chain(rest)
        .map(|s| s.to_string())
        .collect()
}

fn server(dir: &Path) -> ControlServer {
    ControlServer::builder()
        .path(dir.join("ctl.sock"))
        .serve(Target::new())
        .unwrap()
}

#[test]
fn ctl_reads_and_writes_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let sock = server.path().to_str().unwrap();
    let ctl = |rest: &[&str]| ctl_args(sock, rest);

    let list = ok(&ctl(&["list"]));
    assert!(list.starts_with("NAME"), "{list}");
    assert!(list.contains("rpciod  default (cache_shard)"), "{list}");
    let json: Value = serde_json::from_str(&ok(&ctl(&["list", "--json"]))).unwrap();
    assert_eq!(json[1]["name"], "rpciod");
    assert_eq!(json[1]["affinity_scope"], "default");
    assert_eq!(json[1]["effective_scope"], "cache_shard");
    assert_eq!(json[1]["affinity_strict"], false);
    assert!(json[1]["max_active"].is_u64(), "{json}");
    assert_eq!(json[1]["min_active"], 8, "{json}");
    assert!(json[1]["nice"].is_i64(), "{json}");
    assert!(json[1]["cpumask"].is_string(), "{json}");

    assert_eq!(
        ok(&ctl(&["get", "rpciod", "affinity_scope"])),
        "default (cache_shard)\n"
    );
    assert_eq!(
        ok(&ctl(&["set", "rpciod", "affinity_scope", "numa"])),
        "numa\n"
    );
    assert_eq!(ok(&ctl(&["get", "rpciod", "affinity_scope"])), "numa\n");
    let json: Value = serde_json::from_str(&ok(&ctl(&["list", "--json"]))).unwrap();
    assert_eq!(
        (&json[1]["affinity_scope"], &json[1]["effective_scope"]),
        (&json!("numa"), &json!("numa"))
    );
    assert_eq!(ok(&ctl(&["set", "nfsiod", "cpumask", "2"])), "2\n");
    assert_eq!(ok(&ctl(&["set", "nfsiod", "max_active", "4096"])), "2048\n");
    assert_eq!(ok(&ctl(&["set", "nfsiod", "nice", "-5"])), "-5\n");
    assert_eq!(ok(&ctl(&["set", "nfsiod", "min_active", "4"])), "4\n");
    assert_eq!(ok(&ctl(&["get", "nfsiod", "min_active"])), "4\n");

    assert_eq!(ok(&ctl(&["default-scope"])), "cache_shard\n");
    ok(&ctl(&["set", "rpciod", "affinity_scope", "default"]));
    assert_eq!(ok(&ctl(&["default-scope", "smt"])), "smt\n");
    assert_eq!(
        ok(&ctl(&["get", "rpciod", "affinity_scope"])),
        "default (smt)\n"
    );
}

/// The target leaves the parameters to its default: this process's watchdog.
#[test]
fn ctl_reads_and_writes_the_process_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let sock = server.path().to_str().unwrap();
    let ctl = |rest: &[&str]| ctl_args(sock, rest);
    assert_eq!(
        ok(&ctl(&["param"])),
        "cpu_intensive_thresh_us 10000\nwatchdog_thresh 30\n"
    );
    assert_eq!(ok(&ctl(&["param", "cpu_intensive_thresh_us"])), "10000\n");
    assert_eq!(ok(&ctl(&["param", "watchdog_thresh"])), "30\n");
    assert_eq!(
        ok(&ctl(&["param", "cpu_intensive_thresh_us", "25000"])),
        "25000\n"
    );
    assert_eq!(
        podq::watchdog::cpu_intensive_threshold(),
        Some(std::time::Duration::from_millis(25))
    );
    assert_eq!(ok(&ctl(&["param", "cpu_intensive_thresh_us", "0"])), "0\n");
    assert_eq!(podq::watchdog::cpu_intensive_threshold(), None);
    assert_eq!(
        ok(&ctl(&["param", "cpu_intensive_thresh_us", "10000"])),
        "10000\n"
    );
    for (args, needle) in [
        (
            ctl(&["param", "watchdog_thresh", "-1"]),
            "invalid value `-1` for watchdog_thresh: expected 0 (off) or a decimal integer \
             in [1, 86400]",
        ),
        (
            ctl(&["param", "hung_task_timeout"]),
            "unknown parameter `hung_task_timeout`",
        ),
    ] {
        let err = fails(&args, 1);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert_eq!(ok(&ctl(&["param", "watchdog_thresh"])), "30\n");
}

#[test]
fn ctl_errors_exit_1_with_the_servers_message() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let sock = server.path().to_str().unwrap();
    let ctl = |rest: &[&str]| ctl_args(sock, rest);
    for (args, needle) in [
        (ctl(&["get", "nope", "nice"]), "unknown workqueue `nope`"),
        (
            ctl(&["get", "rpciod", "bogus"]),
            "unknown attribute `bogus`",
        ),
        (
            ctl(&["set", "rpciod", "nice", "99"]),
            "invalid value `99` for nice",
        ),
        (
            ctl(&["set", "rpciod", "affinity_scope", "Cache"]),
            "invalid value `Cache` for affinity_scope",
        ),
        (
            ctl(&["set", "rpciod", "cpumask", "4"]),
            "CPU 2 does not exist",
        ),
        (
            ctl(&["default-scope", "default"]),
            "`default` cannot be the default scope",
        ),
    ] {
        let err = fails(&args, 1);
        assert!(
            err.starts_with("podq: ") && err.contains(needle),
            "{args:?}: {err}"
        );
    }
    let missing = dir.path().join("missing.sock");
    let err = fails(&["ctl", "--socket", missing.to_str().unwrap(), "list"], 1);
    assert_eq!(
        err,
        format!(
            "podq: error: cannot connect to {}: No such file or directory (os error 2)\n",
            missing.display()
        ),
        "the cause once"
    );
    let err = fails(&["ctl", "--pid", "999999999", "list"], 1);
    assert!(err.contains("no process with pid 999999999"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    fails(&["ctl", "list"], 2);
    fails(&["ctl", "--pid", "1", "--socket", "/x", "list"], 2);
    fails(&["ctl", "--socket", "/x", "get", "rpciod"], 2);
    fails(&["ctl", "--socket", "/x", "frob"], 2);
    fails(&["monitor", "--socket", "/x", "--interval", "0"], 2);
    fails(&["monitor", "--socket", "/x", "--count", "many"], 2);
}

#[test]
fn pid_finds_the_default_socket() {
    let server = ControlServer::builder().serve(Target::new()).unwrap();
    let me = std::process::id().to_string();
    assert!(server.path().ends_with(format!("{me}.sock")));
    assert!(ok(&["ctl", "--pid", &me, "list"]).contains("rpciod"));
    // Socket with another process's pid in a directory nobody else can use.
    let meta = std::fs::metadata(server.path().parent().unwrap()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o700
    );
}

#[test]
fn monitor_prints_tables_and_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let sock = server.path().to_str().unwrap();
    let table = ok(&[
        "monitor",
        "--socket",
        sock,
        "--interval",
        "0.1",
        "--count",
        "2",
    ]);
    assert_eq!(table.matches("WORKQUEUE").count(), 2, "{table}");
    // Piped: each sample under its own heading, none redrawn over the last.
    assert_eq!(table.matches("podq monitor: pid ").count(), 2, "{table}");
    assert!(table.contains(", every 100ms, "), "{table}");
    assert!(!table.contains('\x1b'), "{table}");
    let rpciod = table.lines().find(|l| l.starts_with("rpciod")).unwrap();
    // scope, total, /s, infl, cpu_s, rpr, cont%, local%, p50, p99 (worst pool: ≤).
    let cells: Vec<&str> = rpciod
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(cells[1], "default (cache_shard)");
    let cells = [&cells[..1], &cells[2..]].concat();
    assert_eq!(cells[1], "40");
    assert_eq!(cells[3], "2");
    assert_eq!(cells[4], "0.002");
    assert_eq!(cells[6], "5.0");
    assert_eq!(cells[7], "94.7");
    assert_eq!(&cells[8..10], ["≤2.5 µs", "≤80.0 µs"]);
    assert!(table.contains("node0"), "{table}");
    assert!(table.contains("cpu0"), "{table}");
    assert!(
        table.contains("podq-control"),
        "the server's threads: {table}"
    );

    let lines = ok(&[
        "monitor", "--socket", sock, "-i", "0.1", "--count", "1", "--json", "nfs",
    ]);
    let objects: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds = |k: &str| objects.iter().filter(|o| o["kind"] == k).count();
    assert_eq!(kinds("workqueue"), 1, "filtered to nfsiod: {lines}");
    assert!(
        kinds("node") >= 1 && kinds("cpu") >= 1 && kinds("thread") >= 1,
        "{lines}"
    );
    let wq = objects.iter().find(|o| o["kind"] == "workqueue").unwrap();
    assert_eq!(wq["name"], "nfsiod");
    assert_eq!(wq["in_flight"], 2);
    assert_eq!(wq["started_per_s"], 0.0);
    assert!(objects.iter().all(|o| o["timestamp"].as_f64().is_some()));

    // A reader that goes away early ends the monitor quietly.
    let mut child = Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(["monitor", "--socket", sock, "-i", "0.05", "--count", "50"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ctl_and_monitor_drive_real_workqueues() {
    use podq::{Work, Workqueue};

    let dir = tempfile::tempdir().unwrap();
    let server = ControlServer::builder()
        .path(dir.path().join("rt.sock"))
        .build()
        .unwrap();
    let sock = server.path().to_str().unwrap();
    let wq = Workqueue::builder("cli_rt")
        .topology(podq::Topology::synthetic("1s2c2t").unwrap())
        .build()
        .unwrap();
    wq.expose().unwrap();
    let work = Work::new(|| {});
    for _ in 0..10 {
        wq.queue(&work);
        wq.flush();
    }
    assert_eq!(
        ok(&[
            "ctl",
            "--socket",
            sock,
            "set",
            "cli_rt",
            "affinity_scope",
            "smt"
        ]),
        "smt\n"
    );
    assert_eq!(wq.attrs().scope, Scope::Smt);
    assert_eq!(
        ok(&["ctl", "--socket", sock, "set", "cli_rt", "cpumask", "5"]),
        "5\n"
    );
    assert_eq!(wq.attrs().cpumask.to_list(), "0,2");
    let err = fails(
        &["ctl", "--socket", sock, "set", "cli_rt", "nice", "-21"],
        1,
    );
    assert!(err.contains("invalid value `-21` for nice"), "{err}");
    let dump = ok(&["ctl", "--socket", sock, "dump", "cli_rt"]);
    assert!(
        dump.starts_with("workqueue cli_rt: max_active 1024 min_active 8, 0 in flight\n"),
        "{dump}"
    );
    assert!(
        dump.contains("\n  pwq on pool ") && dump.contains("\n  pool "),
        "{dump}"
    );
    let json: Value =
        serde_json::from_str(&ok(&["ctl", "--socket", sock, "dump", "--json"])).unwrap();
    assert_eq!(json[0]["name"], "cli_rt");
    assert_eq!(json[0]["in_flight"], 0);
    let err = fails(&["ctl", "--socket", sock, "dump", "nope"], 1);
    assert!(err.contains("unknown workqueue `nope`"), "{err}");
    let lines = ok(&[
        "monitor", "--socket", sock, "-i", "0.1", "--count", "1", "--json", "cli_rt",
    ]);
    let row: Value = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|o| o["kind"] == "workqueue")
        .unwrap();
    assert_eq!(row["name"], "cli_rt");
    assert_eq!(row["started"], 10);
    assert_eq!(row["in_flight"], 0);
}

#[test]
fn help_lists_the_commands_and_every_command_ends_with_examples() {
    let help = ok(&["--help"]);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["topo", "ctl", "monitor", "bench", "sim", "help"]);
    for command in &commands[..5] {
        for flag in ["-h", "--help"] {
            let text = ok(&[command, &flag]);
            let tail = text.rsplit_once("Examples:\n").map(|(_, t)| t);
            let examples: Vec<&str> = tail.map_or(Vec::new(), |t| t.lines().collect());
            assert!(
                examples
                    .iter()
                    .any(|l| l.trim_start().starts_with(&format!("podq {command}"))),
                "podq {command} {flag} does not end with examples:\n{text}"
            );
            // Nothing but examples (and a pointer to --help) after them.
            assert!(
                examples
                    .iter()
                    .all(|l| l.starts_with("  podq ") || l.starts_with('(') || l.is_empty()),
                "podq {command} {flag}:\n{text}"
            );
        }
    }
}

/// A process with a control server that exits without stopping it, as a crash does
/// (run by `monitor_says_when_the_process_exits`).
#[test]
#[ignore = "helper: run by monitor_says_when_the_process_exits in a child process"]
fn exiting_server_child() {
    let server = ControlServer::builder().build().unwrap();
    println!("READY {}", server.path().display());
    // Until the parent closes our stdin.
    let _ = std::io::stdin().read_line(&mut String::new());
    std::process::exit(0);
}

#[test]
fn monitor_says_when_the_process_exits() {
    use std::io::BufRead;
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exiting_server_child",
            "--ignored",
            "--nocapture",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = server.id().to_string();
    let mut lines = std::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let socket = lines
        .find_map(|l| l.unwrap().strip_prefix("READY ").map(str::to_owned))
        .expect("the child started its server");
    let mut monitor = Command::new(env!("CARGO_BIN_EXE_podq"))
        .args(["monitor", "--pid", &pid, "-i", "0.1", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A first sample: the monitor is connected. Then the process exits.
    let mut samples = std::io::BufReader::new(monitor.stdout.take().unwrap());
    samples.read_line(&mut String::new()).unwrap();
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success());
    std::io::copy(&mut samples, &mut std::io::sink()).unwrap();
    let out = monitor.wait_with_output().unwrap();
    let _ = std::fs::remove_file(socket);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!("podq: error: cannot read stats: process {pid} exited\n")
    );
}
