//! Queue entries: what a pool's worklist holds, a work item's instance or a one-shot
//! closure, with the accounting it carries from the queue call to its completion.

use std::sync::Arc;

use crate::work::WorkInner;
use crate::workqueue::flush::Colour;
use crate::workqueue::PwqRef;

/// What a queue entry runs.
pub(crate) enum Task {
    /// Instance `seq` of a work item.
    Work {
        /// The item.
        work: Arc<WorkInner>,
        /// Which queueing this entry is (stale once the item's sequence moved on).
        seq: u32,
    },
    /// A one-shot closure (`spawn`).
    Once(crate::once::OnceTask),
}

/// One queued item: what to run and the accounting it carries. Its count in the pwq's
/// in-flight word keeps the pwq (and its pool) alive while the item is anywhere in
/// flight, as the kernel's `get_pwq` ([`PwqRef`]).
pub(crate) struct Entry {
    pub(crate) task: Task,
    pub(crate) meta: EntryMeta,
}

/// The accounting part of an [`Entry`].
pub(crate) struct EntryMeta {
    pub(crate) pwq: PwqRef,
    /// One word, so that the statistics add nothing to an entry: bit 0 the flush colour
    /// (`workqueue/flush.rs`); bits 1–20 the CPU of the queueing thread in the
    /// workqueue's topology ([`CPU_UNKNOWN`] if it does not fit); with `stats`, if it
    /// is one of the items whose latency is measured (`stats/sample.rs`), bits 21–23
    /// the exponent of its weight and bits 24–63 when it was queued (0: not measured).
    word: u64,
}

/// An entry on its pwq's inactive list, waiting for a node slot: the list's owner is
/// its pwq, so it does not keep the reference (8 bytes less per waiting item, most of
/// a flood's backlog); activation gives it back ([`Waiting::activate`]).
pub(crate) struct Waiting {
    task: Task,
    word: u64,
}

impl Entry {
    /// The entry as its pwq's inactive list keeps it. The item stays counted in the
    /// pwq's in-flight word, which keeps the pwq alive as before.
    #[inline]
    pub(crate) fn into_waiting(self) -> Waiting {
        Waiting {
            task: self.task,
            word: self.meta.word,
        }
    }
}

impl Waiting {
    /// The entry again, activated by `pwq`: the owner of the list it waited on.
    #[inline]
    pub(crate) fn activate(self, pwq: PwqRef) -> Entry {
        Entry {
            task: self.task,
            meta: EntryMeta {
                pwq,
                word: self.word,
            },
        }
    }
}

/// [`EntryMeta`]'s word without a stamp.
fn pack(colour: Colour, queued_cpu: usize) -> u64 {
    let cpu = u64::try_from(queued_cpu).map_or(CPU_UNKNOWN, |c| c.min(CPU_UNKNOWN));
    colour.bit() | cpu << 1
}

/// The queueing CPU in [`EntryMeta`]'s word (`usize::MAX` if unknown).
#[cfg_attr(not(feature = "stats"), allow(dead_code))]
fn unpack_cpu(word: u64) -> usize {
    match (word >> 1) & CPU_UNKNOWN {
        CPU_UNKNOWN => usize::MAX,
        cpu => cpu as usize,
    }
}

/// Bits of the queueing CPU in [`EntryMeta`]'s word (a million CPUs).
const CPU_BITS: u32 = 20;
/// The queueing CPU when it does not fit in [`CPU_BITS`] (or is unknown).
const CPU_UNKNOWN: u64 = (1 << CPU_BITS) - 1;
/// Where a measured item's weight exponent starts in [`EntryMeta`]'s word.
#[cfg(feature = "stats")]
const WEIGHT_SHIFT: u32 = 1 + CPU_BITS;
/// Where the stamp starts in [`EntryMeta`]'s word.
#[cfg(feature = "stats")]
const STAMP_SHIFT: u32 = WEIGHT_SHIFT + crate::stats::WEIGHT_BITS;
#[cfg(feature = "stats")]
const _: () = assert!(STAMP_SHIFT + crate::stats::Stamp::BITS == 64);

impl EntryMeta {
    /// The accounting of an item queued on `pwq` in `colour` from `queued_cpu`.
    #[inline]
    pub(crate) fn new(pwq: PwqRef, colour: Colour, queued_cpu: usize) -> EntryMeta {
        #[allow(unused_mut)]
        let mut word = pack(colour, queued_cpu);
        #[cfg(feature = "stats")]
        if let Some(sample) = crate::stats::sample_stamp() {
            word |= u64::from(sample.weight_log2) << WEIGHT_SHIFT;
            word |= sample.stamp.to_bits() << STAMP_SHIFT;
        }
        EntryMeta { pwq, word }
    }

    /// Its flush colour.
    #[inline]
    pub(crate) fn colour(&self) -> Colour {
        Colour::from_bit(self.word)
    }

    /// The CPU it was queued from, in the workqueue's topology (`usize::MAX` if unknown).
    #[cfg(feature = "stats")]
    #[inline]
    pub(crate) fn queued_cpu(&self) -> usize {
        unpack_cpu(self.word)
    }

    /// When it was queued and how many items it stands for, if it is an item whose
    /// latency is measured.
    #[cfg(feature = "stats")]
    #[inline]
    pub(crate) fn measured(&self) -> Option<crate::stats::Sample> {
        let stamp = crate::stats::Stamp::from_bits(self.word >> STAMP_SHIFT)?;
        let mask = (1 << crate::stats::WEIGHT_BITS) - 1;
        Some(crate::stats::Sample {
            stamp,
            weight_log2: ((self.word >> WEIGHT_SHIFT) & mask) as u32,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod size_tests {
    /// A queue entry's size is memory per queued item (the README's Performance
    /// section gives it): this keeps a change that grows it visible.
    #[test]
    fn a_queue_entry_is_40_bytes_with_or_without_stats() {
        assert_eq!(std::mem::size_of::<super::Entry>(), 40);
    }

    #[test]
    fn a_waiting_entry_is_32_bytes() {
        assert_eq!(std::mem::size_of::<super::Waiting>(), 32);
    }

    #[test]
    fn the_meta_word_keeps_colour_and_cpu() {
        use super::{pack, unpack_cpu, CPU_BITS};
        use crate::workqueue::flush::Colour;
        for bit in [0, 1] {
            let colour = Colour::from_bit(bit);
            for cpu in [0, 1, 4095, 65_535, (1 << CPU_BITS) - 2] {
                let word = pack(colour, cpu);
                assert_eq!(Colour::from_bit(word), colour);
                assert_eq!(unpack_cpu(word), cpu);
            }
            // Too large to keep: unknown, and the colour survives.
            for cpu in [(1 << CPU_BITS) - 1, usize::MAX] {
                let word = pack(colour, cpu);
                assert_eq!(Colour::from_bit(word), colour);
                assert_eq!(unpack_cpu(word), usize::MAX);
            }
        }
    }
}
