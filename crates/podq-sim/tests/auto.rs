//! The `auto` scope on the virtual clock: the controller the runtime uses follows a
//! load that moves from spread over both nodes to piled on one, deterministically.

use podq_sim::{
    cost, simulate, CompletionSpec, QueueSpec, RemoteFree, RunLength, RunSpec, Workload,
};
use podq_topology::{Scope, Topology};

fn run(moves: Vec<Vec<usize>>, scope: Scope) -> podq_sim::SimOutput {
    let machine = cost::machine("xeon-2s24c").unwrap();
    // 2 nodes × 4 cores × SMT2, x86 numbering: node 0 is CPUs 0-3 and 8-11.
    let topology = Topology::synthetic("2s4c2t").unwrap();
    let spec = RunSpec {
        workload: Workload::Completion(CompletionSpec {
            producer_cpus: moves[0].clone(),
            depth: 16,
            io_bytes: podq_sim::DEFAULT_IO_BYTES,
            object_size: 256,
            alloc_cache: 16,
            remote_free: RemoteFree::Cpu,
            producer_ns: 2_000,
            // Ordinary producer threads, as bench's: with high-priority ones the
            // preempted non-strict workers leave node 0 by themselves and the load
            // never piles up.
            high_priority: false,
            rpciod_ns: 16_000,
            nfsiod_ns: 4_000,
            toggle: Vec::new(),
            moves,
        }),
        queue: QueueSpec::new("rpciod", scope, false),
        length: RunLength::Duration(120_000_000),
        warmup: 0,
        seed: 7,
    };
    simulate(&topology, &machine.params, &spec).unwrap()
}

#[test]
fn auto_follows_a_load_that_piles_onto_one_node() {
    let spread = vec![0, 4, 1, 5, 2, 6, 3, 7];
    let piled = vec![0, 1, 2, 3, 8, 9, 10, 11, 0, 1];
    let out = run(vec![spread.clone(), piled.clone()], Scope::Auto);
    assert_eq!(out.segments.len(), 2);
    assert!(out.segments.iter().all(|s| s.scope == Scope::Auto));
    // Spread over both nodes at cache_shard (one pod per node here): nothing to fix.
    assert!(out.segments[0].auto_switches.is_empty());
    assert_eq!(out.segments[0].scope_at_end, Scope::CacheShard);
    // Piled on node 0: the next rung joining node 0 with idle node 1 is system.
    let second = &out.segments[1].auto_switches;
    assert!(!second.is_empty(), "no switch after the pile-up");
    let first = &second[0];
    assert_eq!(
        (first.switch.from, first.switch.to),
        (Scope::CacheShard, Scope::System)
    );
    assert!(
        matches!(
            first.switch.reason,
            podq_policy::auto::Reason::Imbalance { .. }
        ),
        "{:?}",
        first.switch.reason
    );
    // Within a few windows of the move at 60 ms (10 ms windows, 3 to confirm).
    assert!(
        first.at > 60_000_000 && first.at <= 100_000_000,
        "{}",
        first.at
    );
    // Deterministic: the same inputs give the same switches.
    let again = run(vec![spread, piled], Scope::Auto);
    assert_eq!(
        again.segments[1].auto_switches,
        out.segments[1].auto_switches
    );
    assert_eq!(again.segments[1].items, out.segments[1].items);
}
