//! Crafted sysfs trees and archives: huge CPU numbers, links to devices, FIFOs, huge
//! files and names, megabyte cpulists, tens of thousands of CPUs. Each must end at once
//! with an error naming the file (quoting at most a short prefix of it), or read, in
//! bounded memory.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use podq_topology::{CpuSet, Scope, Topology, MAX_CPUS};

const CPU: &str = "sys/devices/system/cpu";

/// A valid two-CPU machine on disk, for one file to be made hostile.
fn machine() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for cpu in 0..2 {
        let topo = dir.path().join(format!("{CPU}/cpu{cpu}/topology"));
        fs::create_dir_all(&topo).unwrap();
        fs::write(topo.join("thread_siblings_list"), format!("{cpu}\n")).unwrap();
    }
    assert!(Topology::from_sysfs(dir.path()).is_ok());
    dir
}

/// The error's message with its causes, as the command line prints it.
fn error_of(result: Result<Topology, podq_topology::Error>) -> String {
    let err = result.expect_err("should be refused");
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text += &format!(": {s}");
        source = s.source();
    }
    text
}

/// A `.tar.gz` in memory of `entries` (name, type, content) under top folder `t`;
/// links point at `/dev/zero`.
fn archive(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, kind, content) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        if kind.is_symlink() {
            tar.append_link(&mut h, format!("t/{name}"), "/dev/zero")
                .unwrap();
        } else {
            tar.append_data(&mut h, format!("t/{name}"), *content)
                .unwrap();
        }
    }
    tar.into_inner().unwrap().finish().unwrap()
}

fn from_archive(
    entries: &[(&str, tar::EntryType, &[u8])],
) -> Result<Topology, podq_topology::Error> {
    Topology::from_sysfs_archive(Path::new("crafted.tar.gz"), &archive(entries))
}

const FILE: tar::EntryType = tar::EntryType::Regular;

#[test]
fn cpu_folders_beyond_the_cpu_limit_are_refused_naming_them() {
    for n in [
        "18446744073709551615",
        "4000000000",
        "100000000000",
        "65536",
    ] {
        let dir = machine();
        fs::create_dir(dir.path().join(format!("{CPU}/cpu{n}"))).unwrap();
        let err = error_of(Topology::from_sysfs(dir.path()));
        assert!(err.contains(&format!("{CPU}/cpu{n}")), "{err}");
        assert!(err.contains("65536-CPU limit"), "{err}");
    }
    // The largest allowed number reads.
    let dir = machine();
    fs::create_dir(dir.path().join(format!("{CPU}/cpu{}", MAX_CPUS - 1))).unwrap();
    let topo = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(topo.usable().to_list(), "0-1,65535");

    // The same in a 5 KB archive, and for node and cache-index numbers.
    for name in [
        "sys/devices/system/cpu/cpu18446744073709551615/online",
        "sys/devices/system/node/node4000000000/cpulist",
        "sys/devices/system/cpu/cpu0/cache/index99999999999999999999999/level",
    ] {
        let err = error_of(from_archive(&[
            ("sys/devices/system/cpu/cpu0/online", FILE, b"1"),
            (name, FILE, b"1"),
        ]));
        let entry = name.rsplit_once('/').unwrap().0;
        assert!(err.contains(&format!("crafted.tar.gz:t/{entry}:")), "{err}");
    }
}

#[test]
fn links_fifos_devices_and_folders_are_not_read_as_files() {
    let online = format!("{CPU}/online");
    type Make = fn(&Path);
    let cases: [(&str, Make); 5] = [
        ("a symbolic link", |p| symlink("/dev/zero", p).unwrap()),
        ("a symbolic link", |p| symlink("/dev/urandom", p).unwrap()),
        ("a symbolic link", |p| {
            symlink("/proc/self/environ", p).unwrap()
        }),
        ("a FIFO", |p| {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        }),
        ("a directory", |p| fs::create_dir(p).unwrap()),
    ];
    for (what, make) in cases {
        let dir = machine();
        make(&dir.path().join(&online));
        let err = error_of(Topology::from_sysfs(dir.path()));
        assert!(err.contains(&online) && err.contains(what), "{err}");
        // Nothing of what the link points at is shown.
        assert!(!err.contains("PATH="), "{err}");
    }
    // An archive's links and FIFOs are refused the same way.
    for (kind, what) in [
        (tar::EntryType::Symlink, "a symbolic link"),
        (tar::EntryType::Fifo, "a special file"),
    ] {
        let err = error_of(from_archive(&[
            ("sys/devices/system/cpu/cpu0/online", FILE, b"1"),
            ("sys/devices/system/cpu/online", kind, b""),
        ]));
        assert!(
            err.contains("t/sys/devices/system/cpu/online") && err.contains(what),
            "{err}"
        );
    }
}

#[test]
fn a_file_over_the_size_limit_is_refused_naming_it() {
    let dir = machine();
    let online = dir.path().join(format!("{CPU}/online"));
    // A 1 GiB sparse file: refused after reading at most the limit.
    fs::File::create(&online).unwrap().set_len(1 << 30).unwrap();
    let err = error_of(Topology::from_sysfs(dir.path()));
    assert!(err.contains(&format!("{CPU}/online")), "{err}");
    assert!(
        err.contains("1073741824 bytes, over the 256 KiB limit"),
        "{err}"
    );

    let big = vec![b'0'; 300 << 10];
    let err = error_of(from_archive(&[
        ("sys/devices/system/cpu/cpu0/online", FILE, b"1"),
        ("sys/devices/system/cpu/online", FILE, &big),
    ]));
    assert!(
        err.contains("t/sys/devices/system/cpu/online: 307200 bytes, over"),
        "{err}"
    );
}

#[test]
fn an_archive_entry_with_a_huge_name_is_refused_with_a_short_message() {
    let long = format!("sys/{}", "a/".repeat(60_000));
    let err = error_of(from_archive(&[
        ("sys/devices/system/cpu/cpu0/online", FILE, b"1"),
        (&long, FILE, b"x"),
    ]));
    assert!(err.contains("over the 4096-byte limit"), "{err}");
    assert!(err.contains("(120006 bytes)"), "{err}");
    assert!(err.len() < 300, "{} bytes", err.len());
}

#[test]
fn a_megabyte_cpulist_is_refused_with_a_short_message() {
    let dir = machine();
    let list = vec!["0-65535"; 1 << 17].join(",");
    fs::write(dir.path().join(format!("{CPU}/online")), &list).unwrap();
    let err = error_of(Topology::from_sysfs(dir.path()));
    assert!(err.contains(&format!("{CPU}/online")), "{err}");
    assert!(err.contains("over the 256 KiB limit"), "{err}");
    assert!(err.len() < 300, "{} bytes", err.len());

    // Garbage under the limit is quoted by its first 64 characters and its length.
    let garbage = format!("{}x", "0-1,".repeat(25_000));
    fs::write(dir.path().join(format!("{CPU}/online")), &garbage).unwrap();
    let err = error_of(Topology::from_sysfs(dir.path()));
    assert!(
        err.contains(&format!("`{}…` (100001 bytes)", &garbage[..64])),
        "{err}"
    );
    assert!(err.len() < 300, "{} bytes", err.len());
}

#[test]
fn a_cpulist_at_the_length_limit_parses_to_its_cpus() {
    // 32 767 whole-range repeats: each range is filled a word at a time.
    let list = vec!["0-65535"; 32_767].join(",");
    assert!(list.len() <= podq_topology::MAX_TEXT_BYTES);
    assert_eq!(
        CpuSet::parse_list(&list).unwrap(),
        CpuSet::first_n(MAX_CPUS)
    );
    for (text, members) in [
        ("63-64", vec![63, 64]),
        ("0-63", (0..64).collect()),
        ("64-127,5", [5].into_iter().chain(64..128).collect()),
        ("60-130", (60..131).collect::<Vec<_>>()),
    ] {
        let set = CpuSet::parse_list(text).unwrap();
        assert_eq!(set.iter().collect::<Vec<_>>(), members, "{text}");
    }
}

/// 20 000 CPUs over two nodes, with `per_cpu` files for each; no cache information.
fn many_cpus(per_cpu: impl Fn(usize) -> Vec<(String, String)>) -> Topology {
    let n = std::env::var("N").map_or(20_000, |v| v.parse().unwrap());
    let mut files = vec![
        (format!("{CPU}/online"), format!("0-{}", n - 1)),
        (
            "sys/devices/system/node/node0/cpulist".to_owned(),
            format!("0-{}", n / 2 - 1),
        ),
        (
            "sys/devices/system/node/node1/cpulist".to_owned(),
            format!("{}-{}", n / 2, n - 1),
        ),
    ];
    for cpu in 0..n {
        for (name, content) in per_cpu(cpu) {
            files.push((format!("{CPU}/cpu{cpu}/{name}"), content));
        }
    }
    let topo =
        Topology::from_sysfs_files(files.into_iter().map(|(p, c)| (p, c.into_bytes()))).unwrap();
    assert_eq!(topo.usable().len(), n);
    topo
}

#[test]
fn twenty_thousand_cpus_without_cache_information_read() {
    // The LLC falls back to package ∩ node: one LLC per node.
    let topo = many_cpus(|_| vec![("online".to_owned(), "1".to_owned())]);
    let cache = topo.pods(Scope::Cache).unwrap();
    assert_eq!(cache.len(), 2);
    assert_eq!(cache.pod_cpus[1].to_list(), "10000-19999");
    assert_eq!(topo.facts(12_345).llc.len(), 10_000);
}

#[test]
fn twenty_thousand_cpus_each_in_its_own_package_read() {
    let topo = many_cpus(|cpu| vec![("topology/physical_package_id".to_owned(), cpu.to_string())]);
    assert_eq!(topo.pods(Scope::Cache).unwrap().len(), 20_000);
    assert_eq!(topo.facts(19_999).package, 19_999);
}

/// Every CPU lists the whole machine as its siblings and package: one core.
#[test]
fn twenty_thousand_cpus_in_one_core_read() {
    let topo = many_cpus(|_| {
        vec![
            (
                "topology/thread_siblings_list".to_owned(),
                "0-19999".to_owned(),
            ),
            (
                "topology/core_siblings_list".to_owned(),
                "0-19999".to_owned(),
            ),
        ]
    });
    assert_eq!(topo.pods(Scope::Smt).unwrap().len(), 1);
    assert_eq!(topo.pods(Scope::Cache).unwrap().len(), 2);
}
