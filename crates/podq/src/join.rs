//! `JoinHandle`: the result of a one-shot item, awaited by blocking or as a `Future`.
//!
//! Legend: O guarded by `Shared::slot`.

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use std::sync::{Arc, Condvar, Mutex};

use crate::sync::{lock_std as lock, wait_std as wait};
use crate::work::panic_message;

/// A one-shot item panicked (or was dropped without running); the payload's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Panicked {
    /// The panic message.
    pub message: String,
}

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work item panicked: {}", self.message)
    }
}

impl std::error::Error for Panicked {}

/// Everything the slot lock guards (all O).
struct Slot<T> {
    /// The result, once the item finished.
    result: Option<Result<T, Panicked>>,
    /// The task to wake when it arrives (the `Future` side).
    waker: Option<Waker>,
}

struct Shared<T> {
    /// O: result and waker.
    slot: Mutex<Slot<T>>,
    /// O: signalled when the result arrives (the blocking side).
    done: Condvar,
}

impl<T> Shared<T> {
    fn complete(&self, result: Result<T, Panicked>) {
        let mut slot = lock(&self.slot);
        if slot.result.is_some() {
            return;
        }
        slot.result = Some(result);
        let waker = slot.waker.take();
        drop(slot);
        self.done.notify_all();
        if let Some(w) = waker {
            w.wake();
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
/// let bad = wq.spawn(|| -> u32 { panic!("boom") });
/// assert_eq!(ok.join().unwrap(), "done");
/// assert_eq!(bad.join().unwrap_err().message, "boom");
/// ```
pub struct JoinHandle<T> {
    shared: Arc<Shared<T>>,
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
        crate::blocking(|| {
            let mut slot = lock(&self.shared.slot);
            loop {
                if let Some(result) = slot.result.take() {
                    return result;
                }
                slot = wait(&self.shared.done, slot);
            }
        })
    }

    /// Whether the item has finished.
    pub fn is_finished(&self) -> bool {
        lock(&self.shared.slot).result.is_some()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, Panicked>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = lock(&self.shared.slot);
        if let Some(result) = slot.result.take() {
            return Poll::Ready(result);
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// Completes the handle with an error if the task is dropped without running.
struct Completer<T>(Arc<Shared<T>>);

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        self.0.complete(Err(Panicked {
            message: "dropped without running".to_owned(),
        }));
    }
}

/// The handle and the task for a one-shot closure. The task returns the panic message
/// if `f` panicked.
pub(crate) fn pair<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> (JoinHandle<T>, Box<dyn FnOnce() -> Option<String> + Send>) {
    let shared = Arc::new(Shared {
        slot: Mutex::new(Slot {
            result: None,
            waker: None,
        }),
        done: Condvar::new(),
    });
    let completer = Completer(Arc::clone(&shared));
    let task = Box::new(move || {
        let outcome = catch_unwind(AssertUnwindSafe(f));
        let (result, message) = match outcome {
            Ok(v) => (Ok(v), None),
            Err(p) => {
                let message = panic_message(&*p);
                (
                    Err(Panicked {
                        message: message.clone(),
                    }),
                    Some(message),
                )
            }
        };
        completer.0.complete(result);
        message
    });
    (JoinHandle { shared }, task)
}
