//! `podq sim`'s results: `podq bench`'s JSON schema (each run with a `sim` object) and
//! its tables.

use hdrhistogram::Histogram;
use podq_sim::{CostParams, PoolLocks, SegmentOutput, Workload};
use podq_topology::Scope;
use serde::Serialize;

use super::{Done, Setup, SimArgs, SimWorkload};
use crate::bench::alloc_model::AllocCounts;
use crate::bench::plot;
use crate::bench::report::{
    self, human_ns, human_rate, CompletionDetail, LatencySummary, RunResult, TopologyInfo,
    SCHEMA_VERSION,
};
use crate::bench::switches_cell;
use crate::bench::system::PoolLockCounts;
use crate::bench::workloads::throughput::{Mode, ThroughputDetail};

/// The whole output: `podq bench`'s report with simulated runs.
#[derive(Serialize)]
pub struct SimReport {
    /// As `podq bench`.
    pub schema_version: u32,
    /// `queue`, `latency`, `completion`, `throughput` or `ladder`.
    pub workload: String,
    /// The command line.
    pub command: Vec<String>,
    /// The simulated topology (`real_cpus` empty, `fake` false: nothing is mapped).
    pub topology: TopologyInfo,
    /// The effective settings.
    pub settings: serde_json::Value,
    /// One entry per configuration (and toggle segment).
    pub results: Vec<SimRun>,
    /// Always empty (no peers in the simulator).
    pub ratios: Vec<()>,
}

/// One run: a bench result plus what the simulator knows.
#[derive(Serialize)]
pub struct SimRun {
    /// The bench fields.
    #[serde(flatten)]
    pub run: RunResult,
    /// The simulator's fields.
    pub sim: SimInfo,
}

/// Locality of the items: where each ran relative to where it was queued.
#[derive(Serialize)]
pub struct LocalityCounts {
    /// The same CPU.
    pub same_cpu: u64,
    /// An SMT sibling.
    pub same_smt: u64,
    /// Another core of the LLC.
    pub same_llc: u64,
    /// Another LLC of the node.
    pub same_node: u64,
    /// Another node.
    pub remote: u64,
}

/// What the simulator adds to a run.
#[derive(Serialize)]
pub struct SimInfo {
    /// `--machine`.
    pub machine: String,
    /// The parameters in force.
    pub parameters: CostParams,
    /// `--seed`.
    pub seed: u64,
    /// Events processed by the whole run (all segments).
    pub events: u64,
    /// Virtual seconds of this result.
    pub virtual_seconds: f64,
    /// Items by locality class.
    pub locality: LocalityCounts,
    /// Wake-ups of sleeping threads.
    pub wakeups: u64,
    /// Context switches (also outside `completion`).
    pub context_switches: u64,
    /// Migrations.
    pub migrations: u64,
    /// Idle workers woken outside their pod and steered back.
    pub repatriations: u64,
    /// Workers started.
    pub workers_created: u64,
    /// Normal threads preempted by a waking high-priority CQ producer.
    pub preemptions: u64,
    /// Workers taken out of their pool's running count for a long item.
    pub cpu_intensive: u64,
    /// Items such a worker had taken and not started, handed back to the worklist.
    pub handed_back: u64,
    /// Time runnable but not running (schedstat's `run_delay`), ns: producers.
    pub run_delay_producers_ns: u64,
    /// The same for workers.
    pub run_delay_workers_ns: u64,
    /// Idle share per node (`[node, share]`).
    pub idle_per_node: Vec<(usize, f64)>,
    /// `auto`: the scope in force at the end and the switches made in this result.
    pub auto: Option<SimAutoInfo>,
    /// Wall-clock figures: the only fields that differ between identical runs.
    pub wall: WallInfo,
}

/// What the `auto` controller did in one result.
#[derive(Serialize)]
pub struct SimAutoInfo {
    /// The concrete scope in force at the end.
    pub scope_at_end: Scope,
    /// The switches, with the virtual time of each.
    pub switches: Vec<SimSwitch>,
}

/// One switch of the simulated `auto` controller.
#[derive(Serialize)]
pub struct SimSwitch {
    /// Virtual time, ns since the start of the run.
    pub at_ns: u64,
    /// The switch and its reason.
    #[serde(flatten)]
    pub switch: podq::policy::auto::Switch,
}

/// Wall-clock figures of a run.
#[derive(Serialize)]
pub struct WallInfo {
    /// Wall seconds the whole run took to simulate.
    pub seconds: f64,
    /// Events per wall second.
    pub events_per_sec: f64,
}

fn pool_locks(p: &PoolLocks) -> PoolLockCounts {
    PoolLockCounts {
        enqueue: p.enqueue,
        dequeue: p.dequeue,
    }
}

fn test_name(w: &Workload) -> &'static str {
    match w {
        Workload::Throughput { .. } => "throughput_work",
        other => other.name(),
    }
}

pub(crate) fn run_result(done: &Done, index: usize, seg: &SegmentOutput) -> RunResult {
    let w = &done.spec.workload;
    let segmented = done.output.segments.len() > 1;
    let main: &Histogram<u64> = match w {
        Workload::Queue { .. } | Workload::Throughput { .. } => &seg.hists.queue,
        _ => &seg.hists.latency,
    };
    let seconds = seg.seconds;
    let rate = |n: u64| n as f64 / seconds.max(f64::MIN_POSITIVE);
    let completion = matches!(w, Workload::Completion(_)).then(|| {
        let io_bytes = match w {
            Workload::Completion(c) => c.io_bytes,
            _ => podq_sim::DEFAULT_IO_BYTES,
        };
        CompletionDetail {
            mb_per_sec: seg.items as f64 * io_bytes as f64 / seconds.max(f64::MIN_POSITIVE) / 1e6,
            idle_per_cpu: seg.idle_per_cpu.iter().map(|&(_, i)| i).collect(),
            idle_per_node: seg.idle_per_node.iter().map(|&(_, i)| i).collect(),
            allocator: AllocCounts {
                ops: seg.alloc.counts,
                node_lock: seg.alloc.node_lock,
            },
            nfsiod_pool_locks: seg.nfsiod_pool_locks.as_ref().map(pool_locks),
            context_switches: seg.counters.context_switches,
            migrations: seg.counters.migrations,
            placement: None,
            auto: None,
            accounting: None,
            start_s: done.output.segments[..index]
                .iter()
                .map(|s| s.seconds)
                .sum(),
            // The simulator keeps per-segment totals only; no time series within one.
            timeline: Vec::new(),
        }
    });
    let throughput = matches!(w, Workload::Throughput { .. }).then(|| ThroughputDetail {
        mode: Mode::Work,
        calls: seg.hists.queue.len(),
        accepted: seg.hists.queue.len(),
        runs: seg.items,
        submit_seconds: seconds,
        calls_per_sec: rate(seg.hists.queue.len()),
        accepted_per_sec: rate(seg.hists.queue.len()),
        context_switches: seg.counters.context_switches,
        pods: None,
        flushed: false,
    });
    RunResult {
        test: test_name(w),
        system: "podq-sim".to_owned(),
        scope: Some(seg.scope),
        strict: Some(done.spec.queue.strict),
        segment: segmented.then_some(index),
        producers: w.producer_cpus().len(),
        items: seg.items,
        seconds,
        items_per_sec: rate(seg.items),
        latency_ns: LatencySummary::of(main),
        submit_ns: matches!(w, Workload::Latency { .. })
            .then(|| LatencySummary::of(&seg.hists.submit)),
        completion,
        throughput,
        memory: None,
        idle: None,
        context_switches: matches!(w, Workload::Queue { .. })
            .then_some(seg.counters.context_switches),
        pool_locks: Some(pool_locks(&seg.pool_locks)),
        // The simulated controller's switches are in `sim.auto`, at virtual times.
        auto: None,
        // A seeded simulation is one deterministic run: there is no spread to show.
        rounds: Vec::new(),
        histogram: main.clone(),
    }
}

fn sim_info(setup: &Setup, done: &Done, seg: &SegmentOutput) -> SimInfo {
    let l = &seg.counters.locality;
    SimInfo {
        machine: setup.machine.name.to_owned(),
        parameters: setup.params.clone(),
        seed: done.spec.seed,
        events: done.output.events,
        virtual_seconds: seg.seconds,
        locality: LocalityCounts {
            same_cpu: l[0],
            same_smt: l[1],
            same_llc: l[2],
            same_node: l[3],
            remote: l[4],
        },
        wakeups: seg.counters.wakeups,
        context_switches: seg.counters.context_switches,
        migrations: seg.counters.migrations,
        repatriations: seg.counters.repatriations,
        workers_created: seg.counters.workers_created,
        preemptions: seg.counters.preemptions,
        cpu_intensive: seg.counters.cpu_intensive,
        handed_back: seg.counters.handed_back,
        run_delay_producers_ns: seg.counters.run_delay_ns[0],
        run_delay_workers_ns: seg.counters.run_delay_ns[1],
        idle_per_node: seg.idle_per_node.clone(),
        auto: (seg.scope == Scope::Auto).then(|| SimAutoInfo {
            scope_at_end: seg.scope_at_end,
            switches: seg
                .auto_switches
                .iter()
                .map(|s| SimSwitch {
                    at_ns: s.at,
                    switch: s.switch.clone(),
                })
                .collect(),
        }),
        wall: WallInfo {
            seconds: done.wall_seconds,
            events_per_sec: done.output.events as f64 / done.wall_seconds.max(1e-9),
        },
    }
}

/// Builds the report.
pub fn report(args: &SimArgs, setup: &Setup, done: &[Done]) -> SimReport {
    let mut results = Vec::new();
    for d in done {
        for (i, seg) in d.output.segments.iter().enumerate() {
            results.push(SimRun {
                run: run_result(d, i, seg),
                sim: sim_info(setup, d, seg),
            });
        }
    }
    SimReport {
        schema_version: SCHEMA_VERSION,
        workload: format!("{:?}", args.workload).to_lowercase(),
        command: std::env::args().collect(),
        topology: TopologyInfo {
            spec: setup.spec.clone(),
            description: crate::bench::topo::describe(&setup.topology),
            cpus: setup.topology.usable().len(),
            nodes: setup.topology.nodes().len(),
            real_cpus: Vec::new(),
            fake: false,
        },
        settings: settings(args),
        results,
        ratios: Vec::new(),
    }
}

fn settings(args: &SimArgs) -> serde_json::Value {
    let d = |x: std::time::Duration| humantime::format_duration(x).to_string();
    serde_json::json!({
        "machine": args.machine,
        "seed": args.seed,
        "duration": args.duration.map(d),
        "items": args.items,
        "warmup": d(args.warmup),
        "scopes": args.scopes,
        "strict": format!("{:?}", args.strict).to_lowercase(),
        "producers": args.producers,
        "cpu": args.cpu,
        "think": d(args.think),
        "cq": args.cq,
        "cq_placement": args.cq_placement,
        "depth": args.depth,
        "toggle": args.toggle,
        "io_size": args.io_size.unwrap_or(podq_sim::DEFAULT_IO_BYTES),
        "object_size": args.object_size,
        "alloc_cache": args.alloc_cache,
        "remote_free": format!("{:?}", args.remote_free).to_lowercase(),
        "cq_priority": format!("{:?}", args.cq_priority).to_lowercase(),
        "worklist": format!("{:?}", args.worklist).to_lowercase(),
        "worker_cap": clap::ValueEnum::to_possible_value(&args.worker_cap)
            .map(|v| v.get_name().to_owned()),
        "cpu_intensive": args.cpu_intensive.0.map(d),
        "item_work": d(args.item_work),
        "cq_work": d(args.cq_work),
        "rpciod_work": d(args.rpciod_work),
        "nfsiod_work": d(args.nfsiod_work),
    })
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn lock_cells(r: &RunResult) -> [String; 3] {
    let l = r.pool_locks.unwrap_or_default();
    [
        percent(l.enqueue.contended, l.enqueue.acquisitions),
        percent(l.dequeue.contended, l.dequeue.acquisitions),
        human_ns((l.enqueue.wait_ns + l.dequeue.wait_ns) as f64),
    ]
}

/// A `queue` or `throughput` row: the run, its items/s, its queue call's percentiles
/// `ps`, then the lock, switch and idle cells.
fn queue_call_row(s: &SimRun, ps: &[fn(&LatencySummary) -> u64]) -> Vec<String> {
    let r = &s.run;
    let mut row = vec![r.label(), human_rate(r.items_per_sec)];
    row.extend(ps.iter().map(|p| human_ns(p(&r.latency_ns) as f64)));
    row.extend(lock_cells(r));
    row.extend([switches_cell(r), idle_cells(&s.sim)]);
    row
}

fn idle_cells(s: &SimInfo) -> String {
    let idle: Vec<String> = s
        .idle_per_node
        .iter()
        .map(|&(_, i)| format!("{:.0}%", i * 100.0))
        .collect();
    idle.join("/")
}

/// The tables, as `podq bench` prints them, with the simulator's lock and idle columns.
pub fn render(args: &SimArgs, setup: &Setup, report: &SimReport) -> String {
    let mut out = format!(
        "podq sim {}: machine {} ({}), topology {} ({}), seed {}\n",
        report.workload,
        setup.machine.name,
        setup.machine.description,
        report.topology.spec,
        report.topology.description,
        args.seed
    );
    let of = |test: &str| -> Vec<&SimRun> {
        report
            .results
            .iter()
            .filter(|r| r.run.test == test)
            .collect()
    };
    let queue = of("queue");
    if !queue.is_empty() {
        let rows: Vec<Vec<String>> = queue
            .iter()
            .map(|s| queue_call_row(s, &[|l| l.p50, |l| l.p90, |l| l.p95]))
            .collect();
        out.push_str(&format!(
            "\nqueue: {} producer(s), each queueing, waiting, re-queueing one item; latency of the queue call; lock columns: contended share, total wait; ctxsw: the simulated threads' context switches\n{}",
            queue[0].run.producers,
            report::table(
                &["scope", "items/s", "queue p50", "p90", "p95", "enqueue", "dequeue", "lock wait", "ctxsw/1k items", "idle/node"],
                &rows,
                1
            )
        ));
    }
    let latency = of("latency");
    if !latency.is_empty() {
        let rows: Vec<Vec<String>> = latency
            .iter()
            .map(|s| {
                let l = &s.run.latency_ns;
                vec![
                    s.run.label(),
                    human_ns(l.p50 as f64),
                    human_ns(l.p90 as f64),
                    human_ns(l.p99 as f64),
                    human_ns(l.p999 as f64),
                    human_ns(l.max as f64),
                    s.run
                        .submit_ns
                        .as_ref()
                        .map_or("-".to_owned(), |x| human_ns(x.stdev)),
                ]
            })
            .collect();
        out.push_str(&format!(
            "\nlatency: one submitter, depth 1, think time {}; submit to end of item\n{}",
            humantime::format_duration(args.think),
            report::table(
                &[
                    "scope",
                    "clat p50",
                    "p90",
                    "p99",
                    "p99.9",
                    "max",
                    "slat stdev"
                ],
                &rows,
                1
            )
        ));
        if args.workload == SimWorkload::Latency {
            for s in &latency {
                out.push_str(&format!("\n{}:\n", s.run.label()));
                if let Some(slat) = &s.run.submit_ns {
                    out.push_str(&report::fio_summary("slat", slat));
                }
                out.push_str(&report::fio_clat("clat", &s.run.latency_ns));
            }
        }
    }
    let throughput = of("throughput_work");
    if !throughput.is_empty() {
        let rows: Vec<Vec<String>> = throughput
            .iter()
            .map(|s| queue_call_row(s, &[|l| l.p50, |l| l.p99]))
            .collect();
        out.push_str(&format!(
            "\nthroughput: {} producer(s), each keeping items in flight; latency of the queue call; ctxsw: the simulated threads' context switches\n{}",
            throughput[0].run.producers,
            report::table(
                &["scope", "items/s", "queue p50", "p99", "enqueue", "dequeue", "lock wait", "ctxsw/1k runs", "idle/node"],
                &rows,
                1
            )
        ));
    }
    let completion = of("completion");
    if !completion.is_empty() {
        let rows: Vec<Vec<String>> = completion
            .iter()
            .map(|s| {
                let r = &s.run;
                let c = r
                    .completion
                    .as_ref()
                    .expect("completion results carry details");
                let [enq, deq, _] = lock_cells(r);
                vec![
                    r.label(),
                    format!("{:.1}", c.mb_per_sec),
                    human_ns(r.latency_ns.p50 as f64),
                    human_ns(r.latency_ns.p99 as f64),
                    percent(
                        c.allocator.node_lock.contended,
                        c.allocator.node_lock.acquisitions,
                    ),
                    human_ns(c.allocator.node_lock.wait_ns as f64),
                    enq,
                    deq,
                    format!("{:.0}", c.context_switches as f64 / r.seconds),
                    format!("{:.0}", c.migrations as f64 / r.seconds),
                    idle_cells(&s.sim),
                ]
            })
            .collect();
        out.push_str(&format!(
            "\ncompletion: {} CQ producer(s) -> rpciod -> nfsiod, {} B per I/O over a {} GB/s port; lock columns: contended share\n{}",
            completion[0].run.producers,
            args.io_size.unwrap_or(podq_sim::DEFAULT_IO_BYTES),
            setup.params.nic_rate,
            report::table(
                &[
                    "rpciod scope", "MB/s", "p50", "p99", "alloc lock", "alloc wait", "enqueue",
                    "dequeue", "ctxsw/s", "migr/s", "idle/node"
                ],
                &rows,
                1
            )
        ));
    }
    let auto: Vec<Vec<String>> = report
        .results
        .iter()
        .filter_map(|s| {
            let a = s.sim.auto.as_ref()?;
            let switches: Vec<String> = a
                .switches
                .iter()
                .map(|w| {
                    let s = &w.switch;
                    format!(
                        "{} {} -> {}: {}",
                        human_ns(w.at_ns as f64),
                        s.from,
                        s.to,
                        s.reason
                    )
                })
                .collect();
            Some(vec![
                format!("{} {}", s.run.test, s.run.label()),
                a.scope_at_end.to_string(),
                a.switches.len().to_string(),
                if switches.is_empty() {
                    "-".to_owned()
                } else {
                    switches.join("; ")
                },
            ])
        })
        .collect();
    if !auto.is_empty() {
        out.push_str(&format!(
            "
auto: switches at virtual times
{}",
            report::table(&["run", "at end", "switches", "what and why"], &auto, 2)
        ));
    }
    let events: u64 = report
        .results
        .iter()
        .filter(|r| r.run.segment.unwrap_or(0) == 0)
        .map(|r| r.sim.events)
        .sum();
    let wall: f64 = report
        .results
        .iter()
        .filter(|r| r.run.segment.unwrap_or(0) == 0)
        .map(|r| r.sim.wall.seconds)
        .sum();
    out.push_str(&format!(
        "\nsimulated {} run(s): {events} events in {wall:.2} s of wall time ({:.2} M events/s)\n",
        report
            .results
            .iter()
            .filter(|r| r.run.segment.unwrap_or(0) == 0)
            .count(),
        events as f64 / wall.max(1e-9) / 1e6
    ));
    out
}

/// The SVG plot, drawn as `podq bench` draws its reports.
pub fn plot(report: SimReport) -> anyhow::Result<String> {
    let title = format!("podq sim {}", report.workload);
    let report = report::Report {
        schema_version: report.schema_version,
        workload: report.workload,
        command: report.command,
        topology: report.topology,
        settings: report.settings,
        results: report.results.into_iter().map(|r| r.run).collect(),
        ratios: Vec::new(),
        warnings: Vec::new(),
    };
    plot::render_titled(&report, &title)
}
