//! Invariants checked on arbitrary input, shared by the fuzz targets in `fuzz/` and by
//! the corpus replay test, so CI replays exactly what the fuzzer checked.
//!
//! Each check panics only when podq-topology misbehaves: a parser panicking, a parse
//! that does not round-trip, or an accepted tree whose pods do not partition its CPUs.

#![allow(dead_code)] // each user calls a subset

use std::path::Path;

use podq_topology::{CpuSet, Scope, Topology};

/// Cpulist, hex mask and scope parsing: never panic; what parses round-trips.
pub fn cpulist(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = [CpuSet::parse_list(text), CpuSet::parse_mask(text)];
    for set in parsed.into_iter().flatten() {
        assert_eq!(CpuSet::parse_list(&set.to_list()).unwrap(), set);
        assert_eq!(CpuSet::parse_mask(&set.to_mask()).unwrap(), set);
    }
    if let Ok(scope) = text.parse::<Scope>() {
        assert_eq!(scope.name(), text.strip_suffix('\n').unwrap_or(text));
    }
}

/// Path templates the tree decoder picks from: `{c}` is a CPU, `{i}` a cache index,
/// `{n}` a node. Drawing from the files the reader looks at lets the fuzzer reach deep
/// reading paths instead of guessing file names.
const TEMPLATES: &[&str] = &[
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/possible",
    "sys/devices/system/cpu/cpu{c}/online",
    "sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list",
    "sys/devices/system/cpu/cpu{c}/topology/thread_siblings",
    "sys/devices/system/cpu/cpu{c}/topology/core_cpus_list",
    "sys/devices/system/cpu/cpu{c}/topology/core_cpus",
    "sys/devices/system/cpu/cpu{c}/topology/core_siblings_list",
    "sys/devices/system/cpu/cpu{c}/topology/package_cpus_list",
    "sys/devices/system/cpu/cpu{c}/topology/physical_package_id",
    "sys/devices/system/cpu/cpu{c}/cache/index{i}/level",
    "sys/devices/system/cpu/cpu{c}/cache/index{i}/type",
    "sys/devices/system/cpu/cpu{c}/cache/index{i}/shared_cpu_list",
    "sys/devices/system/cpu/cpu{c}/cache/index{i}/shared_cpu_map",
    "sys/devices/system/node/node{n}/cpulist",
    "sys/devices/system/node/node{n}/cpumap",
];

/// Decodes records `[template, cpu, index, len, bytes...]` into a file tree.
pub fn decode_tree(mut data: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    while let [t, c, i, len, rest @ ..] = data {
        let len = usize::from(*len % 32).min(rest.len());
        let path = TEMPLATES[usize::from(*t) % TEMPLATES.len()]
            .replace("{c}", &(c % 16).to_string())
            .replace("{i}", &(i % 4).to_string())
            .replace("{n}", &(c % 4).to_string());
        files.push((path, rest[..len].to_vec()));
        data = &rest[len..];
    }
    files
}

/// A sysfs tree of arbitrary files: reading never panics; an accepted tree gives pods
/// that partition its usable CPUs in every scope.
pub fn sysfs_tree(data: &[u8]) {
    if let Ok(topology) = Topology::from_sysfs_files(decode_tree(data)) {
        check_pods(&topology);
    }
}

/// Arbitrary bytes as a `.tar.gz` capture: same guarantees as [`sysfs_tree`].
pub fn sysfs_archive(data: &[u8]) {
    if let Ok(topology) = Topology::from_sysfs_archive(Path::new("fuzz.tar.gz"), data) {
        check_pods(&topology);
    }
}

fn check_pods(topology: &Topology) {
    for scope in Scope::CONCRETE {
        let pods = topology.pods(scope).unwrap();
        let mut seen = CpuSet::new();
        for pod in &pods.pod_cpus {
            assert!(!pod.is_empty(), "{scope}: empty pod");
            assert!(!pod.intersects(&seen), "{scope}: pods overlap");
            seen = seen.union(pod);
        }
        assert_eq!(&seen, topology.usable(), "{scope}: pods miss CPUs");
    }
}
