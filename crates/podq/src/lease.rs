//! Thread leases: each of the first [`LEASES`] threads to ask holds one small index
//! from its first use until it exits. Per-thread slots indexed by it (a sharded
//! counter's shard, a reader's slot in a `Published`) are written by their lessee
//! only, so with a load and a store instead of a locked instruction, on a cache line
//! no other thread writes. Threads beyond the leases get [`Slot::Shared`] and take the
//! slower path each user provides.

use crate::sync::unmodelled;
use crate::sync::Ordering::{Acquire, Relaxed, Release};

/// Leases in the process.
pub(crate) const LEASES: usize = 8;

/// What the calling thread holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Lease `i`: slot `i` is this thread's alone.
    Leased(usize),
    /// No lease; `i` (below [`LEASES`]) spreads such threads round-robin.
    Shared(usize),
}

/// A: the leases taken, one bit each. A lease is taken with an `Acquire` CAS that
/// pairs with the previous holder's `Release` clearing of the bit when its thread
/// exited, so the new holder's loads see the old holder's last stores into every
/// leased slot and its load-and-store updates lose nothing.
static TAKEN: unmodelled::AtomicU32 = unmodelled::AtomicU32::new(0);

/// The calling thread's lease (W), given back when the thread exits.
struct Lease(Slot);

impl Lease {
    fn take() -> Lease {
        let all = (1u32 << LEASES) - 1;
        let mut taken = TAKEN.load(Relaxed);
        while taken & all != all {
            let i = (!taken & all).trailing_zeros();
            match TAKEN.compare_exchange_weak(taken, taken | 1 << i, Acquire, Relaxed) {
                Ok(_) => return Lease(Slot::Leased(i as usize)),
                Err(now) => taken = now,
            }
        }
        // All leased: spread the others round-robin (a relaxed ID counter).
        static NEXT: unmodelled::AtomicUsize = unmodelled::AtomicUsize::new(0);
        Lease(Slot::Shared(NEXT.fetch_add(1, Relaxed) % LEASES))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Slot::Leased(i) = self.0 {
            // Pairs with the next holder's `Acquire` (see `TAKEN`).
            TAKEN.fetch_and(!(1 << i), Release);
        }
    }
}

/// The calling thread's slot; a thread whose lease is already gone (called from
/// another thread-local's destructor) gets `Shared(0)`.
#[inline]
pub(crate) fn slot() -> Slot {
    thread_local! {
        static MINE: Lease = Lease::take();
    }
    MINE.try_with(|m| m.0).unwrap_or(Slot::Shared(0))
}
