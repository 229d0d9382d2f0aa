//! Failed worker creation: the cooldown before a retry, when rescuers are called
//! (mayday), which workqueues are called, and how much a rescuer runs at a time.
//!
//! Times are a clock's instants `T` (the runtime passes its monotonic clock's, the
//! simulator its virtual time); only adding a `Duration` and comparing are needed.

use std::ops::Add;
use std::time::Duration;

use crate::{kick, Kick, PoolLoad};

/// The kernel's `CREATE_COOLDOWN`: how long a pool waits before retrying a failed
/// worker creation.
pub const CREATE_COOLDOWN: Duration = Duration::from_secs(1);

/// The kernel's `MAYDAY_INITIAL_TIMEOUT`: how long items wait after a failed creation
/// before rescuers are called.
pub const MAYDAY_INITIAL_TIMEOUT: Duration = Duration::from_millis(10);

/// The kernel's `MAYDAY_INTERVAL`: how often the call is repeated while the pool is stuck.
pub const MAYDAY_INTERVAL: Duration = Duration::from_millis(100);

/// The kernel's `RESCUER_BATCH`: items a rescuer runs for one pool before it looks at
/// the other pools that called it.
pub const RESCUER_BATCH: usize = 16;

/// Whether a pool wants a worker it has not got (`need_to_create_worker`): items wait,
/// no worker is idle, fewer run than its concurrency, and it is under the thread cap.
/// A pool in this state after a failed creation calls for rescue.
pub fn needs_worker(load: PoolLoad) -> bool {
    kick(load) == Kick::Create
}

/// A pool blocked after a failed worker creation: when to retry, when to call rescuers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateBlock<T> {
    /// When to try creating a worker again (the end of the cooldown).
    pub retry_at: T,
    /// When to call the rescuers next.
    pub mayday_at: T,
}

/// A worker creation failed at `now`: if the pool still wants a worker (`wanted`,
/// [`needs_worker`] after the failure) and is not blocked already (one retry per
/// cooldown), it is blocked: retry after `cooldown`, mayday after
/// [`MAYDAY_INITIAL_TIMEOUT`].
pub fn block_creation<T: Add<Duration, Output = T> + Copy>(
    now: T,
    wanted: bool,
    already_blocked: bool,
    cooldown: Duration,
) -> Option<CreateBlock<T>> {
    (wanted && !already_blocked).then(|| CreateBlock {
        retry_at: now + cooldown,
        mayday_at: now + MAYDAY_INITIAL_TIMEOUT,
    })
}

/// What the manager does for a blocked pool at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The cooldown is over: the pool leaves the list and is kicked (creating a worker if
    /// one is still wanted; a new failure blocks it again).
    Retry,
    /// Call the rescuers; the block now holds the next mayday time.
    Mayday,
    /// Nothing yet; look again at [`CreateBlock::next`].
    Wait,
}

impl<T: Add<Duration, Output = T> + Ord + Copy> CreateBlock<T> {
    /// The manager's step for this pool at `now`; a mayday reschedules the next one
    /// [`MAYDAY_INTERVAL`] later.
    pub fn due(&mut self, now: T) -> Due {
        if self.retry_at <= now {
            Due::Retry
        } else if self.mayday_at <= now {
            self.mayday_at = now + MAYDAY_INTERVAL;
            Due::Mayday
        } else {
            Due::Wait
        }
    }

    /// When this pool needs the manager next.
    pub fn next(&self) -> T {
        self.retry_at.min(self.mayday_at)
    }
}

/// The workqueues a mayday goes to: those with an item on the stuck pool's worklist
/// (`worklist`: the workqueue of each item, in any order) that have a rescuer, each
/// once, in id order.
pub fn mayday_targets(
    worklist: impl IntoIterator<Item = u64>,
    has_rescuer: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let mut ids: Vec<u64> = worklist.into_iter().filter(|&id| has_rescuer(id)).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A rescuer's next step on a pool that called it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RescueStep {
    /// Take the oldest item of its workqueue off the worklist and run it.
    Take,
    /// Done with this pool: it has a worker again, or no item of the workqueue waits.
    Stop,
    /// A batch ran and the pool is still stuck: go to the back of the line of pools
    /// that called.
    Requeue,
}

/// The rescue step after `ran` items of this visit (`rescuer_do_work`):
/// `needs_worker` and `has_item` as the pool is now.
pub fn rescue_step(ran: usize, needs_worker: bool, has_item: bool) -> RescueStep {
    if !needs_worker || !has_item {
        RescueStep::Stop
    } else if ran >= RESCUER_BATCH {
        RescueStep::Requeue
    } else {
        RescueStep::Take
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds on a virtual clock.
    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_failure_blocks_once() {
        let b = block_creation(ms(1000), true, false, CREATE_COOLDOWN).unwrap();
        assert_eq!(b.retry_at, ms(2000));
        assert_eq!(b.mayday_at, ms(1010));
        assert_eq!(block_creation(ms(0), true, true, CREATE_COOLDOWN), None);
        assert_eq!(block_creation(ms(0), false, false, CREATE_COOLDOWN), None);
    }

    #[test]
    fn manager_schedule() {
        let mut b = block_creation(ms(0), true, false, ms(250)).unwrap();
        assert_eq!(b.next(), ms(10));
        assert_eq!(b.due(ms(5)), Due::Wait);
        assert_eq!(b.due(ms(10)), Due::Mayday);
        assert_eq!(b.mayday_at, ms(110));
        assert_eq!(b.due(ms(50)), Due::Wait);
        assert_eq!(b.due(ms(115)), Due::Mayday);
        assert_eq!(b.mayday_at, ms(215));
        assert_eq!(b.next(), ms(215));
        assert_eq!(
            b.due(ms(250)),
            Due::Retry,
            "the retry wins over a due mayday"
        );
    }

    #[test]
    fn maydays_go_to_rescuers_once() {
        let targets = mayday_targets([4, 2, 4, 9, 2, 7], |id| id != 9);
        assert_eq!(targets, vec![2, 4, 7]);
        assert!(mayday_targets([], |_| true).is_empty());
    }

    #[test]
    fn rescuer_batches() {
        assert_eq!(rescue_step(0, true, true), RescueStep::Take);
        assert_eq!(rescue_step(15, true, true), RescueStep::Take);
        assert_eq!(rescue_step(16, true, true), RescueStep::Requeue);
        assert_eq!(rescue_step(3, false, true), RescueStep::Stop);
        assert_eq!(rescue_step(16, true, false), RescueStep::Stop);
    }

    #[test]
    fn stuck_pools_need_workers() {
        let load = PoolLoad {
            worklist: 2,
            idle: 0,
            running: 0,
            workers: 0,
            concurrency: 2,
            spinning: 0,
        };
        assert!(needs_worker(load));
        assert!(!needs_worker(PoolLoad { idle: 1, ..load }));
        assert!(!needs_worker(PoolLoad {
            worklist: 0,
            ..load
        }));
    }
}
