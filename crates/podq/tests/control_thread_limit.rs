//! The control server under a thread limit (`RLIMIT_NPROC`), in a child process running
//! as uid 65534 (the limit does not bind root): a server that cannot start its thread
//! leaves no socket behind, and a running one keeps answering — its stats showing the
//! worker threads that could not be created — while no thread can be created.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use podq::control::{Client, ControlServer, Request};
use podq::{Work, Workqueue};

fn threads_now() -> u64 {
    std::fs::read_dir("/proc/self/task").unwrap().count() as u64
}

/// No thread can be created after this (the uid's process count is at its limit).
fn forbid_new_threads() {
    let n = threads_now();
    let limit = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: `limit` is a valid rlimit for the whole call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &limit) }, 0);
    assert!(
        std::thread::Builder::new().spawn(|| ()).is_err(),
        "the thread limit is not in force"
    );
}

#[test]
#[ignore = "helper: run by control_survives_a_thread_limit as uid 65534"]
fn thread_limit_child() {
    let dir = std::env::var("PODQ_TEST_DIR").expect("PODQ_TEST_DIR names a directory");
    let dir = Path::new(&dir);
    let server = ControlServer::builder()
        .path(dir.join("running.sock"))
        .build()
        .unwrap();
    // Build the workqueue before the limit, but queue after it: its workers cannot start.
    let spawn_failures = Arc::new(AtomicU64::new(0));
    let reported = Arc::clone(&spawn_failures);
    let wq = Workqueue::builder("starved")
        .error_hook(move |_| {
            reported.fetch_add(1, SeqCst);
        })
        .build()
        .unwrap();
    wq.expose().unwrap();
    forbid_new_threads();

    let path = dir.join("unstarted.sock");
    let err = ControlServer::builder().path(&path).build().unwrap_err();
    println!("START: {err}");
    assert_eq!(err.to_string(), "cannot start the control server thread");
    assert!(
        !path.exists(),
        "the socket of a server that never ran is left"
    );

    let work = Work::new(|| ());
    assert!(wq.queue(&work));
    for _ in 0..5 {
        let mut client = Client::connect(server.path(), Duration::from_secs(5)).unwrap();
        let list = client.call(&Request::List).unwrap().queues.unwrap();
        assert!(list.iter().any(|q| q.name == "starved"));
    }
    // The counters are readable exactly while the failures happen: the hook has been
    // told of one (its SeqCst add, made after the counter's, orders the two).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while spawn_failures.load(SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(spawn_failures.load(SeqCst) > 0, "no spawn failure reported");
    let mut client = Client::connect(server.path(), Duration::from_secs(5)).unwrap();
    let stats = client
        .call(&Request::Stats {
            queue: Some("starved".into()),
        })
        .unwrap()
        .stats
        .unwrap();
    let failures: u64 = stats[0].pools.iter().map(|p| p.worker_spawn_failures).sum();
    if cfg!(feature = "stats") {
        assert!(failures > 0, "no spawn failure counted");
    }
    println!("CHILD_OK: {failures} worker spawn failures seen");
    // Let the item run before the workqueue is dropped, so the process can exit.
    std::process::exit(0);
}

#[test]
fn control_survives_a_thread_limit() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "NOT RUN: control_survives_a_thread_limit needs root to run its child as \
             another uid (RLIMIT_NPROC does not bind root, and the limit must not hit \
             this user's other processes)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "thread_limit_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PODQ_TEST_DIR", dir.path())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("CHILD_OK"),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
