//! A worker's finished items not yet accounted: completions of one pwq, settled
//! together — one release of their node slots with one activation pass, one update of
//! the pwq's in-flight counts, one add to the workqueue's `completed` count — instead
//! of once per item. Protocol:
//! `workqueue/README.md` ("Completion").
//!
//! Legend: W thread-private (it lives in the worker's thread-local, `context.rs`).

use super::flush::Colour;
use super::{Pwq, PwqRef};

/// Most completions a worker holds before settling them: it bounds the slots a worker
/// keeps from waiting items while it runs the rest of its batch.
const SETTLE_EVERY: u64 = 32;

/// Completions held by one thread.
pub(crate) struct Completions {
    /// W: the pwq of the held completions, how many of each colour, and how many of
    /// them ran (the others were dropped unrun: cancelled or superseded).
    held: Option<(PwqRef, [u64; 2], u64)>,
    /// W: whether this thread holds completions at all (a worker inside its loop);
    /// elsewhere each one settles at once.
    deferring: bool,
    /// W: whether items waited for a slot on the node of the last settled completions.
    backlog: bool,
}

impl Completions {
    /// None held, settling each at once (a thread outside a worker's loop).
    pub(crate) const fn new() -> Completions {
        Completions {
            held: None,
            deferring: false,
            backlog: false,
        }
    }

    /// Starts or stops holding completions (settling what is held when stopping).
    pub(crate) fn set_deferring(&mut self, deferring: bool) {
        if !deferring {
            self.settle();
        }
        self.deferring = deferring;
    }

    /// An item of `pwq` with flush colour `colour` finished (`ran`) or was dropped. Held
    /// with the others of the same pwq; settled at once when this thread does not
    /// defer, when [`SETTLE_EVERY`] are held, or when a flusher waits and these are the
    /// last items of a colour in flight on the pwq (settling them may end the flush).
    ///
    /// A flusher that waits for a backlog does not make each completion settle on its
    /// own: that would release one `max_active` slot at a time, so every activation
    /// turn would move one or two items, and the workers would contend for the node's
    /// pending list item by item (a flood drained behind `flush` ran at a third of
    /// its rate).
    pub(crate) fn complete(&mut self, pwq: PwqRef, colour: Colour, ran: bool) {
        let mut one = [0; 2];
        one[colour.index()] = 1;
        if !self.deferring {
            self.backlog = Pwq::complete(pwq, one, u64::from(ran));
            return;
        }
        let held = match &mut self.held {
            Some((p, done, done_ran)) if p.same(&pwq) => {
                done[colour.index()] += 1;
                *done_ran += u64::from(ran);
                done[0] + done[1]
            }
            _ => {
                self.settle();
                self.held = Some((pwq, one, u64::from(ran)));
                1
            }
        };
        let ends_a_flush = self
            .held
            .as_ref()
            .is_some_and(|(p, done, _)| p.wq.flush.waited_on() && p.in_flight.would_clear(*done));
        if held >= SETTLE_EVERY || ends_a_flush {
            self.settle();
        }
    }

    /// Accounts every held completion now: before the worker takes a new batch,
    /// blocks, goes idle or exits.
    pub(crate) fn settle(&mut self) {
        if let Some((pwq, done, ran)) = self.held.take() {
            self.backlog = Pwq::complete(pwq, done, ran);
        }
    }

    /// Whether items waited for a slot on the node of the last completions settled.
    pub(crate) fn backlog(&self) -> bool {
        self.backlog
    }
}
