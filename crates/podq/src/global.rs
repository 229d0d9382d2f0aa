//! The process-wide default workqueue (the kernel's `system_dfl_wq`, rayon's global
//! pool): built on first use, on the default scope ([`crate::default_scope`], so it
//! follows [`crate::set_default_scope`]), with default attributes, and never dropped.
//!
//! Legend: I set once (the `OnceLock`), read-only after; G guarded by `BUILD` (the
//! one build in progress).

use crate::sync::unmodelled::Mutex;
use std::sync::OnceLock;

use crate::sync::lock_std as lock;
use crate::{Error, JoinHandle, Work, Workqueue};

/// The default workqueue's name, under which the control server shows it.
pub const DEFAULT_WORKQUEUE_NAME: &str = "system_dfl";

/// I: the default workqueue, once built.
static DEFAULT: OnceLock<Workqueue> = OnceLock::new();

/// G: serialises the first build, so that a failed build can be retried and two
/// racing first calls do not both build (and expose) a workqueue.
static BUILD: Mutex<()> = Mutex::new(());

/// The process-wide default workqueue, built on the first call: named
/// [`DEFAULT_WORKQUEUE_NAME`], scope `Default`, every usable CPU, `max_active` 1024.
/// With the `control` feature it is exposed, so `podq ctl` lists and changes it when
/// the control server runs. A build that fails (an invalid `PODQ_SCOPE`, say) returns
/// its error and is tried again on the next call.
///
/// It is never dropped: like every podq thread, its workers end with the process, and
/// items still queued at exit do not run; [`Workqueue::flush`] it before leaving
/// `main` to run them.
///
/// # Departure from the kernel
/// The kernel's `system_dfl_wq` exists from boot and is not shown in sysfs; podq
/// builds it lazily and exposes it. If a visible workqueue already holds the name, the
/// default one still works but is not exposed (the name stays with the first).
///
/// ```
/// let wq = podq::default_workqueue()?;
/// assert_eq!(wq.name(), podq::DEFAULT_WORKQUEUE_NAME);
/// assert_eq!(wq.attrs().scope, podq::Scope::Default);
/// # Ok::<(), podq::Error>(())
/// ```
pub fn default_workqueue() -> Result<&'static Workqueue, Error> {
    if let Some(wq) = DEFAULT.get() {
        return Ok(wq);
    }
    let _building = lock(&BUILD);
    if let Some(wq) = DEFAULT.get() {
        return Ok(wq);
    }
    let wq = Workqueue::builder(DEFAULT_WORKQUEUE_NAME).build()?;
    #[cfg(feature = "control")]
    {
        // A name already taken leaves it unexposed (documented above); it works as is.
        let _ = wq.expose();
    }
    Ok(DEFAULT.get_or_init(|| wq))
}

/// Runs `f` once on the default workqueue ([`default_workqueue`]) and returns a handle
/// to its result.
///
/// ```
/// let answer = podq::spawn(|| 6 * 7);
/// assert_eq!(answer.join().unwrap(), 42);
/// ```
///
/// # Panics
/// If the default workqueue cannot be built (see [`default_workqueue`]).
pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    expect_default().spawn(f)
}

/// Runs `f` once on the default workqueue ([`default_workqueue`]), with no handle
/// ([`Workqueue::execute`](crate::Workqueue::execute)).
///
/// ```
/// let (tx, rx) = std::sync::mpsc::channel();
/// podq::execute(move || tx.send(6 * 7).unwrap());
/// assert_eq!(rx.recv().unwrap(), 42);
/// ```
///
/// # Panics
/// If the default workqueue cannot be built (see [`default_workqueue`]).
pub fn execute(f: impl FnOnce() + Send + 'static) {
    expect_default().execute(f);
}

/// As [`spawn`], the item labelled `label` ([`crate::current()`] reports it).
///
/// # Panics
/// If the default workqueue cannot be built (see [`default_workqueue`]).
pub fn spawn_named<T: Send + 'static>(
    label: impl Into<std::sync::Arc<str>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    expect_default().spawn_named(label, f)
}

/// Queues `work` on the default workqueue ([`default_workqueue`]), on the pod of the
/// calling CPU. Returns false if it was already pending or is being cancelled.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
///
/// let runs = Arc::new(AtomicUsize::new(0));
/// let counter = Arc::clone(&runs);
/// let work = podq::Work::new(move || {
///     counter.fetch_add(1, Ordering::Relaxed);
/// });
/// assert!(podq::queue(&work));
/// work.flush();
/// assert_eq!(runs.load(Ordering::Relaxed), 1);
/// ```
///
/// # Panics
/// If the default workqueue cannot be built (see [`default_workqueue`]).
pub fn queue(work: &Work) -> bool {
    expect_default().queue(work)
}

fn expect_default() -> &'static Workqueue {
    match default_workqueue() {
        Ok(wq) => wq,
        Err(e) => panic!("podq: cannot build the default workqueue: {e}"),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn is_built_once_and_shared() {
        let first = default_workqueue().unwrap();
        let second = default_workqueue().unwrap();
        assert!(std::ptr::eq(first, second));
        assert_eq!(first.name(), "system_dfl");
    }

    #[test]
    fn racing_first_calls_share_one_workqueue() {
        let addrs: Vec<usize> = (0..4)
            .map(|_| std::thread::spawn(|| default_workqueue().unwrap() as *const _ as usize))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        assert!(addrs.iter().all(|&a| a == addrs[0]));
    }

    #[test]
    fn spawn_and_queue_run_on_it() {
        let handles: Vec<_> = (0..50).map(|i| spawn(move || i * 3)).collect();
        let sum: i32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(sum, 3675);

        let runs = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&runs);
        let work = Work::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        assert!(queue(&work));
        work.flush();
        assert!(queue(&work));
        work.flush();
        assert_eq!(runs.load(Ordering::Relaxed), 2);
    }

    #[cfg(feature = "control")]
    #[test]
    fn is_visible_to_the_control_plane() {
        let wq = default_workqueue().unwrap();
        // The name is held by the default workqueue: another one cannot take it.
        let other = Workqueue::builder(DEFAULT_WORKQUEUE_NAME).build().unwrap();
        assert!(other.expose().is_err());
        let listed = format!("{:?}", crate::control::Registry::global());
        assert!(listed.contains("\"system_dfl\""), "{listed}");
        assert_eq!(wq.name(), DEFAULT_WORKQUEUE_NAME);
    }
}
