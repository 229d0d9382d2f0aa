//! Replays the checked-in fuzz corpora (`fuzz/corpus/<target>/`) through the same
//! checks the fuzz targets run, so every input the fuzzer kept is re-checked in CI.

mod fuzz_checks;

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {} is missing: {e}", dir.display()));
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = entries
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    assert!(!inputs.is_empty(), "fuzz corpus {} is empty", dir.display());
    inputs.sort();
    inputs
}

fn replay(target: &str, check: fn(&[u8])) {
    for (path, bytes) in corpus(target) {
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(outcome.is_ok(), "{target}: input {} fails", path.display());
    }
}

#[test]
fn cpulist_corpus() {
    replay("cpulist", fuzz_checks::cpulist);
}

#[test]
fn sysfs_tree_corpus() {
    replay("sysfs_tree", fuzz_checks::sysfs_tree);
}

#[test]
fn sysfs_archive_corpus() {
    replay("sysfs_archive", fuzz_checks::sysfs_archive);
}

/// The seeds are real machines, so the fuzzer starts from inputs that pass the reader
/// and the pod checks run on them (not only the error paths).
#[test]
fn seeds_read_as_machines() {
    let tree = corpus("sysfs_tree")
        .into_iter()
        .find(|(p, _)| p.ends_with("seed-4cpu"))
        .expect("seed-4cpu in the sysfs_tree corpus");
    let topo = podq_topology::Topology::from_sysfs_files(fuzz_checks::files_of(
        &fuzz_checks::decode_tree(&tree.1),
    ))
    .expect("seed-4cpu reads");
    assert_eq!(topo.usable().to_list(), "0-3");
    let smt = topo.pods(podq_topology::Scope::Smt).unwrap();
    assert_eq!(smt.as_lists(), vec![vec![0, 2], vec![1, 3]]);

    let archive = corpus("sysfs_archive")
        .into_iter()
        .find(|(p, _)| p.ends_with("seed-2cpu.tar.gz"))
        .expect("seed-2cpu.tar.gz in the sysfs_archive corpus");
    let topo = podq_topology::Topology::from_sysfs_archive(&archive.0, &archive.1)
        .expect("seed-2cpu.tar.gz reads");
    assert!(!topo.usable().is_empty());
}
