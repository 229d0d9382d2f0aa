//! The event queue: a binary heap on the virtual clock, ties broken by insertion order
//! so that a run depends on nothing but its inputs and seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Virtual time, nanoseconds since the start of the run.
pub type Ns = u64;

/// What happens at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// Thread `tid` finishes its current step; stale if its generation moved on.
    Step {
        /// The thread.
        tid: usize,
        /// Its step generation when the event was scheduled.
        generation: u64,
    },
    /// A woken or migrated thread reaches CPU `cpu`'s run queue.
    Arrive {
        /// The thread.
        tid: usize,
        /// Where it lands.
        cpu: usize,
    },
    /// `completion`: I/O `usize`'s reply reaches its CQ.
    Wire(usize),
    /// Periodic load balance and worker reaping.
    Balance,
    /// The runtime watchdog's periodic look for items past the CPU-intensive threshold.
    LongItems,
    /// The start of `--toggle` segment `index`.
    Segment(usize),
    /// The end of an `auto` window of the queue under test.
    Auto,
    /// The end of the measured run.
    End,
}

/// `x` ns rounded to the nearest whole ns (halves up), negatives to 0: `f64::round`
/// without its library call, which the hot paths would pay on every step.
#[inline]
pub fn to_ns(x: f64) -> Ns {
    (x + 0.5) as Ns
}

/// The pending events.
#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<(Ns, u64, Event)>>,
    seq: u64,
    processed: u64,
}

impl EventQueue {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Ns, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, event)));
    }

    /// The earliest event, counting it as processed.
    pub fn pop(&mut self) -> Option<(Ns, Event)> {
        let Reverse((at, _, event)) = self.heap.pop()?;
        self.processed += 1;
        Some((at, event))
    }

    /// Events taken so far.
    pub fn processed(&self) -> u64 {
        self.processed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_ns_rounds_halves_up_and_negatives_to_zero() {
        assert_eq!(to_ns(2.4), 2);
        assert_eq!(to_ns(2.5), 3);
        assert_eq!(to_ns(-3.0), 0);
        assert_eq!(to_ns(1e9 + 0.49), 1_000_000_000);
    }

    #[test]
    fn earliest_first_ties_in_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, Event::End);
        q.push(3, Event::Segment(1));
        q.push(3, Event::Segment(0));
        q.push(4, Event::Balance);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (3, Event::Segment(1)),
                (3, Event::Segment(0)),
                (4, Event::Balance),
                (5, Event::End)
            ]
        );
        assert_eq!(q.processed(), 4);
    }
}
