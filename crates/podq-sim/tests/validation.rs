//! The qualitative results of the NFS experiments (the project's `nfs-experiments.md`),
//! predicted from the cost model alone: no parameter was set from these results.
//!
//! Each run is 10 ms of virtual time after a 5 ms warm-up; `PODQ_SIM_VALIDATION_MS`
//! lengthens them. The README's "podq sim" section lists the results the model does
//! not reproduce.
//!
//! The completion producers (CQs) run at the kernel's priority (`high_priority`: the
//! CQ handlers are `WQ_HIGHPRI` kworkers and preempt rpciod's workers) unless a test
//! says `normal`: ordinary threads, as in `podq bench completion`. The two models
//! reproduce different results; the README says which and why.

use podq_sim::{
    cost, simulate, CompletionSpec, QueueSpec, RemoteFree, RunLength, RunSpec, SegmentOutput,
    Workload,
};
use podq_topology::{Scope, Topology};

fn virtual_ns() -> u64 {
    let ms: u64 = std::env::var("PODQ_SIM_VALIDATION_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    ms * 1_000_000
}

fn machine(name: &str) -> (Topology, podq_sim::CostParams) {
    let m = cost::machine(name).unwrap();
    (Topology::synthetic(m.shape).unwrap(), m.params)
}

/// `podq sim completion`'s defaults: 16 I/Os in flight per CQ, 256-byte objects,
/// high-priority CQs.
fn completion(cpus: Vec<usize>, toggle: Vec<Scope>) -> Workload {
    with_priority(cpus, toggle, true)
}

/// As [`completion`], with CQs as ordinary threads (`--cq-priority normal`).
fn normal(cpus: Vec<usize>, toggle: Vec<Scope>) -> Workload {
    with_priority(cpus, toggle, false)
}

fn with_priority(cpus: Vec<usize>, toggle: Vec<Scope>, high_priority: bool) -> Workload {
    with_io(cpus, toggle, high_priority, podq_sim::DEFAULT_IO_BYTES)
}

fn with_io(cpus: Vec<usize>, toggle: Vec<Scope>, high_priority: bool, io_bytes: u64) -> Workload {
    Workload::Completion(CompletionSpec {
        producer_cpus: cpus,
        depth: 16,
        io_bytes,
        object_size: 256,
        alloc_cache: 16,
        remote_free: RemoteFree::Cpu,
        producer_ns: 2_000,
        high_priority,
        rpciod_ns: 16_000,
        nfsiod_ns: 4_000,
        toggle,
        moves: Vec::new(),
    })
}

fn run(name: &str, workload: Workload, scope: Scope, strict: bool) -> Vec<SegmentOutput> {
    let (topo, params) = machine(name);
    let segments = match &workload {
        Workload::Completion(c) => c.toggle.len().max(1) as u64,
        _ => 1,
    };
    let spec = RunSpec {
        workload,
        queue: QueueSpec::new("rpciod", scope, strict),
        length: RunLength::Duration(virtual_ns() * segments),
        warmup: 5_000_000,
        seed: 1,
    };
    simulate(&topo, &params, &spec).unwrap().segments
}

/// 32 CQs on node 0 of the 2 x 24c x SMT2 machine, as `--cq-placement node0`: CPUs
/// 0-23 and 48-55.
fn node0() -> Vec<usize> {
    (0..24).chain(48..56).collect()
}

fn rate(s: &SegmentOutput) -> f64 {
    s.items as f64 / s.seconds
}

fn node0_rate(scope: Scope, strict: bool) -> f64 {
    rate(&run("xeon-2s24c", completion(node0(), vec![]), scope, strict)[0])
}

/// E1e and E1d from one ladder of runs (all CQs on node 0). E1d: strict pods keep
/// rpciod's smt workers on the CQs' own cores, where the CQ handlers preempt them;
/// non-strict ones leave for idle CPUs.
#[test]
fn e1e_cpu_below_smt_cache_shard_and_numa_within_a_few_percent_e1d_strict_smt_worse() {
    let cpu = node0_rate(Scope::Cpu, false);
    let smt = node0_rate(Scope::Smt, false);
    assert!(cpu * 1.2 < smt, "cpu {cpu:.0} smt {smt:.0}");
    let cache = node0_rate(Scope::Cache, false);
    let shard = node0_rate(Scope::CacheShard, false);
    assert!(
        (shard / cache - 1.0).abs() < 0.06,
        "cache_shard {shard:.0} cache {cache:.0}"
    );
    // One LLC per node: numa's pods are cache's, so its pools and its run are too
    // (the README's table shows the identical figures).
    let (topo, _) = machine("xeon-2s24c");
    assert_eq!(
        topo.pods(Scope::Numa).unwrap().as_lists(),
        topo.pods(Scope::Cache).unwrap().as_lists()
    );
    let strict = node0_rate(Scope::Smt, true);
    assert!(strict * 1.1 < smt, "strict {strict:.0} non-strict {smt:.0}");
}

/// E1's 17/15 split, as `--cq-placement 0-16,24-38`.
fn split() -> Vec<usize> {
    (0..17).chain(24..39).collect()
}

/// E1d's split runs: the strict penalty vanishes once the transport, not the CPUs,
/// sets the pace. With 16 KiB I/Os one 200 Gb/s port carries 1.53 M I/Os/s, less than
/// either split run can handle, and both run at the port's rate; with 4 KiB I/Os (6.1
/// M/s) the runs are CPU-bound and strict smt stays behind.
#[test]
fn e1d_split_cqs_the_strict_penalty_vanishes_when_the_transport_binds() {
    let (_, params) = machine("xeon-2s24c");
    let split_rate = |io_bytes, strict| {
        let workload = with_io(split(), vec![], true, io_bytes);
        rate(&run("xeon-2s24c", workload, Scope::Smt, strict)[0])
    };
    let port = params.nic_rate * 1e9 / 16384.0;
    let (loose, strict) = (split_rate(16384, false), split_rate(16384, true));
    assert!(loose > 0.97 * port, "non-strict {loose:.0}, port {port:.0}");
    assert!(
        strict > 0.98 * loose,
        "strict {strict:.0} non-strict {loose:.0}"
    );
    let (loose, strict) = (split_rate(4096, false), split_rate(4096, true));
    assert!(
        strict * 1.1 < loose,
        "4 KiB: strict {strict:.0} non-strict {loose:.0}"
    );
}

/// With CQs as ordinary threads, node 1 idles far more than node 0. (With
/// high-priority CQs it is the other way round: README, "What it predicts".)
#[test]
fn e1b_normal_priority_cqs_all_on_node0_node1_idles_far_more() {
    let s = &run(
        "xeon-2s24c",
        normal(node0(), vec![]),
        Scope::CacheShard,
        false,
    )[0];
    let (n0, n1) = (s.idle_per_node[0].1, s.idle_per_node[1].1);
    // The references' node 0 is nearly saturated; the model's keeps 10-20% idle once
    // past its first milliseconds (README, "What it predicts"), so only the gap between
    // the nodes is checked here.
    assert!(n0 < 0.25, "node 0 idle {n0:.2}");
    assert!(
        n1 > 0.5 && n1 > n0 + 0.35,
        "node 1 idle {n1:.2}, node 0 {n0:.2}"
    );
}

/// Each segment lasts the validation length. With ordinary CQs, cache_shard's rate
/// depends on the seed (the README's "bimodal" case): the toggle moves throughput and
/// node 0's idle share together reliably only once a segment is long enough for the
/// old pwqs to drain and the balancer to settle, so those are checked from 45 ms (what
/// `.ci/run` uses; at 45 ms seeds 1-6 all show the throughput move).
///
/// With CQs as ordinary threads (bench's miniature), and E1e's rise continuing to
/// `cache`: the toggle's first segment is the smt run, measured over the same length
/// after the same warm-up.
#[test]
fn e1c_e1e_normal_priority_cqs_toggle_moves_throughput_and_node0_idle_smt_below_cache() {
    let toggle = vec![Scope::Smt, Scope::CacheShard, Scope::Smt];
    let segs = run("xeon-2s24c", normal(node0(), toggle), Scope::Smt, false);
    let r: Vec<f64> = segs.iter().map(rate).collect();
    let cache = rate(&run("xeon-2s24c", normal(node0(), vec![]), Scope::Cache, false)[0]);
    assert!(r[0] * 1.1 < cache, "smt {:.0} cache {cache:.0}", r[0]);
    if virtual_ns() >= 45_000_000 {
        assert!(r[1] > r[0] * 1.05 && r[1] > r[2] * 1.05, "{r:?}");
        let idle0: Vec<f64> = segs.iter().map(|s| s.idle_per_node[0].1).collect();
        assert!(idle0[1] > idle0[0] && idle0[1] > idle0[2], "{idle0:?}");
    }
}

/// E1e's whole ladder with CQs as ordinary threads: `cpu` below `smt` below `cache`,
/// and `cache`, `cache_shard` and `numa` together, once the port sets the pace for the
/// wider scopes. With 18 KiB I/Os one 200 Gb/s port carries 1.36 M I/Os/s: more than
/// `smt` handles with every CQ on node 0 (about 1.2 M, CPU-bound as at 4 KiB), less
/// than `cache` and `cache_shard` do (1.5-2.0 M at 4 KiB, where `cache_shard` lags
/// `cache` by about a fifth). E1's I/O size is not in the mails; the README says for
/// which sizes this holds.
#[test]
fn e1e_normal_priority_cqs_the_whole_ladder_once_the_port_sets_the_pace() {
    const IO: u64 = 18 * 1024;
    let (_, params) = machine("xeon-2s24c");
    let port = params.nic_rate * 1e9 / IO as f64;
    let ladder_rate = |scope| {
        let workload = with_io(node0(), vec![], false, IO);
        rate(&run("xeon-2s24c", workload, scope, false)[0])
    };
    let (cpu, smt) = (ladder_rate(Scope::Cpu), ladder_rate(Scope::Smt));
    let (cache, shard) = (ladder_rate(Scope::Cache), ladder_rate(Scope::CacheShard));
    assert!(cpu * 1.2 < smt, "cpu {cpu:.0} smt {smt:.0}");
    assert!(smt * 1.05 < cache, "smt {smt:.0} cache {cache:.0}");
    assert!(cache > 0.97 * port, "cache {cache:.0}, port {port:.0}");
    assert!(
        (shard / cache - 1.0).abs() < 0.05,
        "cache_shard {shard:.0} cache {cache:.0}"
    );
}

#[test]
fn e2_smt_removes_most_pool_lock_contention_on_a_12_core_single_l3_box() {
    // nconnect=3: three producers.
    let contended = |scope| {
        let s = &run("xeon-12c", completion(vec![0, 1, 2], vec![]), scope, false)[0];
        let l = s.pool_locks;
        (l.enqueue.contended + l.dequeue.contended) as f64
            / (l.enqueue.acquisitions + l.dequeue.acquisitions) as f64
    };
    let (cache, smt) = (contended(Scope::Cache), contended(Scope::Smt));
    assert!(cache > 0.05, "cache {cache:.3}");
    assert!(smt < cache / 5.0, "smt {smt:.3} cache {cache:.3}");
}

#[test]
fn test_workqueue_on_a_72_core_single_llc_cache_shard_beats_cache_widely() {
    let queue = Workload::Queue {
        producer_cpus: (0..72).collect(),
        item_ns: 100,
    };
    let cache = &run("grace-72c", queue.clone(), Scope::Cache, false)[0];
    let shard = &run("grace-72c", queue, Scope::CacheShard, false)[0];
    assert!(
        rate(shard) > 3.0 * rate(cache),
        "{} {}",
        rate(shard),
        rate(cache)
    );
    let p50 = |s: &SegmentOutput| s.hists.queue.value_at_quantile(0.5);
    assert!(p50(shard) * 3 < p50(cache), "{} {}", p50(shard), p50(cache));
}
