//! `podq sim`: the bench workloads on a simulated machine (the `podq-sim` crate), for
//! machines this one is not. See the README's "podq sim" section.

pub mod backend;
pub mod compare;
mod output;
mod sweep;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use podq_sim::{cost, CostParams, RunLength, RunSpec, SimOutput};
use podq_topology::{Scope, Topology};

use crate::bench::alloc_model::{AllocConfig, RemoteRule};
use crate::bench::output::Outputs;
use crate::bench::workloads::throughput;
use crate::bench::{self, define, progress_bar, scopes_or_all, topo, usage, StrictArg};

/// What to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SimWorkload {
    /// `queue` and `latency` across the scope ladder (the default).
    Ladder,
    /// test_workqueue's shape: one producer per CPU queueing its own item, waiting for it.
    Queue,
    /// One synchronous submitter with think time; fio-style clat percentiles.
    Latency,
    /// The NFS-over-RDMA miniature: CQ producers, rpciod -> nfsiod, allocator model.
    Completion,
    /// Producers re-queueing up to `--depth` items each, as bench's `throughput_work`.
    Throughput,
}

/// `--cq-priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CqPriority {
    /// Preempt the workers on their CPUs (the kernel's completion handlers).
    High,
    /// Ordinary threads.
    Normal,
}

/// `--worklist`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorklistArg {
    /// The kernel's: the pool lock for every push and every take.
    Locked,
    /// podq's runtime: pools of several CPUs claim ring slots, each side on its own
    /// line; one-CPU pools keep the lock.
    Ring,
}

impl From<WorklistArg> for podq_sim::Worklist {
    fn from(arg: WorklistArg) -> Self {
        match arg {
            WorklistArg::Locked => podq_sim::Worklist::Locked,
            WorklistArg::Ring => podq_sim::Worklist::Ring,
        }
    }
}

/// `--worker-cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkerCapArg {
    /// podq's runtime: one running worker per pod CPU.
    PodCpus,
    /// The kernel's unbound pools: a worker for every queued item.
    Unlimited,
}

impl From<WorkerCapArg> for podq_sim::WorkerCap {
    fn from(arg: WorkerCapArg) -> Self {
        match arg {
            WorkerCapArg::PodCpus => podq_sim::WorkerCap::PodCpus,
            WorkerCapArg::Unlimited => podq_sim::WorkerCap::Unlimited,
        }
    }
}

/// `--remote-free`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RemoteFreeArg {
    /// Freed on another CPU than it was allocated on.
    Cpu,
    /// Freed on another NUMA node.
    Node,
}

/// Options of `podq sim`.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// The workload.
    #[arg(value_enum, default_value = "ladder")]
    pub workload: SimWorkload,
    /// Machine profile: xeon-2s24c, grace-72c, xeon-12c, epyc-2s32c. It gives the cost
    /// parameters and, unless a topology is given, the topology.
    #[arg(long, default_value = "xeon-2s24c")]
    pub machine: String,
    /// JSON object of cost parameters overriding the machine's (see --print-cost).
    #[arg(long, value_name = "FILE.json")]
    pub cost: Option<PathBuf>,
    /// Print the cost parameters in force with their sources, and exit.
    #[arg(long)]
    pub print_cost: bool,
    /// `live`, `fake:SHAPE` or `sysfs:PATH`: the topology to simulate instead of the
    /// machine's shape (costs still come from --machine).
    #[arg(long, conflicts_with_all = ["synthetic", "sysfs_root"])]
    pub topology: Option<String>,
    /// Same as `--topology fake:SHAPE`.
    #[arg(long, value_name = "SHAPE", conflicts_with = "sysfs_root")]
    pub synthetic: Option<String>,
    /// Same as `--topology sysfs:PATH`.
    #[arg(long, value_name = "DIR|FILE.tar.gz")]
    pub sysfs_root: Option<PathBuf>,
    /// Affinity scopes to run, comma-separated [default: cpu,smt,cache,cache_shard,numa,system].
    #[arg(long, value_delimiter = ',', value_parser = parse_scope)]
    pub scopes: Vec<Scope>,
    /// Strict pods: on, off or both.
    #[arg(long, value_enum, default_value = "both")]
    pub strict: StrictArg,
    /// Virtual time of each run, e.g. 50ms, 1s (at most 10 s) [default: 100ms].
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "items")]
    pub duration: Option<Duration>,
    /// Items per producer per run, instead of a duration.
    #[arg(long)]
    pub items: Option<u64>,
    /// Virtual time simulated before measuring, with --duration.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms")]
    pub warmup: Duration,
    /// `queue`, `throughput`: producers [default: one per CPU].
    #[arg(long)]
    pub producers: Option<usize>,
    /// `latency`: the submitter's CPU [default: the first CPU].
    #[arg(long)]
    pub cpu: Option<usize>,
    /// `latency`: think time between items.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1ms")]
    pub think: Duration,
    /// `completion`: completion producers (CQs) [default: one per CPU].
    #[arg(long)]
    pub cq: Option<usize>,
    /// `completion`: `node0`, `split` or a cpulist.
    #[arg(long, default_value = "node0")]
    pub cq_placement: String,
    /// `completion`: I/Os in flight per producer; `throughput`: items in flight per
    /// producer [default: 16; throughput 64].
    #[arg(long)]
    pub depth: Option<usize>,
    /// `completion`: rpciod scopes in equal time segments, e.g. smt,cache_shard,smt.
    #[arg(long, value_delimiter = ',', value_parser = parse_scope)]
    pub toggle: Vec<Scope>,
    /// `completion`: CQ placements in equal time segments, e.g. split,node0 (`nodeN`
    /// or `split`; the first replaces --cq-placement); a producer moves at its next
    /// wake-up.
    #[arg(long, value_delimiter = ',')]
    pub cq_move: Vec<String>,
    /// `--scopes auto`: the controller's window of virtual time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms")]
    pub auto_window: Duration,
    /// `--scopes auto`: the controller's thresholds and limits as JSON (the fields of
    /// `podq::policy::auto::AutoConfig`; missing ones keep their defaults).
    #[arg(long, value_name = "FILE.json")]
    pub auto_config: Option<PathBuf>,
    /// `completion`: an I/O's payload in bytes, which crosses the transport (the cost
    /// model's `nic_rate`) and is the unit of MB/s, 1 to 1073741824 [default: 4096].
    #[arg(long, value_name = "BYTES")]
    pub io_size: Option<u64>,
    /// `completion`: allocator object size in bytes.
    #[arg(long, default_value_t = 256)]
    pub object_size: usize,
    /// `completion`: objects per CPU cache in the allocator model.
    #[arg(long, default_value_t = 16)]
    pub alloc_cache: usize,
    /// `completion`: which frees are remote.
    #[arg(long, value_enum, default_value = "cpu")]
    pub remote_free: RemoteFreeArg,
    /// CPU time of an item of `queue`, `latency` and `throughput`. The default stands
    /// for a small item; `podq bench`'s items spend none beyond their closure
    /// (`--item-work 0s` there), which `podq bench X --sim` simulates as it is.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "100ns")]
    pub item_work: Duration,
    /// `completion`: the CQ producers' priority: `high` preempts the workers on their
    /// CPUs, as the kernel's CQ handlers on `ib-comp-wq` (WQ_HIGHPRI, nice -20) do;
    /// `normal` as `podq bench`'s producer threads.
    #[arg(long, value_enum, default_value = "high")]
    pub cq_priority: CqPriority,
    /// `completion`: CPU time of a CQ producer per I/O.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2us")]
    pub cq_work: Duration,
    /// `completion`: CPU time of an rpciod item besides its buffer read and allocator work.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "16us")]
    pub rpciod_work: Duration,
    /// `completion`: CPU time of an nfsiod item besides its allocator work.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "4us")]
    pub nfsiod_work: Duration,
    /// How a pool's worklist is shared between queuers and workers: `locked`, the
    /// kernel's pool lock (the model the validation runs use); `ring`, podq's runtime,
    /// whose pools of several CPUs claim ring slots instead.
    #[arg(long, value_enum, default_value = "locked")]
    pub worklist: WorklistArg,
    /// How many of a pool's workers may run at once: `pod-cpus`, podq's runtime (one per
    /// CPU of the pod, a preempted one still counted); `unlimited`, the kernel's unbound
    /// pools, where every queued item gets a worker woken or created for it (up to 512
    /// threads a pool).
    #[arg(long, value_enum, default_value = "pod-cpus")]
    pub worker_cap: WorkerCapArg,
    /// The runtime's CPU-intensive rule: a worker whose item has run this long (at
    /// least 1ms) leaves its pool's running count, so the pool wakes or starts another
    /// for the items behind it (at most one more per pod CPU); `off` turns it off, as
    /// `podq::watchdog::set_cpu_intensive_threshold(None)` does. Only with
    /// `--worker-cap pod-cpus`: the kernel's unbound pools have no count to leave.
    #[arg(long, value_parser = parse_cpu_intensive, default_value = "10ms")]
    pub cpu_intensive: CpuIntensive,
    /// Random seed: the same inputs and seed give the same results.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run each parameter at x0.5 and x2 for every configuration and report how
    /// items/s moves (the sensitivity sweep), next to the change two other seeds give.
    #[arg(long)]
    pub sensitivity: bool,
    /// Write the results as JSON to FILE (`-`: stdout; the tables then go to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,
    /// Write an SVG plot, drawn as `podq bench --plot` draws its own.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Refused: a simulated run is deterministic, rounds would repeat it.
    #[arg(long, hide = true)]
    pub rounds: Option<String>,
    /// Refused: the simulator models podq only.
    #[arg(long, hide = true)]
    pub systems: Option<String>,
}

/// `--cpu-intensive`: a threshold, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuIntensive(pub Option<Duration>);

fn parse_cpu_intensive(text: &str) -> Result<CpuIntensive, String> {
    if text == "off" {
        return Ok(CpuIntensive(None));
    }
    let threshold = bench::parse_run_duration(text).map_err(|e| format!("{e}, or `off`"))?;
    if threshold < podq::watchdog::MIN_THRESHOLD {
        return Err(format!(
            "`{text}` is shorter than {} (the runtime's shortest threshold), or `off`",
            humantime::format_duration(podq::watchdog::MIN_THRESHOLD)
        ));
    }
    Ok(CpuIntensive(Some(threshold)))
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    match text.parse::<Scope>() {
        Ok(Scope::Default) => Err("`default` is not a scope to simulate; name it".to_owned()),
        Ok(scope) => Ok(scope),
        Err(e) => Err(e.to_string()),
    }
}

/// One configuration to simulate.
pub struct Case {
    /// The run.
    pub spec: RunSpec,
}

/// A finished case.
pub struct Done {
    /// What ran.
    pub spec: RunSpec,
    /// What came out.
    pub output: SimOutput,
    /// Wall time of the simulation, seconds.
    pub wall_seconds: f64,
}

/// The machine profile, topology and parameters of a `podq sim` invocation.
pub struct Setup {
    /// The profile.
    pub machine: cost::Machine,
    /// The topology spec as given.
    pub spec: String,
    /// The topology.
    pub topology: Topology,
    /// Parameters in force.
    pub params: CostParams,
}

pub(crate) fn setup(args: &SimArgs) -> Result<Setup> {
    let machine = machine(&args.machine)?;
    let mut params = machine.params.clone();
    if let Some(path) = &args.cost {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading cost file {}", path.display()))?;
        params
            .apply_json(&text, false)
            .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    }
    let spec = if let Some(shape) = &args.synthetic {
        format!("fake:{shape}")
    } else if let Some(root) = &args.sysfs_root {
        format!("sysfs:{}", root.display())
    } else if let Some(t) = &args.topology {
        t.clone()
    } else {
        format!("fake:{}", machine.shape)
    };
    setup_on(machine, params, spec)
}

/// The machine profile `name`.
pub(crate) fn machine(name: &str) -> Result<cost::Machine> {
    cost::machine(name).ok_or_else(|| {
        usage(format!(
            "unknown machine `{name}`: expected one of {}",
            cost::MACHINES.join(", ")
        ))
    })
}

/// `machine` with `params` on the topology `spec` names.
pub(crate) fn setup_on(machine: cost::Machine, params: CostParams, spec: String) -> Result<Setup> {
    let topology = topo::load(&spec).map_err(|e| usage(format!("--topology: {e:#}")))?;
    if topology.usable().len() > podq_sim::MAX_SIM_CPUS {
        return Err(usage(format!(
            "--topology {spec}: {} CPUs; the simulator takes at most {} (a run would take too long)",
            topology.usable().len(),
            podq_sim::MAX_SIM_CPUS
        )));
    }
    Ok(Setup {
        machine,
        spec,
        topology,
        params,
    })
}

fn validate(args: &SimArgs) -> Result<()> {
    if args.rounds.is_some() {
        return Err(usage(
            "--rounds makes no sense for the simulator: a run is deterministic; vary --seed instead",
        ));
    }
    if args.systems.is_some() {
        return Err(usage(
            "--systems makes no sense for the simulator: it models podq only",
        ));
    }
    if args.items == Some(0) {
        return Err(usage("--items must be at least 1"));
    }
    if let Some(d) = args.duration {
        if d.is_zero() {
            return Err(usage("--duration must be longer than zero"));
        }
        if (d + args.warmup).as_nanos() > u128::from(podq_sim::MAX_VIRTUAL_NS) {
            return Err(usage(format!(
                "--duration {} with --warmup {}: a simulated run lasts at most {} s of virtual time",
                humantime::format_duration(d),
                humantime::format_duration(args.warmup),
                podq_sim::MAX_VIRTUAL_NS / 1_000_000_000
            )));
        }
    }
    if args.producers == Some(0) {
        return Err(usage("--producers must be at least 1"));
    }
    if args.depth == Some(0) {
        return Err(usage("--depth must be at least 1"));
    }
    crate::bench::alloc_model::check_options(args.object_size, args.alloc_cache)?;
    let only = |set: bool, name: &str, workloads: &[SimWorkload]| -> Result<()> {
        if set && !workloads.contains(&args.workload) {
            return Err(usage(
                format!(
                    "{name} makes no sense for the simulator's {:?} workload",
                    args.workload
                )
                .to_lowercase(),
            ));
        }
        Ok(())
    };
    use SimWorkload::*;
    only(!args.toggle.is_empty(), "--toggle", &[Completion])?;
    only(!args.cq_move.is_empty(), "--cq-move", &[Completion])?;
    only(args.cq.is_some(), "--cq", &[Completion])?;
    only(args.io_size.is_some(), "--io-size", &[Completion])?;
    if let Some(bytes) = args.io_size {
        if bytes == 0 || bytes > podq_sim::MAX_IO_BYTES {
            return Err(usage(format!(
                "--io-size {bytes}: an I/O's payload is 1 to {} bytes",
                podq_sim::MAX_IO_BYTES
            )));
        }
    }
    only(args.depth.is_some(), "--depth", &[Completion, Throughput])?;
    only(
        args.producers.is_some(),
        "--producers",
        &[Queue, Throughput, Ladder],
    )?;
    only(args.cpu.is_some(), "--cpu", &[Latency, Ladder])?;
    if (!args.toggle.is_empty() || !args.cq_move.is_empty()) && args.items.is_some() {
        return Err(usage("--toggle and --cq-move need --duration, not --items"));
    }
    Ok(())
}

pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `--auto-window` and `--auto-config`.
fn auto_spec(args: &SimArgs) -> Result<podq_sim::auto::AutoSpec> {
    if args.auto_window < Duration::from_micros(1) {
        return Err(usage("--auto-window must be at least 1us"));
    }
    let config = match &args.auto_config {
        None => podq::policy::auto::AutoConfig::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| usage(format!("--auto-config {}: {e}", path.display())))?;
            let config: podq::policy::auto::AutoConfig = serde_json::from_str(&text)
                .map_err(|e| usage(format!("--auto-config {}: {e}", path.display())))?;
            config
                .validate()
                .map_err(|e| usage(format!("--auto-config {}: {e}", path.display())))?;
            config
        }
    };
    Ok(podq_sim::auto::AutoSpec {
        window_ns: ns(args.auto_window),
        config,
    })
}

/// The workload options of `args`, for the shared definitions (`bench::define`).
fn options(args: &SimArgs) -> define::Options<'_> {
    define::Options {
        producers: args.producers,
        cpu: args.cpu,
        think: args.think,
        items: args.items,
        works: args.depth.unwrap_or(throughput::DEFAULT_WORKS),
        flush: false,
        cq: args.cq,
        cq_placement: &args.cq_placement,
        depth: args.depth.unwrap_or(16),
        toggle: &args.toggle,
        cq_move: &args.cq_move,
        alloc: AllocConfig {
            object_size: args.object_size,
            cache_size: args.alloc_cache,
            remote: match args.remote_free {
                RemoteFreeArg::Cpu => RemoteRule::Cpu,
                RemoteFreeArg::Node => RemoteRule::Node,
            },
        },
        work: define::ItemWork {
            item: args.item_work,
            cq: args.cq_work,
            rpciod: args.rpciod_work,
            nfsiod: args.nfsiod_work,
        },
    }
}

pub(crate) fn cases(args: &SimArgs, topology: &Topology) -> Result<Vec<Case>> {
    let scopes = scopes_or_all(&args.scopes);
    let strict = args.strict.values();
    let length = match (args.items, args.duration) {
        (Some(n), _) => RunLength::Items(n),
        (None, Some(d)) => RunLength::Duration(ns(d)),
        (None, None) => RunLength::Duration(100_000_000),
    };
    let auto = auto_spec(args)?;
    let which = match args.workload {
        SimWorkload::Ladder => bench::Workload::Ladder,
        SimWorkload::Queue => bench::Workload::Queue,
        SimWorkload::Latency => bench::Workload::Latency,
        SimWorkload::Completion => bench::Workload::Completion,
        SimWorkload::Throughput => bench::Workload::Throughput,
    };
    let high_priority = args.cq_priority == CqPriority::High;
    let mut out = Vec::new();
    for test in define::tests(which, &options(args), topology)? {
        let Some(mut workload) = backend::workload(&test, topology, high_priority) else {
            continue;
        };
        if let (podq_sim::Workload::Completion(c), Some(bytes)) = (&mut workload, args.io_size) {
            c.io_bytes = bytes;
        }
        let scopes = if args.toggle.is_empty() {
            scopes.clone()
        } else {
            args.toggle[..1].to_vec()
        };
        for &scope in &scopes {
            for &s in &strict {
                let mut spec = backend::run_spec(
                    workload.clone(),
                    scope,
                    s,
                    &auto,
                    length,
                    args.warmup,
                    args.seed,
                );
                spec.queue.worklist = args.worklist.into();
                spec.queue.worker_cap = args.worker_cap.into();
                spec.queue.cpu_intensive = args.cpu_intensive.0;
                out.push(Case { spec });
            }
        }
    }
    Ok(out)
}

/// Runs `podq sim`.
pub fn run(args: &SimArgs) -> Result<()> {
    validate(args)?;
    let setup = setup(args)?;
    if args.print_cost {
        print!(
            "machine {}: {}\n\n{}",
            setup.machine.name,
            setup.machine.description,
            setup.params.table()
        );
        return Ok(());
    }
    let cases = cases(args, &setup.topology)?;
    if args.sensitivity {
        let progress = progress_bar(
            args.quiet,
            (cases.len() * (3 + 2 * cost::PARAMS.len())) as u64,
        );
        let text = sweep::run(&cases, &setup, &progress)?;
        progress.finish_and_clear();
        print!("{text}");
        return Ok(());
    }
    // Checked and created before the simulation, as bench does.
    let mut outputs = Outputs::open(args.json.as_deref(), args.plot.as_deref())?;
    let progress = progress_bar(args.quiet, cases.len() as u64);
    let specs = cases.into_iter().map(|c| c.spec).collect();
    let done = backend::run_all(&setup, specs, &progress)?;
    progress.finish_and_clear();
    let report = output::report(args, &setup, &done);
    let text = output::render(args, &setup, &report);
    if args.json.as_deref() == Some("-") {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    outputs.write_json(&report)?;
    outputs.write_plot(|| output::plot(report))?;
    outputs.keep();
    Ok(())
}
