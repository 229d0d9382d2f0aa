//! Which items' latency is measured, and the clock arithmetic of a measurement.

#[cfg(feature = "stats")]
use std::num::NonZeroU64;
#[cfg(feature = "stats")]
use std::sync::OnceLock;
#[cfg(feature = "stats")]
use std::time::Instant;

/// When a measured item was queued, in [`Stamp::BITS`] bits, so that it shares one word
/// of the queue entry with the flush colour and the queueing CPU (`entry.rs`): ticks of
/// [`TICK_NS`] since the process's first stamp, modulo [`PERIOD`] (about 2.4 hours),
/// plus one. A wait longer than the period is measured modulo the period: a queue
/// entry then reads as having waited less (the watchdog reports such stalls).
#[cfg(feature = "stats")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(NonZeroU64);

/// Resolution of a [`Stamp`]: at most this much error per measurement, below the cost of
/// one clock read.
#[cfg(feature = "stats")]
const TICK_NS: u64 = 8;

/// Ticks a [`Stamp`] counts before wrapping: 2^40 - 1, about 2.44 hours of 8 ns ticks.
#[cfg(feature = "stats")]
const PERIOD: u64 = (1 << Stamp::BITS) - 1;

#[cfg(feature = "stats")]
impl Stamp {
    /// The instant stamps count from (taken by the first stamp).
    fn base() -> Instant {
        static BASE: OnceLock<Instant> = OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    /// Bits a stamp takes.
    pub(crate) const BITS: u32 = 40;

    fn now() -> Stamp {
        Stamp::at(Instant::now())
    }

    /// The stamp of `at` (an instant before the base counts as the base).
    fn at(at: Instant) -> Stamp {
        let ticks = Stamp::ticks(at);
        Stamp(NonZeroU64::MIN.saturating_add(ticks))
    }

    /// Ticks from the base to `at`, modulo the period.
    fn ticks(at: Instant) -> u64 {
        let ns = at.saturating_duration_since(Stamp::base()).as_nanos();
        (ns / u128::from(TICK_NS) % u128::from(PERIOD)) as u64
    }

    /// Nanoseconds from this stamp to `to` (a later instant), modulo the period.
    pub(crate) fn ns_until(self, to: Instant) -> u64 {
        let from = self.0.get() - 1;
        (Stamp::ticks(to) + PERIOD - from) % PERIOD * TICK_NS
    }

    /// The stamp as a non-zero number below 2^[`BITS`](Self::BITS), and back (0: none).
    pub(crate) fn to_bits(self) -> u64 {
        self.0.get()
    }

    pub(crate) fn from_bits(bits: u64) -> Option<Stamp> {
        NonZeroU64::new(bits & PERIOD).map(Stamp)
    }
}

/// Latency is measured on one item in [`SAMPLE_EVERY`] per queueing thread: a clock
/// read costs about as much as the rest of queueing a tiny item, and each measured
/// item takes three (queued, started, finished). The first item a thread queues is
/// always measured. The histograms then hold a systematic 1-in-16 sample: their
/// `count` is the sample size, not the item count (the item counters are exact), and a
/// percentile's rank error from sampling is about `sqrt(p (1 - p) / samples)`, e.g.
/// ±0.04 points for p99 after 1 M items; latency that depends on an item's position
/// modulo 16 in its thread's sequence would bias it.
#[cfg(feature = "stats")]
pub(crate) const SAMPLE_EVERY: u32 = 16;

/// The queueing time of an item if it is one to measure ([`SAMPLE_EVERY`]).
#[cfg(feature = "stats")]
#[inline]
pub(crate) fn sample_stamp() -> Option<Stamp> {
    thread_local! {
        /// W: queue calls of this thread, modulo `SAMPLE_EVERY`.
        static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    one_in(&CALLS, SAMPLE_EVERY).then(Stamp::now)
}

/// A contended pool-lock acquisition's wait is timed on one in [`LOCK_WAIT_EVERY`] per
/// thread (each thread's first always), for the same reason as [`SAMPLE_EVERY`]: two
/// clock reads cost more than a short wait, and a contended flood has hundreds of
/// thousands of them a second. Every contended acquisition is counted; the wait
/// reported is the timed ones' mean wait times that count (`LockCounters`).
#[cfg(feature = "stats")]
pub(crate) const LOCK_WAIT_EVERY: u32 = 8;

/// Whether to time this contended acquisition ([`LOCK_WAIT_EVERY`]).
#[cfg(feature = "stats")]
#[inline]
pub(crate) fn sample_lock_wait() -> bool {
    thread_local! {
        /// W: contended acquisitions of this thread, modulo `LOCK_WAIT_EVERY`.
        static WAITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    one_in(&WAITS, LOCK_WAIT_EVERY)
}

/// Counts an event in `counter` (modulo `every`): whether it is the first of its `every`.
#[cfg(feature = "stats")]
#[inline]
fn one_in(counter: &'static std::thread::LocalKey<std::cell::Cell<u32>>, every: u32) -> bool {
    counter.with(|c| {
        let n = c.get();
        c.set(if n + 1 == every { 0 } else { n + 1 });
        n == 0
    })
}

/// Nanoseconds since `start`, saturating.
#[cfg(feature = "stats")]
pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, feature = "stats", not(loom)))]
mod tests {
    use super::*;

    use std::time::Duration;

    #[test]
    fn a_stamp_measures_to_a_later_instant() {
        let stamp = Stamp::now();
        let later = Instant::now() + Duration::from_micros(250);
        let ns = stamp.ns_until(later);
        assert!((250_000..250_000 + 50_000_000).contains(&ns), "{ns}");
    }

    #[test]
    fn a_stamp_is_exact_to_a_tick_and_wraps_after_the_period() {
        let base = Stamp::base();
        let at = base + Duration::from_nanos(1_000_003);
        let stamp = Stamp::at(at);
        assert_eq!(stamp.ns_until(at), 0);
        assert_eq!(stamp.ns_until(at + Duration::from_nanos(800)), 800);
        let ns = stamp.ns_until(at + Duration::from_nanos(12_345));
        assert!(ns.abs_diff(12_345) < TICK_NS, "{ns}");
        let period = Duration::from_nanos(PERIOD * TICK_NS);
        assert_eq!(
            stamp.ns_until(at + period + Duration::from_micros(5)),
            5_000
        );
        let bits = stamp.to_bits();
        assert!(bits != 0 && bits < 1 << Stamp::BITS);
        assert_eq!(Stamp::from_bits(bits), Some(stamp));
        assert_eq!(Stamp::from_bits(0), None);
    }
}
