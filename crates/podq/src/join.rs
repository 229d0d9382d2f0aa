//! `JoinHandle`: the result of a one-shot item, awaited by blocking or as a `Future`.
//!
//! A spawned item is one allocation: the closure, the result and the waiter live in
//! one [`Spawned`] block, shared by the queue entry ([`OnceTask`]) and the handle. The
//! block's reference count is two bits of its state word, so a fire-and-forget item
//! (handle dropped before it runs) costs one locked instruction in all: the handle's
//! drop. An item with no handle at all (`Workqueue::execute`) has no block of this
//! kind: its closure travels in the entry itself, or alone in a block of its own
//! (`once.rs`).
//!
//! Protocol, on one state word (`DONE`, `RESULT`, `WAITER_LOCK`, and the references
//! `TASK`, `HANDLE`) and one slot that holds the waiter until the item is done and the
//! result after (sharing the slot keeps the block of an 8-byte closure at 24 bytes, an
//! allocator size class below the 40 that separate fields took, which a flood of
//! spawns runs measurably faster with: `PERFORMANCE.md`, "A spawned block's size, and
//! the inactive list through the blocks"):
//! 1. The task is unique (an entry, not cloned), so its holder owns the closure: it
//!    runs it (or drops it unrun, completing the handle with "dropped without
//!    running").
//! 2. Completing: if `HANDLE` is clear, nobody will read the result: the task frees
//!    the block without a write. Otherwise it takes `WAITER_LOCK`, takes the waiter out
//!    of the slot, writes the result there, and in one update sets `DONE | RESULT` and
//!    clears `WAITER_LOCK` and `TASK`; then it wakes the waiter it took (which it owns:
//!    the handle may free the block meanwhile).
//! 3. The handle takes the result once it sees `RESULT` (clearing it, so the block
//!    does not drop it). To wait, it stores its waiter in the slot under
//!    `WAITER_LOCK`, unless that shows `DONE`: then it takes the result instead of
//!    sleeping. A timed wait that gives up takes its waiter back out under
//!    `WAITER_LOCK`, so that no completer wakes it later. Dropping the handle clears
//!    `HANDLE`.
//! 4. Whoever clears the last reference frees the block, dropping the result if
//!    `RESULT` is still set, or the waiter if `DONE` is not.
//!
//! `WAITER_LOCK` is a spin lock in the state word, held only to move a waiter or a
//! result in or out (clones and drops of wakers happen outside it): a `Mutex` would add
//! 8 bytes to every spawned item.
//!
//! Races considered: the slot changes hands only under `WAITER_LOCK`, and `DONE` is
//! set as that lock is let go, so a waiter either stores its waiter before the
//! completer takes the lock (and is woken) or sees `DONE` (and does not sleep): no
//! lost wake-up. The two references are cleared on the state word, so exactly one side
//! sees the other gone and frees. Loom models:
//! `loom_join_sees_the_result_or_is_woken`, `loom_a_polled_handle_is_woken`,
//! `loom_a_timed_wait_gives_its_waker_back`,
//! `loom_abandoned_item_completes_the_handle`, `loom_a_detached_item_is_freed_once`.
//!
//! Legend: A atomic; D owned by the task's holder; I immutable; V guarded by
//! `WAITER_LOCK` until `DONE`, then only the handle's.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll, Waker};

use crate::sync::Ordering::{AcqRel, Acquire, Release};
use std::sync::Arc;

use crate::once::OnceTask;
use crate::sync::{spin_wait, thread, AtomicU32, UnsafeCell};
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

/// Whom a finished item wakes: a thread blocked in [`JoinHandle::join`] or a task that
/// polled the handle. Behind one pointer, so that it shares the block's slot with the
/// result.
enum Wakeup {
    Thread(thread::Thread),
    Task(Waker),
}

impl Wakeup {
    fn wake(&self) {
        match self {
            Wakeup::Thread(thread) => thread.unpark(),
            Wakeup::Task(waker) => waker.wake_by_ref(),
        }
    }
}

/// Who registers to be woken.
#[derive(Clone, Copy)]
enum Waiter<'a> {
    /// A blocked thread, with its wake-up ([`thread_wakeup`]).
    Thread(&'a Arc<Wakeup>),
    /// A polling task.
    Task(&'a Waker),
}

impl Waiter<'_> {
    /// Whether `held` wakes this waiter already.
    fn is(self, held: &Arc<Wakeup>) -> bool {
        match (self, &**held) {
            (Waiter::Thread(mine), _) => Arc::ptr_eq(mine, held),
            (Waiter::Task(waker), Wakeup::Task(held)) => held.will_wake(waker),
            (Waiter::Task(_), Wakeup::Thread(_)) => false,
        }
    }

    /// The wake-up to store (a task's waker is cloned: call it outside the lock).
    fn wakeup(self) -> Arc<Wakeup> {
        match self {
            Waiter::Thread(wakeup) => Arc::clone(wakeup),
            Waiter::Task(waker) => Arc::new(Wakeup::Task(waker.clone())),
        }
    }
}

/// The calling thread's wake-up: made once per thread (a blocked join allocates
/// nothing), except under loom, whose threads share thread-locals.
fn thread_wakeup() -> Arc<Wakeup> {
    let fresh = || Arc::new(Wakeup::Thread(thread::current()));
    #[cfg(not(loom))]
    {
        thread_local! {
            static WAKEUP: Arc<Wakeup> = Arc::new(Wakeup::Thread(thread::current()));
        }
        // A join from another thread-local's destructor makes its own.
        WAKEUP.try_with(Arc::clone).unwrap_or_else(|_| fresh())
    }
    #[cfg(loom)]
    fresh()
}

/// `Spawned::state`: the item finished (ran, panicked or was dropped unrun).
const DONE: u32 = 1;
/// `Spawned::state`: the queue entry's reference ([`OnceTask`]) is alive.
const TASK: u32 = 4;
/// `Spawned::state`: the handle's reference ([`JoinHandle`]) is alive.
const HANDLE: u32 = 8;
/// `Spawned::state`: the result is in `Spawned::slot`, not taken yet.
const RESULT: u32 = 16;
/// `Spawned::state`: the slot's lock (held to move a waiter or the result in or out).
const WAITER_LOCK: u32 = 32;

/// Whether a spawned item carries a label, as part of its block's type: an unlabelled
/// block has no field for one.
trait Label: Send + Sync + 'static {
    fn label(&self) -> Option<&Arc<str>>;
}

impl Label for () {
    fn label(&self) -> Option<&Arc<str>> {
        None
    }
}

impl Label for Arc<str> {
    fn label(&self) -> Option<&Arc<str>> {
        Some(self)
    }
}

/// The shared block of a spawned item: closure, the slot for the waiter and then the
/// result, and the two references in one allocation, 24 bytes with an 8-byte closure
/// and no result (`a_spawned_block_is_small`). Running and completing it take no lock
/// unless the handle is still there (protocol in the module docs).
struct Spawned<F, T, L> {
    /// A: [`DONE`], [`TASK`], [`HANDLE`], [`RESULT`], [`WAITER_LOCK`]. Written with
    /// read-modify-writes: taking `WAITER_LOCK` (`Acquire`) pairs with its release, the
    /// `Release` update that lets it go (a completer's also sets `DONE | RESULT`,
    /// publishing the result for the handle's `Acquire` load that sees them); clearing
    /// a reference (`AcqRel`) releases that side's last accesses and pairs with the
    /// other side's `Acquire` read that finds it cleared before freeing. All of these
    /// are ordered on this one word, so exactly one side sees the other (module docs).
    state: AtomicU32,
    /// D: the closure, read out once by the task's holder (`run` or `abandon`), so
    /// never there when the block is freed.
    f: UnsafeCell<MaybeUninit<F>>,
    /// V: the waiter until `DONE`, then the result (there while `RESULT` is set).
    slot: UnsafeCell<Slot<T>>,
    /// I: the label [`crate::current()`] reports while it runs.
    label: L,
}

/// A spawned block's slot: who waits for the item until it is done, then its result
/// (a panic boxed, so that the slot stays one word for the usual case).
union Slot<T> {
    waiter: ManuallyDrop<Option<Arc<Wakeup>>>,
    result: ManuallyDrop<Result<T, Box<Panicked>>>,
}

// SAFETY: the closure is touched only by the task's holder (D), and the slot under
// `WAITER_LOCK` until `DONE`, then only by the single handle (V); `F` and `T` move
// between threads, so they must be `Send`, and nothing is shared by reference.
unsafe impl<F: Send, T: Send, L: Label> Sync for Spawned<F, T, L> {}

impl<F, T, L> Drop for Spawned<F, T, L> {
    fn drop(&mut self) {
        // The last reference was let go with an `AcqRel` update of `state`, which this
        // `Acquire` load follows: it sees what the slot holds.
        let state = self.state.load(Acquire);
        self.slot.with_mut(|slot| {
            if state & DONE == 0 {
                // SAFETY: not done: the slot holds the waiter (V); the block is ours.
                unsafe { ManuallyDrop::drop(&mut (*slot).waiter) }
            } else if state & RESULT != 0 {
                // SAFETY: `RESULT` says the result was written and not taken.
                unsafe { ManuallyDrop::drop(&mut (*slot).result) }
            }
        });
    }
}

impl<F, T, L> Spawned<F, T, L> {
    /// The task's end: completes the handle with `result` and drops the task's
    /// reference. Returns whether that was the last reference (the caller frees the
    /// block). Called once, by the task's holder.
    fn finish(&self, result: Result<T, Panicked>) -> bool {
        if self.state.load(Acquire) & HANDLE == 0 {
            // The handle is gone (its clearing of `HANDLE` pairs with this load):
            // nobody reads the result.
            return true;
        }
        let mut state = self.lock_slot();
        // SAFETY: `WAITER_LOCK` is held and `DONE` is not set (only the task's holder
        // sets it, once): the slot holds the waiter, and no one else touches it (V).
        let waiter = self.slot.with_mut(|slot| unsafe {
            let waiter = ManuallyDrop::take(&mut (*slot).waiter);
            (*slot).result = ManuallyDrop::new(result.map_err(Box::new));
            waiter
        });
        // Publishes the result as it lets the lock go, and drops the task's reference.
        loop {
            let done = (state | DONE | RESULT) & !(WAITER_LOCK | TASK);
            match self
                .state
                .compare_exchange_weak(state, done, AcqRel, Acquire)
            {
                Ok(_) => break,
                Err(now) => state = now,
            }
        }
        // Ours now: the handle may free the block meanwhile.
        if let Some(waiter) = waiter {
            waiter.wake();
        }
        state & HANDLE == 0
    }

    /// Takes the closure (D: only the task's holder calls this, once).
    fn take_closure(&self) -> F {
        // SAFETY: written when the block was made; the task's holder alone reads it,
        // once (D), and the block never drops it.
        self.f.with_mut(|f| unsafe { (*f).assume_init_read() })
    }

    /// Runs `f` on the waiter under `WAITER_LOCK`, unless the item is done (then the
    /// slot holds the result: `None`).
    fn with_waiter<R>(&self, f: impl FnOnce(&mut Option<Arc<Wakeup>>) -> R) -> Option<R> {
        let state = self.lock_slot();
        let r = (state & DONE == 0).then(|| {
            // SAFETY: `WAITER_LOCK` is held and the item is not done: the slot holds
            // the waiter (V).
            self.slot.with_mut(|slot| f(unsafe { &mut (*slot).waiter }))
        });
        self.state.fetch_and(!WAITER_LOCK, Release);
        r
    }

    /// Takes `WAITER_LOCK`: held only to move a waiter or the result (no user code runs
    /// under it), so a short spin. Returns the state word with the lock taken.
    fn lock_slot(&self) -> u32 {
        let mut spins = 0;
        loop {
            let state = self.state.fetch_or(WAITER_LOCK, Acquire);
            if state & WAITER_LOCK == 0 {
                return state | WAITER_LOCK;
            }
            spin_wait(&mut spins);
        }
    }
}

/// What a queue entry does with its spawned item. Each method ends the task's
/// reference and returns whether it was the last one: the caller then frees the block
/// (after the borrow of it ended).
pub(crate) trait RunOnce: Send + Sync {
    /// Runs it; returns the panic message if it panicked.
    fn run(&self) -> (Option<String>, bool);
    /// It will never run: completes the handle with an error.
    fn abandon(&self) -> bool;
    /// Its label, for the trace events.
    #[cfg(feature = "tracing")]
    fn label(&self) -> Option<&Arc<str>>;
}

impl<F, T, L> RunOnce for Spawned<F, T, L>
where
    F: FnOnce() -> T + Send,
    T: Send,
    L: Label,
{
    fn run(&self) -> (Option<String>, bool) {
        let f = self.take_closure();
        let outcome = {
            let _label = crate::current::Labelled::new(self.label.label());
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

    #[cfg(feature = "tracing")]
    fn label(&self) -> Option<&Arc<str>> {
        self.label.label()
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
    fn wait_with(&self, waiter: Waiter<'_>) -> bool;
    /// Takes `waiter` back out if it is the one registered (a timed wait gave up).
    fn forget_waiter(&self, waiter: Waiter<'_>);
    /// Whether the item is done.
    fn done(&self) -> bool;
    /// Drops the handle's reference; returns whether it was the last one (the caller
    /// frees the block).
    fn release(&self) -> bool;
}

impl<F, T, L> Joinable<T> for Spawned<F, T, L>
where
    F: Send,
    T: Send,
    L: Label,
{
    fn take_result(&self) -> Option<Result<T, Panicked>> {
        if self.state.load(Acquire) & RESULT == 0 {
            return None;
        }
        // Cleared first, so that the block does not drop the result too.
        self.state.fetch_and(!RESULT, AcqRel);
        // SAFETY: `RESULT` was set (`Acquire` above): the completer wrote the result and
        // will not touch the slot again; only the one handle takes it, once (V).
        let result = self
            .slot
            .with_mut(|slot| unsafe { ManuallyDrop::take(&mut (*slot).result) });
        Some(result.map_err(|panicked| *panicked))
    }

    fn wait_with(&self, waiter: Waiter<'_>) -> bool {
        // Made and the old one dropped outside the lock: both may run a waker's code.
        match self.with_waiter(|slot| slot.as_ref().is_some_and(|held| waiter.is(held))) {
            None => return false,
            Some(true) => return true,
            Some(false) => {}
        }
        let new = waiter.wakeup();
        match self.with_waiter(|slot| slot.replace(new)) {
            Some(old) => {
                drop(old);
                true
            }
            None => false,
        }
    }

    fn forget_waiter(&self, waiter: Waiter<'_>) {
        // Dropped outside the lock, as in `wait_with`. A completer that has not taken
        // the slot yet then finds it empty; one that has woke it already.
        let mine = self.with_waiter(|slot| {
            let mine = slot.as_ref().is_some_and(|held| waiter.is(held));
            mine.then(|| slot.take()).flatten()
        });
        drop(mine);
    }

    fn done(&self) -> bool {
        self.state.load(Acquire) & DONE != 0
    }

    fn release(&self) -> bool {
        self.state.fetch_and(!HANDLE, AcqRel) & TASK == 0
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
            self.park_until(None);
        }
    }

    /// Parks the calling thread until the item is done or `deadline` passes (`None`:
    /// no deadline); returns whether it is done. Giving up takes the waker back out.
    fn park_until(&self, deadline: Option<std::time::Instant>) -> bool {
        let mut wakeup = None;
        loop {
            let left = deadline.map(|at| at.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|left| left.is_zero()) {
                if let Some(wakeup) = &wakeup {
                    self.shared().forget_waiter(Waiter::Thread(wakeup));
                }
                return self.is_finished();
            }
            let wakeup = wakeup.get_or_insert_with(thread_wakeup);
            if !self.shared().wait_with(Waiter::Thread(wakeup)) {
                return true;
            }
            // Spurious wake-ups and stale unparks only loop once more.
            match left {
                Some(left) => thread::park_timeout(left),
                None => thread::park(),
            }
        }
    }

    /// Whether the item has finished.
    pub fn is_finished(&self) -> bool {
        self.shared().done()
    }

    /// Waits up to `timeout` for the item to finish; returns whether it has. The handle
    /// stays: [`JoinHandle::join`] then returns at once. Inside a work item the wait
    /// counts as [`crate::blocking`], as `join` does.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let wq = podq::Workqueue::builder("doc-wait-timeout").build()?;
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let mut item = wq.spawn(move || rx.recv().is_ok());
    /// assert!(!item.wait_timeout(Duration::from_millis(10)), "still waiting");
    /// tx.send(()).unwrap();
    /// assert!(item.wait_timeout(Duration::from_secs(60)));
    /// assert!(item.join()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(&mut self, timeout: std::time::Duration) -> bool {
        if self.is_finished() {
            return true;
        }
        // Past the clock's range: as good as forever.
        let deadline = std::time::Instant::now().checked_add(timeout);
        crate::blocking(|| self.park_until(deadline))
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
            if self.shared().wait_with(Waiter::Task(cx.waker())) {
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

/// As [`pair`], the item labelled `label` ([`crate::current()`]).
pub(crate) fn pair_named<T: Send + 'static>(
    label: Option<Arc<str>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> (JoinHandle<T>, OnceTask) {
    match label {
        Some(label) => pair_in(label, f),
        None => pair_in((), f),
    }
}

/// The block for `f` with `label`, and its two references.
fn pair_in<T: Send + 'static, L: Label>(
    label: L,
    f: impl FnOnce() -> T + Send + 'static,
) -> (JoinHandle<T>, OnceTask) {
    let block = new_block(TASK | HANDLE, label, f);
    (
        JoinHandle {
            shared: block,
            claimed: false,
        },
        OnceTask::block(block),
    )
}

/// A leaked block for `f` with `label`, holding the references in `state`.
fn new_block<F, T, L>(state: u32, label: L, f: F) -> NonNull<Spawned<F, T, L>> {
    NonNull::from(Box::leak(Box::new(Spawned {
        state: AtomicU32::new(state),
        f: UnsafeCell::new(MaybeUninit::new(f)),
        slot: UnsafeCell::new(Slot {
            waiter: ManuallyDrop::new(None),
        }),
        label,
    })))
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

    /// The memory target of a queued spawn (`podq bench memory`) rests on this: state,
    /// one slot for the waiter and then the result, no label field, the closure inline.
    #[test]
    fn a_spawned_block_is_small() {
        let seq = std::hint::black_box(7u64);
        let f = move || {
            std::hint::black_box(seq);
        };
        fn size_of_block<F, L>(_: &F, _: L) -> usize {
            std::mem::size_of::<Spawned<F, (), L>>()
        }
        // 4 (state, padded to 8) + 8 (closure) + 8 (the slot: waiter, then result).
        assert_eq!(size_of_block(&f, ()), 24);
        assert_eq!(size_of_block(&f, Arc::<str>::from("x")), 40);
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
    use std::task::Wake;

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

    /// A timed wait registers its waker and gives up (`JoinHandle::wait_timeout`)
    /// while the runner completes the item: the slot's accesses stay ordered (loom
    /// checks the cell), a later `join` still gets the value, never sleeping through
    /// the wake-up, and no completer unparks the thread after it: the model fails if
    /// giving up leaves its waiter in the slot (a late unpark wakes loom's `join` of
    /// the runner).
    #[test]
    fn loom_a_timed_wait_gives_its_waker_back() {
        // A waker that counts (loom's park and join share one notification per
        // thread, so a stale unpark would wake the model's `join` early).
        struct Count(crate::sync::AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, crate::sync::Ordering::Relaxed);
            }
        }
        loom::model(|| {
            let (handle, task) = pair(|| 3);
            let runner = loom::thread::spawn(move || task.run());
            let count = Arc::new(Count(crate::sync::AtomicUsize::new(0)));
            let waker = Waker::from(Arc::clone(&count));
            if handle.shared().wait_with(Waiter::Task(&waker)) {
                handle.shared().forget_waiter(Waiter::Task(&waker));
            }
            assert_eq!(handle.wait().unwrap(), 3);
            assert_eq!(runner.join().unwrap(), None);
            // The forgotten waker is woken only by a completer that took it first.
            assert!(count.0.load(crate::sync::Ordering::Relaxed) <= 1);
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

    /// A polled handle (its waker stored under `WAITER_LOCK`, possibly replaced on a
    /// second poll) races the completion: it gets the value, never sleeping through
    /// the wake-up (loom reports a deadlock if it does).
    #[test]
    fn loom_a_polled_handle_is_woken() {
        loom::model(|| {
            let (handle, task) = pair(|| 5);
            let runner = loom::thread::spawn(move || task.run());
            assert_eq!(loom::future::block_on(handle).unwrap(), 5);
            assert_eq!(runner.join().unwrap(), None);
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
