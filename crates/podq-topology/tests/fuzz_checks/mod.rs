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

/// Path templates of the files the reader looks at: `{c}` is a CPU, `{i}` a cache
/// index, `{n}` a node. Drawing from them lets the fuzzer reach deep reading paths
/// instead of guessing file names. (The order is fixed: corpus entries depend on it.)
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

/// Folders (and links and FIFOs in their place): numbered folders, a long name, and
/// folders where the reader expects a file.
const DIR_TEMPLATES: &[&str] = &[
    "sys/devices/system/cpu/cpu{c}",
    "sys/devices/system/cpu/cpu{c}/cache/index{i}",
    "sys/devices/system/cpu/cpu{c}/cache",
    "sys/devices/system/cpu/cpu{c}/topology",
    "sys/devices/system/node/node{n}",
    "sys/devices/system/cpu/cpu{c}/node{n}",
    "sys/devices/system/cpu/cpu{long}",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list",
    "sys/devices/system/node",
];

/// CPU, node and index numbers drawn by the bytes 0xf8..=0xff: at and beyond the CPU
/// limit, beyond `u64`, with leading zeros, and far apart.
const LARGE_NUMBERS: &[&str] = &[
    "65535",
    "65536",
    "4000000000",
    "100000000000",
    "18446744073709551615",
    "99999999999999999999",
    "0001",
    "19999",
];

/// Where links point: devices that never end, the environment, nothing, a loop.
const LINK_TARGETS: &[&str] = &[
    "/dev/zero",
    "/dev/urandom",
    "/proc/self/environ",
    "/dev/null",
    "/nonexistent/podq",
    ".",
];

/// Most entries a decoded tree has.
pub const MAX_ENTRIES: usize = 4096;

/// One entry of a decoded tree; paths are relative to the root.
#[derive(Clone, Debug)]
pub enum Entry {
    File(String, Vec<u8>),
    Dir(String),
    Link(String, &'static str),
    Fifo(String),
}

fn number(byte: u8, modulo: u8) -> String {
    match byte.checked_sub(0xf8) {
        Some(k) => LARGE_NUMBERS[usize::from(k)].to_owned(),
        None => (byte % modulo).to_string(),
    }
}

fn fill(template: &str, c: u8, i: u8) -> String {
    template
        .replace("{c}", &number(c, 64))
        .replace("{i}", &number(i, 4))
        .replace("{n}", &number(c, 4))
        .replace("{long}", &format!("{}{}", "0".repeat(240), c % 64))
}

/// Decodes records `[op, c, i, len, bytes...]` into a tree. `op / 16 % 8` is the kind:
/// - 0–3: a file `TEMPLATES[op % 16]` of `len % 64` bytes;
/// - 4, 5, 6: a folder, a link to `LINK_TARGETS[len % 6]`, a FIFO, at
///   `DIR_TEMPLATES` then `TEMPLATES` (`op % 16` indexes both lists end to end);
/// - 7 with `i` even: a file `TEMPLATES[op % 16]` of `(i / 2 + 1) * 2201` bytes (to
///   beyond the size limit) repeating its `len % 64` bytes (`0` if none);
/// - 7 with `i` odd: `(c + 1) * 16` CPUs `cpu0..`, as files `online` = `1` for even
///   `op`, else as empty folders.
///
/// `c` picks the CPU (`c % 64`, or from 0xf8 on a large number) and the node (`c % 4`
/// or large), `i` the cache index (`i % 4` or large). A tree stops growing at
/// [`MAX_ENTRIES`], so that one input stays quick to write to disk.
pub fn decode_tree(mut data: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    while let [op, c, i, len_byte, rest @ ..] = data {
        if entries.len() >= MAX_ENTRIES {
            break;
        }
        let (op, c, i, len_byte) = (*op, *c, *i, *len_byte);
        let kind = op / 16 % 8;
        let takes_bytes = kind < 4 || (kind == 7 && i % 2 == 0);
        let len = if takes_bytes {
            usize::from(len_byte % 64).min(rest.len())
        } else {
            0
        };
        let bytes = &rest[..len];
        let any = |k: u8| {
            let k = usize::from(k) % (DIR_TEMPLATES.len() + TEMPLATES.len());
            let template = DIR_TEMPLATES
                .get(k)
                .unwrap_or_else(|| &TEMPLATES[k - DIR_TEMPLATES.len()]);
            fill(template, c, i)
        };
        match kind {
            0..=3 => entries.push(Entry::File(
                fill(TEMPLATES[usize::from(op % 16)], c, i),
                bytes.to_vec(),
            )),
            4 => entries.push(Entry::Dir(any(op % 16))),
            5 => entries.push(Entry::Link(
                any(op % 16),
                LINK_TARGETS[usize::from(len_byte) % LINK_TARGETS.len()],
            )),
            6 => entries.push(Entry::Fifo(any(op % 16))),
            _ if i % 2 == 0 => {
                let size = (usize::from(i / 2) + 1) * 2201;
                let content = if bytes.is_empty() {
                    vec![b'0'; size]
                } else {
                    bytes.iter().copied().cycle().take(size).collect()
                };
                let path = fill(TEMPLATES[usize::from(op % 16)], c, i);
                entries.push(Entry::File(path, content));
            }
            _ => {
                let room = MAX_ENTRIES.saturating_sub(entries.len());
                for cpu in 0..((usize::from(c) + 1) * 16).min(room) {
                    let dir = format!("sys/devices/system/cpu/cpu{cpu}");
                    entries.push(if op % 2 == 0 {
                        Entry::File(format!("{dir}/online"), b"1".to_vec())
                    } else {
                        Entry::Dir(dir)
                    });
                }
            }
        }
        data = &rest[len..];
    }
    entries
}

/// The regular files of a decoded tree (what [`Topology::from_sysfs_files`] takes).
pub fn files_of(entries: &[Entry]) -> Vec<(String, Vec<u8>)> {
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::File(path, bytes) => Some((path.clone(), bytes.clone())),
            _ => None,
        })
        .collect()
}

/// Makes `entries` under `root`, in order; an entry that cannot be made (its name is
/// taken or too long) is left out. Returns the entries made.
fn make_on_disk(root: &Path, entries: &[Entry]) -> Vec<Entry> {
    let mut made = Vec::new();
    for entry in entries {
        let (Entry::File(rel, _) | Entry::Dir(rel) | Entry::Link(rel, _) | Entry::Fifo(rel)) =
            entry;
        let path = root.join(rel);
        let parent_ok = path
            .parent()
            .is_some_and(|p| std::fs::create_dir_all(p).is_ok());
        let ok = parent_ok
            && match entry {
                // Only over nothing or a regular file: writing through a FIFO blocks.
                Entry::File(_, bytes) => {
                    std::fs::symlink_metadata(&path).map_or(true, |m| m.is_file())
                        && std::fs::write(&path, bytes).is_ok()
                }
                Entry::Dir(_) => std::fs::create_dir(&path).is_ok(),
                Entry::Link(_, target) => std::os::unix::fs::symlink(target, &path).is_ok(),
                Entry::Fifo(_) => {
                    use std::os::unix::ffi::OsStrExt;
                    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
                    // SAFETY: `c` is a NUL-terminated path that outlives the call.
                    unsafe { libc::mkfifo(c.as_ptr(), 0o644) == 0 }
                }
            };
        if ok {
            made.push(entry.clone());
        }
    }
    made
}

/// `entries` as a `.tar.gz` with top folder `t`.
fn archive_of(entries: &[Entry]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    let mut tar = tar::Builder::new(gz);
    for entry in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        let result = match entry {
            Entry::File(rel, bytes) => {
                h.set_size(bytes.len() as u64);
                tar.append_data(&mut h, format!("t/{rel}"), bytes.as_slice())
            }
            Entry::Dir(rel) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                tar.append_data(&mut h, format!("t/{rel}/"), std::io::empty())
            }
            Entry::Link(rel, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                tar.append_link(&mut h, format!("t/{rel}"), target)
            }
            Entry::Fifo(rel) => {
                h.set_entry_type(tar::EntryType::Fifo);
                h.set_size(0);
                tar.append_data(&mut h, format!("t/{rel}"), std::io::empty())
            }
        };
        result.unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// A fresh folder for one tree, in memory-backed `/dev/shm` where there is one: a
/// tree of thousands of entries is made and removed for every input.
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Two readings of the same tree agree: both refuse it, or both give the same pods.
fn agree(
    what: &str,
    a: &Result<Topology, podq_topology::Error>,
    b: &Result<Topology, podq_topology::Error>,
) {
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.usable(), b.usable(), "{what}: usable CPUs differ");
            for scope in Scope::CONCRETE {
                assert_eq!(
                    a.pods(scope).unwrap(),
                    b.pods(scope).unwrap(),
                    "{what}: {scope}"
                );
            }
        }
        (Err(_), Err(_)) => {}
        _ => panic!("{what}: one reading fails: {a:?} / {b:?}"),
    }
}

/// A decoded tree as a directory on disk (links and FIFOs included), read as
/// [`Topology::from_sysfs`] reads a root.
pub fn read_on_disk(data: &[u8]) -> Result<Topology, podq_topology::Error> {
    let dir = scratch_dir();
    make_on_disk(dir.path(), &decode_tree(data));
    Topology::from_sysfs(dir.path())
}

/// A decoded tree read three ways (its files in memory; on disk, where links and FIFOs
/// exist; as an archive): reading never panics, an accepted tree gives pods that
/// partition its usable CPUs in every scope, and where the ways can express the same
/// tree they agree.
pub fn sysfs_tree(data: &[u8]) {
    let entries = decode_tree(data);
    let in_memory = Topology::from_sysfs_files(files_of(&entries));
    let dir = scratch_dir();
    let made = make_on_disk(dir.path(), &entries);
    let on_disk = Topology::from_sysfs(dir.path());
    let archived = Topology::from_sysfs_archive(Path::new("fuzz.tar.gz"), &archive_of(&made));
    for topology in [&in_memory, &on_disk, &archived].into_iter().flatten() {
        check_pods(topology);
    }
    let plain = made
        .iter()
        .all(|e| matches!(e, Entry::File(..) | Entry::Dir(_)));
    if plain {
        agree("disk and archive", &on_disk, &archived);
    }
    if made.iter().all(|e| matches!(e, Entry::File(..))) && made.len() == entries.len() {
        agree("memory and disk", &in_memory, &on_disk);
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
