//! Which items' latency is measured, and the clock arithmetic of a measurement.

#[cfg(feature = "stats")]
use std::num::NonZeroU64;

#[cfg(feature = "stats")]
use super::clock;

/// When a measured item was queued, in [`Stamp::BITS`] bits, so that it shares one word
/// of the queue entry with the flush colour and the queueing CPU (`entry.rs`): ticks of
/// [`TICK_NS`] of the statistics' clock (`clock.rs`, nanoseconds since its base),
/// modulo [`PERIOD`] (about 2.4 hours), plus one. A wait longer than the
/// period is measured modulo the period: a queue entry then reads as having waited less
/// (the watchdog reports such stalls).
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
    /// Bits a stamp takes.
    pub(crate) const BITS: u32 = 40;

    /// The stamp of the clock reading `at_ns` (nanoseconds, [`clock::Reading::ns`]).
    fn at(at_ns: u64) -> Stamp {
        Stamp(NonZeroU64::MIN.saturating_add(Stamp::ticks(at_ns)))
    }

    /// Ticks of the clock reading `at_ns`, modulo the period.
    fn ticks(at_ns: u64) -> u64 {
        at_ns / TICK_NS % PERIOD
    }

    /// Nanoseconds from this stamp to the later clock reading `to_ns`, modulo the period.
    pub(crate) fn ns_until(self, to_ns: u64) -> u64 {
        let from = self.0.get() - 1;
        (Stamp::ticks(to_ns) + PERIOD - from) % PERIOD * TICK_NS
    }

    /// The stamp as a non-zero number below 2^[`BITS`](Self::BITS), and back (0: none).
    pub(crate) fn to_bits(self) -> u64 {
        self.0.get()
    }

    pub(crate) fn from_bits(bits: u64) -> Option<Stamp> {
        NonZeroU64::new(bits & PERIOD).map(Stamp)
    }
}

/// Which items' latency is measured: per queueing thread, one item in a *period* that
/// adapts to the thread's rate, so that measured items come about [`SAMPLE_GAP_NS`]
/// apart. Each measured item costs three clock reads (queued, started, finished;
/// `clock.rs`) and two histogram records, a good part of what queueing and running a
/// tiny item costs, so a fixed rate costs a flood dearly and a slow stream gets few
/// samples. The period is a
/// power of two from 1 (every item, for a thread that queues at most once per 16 µs)
/// to 128 (a flood, [`MAX_PERIOD_LOG2`]): it doubles when two measured items came less
/// than half the gap apart, halves when they came more than twice the gap apart. The
/// first item a thread queues is always measured.
///
/// A measured item stands for the items its thread queued since its previous measured
/// one, itself included: its *weight*, the period that led to it. The histograms count
/// each value with its weight, so their percentiles and means are those of all items
/// (not of the measured ones, which over-represent slow stretches), their `count`
/// estimates the items they stand for, and their `samples` is the sample's size. A
/// percentile's rank error from sampling is then about `sqrt(p (1 - p) / samples)`:
/// ±0.1 points for p99 after 10 000 samples, which a flood of one thread (one sample
/// per 128 items) collects in 128 ms and a stream of one item per 100 µs in a second.
/// Latency that varies with an item's position in a period biases them (the weight
/// assumes the items between two samples are like the sample).
#[cfg(feature = "stats")]
pub(crate) const SAMPLE_GAP_NS: u64 = 32_000;

/// Bits of a weight's exponent, as it travels in the queue entry's word
/// ([`Sample::weight_log2`]).
#[cfg(feature = "stats")]
pub(crate) const WEIGHT_BITS: u32 = 3;

/// The largest period's exponent: one measured item stands for at most 128 items, so a
/// thread queueing 10 M items a second measures one every 12.8 µs.
#[cfg(feature = "stats")]
const MAX_PERIOD_LOG2: u32 = (1 << WEIGHT_BITS) - 1;

/// A measured item: when it was queued and how many items it stands for.
#[cfg(feature = "stats")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) stamp: Stamp,
    /// Its weight is `1 << weight_log2` (at most `1 << MAX_PERIOD_LOG2`).
    pub(crate) weight_log2: u32,
}

/// The next period's exponent, after two measured items `gap_ns` apart under a period
/// of `1 << log2` ([`SAMPLE_GAP_NS`]).
#[cfg(feature = "stats")]
fn next_period_log2(log2: u32, gap_ns: u64) -> u32 {
    if gap_ns < SAMPLE_GAP_NS / 2 {
        (log2 + 1).min(MAX_PERIOD_LOG2)
    } else if gap_ns > SAMPLE_GAP_NS * 2 {
        log2.saturating_sub(1)
    } else {
        log2
    }
}

/// A queueing thread's sampling state (all W).
#[cfg(feature = "stats")]
struct Sampler {
    /// Queue calls left before the next measured one.
    countdown: std::cell::Cell<u32>,
    /// The current period's exponent.
    log2: std::cell::Cell<u32>,
    /// The stamp of the last measured item (none yet: the next call is the first).
    last: std::cell::Cell<Option<Stamp>>,
}

/// The measurement of this queue call's item if it is one to measure
/// ([`SAMPLE_GAP_NS`]): one thread-local decrement for the others.
#[cfg(feature = "stats")]
#[inline]
pub(crate) fn sample_stamp() -> Option<Sample> {
    thread_local! {
        static SAMPLER: Sampler = const {
            Sampler {
                countdown: std::cell::Cell::new(0),
                log2: std::cell::Cell::new(0),
                last: std::cell::Cell::new(None),
            }
        };
    }
    SAMPLER.with(|s| s.call(clock::now, clock::Reading::ns))
}

#[cfg(feature = "stats")]
impl Sampler {
    /// One queue call: measured (reading the clock with `read`, whose reading `ns`
    /// converts to nanoseconds) or counted down.
    #[inline]
    fn call<R>(&self, read: impl FnOnce() -> R, ns: impl FnOnce(R) -> u64) -> Option<Sample> {
        let left = self.countdown.get();
        if left > 0 {
            self.countdown.set(left - 1);
            return None;
        }
        Some(self.measure(read(), ns))
    }

    /// Measures the call at `reading`, converted out of line: its weight is the period
    /// that led to it, and the gap since the last measured call sets the next period.
    #[cold]
    fn measure<R>(&self, reading: R, ns: impl FnOnce(R) -> u64) -> Sample {
        let now_ns = ns(reading);
        let stamp = Stamp::at(now_ns);
        let weight_log2 = self.log2.get();
        if let Some(last) = self.last.get() {
            let next = next_period_log2(weight_log2, last.ns_until(now_ns));
            self.log2.set(next);
        }
        self.last.set(Some(stamp));
        self.countdown.set((1 << self.log2.get()) - 1);
        Sample { stamp, weight_log2 }
    }
}

/// A contended pool-lock acquisition's wait is timed on one in [`LOCK_WAIT_EVERY`] per
/// thread (each thread's first always), for the same reason as item latency
/// ([`SAMPLE_GAP_NS`]): two clock reads cost more than a short wait, and a contended
/// flood has hundreds of thousands of them a second. Every contended acquisition is counted; the wait
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

#[cfg(all(test, feature = "stats", not(loom)))]
mod tests {
    use super::*;

    use std::time::Duration;

    #[test]
    fn a_stamp_measures_to_a_later_reading() {
        let stamp = Stamp::at(clock::now_ns());
        std::thread::sleep(Duration::from_micros(250));
        let ns = stamp.ns_until(clock::now_ns());
        assert!((250_000..250_000 + 50_000_000).contains(&ns), "{ns}");
    }

    #[test]
    fn the_period_doubles_on_close_samples_and_halves_on_far_ones() {
        let close = SAMPLE_GAP_NS / 2 - 1;
        let far = SAMPLE_GAP_NS * 2 + 1;
        assert_eq!(next_period_log2(0, close), 1);
        assert_eq!(next_period_log2(MAX_PERIOD_LOG2, close), MAX_PERIOD_LOG2);
        assert_eq!(next_period_log2(3, far), 2);
        assert_eq!(next_period_log2(0, far), 0);
        assert_eq!(next_period_log2(3, SAMPLE_GAP_NS), 3);
    }

    fn fresh() -> Sampler {
        Sampler {
            countdown: std::cell::Cell::new(0),
            log2: std::cell::Cell::new(0),
            last: std::cell::Cell::new(None),
        }
    }

    /// Calls `every` apart: the weights of the measured ones, and how many calls came
    /// up to the last measured one.
    fn drive(calls: u64, every: Duration) -> (Vec<u64>, u64) {
        let sampler = fresh();
        let every_ns = u64::try_from(every.as_nanos()).unwrap();
        let (mut weights, mut upto) = (Vec::new(), 0);
        for i in 0..calls {
            let at = 1_000 + every_ns * i;
            if let Some(sample) = sampler.call(|| at, |ns| ns) {
                weights.push(1u64 << sample.weight_log2);
                upto = i + 1;
            }
        }
        (weights, upto)
    }

    #[test]
    fn a_flood_is_sampled_sparsely_and_its_weights_count_its_calls() {
        let (weights, upto) = drive(100_000, Duration::from_nanos(100));
        assert_eq!(weights[0], 1, "the first call is measured alone");
        assert_eq!(weights.iter().sum::<u64>(), upto);
        assert_eq!(*weights.last().unwrap(), 1 << MAX_PERIOD_LOG2);
        // 100 000 calls: a few to reach the largest period, then one in 128.
        assert!((780..800).contains(&weights.len()), "{}", weights.len());
    }

    #[test]
    fn a_slow_stream_is_measured_item_by_item() {
        let (weights, upto) = drive(1_000, Duration::from_micros(100));
        assert_eq!(weights.len(), 1_000);
        assert!(weights.iter().all(|&w| w == 1));
        assert_eq!(upto, 1_000);
    }

    #[test]
    fn a_moderate_stream_keeps_its_samples_about_the_gap_apart() {
        // One call per 5 µs: the period settles where samples are 16 to 64 µs apart.
        let every = Duration::from_micros(5);
        let (weights, upto) = drive(10_000, every);
        assert_eq!(weights.iter().sum::<u64>(), upto);
        let settled = weights[weights.len() - 1];
        let gap = every.as_nanos() as u64 * settled;
        assert!(
            (SAMPLE_GAP_NS / 2..=SAMPLE_GAP_NS * 2).contains(&gap),
            "{gap}"
        );
    }

    #[test]
    fn a_stamp_is_exact_to_a_tick_and_wraps_after_the_period() {
        let at = 1_000_003;
        let stamp = Stamp::at(at);
        assert_eq!(stamp.ns_until(at), 0);
        assert_eq!(stamp.ns_until(at + 800), 800);
        let ns = stamp.ns_until(at + 12_345);
        assert!(ns.abs_diff(12_345) < TICK_NS, "{ns}");
        let period = PERIOD * TICK_NS;
        assert_eq!(stamp.ns_until(at + period + 5_000), 5_000);
        let bits = stamp.to_bits();
        assert!(bits != 0 && bits < 1 << Stamp::BITS);
        assert_eq!(Stamp::from_bits(bits), Some(stamp));
        assert_eq!(Stamp::from_bits(0), None);
    }
}
