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
/// worker took but has not started go back to the worklist when it blocks.
pub fn batch_take(waiting: usize, concurrency: usize) -> usize {
    (waiting / concurrency.max(1)).clamp(1, MAX_BATCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
