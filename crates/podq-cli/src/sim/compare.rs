//! `podq bench X --sim MACHINE`: the bench's runs simulated on the same topology with
//! a machine profile's costs, printed next to the real ones.
//!
//! The bench options are translated into the simulator's workload descriptions
//! (`podq_sim::Workload`); `throughput` differs by definition (the simulator's
//! producers block while `--depth` items are pending, bench's keep calling).

use std::time::Duration;

use anyhow::Result;
use indicatif::ProgressBar;

use super::{cases, run_cases, setup, RemoteFreeArg, SimArgs, SimWorkload};
use crate::bench::alloc_model::RemoteRule;
use crate::bench::report::{self, human_ns, human_rate, Report};
use crate::bench::{usage, BenchArgs, Workload};

fn sim_args(bench: &BenchArgs, machine: &str, topology: &str) -> Result<SimArgs> {
    let workload =
        match bench.workload {
            Workload::Ladder => SimWorkload::Ladder,
            Workload::Queue => SimWorkload::Queue,
            Workload::Latency => SimWorkload::Latency,
            Workload::Completion => SimWorkload::Completion,
            Workload::Throughput => SimWorkload::Throughput,
            Workload::Peers => return Err(usage(
                "--sim: the simulator models podq only, so `peers` has no simulated counterpart",
            )),
            Workload::Compare => return Err(usage(
                "--sim: `compare` reads results, it runs nothing to simulate",
            )),
            Workload::Memory | Workload::Idle => return Err(usage(
                "--sim: `memory` and `idle` measure this process's memory and threads; the simulator has neither",
            )),
            Workload::Scale => return Err(usage(
                "--sim: `scale` runs several fake topologies; simulate each with `podq sim throughput --synthetic SHAPE`",
            )),
        };
    Ok(SimArgs {
        workload,
        machine: machine.to_owned(),
        cost: None,
        print_cost: false,
        topology: Some(topology.to_owned()),
        synthetic: None,
        sysfs_root: None,
        scopes: bench.scopes.clone(),
        strict: bench.strict,
        duration: match (bench.items, bench.duration) {
            (Some(_), _) => None,
            (None, Some(d)) => Some(d),
            (None, None) if workload == SimWorkload::Completion => Some(Duration::from_secs(3)),
            (None, None) => Some(Duration::from_secs(1)),
        },
        items: bench.items,
        warmup: Duration::from_millis(10),
        producers: bench.producers,
        cpu: bench.cpu,
        think: bench.think,
        cq: bench.cq,
        cq_placement: bench.cq_placement.clone(),
        depth: Some(if workload == SimWorkload::Throughput {
            bench.works
        } else {
            bench.depth
        }),
        toggle: bench.toggle.clone(),
        cq_move: bench.cq_move.clone(),
        // The same controller settings as the real run beside it.
        auto_window: bench.auto_window,
        auto_config: bench.auto_config.clone(),
        object_size: bench.object_size,
        alloc_cache: bench.alloc_cache,
        remote_free: match bench.remote_free {
            RemoteRule::Cpu => RemoteFreeArg::Cpu,
            RemoteRule::Node => RemoteFreeArg::Node,
        },
        item_work: Duration::from_nanos(100),
        cq_work: Duration::from_micros(2),
        rpciod_work: Duration::from_micros(16),
        nfsiod_work: Duration::from_micros(4),
        seed: 1,
        sensitivity: false,
        json: None,
        plot: None,
        quiet: true,
        rounds: None,
        systems: None,
    })
}

/// Refuses a `--sim` that cannot run, before the real runs spend their time.
pub fn check(bench: &BenchArgs, machine: &str) -> Result<()> {
    let args = sim_args(bench, machine, "live")?;
    if podq_sim::cost::machine(&args.machine).is_none() {
        return Err(usage(format!(
            "--sim: unknown machine `{machine}`: expected one of {}",
            podq_sim::cost::MACHINES.join(", ")
        )));
    }
    Ok(())
}

/// Simulates `bench`'s runs and renders them next to `real`'s podq results.
pub fn side_by_side(
    bench: &BenchArgs,
    machine: &str,
    topology: &str,
    real: &Report,
) -> Result<String> {
    let args = sim_args(bench, machine, topology)?;
    let setup = setup(&args)?;
    let cases = cases(&args, &setup.topology)?;
    let done = run_cases(
        &cases,
        &setup.topology,
        &setup.params,
        &ProgressBar::hidden(),
    )?;
    let sim = super::output::report(&args, &setup, &done);
    let rows: Vec<Vec<String>> = sim
        .results
        .iter()
        .map(|s| {
            let r = &s.run;
            let twin = real.results.iter().find(|x| {
                x.system == "podq"
                    && x.test == r.test
                    && x.scope == r.scope
                    && x.strict == r.strict
                    && x.segment == r.segment
            });
            let cell = |f: &dyn Fn(&report::RunResult) -> String| twin.map_or("-".to_owned(), f);
            vec![
                r.test.to_owned(),
                report::config_label(r.scope, r.strict),
                cell(&|x| human_rate(x.items_per_sec)),
                human_rate(r.items_per_sec),
                cell(&|x| human_ns(x.latency_ns.p50 as f64)),
                human_ns(r.latency_ns.p50 as f64),
                cell(&|x| human_ns(x.latency_ns.p99 as f64)),
                human_ns(r.latency_ns.p99 as f64),
            ]
        })
        .collect();
    Ok(format!(
        "\nreal against simulated (podq sim --machine {machine} --topology {topology}; latency: queue call, clat or I/O)\n{}",
        report::table(
            &["test", "scope", "real items/s", "sim items/s", "real p50", "sim p50", "real p99", "sim p99"],
            &rows,
            2
        )
    ))
}
