//! `JoinHandle`: the result of a one-shot item, awaited by blocking or as a `Future`.
//!
//! A spawned item is one allocation: the closure, the result slot and the waiter live
//! in one [`Spawned`] block, shared by the queue entry ([`OnceTask`]) and the handle.
//! Completing it takes one uncontended lock and no system call unless someone waits.
//!
//! Legend: D guarded by `Spawned::f` (taken once, by the entry's owner); O guarded by
//! `Spawned::slot`.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::sync::lock_std as lock;
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
    /// A blocked `join()`.
    Thread(std::thread::Thread),
    /// A polled `Future`.
    Task(Waker),
}

/// Everything the slot lock guards (all O).
struct Slot<T> {
    /// The result, once the item finished (taken by the handle).
    result: Option<Result<T, Panicked>>,
    /// Set once a result was stored (the result itself may have been taken since).
    done: bool,
    /// Whom to wake when it arrives.
    waiter: Waiter,
}

/// The one block of a spawned item.
struct Spawned<F, T> {
    /// D: the closure, until it runs or is dropped.
    f: Mutex<Option<F>>,
    /// O: result and waiter.
    slot: Mutex<Slot<T>>,
}

impl<F, T> Spawned<F, T> {
    fn complete(&self, result: Result<T, Panicked>) {
        let mut slot = lock(&self.slot);
        if slot.done {
            return;
        }
        slot.result = Some(result);
        slot.done = true;
        let waiter = std::mem::replace(&mut slot.waiter, Waiter::None);
        drop(slot);
        match waiter {
            Waiter::None => {}
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(w) => w.wake(),
        }
    }
}

/// The queue side of a spawned item, type-erased.
trait RunOnce: Send + Sync {
    /// Runs the closure (once); returns its panic message if it panicked.
    fn run(&self) -> Option<String>;
    /// The entry is dropped without running: completes the handle with that error.
    fn abandon(&self);
}

impl<F, T> RunOnce for Spawned<F, T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    fn run(&self) -> Option<String> {
        let f = lock(&self.f).take()?;
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

    fn abandon(&self) {
        if lock(&self.f).take().is_some() {
            self.complete(Err(Panicked {
                message: "dropped without running".to_owned(),
                payload: None,
            }));
        }
    }
}

/// The handle side of a spawned item, type-erased over the closure.
trait Joinable<T>: Send + Sync {
    fn slot(&self) -> &Mutex<Slot<T>>;
}

impl<F, T> Joinable<T> for Spawned<F, T>
where
    F: Send,
    T: Send,
{
    fn slot(&self) -> &Mutex<Slot<T>> {
        &self.slot
    }
}

/// A spawned item as it travels through a workqueue. Dropped without [`OnceTask::run`]
/// (refused, or lost with its workqueue), it completes the handle with an error.
pub(crate) struct OnceTask(Option<Arc<dyn RunOnce>>, Option<Arc<str>>);

impl OnceTask {
    /// Runs the item; returns its panic message if it panicked.
    pub(crate) fn run(mut self) -> Option<String> {
        let _label = crate::current::Labelled::new(self.1.as_ref());
        self.0.take().and_then(|spawned| spawned.run())
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
        crate::blocking(|| loop {
            let mut slot = lock(self.shared.slot());
            if let Some(result) = slot.result.take() {
                return result;
            }
            slot.waiter = Waiter::Thread(std::thread::current());
            drop(slot);
            // Spurious wake-ups and stale unparks only loop once more.
            std::thread::park();
        })
    }

    /// Whether the item has finished.
    pub fn is_finished(&self) -> bool {
        lock(self.shared.slot()).done
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Panicked>;

    /// # Panics
    /// If polled again after it returned `Ready`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = lock(self.shared.slot());
        if let Some(result) = slot.result.take() {
            return Poll::Ready(result);
        }
        assert!(!slot.done, "JoinHandle polled after completion");
        match &slot.waiter {
            Waiter::Task(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waiter = Waiter::Task(cx.waker().clone()),
        }
        Poll::Pending
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
        f: Mutex::new(Some(f)),
        slot: Mutex::new(Slot {
            result: None,
            done: false,
            waiter: Waiter::None,
        }),
    });
    let task: Arc<dyn RunOnce> = spawned.clone();
    (JoinHandle { shared: spawned }, OnceTask(Some(task), label))
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
