//! A growable ring buffer of items, oldest first: the worklist's spill and a worker's
//! batch. Unlike `VecDeque`, whose `extend(drain(..n))` moves one element at a time
//! (about 50 instructions an entry, a third of a one-CPU pool's worker path in a
//! flood), a run of items moves between two of these with at most three copies
//! ([`Fifo::move_front_to`]); a plain `VecDeque` offers no way to write its spare
//! capacity or to forget moved-out items.
//!
//! Not shared: its owner holds it exclusively (behind the worklist lock, or in the
//! worker's thread-local), so it has no legend of its own.

use std::mem::MaybeUninit;
use std::ptr;

/// Items oldest first. The buffer's length is its capacity, 0 or a power of two; the
/// items are the `len` slots from `head` on, wrapping at the end: those slots are
/// initialized, all others are not.
pub(crate) struct Fifo<T> {
    buf: Vec<MaybeUninit<T>>,
    head: usize,
    len: usize,
}

/// The smallest capacity a growing fifo takes.
const MIN_CAPACITY: usize = 8;

impl<T> Fifo<T> {
    pub(crate) const fn new() -> Fifo<T> {
        Fifo {
            buf: Vec::new(),
            head: 0,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The buffer index of the item `i` places from the oldest (or of the free slot
    /// `i - len` places after the newest), for `i` at most the capacity.
    #[inline]
    fn slot(&self, i: usize) -> usize {
        (self.head + i) & (self.buf.len().wrapping_sub(1))
    }

    /// Makes room for `extra` more items without another allocation.
    #[inline]
    pub(crate) fn reserve(&mut self, extra: usize) {
        let need = self.len.checked_add(extra).expect("fifo capacity overflow");
        if need > self.buf.len() {
            self.resize(need.max(MIN_CAPACITY).next_power_of_two());
        }
    }

    /// Moves the items to a new buffer of `capacity` slots (0 or a power of two, at
    /// least `len`), oldest at its start.
    #[cold]
    fn resize(&mut self, capacity: usize) {
        debug_assert!(capacity >= self.len && (capacity == 0 || capacity.is_power_of_two()));
        let mut buf = Vec::with_capacity(capacity);
        // SAFETY: `MaybeUninit` slots need no initialization.
        unsafe { buf.set_len(capacity) };
        let mut new = Fifo {
            buf,
            head: 0,
            len: 0,
        };
        let n = self.len;
        self.move_front_to(n, &mut new);
        *self = new;
    }

    /// Gives memory back down to `capacity` slots (a power of two, and never below
    /// the items held).
    pub(crate) fn shrink_to(&mut self, capacity: usize) {
        let capacity = capacity.max(self.len);
        let capacity = if capacity == 0 {
            0
        } else {
            capacity.next_power_of_two()
        };
        if capacity < self.buf.len() {
            self.resize(capacity);
        }
    }

    #[inline]
    pub(crate) fn push_back(&mut self, item: T) {
        self.reserve(1);
        let at = self.slot(self.len);
        self.buf[at].write(item);
        self.len += 1;
    }

    #[inline]
    pub(crate) fn push_front(&mut self, item: T) {
        self.reserve(1);
        self.head = self.slot(self.buf.len() - 1);
        self.buf[self.head].write(item);
        self.len += 1;
    }

    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let at = self.head;
        self.head = self.slot(1);
        self.len -= 1;
        // SAFETY: slot `at` held the oldest item; it is outside the items now, so it
        // is read once.
        Some(unsafe { self.buf[at].assume_init_read() })
    }

    #[inline]
    pub(crate) fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let at = self.slot(self.len);
        // SAFETY: slot `at` held the newest item; it is outside the items now, so it
        // is read once.
        Some(unsafe { self.buf[at].assume_init_read() })
    }

    /// Appends every item of `items`, room for as many as it says it has made first.
    pub(crate) fn extend(&mut self, items: impl IntoIterator<Item = T>) {
        let items = items.into_iter();
        self.reserve(items.size_hint().0);
        // Internal iteration: a `for` loop built each item on the stack in pieces and
        // copied it with wider loads, which stalled on store forwarding (most of this
        // function's time in a profile of a flood).
        items.for_each(|item| self.push_back(item));
    }

    /// Moves up to `n` of the oldest items to the end of `into`, in order, as at most
    /// three copies of contiguous runs. Returns how many it moved.
    pub(crate) fn move_front_to(&mut self, n: usize, into: &mut Fifo<T>) -> usize {
        let n = n.min(self.len);
        into.reserve(n);
        let mut moved = 0;
        while moved < n {
            let from = self.slot(moved);
            let to = into.slot(into.len + moved);
            let run = (n - moved)
                .min(self.buf.len() - from)
                .min(into.buf.len() - to);
            // SAFETY: slots `from..from + run` hold items of `self` (the `moved`-th
            // oldest on, not past the buffer's end); slots `to..to + run` of `into`
            // are free (`reserve` made room for `n` past its items, not past the
            // buffer's end). Distinct buffers do not overlap. The items leave `self`
            // below, so each is owned once.
            unsafe {
                ptr::copy_nonoverlapping(
                    self.buf.as_ptr().add(from),
                    into.buf.as_mut_ptr().add(to),
                    run,
                );
            }
            moved += run;
        }
        self.head = self.slot(n);
        self.len -= n;
        into.len += n;
        n
    }

    /// The item `i` places from the oldest.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        // SAFETY: slot `slot(i)` holds an item (`i` is below `len`).
        Some(unsafe { self.buf[self.slot(i)].assume_init_ref() })
    }

    /// Drops every item, keeping the buffer.
    pub(crate) fn clear(&mut self) {
        while self.pop_front().is_some() {}
    }

    /// The oldest item.
    pub(crate) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// The items, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        (0..self.len).filter_map(|i| self.get(i))
    }

    /// Takes out the item `i` places from the oldest, the newer ones moving up one
    /// place (a scan's rare removal: one item at a time).
    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        // SAFETY: slot `slot(i)` holds an item; the loop below overwrites the slot
        // (or it leaves the items), so it is read once.
        let item = unsafe { self.buf[self.slot(i)].assume_init_read() };
        for k in i..self.len - 1 {
            let (to, from) = (self.slot(k), self.slot(k + 1));
            // SAFETY: both are slots of the buffer; the item in `from` moves to `to`,
            // whose item was taken out already, and `from` is then overwritten or
            // left outside the items.
            unsafe {
                ptr::copy_nonoverlapping(
                    self.buf.as_ptr().add(from),
                    self.buf.as_mut_ptr().add(to),
                    1,
                )
            };
        }
        self.len -= 1;
        Some(item)
    }
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo::new()
    }
}

impl<T> Drop for Fifo<T> {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
impl<T: PartialEq, const N: usize> PartialEq<[T; N]> for Fifo<T> {
    fn eq(&self, other: &[T; N]) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Fifo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;
    use std::rc::Rc;

    fn items<T: Clone>(fifo: &Fifo<T>) -> Vec<T> {
        fifo.iter().cloned().collect()
    }

    #[test]
    fn a_run_that_wraps_on_both_sides_moves_in_order() {
        let mut from = Fifo::new();
        let mut into = Fifo::new();
        // Both buffers of 8, their items starting near the end.
        for i in 0..6 {
            from.push_back(i);
            into.push_back(100 + i);
        }
        for _ in 0..5 {
            from.pop_front();
            into.pop_front();
        }
        for i in 6..12 {
            from.push_back(i);
        }
        into.push_back(106);
        assert_eq!(from.capacity(), 8);
        assert_eq!(into.move_front_to(0, &mut from), 0);
        assert_eq!(from.move_front_to(5, &mut into), 5);
        assert_eq!(items(&into), [105, 106, 5, 6, 7, 8, 9]);
        assert_eq!(items(&from), [10, 11]);
        assert_eq!(from.move_front_to(10, &mut into), 2, "no more than it has");
        assert!(from.is_empty());
        assert_eq!(into.len(), 9);
        assert_eq!(into.capacity(), 16, "grew for the run");
    }

    #[test]
    fn every_item_is_dropped_once() {
        let counted = Rc::new(());
        let mut a = Fifo::new();
        let mut b = Fifo::new();
        for _ in 0..20 {
            a.push_back(Rc::clone(&counted));
            b.push_front(Rc::clone(&counted));
        }
        a.move_front_to(7, &mut b);
        drop(a.remove(3));
        drop(b.pop_back());
        b.shrink_to(0);
        assert_eq!(Rc::strong_count(&counted), 1 + 38);
        drop(a);
        drop(b);
        assert_eq!(Rc::strong_count(&counted), 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        PushBack(u32),
        PushFront(u32),
        PopFront,
        PopBack,
        Extend(Vec<u32>),
        MoveToOther(usize),
        MoveFromOther(usize),
        Remove(usize),
        Shrink(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u32>().prop_map(Op::PushBack),
            any::<u32>().prop_map(Op::PushFront),
            Just(Op::PopFront),
            Just(Op::PopBack),
            prop::collection::vec(any::<u32>(), 0..40).prop_map(Op::Extend),
            (0usize..50).prop_map(Op::MoveToOther),
            (0usize..50).prop_map(Op::MoveFromOther),
            (0usize..40).prop_map(Op::Remove),
            (0usize..64).prop_map(Op::Shrink),
        ]
    }

    proptest! {
        /// Two fifos behave as two `VecDeque`s under any sequence of calls.
        #[test]
        fn fifos_match_vecdeques(ops in prop::collection::vec(op(), 0..200)) {
            let (mut a, mut b) = (Fifo::new(), Fifo::new());
            let (mut ma, mut mb) = (VecDeque::new(), VecDeque::new());
            for op in ops {
                match op {
                    Op::PushBack(x) => { a.push_back(x); ma.push_back(x); }
                    Op::PushFront(x) => { a.push_front(x); ma.push_front(x); }
                    Op::PopFront => prop_assert_eq!(a.pop_front(), ma.pop_front()),
                    Op::PopBack => prop_assert_eq!(a.pop_back(), ma.pop_back()),
                    Op::Extend(xs) => { a.extend(xs.iter().copied()); ma.extend(xs); }
                    Op::MoveToOther(n) => {
                        let k = n.min(ma.len());
                        prop_assert_eq!(a.move_front_to(n, &mut b), k);
                        mb.extend(ma.drain(..k));
                    }
                    Op::MoveFromOther(n) => {
                        let k = n.min(mb.len());
                        prop_assert_eq!(b.move_front_to(n, &mut a), k);
                        ma.extend(mb.drain(..k));
                    }
                    Op::Remove(i) => prop_assert_eq!(a.remove(i), ma.remove(i)),
                    Op::Shrink(c) => {
                        a.shrink_to(c);
                        prop_assert!(a.capacity() >= a.len());
                    }
                }
                prop_assert_eq!(a.len(), ma.len());
                prop_assert!(a.iter().eq(ma.iter()));
                prop_assert!(b.iter().eq(mb.iter()));
                prop_assert!(a.capacity() == 0 || a.capacity().is_power_of_two());
            }
        }
    }
}
