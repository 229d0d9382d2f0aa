//! How many runnable items a worker takes from its pool's worklist at once.

/// The most items a worker takes in one acquisition of the worklist lock.
pub const MAX_BATCH: usize = 32;

/// Items a worker takes from a worklist holding `waiting` items, in a pool that runs up
/// to `concurrency` workers at once: its share, `waiting / concurrency`, at least one
/// and at most [`MAX_BATCH`].
///
/// Departure from the kernel: a kernel worker takes one item per acquisition of the
/// pool lock. Taking a share amortises the lock over many tiny items, and never takes
/// more than the worker's share, so other running workers still find items. Items a
/// worker took but has not started go back to the worklist when it blocks, or when the
/// watchdog takes it out of the count for a long item.
pub fn batch_take(waiting: usize, concurrency: usize) -> usize {
    (waiting / concurrency.max(1)).clamp(1, MAX_BATCH)
}

/// Claims a pool's workers make one item at a time after one of its items ran past the
/// CPU-intensive threshold ([`crate::cpu_intensive`]), instead of their share.
///
/// When the watchdog takes a worker with a long item out of the count, the items it took
/// with that item go back to the worklist, but only then, a threshold after they were
/// taken, and not from workers that stay in the count because enough are out already.
/// Where one item ran that long others may too, and the claim a batch saves is nothing
/// beside an item of milliseconds; so, after each such item, the pool's next claims
/// take one item each, as the kernel's workers always do. Where items are tiny, this
/// many single claims cost a few microseconds once.
pub const SINGLE_TAKES_AFTER_LONG_ITEM: u32 = 64;

/// [`batch_take`], or one item while the pool takes items one at a time after a long
/// one (`one_at_a_time`, [`SINGLE_TAKES_AFTER_LONG_ITEM`]).
pub fn batch_take_after_long_items(
    waiting: usize,
    concurrency: usize,
    one_at_a_time: bool,
) -> usize {
    if one_at_a_time {
        1
    } else {
        batch_take(waiting, concurrency)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn after_a_long_item_one_at_a_time() {
        assert_eq!(batch_take_after_long_items(1000, 1, true), 1);
        assert_eq!(batch_take_after_long_items(1000, 1, false), MAX_BATCH);
        assert_eq!(batch_take_after_long_items(10, 2, false), 5);
    }

    #[test]
    fn a_share_of_the_waiting_items() {
        assert_eq!(batch_take(1, 4), 1);
        assert_eq!(batch_take(2, 2), 1);
        assert_eq!(batch_take(10, 2), 5);
        assert_eq!(batch_take(10, 1), 10);
        assert_eq!(batch_take(1000, 1), 32);
        assert_eq!(batch_take(1000, 64), 15);
        assert_eq!(batch_take(5, 0), 5);
    }

    proptest! {
        /// At least one item, never more than waiting (when any wait) nor the cap, and
        /// never more than a worker's share rounded up to one.
        #[test]
        fn bounded(waiting in 1usize..100_000, concurrency in 1usize..1024) {
            let n = batch_take(waiting, concurrency);
            prop_assert!(n >= 1 && n <= waiting && n <= MAX_BATCH);
            prop_assert!(n == 1 || n * concurrency <= waiting);
        }
    }
}
