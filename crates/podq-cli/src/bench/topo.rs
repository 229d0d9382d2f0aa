//! The topology a benchmark runs on: the live machine, a sysfs snapshot, or a fake
//! shape whose CPUs are mapped onto the real ones.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use podq_topology::{CpuFacts, CpuSet, Topology};

/// Parses `--topology`: `live`, `fake:SHAPE` (e.g. `fake:2s4c2t`) or `sysfs:DIR`.
pub fn load(spec: &str) -> Result<Topology> {
    if spec == "live" {
        return read_sysfs(Path::new("/")).context("reading the live topology from /sys");
    }
    if let Some(shape) = spec.strip_prefix("fake:") {
        return synthetic(shape);
    }
    if let Some(dir) = spec.strip_prefix("sysfs:") {
        return read_sysfs(Path::new(dir))
            .with_context(|| format!("reading the topology under `{dir}`"));
    }
    bail!("unknown topology `{spec}`: expected `live`, `fake:SHAPE` (like fake:2s4c2t) or `sysfs:DIR`")
}

/// A synthetic machine `<S>s<C>c<T>t`: S packages, each one NUMA node with one LLC,
/// C cores per package, T threads per core, numbered x86-style (all first threads,
/// then all second threads).
pub fn synthetic(shape: &str) -> Result<Topology> {
    let bad =
        |why: &str| anyhow::anyhow!("bad topology shape `{shape}`: {why} (expected like 2s4c2t)");
    let mut nums = [0usize; 3];
    let mut rest = shape;
    for (slot, unit) in nums.iter_mut().zip(['s', 'c', 't']) {
        let end = rest
            .find(unit)
            .ok_or_else(|| bad(&format!("missing `{unit}`")))?;
        *slot = rest[..end]
            .parse()
            .map_err(|_| bad(&format!("`{}` is not a count", &rest[..end])))?;
        if *slot == 0 {
            return Err(bad("counts must be at least 1"));
        }
        rest = &rest[end + 1..];
    }
    if !rest.is_empty() {
        return Err(bad(&format!("trailing `{rest}`")));
    }
    let [sockets, cores, threads] = nums;
    let per_thread = sockets * cores;
    let total = per_thread * threads;
    if total > 4096 {
        return Err(bad("more than 4096 CPUs"));
    }
    let cpu = |t: usize, s: usize, c: usize| t * per_thread + s * cores + c;
    let mut facts = Vec::with_capacity(total);
    for s in 0..sockets {
        let llc: CpuSet = (0..threads)
            .flat_map(|t| (0..cores).map(move |c| cpu(t, s, c)))
            .collect();
        for c in 0..cores {
            let smt: CpuSet = (0..threads).map(|t| cpu(t, s, c)).collect();
            for t in 0..threads {
                facts.push((
                    cpu(t, s, c),
                    CpuFacts {
                        smt: smt.clone(),
                        llc: llc.clone(),
                        node: s,
                        package: s,
                    },
                ));
            }
        }
    }
    let all = CpuSet::first_n(total);
    Ok(Topology::from_parts(all.clone(), all, facts)?)
}

/// Reads the usable CPUs and their SMT, LLC, node and package from a sysfs root, then
/// keeps only the CPUs this process may run on (when the root is `/`).
fn read_sysfs(root: &Path) -> Result<Topology> {
    let cpu_dir = root.join("sys/devices/system/cpu");
    let read_list = |path: &Path| -> Result<CpuSet> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        CpuSet::parse_list(text.trim_end_matches(['\n', '\0']))
            .with_context(|| format!("parsing {}", path.display()))
    };
    let possible = read_list(&cpu_dir.join("possible"))?;
    let online = read_list(&cpu_dir.join("online"))?;
    let nodes = node_table(root, &read_list)?;
    let mut facts = Vec::new();
    for cpu in &online {
        let topo_dir = cpu_dir.join(format!("cpu{cpu}/topology"));
        let smt = read_list(&topo_dir.join("thread_siblings_list"))
            .unwrap_or_else(|_| CpuSet::single(cpu));
        let package = fs::read_to_string(topo_dir.join("physical_package_id"))
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .map_or(0, |p| usize::try_from(p).unwrap_or(0));
        let llc = highest_cache(&cpu_dir.join(format!("cpu{cpu}/cache")), &read_list)
            .unwrap_or_else(|| online.clone());
        let node = nodes
            .iter()
            .find(|(_, set)| set.contains(cpu))
            .map_or(0, |(n, _)| *n);
        facts.push((
            cpu,
            CpuFacts {
                smt,
                llc,
                node,
                package,
            },
        ));
    }
    let topology = Topology::from_parts(possible, online, facts)?;
    if root == Path::new("/") {
        let allowed: CpuSet = super::system::placement::allowed_cpus()?.into();
        return Ok(topology.restrict(&allowed)?);
    }
    Ok(topology)
}

fn node_table(
    root: &Path,
    read_list: &dyn Fn(&Path) -> Result<CpuSet>,
) -> Result<Vec<(usize, CpuSet)>> {
    let node_dir = root.join("sys/devices/system/node");
    let Ok(entries) = fs::read_dir(&node_dir) else {
        return Ok(Vec::new());
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", node_dir.display()))?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        nodes.push((id, read_list(&entry.path().join("cpulist"))?));
    }
    nodes.sort_by_key(|(id, _)| *id);
    Ok(nodes)
}

/// The `shared_cpu_list` of the highest-level cache of one CPU.
fn highest_cache(dir: &Path, read_list: &dyn Fn(&Path) -> Result<CpuSet>) -> Option<CpuSet> {
    let mut best: Option<(u32, CpuSet)> = None;
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let level = fs::read_to_string(entry.path().join("level"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        let shared = read_list(&entry.path().join("shared_cpu_list")).ok();
        if let (Some(level), Some(shared)) = (level, shared) {
            if best.as_ref().map_or(true, |(l, _)| level > *l) {
                best = Some((level, shared));
            }
        }
    }
    best.map(|(_, set)| set)
}

/// One line describing a topology: CPUs, nodes, LLCs, SMT width.
pub fn describe(topology: &Topology) -> String {
    let usable = topology.usable();
    let mut llcs: Vec<usize> = usable
        .iter()
        .filter_map(|c| topology.facts(c).llc.first())
        .collect();
    llcs.sort_unstable();
    llcs.dedup();
    let smt = usable
        .iter()
        .map(|c| topology.facts(c).smt.len())
        .max()
        .unwrap_or(1);
    format!(
        "{} CPUs, {} node(s), {} LLC(s), SMT{}",
        usable.len(),
        topology.nodes().len(),
        llcs.len(),
        smt
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use podq_topology::Scope;

    #[test]
    fn synthetic_shape_has_the_kernel_pods() {
        let t = synthetic("2s4c2t").unwrap();
        assert_eq!(t.usable().len(), 16);
        assert_eq!(t.nodes(), vec![0, 1]);
        let smt = t.pods(Scope::Smt).unwrap();
        assert_eq!(smt.len(), 8);
        assert_eq!(smt.as_lists()[0], vec![0, 8]);
        assert_eq!(
            t.pods(Scope::Numa).unwrap().as_lists()[1],
            vec![4, 5, 6, 7, 12, 13, 14, 15]
        );
        assert_eq!(t.pods(Scope::Cpu).unwrap().len(), 16);
        assert_eq!(t.pods(Scope::System).unwrap().len(), 1);
    }

    #[test]
    fn bad_shapes_are_named() {
        for bad in ["", "2s", "2s4c", "0s1c1t", "2s4c2tx", "as4c2t", "2x4c2t"] {
            let err = synthetic(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
        }
        let err = load("nonsense").unwrap_err().to_string();
        assert!(err.contains("nonsense"), "{err}");
    }

    #[test]
    fn fake_topology_maps_round_robin_onto_real_cpus() {
        let map =
            super::super::system::placement::CpuMap::new(synthetic("1s4c1t").unwrap()).unwrap();
        let real = map.real_cpus().to_vec();
        for v in 0..4 {
            assert_eq!(map.real_of(v), real[v % real.len()]);
        }
    }
}
