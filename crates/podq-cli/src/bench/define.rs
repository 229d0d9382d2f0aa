//! The workloads as data, written once for both backends: which producers run on
//! which CPUs, think time, items in flight, and for `completion` the rpciod -> nfsiod
//! chain with its allocator. `podq bench` runs these definitions ([`Test`]) on threads
//! ([`Threaded`]); `podq sim` and `podq bench --sim` run the same definitions on the
//! simulator (`crate::sim::backend`). Options become definitions here and nowhere else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use podq_topology::{CpuSet, Scope, Topology};

use super::alloc_model::AllocConfig;
use super::report::RunResult;
use super::system::placement::CpuMap;
use super::workloads::completion::CompletionParams;
use super::workloads::latency::LatencyParams;
use super::workloads::memory;
use super::workloads::queue::QueueParams;
use super::workloads::throughput::{self, ThroughputParams};
use super::workloads::{self, Case, RunLength, Test};
use super::{usage, Workload};

/// CPU time each item spends besides what the workload does for real: on threads a
/// busy loop ([`spin`]), in the simulator CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItemWork {
    /// An item of `queue`, `latency` and `throughput`'s `work` mode (`spawn` mode's
    /// one-shot closures are the systems' own and stay tiny).
    pub item: Duration,
    /// A `completion` producer per I/O.
    pub cq: Duration,
    /// An rpciod item.
    pub rpciod: Duration,
    /// An nfsiod item.
    pub nfsiod: Duration,
}

/// Spends `d` on this CPU: the work an item stands for. Zero costs nothing.
pub fn spin(d: Duration) {
    if d.is_zero() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The workload options `podq bench` and `podq sim` share.
pub struct Options<'a> {
    /// `queue`, `throughput`: producers (`None`: one per usable CPU).
    pub producers: Option<usize>,
    /// `latency`: the submitter's CPU (`None`: the first usable one).
    pub cpu: Option<usize>,
    /// `latency`: think time between items.
    pub think: Duration,
    /// Items per producer (`throughput`: spawns, or runs in the `work` mode; bench's
    /// default otherwise).
    pub items: Option<u64>,
    /// `throughput`'s `work` mode: prepared items per producer, the most it has pending.
    pub works: usize,
    /// `throughput`: end each run with the system's flush (podq's `Workqueue::flush`).
    pub flush: bool,
    /// `completion`: producers (CQs), `None`: one per usable CPU.
    pub cq: Option<usize>,
    /// `completion`: `nodeN`, `split` or a cpulist.
    pub cq_placement: &'a str,
    /// `completion`: I/Os in flight per producer.
    pub depth: usize,
    /// `completion`: rpciod's scope in equal time segments.
    pub toggle: &'a [Scope],
    /// `completion`: the producers' placement in equal time segments.
    pub cq_move: &'a [String],
    /// `completion`: the allocator model.
    pub alloc: AllocConfig,
    /// What each item costs beyond its real work.
    pub work: ItemWork,
}

/// The definitions `workload` stands for on `topology`.
pub fn tests(workload: Workload, o: &Options, topology: &Topology) -> Result<Vec<Test>> {
    if let Some(cpu) = o.cpu {
        if !topology.usable().contains(cpu) {
            return Err(usage(format!(
                "--cpu {cpu} is not a usable CPU of the topology ({})",
                topology.usable()
            )));
        }
    }
    let queue = Test::Queue(QueueParams {
        producers: o.producers,
        work: o.work.item,
    });
    let latency = Test::Latency(LatencyParams {
        cpu: o.cpu,
        think: o.think,
        work: o.work.item,
    });
    let throughput = |mode| {
        Test::Throughput(ThroughputParams {
            producers: o.producers,
            items: o.items.unwrap_or(throughput::DEFAULT_ITEMS),
            mode,
            works: o.works,
            work: o.work.item,
            spread_real: false,
            flush: o.flush,
        })
    };
    Ok(match workload {
        Workload::Ladder => vec![queue, latency],
        Workload::Peers => vec![
            queue,
            latency,
            throughput(throughput::Mode::Spawn),
            throughput(throughput::Mode::Execute),
            throughput(throughput::Mode::Work),
        ],
        Workload::Throughput => vec![
            throughput(throughput::Mode::Spawn),
            throughput(throughput::Mode::Execute),
            throughput(throughput::Mode::Work),
        ],
        Workload::Queue => vec![queue],
        Workload::Latency => vec![latency],
        Workload::Completion => vec![Test::Completion(Arc::new(completion(o, topology)?))],
        Workload::Memory => [throughput::Mode::Spawn, throughput::Mode::Work]
            .into_iter()
            .map(|mode| {
                Test::Memory(memory::MemoryParams {
                    items: o.items.unwrap_or(memory::DEFAULT_ITEMS),
                    mode,
                })
            })
            .collect(),
        // One fake topology per pod count: built by `bench::scale_cases`.
        Workload::Scale | Workload::Idle => {
            bail!("{workload:?} builds its own topologies (bench::scale_cases)")
        }
        Workload::Compare => bail!("compare reads results; it runs no workload"),
    })
}

fn completion(o: &Options, topology: &Topology) -> Result<CompletionParams> {
    let count = o.cq.unwrap_or(topology.usable().len());
    let producer_cpus =
        place_producers(topology, o.cq_placement, count).map_err(|e| usage(format!("{e:#}")))?;
    let mut moves = Vec::new();
    for spec in o.cq_move {
        if spec != "split" && !spec.starts_with("node") {
            return Err(usage(format!(
                "--cq-move `{spec}`: expected nodeN or split (a cpulist would be cut at its commas)"
            )));
        }
        let cpus = place_producers(topology, spec, count).map_err(|e| usage(format!("{e:#}")))?;
        moves.push((spec.clone(), cpus));
    }
    if !o.toggle.is_empty() && !moves.is_empty() && o.toggle.len() != moves.len() {
        return Err(usage(format!(
            "--toggle has {} segments and --cq-move {}: give both the same number",
            o.toggle.len(),
            moves.len()
        )));
    }
    // With --cq-move the first segment's placement is the first one named.
    let producer_cpus = moves
        .first()
        .map_or(producer_cpus, |(_, cpus)| cpus.clone());
    Ok(CompletionParams {
        producer_cpus,
        depth: o.depth,
        alloc: o.alloc,
        toggle: o.toggle.to_vec(),
        moves,
        work: o.work,
    })
}

/// Resolves `--cq-placement` for `count` producers: `node0` (every CQ on the first
/// node; `nodeN` on the N-th), `split` (alternating nodes) or a cpulist of the
/// topology's CPUs, used round-robin.
pub fn place_producers(topology: &Topology, spec: &str, count: usize) -> Result<Vec<usize>> {
    if count == 0 {
        bail!("--cq must be at least 1");
    }
    let nodes: Vec<Vec<usize>> = topology
        .nodes()
        .into_iter()
        .map(|n| topology.node_cpus(n).iter().collect())
        .collect();
    let nth_node = spec
        .strip_prefix("node")
        .and_then(|n| n.parse::<usize>().ok());
    if let Some(n) = nth_node {
        let Some(cpus) = nodes.get(n) else {
            bail!(
                "--cq-placement `{spec}`: the topology has {} node(s)",
                nodes.len()
            );
        };
        return Ok(cpus.iter().copied().cycle().take(count).collect());
    }
    Ok(match spec {
        "split" => (0..count)
            .map(|i| {
                let node = &nodes[i % nodes.len()];
                node[(i / nodes.len()) % node.len()]
            })
            .collect(),
        list => {
            let cpus = CpuSet::parse_list(list).with_context(|| {
                format!("--cq-placement `{list}` is neither node0, split nor a cpulist")
            })?;
            if cpus.is_empty() {
                bail!("--cq-placement `{list}` names no CPU");
            }
            if let Some(bad) = cpus.iter().find(|&c| !topology.usable().contains(c)) {
                bail!("--cq-placement: CPU {bad} is not a usable CPU of the topology");
            }
            let cpus: Vec<usize> = cpus.iter().collect();
            cpus.iter().copied().cycle().take(count).collect()
        }
    })
}

/// What runs the definitions: real threads or the simulator.
pub trait Backend {
    /// Runs every case for `length`; one result per case (and per toggle segment).
    fn run(
        &self,
        cases: &[Case],
        length: RunLength,
        progress: &ProgressBar,
    ) -> Result<Vec<RunResult>>;
}

/// The threaded runner: each case's system on real threads, `rounds` times, the
/// order rotating each round.
pub struct Threaded<'a> {
    /// The topology and its real CPUs.
    pub map: &'a CpuMap,
    /// Rounds per case.
    pub rounds: usize,
}

impl Backend for Threaded<'_> {
    fn run(
        &self,
        cases: &[Case],
        length: RunLength,
        progress: &ProgressBar,
    ) -> Result<Vec<RunResult>> {
        workloads::run_cases(cases, self.map, length, self.rounds, progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::alloc_model::RemoteRule;

    fn options() -> Options<'static> {
        Options {
            producers: None,
            cpu: None,
            think: Duration::from_millis(1),
            items: None,
            works: 64,
            flush: false,
            cq: Some(4),
            cq_placement: "split",
            depth: 16,
            toggle: &[],
            cq_move: &[],
            alloc: AllocConfig {
                object_size: 256,
                cache_size: 16,
                remote: RemoteRule::Cpu,
            },
            work: ItemWork::default(),
        }
    }

    #[test]
    fn spin_spends_at_least_its_time() {
        let start = Instant::now();
        spin(Duration::from_millis(2));
        assert!(start.elapsed() >= Duration::from_millis(2));
    }

    #[test]
    fn placements_on_two_nodes() {
        // 2 nodes x 2 cores x SMT2, x86 numbering: node 0 is CPUs 0, 1, 4, 5.
        let topo = Topology::synthetic("2s2c2t").unwrap();
        assert_eq!(place_producers(&topo, "node0", 5).unwrap(), [0, 1, 4, 5, 0]);
        assert_eq!(place_producers(&topo, "node1", 2).unwrap(), [2, 3]);
        assert_eq!(place_producers(&topo, "split", 4).unwrap(), [0, 2, 1, 3]);
        assert_eq!(place_producers(&topo, "7,3", 3).unwrap(), [3, 7, 3]);
        for (spec, expect) in [
            ("node2", "has 2 node(s)"),
            ("0-3,99", "CPU 99"),
            ("x", "neither node0, split nor a cpulist"),
            ("", "names no CPU"),
        ] {
            let e = format!("{:#}", place_producers(&topo, spec, 2).unwrap_err());
            assert!(e.contains(expect), "{spec}: {e}");
        }
        assert!(place_producers(&topo, "node0", 0).is_err());
    }

    #[test]
    fn one_definition_per_test_of_a_workload() {
        let topo = Topology::synthetic("2s2c2t").unwrap();
        let o = options();
        let names = |w| -> Vec<&'static str> {
            tests(w, &o, &topo)
                .unwrap()
                .iter()
                .map(Test::name)
                .collect()
        };
        assert_eq!(names(Workload::Ladder), ["queue", "latency"]);
        assert_eq!(
            names(Workload::Throughput),
            ["throughput_spawn", "throughput_execute", "throughput_work"]
        );
        let Test::Completion(c) = &tests(Workload::Completion, &o, &topo).unwrap()[0] else {
            panic!("not a completion definition");
        };
        assert_eq!(c.producer_cpus, [0, 2, 1, 3]);
        let bad = Options {
            cpu: Some(9),
            ..options()
        };
        let e = tests(Workload::Latency, &bad, &topo).unwrap_err();
        assert!(e.to_string().contains("--cpu 9 is not a usable CPU"), "{e}");
        let moves = ["split".to_owned(), "0-3".to_owned()];
        let bad = Options {
            cq_move: &moves,
            ..options()
        };
        let e = tests(Workload::Completion, &bad, &topo).unwrap_err();
        assert!(e.to_string().contains("expected nodeN or split"), "{e}");
    }
}
