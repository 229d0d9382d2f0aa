//! Faults the runtime survives, what it tells about them, and how tests inject them.
//!
//! A worker thread that cannot be created (resource limits) is counted in the pool's
//! `worker_spawn_failures`, reported through the error hook ([`set_error_hook`]) and
//! retried after the create cooldown ([`set_create_cooldown`]); meanwhile workqueues
//! built with a rescuer (`WorkqueueBuilder::rescuer`) keep their items moving. The
//! protocol is described in `pool/rescue.rs`. Failures can be injected for tests with
//! the `test-util` feature (`fail_worker_spawns`).
//!
//! Legend: A atomic (`Relaxed`: plain settings read on the slow spawn path, pairing
//! with nothing); E guarded by the hook's own lock.

use crate::sync::unmodelled::{AtomicU64, RwLock};
use crate::sync::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::{Builder, JoinHandle};
use std::time::Duration;

use podq_topology::CpuSet;

use crate::Error;

pub use crate::policy::CREATE_COOLDOWN;

/// A: the create cooldown in nanoseconds.
static COOLDOWN_NS: AtomicU64 = AtomicU64::new(CREATE_COOLDOWN.as_nanos() as u64);

/// A: worker creations still to fail (`u64::MAX`: all of them).
#[cfg(feature = "test-util")]
static INJECTED: AtomicU64 = AtomicU64::new(0);

/// What the error hook is told about a fault the runtime handled.
#[derive(Clone, Copy, Debug)]
pub struct ErrorReport<'a> {
    /// The pool that met it.
    pub pool: u64,
    /// That pool's pod, in its topology's numbering.
    pub pod: &'a CpuSet,
    /// What failed.
    pub error: &'a Error,
}

/// An error hook, shared by the workqueues it was given to.
pub(crate) type ErrorHook = Arc<dyn Fn(&ErrorReport<'_>) + Send + Sync>;

/// E: the process-wide error hook.
static ERROR_HOOK: RwLock<Option<ErrorHook>> = RwLock::new(None);

/// Sets the process-wide hook called for every fault the runtime handles without
/// failing a call (today: a worker thread that could not be created; the pool retries
/// after the create cooldown), for workqueues without their own
/// ([`crate::WorkqueueBuilder::error_hook`]). Replaces the previous hook. It runs on the thread that
/// met the fault, with no podq lock held.
pub fn set_error_hook(hook: impl Fn(&ErrorReport<'_>) + Send + Sync + 'static) {
    *ERROR_HOOK
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(hook));
}

/// Removes the error hook.
pub fn clear_error_hook() {
    *ERROR_HOOK
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
}

/// Reports a fault of pool `pool` to the workqueues' own hooks `own` (each once) and,
/// if `process_wide`, to the process-wide hook.
pub(crate) fn report_error(
    own: &[ErrorHook],
    process_wide: bool,
    pool: u64,
    pod: &CpuSet,
    error: &Error,
) {
    let global = if process_wide {
        ERROR_HOOK
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    } else {
        None
    };
    for hook in own.iter().chain(global.iter()) {
        // A panicking hook must not take the runtime down with it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hook(&ErrorReport { pool, pod, error })
        }));
    }
}

/// Sets how long a pool waits after a failed worker creation before trying again
/// (default [`CREATE_COOLDOWN`], 1 s as in the kernel). Process-wide.
pub fn set_create_cooldown(cooldown: Duration) {
    let ns = u64::try_from(cooldown.as_nanos()).unwrap_or(u64::MAX);
    COOLDOWN_NS.store(ns, Relaxed);
}

/// The create cooldown now in force.
pub fn create_cooldown() -> Duration {
    Duration::from_nanos(COOLDOWN_NS.load(Relaxed))
}

/// Makes the next `n` worker-thread creations fail as the OS does when a resource limit
/// is hit (`EAGAIN`); `u64::MAX` makes all of them fail until called again with 0.
/// Rescuer, timer and manager threads are not affected. Process-wide: tests using it
/// should not share a process with tests that need workers to start.
///
/// Needs the `test-util` feature.
#[cfg(feature = "test-util")]
pub fn fail_worker_spawns(n: u64) {
    INJECTED.store(n, Relaxed);
}

/// Spawns a worker thread, unless an injected failure is due.
pub(crate) fn spawn_worker_thread(
    builder: Builder,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    #[cfg(feature = "test-util")]
    let injected = INJECTED
        .fetch_update(Relaxed, Relaxed, |n| match n {
            0 => None,
            u64::MAX => Some(u64::MAX),
            n => Some(n - 1),
        })
        .is_ok();
    #[cfg(feature = "test-util")]
    if injected {
        return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
    }
    builder.spawn(f)
}
