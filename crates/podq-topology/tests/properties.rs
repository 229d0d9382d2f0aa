//! Properties over random synthetic machines (and random usable subsets of them):
//! every scope's pods partition the usable CPUs, and `cpu` refines `smt` refines
//! `cache_shard` refines `cache` refines `numa` refines `system`.

use podq_topology::{CpuSet, PodLayout, Scope, Topology};
use proptest::prelude::*;

fn shape() -> impl Strategy<Value = String> {
    (
        1..=3usize,
        1..=2usize,
        1..=3usize,
        1..=20usize,
        1..=4usize,
        any::<bool>(),
    )
        .prop_map(|(s, n, l, c, t, linear)| {
            format!(
                "{s}s{n}n{l}l{c}c{t}t:{}",
                if linear { "linear" } else { "x86" }
            )
        })
}

fn check_partition(topo: &Topology, layout: &PodLayout) -> Result<(), TestCaseError> {
    let mut seen = CpuSet::new();
    for (i, pod) in layout.pod_cpus.iter().enumerate() {
        prop_assert!(!pod.is_empty(), "{:?} pod {i} is empty", layout.scope);
        prop_assert!(!pod.intersects(&seen), "{:?} pods overlap", layout.scope);
        seen = seen.union(pod);
        for cpu in pod {
            prop_assert_eq!(layout.pod_of(cpu), Some(i));
        }
        let node = if layout.scope == Scope::System {
            None
        } else {
            topo.node_of(pod.last().unwrap())
        };
        prop_assert_eq!(layout.pod_node[i], node, "pod node is its highest CPU's");
    }
    prop_assert_eq!(&seen, topo.usable());
    let firsts: Vec<usize> = layout.pod_cpus.iter().map(|p| p.first().unwrap()).collect();
    prop_assert!(
        firsts.windows(2).all(|w| w[0] < w[1]),
        "pods ordered by first CPU"
    );
    Ok(())
}

fn check_refines(fine: &PodLayout, coarse: &PodLayout) -> Result<(), TestCaseError> {
    for pod in &fine.pod_cpus {
        let outer = coarse.pod_of(pod.first().unwrap()).unwrap();
        prop_assert!(
            pod.is_subset(&coarse.pod_cpus[outer]),
            "{:?} pod {} is not inside one {:?} pod",
            fine.scope,
            pod,
            coarse.scope
        );
    }
    Ok(())
}

fn check_all(topo: &Topology) -> Result<(), TestCaseError> {
    // Finest to coarsest. Synthetic LLCs sit inside one node, so `cache` refines
    // `numa` here (on real machines an LLC may span nodes, e.g. Intel SNC).
    let chain = [
        Scope::Cpu,
        Scope::Smt,
        Scope::CacheShard,
        Scope::Cache,
        Scope::Numa,
        Scope::System,
    ];
    let layouts: Vec<PodLayout> = chain.iter().map(|&s| topo.pods(s).unwrap()).collect();
    for layout in &layouts {
        check_partition(topo, layout)?;
    }
    for pair in layouts.windows(2) {
        check_refines(&pair[0], &pair[1])?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn pods_partition_and_refine(shape in shape(), shard in 1..=10usize) {
        let topo = Topology::synthetic(&shape).unwrap().with_shard_size(shard).unwrap();
        check_all(&topo)?;
        // Siblings are never split and no shard is bigger than the rounding allows.
        let smt = topo.pods(Scope::Smt).unwrap();
        let shards = topo.pods(Scope::CacheShard).unwrap();
        check_refines(&smt, &shards)?;
        for pod in &shards.pod_cpus {
            let cores = pod.iter().filter(|&c| topo.facts(c).smt.first() == Some(c)).count();
            prop_assert!(cores <= shard + shard / 2 + 1, "{} cores in a shard of target {}", cores, shard);
        }
    }

    #[test]
    fn pods_partition_and_refine_on_a_subset(
        shape in shape(),
        mask in proptest::collection::vec(any::<bool>(), 1..=480),
    ) {
        let topo = Topology::synthetic(&shape).unwrap();
        let keep: CpuSet = mask.iter().enumerate().filter(|(_, &k)| k).map(|(i, _)| i).collect();
        prop_assume!(keep.intersects(topo.usable()));
        let sub = topo.restrict(&keep).unwrap();
        prop_assert!(sub.usable().is_subset(&keep));
        check_all(&sub)?;
    }

    #[test]
    fn cpusets_round_trip(cpus in proptest::collection::btree_set(0..5000usize, 0..200)) {
        let set: CpuSet = cpus.iter().copied().collect();
        prop_assert_eq!(CpuSet::parse_list(&set.to_list()).unwrap(), set.clone());
        prop_assert_eq!(CpuSet::parse_mask(&set.to_mask()).unwrap(), set.clone());
        prop_assert_eq!(set.iter().collect::<Vec<_>>(), cpus.into_iter().collect::<Vec<_>>());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Garbage never panics the parsers: it parses, or the error quotes the text
    /// (control characters escaped).
    #[test]
    fn parsers_never_panic(text in "[0-9a-fx,\\-: \\n\\x00]{0,40}") {
        let quoted = format!("`{}`", text.escape_default());
        match CpuSet::parse_list(&text) {
            Ok(set) => prop_assert_eq!(CpuSet::parse_list(&set.to_list()).unwrap(), set),
            Err(e) => prop_assert!(e.to_string().contains(&quoted)),
        }
        match CpuSet::parse_mask(&text) {
            Ok(set) => prop_assert_eq!(CpuSet::parse_mask(&set.to_mask()).unwrap(), set),
            Err(e) => prop_assert!(e.to_string().contains(&quoted)),
        }
    }

    /// However long the rejected text, an error quotes only its first 64 characters.
    #[test]
    fn errors_quote_a_short_prefix(text in "[0-9,\\-x]{65,3000}") {
        for err in [CpuSet::parse_list(&text).err(), CpuSet::parse_mask(&text).err()]
            .into_iter()
            .flatten()
        {
            let msg = err.to_string();
            prop_assert!(msg.contains(&format!("`{}…` ({} bytes)", &text[..64], text.len())), "{}", msg);
            prop_assert!(msg.len() < 300, "{}", msg);
        }
    }

    /// Any shape string gives a topology or an error naming the shape, never a panic.
    #[test]
    fn shapes_never_panic(text in "[0-9snlctx:a-z]{0,12}") {
        let quoted = format!("`{}`", text);
        if let Err(e) = Topology::synthetic(&text) {
            prop_assert!(e.to_string().contains(&quoted));
        }
    }
}
