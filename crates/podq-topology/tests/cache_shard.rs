//! The `cache_shard` table from the kernel (reference §2.3), on synthetic LLCs of 8, 11,
//! 12, 19, 36, 72 and 100 cores, with and without SMT, in both sibling numberings.
//!
//! The expected pods are built here from the published table (shard sizes in cores,
//! larger shards first, cores taken in CPU-id order, siblings with their core), not
//! from the library's own `shard_sizes`.

use podq_topology::{CpuSet, Scope, Topology};

/// Cores per LLC → shard sizes in cores with the default size 8 (kernel table).
fn table() -> Vec<(usize, Vec<usize>)> {
    let mut hundred = vec![8; 9];
    hundred.extend([7; 4]);
    vec![
        (8, vec![8]),
        (11, vec![11]),
        (12, vec![6, 6]),
        (19, vec![10, 9]),
        (36, vec![8, 7, 7, 7, 7]),
        (72, vec![8; 9]),
        (100, hundred),
    ]
}

/// Expected pods for `sockets` LLCs of `cores` cores with `threads` threads each.
fn expected(
    sockets: usize,
    cores: usize,
    threads: usize,
    linear: bool,
    sizes: &[usize],
) -> Vec<Vec<usize>> {
    let total_cores = sockets * cores;
    let cpu = |core: usize, thread: usize| {
        if linear {
            core * threads + thread
        } else {
            thread * total_cores + core
        }
    };
    let mut pods = Vec::new();
    for socket in 0..sockets {
        let mut first = socket * cores;
        for &size in sizes {
            let pod: CpuSet = (first..first + size)
                .flat_map(|core| (0..threads).map(move |t| (core, t)))
                .map(|(core, t)| cpu(core, t))
                .collect();
            pods.push(pod.iter().collect::<Vec<_>>());
            first += size;
        }
    }
    pods.sort();
    pods
}

#[test]
fn shard_table_on_synthetic_llcs() {
    for (cores, sizes) in table() {
        for threads in [1, 2, 4] {
            for linear in [false, true] {
                for sockets in [1, 2] {
                    let shape = format!(
                        "{sockets}s{cores}c{threads}t:{}",
                        if linear { "linear" } else { "x86" }
                    );
                    let topo = Topology::synthetic(&shape).unwrap();
                    let got = topo.pods(Scope::CacheShard).unwrap().as_lists();
                    let want = expected(sockets, cores, threads, linear, &sizes);
                    assert_eq!(got, want, "{shape}");
                }
            }
        }
    }
}

#[test]
fn x86_shard_zero_of_36_cores_is_cpus_0_to_7_and_36_to_43() {
    let topo = Topology::synthetic("1s36c2t").unwrap();
    let pods = topo.pods(Scope::CacheShard).unwrap();
    assert_eq!(pods.pod_cpus[0].to_list(), "0-7,36-43");
    assert_eq!(pods.len(), 5);
}

#[test]
fn eight_or_fewer_cores_per_llc_makes_cache_shard_equal_cache() {
    let topo = Topology::synthetic("2s2l8c2t").unwrap();
    assert_eq!(
        topo.pods(Scope::CacheShard).unwrap().pod_cpus,
        topo.pods(Scope::Cache).unwrap().pod_cpus
    );
}

#[test]
fn shard_size_is_configurable_and_zero_is_refused() {
    let topo = Topology::synthetic("1s12c2t")
        .unwrap()
        .with_shard_size(4)
        .unwrap();
    assert_eq!(topo.shard_size(), 4);
    let pods = topo.pods(Scope::CacheShard).unwrap();
    assert_eq!(
        pods.as_lists(),
        vec![
            vec![0, 1, 2, 3, 12, 13, 14, 15],
            vec![4, 5, 6, 7, 16, 17, 18, 19],
            vec![8, 9, 10, 11, 20, 21, 22, 23]
        ]
    );
    let one = Topology::synthetic("1s3c2t:linear")
        .unwrap()
        .with_shard_size(1)
        .unwrap();
    assert_eq!(
        one.pods(Scope::CacheShard).unwrap().as_lists(),
        vec![vec![0, 1], vec![2, 3], vec![4, 5]]
    );
    let err = Topology::synthetic("1s4c")
        .unwrap()
        .with_shard_size(0)
        .unwrap_err();
    assert!(err.to_string().contains("shard size"), "{err}");
}
