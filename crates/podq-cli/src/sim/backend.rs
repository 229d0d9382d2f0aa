//! The simulator as a backend for the workload definitions (`bench::define`): each
//! definition becomes a `podq_sim` workload, each podq configuration a simulated
//! workqueue. The definition's item work is the simulated items' CPU time.

use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::ProgressBar;
use podq_sim::{
    auto::AutoSpec, simulate, CompletionSpec, QueueSpec, RemoteFree, RunSpec, Workload,
};
use podq_topology::{Scope, Topology};

use super::{ns, output, Done, Setup};
use crate::bench::alloc_model::RemoteRule;
use crate::bench::define::Backend;
use crate::bench::report::RunResult;
use crate::bench::system::QueueConfig;
use crate::bench::usage;
use crate::bench::workloads::throughput::Mode;
use crate::bench::workloads::{Case, RunLength, Test};

/// The simulator's workload for `test` on `topology`; `None` for `throughput`'s
/// `spawn` mode, which has no simulated counterpart (the simulator queues items, it
/// does not allocate closures). `throughput`'s `work` mode keeps at most `works` items
/// pending per producer and blocks when all are, where the threaded producers coalesce
/// the call and carry on.
/// `cq_high_priority`: the CQ producers preempt the workers on their CPUs (the
/// kernel's `WQ_HIGHPRI` completion handlers).
pub fn workload(test: &Test, topology: &Topology, cq_high_priority: bool) -> Option<Workload> {
    let usable: Vec<usize> = topology.usable().iter().collect();
    let producers = |n: Option<usize>| -> Vec<usize> {
        let n = n.unwrap_or(usable.len());
        usable.iter().copied().cycle().take(n).collect()
    };
    Some(match test {
        Test::Queue(q) => Workload::Queue {
            producer_cpus: producers(q.producers),
            item_ns: ns(q.work),
        },
        Test::Latency(l) => Workload::Latency {
            cpu: l.cpu.unwrap_or(usable[0]),
            think_ns: ns(l.think),
            item_ns: ns(l.work),
        },
        Test::Throughput(t) if matches!(t.mode, Mode::Spawn | Mode::Execute) => return None,
        // The process's own memory and threads, and one topology per pod count: no
        // simulated counterpart.
        Test::Scale(_) | Test::Memory(_) | Test::Idle(..) => return None,
        Test::Throughput(t) => Workload::Throughput {
            producer_cpus: producers(t.producers),
            depth: t.works,
            item_ns: ns(t.work),
        },
        Test::Completion(c) => Workload::Completion(CompletionSpec {
            producer_cpus: c.producer_cpus.clone(),
            depth: c.depth,
            io_bytes: podq_sim::DEFAULT_IO_BYTES,
            object_size: c.alloc.object_size,
            alloc_cache: c.alloc.cache_size,
            remote_free: match c.alloc.remote {
                RemoteRule::Cpu => RemoteFree::Cpu,
                RemoteRule::Node => RemoteFree::Node,
            },
            producer_ns: ns(c.work.cq),
            high_priority: cq_high_priority,
            rpciod_ns: ns(c.work.rpciod),
            nfsiod_ns: ns(c.work.nfsiod),
            toggle: c.toggle.clone(),
            moves: c.moves.iter().map(|(_, cpus)| cpus.clone()).collect(),
        }),
    })
}

/// One simulated run of `workload` on a queue at `scope`/`strict`.
pub fn run_spec(
    workload: Workload,
    scope: Scope,
    strict: bool,
    auto: &AutoSpec,
    length: podq_sim::RunLength,
    warmup: Duration,
    seed: u64,
) -> RunSpec {
    let name = if matches!(workload, Workload::Completion(_)) {
        "rpciod"
    } else {
        "queue"
    };
    RunSpec {
        workload,
        queue: QueueSpec {
            auto: auto.clone(),
            ..QueueSpec::new(name, scope, strict)
        },
        length,
        warmup: ns(warmup),
        seed,
    }
}

/// The simulator behind [`Backend`]: podq's cases on a machine profile's costs, on
/// the setup's topology; other systems' cases have no simulated counterpart and are
/// left out.
pub struct Simulated<'a> {
    /// Machine, topology and parameters.
    pub setup: &'a Setup,
    /// The CQ producers preempt the workers on their CPUs.
    pub cq_high_priority: bool,
    /// The `auto` controller's settings.
    pub auto: AutoSpec,
    /// Virtual time before measuring.
    pub warmup: Duration,
    /// The seed.
    pub seed: u64,
}

impl Simulated<'_> {
    /// The simulated runs of `cases`, in order.
    pub fn specs(&self, cases: &[Case], length: RunLength) -> Result<Vec<RunSpec>> {
        let length = match length {
            RunLength::Duration(d) => podq_sim::RunLength::Duration(ns(d)),
            RunLength::Items(n) => podq_sim::RunLength::Items(n),
        };
        let mut specs = Vec::new();
        for case in cases.iter().filter(|c| c.system.name() == "podq") {
            let Some(workload) = workload(&case.test, &self.setup.topology, self.cq_high_priority)
            else {
                continue;
            };
            let (scope, strict) = podq_config(&case.config)?;
            let mut spec = run_spec(
                workload,
                scope,
                strict,
                &self.auto,
                length,
                self.warmup,
                self.seed,
            );
            // The real runs beside it use the runtime's worklist.
            spec.queue.worklist = podq_sim::Worklist::Ring;
            specs.push(spec);
        }
        Ok(specs)
    }
}

fn podq_config(config: &QueueConfig) -> Result<(Scope, bool)> {
    match config.scope {
        Some(scope) => Ok((scope, config.strict.unwrap_or(false))),
        None => Err(usage("a podq configuration without a scope")),
    }
}

/// Runs every simulated case, one after the other.
pub fn run_all(setup: &Setup, specs: Vec<RunSpec>, progress: &ProgressBar) -> Result<Vec<Done>> {
    let mut done = Vec::new();
    for spec in specs {
        progress.set_message(format!("{} {}", spec.workload.name(), spec.queue.scope));
        let started = Instant::now();
        let output =
            simulate(&setup.topology, &setup.params, &spec).map_err(|e| usage(e.to_string()))?;
        done.push(Done {
            spec,
            output,
            wall_seconds: started.elapsed().as_secs_f64(),
        });
        progress.inc(1);
    }
    Ok(done)
}

impl Backend for Simulated<'_> {
    fn run(
        &self,
        cases: &[Case],
        length: RunLength,
        progress: &ProgressBar,
    ) -> Result<Vec<RunResult>> {
        let done = run_all(self.setup, self.specs(cases, length)?, progress)?;
        Ok(done
            .iter()
            .flat_map(|d| {
                d.output
                    .segments
                    .iter()
                    .enumerate()
                    .map(move |(i, seg)| output::run_result(d, i, seg))
            })
            .collect())
    }
}
