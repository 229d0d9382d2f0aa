//! A topology at the CPU limit ([`MAX_CPUS`]) builds in bounded memory: each distinct
//! SMT or LLC set is kept once, not once per CPU. Measured with a counting allocator
//! (the peak of live heap bytes while building), so this file holds one test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use podq_topology::{CpuFacts, CpuSet, Scope, Topology, MAX_CPUS, MAX_SYNTHETIC_CPUS};

/// The system allocator, keeping the live and peak heap bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The peak of live heap bytes above those live at the start while `f` runs, and what
/// stays live after it (its result).
fn peak_bytes<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (PEAK.load(Relaxed) - base, out)
}

const MIB: usize = 1 << 20;

#[test]
fn a_topology_at_the_cpu_limit_builds_in_bounded_memory() {
    let n = MAX_CPUS;
    let all = CpuSet::first_n(n);
    // Machine-wide groups: every CPU lists all CPUs as its siblings and its LLC (the
    // hostile case; per-CPU sets of 8 KiB each took 1 GiB).
    let (peak, topo) = peak_bytes(|| {
        let facts = (0..n).map(|cpu| {
            (
                cpu,
                CpuFacts {
                    smt: all.clone(),
                    llc: all.clone(),
                    node: 0,
                    package: 0,
                },
            )
        });
        Topology::from_parts(all.clone(), all.clone(), facts).unwrap()
    });
    eprintln!("machine-wide groups: peak {peak} B");
    assert_eq!(topo.facts(n - 1).smt.len(), n);
    assert_eq!(topo.pods(Scope::Smt).unwrap().len(), 1);
    assert!(peak < 16 * MIB, "machine-wide groups: peak {peak} B");
    drop(topo);

    // x86 numbering, 4 sockets of 8 Ki two-thread cores, 32 cores to an LLC: core `k`
    // has CPUs `k` and `k + 32 Ki`. Each distinct SMT set is still a bitmap up to its
    // highest CPU (4 to 8 KiB here), so this shape costs about 200 MiB.
    let cores = n / 2;
    let (peak, topo) = peak_bytes(|| {
        let facts = (0..n).map(|cpu| {
            let core = cpu % cores;
            let first = core / 32 * 32;
            let llc = (first..first + 32).flat_map(|c| [c, c + cores]).collect();
            let package = core / (cores / 4);
            let smt = [core, core + cores].into_iter().collect();
            (
                cpu,
                CpuFacts {
                    smt,
                    llc,
                    node: package,
                    package,
                },
            )
        });
        Topology::from_parts(all.clone(), all.clone(), facts).unwrap()
    });
    eprintln!("x86 numbering: peak {peak} B");
    assert_eq!(topo.pods(Scope::Smt).unwrap().len(), cores);
    assert_eq!(topo.pods(Scope::Cache).unwrap().len(), cores / 32);
    assert_eq!(
        topo.facts(cores + 5).smt.to_list(),
        format!("5,{}", cores + 5)
    );
    assert!(peak < 512 * MIB, "x86 numbering: peak {peak} B");

    drop(topo);

    // The largest synthetic shape with one LLC: its single-CPU SMT sets are distinct,
    // each a bitmap up to its CPU (16 MiB together).
    let shape = format!("1s{MAX_SYNTHETIC_CPUS}c");
    let (peak, topo) = peak_bytes(|| Topology::synthetic(&shape).unwrap());
    eprintln!("{shape}: peak {peak} B");
    assert_eq!(
        topo.facts(MAX_SYNTHETIC_CPUS - 1).llc.len(),
        MAX_SYNTHETIC_CPUS
    );
    assert!(peak < 32 * MIB, "{shape}: peak {peak} B");
    drop(topo);

    // The same machine-wide groups read from sysfs text: every CPU lists all CPUs as
    // its thread siblings and its package, and has no cache information. A quarter of
    // the limit keeps the debug build's run short (the reader's passes over each CPU's
    // set are n² / 64 word operations); set per CPU, these took 95 MB here.
    let n = MAX_CPUS / 4;
    const CPU: &str = "sys/devices/system/cpu";
    let mut files = vec![(format!("{CPU}/online"), format!("0-{}", n - 1))];
    for cpu in 0..n {
        for name in ["thread_siblings_list", "core_siblings_list"] {
            files.push((
                format!("{CPU}/cpu{cpu}/topology/{name}"),
                format!("0-{}", n - 1),
            ));
        }
    }
    let files: Vec<(String, Vec<u8>)> = files
        .into_iter()
        .map(|(p, c)| (p, c.into_bytes()))
        .collect();
    let (peak, topo) = peak_bytes(|| Topology::from_sysfs_files(files).unwrap());
    eprintln!("sysfs, machine-wide groups: peak {peak} B");
    assert_eq!(topo.pods(Scope::Smt).unwrap().len(), 1);
    assert_eq!(topo.facts(12_345).llc.len(), n);
    assert!(peak < 48 * MIB, "sysfs, machine-wide groups: peak {peak} B");
}
