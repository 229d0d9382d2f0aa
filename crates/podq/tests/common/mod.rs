//! Helpers shared by podq's integration tests (`mod common;` in each test file). Each
//! test binary uses a part of them, so unused ones are not an error here.
#![allow(dead_code)]

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use podq::{CpuSet, Workqueue};

/// A shared counter starting at 0.
pub fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// Threads of this process now.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .count()
}

/// Live threads named as workers of pool `id` (`podq/u<id>:<n>`).
pub fn pool_threads(id: u64) -> usize {
    let prefix = format!("podq/u{id}:");
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with(&prefix))
        .count()
}

/// The real CPU the calling thread runs on.
pub fn this_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions.
    usize::try_from(unsafe { libc::sched_getcpu() }).expect("sched_getcpu")
}

/// The real CPUs the calling thread may run on.
pub fn my_affinity() -> CpuSet {
    podq::topology::live::affinity().expect("sched_getaffinity")
}

/// Sets the affinity of the process's main thread, the mask podq reads as the
/// process's (what `taskset -p` does to a running process).
pub fn set_process_affinity(cpus: &CpuSet) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    podq::topology::live::set_affinity_of(pid, cpus).expect("sched_setaffinity");
}

/// Flushes `wq` on another thread; returns whether it finished within `limit`.
pub fn flush_within(wq: &Workqueue, limit: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let wq = wq.clone();
    std::thread::spawn(move || {
        wq.flush();
        let _ = tx.send(());
    });
    rx.recv_timeout(limit).is_ok()
}
