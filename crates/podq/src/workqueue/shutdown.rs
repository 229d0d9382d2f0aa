//! [`Workqueue::shutdown`]: a drain bounded by a timeout that reports what did not
//! finish, instead of waiting forever as dropping the last handle does.

use crate::stats::Item;
use crate::sync::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{lock, Pwq, WqShared};
use crate::{delayed, pool, Workqueue};

/// A shutdown that finished in time: what it cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Shutdown {
    /// Delayed items still on the timer at the end, cancelled (and counted cancelled).
    pub cancelled_on_timer: usize,
}

/// A shutdown whose timeout passed with items still in flight. They are not lost: the
/// ones queued still run and the running ones finish, after the call returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "workqueue `{workqueue}` did not finish within {timeout:?}: {queued} items queued, \
     {running} running ({cancelled_on_timer} cancelled on the timer)"
)]
#[non_exhaustive]
pub struct Unfinished {
    /// The workqueue.
    pub workqueue: String,
    /// The timeout given.
    pub timeout: Duration,
    /// Items queued and not started (waiting for an active slot or on a worklist;
    /// cancelled entries not yet reached included).
    pub queued: usize,
    /// Items running on a worker.
    pub running: usize,
    /// Delayed items that were on the timer, cancelled.
    pub cancelled_on_timer: usize,
}

/// How often the drain looks at the items in flight, at most (it starts at 100 µs and
/// doubles up to this).
const POLL_MAX: Duration = Duration::from_millis(10);

impl Workqueue {
    /// Shuts the workqueue down, waiting at most `timeout`: from the call on it refuses
    /// queueing except from its own items (as [`Workqueue::drain`] does, for good:
    /// [`crate::Error::Draining`]), lets its queued and running items finish, and at the
    /// end cancels the delayed items still on the timer (those that fire meanwhile are
    /// queued and waited for, as in a drain). A frozen workqueue is thawed first
    /// ([`Workqueue::freeze`]). Returns what it cancelled, or
    /// [`Unfinished`] with the items that were still queued or running when the time
    /// was up. Those keep going, and dropping the last handle waits for them.
    ///
    /// Called from one of its own items, that item counts as running: the call waits
    /// its whole timeout.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let wq = podq::Workqueue::builder("doc-shutdown").build()?;
    /// wq.spawn(|| std::thread::sleep(Duration::from_millis(10)));
    /// let done = wq.shutdown(Duration::from_secs(10)).expect("in time");
    /// assert_eq!(done.cancelled_on_timer, 0);
    /// assert!(wq.try_spawn(|| ()).is_err(), "shut down: refused");
    /// # Ok::<(), podq::Error>(())
    /// ```
    pub fn shutdown(&self, timeout: Duration) -> Result<Shutdown, Unfinished> {
        let wq = self.shared();
        pool::blocking(|| wq.shutdown(timeout))
    }
}

impl WqShared {
    fn shutdown(&self, timeout: Duration) -> Result<Shutdown, Unfinished> {
        let deadline = Instant::now().checked_add(timeout);
        // Never lowered again: the workqueue stays closed to outside queueing.
        self.draining.fetch_add(1, SeqCst);
        // Frozen items would wait the whole timeout: the workqueue is going, they run.
        self.thaw();
        let mut poll = Duration::from_micros(100);
        loop {
            if self.in_flight() == 0 {
                break;
            }
            let now = Instant::now();
            match deadline {
                Some(d) if now >= d => break,
                Some(d) => std::thread::sleep(poll.min(d - now)),
                None => std::thread::sleep(poll),
            }
            poll = (poll * 2).min(POLL_MAX);
        }
        let cancelled = delayed::cancel_for(self.id);
        self.counters.add(Item::Cancelled, cancelled);
        let cancelled_on_timer = usize::try_from(cancelled).unwrap_or(usize::MAX);
        // Counted after the timer is emptied: an item it fired just before is in flight.
        let in_flight = self.in_flight();
        if in_flight == 0 {
            return Ok(Shutdown { cancelled_on_timer });
        }
        let running = crate::busy::running_of(self.id).min(in_flight);
        Err(Unfinished {
            workqueue: self.name.clone(),
            timeout,
            queued: in_flight - running,
            running,
            cancelled_on_timer,
        })
    }

    /// Items in flight on every pwq (queued, waiting for a slot, running).
    fn in_flight(&self) -> usize {
        let pwqs: Vec<Arc<Pwq>> = lock(&self.pwqs).clone();
        let total: u64 = pwqs.iter().map(|p| p.in_flight.total()).sum();
        usize::try_from(total).unwrap_or(usize::MAX)
    }
}
