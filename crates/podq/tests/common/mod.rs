//! Helpers shared by podq's integration tests (`mod common;` in each test file). Each
//! test binary uses a part of them, so unused ones are not an error here.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime};

use podq::{CpuSet, DelayedWork, Scope, Work, Workqueue};

/// A shared counter starting at 0.
pub fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// A work item that adds one to `runs` each time it runs.
pub fn counting_work(runs: &Arc<AtomicUsize>) -> Work {
    let runs = Arc::clone(runs);
    Work::new(move || {
        runs.fetch_add(1, SeqCst);
    })
}

/// A delayed work item that adds one to `runs` each time it runs.
pub fn counting_delayed(runs: &Arc<AtomicUsize>) -> DelayedWork {
    let runs = Arc::clone(runs);
    DelayedWork::new(move || {
        runs.fetch_add(1, SeqCst);
    })
}

/// Spawns onto `wq` an item that adds one to `runs`.
pub fn spawn_counting(wq: &Workqueue, runs: &Arc<AtomicUsize>) {
    let runs = Arc::clone(runs);
    drop(wq.spawn(move || {
        runs.fetch_add(1, SeqCst);
    }));
}

/// What the attribute changers of the stress test and the soak pick from: every scope
/// a workqueue can be set to (`auto` aside, it moves on its own)...
pub fn changer_scopes() -> Vec<Scope> {
    Scope::CONCRETE
        .into_iter()
        .chain([Scope::Default])
        .collect()
}

/// ... and these cpumasks of `fake_topology(2, 2, 2, 2)`, whose usable CPUs are `all`:
/// all, each node, and one CPU of each LLC.
pub fn changer_masks(all: &CpuSet) -> [CpuSet; 4] {
    [
        all.clone(),
        (0..8).collect(),
        (8..16).collect(),
        [1, 6, 9, 14].into_iter().collect(),
    ]
}

/// A control server on a socket in a temporary directory of its own, and a client
/// connected to it (fields drop in order: the client, the server, the directory).
#[cfg(feature = "control")]
pub struct Control {
    pub client: podq::control::Client,
    pub server: podq::control::ControlServer,
    _dir: tempfile::TempDir,
}

/// Starts a [`Control`].
#[cfg(feature = "control")]
pub fn control() -> Control {
    let dir = tempfile::tempdir().unwrap();
    let server = podq::control::ControlServer::builder()
        .path(dir.path().join("ctl.sock"))
        .build()
        .unwrap();
    let client = podq::control::Client::connect(server.path(), Duration::from_secs(10)).unwrap();
    Control {
        client,
        server,
        _dir: dir,
    }
}

/// A request written as its protocol line (JSON).
#[cfg(feature = "control")]
pub fn request(line: &str) -> podq::control::Request {
    podq::control::parse_request(line.as_bytes()).unwrap()
}

/// The `get` request for `attr` of `queue`.
#[cfg(feature = "control")]
pub fn get_attr(queue: &str, attr: &str) -> podq::control::Request {
    podq::control::Request::Get {
        queue: queue.into(),
        attr: attr.into(),
    }
}

/// The `set` request of `attr` of `queue` to `value`.
#[cfg(feature = "control")]
pub fn set_attr(queue: &str, attr: &str, value: &str) -> podq::control::Request {
    podq::control::Request::Set {
        queue: queue.into(),
        attr: attr.into(),
        value: value.into(),
    }
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

/// Spawns an item that reports when it starts and then waits for `release`.
pub fn blocker(wq: &Workqueue) -> (mpsc::Sender<()>, podq::JoinHandle<()>) {
    let (release, gate) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let handle = wq.spawn(move || {
        started_tx.send(()).unwrap();
        gate.lock().unwrap().recv().unwrap();
    });
    started.recv().unwrap();
    (release, handle)
}

/// The example program `name`, built next to the test binaries. `cargo test` builds
/// the examples; a test binary run alone (`cargo test --test NAME`) does not, so the
/// binary there may be missing or older than the code: both are refused, naming the
/// newer source, so that no test checks a stale example.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let path = dir.join("examples").join(name);
    let rebuild = format!(
        "build it with `cargo build -p podq --example {name}` (`cargo test` builds every example)"
    );
    let Some(built) = modified(&path) else {
        panic!("{} is missing: {rebuild}", path.display());
    };
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let sources = [
        "podq/src",
        "podq/examples",
        "podq-policy/src",
        "podq-topology/src",
    ];
    let mut stale = sources
        .iter()
        .flat_map(|dir| files_under(&crates.join(dir)));
    if let Some(newer) = stale.find(|file| modified(file).is_some_and(|at| at > built)) {
        panic!(
            "{} is older than {}: {rebuild}",
            path.display(),
            newer.display()
        );
    }
    path
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The files under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}
