//! `JoinHandle`: the result of a one-shot item, awaited by blocking or as a `Future`.
//!
//! A spawned item is one allocation: the closure, the result and the waiter live in
//! one [`Spawned`] block, shared by the queue entry ([`OnceTask`]) and the handle.
//!
//! Protocol, on one state word (`TAKEN`, `DONE`, `WAITING`):
//! 1. Running (or abandoning) starts with `fetch_or(TAKEN)`: the one caller that set
//!    it owns the closure, so an item runs at most once and a dropped entry that never
//!    ran completes the handle with "dropped without running" instead.
//! 2. The owner writes the result, then `fetch_or(DONE)`; only if `WAITING` was set
//!    does it lock the waiter and wake it. A completion nobody waits for takes no lock
//!    and makes no system call.
//! 3. The handle takes the result once it sees `DONE`. To wait, it stores its waiter
//!    (thread or task waker) under the waiter lock, then `fetch_or(WAITING)`; if that
//!    shows `DONE`, it takes the result instead of sleeping.
//!
//! Race considered: the completer's `fetch_or(DONE)` and the waiter's
//! `fetch_or(WAITING)` are ordered on the same word, so either the completer sees
//! `WAITING` (and the waiter stored before it) or the waiter sees `DONE`: no lost
//! wake-up. Loom model: `loom_join_sees_the_result_or_is_woken`.
//!
//! Legend: A atomic; D owned by the thread whose `fetch_or` set `TAKEN`; O written by the
//! closure's owner before `DONE`, then only by the handle; V guarded by
//! `Spawned::waiter`.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::Ordering::{AcqRel, Acquire};
use std::sync::Arc;

use crate::sync::{lock, thread, AtomicU32, Mutex, UnsafeCell};
use crate::work::panic_message;

/// A one-shot item panicked, or was dropped without running (its workqueue refused it).
///
/// The panic payload is kept, as `std::thread::Result` keeps it: [`Panicked::payload`]
/// borrows it, [`Panicked::into_payload`] gives it back (e.g. for
/// `std::panic::resume_unwind`). `message` is its text when the payload is a string.
#[non_exhaustive]
pub struct Panicked {
    /// The panic message (`"panic with a non-string payload"` when the payload is not a
    /// string; `"dropped without running"` when the item never ran).
    pub message: String,
    /// The payload, `None` when the item never ran.
    payload: Option<Box<dyn Any + Send>>,
}

impl Panicked {
    /// The panic payload, `None` when the item was dropped without running.
    pub fn payload(&self) -> Option<&(dyn Any + Send)> {
        self.payload.as_deref()
    }

    /// The panic payload, to resume the panic with `std::panic::resume_unwind`.
    pub fn into_payload(self) -> Option<Box<dyn Any + Send>> {
        self.payload
    }

    /// Whether the item panicked (rather than being dropped without running).
    pub fn ran(&self) -> bool {
        self.payload.is_some()
    }
}

impl fmt::Debug for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Panicked")
            .field("message", &self.message)
            .field("ran", &self.ran())
            .finish()
    }
}

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ran() {
            write!(f, "work item panicked: {}", self.message)
        } else {
            write!(f, "work item {}", self.message)
        }
    }
}

impl std::error::Error for Panicked {}

/// Who waits for the result.
enum Waiter {
    None,
    Thread(thread::Thread),
    Task(Waker),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::None => {}
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(w) => w.wake(),
        }
    }
}

/// `Spawned::state`: the closure was taken, by the runner or by a drop that abandons it.
const TAKEN: u32 = 1;
/// `Spawned::state`: the result is in `Spawned::result`.
const DONE: u32 = 2;
/// `Spawned::state`: a waiter is registered in `Spawned::waiter`.
const WAITING: u32 = 4;

/// The shared block of a spawned item: closure, result and waiter in one allocation.
/// Running and completing it take no lock unless someone waits (protocol in the
/// module docs).
struct Spawned<F, T> {
    /// A: [`TAKEN`], [`DONE`] and [`WAITING`]. Set with `AcqRel` read-modify-writes:
    /// the `fetch_or` of `DONE` releases the result written before it and pairs with
    /// the handle's `Acquire` load (or its `fetch_or` of `WAITING`) that sees `DONE`;
    /// the two `fetch_or`s of `DONE` and `WAITING` are ordered on this one word, so
    /// either the completer sees `WAITING` and wakes the waiter, or the waiter sees
    /// `DONE` and does not sleep.
    state: AtomicU32,
    /// D: the closure.
    f: UnsafeCell<Option<F>>,
    /// O: the result (a panic boxed, so that the block stays small for the usual
    /// case).
    result: UnsafeCell<Option<Result<T, Box<Panicked>>>>,
    /// V: the waiter.
    waiter: Mutex<Waiter>,
    /// I: the label [`crate::current`] reports while it runs.
    label: Option<Arc<str>>,
}

// SAFETY: the closure is touched only by the one thread whose `fetch_or` set `TAKEN`
// (D), the result by the completer before `DONE` and by the single handle after it (O),
// and the waiter under its lock; `F` and `T` move between threads, so they must be
// `Send`, and nothing is shared by reference.
unsafe impl<F: Send, T: Send> Sync for Spawned<F, T> {}

impl<F, T> Spawned<F, T> {
    /// Claims the closure: true for the one caller that sets `TAKEN`.
    fn take_closure(&self) -> Option<F> {
        if self.state.fetch_or(TAKEN, AcqRel) & TAKEN != 0 {
            return None;
        }
        // SAFETY: this call set `TAKEN`, so it alone owns the closure (D).
        self.f.with_mut(|f| unsafe { (*f).take() })
    }

    /// Stores the result and wakes the waiter, if any. Called once, by the owner of
    /// the closure.
    fn complete(&self, result: Result<T, Panicked>) {
        // SAFETY: `DONE` is not set yet and only the closure's owner completes, so
        // nobody else reads or writes the result now (O).
        self.result
            .with_mut(|r| unsafe { *r = Some(result.map_err(Box::new)) });
        if self.state.fetch_or(DONE, AcqRel) & WAITING != 0 {
            let waiter = std::mem::replace(&mut *lock(&self.waiter), Waiter::None);
            waiter.wake();
        }
    }
}

/// What a queue entry does with its spawned item.
trait RunOnce: Send + Sync {
    /// Runs it; returns the panic message if it panicked.
    fn run(&self) -> Option<String>;
    /// It will never run: completes the handle with an error.
    fn abandon(&self);
    /// Its label, for the trace events.
    #[cfg(feature = "tracing")]
    fn label(&self) -> Option<&Arc<str>>;
}

impl<F, T> RunOnce for Spawned<F, T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    fn run(&self) -> Option<String> {
        let f = self.take_closure()?;
        let _label = crate::current::Labelled::new(self.label.as_ref());
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => {
                self.complete(Ok(v));
                None
            }
            Err(payload) => {
                let message = panic_message(&*payload);
                self.complete(Err(Panicked {
                    message: message.clone(),
                    payload: Some(payload),
                }));
                Some(message)
            }
        }
    }

    #[cfg(feature = "tracing")]
    fn label(&self) -> Option<&Arc<str>> {
        self.label.as_ref()
    }

    fn abandon(&self) {
        if self.take_closure().is_some() {
            self.complete(Err(Panicked {
                message: "dropped without running".to_owned(),
                payload: None,
            }));
        }
    }
}

/// What the handle does with its spawned item.
trait Joinable<T>: Send + Sync {
    /// The result, if the item is done and the result was not taken yet.
    fn take_result(&self) -> Option<Result<T, Panicked>>;
    /// Registers `waiter`; returns false if the item is done already (nothing will
    /// wake it then).
    fn wait_with(&self, waiter: Waiter) -> bool;
    /// Whether the item is done.
    fn done(&self) -> bool;
}

impl<F, T> Joinable<T> for Spawned<F, T>
where
    F: Send,
    T: Send,
{
    fn take_result(&self) -> Option<Result<T, Panicked>> {
        if !self.done() {
            return None;
        }
        // SAFETY: `DONE` is set (`Acquire` in `done`): the completer wrote the result
        // and will not touch it again, and only the one handle calls this (O).
        self.result
            .with_mut(|r| unsafe { (*r).take() })
            .map(|r| r.map_err(|panicked| *panicked))
    }

    fn wait_with(&self, waiter: Waiter) -> bool {
        *lock(&self.waiter) = waiter;
        self.state.fetch_or(WAITING, AcqRel) & DONE == 0
    }

    fn done(&self) -> bool {
        self.state.load(Acquire) & DONE != 0
    }
}

/// A spawned item as it travels through a workqueue. Dropped without [`OnceTask::run`]
/// (refused, or lost with its workqueue), it completes the handle with an error.
pub(crate) struct OnceTask(Option<Arc<dyn RunOnce>>);

impl OnceTask {
    /// Runs the item; returns its panic message if it panicked.
    pub(crate) fn run(mut self) -> Option<String> {
        self.0.take().and_then(|spawned| spawned.run())
    }

    /// Its identity (the spawned block's address) and label, for the trace events.
    #[cfg(feature = "tracing")]
    pub(crate) fn traced(&self) -> (usize, Option<&Arc<str>>) {
        match &self.0 {
            Some(spawned) => (Arc::as_ptr(spawned).cast::<()>() as usize, spawned.label()),
            None => (0, None),
        }
    }
}

impl Drop for OnceTask {
    fn drop(&mut self) {
        if let Some(spawned) = self.0.take() {
            spawned.abandon();
        }
    }
}

/// The handle of an item started with [`crate::Workqueue::spawn`]: `join()` blocks for
/// its result, and the handle is a `Future` of the same result for async callers.
/// Dropping it detaches the item (it still runs).
///
/// ```
/// let wq = podq::Workqueue::builder("doc-spawn").build().unwrap();
/// let ok = wq.spawn(|| "done");
/// let bad = wq.spawn(|| -> u32 { std::panic::panic_any(7u8) });
/// assert_eq!(ok.join().unwrap(), "done");
/// let err = bad.join().unwrap_err();
/// assert_eq!(err.payload().and_then(|p| p.downcast_ref::<u8>()), Some(&7));
/// ```
pub struct JoinHandle<T> {
    shared: Arc<dyn Joinable<T>>,
    /// Whether `poll` returned the result.
    claimed: bool,
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl<T> JoinHandle<T> {
    /// Waits for the item and returns its value, or the panic it raised.
    pub fn join(self) -> Result<T, Panicked> {
        crate::blocking(|| self.wait())
    }

    /// The wait of [`JoinHandle::join`], outside `blocking`.
    fn wait(self) -> Result<T, Panicked> {
        loop {
            if let Some(result) = self.shared.take_result() {
                return result;
            }
            if self.shared.wait_with(Waiter::Thread(thread::current())) {
                // Spurious wake-ups and stale unparks only loop once more.
                thread::park();
            }
        }
    }

    /// Whether the item has finished.
    pub fn is_finished(&self) -> bool {
        self.shared.done()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Panicked>;

    /// # Panics
    /// If polled again after it returned `Ready`.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        assert!(!self.claimed, "JoinHandle polled after completion");
        loop {
            if let Some(result) = self.shared.take_result() {
                self.claimed = true;
                return Poll::Ready(result);
            }
            if self.shared.wait_with(Waiter::Task(cx.waker().clone())) {
                return Poll::Pending;
            }
        }
    }
}

/// The handle and the queue entry's task for a one-shot closure, in one allocation.
pub(crate) fn pair<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> (JoinHandle<T>, OnceTask) {
    pair_named(None, f)
}

/// As [`pair`], the item labelled `label` ([`crate::current`]).
pub(crate) fn pair_named<T: Send + 'static>(
    label: Option<Arc<str>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> (JoinHandle<T>, OnceTask) {
    let spawned = Arc::new(Spawned {
        state: AtomicU32::new(0),
        f: UnsafeCell::new(Some(f)),
        result: UnsafeCell::new(None),
        waiter: Mutex::new(Waiter::None),
        label,
    });
    let task: Arc<dyn RunOnce> = spawned.clone();
    (
        JoinHandle {
            shared: spawned,
            claimed: false,
        },
        OnceTask(Some(task)),
    )
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_value_arrives_through_join_and_is_finished() {
        let (handle, task) = pair(|| 41 + 1);
        assert!(!handle.is_finished());
        assert_eq!(task.run(), None);
        assert!(handle.is_finished());
        assert_eq!(handle.join().unwrap(), 42);
    }

    #[test]
    fn a_panic_keeps_its_payload() {
        let (handle, task) = pair(|| -> u32 { std::panic::panic_any(vec![1u16, 2]) });
        assert_eq!(
            task.run().as_deref(),
            Some("panic with a non-string payload")
        );
        let err = handle.join().unwrap_err();
        assert!(err.ran());
        assert_eq!(err.message, "panic with a non-string payload");
        let payload = err.into_payload().unwrap();
        assert_eq!(payload.downcast_ref::<Vec<u16>>(), Some(&vec![1, 2]));
    }

    #[test]
    fn a_string_panic_keeps_message_and_payload() {
        let seven = std::hint::black_box(7);
        let (handle, task) = pair(move || -> () { panic!("boom {seven}") });
        assert_eq!(task.run().as_deref(), Some("boom 7"));
        let err = handle.join().unwrap_err();
        assert_eq!(err.message, "boom 7");
        assert_eq!(err.to_string(), "work item panicked: boom 7");
        assert_eq!(
            err.payload().and_then(|p| p.downcast_ref::<String>()),
            Some(&"boom 7".to_owned())
        );
    }

    #[test]
    fn dropped_without_running_says_so() {
        let (handle, task) = pair(|| 1);
        drop(task);
        let err = handle.join().unwrap_err();
        assert!(!err.ran());
        assert!(err.payload().is_none());
        assert_eq!(err.to_string(), "work item dropped without running");
    }

    #[test]
    fn a_blocked_join_is_woken_from_another_thread() {
        let (handle, task) = pair(|| "late");
        let runner = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            task.run()
        });
        assert_eq!(handle.join().unwrap(), "late");
        assert_eq!(runner.join().unwrap(), None);
    }
}

/// Loom model of the join protocol on the real `Spawned`:
/// `RUSTFLAGS="--cfg loom" cargo test -p podq --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// A runner completes the item while the handle waits: the handle always gets the
    /// value, never sleeping through the wake-up (loom reports a deadlock if it does).
    #[test]
    fn loom_join_sees_the_result_or_is_woken() {
        loom::model(|| {
            let (handle, task) = pair(|| 42);
            let runner = loom::thread::spawn(move || task.run());
            assert_eq!(handle.wait().unwrap(), 42);
            assert_eq!(runner.join().unwrap(), None);
        });
    }

    /// A task dropped unrun races with the handle: the handle gets "dropped without
    /// running".
    #[test]
    fn loom_abandoned_item_completes_the_handle() {
        loom::model(|| {
            let (handle, task) = pair(|| 1);
            let dropper = loom::thread::spawn(move || drop(task));
            assert!(!handle.wait().unwrap_err().ran());
            dropper.join().unwrap();
        });
    }
}
