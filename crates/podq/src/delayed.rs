//! Delayed work: one timer thread for the whole process, a binary heap of deadlines and
//! a condvar (not a thread per item).
//!
//! Legend: X guarded by `Timer::state`; I set at init; the work item's own state word decides whether a
//! heap entry is still valid (see `work/README.md`: entries carry a sequence number and
//! go stale when the item is cancelled or re-armed, so nothing is removed from the heap
//! eagerly).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::{OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::sync::unmodelled::{Condvar, Mutex};
use std::sync::Arc;

use crate::sync::lock_std as lock;
use crate::work::{Work, WorkInner};
use crate::workqueue::WqShared;
use crate::Error;

/// Where a delayed item was last armed: its workqueue and requested CPU.
type Target = (Weak<WqShared>, Option<usize>);

/// A work item that can be queued after a delay (`delayed_work`).
///
/// ```
/// use std::time::Duration;
/// use podq::{DelayedWork, Workqueue};
///
/// let wq = Workqueue::builder("doc-delayed").build().unwrap();
/// let dwork = DelayedWork::new(|| println!("later"));
/// assert!(wq.queue_delayed(&dwork, Duration::from_secs(3600)));
/// assert!(dwork.cancel());
/// assert!(wq.queue_delayed(&dwork, Duration::from_millis(1)));
/// dwork.flush(); // queues it at once if still on the timer, then waits
/// ```
#[derive(Clone)]
pub struct DelayedWork {
    work: Work,
    /// The workqueue and CPU of the last arming, for `flush`.
    target: Arc<Mutex<Option<Target>>>,
}

impl fmt::Debug for DelayedWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayedWork")
            .field("pending", &self.is_pending())
            .finish()
    }
}

impl DelayedWork {
    /// A new idle delayed item running `f`.
    pub fn new(f: impl Fn() + Send + Sync + 'static) -> DelayedWork {
        DelayedWork {
            work: Work::new(f),
            target: Arc::new(Mutex::new(None)),
        }
    }

    /// As [`DelayedWork::new`], labelled as [`Work::named`].
    pub fn named(label: impl Into<Arc<str>>, f: impl Fn() + Send + Sync + 'static) -> DelayedWork {
        DelayedWork {
            work: Work::named(label, f),
            target: Arc::new(Mutex::new(None)),
        }
    }

    /// The label given by [`DelayedWork::named`].
    pub fn label(&self) -> Option<&str> {
        self.work.label()
    }

    /// Whether it is on the timer or queued and not started.
    pub fn is_pending(&self) -> bool {
        self.work.is_pending()
    }

    /// Whether a worker runs it now ([`Work::is_running`]).
    pub fn is_running(&self) -> bool {
        self.work.is_running()
    }

    /// Whether it is disabled ([`DelayedWork::disable`]).
    pub fn is_disabled(&self) -> bool {
        self.work.is_disabled()
    }

    /// `disable_delayed_work`: takes it off the timer or the queue and refuses arming
    /// until enabled, as [`Work::disable`]. Returns whether it was pending.
    pub fn disable(&self) -> Result<bool, Error> {
        self.work.disable()
    }

    /// `disable_delayed_work_sync`: [`DelayedWork::disable`], then waits for a running
    /// instance, as [`Work::disable_sync`].
    pub fn disable_sync(&self) -> Result<bool, Error> {
        self.work.disable_sync()
    }

    /// `enable_delayed_work`: undoes one disable, as [`Work::enable`].
    pub fn enable(&self) -> Result<bool, Error> {
        self.work.enable()
    }

    /// `cancel_delayed_work`: takes it off the timer or the queue. Returns whether it
    /// was pending; does not wait for a running instance.
    pub fn cancel(&self) -> bool {
        self.work.cancel()
    }

    /// `cancel_delayed_work_sync`: as [`DelayedWork::cancel`], then waits for a running
    /// instance; re-arming is refused meanwhile.
    pub fn cancel_sync(&self) -> bool {
        self.work.cancel_sync()
    }

    /// `flush_delayed_work`: if it is on the timer, queues it now; then waits for it.
    /// Returns whether there was anything to wait for.
    pub fn flush(&self) -> bool {
        let target = lock(&self.target).clone();
        let mut queued = false;
        if let Some((wq, cpu)) = target {
            if let Some(seq) = self.work.inner.state.steal_timer() {
                queued = true;
                match wq.upgrade() {
                    Some(wq) => wq.enqueue_pending(Arc::clone(&self.work.inner), seq, cpu),
                    None => {
                        self.work.inner.state.cancel();
                    }
                }
            }
        }
        // An instance queued just now may already have finished: it still counts.
        self.work.flush() || queued
    }
}

/// Arms (or with `modify`, re-arms) `dwork` on `wq`. Returns whether it was armed
/// (plain) or whether it was pending before (`modify`). Refused, leaving `dwork` as it
/// was, while `wq` is draining and the caller is not one of its items, as every queue
/// call is.
pub(crate) fn queue(
    wq: &Arc<WqShared>,
    dwork: &DelayedWork,
    delay: Duration,
    cpu: Option<usize>,
    modify: bool,
) -> Result<bool, Error> {
    wq.check_accepting()?;
    let on_timer = !delay.is_zero();
    let state = &dwork.work.inner.state;
    let (answer, seq) = if modify {
        match state.repend(on_timer) {
            Some((was_pending, seq)) => (was_pending, seq),
            None => return Ok(false),
        }
    } else {
        match state.try_pend(on_timer) {
            Some(seq) => (true, seq),
            None => return Ok(false),
        }
    };
    *lock(&dwork.target) = Some((Arc::downgrade(wq), cpu));
    let work = Arc::clone(&dwork.work.inner);
    if on_timer {
        timer().arm(TimerEntry {
            deadline: Instant::now() + delay,
            order: 0,
            work,
            seq,
            wq: Arc::downgrade(wq),
            wq_id: wq.id,
            cpu,
        });
    } else {
        // Past the check above, this call counts as made before any drain that began
        // since: like an item queued just before, it is queued and the drain waits for
        // it (refusing it now would lose the instance `repend` replaced).
        wq.enqueue_pending(work, seq, cpu);
    }
    Ok(answer)
}

/// Cancels every item of workqueue `wq_id` still on the timer; returns how many.
pub(crate) fn cancel_for(wq_id: u64) -> u64 {
    let Some(timer) = TIMER.get() else {
        return 0;
    };
    let mut st = lock(&timer.state);
    let heap = std::mem::take(&mut st.heap);
    let mut cancelled = 0;
    for entry in heap.into_vec() {
        if entry.wq_id != wq_id {
            st.heap.push(entry);
        } else if entry.work.state.fire_timer(entry.seq) && entry.work.state.cancel() {
            cancelled += 1;
        }
    }
    cancelled
}

struct TimerEntry {
    deadline: Instant,
    /// Arming order, so equal deadlines fire in FIFO order.
    order: u64,
    work: Arc<WorkInner>,
    seq: u32,
    wq: Weak<WqShared>,
    wq_id: u64,
    cpu: Option<usize>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for TimerEntry {}

impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for TimerEntry {
    /// Reversed: the heap's maximum is the earliest deadline.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.deadline, other.order).cmp(&(self.deadline, self.order))
    }
}

/// Everything the timer lock guards (all X).
#[derive(Default)]
struct TimerState {
    heap: BinaryHeap<TimerEntry>,
    next_order: u64,
}

struct Timer {
    /// X: the heap.
    state: Mutex<TimerState>,
    /// X: signalled when an earlier deadline is armed.
    wake: Condvar,
}

static TIMER: OnceLock<Arc<Timer>> = OnceLock::new();

/// The process timer, started on first use.
fn timer() -> &'static Arc<Timer> {
    TIMER.get_or_init(|| {
        let timer = Arc::new(Timer {
            state: Mutex::new(TimerState::default()),
            wake: Condvar::new(),
        });
        let t = Arc::clone(&timer);
        // Without a timer thread no delayed item could ever run: failing to start one
        // is unrecoverable for the process, like failing to allocate.
        std::thread::Builder::new()
            .name("podq/timer".to_owned())
            .spawn(move || t.run())
            .expect("podq: cannot start the timer thread");
        timer
    })
}

impl Timer {
    fn arm(&self, mut entry: TimerEntry) {
        let mut st = lock(&self.state);
        entry.order = st.next_order;
        st.next_order += 1;
        let earliest = st
            .heap
            .peek()
            .map_or(true, |top| entry.deadline < top.deadline);
        st.heap.push(entry);
        drop(st);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        let mut st = lock(&self.state);
        loop {
            let now = Instant::now();
            match st.heap.peek().map(|e| e.deadline) {
                Some(deadline) if deadline <= now => {
                    let entry = st.heap.pop().expect("peeked");
                    drop(st);
                    fire(entry);
                    st = lock(&self.state);
                }
                Some(deadline) => {
                    st = match self.wake.wait_timeout(st, deadline - now) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
                None => st = crate::sync::wait_std(&self.wake, st),
            }
        }
    }
}

fn fire(entry: TimerEntry) {
    if !entry.work.state.fire_timer(entry.seq) {
        return; // cancelled or re-armed meanwhile
    }
    match entry.wq.upgrade() {
        Some(wq) => wq.enqueue_pending(entry.work, entry.seq, entry.cpu),
        None => {
            entry.work.state.cancel();
        }
    }
}
