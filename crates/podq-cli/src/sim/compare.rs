//! `podq bench X --sim MACHINE`: the bench's own cases, run again through the
//! simulator backend on the same topology with a machine profile's costs, printed next
//! to the real ones. Both runs take the same workload definitions (`bench::define`),
//! item work included: a simulated item costs what bench's `--item-work` ... made the
//! real one spend besides its real work.

use std::time::Duration;

use anyhow::Result;
use indicatif::ProgressBar;
use podq_sim::auto::AutoSpec;

use super::backend::Simulated;
use crate::bench::define::Backend;
use crate::bench::report::{self, human_ns, human_rate, Report};
use crate::bench::workloads::{Case, RunLength};
use crate::bench::{usage, BenchArgs, Workload};

/// Refuses a `--sim` that cannot run, before the real runs spend their time.
pub fn check(bench: &BenchArgs, machine: &str) -> Result<()> {
    let refusal = match bench.workload {
        Workload::Peers => {
            Some("the simulator models podq only, so `peers` has no simulated counterpart")
        }
        Workload::Compare => Some("`compare` reads results, it runs nothing to simulate"),
        Workload::Memory | Workload::Idle => Some(
            "`memory` and `idle` measure this process's memory and threads; the simulator has neither",
        ),
        Workload::Scale => Some(
            "`scale` runs several fake topologies; simulate each with `podq sim throughput --synthetic SHAPE`",
        ),
        _ => None,
    };
    if let Some(why) = refusal {
        return Err(usage(format!("--sim: {why}")));
    }
    super::machine(machine).map_err(|e| usage(format!("--sim: {e}")))?;
    Ok(())
}

/// Simulates `cases` (the bench's podq cases) and renders them next to `real`'s
/// results.
pub fn side_by_side(
    bench: &BenchArgs,
    machine: &str,
    topology: &str,
    cases: &[Case],
    length: RunLength,
    real: &Report,
) -> Result<String> {
    let profile = super::machine(machine)?;
    let params = profile.params.clone();
    let setup = super::setup_on(profile, params, topology.to_owned())?;
    let backend = Simulated {
        setup: &setup,
        // bench's producers are ordinary threads.
        cq_high_priority: false,
        auto: AutoSpec {
            window_ns: super::ns(bench.auto_window),
            config: crate::bench::auto_config(bench)?,
        },
        warmup: Duration::from_millis(10),
        seed: 1,
    };
    let sim = backend.run(cases, length, &ProgressBar::hidden())?;
    let rows: Vec<Vec<String>> = sim
        .iter()
        .map(|r| {
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
    // The `podq sim` options that give these simulated runs, where its defaults differ
    // from bench's: its items cost 100 ns by default (bench's none beyond the closure),
    // its CQ producers preempt the workers.
    let work = |flag: &str, d: Duration| format!(" {flag} {}", humantime::format_duration(d));
    let mut same = format!("--worklist ring{}", work("--item-work", bench.item_work));
    if bench.workload == Workload::Completion {
        same.push_str(" --cq-priority normal");
        for (flag, d) in [
            ("--cq-work", bench.cq_work),
            ("--rpciod-work", bench.rpciod_work),
            ("--nfsiod-work", bench.nfsiod_work),
        ] {
            same.push_str(&work(flag, d));
        }
    }
    Ok(format!(
        "\nreal against simulated (podq sim --machine {machine} --topology {topology} {same}; latency: queue call, clat or I/O)\n{}",
        report::table(
            &["test", "scope", "real items/s", "sim items/s", "real p50", "sim p50", "real p99", "sim p99"],
            &rows,
            2
        )
    ))
}
