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

/// The corpus entries for the cases of hostile input that once crashed, hung or
/// exhausted memory give their expected outcome, not only no panic.
#[test]
fn hostile_cases_give_their_errors() {
    let tree_cases: &[(&str, Option<&str>)] = &[
        (
            "issue13-1-cpu-u64max",
            Some("cpu18446744073709551615: number"),
        ),
        ("issue13-1-cpu-4000000000", Some("cpu4000000000: number")),
        ("issue13-1-cpu-100000000000", Some("65536-CPU limit")),
        (
            "issue13-1-node-beyond-u64",
            Some("node99999999999999999999: number"),
        ),
        ("issue13-1-long-cpu-name", None),
        (
            "issue13-2-online-devzero",
            Some("cpu/online: a symbolic link"),
        ),
        (
            "issue13-2-online-urandom",
            Some("cpu/online: a symbolic link"),
        ),
        (
            "issue13-2-online-environ",
            Some("cpu/online: a symbolic link"),
        ),
        (
            "issue13-2-cpu-folder-devzero",
            Some("thread_siblings_list: Not a directory"),
        ),
        ("issue13-2-online-fifo", Some("cpu/online: a FIFO")),
        (
            "issue13-2-siblings-fifo",
            Some("thread_siblings_list: a FIFO"),
        ),
        ("issue13-2-online-folder", Some("cpu/online: a directory")),
        (
            "issue13-2-online-too-large",
            Some("281728 bytes, over the 256 KiB limit"),
        ),
        (
            "issue13-4-online-ranges-over-limit",
            Some("over the 256 KiB limit"),
        ),
        ("issue13-4-siblings-ranges-at-limit", None),
        ("issue13-5-4096-cpus-no-cache", None),
        ("issue13-5-4096-cpus-online-files", None),
    ];
    let trees = corpus("sysfs_tree");
    for (name, expected) in tree_cases {
        let (_, data) = trees
            .iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing from the sysfs_tree corpus"));
        let result = fuzz_checks::read_on_disk(data);
        match (expected, result) {
            (Some(want), Err(e)) => {
                let msg = e.to_string()
                    + &std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
                assert!(msg.contains(want) && msg.len() < 400, "{name}: {msg}");
            }
            (None, Ok(topo)) => assert!(!topo.usable().is_empty(), "{name}"),
            (want, got) => panic!("{name}: expected {want:?}, got {got:?}"),
        }
    }
    let archive_cases: &[(&str, &str)] = &[
        (
            "issue13-1-cpu-u64max.tar.gz",
            "cpu18446744073709551615: number",
        ),
        (
            "issue13-2-online-symlink.tar.gz",
            "cpu/online: a symbolic link",
        ),
        ("issue13-2-online-fifo.tar.gz", "cpu/online: a special file"),
        ("issue13-3-120KB-name.tar.gz", "over the 4096-byte limit"),
        (
            "issue13-4-online-4MB-ranges.tar.gz",
            "4194303 bytes, over the 256 KiB limit",
        ),
    ];
    let archives = corpus("sysfs_archive");
    for (name, want) in archive_cases {
        let (path, data) = archives
            .iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing from the sysfs_archive corpus"));
        let msg = podq_topology::Topology::from_sysfs_archive(path, data)
            .expect_err(name)
            .to_string();
        assert!(msg.contains(want) && msg.len() < 400, "{name}: {msg}");
    }
}
