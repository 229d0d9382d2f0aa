use podq_sim::*;
use podq_topology::{Scope, Topology};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let m = cost::machine(&args[1]).unwrap();
    let topo = Topology::synthetic(m.shape).unwrap();
    let wl = &args[2];
    let ms: u64 = args[3].parse().unwrap();
    for scope in [Scope::Cpu, Scope::Smt, Scope::Cache, Scope::CacheShard, Scope::Numa] {
        for strict in [false, true] {
            let workload = match wl.as_str() {
                "queue" => Workload::Queue { producer_cpus: topo.usable().iter().collect(), item_ns: 100 },
                "latency" => Workload::Latency { cpu: 0, think_ns: 1_000_000, item_ns: 100 },
                "node0" | "split" => {
                    let n0: Vec<usize> = topo.node_cpus(0).iter().collect();
                    let n1: Vec<usize> = topo.node_cpus(1).iter().collect();
                    let cpus = if wl == "node0" { n0.iter().copied().cycle().take(32).collect() } else { (0..32).map(|i| if i % 2 == 0 { n0[i/2] } else { n1[i/2] }).collect() };
                    Workload::Completion(CompletionSpec { producer_cpus: cpus, depth: 16, object_size: 256, alloc_cache: 16, remote_free: RemoteFree::Cpu, producer_ns: 2000, rpciod_ns: 16000, nfsiod_ns: 4000, toggle: vec![] })
                }
                _ => panic!(),
            };
            let spec = RunSpec { workload, queue: QueueSpec::new("q", scope, strict), length: RunLength::Duration(ms * 1_000_000), seed: 1 };
            let t = std::time::Instant::now();
            let out = simulate(&topo, &m.params, &spec).unwrap();
            let s = &out.segments[0];
            let h = if !s.hists.queue.is_empty() { &s.hists.queue } else { &s.hists.latency };
            println!("{:?} strict={} items/s={:.0} p50={} p99={} enq={}/{} deq={}/{} alloc={}/{} ctx={} migr={} idle={:?} loc={:?} ev={} wall={:.2}",
                scope, strict, s.items as f64 / s.seconds, h.value_at_quantile(0.5), h.value_at_quantile(0.99),
                s.pool_locks.enqueue.contended, s.pool_locks.enqueue.acquisitions, s.pool_locks.dequeue.contended, s.pool_locks.dequeue.acquisitions,
                s.alloc.node_lock.contended, s.alloc.node_lock.acquisitions, s.counters.context_switches, s.counters.migrations,
                s.idle_per_node.iter().map(|x| (x.1*100.0).round()).collect::<Vec<_>>(), s.counters.locality, out.events, t.elapsed().as_secs_f64());
        }
    }
}
