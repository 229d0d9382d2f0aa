//! The topology a benchmark runs on: the live machine, a sysfs snapshot, or a fake
//! shape whose CPUs are mapped onto the real ones.

use std::path::Path;

use anyhow::{Context, Result};
use podq_topology::Topology;

use super::usage;

/// Parses `--topology`: `live`, `fake:SHAPE` (a synthetic machine such as
/// `fake:2s4c2t`, whose CPUs are mapped onto the real ones) or `sysfs:PATH` (a sysfs
/// capture directory or `.tar.gz`). A spec or shape that does not parse is a usage
/// error (exit 2); a capture or machine that cannot be read is a failure (exit 1).
pub fn load(spec: &str) -> Result<Topology> {
    if spec == "live" {
        return Topology::live().context("reading this machine's topology");
    }
    if let Some(shape) = spec.strip_prefix("fake:") {
        return Topology::synthetic(shape)
            .map_err(|e| usage(format!("--topology fake:{shape}: {e}")));
    }
    if let Some(path) = spec.strip_prefix("sysfs:") {
        return Topology::from_sysfs(Path::new(path))
            .with_context(|| format!("reading sysfs capture {path}"));
    }
    Err(usage(format!(
        "unknown topology `{spec}`: expected `live`, `fake:SHAPE` (like fake:2s4c2t) or `sysfs:PATH`"
    )))
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

    #[test]
    fn bad_specs_are_named() {
        for bad in ["fake:", "fake:2x", "nonsense", "sysfs:/nonexistent/capture"] {
            let err = format!("{:#}", load(bad).unwrap_err());
            let named = bad.split_once(':').map_or(bad, |(_, rest)| rest);
            assert!(err.contains(named), "{err}");
        }
    }

    #[test]
    fn fake_topology_maps_round_robin_onto_real_cpus() {
        let map =
            super::super::system::placement::CpuMap::new(load("fake:1s4c1t").unwrap()).unwrap();
        let real = map.real_cpus().to_vec();
        for v in 0..4 {
            assert_eq!(map.real_of(v), real[v % real.len()]);
        }
    }
}
