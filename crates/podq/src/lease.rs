//! Thread leases: each of the first [`LEASES`] threads to ask holds one small index
//! from its first use until it exits. Per-thread slots indexed by it (a sharded
//! counter's shard, a reader's slot in a `Published`) are written by their lessee
//! only, so with a load and a store instead of a locked instruction, on a cache line
//! no other thread writes. Threads beyond the leases get [`Slot::Shared`] and take the
//! slower path each user provides.

use std::cell::Cell;

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
        // Before the lease is free for another thread: lookups from later destructors of
        // this thread take the slow path, which finds the lease gone.
        CACHED.with(|c| c.set(GONE));
        if let Slot::Leased(i) = self.0 {
            // Pairs with the next holder's `Acquire` (see `TAKEN`).
            TAKEN.fetch_and(!(1 << i), Release);
        }
    }
}

thread_local! {
    /// W: the calling thread's slot once its lease is taken ([`Slot::code`]), else
    /// [`UNSET`] or [`GONE`]. A plain value with a constant start and no destructor, so
    /// a lookup is one thread-local load: the lease itself has a destructor, whose
    /// thread-local would be checked for its state on every access.
    static CACHED: Cell<u8> = const { Cell::new(UNSET) };
}

/// [`CACHED`] before the thread's first lookup.
const UNSET: u8 = 2 * LEASES as u8;
/// [`CACHED`] once the thread's lease was given back (it is exiting).
const GONE: u8 = UNSET + 1;

impl Slot {
    /// The slot as one byte: `i` for `Leased(i)`, `LEASES + i` for `Shared(i)`.
    pub(crate) fn code(self) -> u8 {
        match self {
            Slot::Leased(i) => i as u8,
            Slot::Shared(i) => (LEASES + i) as u8,
        }
    }

    fn from_code(code: u8) -> Slot {
        let code = usize::from(code);
        if code < LEASES {
            Slot::Leased(code)
        } else {
            Slot::Shared(code - LEASES)
        }
    }
}

/// The calling thread's slot; a thread whose lease is already gone (called from
/// another thread-local's destructor) gets `Shared(0)`.
#[inline]
pub(crate) fn slot() -> Slot {
    Slot::from_code(code())
}

/// [`slot`] as one byte below `2 * LEASES` ([`Slot::code`]): for per-thread slots on
/// the hottest paths, where decoding into a [`Slot`] costs more than the lookup.
#[inline]
pub(crate) fn code() -> u8 {
    let code = CACHED.with(Cell::get);
    if code < UNSET {
        return code;
    }
    first_code()
}

/// [`code`] before the thread's first lookup (takes its lease) or after its lease was
/// given back.
#[cold]
fn first_code() -> u8 {
    thread_local! {
        static MINE: Lease = Lease::take();
    }
    match MINE.try_with(|m| m.0.code()) {
        Ok(code) => {
            CACHED.with(|c| c.set(code));
            code
        }
        Err(_) => Slot::Shared(0).code(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_slot_survives_its_code() {
        for i in 0..LEASES {
            for slot in [Slot::Leased(i), Slot::Shared(i)] {
                assert!(slot.code() < UNSET);
                assert_eq!(Slot::from_code(slot.code()), slot);
            }
        }
    }

    /// A thread's slot stays the same for its life; a destructor that runs after its
    /// lease was given back (thread-locals are destroyed in reverse order of first use)
    /// gets `Shared(0)`, not the lease another thread may hold by then.
    #[test]
    fn a_slot_is_stable_and_gone_after_the_lease() {
        struct LateProbe(std::sync::mpsc::Sender<Slot>);
        impl Drop for LateProbe {
            fn drop(&mut self) {
                let _ = self.0.send(slot());
            }
        }
        thread_local! {
            static PROBE: std::cell::RefCell<Option<LateProbe>> =
                const { std::cell::RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // First used before the lease, so destroyed after it.
            PROBE.with(|p| *p.borrow_mut() = Some(LateProbe(tx)));
            let first = slot();
            assert!((0..100).all(|_| slot() == first));
        })
        .join()
        .unwrap();
        assert_eq!(rx.recv().unwrap(), Slot::Shared(0));
    }
}
