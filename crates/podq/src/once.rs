//! The task of a one-shot item as it travels in a queue entry ([`OnceTask`]): a
//! reference to a block on the heap, or a small closure held in the task itself.
//!
//! A spawned item's closure, result and waiter share one block with its handle
//! (`join.rs`), so a `spawn` is one allocation. An item with no handle
//! (`Workqueue::execute`) needs no block at all when its closure fits the task's two
//! words: it moves with its entry through the worklist and runs from there, and a
//! flood of such items calls the allocator neither in the queuer nor in the worker
//! (a closure allocated on one thread and freed on another misses both threads'
//! caches in the allocator: `PERFORMANCE.md`, "Small closures in the entry"). A larger
//! closure goes to a block that is the closure alone ([`Detached`]).
//!
//! Builds with the `tracing` feature keep every closure in a block: the events name
//! an item by its block's address, which an inline closure does not have (it moves
//! with its entry).
//!
//! Legend: I set when the task is made; D owned by the task's holder (it moves with
//! the task).

use std::marker::PhantomData;
use std::mem::{align_of, size_of, ManuallyDrop, MaybeUninit};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

#[cfg(feature = "tracing")]
use std::sync::Arc;

use crate::join::RunOnce;
use crate::sync::UnsafeCell;
use crate::work::panic_message;

/// What a task holds: a closure of up to two words, or a block's (fat) pointer.
type Data = MaybeUninit<[usize; 2]>;

// A block's pointer fits the task's data.
const _: () = assert!(
    size_of::<NonNull<dyn RunOnce>>() <= size_of::<Data>()
        && align_of::<NonNull<dyn RunOnce>>() <= align_of::<Data>()
);

/// How a task's data runs or goes: one table per kind of task.
struct Ops {
    /// Runs what the data holds, which it no longer holds after; returns the panic
    /// message if the item panicked.
    run: unsafe fn(*mut Data) -> Option<String>,
    /// Drops what the data holds without running it (refused, or lost with its
    /// workqueue).
    abandon: unsafe fn(*mut Data),
}

/// A one-shot item as it travels through a workqueue, in the three words of its
/// entry's task. Dropped without [`OnceTask::run`] (refused, or lost with its
/// workqueue), it drops its closure, and a spawned item's handle reports "dropped
/// without running".
pub(crate) struct OnceTask {
    /// I: how `data` runs or goes.
    ops: &'static Ops,
    /// D: the closure, or the block's pointer; read once, by `run` or the drop.
    data: Data,
}

// SAFETY: every task is made from a `Send` closure (`detached`'s bound) or a block
// that is `Send + Sync` (`RunOnce`'s bounds), and is not cloned, so moving it moves
// the closure or the block's reference.
unsafe impl Send for OnceTask {}

/// The table of a task that refers to a spawned or detached block.
static BLOCK: Ops = Ops {
    run: run_block,
    abandon: abandon_block,
};

/// The block `data` refers to.
///
/// # Safety
/// `data` holds a block's pointer (the task's `ops` is [`BLOCK`]), written by
/// [`OnceTask::block`].
unsafe fn block_of(data: *const Data) -> NonNull<dyn RunOnce> {
    // SAFETY: the caller's promise; `block` wrote a pointer of this type there.
    unsafe { data.cast::<NonNull<dyn RunOnce>>().read() }
}

/// # Safety
/// As [`block_of`]; the task's reference is given up here, once.
unsafe fn run_block(data: *mut Data) -> Option<String> {
    // SAFETY: the caller's promise.
    let block = unsafe { block_of(data) };
    // SAFETY: the task's reference (`join.rs`'s `TASK`) keeps the block alive until
    // `run` returns; the block is freed below only if that was the last reference.
    let (message, last) = unsafe { block.as_ref() }.run();
    // SAFETY: the borrow above ended; `last` is what the block's `run` returned.
    unsafe { free_if_last(block, last) };
    message
}

/// # Safety
/// As [`run_block`].
unsafe fn abandon_block(data: *mut Data) {
    // SAFETY: the caller's promise.
    let block = unsafe { block_of(data) };
    // SAFETY: as in `run_block`.
    let last = unsafe { block.as_ref() }.abandon();
    // SAFETY: as in `run_block`.
    unsafe { free_if_last(block, last) };
}

/// Frees `block` if the task's reference was its last.
///
/// # Safety
/// `last` is what the block's `run` or `abandon` returned, and no borrow of the block
/// is left.
unsafe fn free_if_last(block: NonNull<dyn RunOnce>, last: bool) {
    if last {
        // SAFETY: the last reference is gone; the block came from `Box::leak`.
        drop(unsafe { Box::from_raw(block.as_ptr()) });
    }
}

/// Runs a closure that no handle waits for; returns its panic message if it panicked.
/// Unlabelled: `crate::current()` reports no label, as between items.
fn run_unwatched(f: impl FnOnce()) -> Option<String> {
    catch_unwind(AssertUnwindSafe(f))
        .err()
        .map(|payload| panic_message(&*payload))
}

/// The table of a task that holds a closure of type `F` itself.
struct Inline<F>(PhantomData<F>);

impl<F: FnOnce() + Send + 'static> Inline<F> {
    /// Whether `F` fits the task's data: at most two words, aligned to at most one.
    /// Never with `tracing` (the module docs).
    const FITS: bool = !cfg!(feature = "tracing")
        && size_of::<F>() <= size_of::<Data>()
        && align_of::<F>() <= align_of::<Data>();

    const OPS: Ops = Ops {
        run: Self::run,
        abandon: Self::abandon,
    };

    /// # Safety
    /// `data` holds an `F` (written by [`detached`]), read here once.
    unsafe fn run(data: *mut Data) -> Option<String> {
        // SAFETY: the caller's promise.
        run_unwatched(unsafe { data.cast::<F>().read() })
    }

    /// # Safety
    /// As [`Self::run`].
    unsafe fn abandon(data: *mut Data) {
        // SAFETY: the caller's promise.
        drop(unsafe { data.cast::<F>().read() });
    }
}

impl OnceTask {
    /// The task's reference to a spawned or detached block (from `Box::leak`).
    pub(crate) fn block(block: NonNull<dyn RunOnce>) -> OnceTask {
        let mut data = Data::uninit();
        // SAFETY: the pointer fits the data (the assertion at the top).
        unsafe {
            data.as_mut_ptr()
                .cast::<NonNull<dyn RunOnce>>()
                .write(block)
        };
        OnceTask { ops: &BLOCK, data }
    }

    /// Runs the item; returns its panic message if it panicked.
    pub(crate) fn run(self) -> Option<String> {
        let mut task = ManuallyDrop::new(self);
        // SAFETY: `ops` is the table of what `data` holds (set with it), and the task
        // is consumed: `data` is read once, and the drop does not run.
        unsafe { (task.ops.run)(&mut task.data) }
    }

    /// Its identity (the block's address) and label, for the trace events. With
    /// `tracing` every task refers to a block (`Inline::FITS`).
    #[cfg(feature = "tracing")]
    pub(crate) fn traced(&self) -> (usize, Option<&Arc<str>>) {
        debug_assert!(std::ptr::eq(self.ops, &BLOCK));
        // SAFETY: with `tracing` every task holds a block's pointer.
        let block = unsafe { block_of(&self.data) };
        // SAFETY: the task's reference keeps the block alive while the task lives;
        // the label is borrowed from the task.
        let label = unsafe { block.as_ref() }.label();
        (block.as_ptr().cast::<()>() as usize, label)
    }
}

impl Drop for OnceTask {
    fn drop(&mut self) {
        // SAFETY: as in `run`: the task is going, so `data` is read once.
        unsafe { (self.ops.abandon)(&mut self.data) }
    }
}

/// The task of an item that no handle will read (`Workqueue::execute`): the closure
/// itself where it fits the task ([`Inline::FITS`]), else a block that is the closure
/// alone ([`Detached`]; none either for a closure that captures nothing).
pub(crate) fn detached<F: FnOnce() + Send + 'static>(f: F) -> OnceTask {
    if Inline::<F>::FITS {
        let mut data = Data::uninit();
        // SAFETY: `FITS`: `F` is no larger than the data and no more aligned.
        unsafe { data.as_mut_ptr().cast::<F>().write(f) };
        return OnceTask {
            ops: &Inline::<F>::OPS,
            data,
        };
    }
    let block = Box::new(Detached {
        f: UnsafeCell::new(MaybeUninit::new(f)),
    });
    OnceTask::block(NonNull::from(Box::leak(block)))
}

/// The block of an item with no handle whose closure does not fit its task: only its
/// closure. A spawned block's state word, result and waiter serve the handle; here the
/// task is the one reference, so its holder runs or drops the closure and frees the
/// block with no state to read.
struct Detached<F> {
    /// D: the closure, read out once by the task's holder (`run` or `abandon`), so
    /// never there when the block is freed.
    f: UnsafeCell<MaybeUninit<F>>,
}

// SAFETY: the closure is touched only by the task's holder (D), and the block is not
// shared: the task is its one reference.
unsafe impl<F: Send> Sync for Detached<F> {}

impl<F> Detached<F> {
    /// Takes the closure (D: only the task's holder calls this, once).
    fn take_closure(&self) -> F {
        // SAFETY: written when the block was made; the task's holder alone reads it,
        // once (D), and the block never drops it.
        self.f.with_mut(|f| unsafe { (*f).assume_init_read() })
    }
}

impl<F> RunOnce for Detached<F>
where
    F: FnOnce() + Send,
{
    fn run(&self) -> (Option<String>, bool) {
        (run_unwatched(self.take_closure()), true)
    }

    #[cfg(feature = "tracing")]
    fn label(&self) -> Option<&Arc<str>> {
        None
    }

    fn abandon(&self) -> bool {
        drop(self.take_closure());
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    /// Counts its drops; `pad` sets its size.
    struct DropCount<const N: usize> {
        drops: Arc<AtomicUsize>,
        pad: [u8; N],
    }

    impl<const N: usize> DropCount<N> {
        fn new() -> (DropCount<N>, Arc<AtomicUsize>) {
            let drops = Arc::new(AtomicUsize::new(0));
            let guard = DropCount {
                drops: Arc::clone(&drops),
                pad: [0; N],
            };
            (guard, drops)
        }
    }

    impl<const N: usize> Drop for DropCount<N> {
        fn drop(&mut self) {
            self.drops.fetch_add(1, SeqCst);
        }
    }

    /// Runs, drops unrun and panics a detached item whose closure carries `N` more
    /// bytes than two `Arc`s; `inline` says where it should live.
    fn runs_or_drops_once<const N: usize>(inline: bool) {
        let ran = Arc::new(AtomicUsize::new(0));
        let (guard, drops) = DropCount::<N>::new();
        let task = {
            let ran = Arc::clone(&ran);
            detached(move || {
                let guard = guard;
                ran.fetch_add(guard.pad.len() + 1, SeqCst);
            })
        };
        assert_eq!(std::ptr::eq(task.ops, &BLOCK), !inline, "where it lives");
        assert_eq!(task.run(), None);
        assert_eq!(ran.load(SeqCst), N + 1);
        assert_eq!(drops.load(SeqCst), 1, "dropped once after running");

        let (guard, drops) = DropCount::<N>::new();
        drop(detached(move || drop(guard)));
        assert_eq!(drops.load(SeqCst), 1, "dropped once unrun");

        let (guard, drops) = DropCount::<N>::new();
        let task = detached(move || {
            let _guard = guard;
            panic!("alone {N}")
        });
        assert_eq!(task.run(), Some(format!("alone {N}")));
        assert_eq!(drops.load(SeqCst), 1, "dropped once by the unwinding");
    }

    #[test]
    fn a_detached_item_runs_or_drops_its_closure_once_in_the_task_or_a_block() {
        // Two `Arc`s are 16 bytes: in the task.
        runs_or_drops_once::<0>(!cfg!(feature = "tracing"));
        // 8 bytes more: a block.
        runs_or_drops_once::<8>(false);
    }

    #[test]
    fn what_fits_the_task() {
        fn fits<F: FnOnce() + Send + 'static>(_: &F) -> bool {
            Inline::<F>::FITS
        }
        let (a, b, c) = (1u64, 2u64, 3u64);
        let two_words = move || {
            std::hint::black_box((a, b));
        };
        let three_words = move || {
            std::hint::black_box((a, b, c));
        };
        let big_align = {
            let v = std::hint::black_box(3u128);
            move || {
                std::hint::black_box(v);
            }
        };
        assert_eq!(fits(&two_words), !cfg!(feature = "tracing"));
        assert!(!fits(&three_words));
        assert!(!fits(&big_align), "a u128 is aligned to 16");
        // The task is three words, as the block's fat pointer and a tag were: an
        // entry does not grow.
        assert_eq!(size_of::<OnceTask>(), 3 * size_of::<usize>());
        assert_eq!(size_of::<crate::entry::Task>(), 3 * size_of::<usize>());
    }

    #[test]
    fn a_block_holds_the_closure_alone() {
        let seq = std::hint::black_box(7u64);
        let f = move || {
            std::hint::black_box(seq);
        };
        fn size_of_detached<F>(_: &F) -> usize {
            size_of::<Detached<F>>()
        }
        assert_eq!(size_of_detached(&f), 8);
    }
}
