//! `podq bench`: the scope ladder, the NFS experiments in miniature, and the peers in
//! the same run. See `BENCH.md` next to the crate manifest for the workloads and the
//! JSON schema.

pub mod alloc_model;
pub mod compare;
pub mod counting_alloc;
pub mod define;
pub(crate) mod output;
pub mod peers;
pub mod plot;
pub mod podq_system;
pub mod report;
pub mod system;
pub mod topo;
pub mod workloads;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use podq::policy::auto::AutoConfig;
use podq_topology::Scope;

use alloc_model::{AllocConfig, RemoteRule};
use define::Backend;
use report::{human_ns, human_rate, Report, RunResult, TopologyInfo};
use system::placement::CpuMap;
use system::System;
use workloads::memory;
use workloads::throughput;
use workloads::{Case, RunLength, Test};

pub(crate) use crate::usage::usage;

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// `queue` and `latency` across the scope ladder (the default).
    Ladder,
    /// test_workqueue's shape: one producer per CPU queueing on one shared queue.
    Queue,
    /// One synchronous submitter with think time; fio-style clat percentiles.
    Latency,
    /// The NFS-over-RDMA miniature: CQ producers, rpciod -> nfsiod, allocator model.
    Completion,
    /// Open loop: producers submit tiny items as fast as they can (spawn, and re-queued
    /// items).
    Throughput,
    /// `queue`, `latency` and `throughput` on podq and every peer executor, with ratios.
    Peers,
    /// Bytes per queued item beyond the closure, 1 M items queued with the workers held
    /// back (spawn, and prepared items), from a counting allocator.
    Memory,
    /// Compares two sets of `--json` files (`--base`, `--new`), e.g. builds with and
    /// without podq's stats: the median ratio per result and its spread.
    Compare,
    /// Idle pools on fake topologies of `--pods` pods: threads, heap and resident bytes
    /// per pool, and their CPU time over `--duration` (default 3s).
    Idle,
    /// Open-loop spawn on fake topologies of 1, 8, 64 and 256 `cpu`-scope pods
    /// (`--pods`) mapped onto the real CPUs: what more pools cost.
    Scale,
}

/// `--strict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrictArg {
    /// Strict pods only.
    On,
    /// Non-strict pods only.
    Off,
    /// Both.
    Both,
}

impl StrictArg {
    /// The strictness values to run, non-strict first.
    pub(crate) fn values(self) -> Vec<bool> {
        match self {
            StrictArg::On => vec![true],
            StrictArg::Off => vec![false],
            StrictArg::Both => vec![false, true],
        }
    }
}

/// The `--scopes` list, or every concrete scope when none was given (bench and sim).
pub(crate) fn scopes_or_all(scopes: &[Scope]) -> Vec<Scope> {
    if scopes.is_empty() {
        Scope::CONCRETE.to_vec()
    } else {
        scopes.to_vec()
    }
}

/// Options of `podq bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The workload.
    #[arg(value_enum, default_value = "ladder")]
    pub workload: Workload,
    /// Affinity scopes to run, comma-separated [default: cpu,smt,cache,cache_shard,numa,system].
    #[arg(long, value_delimiter = ',', value_parser = parse_scope)]
    pub scopes: Vec<Scope>,
    /// Strict pods: on, off or both.
    #[arg(long, value_enum, default_value = "both")]
    pub strict: StrictArg,
    /// Wall time of each measured run, e.g. 500ms, 2s, 1m; at most 1h [default: 1s;
    /// completion and idle 3s; not for throughput, scale and memory, which run a count].
    #[arg(long, value_parser = parse_run_duration, allow_hyphen_values = true, conflicts_with = "items")]
    pub duration: Option<Duration>,
    /// Items per producer per run, instead of a duration, 1 to 10^12 (`throughput`
    /// always runs a count: default 500000; `scale`: per real CPU, shared by the
    /// producers; `memory`: items queued, default 1000000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000_000))]
    pub items: Option<u64>,
    /// Times each configuration runs; runs are interleaved across configurations.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// `live`, `fake:SHAPE` (e.g. fake:2s4c2t: a synthetic machine whose CPUs are
    /// mapped round-robin onto the real ones) or `sysfs:PATH` (a capture, mapped too).
    #[arg(long, default_value = "live", conflicts_with_all = ["synthetic", "sysfs_root"])]
    pub topology: String,
    /// Same as `--topology fake:SHAPE`.
    #[arg(long, value_name = "SHAPE", conflicts_with = "sysfs_root")]
    pub synthetic: Option<String>,
    /// Same as `--topology sysfs:PATH`.
    #[arg(long, value_name = "DIR|FILE.tar.gz")]
    pub sysfs_root: Option<PathBuf>,
    /// Systems to run, comma-separated: podq, rayon, tokio-spawn-blocking,
    /// crossbeam-channel, std-mpsc, pernode-threads [default: podq; peers: all].
    #[arg(long, value_delimiter = ',')]
    pub systems: Vec<String>,
    /// `queue`, `throughput`: producer threads [default: one per usable CPU].
    #[arg(long)]
    pub producers: Option<usize>,
    /// `scale`: pod counts to run, comma-separated, each 1 to 1024 (a fake topology of
    /// that many single-CPU pods, one producer per pod).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 64, 256])]
    pub pods: Vec<usize>,
    /// `compare`: the base runs' JSON files, comma-separated, in the order they ran.
    #[arg(long, value_delimiter = ',', value_name = "FILE,...")]
    pub base: Vec<String>,
    /// `compare`: the new runs' JSON files, paired in order with `--base`'s.
    #[arg(long = "new", value_delimiter = ',', value_name = "FILE,...")]
    pub new_files: Vec<String>,
    /// `throughput`: prepared items each producer cycles through in the re-queue mode.
    #[arg(long, default_value_t = throughput::DEFAULT_WORKS)]
    pub works: usize,
    /// `throughput`, `peers`: end podq's runs with `Workqueue::flush` once the
    /// producers are done, as a program that floods a workqueue does (the peers have no
    /// flush: their runs end when all their items ran, as without it).
    #[arg(long)]
    pub flush: bool,
    /// `latency`: the submitter's CPU [default: the first usable CPU].
    #[arg(long)]
    pub cpu: Option<usize>,
    /// `latency`: think time between items, e.g. 0s, 50us, 1ms; at most 10s.
    #[arg(long, value_parser = parse_think, allow_hyphen_values = true, default_value = "1ms")]
    pub think: Duration,
    /// `completion`: completion producers (CQs) [default: one per usable CPU].
    #[arg(long)]
    pub cq: Option<usize>,
    /// `completion`: `node0`, `split` or a cpulist.
    #[arg(long, default_value = "node0")]
    pub cq_placement: String,
    /// `completion`: I/Os in flight per producer.
    #[arg(long, default_value_t = 16)]
    pub depth: usize,
    /// `completion`: rpciod scopes in equal time segments, e.g. smt,cache_shard,smt.
    #[arg(long, value_delimiter = ',', value_parser = parse_scope)]
    pub toggle: Vec<Scope>,
    /// `completion`: CQ placements in equal time segments, e.g. node0,split,node1
    /// (`nodeN` or `split`; the first replaces --cq-placement); the producers re-pin at
    /// each boundary.
    #[arg(long, value_delimiter = ',')]
    pub cq_move: Vec<String>,
    /// `completion`: allocator object size in bytes.
    #[arg(long, default_value_t = 256)]
    pub object_size: usize,
    /// `completion`: objects per CPU cache in the allocator model.
    #[arg(long, default_value_t = 16)]
    pub alloc_cache: usize,
    /// `completion`: which frees take the allocator's node lock.
    #[arg(long, value_enum, default_value = "cpu")]
    pub remote_free: RemoteRule,
    /// `--scopes auto`: how often the controller judges the statistics.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "100ms")]
    pub auto_window: Duration,
    /// `--scopes auto`: the controller's thresholds and limits as JSON (the fields of
    /// `podq::policy::auto::AutoConfig`; missing ones keep their defaults).
    #[arg(long, value_name = "FILE.json")]
    pub auto_config: Option<PathBuf>,
    /// Write the results as JSON to FILE (`-`: stdout; the tables then go to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,
    /// Write an SVG plot (the name must end in .svg): throughput bars with the rounds'
    /// spread, latency percentiles, and for completion --toggle a time series.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// CPU time (a busy loop) each item of `queue`, `latency` and `throughput`'s `work`
    /// mode spends, standing for real work.
    #[arg(long, value_parser = parse_work, default_value = "0s")]
    pub item_work: Duration,
    /// `completion`: CPU time of a CQ producer per I/O besides posting it.
    #[arg(long, value_parser = parse_work, default_value = "0s")]
    pub cq_work: Duration,
    /// `completion`: CPU time of an rpciod item besides its buffer read and allocator work.
    #[arg(long, value_parser = parse_work, default_value = "0s")]
    pub rpciod_work: Duration,
    /// `completion`: CPU time of an nfsiod item besides its allocator work.
    #[arg(long, value_parser = parse_work, default_value = "0s")]
    pub nfsiod_work: Duration,
    /// Also simulate the same podq runs on the same topology with this machine
    /// profile's costs (`podq sim --machine`) and print them next to the real ones.
    #[arg(long, value_name = "MACHINE")]
    pub sim: Option<String>,
}

/// The longest `--duration`: one run of an hour is already a soak, and a bound
/// turns a typo (`10y`) into an error instead of a run that never ends.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// The longest `--think`.
pub const MAX_THINK: Duration = Duration::from_secs(10);

fn parse_bounded(text: &str, max: Duration, zero_ok: bool) -> Result<Duration, String> {
    let shown = humantime::format_duration(max);
    let expected = format!("expected a number with a unit, like 500ms, 2s or 1m, at most {shown}");
    if text.trim_start().starts_with('-') {
        return Err(format!("`{text}` is negative: {expected}"));
    }
    let d = humantime::parse_duration(text)
        .map_err(|_| format!("`{text}` is not a duration: {expected}"))?;
    if d > max {
        return Err(format!("`{text}` is longer than {shown}"));
    }
    if d.is_zero() && !zero_ok {
        return Err(format!("`{text}`: must be longer than zero"));
    }
    Ok(d)
}

/// `--duration`: above zero, at most [`MAX_DURATION`].
pub fn parse_run_duration(text: &str) -> Result<Duration, String> {
    parse_bounded(text, MAX_DURATION, false)
}

fn parse_think(text: &str) -> Result<Duration, String> {
    parse_bounded(text, MAX_THINK, true)
}

/// The longest per-item `--*-work`.
pub const MAX_WORK: Duration = Duration::from_secs(1);

fn parse_work(text: &str) -> Result<Duration, String> {
    parse_bounded(text, MAX_WORK, true)
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    match text.parse::<Scope>() {
        Ok(Scope::Default) => Err("`default` is not a scope to benchmark; name it".to_owned()),
        Ok(scope) => Ok(scope),
        Err(e) => Err(e.to_string()),
    }
}

/// Every system name `--systems` accepts.
pub fn system_names() -> Vec<&'static str> {
    std::iter::once("podq").chain(peers::NAMES).collect()
}

/// The `--auto-config` file, or the defaults.
pub(crate) fn auto_config(args: &BenchArgs) -> Result<AutoConfig> {
    let Some(path) = &args.auto_config else {
        return Ok(AutoConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--auto-config {}: {e}", path.display())))?;
    let config: AutoConfig = serde_json::from_str(&text)
        .map_err(|e| usage(format!("--auto-config {}: {e}", path.display())))?;
    config
        .validate()
        .map_err(|e| usage(format!("--auto-config {}: {e}", path.display())))?;
    Ok(config)
}

fn build_system(name: &str, map: &CpuMap, args: &BenchArgs) -> Result<Arc<dyn System>> {
    if !system_names().contains(&name) {
        return Err(usage(format!(
            "unknown system `{name}`: expected one of {}",
            system_names().join(", ")
        )));
    }
    if name == "podq" {
        return Ok(Arc::new(podq_system::Podq::new(
            map.topology().clone(),
            args.auto_window,
            auto_config(args)?,
        )));
    }
    peers::build(name, map)
}

/// Runs `podq bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    validate(args)?;
    if args.workload == Workload::Compare {
        return run_compare(args);
    }
    if let Some(machine) = &args.sim {
        crate::sim::compare::check(args, machine)?;
    }
    // The library warns about a bad PODQ_DEFAULT_AFFINITY_SCOPE once, on stderr, when
    // the default is first needed: now, before the run; the JSON records it too.
    podq::default_scope();
    let mut warnings = environment_warnings();
    // Before the run, so that a bad path does not cost the whole benchmark.
    let mut outputs = output::Outputs::open(args.json.as_deref(), args.plot.as_deref())?;
    let spec = topology_spec(args);
    let topology = topo::load(&spec)?;
    let map = CpuMap::new(topology)?;
    let systems = systems_for(args, &map)?;
    let length = match (args.items, args.duration) {
        // Counted runs: their wall time has no budget to overshoot.
        (items, _) if args.workload == Workload::Throughput || args.workload == Workload::Scale => {
            RunLength::Items(items.unwrap_or(throughput::DEFAULT_ITEMS))
        }
        (items, _) if args.workload == Workload::Memory => {
            RunLength::Items(items.unwrap_or(memory::DEFAULT_ITEMS))
        }
        (_, window) if args.workload == Workload::Idle => {
            RunLength::Duration(window.unwrap_or(IDLE_WINDOW))
        }
        (Some(n), _) => RunLength::Items(n),
        (None, Some(d)) => RunLength::Duration(d),
        (None, None) if args.workload == Workload::Completion => {
            RunLength::Duration(Duration::from_secs(3))
        }
        (None, None) => RunLength::Duration(Duration::from_secs(1)),
    };
    let cases = cases_for(args, &map, &systems)?;
    let progress = progress_bar(args.quiet, (cases.len() * args.rounds) as u64);
    let backend = define::Threaded {
        map: &map,
        rounds: args.rounds,
    };
    let results = backend.run(&cases, length, &progress)?;
    progress.finish_and_clear();
    if let Some(w) = overshoot_warning(&results, length) {
        eprintln!("podq: warning: {w}");
        warnings.push(w);
    }
    let report = Report {
        schema_version: report::SCHEMA_VERSION,
        workload: format!("{:?}", args.workload).to_lowercase(),
        command: std::env::args().collect(),
        topology: TopologyInfo {
            spec: spec.clone(),
            description: topo::describe(map.topology()),
            cpus: map.vcpus().len(),
            nodes: map.topology().nodes().len(),
            real_cpus: map.real_cpus().to_vec(),
            fake: map.is_fake(),
        },
        settings: settings_json(args, length),
        ratios: report::ratios(
            &results,
            &default_and_same_pods(map.topology(), podq::default_scope()),
        ),
        results,
        warnings,
    };
    let mut text = render(args, &report, length);
    if let Some(machine) = &args.sim {
        text.push_str(&crate::sim::compare::side_by_side(
            args, machine, &spec, &cases, length, &report,
        )?);
    }
    if args.json.as_deref() == Some("-") {
        let mut err = std::io::stderr().lock();
        err.write_all(text.as_bytes())
            .context("writing the tables to stderr")?;
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing the tables to stdout")?;
    }
    outputs.write_json(&report)?;
    outputs.write_plot(|| plot::render(&report))?;
    outputs.keep();
    Ok(())
}

/// `podq bench compare`: the table on stdout, the comparisons as JSON with `--json`.
fn run_compare(args: &BenchArgs) -> Result<()> {
    let rows = compare::compare(&args.base, &args.new_files)?;
    let text = compare::render(&rows);
    let json = serde_json::json!({
        "schema_version": report::SCHEMA_VERSION,
        "workload": "compare",
        "command": std::env::args().collect::<Vec<_>>(),
        "base": args.base,
        "new": args.new_files,
        "comparisons": rows,
    });
    match args.json.as_deref() {
        Some("-") => {
            eprint!("{text}");
            println!("{json:#}");
        }
        Some(path) => {
            print!("{text}");
            std::fs::write(path, format!("{json:#}\n"))
                .with_context(|| format!("writing {path}"))?;
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// A bad `PODQ_DEFAULT_AFFINITY_SCOPE`, for the JSON (podq warns on stderr itself): the
/// default scope then reads as the built-in one, so the `default` ratios would
/// silently mean something else than the user asked for.
fn environment_warnings() -> Vec<String> {
    match Scope::process_default() {
        Ok(_) => Vec::new(),
        Err(e) => vec![format!(
            "{e}; the default scope reads as {}, and workqueues on `default` are refused",
            Scope::BUILTIN_DEFAULT
        )],
    }
}

/// One line for all runs whose wall time (setup, warm-up and teardown included) was
/// more than twice the `--duration` budget: their figures come from a loaded or
/// struggling machine, and the user's time estimate was wrong.
fn overshoot_warning(results: &[RunResult], length: RunLength) -> Option<String> {
    let RunLength::Duration(budget) = length else {
        return None;
    };
    let budget_s = budget.as_secs_f64();
    // Toggle segments share their run's wall time: count each run once.
    let runs: Vec<(String, f64)> = results
        .iter()
        .filter(|r| r.segment.map_or(true, |s| s == 0))
        .flat_map(|r| {
            let name = format!(
                "{} {} {}",
                r.test,
                r.system,
                report::config_label(r.scope, r.strict)
            );
            r.rounds
                .iter()
                .map(move |round| (name.clone(), round.wall_seconds))
        })
        .collect();
    let over: Vec<&(String, f64)> = runs.iter().filter(|(_, w)| *w > 2.0 * budget_s).collect();
    let worst = over.iter().max_by(|a, b| a.1.total_cmp(&b.1))?;
    Some(format!(
        "{} of {} runs took more than twice their {} budget (longest: {}, {}); setup, \
         warm-up and teardown count, and a loaded machine stretches them",
        over.len(),
        runs.len(),
        humantime::format_duration(budget),
        worst.0,
        human_ns(worst.1 * 1e9)
    ))
}

/// The `--topology` value, with `--synthetic` and `--sysfs-root` folded in.
fn topology_spec(args: &BenchArgs) -> String {
    if let Some(shape) = &args.synthetic {
        format!("fake:{shape}")
    } else if let Some(root) = &args.sysfs_root {
        format!("sysfs:{}", root.display())
    } else {
        args.topology.clone()
    }
}

fn validate(args: &BenchArgs) -> Result<()> {
    if args.rounds == 0 {
        return Err(usage("--rounds must be at least 1"));
    }
    if args.producers == Some(0) {
        return Err(usage("--producers must be at least 1"));
    }
    if args.auto_window < Duration::from_millis(1) {
        return Err(usage("--auto-window must be at least 1ms"));
    }
    auto_config(args)?;
    if args.works == 0 {
        return Err(usage("--works must be at least 1"));
    }
    if args.depth == 0 {
        return Err(usage("--depth must be at least 1"));
    }
    alloc_model::check_options(args.object_size, args.alloc_cache)?;
    if args.cq == Some(0) {
        return Err(usage("--cq must be at least 1"));
    }
    if !args.toggle.is_empty() && args.workload != Workload::Completion {
        return Err(usage("--toggle applies to the completion workload only"));
    }
    if args.flush && !matches!(args.workload, Workload::Throughput | Workload::Peers) {
        return Err(usage(
            "--flush applies to the throughput and peers workloads only",
        ));
    }
    if args.workload != Workload::Compare && !(args.base.is_empty() && args.new_files.is_empty()) {
        return Err(usage("--base and --new belong to `podq bench compare`"));
    }
    if args.plot.is_some()
        && matches!(
            args.workload,
            Workload::Memory | Workload::Idle | Workload::Compare
        )
    {
        return Err(usage(format!(
            "--plot draws rates and latencies; `{}` has a table only",
            format!("{:?}", args.workload).to_lowercase()
        )));
    }
    if args.workload == Workload::Memory && args.duration.is_some() {
        return Err(usage(
            "memory queues a number of items (--items), not for a --duration",
        ));
    }
    if matches!(args.workload, Workload::Throughput | Workload::Scale) && args.duration.is_some() {
        return Err(usage(format!(
            "{} runs a number of items per producer (--items), not for a --duration",
            format!("{:?}", args.workload).to_lowercase()
        )));
    }
    if !args.toggle.is_empty() && args.items.is_some() {
        return Err(usage("--toggle needs --duration, not --items"));
    }
    Ok(())
}

fn systems_for(args: &BenchArgs, map: &CpuMap) -> Result<Vec<Arc<dyn System>>> {
    let names: Vec<String> = if !args.systems.is_empty() {
        args.systems.clone()
    } else if args.workload == Workload::Peers {
        system_names().iter().map(|s| (*s).to_owned()).collect()
    } else {
        vec!["podq".to_owned()]
    };
    let mut systems = Vec::new();
    for name in &names {
        if names.iter().filter(|n| *n == name).count() > 1 {
            return Err(usage(format!("system `{name}` is named twice")));
        }
        systems.push(build_system(name, map, args)?);
    }
    Ok(systems)
}

/// How long `idle` watches the pools when `--duration` is not given.
pub const IDLE_WINDOW: Duration = Duration::from_secs(3);

/// The most pods `--pods` takes: each needs a producer thread and a worker.
pub const MAX_SCALE_PODS: usize = 1024;

/// `scale` and `idle`: one case per `--pods` value, each podq on its own fake
/// topology on the `cpu` scope; `scale` shares `--items` x real CPUs spawns per run
/// among one producer per pod, `idle` watches the pools for `--duration`.
fn scale_cases(args: &BenchArgs, map: &CpuMap) -> Result<Vec<Case>> {
    if !args.scopes.is_empty() && args.scopes != [Scope::Cpu] {
        return Err(usage(
            "scale and idle run the cpu scope (one pod per virtual CPU); drop --scopes",
        ));
    }
    if args.systems.iter().any(|s| s != "podq") {
        return Err(usage(
            "scale and idle measure podq's pools; peers have none (drop --systems)",
        ));
    }
    if args.topology != "live" || args.synthetic.is_some() || args.sysfs_root.is_some() {
        return Err(usage(
            "scale and idle build their own fake topologies (--pods); drop --topology",
        ));
    }
    if let Some(&bad) = args
        .pods
        .iter()
        .find(|&&n| !(1..=MAX_SCALE_PODS).contains(&n))
    {
        return Err(usage(format!(
            "--pods {bad} is out of range 1..={MAX_SCALE_PODS}"
        )));
    }
    let total = args.items.unwrap_or(throughput::DEFAULT_ITEMS) * map.real_cpus().len() as u64;
    let mut cases = Vec::new();
    for &pods in &args.pods {
        let params = throughput::ScaleParams::new(pods, total)?;
        let system: Arc<dyn System> = Arc::new(podq_system::Podq::new(
            params.map.topology().clone(),
            args.auto_window,
            auto_config(args)?,
        ));
        let params = Arc::new(params);
        for config in system.configs(&[Scope::Cpu], &args.strict.values()) {
            let test = if args.workload == Workload::Idle {
                Test::Idle(Arc::clone(&params), args.duration.unwrap_or(IDLE_WINDOW))
            } else {
                Test::Scale(Arc::clone(&params))
            };
            cases.push(Case {
                system: Arc::clone(&system),
                config,
                test,
            });
        }
    }
    Ok(cases)
}

/// The workload options of `args`, for [`define::tests`].
pub(crate) fn options(args: &BenchArgs) -> define::Options<'_> {
    define::Options {
        producers: args.producers,
        cpu: args.cpu,
        think: args.think,
        items: args.items,
        works: args.works,
        flush: args.flush,
        cq: args.cq,
        cq_placement: &args.cq_placement,
        depth: args.depth,
        toggle: &args.toggle,
        cq_move: &args.cq_move,
        alloc: AllocConfig {
            object_size: args.object_size,
            cache_size: args.alloc_cache,
            remote: args.remote_free,
        },
        work: define::ItemWork {
            item: args.item_work,
            cq: args.cq_work,
            rpciod: args.rpciod_work,
            nfsiod: args.nfsiod_work,
        },
    }
}

pub(crate) fn cases_for(
    args: &BenchArgs,
    map: &CpuMap,
    systems: &[Arc<dyn System>],
) -> Result<Vec<Case>> {
    if matches!(args.workload, Workload::Scale | Workload::Idle) {
        return scale_cases(args, map);
    }
    let scopes = scopes_or_all(&args.scopes);
    let strict = args.strict.values();
    let tests = define::tests(args.workload, &options(args), map.topology())?;
    if !args.toggle.is_empty() {
        if let Some(s) = systems.iter().find(|s| s.name() != "podq") {
            return Err(usage(format!(
                "--toggle changes a podq scope live; `{}` has no scopes",
                s.name()
            )));
        }
    }
    let mut cases = Vec::new();
    for test in tests {
        for system in systems {
            let configs = if args.toggle.is_empty() {
                system.configs(&scopes, &strict)
            } else {
                // The toggle list decides rpciod's scope; run each strictness once.
                system.configs(&args.toggle[..1], &strict)
            };
            for config in configs {
                cases.push(Case {
                    system: Arc::clone(system),
                    config,
                    test: test.clone(),
                });
            }
        }
    }
    Ok(cases)
}

/// The progress bar of a run of `total` configurations: on stderr when it is a
/// terminal and not `--quiet`, hidden otherwise (also `podq sim`'s).
pub(crate) fn progress_bar(quiet: bool, total: u64) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:30.cyan/blue} {pos}/{len} runs  {msg}  [{elapsed} < {eta}]",
    ) {
        bar.set_style(style);
    }
    bar
}

fn settings_json(args: &BenchArgs, length: RunLength) -> serde_json::Value {
    let (duration, items) = match length {
        RunLength::Duration(d) => (Some(humantime::format_duration(d).to_string()), None),
        RunLength::Items(n) => (None, Some(n)),
    };
    serde_json::json!({
        "duration": duration,
        "items": items,
        "rounds": args.rounds,
        "scopes": if args.scopes.is_empty() { Scope::CONCRETE.to_vec() } else { args.scopes.clone() },
        "strict": format!("{:?}", args.strict).to_lowercase(),
        "producers": args.producers,
        "works": args.works,
        "cpu": args.cpu,
        "think": humantime::format_duration(args.think).to_string(),
        "cq": args.cq,
        "cq_placement": args.cq_placement,
        "depth": args.depth,
        "toggle": args.toggle,
        "cq_move": args.cq_move,
        "auto_window": humantime::format_duration(args.auto_window).to_string(),
        "auto_config": auto_config(args).ok(),
        "object_size": args.object_size,
        "alloc_cache": args.alloc_cache,
        "remote_free": args.remote_free,
        "item_work": humantime::format_duration(args.item_work).to_string(),
        "cq_work": humantime::format_duration(args.cq_work).to_string(),
        "rpciod_work": humantime::format_duration(args.rpciod_work).to_string(),
        "nfsiod_work": humantime::format_duration(args.nfsiod_work).to_string(),
        "pods": args.pods,
        "podq_stats": cfg!(feature = "stats"),
    })
}

fn render(args: &BenchArgs, report: &Report, length: RunLength) -> String {
    let per_run = match length {
        _ if args.workload == Workload::Memory => format!(
            "{} items queued per run",
            args.items.unwrap_or(memory::DEFAULT_ITEMS)
        ),
        _ if args.workload == Workload::Idle => format!(
            "{} idle per run",
            humantime::format_duration(args.duration.unwrap_or(IDLE_WINDOW))
        ),
        _ if args.workload == Workload::Scale => format!(
            "{} items per real CPU per run, shared by one producer per pod",
            args.items.unwrap_or(throughput::DEFAULT_ITEMS)
        ),
        _ if args.workload == Workload::Throughput => format!(
            "{} items per producer per run",
            args.items.unwrap_or(throughput::DEFAULT_ITEMS)
        ),
        RunLength::Duration(d) => format!("{} per run", humantime::format_duration(d)),
        RunLength::Items(n) => format!("{n} items per producer per run"),
    };
    let mut out = format!(
        "podq bench {}: topology {} ({}{}), {} round(s), {per_run}{}\n",
        report.workload,
        report.topology.spec,
        report.topology.description,
        if report.topology.fake {
            format!(", mapped onto real CPUs {:?}", report.topology.real_cpus)
        } else {
            String::new()
        },
        args.rounds,
        if cfg!(feature = "stats") {
            ""
        } else {
            ", podq built without stats"
        },
    );
    let of = |test: &str| -> Vec<&RunResult> {
        report.results.iter().filter(|r| r.test == test).collect()
    };
    let queue = of("queue");
    if !queue.is_empty() {
        out.push_str(&queue_table(&queue));
    }
    let latency = of("latency");
    if !latency.is_empty() {
        out.push_str(&latency_table(&latency, args.think));
        if args.workload == Workload::Latency {
            for r in &latency {
                let config = r.label();
                if config == "-" {
                    out.push_str(&format!("\n{}:\n", r.system));
                } else {
                    out.push_str(&format!("\n{} {config}:\n", r.system));
                }
                if let Some(slat) = &r.submit_ns {
                    out.push_str(&report::fio_summary("slat", slat));
                }
                out.push_str(&report::fio_clat("clat", &r.latency_ns));
            }
        }
    }
    for test in ["throughput_spawn", "throughput_execute", "throughput_work"] {
        let rows = of(test);
        if !rows.is_empty() {
            out.push_str(&throughput_table(test, &rows, args.works));
        }
    }
    let memory: Vec<&RunResult> = report
        .results
        .iter()
        .filter(|r| r.memory.is_some())
        .collect();
    if !memory.is_empty() {
        out.push_str(&memory_table(&memory));
    }
    let idle = of("idle");
    if !idle.is_empty() {
        out.push_str(&idle_table(&idle));
    }
    let scale = of("scale");
    if !scale.is_empty() {
        out.push_str(&scale_table(&scale));
    }
    let completion = of("completion");
    if !completion.is_empty() {
        out.push_str(&completion_table(&completion));
        out.push_str(&auto_table(&completion));
    }
    out.push_str(&auto_runs_table(&report.results));
    if !report.ratios.is_empty() {
        out.push_str(&ratio_table(report));
    }
    out
}

/// `n`: the latency samples behind a row's percentiles.
fn samples(r: &RunResult) -> String {
    r.latency_ns.count.to_string()
}

/// The rounds' spread of one per-round figure.
fn spread(r: &RunResult, figure: fn(&report::Round) -> f64, unit: fn(f64) -> String) -> String {
    let values: Vec<f64> = r.rounds.iter().map(figure).collect();
    report::round_range(&values, unit)
}

/// The note under a table in which some percentile had too few samples.
fn blanked_note(results: &[&RunResult], shown: &[f64]) -> String {
    let blanked: Vec<String> = shown
        .iter()
        .filter(|&&p| {
            results
                .iter()
                .any(|r| r.latency_ns.count < report::min_samples(p))
        })
        .map(|&p| format!("p{p} needs {}", report::min_samples(p)))
        .collect();
    if blanked.is_empty() {
        String::new()
    } else {
        format!(
            "-: too few samples for that percentile ({}; ten samples must lie beyond it)\n",
            blanked.join(", ")
        )
    }
}

fn queue_table(results: &[&RunResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let l = &r.latency_ns;
            vec![
                r.system.clone(),
                r.label(),
                samples(r),
                human_rate(r.items_per_sec),
                spread(r, |x| x.items_per_sec, human_rate),
                report::percentile_cell(l.count, 50.0, l.p50),
                report::percentile_cell(l.count, 90.0, l.p90),
                report::percentile_cell(l.count, 95.0, l.p95),
                switches_cell(r),
                spread(r, |x| x.switches_per_kitem.unwrap_or(0.0), switches),
            ]
        })
        .collect();
    format!(
        "\nqueue: {} producer(s), each queueing, waiting, re-queueing one item; latency of the queue call; n: queue calls; ctxsw: context switches of producers and workers\n{}{}",
        results.first().map_or(0, |r| r.producers),
        report::table(
            &[
                "system",
                "scope",
                "n",
                "items/s",
                "rounds min … max",
                "queue p50",
                "p90",
                "p95",
                "ctxsw/1k items",
                "rounds min … max",
            ],
            &rows,
            2
        ),
        blanked_note(results, &[50.0, 90.0, 95.0]),
    )
}

fn latency_table(results: &[&RunResult], think: Duration) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let l = &r.latency_ns;
            vec![
                r.system.clone(),
                r.label(),
                samples(r),
                report::percentile_cell(l.count, 50.0, l.p50),
                if r.rounds
                    .iter()
                    .all(|x| x.samples >= report::min_samples(50.0))
                {
                    spread(r, |x| x.p50_ns as f64, human_ns)
                } else {
                    "-".to_owned()
                },
                report::percentile_cell(l.count, 90.0, l.p90),
                report::percentile_cell(l.count, 99.0, l.p99),
                report::percentile_cell(l.count, 99.9, l.p999),
                if l.count == 0 {
                    "-".to_owned()
                } else {
                    human_ns(l.max as f64)
                },
                r.submit_ns
                    .as_ref()
                    .map_or("-".to_owned(), |s| human_ns(s.stdev)),
            ]
        })
        .collect();
    format!(
        "\nlatency: one submitter, depth 1, think time {}; submit to end of item; n: items\n{}{}",
        humantime::format_duration(think),
        report::table(
            &[
                "system",
                "scope",
                "n",
                "clat p50",
                "p50 rounds min … max",
                "p90",
                "p99",
                "p99.9",
                "max",
                "slat stdev"
            ],
            &rows,
            2
        ),
        blanked_note(results, &[50.0, 90.0, 99.0, 99.9]),
    )
}

/// Context switches per 1000 runs, as the tables show them.
fn switches(per_kitem: f64) -> String {
    format!("{per_kitem:.1}")
}

/// A `throughput`, `scale` or `queue` result's context switches per 1000 runs over its
/// rounds (`podq sim`'s tables too).
pub(crate) fn switches_cell(r: &RunResult) -> String {
    r.throughput
        .as_ref()
        .map(|t| t.context_switches)
        .or(r.context_switches)
        .map_or("-".to_owned(), |n| switches(report::per_kitem(n, r.items)))
}

fn throughput_table(test: &str, results: &[&RunResult], works: usize) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let t = r.throughput.as_ref();
            let share = t.map_or("-".to_owned(), |t| {
                if t.calls == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.1}%", t.accepted as f64 * 100.0 / t.calls as f64)
                }
            });
            let mut row = vec![
                r.system.clone(),
                r.label(),
                human_rate(r.items_per_sec),
                spread(r, |x| x.items_per_sec, human_rate),
            ];
            if test == "throughput_work" {
                row.extend([
                    t.map_or("-".to_owned(), |t| human_rate(t.accepted_per_sec)),
                    spread(r, |x| x.accepted_per_sec.unwrap_or(0.0), human_rate),
                    t.map_or("-".to_owned(), |t| human_rate(t.calls_per_sec)),
                    spread(r, |x| x.calls_per_sec.unwrap_or(0.0), human_rate),
                    share,
                ]);
            }
            row.extend([
                switches_cell(r),
                spread(r, |x| x.switches_per_kitem.unwrap_or(0.0), switches),
                format!("{:.3}s", r.seconds),
            ]);
            row
        })
        .collect();
    let one_shot = [
        "system",
        "scope",
        "runs/s",
        "rounds min … max",
        "ctxsw/1k runs",
        "rounds min … max",
        "wall",
    ];
    let (what, head): (String, &[&str]) = if test == "throughput_spawn" {
        (
            "one-shot tiny closures, handles dropped".to_owned(),
            &one_shot,
        )
    } else if test == "throughput_execute" {
        (
            "one-shot tiny closures with no handle (podq's execute; the peers' spawn, \
             which has none)"
                .to_owned(),
            &one_shot,
        )
    } else {
        (
            format!(
                "each re-queueing {works} items until the runs are counted; a call on an item \
                 not yet running is coalesced (podq's PENDING; a flag per item for the peers)"
            ),
            &[
                "system",
                "scope",
                "runs/s",
                "rounds min … max",
                "accepted/s",
                "rounds min … max",
                "calls/s",
                "rounds min … max",
                "accepted",
                "ctxsw/1k runs",
                "rounds min … max",
                "wall",
            ],
        )
    };
    let flushed = results
        .iter()
        .any(|r| r.throughput.as_ref().is_some_and(|t| t.flushed));
    let end = if flushed {
        "; podq's runs end with its flush"
    } else {
        ""
    };
    format!(
        "\n{test}: {} producer(s), open loop, {what}{end}; ctxsw: context switches of producers and workers\n{}",
        results.first().map_or(0, |r| r.producers),
        report::table(head, &rows, 2)
    )
}

fn memory_table(results: &[&RunResult]) -> String {
    let bytes = |x: f64| format!("{x:.1}");
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let m = r.memory.as_ref().expect("memory results carry details");
            vec![
                r.system.clone(),
                r.label(),
                format!("{:?}", m.mode).to_lowercase(),
                (m.queued / r.rounds.len().max(1) as u64).to_string(),
                m.prepared_bytes_per_item.map_or("-".to_owned(), bytes),
                bytes(m.bytes_per_item),
                spread(r, |x| x.bytes_per_item.unwrap_or(0.0), bytes),
                bytes(m.beyond_closure),
                format!("{:.2}", m.allocs_per_item),
                format!("{:.1} MiB", m.retained_bytes / f64::from(1 << 20)),
            ]
        })
        .collect();
    format!(
        "\nmemory: items queued from one thread while the workers are held back; live bytes from the allocator; closures capture 8 bytes (spawn)\n{}",
        report::table(
            &[
                "system",
                "scope",
                "mode",
                "queued",
                "prepared B/item",
                "queued B/item",
                "rounds min … max",
                "beyond closure",
                "allocs/item",
                "retained after"
            ],
            &rows,
            3
        )
    )
}

fn idle_table(results: &[&RunResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let d = r.idle.as_ref().expect("idle results carry details");
            let per = |x: f64| x / d.pools.max(1) as f64;
            vec![
                d.pods.to_string(),
                r.label(),
                d.pools.to_string(),
                d.threads.to_string(),
                format!("{:.2}", per(d.threads as f64)),
                format!("{:.1} KiB", per(d.heap_bytes as f64) / 1024.0),
                format!("{:.1} KiB", per(d.rss_bytes as f64) / 1024.0),
                human_ns(d.cpu_ns as f64),
                format!("{:.4}%", d.cpu_share() * 100.0),
                spread(
                    r,
                    |x| x.idle_cpu_share.unwrap_or(0.0) * 100.0,
                    |x| format!("{x:.4}%"),
                ),
                format!(
                    "{:.1}",
                    d.context_switches as f64 / d.window_seconds.max(1e-9)
                ),
            ]
        })
        .collect();
    let source = results
        .iter()
        .find_map(|r| r.idle.as_ref())
        .map_or("", |d| match d.cpu_time_source {
            crate::procinfo::CpuTimeSource::Schedstat => "schedstat",
            crate::procinfo::CpuTimeSource::StatTicks => "stat ticks (10 ms steps)",
        });
    format!(
        "\nidle: podq, one item run in every pod, then nothing queued; threads and CPU time of the threads the workqueue added ({source}), summed over rounds\n{}",
        report::table(
            &[
                "pods", "scope", "pools", "threads", "threads/pool", "heap/pool", "rss/pool",
                "cpu time", "of one CPU", "rounds min … max", "ctxsw/s"
            ],
            &rows,
            3
        )
    )
}

fn scale_table(results: &[&RunResult]) -> String {
    let pods = |r: &RunResult| {
        r.throughput
            .as_ref()
            .and_then(|t| t.pods.as_ref())
            .map_or(0, |p| p.pods)
    };
    // Each strictness is compared with its own run on the fewest pods.
    let fewest = |strict: Option<bool>| {
        results
            .iter()
            .filter(|r| r.strict == strict)
            .min_by_key(|r| pods(r))
    };
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let base = fewest(r.strict);
            vec![
                pods(r).to_string(),
                r.label(),
                r.producers.to_string(),
                human_rate(r.items_per_sec),
                spread(r, |x| x.items_per_sec, human_rate),
                base.map_or("-".to_owned(), |b| {
                    format!(
                        "{:+.1}% (vs {})",
                        (r.items_per_sec / b.items_per_sec - 1.0) * 100.0,
                        pods(b)
                    )
                }),
                switches_cell(r),
                format!("{:.3}s", r.seconds),
            ]
        })
        .collect();
    format!(
        "\nscale: podq, open-loop spawn, one producer per pod (fake:1sNc1t, virtual CPUs on the real ones); ctxsw: context switches of producers and workers\n{}",
        report::table(
            &[
                "pods",
                "scope",
                "producers",
                "runs/s",
                "rounds min … max",
                "change",
                "ctxsw/1k runs",
                "wall"
            ],
            &rows,
            3
        )
    )
}

fn completion_table(results: &[&RunResult]) -> String {
    let percent = |part: u64, whole: u64| {
        if whole == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}%", part as f64 * 100.0 / whole as f64)
        }
    };
    let mb = |x: f64| format!("{x:.1}");
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let c = r
                .completion
                .as_ref()
                .expect("completion results carry details");
            let locks = r.pool_locks.unwrap_or_default();
            let idle = if c.idle_per_node.is_empty() {
                &c.idle_per_cpu
            } else {
                &c.idle_per_node
            };
            let idle: Vec<String> = idle.iter().map(|x| format!("{:.0}%", x * 100.0)).collect();
            let l = &r.latency_ns;
            vec![
                r.system.clone(),
                r.label(),
                samples(r),
                mb(c.mb_per_sec),
                spread(r, |x| x.mb_per_sec.unwrap_or(0.0), mb),
                report::percentile_cell(l.count, 50.0, l.p50),
                report::percentile_cell(l.count, 99.0, l.p99),
                percent(
                    c.allocator.node_lock.contended,
                    c.allocator.node_lock.acquisitions,
                ),
                human_ns(c.allocator.node_lock.wait_ns as f64),
                if r.pool_locks.is_some() {
                    percent(locks.enqueue.contended, locks.enqueue.acquisitions)
                } else {
                    "-".to_owned()
                },
                if r.pool_locks.is_some() {
                    percent(locks.dequeue.contended, locks.dequeue.acquisitions)
                } else {
                    "-".to_owned()
                },
                format!("{:.0}", c.context_switches as f64 / r.seconds),
                format!("{:.0}", c.migrations as f64 / r.seconds),
                idle.join("/"),
            ]
        })
        .collect();
    let first = results.first();
    let idle_head = if first
        .and_then(|r| r.completion.as_ref())
        .is_some_and(|c| c.idle_per_node.is_empty())
    {
        "idle/cpu"
    } else {
        "idle/node"
    };
    format!(
        "\ncompletion: {} CQ producer(s) -> rpciod -> nfsiod, 4 KiB per I/O; n: I/Os; lock columns: contended share\n{}{}",
        first.map_or(0, |r| r.producers),
        report::table(
            &[
                "system", "rpciod scope", "n", "MB/s", "rounds min … max", "p50", "p99",
                "alloc lock", "alloc wait", "enqueue", "dequeue", "ctxsw/s", "migr/s", idle_head
            ],
            &rows,
            2
        ),
        blanked_note(results, &[50.0, 99.0]),
    )
}

/// `rpciod`'s `auto` switches per segment, and the I/O accounting of each run.
fn auto_table(results: &[&RunResult]) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut accounted = Vec::new();
    for r in results {
        let Some(c) = r.completion.as_ref() else {
            continue;
        };
        if let Some(a) = &c.accounting {
            let whole = a.posted == a.done
                && a.rpciod[0] == a.rpciod[1]
                && a.nfsiod[0] == a.nfsiod[1]
                && a.rpciod[1] == a.done;
            accounted.push(format!(
                "{} {}: posted {}, done {}; rpciod queued {} finished {}; nfsiod queued {} finished {}{}",
                r.system,
                report::config_label(r.scope, r.strict),
                a.posted,
                a.done,
                a.rpciod[0],
                a.rpciod[1],
                a.nfsiod[0],
                a.nfsiod[1],
                if whole { " (all accounted for)" } else { " (MISMATCH)" }
            ));
        }
        let Some(auto) = &c.auto else {
            continue;
        };
        let placement = c.placement.clone().unwrap_or_else(|| "-".to_owned());
        rows.push(vec![
            r.label(),
            placement,
            auto.scope_at_end.to_string(),
            auto.switches_made.to_string(),
            switch_list(auto),
        ]);
    }
    let mut out = String::new();
    if !rows.is_empty() {
        out.push_str(&format!(
            "
auto (rpciod): switches per segment, at the controller's time since it started
{}",
            report::table_ending_in_text(
                &["rpciod scope", "CQs", "at end", "switches", "what and why"],
                &rows,
                2
            )
        ));
    }
    if !accounted.is_empty() {
        out.push_str(
            "
I/Os and items once nothing was in flight:
",
        );
        for line in accounted {
            out.push_str(&format!(
                "  {line}
"
            ));
        }
    }
    out
}

/// An `auto` controller's switches, each at the controller's time since it started
/// (`-` for none).
fn switch_list(auto: &report::AutoTrace) -> String {
    let switches: Vec<String> = auto
        .switches
        .iter()
        .map(|s| {
            let at = s.window as f64 * auto.window_ns as f64;
            format!(
                "{} {} -> {}: {}",
                report::human_ns(at),
                s.from,
                s.to,
                s.reason
            )
        })
        .collect();
    if switches.is_empty() {
        "-".to_owned()
    } else {
        switches.join("; ")
    }
}

/// Where the `auto` controller of each `queue`, `latency` and `throughput_*` run went
/// (every round's own workqueue, its switches in the order the rounds ran).
fn auto_runs_table(results: &[RunResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .filter_map(|r| {
            let auto = r.auto.as_ref()?;
            Some(vec![
                r.test.to_owned(),
                r.label(),
                r.auto_ends()
                    .unwrap_or_else(|| auto.scope_at_end.to_string()),
                auto.switches_made.to_string(),
                auto.last_reason.to_string(),
                switch_list(auto),
            ])
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\nauto: where the controller went, each round's workqueue from its start (warm-up included)\n{}",
        report::table_ending_in_text(
            &["test", "scope", "at end", "switches", "last window", "what and why"],
            &rows,
            2
        )
    )
}

/// The default scope, then the concrete scopes whose pods are the same on `topology`
/// (the aliases of its rung of the scope ladder: on one LLC and one node,
/// `cache_shard`'s one pod is `system`'s): a run of any of them is what a user of the
/// default gets there. `auto` has no fixed pods.
fn default_and_same_pods(topology: &podq_topology::Topology, default: Scope) -> Vec<Scope> {
    let ladder = podq::policy::auto::Ladder::new(topology, topology.usable());
    let aliases = ladder.ok().and_then(|ladder| {
        let rung = ladder.rung_of(default)?;
        Some(ladder.rungs()[rung].aliases.clone())
    });
    std::iter::once(default)
        .chain(
            aliases
                .into_iter()
                .flatten()
                .filter(|&scope| scope != default),
        )
        .collect()
}

fn ratio_table(report: &Report) -> String {
    let rows: Vec<Vec<String>> = report
        .ratios
        .iter()
        .map(|r| {
            let fmt = |v: f64| {
                if r.metric == "items_per_sec" {
                    human_rate(v)
                } else {
                    human_ns(v)
                }
            };
            vec![
                format!("{} {}", r.test, r.metric),
                format!("podq {}", r.podq_config),
                fmt(r.podq),
                format!("{}{}", r.peer, if r.best_peer { " (best)" } else { "" }),
                fmt(r.peer_value),
                format!("{:.2}x", r.ratio),
                r.rounds.as_ref().map_or("-".to_owned(), |p| {
                    format!(
                        "{:.2}x ({:.2} … {:.2}, {})",
                        p.median, p.min, p.max, p.pairs
                    )
                }),
                r.default_podq.map_or("-".to_owned(), fmt),
                r.default_ratio
                    .map_or("-".to_owned(), |x| format!("{x:.2}x")),
            ]
        })
        .collect();
    let configs = report
        .ratios
        .iter()
        .map(|r| r.podq_configs)
        .max()
        .unwrap_or(0);
    let scope = podq::default_scope();
    let default = match report.ratios.iter().find_map(|r| r.default_config.clone()) {
        Some(config) if config == scope.name() => config,
        Some(config) => format!("{scope}, run as {config} (the same pods on this topology)"),
        None => format!("{scope} (not run)"),
    };
    format!(
        "\npodq against each peer (ratio = podq / peer): `best` is podq's best of its {configs} configuration(s) \
         for each metric, picked after the run; `per round` pairs its k-th round with the peer's k-th round \
         (median, min … max, pairs); `default` is podq on the default scope, {default}, as a user gets it\n{}",
        report::table(
            &["metric", "podq best", "value", "peer", "value", "best ratio", "per round", "podq default", "default ratio"],
            &rows,
            4
        )
    )
}
