//! Reading sysfs trees: bad input gives clear errors naming the file (never a panic),
//! odd but legal input reads, a directory reads like its tarball, and a capture of this
//! machine reads back to the same pods.

use std::fs;
use std::path::Path;

use podq_topology::{PodsReport, Scope, Topology};

#[path = "support/fixtures_dir.rs"]
mod fixtures_dir;
use fixtures_dir::fixtures_dir;

const CPU: &str = "sys/devices/system/cpu";

/// Writes `files` (path relative to root, content) under a fresh temporary root.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (rel, content) in files {
        let path = dir.path().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
    dir
}

/// A small valid machine: 4 CPUs, 2 cores of 2 threads, one L2 each, one node.
fn small_machine() -> Vec<(String, String)> {
    let mut files = vec![
        (format!("{CPU}/online"), "0-3\n".to_owned()),
        (format!("{CPU}/possible"), "0-3\n".to_owned()),
        (
            "sys/devices/system/node/node0/cpulist".to_owned(),
            "0-3\n".to_owned(),
        ),
    ];
    for cpu in 0..4 {
        let core = cpu % 2;
        let d = format!("{CPU}/cpu{cpu}");
        files.push((
            format!("{d}/topology/thread_siblings_list"),
            format!("{core},{}\n", core + 2),
        ));
        files.push((
            format!("{d}/topology/core_siblings_list"),
            "0-3\n".to_owned(),
        ));
        files.push((format!("{d}/cache/index0/level"), "1\n".to_owned()));
        files.push((format!("{d}/cache/index0/type"), "Data\n".to_owned()));
        files.push((
            format!("{d}/cache/index0/shared_cpu_list"),
            format!("{core},{}\n", core + 2),
        ));
        files.push((format!("{d}/cache/index1/level"), "2\n".to_owned()));
        files.push((format!("{d}/cache/index1/type"), "Unified\n".to_owned()));
        files.push((
            format!("{d}/cache/index1/shared_cpu_list"),
            "0-3\n".to_owned(),
        ));
    }
    files
}

fn machine_with(replace: &[(&str, Option<&str>)]) -> tempfile::TempDir {
    let mut files = small_machine();
    for (rel, content) in replace {
        files.retain(|(r, _)| r != rel);
        if let Some(c) = content {
            files.push(((*rel).to_owned(), (*c).to_owned()));
        }
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    tree(&refs)
}

fn error_of(root: &Path) -> String {
    let err = Topology::from_sysfs(root).expect_err("should fail");
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text += &format!(": {s}");
        source = s.source();
    }
    text
}

#[test]
fn the_small_machine_reads() {
    let dir = machine_with(&[]);
    let topo = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(
        topo.pods(Scope::Smt).unwrap().as_lists(),
        vec![vec![0, 2], vec![1, 3]]
    );
    assert_eq!(topo.pods(Scope::Cache).unwrap().len(), 1);
    assert!(topo.warnings().is_empty(), "{:?}", topo.warnings());
}

#[test]
fn an_empty_tree_is_an_error_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let err = error_of(dir.path());
    assert!(err.contains("sys/devices/system/cpu"), "{err}");
    assert!(err.contains("not a sysfs root"), "{err}");
}

#[test]
fn a_missing_root_is_an_error_naming_it() {
    let err = error_of(Path::new("/no/such/podq/root"));
    assert!(err.contains("/no/such/podq/root"), "{err}");
}

#[test]
fn malformed_files_are_errors_naming_the_file() {
    let cases: &[(&str, &str)] = &[
        ("sys/devices/system/cpu/online", "0-3,x\n"),
        ("sys/devices/system/cpu/possible", "3-0\n"),
        (
            "sys/devices/system/cpu/cpu1/topology/thread_siblings_list",
            "1,,3\n",
        ),
        (
            "sys/devices/system/cpu/cpu2/cache/index1/shared_cpu_list",
            "zero\n",
        ),
        ("sys/devices/system/cpu/cpu2/cache/index1/level", "two\n"),
        ("sys/devices/system/node/node0/cpulist", "0-3-5\n"),
    ];
    for (rel, bad) in cases {
        let dir = machine_with(&[(rel, Some(bad))]);
        let err = error_of(dir.path());
        assert!(err.contains(rel), "{rel}: {err}");
    }
}

#[test]
fn malformed_masks_are_errors_naming_the_file() {
    let rel = "sys/devices/system/cpu/cpu0/topology/thread_siblings";
    let dir = machine_with(&[
        (
            "sys/devices/system/cpu/cpu0/topology/thread_siblings_list",
            None,
        ),
        (rel, Some("0000,00g5\n")),
    ]);
    let err = error_of(dir.path());
    assert!(err.contains(rel) && err.contains("00g5"), "{err}");
}

#[test]
fn a_bad_per_cpu_online_flag_is_an_error() {
    let rel = "sys/devices/system/cpu/cpu3/online";
    let dir = machine_with(&[
        ("sys/devices/system/cpu/online", None),
        (rel, Some("yes\n")),
    ]);
    let err = error_of(dir.path());
    assert!(err.contains(rel) && err.contains("yes"), "{err}");
}

#[test]
fn no_online_cpu_is_an_error() {
    let dir = machine_with(&[("sys/devices/system/cpu/online", Some("\n"))]);
    let err = error_of(dir.path());
    assert!(err.contains("no online CPU"), "{err}");
}

#[test]
fn missing_files_fall_back_and_warn() {
    // No cache, no node folder, no package files: one node, LLC = package ∩ node.
    let mut files = vec![(format!("{CPU}/online"), "0-1".to_owned())];
    for cpu in 0..2 {
        files.push((
            format!("{CPU}/cpu{cpu}/topology/thread_siblings_list"),
            format!("{cpu}"),
        ));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let dir = tree(&refs);
    let topo = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(
        topo.pods(Scope::Cache).unwrap().as_lists(),
        vec![vec![0, 1]]
    );
    assert_eq!(topo.nodes(), vec![0]);
    assert!(
        topo.warnings()
            .iter()
            .any(|w| w.contains("no cache information")),
        "{:?}",
        topo.warnings()
    );
}

#[test]
fn stale_online_list_drops_cpus_without_folders() {
    let dir = machine_with(&[(&format!("{CPU}/online"), Some("0-5\n"))]);
    let topo = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.usable().to_list(), "0-3");
    assert!(
        topo.warnings().iter().any(|w| w.contains("4-5")),
        "{:?}",
        topo.warnings()
    );
}

#[test]
fn offline_cpus_and_hex_only_files_read() {
    let mut files = vec![];
    for cpu in 0..4 {
        let d = format!("{CPU}/cpu{cpu}");
        files.push((
            format!("{d}/online"),
            if cpu == 1 { "0\n" } else { "1\n" }.to_owned(),
        ));
        if cpu != 1 {
            files.push((
                format!("{d}/topology/thread_siblings"),
                "0000000f\n".to_owned(),
            ));
            files.push((format!("{d}/cache/index0/level"), "3".to_owned()));
            files.push((format!("{d}/cache/index0/type"), "Unified\0".to_owned()));
            files.push((
                format!("{d}/cache/index0/shared_cpu_map"),
                "00000000,0000000f\n\0".to_owned(),
            ));
        }
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let dir = tree(&refs);
    let topo = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.usable().to_list(), "0,2-3");
    assert_eq!(
        topo.pods(Scope::Smt).unwrap().as_lists(),
        vec![vec![0, 2, 3]]
    );
}

#[test]
fn bad_archives_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let not_gz = dir.path().join("junk.tar.gz");
    fs::write(&not_gz, "this is not gzip").unwrap();
    let err = error_of(&not_gz);
    assert!(err.contains("junk.tar.gz"), "{err}");

    // Two top folders.
    let two = dir.path().join("two.tar.gz");
    write_tar(
        &two,
        &[("a/sys/devices/system/cpu/online", "0"), ("b/x", "1")],
    );
    let err = error_of(&two);
    assert!(
        err.contains("two.tar.gz") && err.contains("one top folder"),
        "{err}"
    );

    // One top folder but no sysfs inside.
    let empty = dir.path().join("empty.tar.gz");
    write_tar(&empty, &[("top/readme", "hello")]);
    let err = error_of(&empty);
    assert!(
        err.contains("empty.tar.gz") && err.contains("not a sysfs root"),
        "{err}"
    );
}

fn write_tar(path: &Path, files: &[(&str, &str)]) {
    let gz = flate2::write::GzEncoder::new(fs::File::create(path).unwrap(), Default::default());
    let mut tar = tar::Builder::new(gz);
    for (name, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, name, content.as_bytes()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
}

fn report(topo: &Topology) -> PodsReport {
    PodsReport::new(topo, Scope::CacheShard).unwrap()
}

#[test]
fn an_unpacked_directory_reads_like_its_tarball() {
    for name in ["offline-cpu0-node0", "16em64t-4s2c2t", "nvidiagpunumanodes"] {
        let tarball = fixtures_dir().join(format!("{name}.tar.gz"));
        let dir = tempfile::tempdir().unwrap();
        let gz = flate2::read::GzDecoder::new(fs::File::open(&tarball).unwrap());
        tar::Archive::new(gz).unpack(dir.path()).unwrap();
        let from_dir = Topology::from_sysfs(&dir.path().join(name)).unwrap();
        let from_tar = Topology::from_sysfs(&tarball).unwrap();
        assert_eq!(report(&from_dir), report(&from_tar), "{name}");
    }
}

#[test]
fn a_capture_of_this_machine_reads_back_to_the_same_pods() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("me.tar.gz");
    let (captured, files) = Topology::capture(Path::new("/"), &out, "me").unwrap();
    assert!(files > 0);
    let back = Topology::from_sysfs(&out).unwrap();
    let direct = Topology::from_sysfs(Path::new("/")).unwrap();
    assert_eq!(report(&back), report(&direct));
    assert_eq!(report(&back), report(&captured));
    // The live view is the capture narrowed to what this process may use.
    let live = Topology::live().unwrap();
    let narrowed = back.restrict(live.usable()).unwrap();
    assert_eq!(report(&narrowed), report(&live));
}

#[test]
fn a_capture_of_a_fixture_round_trips() {
    let tarball = fixtures_dir().join("offline-cpu0-node0.tar.gz");
    let dir = tempfile::tempdir().unwrap();
    let gz = flate2::read::GzDecoder::new(fs::File::open(&tarball).unwrap());
    tar::Archive::new(gz).unpack(dir.path()).unwrap();
    let root = dir.path().join("offline-cpu0-node0");
    let out = dir.path().join("again.tar.gz");
    Topology::capture(&root, &out, "again").unwrap();
    let back = Topology::from_sysfs(&out).unwrap();
    assert_eq!(
        report(&back),
        report(&Topology::from_sysfs(&tarball).unwrap())
    );
}

#[test]
fn capture_refuses_a_bad_folder_name() {
    let dir = tempfile::tempdir().unwrap();
    let err = Topology::capture(Path::new("/"), &dir.path().join("x.tar.gz"), "a/b").unwrap_err();
    assert!(err.to_string().contains("a/b"), "{err}");
}
