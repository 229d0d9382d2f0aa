//! `JoinHandle`: the result of a one-shot item, awaited by blocking or as a `Future`.
//!
//! A spawned item is one allocation: the closure, the result and the waiter live in
//! one [`Spawned`] block, shared by the queue entry ([`OnceTask`]) and the handle. The
//! block's reference count is two bits of its state word, so a fire-and-forget item
//! (handle dropped before it runs) costs one locked instruction in all: the handle's
//! drop.
//!
//! Protocol, on one state word (`DONE`, `WAITING`, and the references `TASK`, `HANDLE`):
//! 1. The task is unique (an entry, not cloned), so its holder owns the closure: it
//!    runs it (or drops it unrun, completing the handle with "dropped without
//!    running").
//! 2. Completing: if only `TASK` is left, nobody will read the result: the task frees
//!    the block without a write. Otherwise it writes the result, then sets `DONE` and
//!    clears `TASK` in one CAS. If `WAITING` is set, it sets `DONE` first, wakes the
//!    waiter under the waiter lock, and clears `TASK` only then, so the handle cannot
//!    free the block under the wake-up.
//! 3. The handle takes the result once it sees `DONE`. To wait, it stores its waiter
//!    (thread or task waker) under the waiter lock, then `fetch_or(WAITING)`; if that
//!    shows `DONE`, it takes the result instead of sleeping. Dropping it clears
//!    `HANDLE`.
//! 4. Whoever clears the last reference frees the block.
//!
//! Races considered: the completer's setting of `DONE` and the waiter's
//! `fetch_or(WAITING)` are ordered on the same word, so either the completer sees
//! `WAITING` (and the waiter stored before it) or the waiter sees `DONE`: no lost
//! wake-up. The two references are cleared on that word too, so exactly one side
//! sees the other gone and frees. Loom models: `loom_join_sees_the_result_or_is_woken`,
//! `loom_abandoned_item_completes_the_handle`, `loom_a_detached_item_is_freed_once`.
//!
//! Legend: A atomic; D owned by the task's holder; O written by the completer before
//! `DONE`, then only by the handle; V guarded by `Spawned::waiter`.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::NonNull;
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

/// `Spawned::state`: the result is in `Spawned::result`.
const DONE: u32 = 1;
/// `Spawned::state`: a waiter is registered in `Spawned::waiter`.
const WAITING: u32 = 2;
/// `Spawned::state`: the queue entry's reference ([`OnceTask`]) is alive.
const TASK: u32 = 4;
/// `Spawned::state`: the handle's reference ([`JoinHandle`]) is alive.
const HANDLE: u32 = 8;

/// The shared block of a spawned item: closure, result, waiter and the two references
/// in one allocation. Running and completing it take no lock unless someone waits
/// (protocol in the module docs).
struct Spawned<F, T> {
    /// A: [`DONE`], [`WAITING`], [`TASK`] and [`HANDLE`]. Written with `AcqRel`
    /// read-modify-writes: setting `DONE` releases the result written before it and
    /// pairs with the handle's `Acquire` load (or its `fetch_or` of `WAITING`) that sees
    /// `DONE`; clearing a reference releases that side's last accesses and pairs with
    /// the other side's `Acquire` read that finds it cleared before freeing; the
    /// `DONE`/`WAITING` and the two reference updates are ordered on this one word, so
    /// exactly one side sees the other (module docs).
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

// SAFETY: the closure is touched only by the task's holder (D), the result by the
// completer before `DONE` and by the single handle after it (O), and the waiter under
// its lock; `F` and `T` move between threads, so they must be `Send`, and nothing is
// shared by reference.
unsafe impl<F: Send, T: Send> Sync for Spawned<F, T> {}

impl<F, T> Spawned<F, T> {
    /// The task's end: completes the handle with `result` and drops the task's
    /// reference. Returns whether that was the last reference (the caller frees the
    /// block). Called once, by the task's holder.
    fn finish(&self, result: Result<T, Panicked>) -> bool {
        let mut state = self.state.load(Acquire);
        if state & HANDLE == 0 {
            // The handle is gone (its clearing of `HANDLE` pairs with this load):
            // nobody reads the result.
            return true;
        }
        // SAFETY: `DONE` is not set and only the task's holder completes, so nobody
        // else reads or writes the result now (O).
        self.result
            .with_mut(|r| unsafe { *r = Some(result.map_err(Box::new)) });
        while state & WAITING == 0 {
            if state & HANDLE == 0 {
                return true; // dropped meanwhile: the result goes with the block
            }
            match self
                .state
                .compare_exchange_weak(state, (state | DONE) & !TASK, AcqRel, Acquire)
            {
                Ok(_) => return false,
                Err(now) => state = now,
            }
        }
        // A waiter: publish, wake it, and only then drop the reference, so that the
        // handle cannot free the block under the wake-up.
        self.state.fetch_or(DONE, AcqRel);
        let waiter = std::mem::replace(&mut *lock(&self.waiter), Waiter::None);
        waiter.wake();
        self.state.fetch_and(!TASK, AcqRel) & HANDLE == 0
    }

    /// Takes the closure (D: only the task's holder calls this).
    fn take_closure(&self) -> Option<F> {
        // SAFETY: the task's holder alone owns the closure (D).
        self.f.with_mut(|f| unsafe { (*f).take() })
    }
}

/// What a queue entry does with its spawned item. Each method ends the task's
/// reference and returns whether it was the last one: the caller then frees the block
/// (after the borrow of it ended).
trait RunOnce: Send + Sync {
    /// Runs it; returns the panic message if it panicked.
    fn run(&self) -> (Option<String>, bool);
    /// It will never run: completes the handle with an error.
    fn abandon(&self) -> bool;
}

impl<F, T> RunOnce for Spawned<F, T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    fn run(&self) -> (Option<String>, bool) {
        let Some(f) = self.take_closure() else {
            unreachable!("a task runs once: `OnceTask::run` consumes it")
        };
        let outcome = {
            let _label = crate::current::Labelled::new(self.label.as_ref());
            catch_unwind(AssertUnwindSafe(f))
        };
        match outcome {
            Ok(v) => (None, self.finish(Ok(v))),
            Err(payload) => {
                let message = panic_message(&*payload);
                let last = self.finish(Err(Panicked {
                    message: message.clone(),
                    payload: Some(payload),
                }));
                (Some(message), last)
            }
        }
    }

    fn abandon(&self) -> bool {
        drop(self.take_closure());
        self.finish(Err(Panicked {
            message: "dropped without running".to_owned(),
            payload: None,
        }))
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
    /// Drops the handle's reference; returns whether it was the last one (the caller
    /// frees the block).
    fn release(&self) -> bool;
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

    fn release(&self) -> bool {
        self.state.fetch_and(!HANDLE, AcqRel) & TASK == 0
    }
}

/// A spawned item as it travels through a workqueue. Dropped without [`OnceTask::run`]
/// (refused, or lost with its workqueue), it completes the handle with an error.
pub(crate) struct OnceTask(Option<NonNull<dyn RunOnce>>);

// SAFETY: the pointer is the task's reference to a `Spawned` block that is `Send +
// Sync` (`RunOnce`'s bounds); the task is not cloned, so moving it moves that
// reference.
unsafe impl Send for OnceTask {}

impl OnceTask {
    /// Runs the item; returns its panic message if it panicked.
    pub(crate) fn run(mut self) -> Option<String> {
        let block = self.0.take()?;
        // SAFETY: the task's reference (`TASK`) keeps the block alive until `run`
        // returns; the block is freed below only if that was the last reference.
        let (message, last) = unsafe { block.as_ref() }.run();
        if last {
            // SAFETY: the last reference is gone; the block came from `Box::leak`.
            drop(unsafe { Box::from_raw(block.as_ptr()) });
        }
        message
    }
}

impl Drop for OnceTask {
    fn drop(&mut self) {
        if let Some(block) = self.0.take() {
            // SAFETY: as in `run`.
            if unsafe { block.as_ref() }.abandon() {
                // SAFETY: as in `run`.
                drop(unsafe { Box::from_raw(block.as_ptr()) });
            }
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
    /// The handle's reference (`HANDLE`) to the item's block.
    shared: NonNull<dyn Joinable<T>>,
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

// SAFETY: the block is `Send + Sync` (`Joinable`'s bounds) and the handle's methods
// move the result out only by value; `T: Send` lets that result cross threads.
unsafe impl<T: Send> Send for JoinHandle<T> {}
// SAFETY: as for `Send`; through `&JoinHandle` only `is_finished` (an atomic load) runs.
unsafe impl<T: Send> Sync for JoinHandle<T> {}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        if self.shared().release() {
            // SAFETY: the last reference is gone; the block came from `Box::leak`.
            drop(unsafe { Box::from_raw(self.shared.as_ptr()) });
        }
    }
}

impl<T> JoinHandle<T> {
    fn shared(&self) -> &dyn Joinable<T> {
        // SAFETY: the handle's reference (`HANDLE`) keeps the block alive until `drop`.
        unsafe { self.shared.as_ref() }
    }

    /// Waits for the item and returns its value, or the panic it raised.
    pub fn join(self) -> Result<T, Panicked> {
        crate::blocking(|| self.wait())
    }

    /// The wait of [`JoinHandle::join`], outside `blocking`.
    fn wait(self) -> Result<T, Panicked> {
        loop {
            if let Some(result) = self.shared().take_result() {
                return result;
            }
            if self.shared().wait_with(Waiter::Thread(thread::current())) {
                // Spurious wake-ups and stale unparks only loop once more.
                thread::park();
            }
        }
    }

    /// Whether the item has finished.
    pub fn is_finished(&self) -> bool {
        self.shared().done()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Panicked>;

    /// # Panics
    /// If polled again after it returned `Ready`.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        assert!(!self.claimed, "JoinHandle polled after completion");
        loop {
            if let Some(result) = self.shared().take_result() {
                self.claimed = true;
                return Poll::Ready(result);
            }
            if self.shared().wait_with(Waiter::Task(cx.waker().clone())) {
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
    let block = NonNull::from(Box::leak(Box::new(Spawned {
        state: AtomicU32::new(TASK | HANDLE),
        f: UnsafeCell::new(Some(f)),
        result: UnsafeCell::new(None),
        waiter: Mutex::new(Waiter::None),
        label,
    })));
    (
        JoinHandle {
            shared: block,
            claimed: false,
        },
        OnceTask(Some(block)),
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

    /// Counts its drops: a result dropped twice, or leaked, shows in the count.
    struct Counted(Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_detached_result_is_dropped_once_whichever_side_goes_last() {
        for handle_first in [true, false] {
            let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = Counted(Arc::clone(&drops));
            let (handle, task) = pair(move || counted);
            if handle_first {
                drop(handle);
                assert_eq!(task.run(), None);
            } else {
                assert_eq!(task.run(), None);
                assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 0);
                drop(handle);
            }
            assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
            assert_eq!(Arc::strong_count(&drops), 1, "the result was not freed");
        }
    }

    #[test]
    fn a_polled_then_dropped_handle_still_frees_the_item() {
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Counted(Arc::clone(&drops));
        let (mut handle, task) = pair(move || counted);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(Pin::new(&mut handle).poll(&mut cx).is_pending());
        drop(handle);
        assert_eq!(task.run(), None);
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&drops), 1);
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

    /// The handle is dropped while the item runs: the result is dropped exactly once,
    /// by whichever side lets go of the block last.
    #[test]
    fn loom_a_detached_item_is_freed_once() {
        struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        loom::model(|| {
            let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = Counted(std::sync::Arc::clone(&drops));
            let (handle, task) = pair(move || counted);
            let runner = loom::thread::spawn(move || task.run());
            drop(handle);
            assert_eq!(runner.join().unwrap(), None);
            assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
        });
    }
}
