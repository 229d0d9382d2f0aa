//! Worker thread options ([`crate::WorkqueueBuilder::thread_name`], `stack_size`,
//! `on_thread_start`, `on_thread_stop`): how a workqueue's pools and its rescuer
//! create their threads, and the hooks those threads call.
//!
//! Legend: I set at init, read-only after.

use crate::sync::unmodelled::AtomicU64;
use crate::sync::Ordering::Relaxed;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use podq_topology::CpuSet;

use crate::work::panic_message;
use crate::PanicHook;

/// What an [`on_thread_start`](crate::WorkqueueBuilder::on_thread_start) or
/// [`on_thread_stop`](crate::WorkqueueBuilder::on_thread_stop) hook is told about the
/// thread it runs on.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct WorkerThread<'a> {
    /// The workqueue whose options made the thread.
    pub workqueue: &'a str,
    /// The pool it works for (as in [`crate::stats::PoolStats::id`]); `None` for the
    /// workqueue's rescuer, which serves every pool the workqueue uses.
    pub pool: Option<u64>,
    /// Its slot in the pool (0 for the rescuer), as in the default name `podq/u<pool>:<index>`.
    pub index: usize,
    /// The real CPUs it may run on: the pool's (its pod if strict, else the cpumask);
    /// for the rescuer, the workqueue's cpumask when it started.
    pub cpus: &'a CpuSet,
}

/// A name function: `(pool id, worker index)` → thread name.
pub(crate) type NameFn = Arc<dyn Fn(u64, usize) -> String + Send + Sync>;
/// A thread hook.
pub(crate) type ThreadHook = Arc<dyn Fn(&WorkerThread<'_>) + Send + Sync>;

/// Identities of workqueues with their own thread options (0 stands for the defaults).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How a workqueue's threads are made (all I).
#[derive(Clone, Default)]
pub(crate) struct ThreadOptions {
    /// 0 for the defaults (pools may be shared with any workqueue), else unique to one
    /// workqueue: it is part of the pool registry's key, so pools whose threads carry
    /// one workqueue's names and hooks serve only that workqueue.
    pub(crate) id: u64,
    /// The workqueue, for hooks and panic reports.
    pub(crate) workqueue: String,
    pub(crate) name: Option<NameFn>,
    pub(crate) stack_size: Option<usize>,
    pub(crate) on_start: Option<ThreadHook>,
    pub(crate) on_stop: Option<ThreadHook>,
    /// Where a panicking hook or name function is reported (`None`: the process-wide hook).
    pub(crate) panic_hook: Option<PanicHook>,
}

impl ThreadOptions {
    /// Gives the options their identity once they are final (nothing set: the defaults).
    pub(crate) fn seal(mut self, workqueue: &str, panic_hook: Option<PanicHook>) -> Self {
        let custom = self.name.is_some()
            || self.stack_size.is_some()
            || self.on_start.is_some()
            || self.on_stop.is_some();
        self.id = if custom {
            NEXT_ID.fetch_add(1, Relaxed)
        } else {
            0
        };
        self.workqueue = workqueue.to_owned();
        self.panic_hook = panic_hook;
        self
    }

    /// The thread builder for worker `index` of pool `pool`.
    pub(crate) fn worker(&self, pool: u64, index: usize) -> std::thread::Builder {
        let default = || format!("podq/u{pool}:{index}");
        let name = match &self.name {
            None => default(),
            Some(f) => match catch_unwind(AssertUnwindSafe(|| f(pool, index))) {
                Ok(name) => without_nul(name),
                Err(payload) => {
                    self.report(&format!(
                        "thread name function panicked (the default name is used): {}",
                        panic_message(&*payload)
                    ));
                    default()
                }
            },
        };
        self.sized(std::thread::Builder::new().name(name))
    }

    /// The thread builder for the rescuer of workqueue `name` (the kernel's name).
    pub(crate) fn rescuer(&self, name: &str) -> std::thread::Builder {
        self.sized(std::thread::Builder::new().name(without_nul(format!("podq/R-{name}"))))
    }

    fn sized(&self, builder: std::thread::Builder) -> std::thread::Builder {
        match self.stack_size {
            Some(bytes) => builder.stack_size(bytes),
            None => builder,
        }
    }

    /// Calls the start hook on the calling thread; the returned guard calls the stop
    /// hook when dropped (when the thread leaves its loop, or unwinds).
    pub(crate) fn started<'a>(
        &'a self,
        pool: Option<u64>,
        index: usize,
        cpus: &'a CpuSet,
    ) -> Stopping<'a> {
        let stopping = Stopping {
            options: self,
            pool,
            index,
            cpus,
        };
        stopping.call(self.on_start.as_ref(), "on_thread_start");
        stopping
    }

    fn report(&self, message: &str) {
        crate::report_panic(self.panic_hook.as_ref(), &self.workqueue, message);
    }
}

/// Calls the stop hook when dropped.
pub(crate) struct Stopping<'a> {
    options: &'a ThreadOptions,
    pool: Option<u64>,
    index: usize,
    cpus: &'a CpuSet,
}

impl Stopping<'_> {
    /// Runs `hook` for this thread; a panic in it is caught and reported, and the
    /// thread carries on.
    fn call(&self, hook: Option<&ThreadHook>, what: &str) {
        let Some(hook) = hook else {
            return;
        };
        let info = WorkerThread {
            workqueue: &self.options.workqueue,
            pool: self.pool,
            index: self.index,
            cpus: self.cpus,
        };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| hook(&info))) {
            self.options
                .report(&format!("{what} panicked: {}", panic_message(&*payload)));
        }
    }
}

impl Drop for Stopping<'_> {
    fn drop(&mut self) {
        self.call(self.options.on_stop.as_ref(), "on_thread_stop");
    }
}

/// A thread name cut at its first NUL byte (the OS cannot carry one; the kernel
/// stops at it too).
fn without_nul(mut name: String) -> String {
    if let Some(at) = name.find('\0') {
        name.truncate(at);
    }
    name
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn names_stop_at_nul() {
        assert_eq!(without_nul("io\0worker".into()), "io");
        assert_eq!(without_nul("plain".into()), "plain");
    }

    #[test]
    fn only_customised_options_get_an_identity() {
        assert_eq!(ThreadOptions::default().seal("a", None).id, 0);
        let sized = ThreadOptions {
            stack_size: Some(1 << 20),
            ..ThreadOptions::default()
        };
        let a = sized.clone().seal("a", None).id;
        let b = sized.seal("b", None).id;
        assert!(a != 0 && b != 0 && a != b, "{a} {b}");
    }

    #[test]
    fn the_default_name_is_the_kernel_style_one() {
        let b = ThreadOptions::default().seal("a", None).worker(7, 3);
        let h = b
            .spawn(|| std::thread::current().name().map(str::to_owned))
            .unwrap();
        assert_eq!(h.join().unwrap().as_deref(), Some("podq/u7:3"));
    }
}
