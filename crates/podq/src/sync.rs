//! The synchronisation facade: every atomic, mutex and condvar of the runtime comes from
//! here. The types at the top level are std's normally and loom's under `cfg(loom)`, so
//! the loom models exercise the real protocol code (pending bit, sleep/wake, flush,
//! admission, join); instance state uses them. [`unmodelled`] holds std's in every
//! build, for what loom cannot model: process-wide statics (loom's types have no
//! `const` constructors and may not outlive one model execution), state reachable
//! from them, and OS-thread bookkeeping. Loom has no `Weak`, `OnceLock` or clock;
//! those come from std directly. [`lock`] takes either kind of mutex; [`lock_std`] and
//! [`wait_std`] take only the unmodelled ones.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{
    Condvar, Mutex, MutexGuard, RwLock as ReadLock, RwLockReadGuard as ReadLockGuard,
    RwLockWriteGuard as WriteLockGuard,
};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

/// A reader-writer lock for read-mostly state: crossbeam's `ShardedLock` (readers of
/// different threads lock different shards) normally, loom's `RwLock` under `cfg(loom)`.
#[cfg(not(loom))]
pub(crate) use crossbeam_utils::sync::{
    ShardedLock as ReadLock, ShardedLockReadGuard as ReadLockGuard,
    ShardedLockWriteGuard as WriteLockGuard,
};

/// Std's types in every build, for state loom cannot model (see the module docs).
pub(crate) mod unmodelled {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
    pub(crate) use std::sync::{Condvar, Mutex, RwLock};
}

/// The fence between the `SeqCst` write and the `SeqCst` read of one side of a Dekker
/// pair (each side writes its flag, then reads the other's) whose accesses on both
/// sides are all `SeqCst`. The language puts every `SeqCst` access in one total order,
/// so such a pair needs no fence: at least one side reads the other's write. Loom
/// models `SeqCst` accesses as acquire/release only, so under loom this is a `SeqCst`
/// fence, and the models check the pairing that the total order gives the real build
/// (where a fence would cost a locked instruction on the queue path).
#[inline(always)]
pub(crate) fn seqcst_pair_fence() {
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

/// One step of a short spin on a flag another thread holds for a few instructions:
/// pause loops, then yields (the holder may have been preempted). Under loom, a yield.
#[inline]
pub(crate) fn spin_wait(spins: &mut u32) {
    #[cfg(not(loom))]
    {
        if *spins < 64 {
            *spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
}

/// A cell whose contents the caller synchronises: std's `UnsafeCell` normally, loom's
/// (which checks the accesses) under `cfg(loom)`.
#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// A cell whose contents the caller synchronises, with loom's `with_mut` interface.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer to the contents; the caller makes the access exclusive.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Threads: `current`, `park`, `park_timeout` and the `Thread` handle used to unpark.
pub(crate) mod thread {
    #[cfg(loom)]
    pub(crate) use loom::thread::{current, park, Thread};
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, park, Thread};

    /// Parks for at most `timeout`.
    #[cfg(not(loom))]
    pub(crate) fn park_timeout(timeout: std::time::Duration) {
        std::thread::park_timeout(timeout);
    }

    /// Parks until unparked (loom has no clock; spurious wake-ups are modelled).
    #[cfg(loom)]
    pub(crate) fn park_timeout(_timeout: std::time::Duration) {
        loom::thread::park();
    }
}

/// Locks `mutex`, ignoring poisoning: no podq lock is held while user code runs, so a
/// poisoned lock can only come from a bug in podq itself, and the data it guards is
/// still consistent at every unlock point. Takes the modelled mutex and the
/// [`unmodelled`] one alike (the same type outside loom).
pub(crate) fn lock<M: Lockable + ?Sized>(mutex: &M) -> M::Guard<'_> {
    mutex.lock_ignoring_poison()
}

/// A mutex [`lock`] takes.
pub(crate) trait Lockable {
    type Guard<'a>
    where
        Self: 'a;

    /// See [`lock`].
    fn lock_ignoring_poison(&self) -> Self::Guard<'_>;
}

impl<T: ?Sized> Lockable for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        T: 'a;

    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(loom)]
impl<T: ?Sized> Lockable for loom::sync::Mutex<T> {
    type Guard<'a>
        = loom::sync::MutexGuard<'a, T>
    where
        T: 'a;

    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        self.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A mutex on a cache line of its own is locked as the mutex.
impl<M: Lockable> Lockable for crossbeam_utils::CachePadded<M> {
    type Guard<'a>
        = M::Guard<'a>
    where
        M: 'a;

    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        (**self).lock_ignoring_poison()
    }
}

/// Waits on `cv`, ignoring poisoning (see [`lock`]).
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    match cv.wait(guard) {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Read access to a [`ReadLock`], ignoring poisoning (see [`lock`]).
pub(crate) fn read_lock<T>(l: &ReadLock<T>) -> ReadLockGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Write access to a [`ReadLock`], ignoring poisoning (see [`lock`]).
pub(crate) fn write_lock<T>(l: &ReadLock<T>) -> WriteLockGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lock`] for `std` mutexes (the same function when not under loom).
pub(crate) fn lock_std<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`wait`] for `std` condvars.
pub(crate) fn wait_std<'a, T>(
    cv: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
) -> std::sync::MutexGuard<'a, T> {
    cv.wait(guard)
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
