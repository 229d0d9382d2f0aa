//! The statistics' clock (item latency, sampled lock waits): the CPU's time-stamp
//! counter where the kernel keeps time by it, else `Instant`.
//!
//! A measured item reads the clock three times, once in its queue call and twice on its
//! worker's path (`sample.rs`). `Instant::now` is a `clock_gettime` call through the
//! vDSO: 32 ns on this project's 2-CPU machines, against 13 ns for `rdtsc`. Those reads
//! sit between two items of a closed loop, where a shared pod's worker either takes the
//! next item while it spins or parks, and with the counter `system`'s closed loop ran
//! 7% faster (PERFORMANCE.md, "The time-stamp counter for item latency").
//!
//! The counter is used only where the kernel's own clocksource is `tsc`: the kernel
//! picks it only when the counter runs at a constant rate, through idle states, and in
//! step on every CPU, which a stamp taken on one CPU and read on another needs. Its
//! rate is calibrated once against `Instant` (a few hundred microseconds, at the first
//! workqueue's build, [`init`]); elsewhere (another clocksource, another architecture,
//! a calibration that reads an implausible rate, Miri) the clock is `Instant`. The
//! choice is made once: should the kernel later give up the counter (its clocksource
//! watchdog marking it unstable), latency goes on being timed by it. A reading keeps
//! the source's raw value; it becomes nanoseconds since the clock's base (the moment
//! the source was chosen) only when a time is computed from it.

use std::sync::OnceLock;
use std::time::Instant;

/// Where the readings come from, chosen once.
#[derive(Debug)]
enum Source {
    /// The time-stamp counter: ticks since `base`, times `ns_per_tick_q32 / 2^32`.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    Tsc { base: u64, ns_per_tick_q32: u64 },
    /// `Instant`, since `base`.
    Monotonic { base: Instant },
}

/// The source, chosen (and the counter calibrated) by the first reading or [`init`].
fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(Source::choose)
}

/// Chooses the source now, so that no measured item pays for the calibration.
pub(crate) fn init() {
    source();
}

/// A reading of the clock, as cheap as the source allows: the counter's raw value
/// (converted only when a time is computed from it) or nanoseconds since the base.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading(u64);

/// Reads the clock.
#[inline]
pub(crate) fn now() -> Reading {
    match source() {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        Source::Tsc { .. } => Reading(tsc()),
        Source::Monotonic { base } => Reading(ns_since(base)),
    }
}

impl Reading {
    /// Nanoseconds from the clock's base to this reading.
    #[inline]
    pub(crate) fn ns(self) -> u64 {
        match source() {
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            &Source::Tsc {
                base,
                ns_per_tick_q32,
            } => ticks_to_ns(self.0.saturating_sub(base), ns_per_tick_q32),
            Source::Monotonic { .. } => self.0,
        }
    }

    /// Nanoseconds from this reading to now, 0 if the clock read earlier.
    #[inline]
    pub(crate) fn elapsed_ns(self) -> u64 {
        elapsed_since(self.ns())
    }
}

/// Nanoseconds since the clock's base, now.
#[inline]
pub(crate) fn now_ns() -> u64 {
    now().ns()
}

/// Nanoseconds from `start_ns` (an earlier [`now_ns`]) to now, 0 if the clock read earlier.
#[inline]
pub(crate) fn elapsed_since(start_ns: u64) -> u64 {
    now_ns().saturating_sub(start_ns)
}

/// Nanoseconds since `base`, out of line: where the counter is the source, the callers'
/// hot code stays as small as its `rdtsc`.
#[inline(never)]
fn ns_since(base: &Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// `ticks` in nanoseconds at `ns_per_tick_q32 / 2^32` nanoseconds a tick.
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
#[inline]
fn ticks_to_ns(ticks: u64, ns_per_tick_q32: u64) -> u64 {
    let ns = (u128::from(ticks) * u128::from(ns_per_tick_q32)) >> 32;
    u64::try_from(ns).unwrap_or(u64::MAX)
}

impl Source {
    fn choose() -> Source {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if kernel_clocksource_is_tsc() {
            if let Some(source) = Source::calibrated_tsc() {
                return source;
            }
        }
        Source::Monotonic {
            base: Instant::now(),
        }
    }

    /// The counter's rate against `Instant` over [`CALIBRATION`]; `None` if it reads
    /// outside [`plausible_rate`].
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    fn calibrated_tsc() -> Option<Source> {
        let (tick0, at0) = paired_reading();
        while at0.elapsed() < CALIBRATION {
            std::hint::spin_loop();
        }
        let (tick1, at1) = paired_reading();
        let ns = u64::try_from(at1.duration_since(at0).as_nanos()).ok()?;
        let ns_per_tick_q32 = plausible_rate(tick1.checked_sub(tick0)?, ns)?;
        Some(Source::Tsc {
            base: tick0,
            ns_per_tick_q32,
        })
    }
}

/// How long the counter is calibrated against `Instant`: each end of the interval is
/// known to within the ~20 ns of one clock read, so 0.02% of a 200 µs interval, finer
/// than the latency histograms' buckets.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const CALIBRATION: std::time::Duration = std::time::Duration::from_micros(200);

/// Nanoseconds a tick, times 2^32, from `ticks` counted in `ns`; `None` for a rate
/// outside 100 MHz … 20 GHz (no counter runs there: a bad reading).
#[cfg(any(test, all(target_arch = "x86_64", not(miri))))]
fn plausible_rate(ticks: u64, ns: u64) -> Option<u64> {
    if ticks == 0 {
        return None;
    }
    let q32 = (u128::from(ns) << 32) / u128::from(ticks);
    let (fastest, slowest) = ((1u128 << 32) / 20, (1u128 << 32) * 10);
    (fastest..=slowest)
        .contains(&q32)
        .then(|| u64::try_from(q32).ok())
        .flatten()
}

/// A counter reading and an `Instant` taken together: of three tries, the one whose
/// `Instant` read took the least counter time, at its middle (a try that the thread was
/// preempted in is not the one kept).
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn paired_reading() -> (u64, Instant) {
    let try_once = || {
        let before = tsc();
        let at = Instant::now();
        let after = tsc();
        let spread = after.wrapping_sub(before);
        (spread, before.wrapping_add(spread / 2), at)
    };
    let mut best = try_once();
    for _ in 1..3 {
        let next = try_once();
        if next.0 < best.0 {
            best = next;
        }
    }
    let (_, tick, at) = best;
    (tick, at)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` only copies the time-stamp counter into registers: it touches no
    // memory and is part of every x86_64 CPU (no target feature to check). A process that
    // made it fault (`PR_SET_TSC`) gets a signal, not undefined behaviour.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Whether the kernel keeps time by the time-stamp counter (a missing or unreadable
/// file: no).
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn kernel_clocksource_is_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|name| name.trim() == "tsc")
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    use std::time::Duration;

    #[test]
    fn the_clock_keeps_time_with_instant() {
        init();
        let (r0, at0) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (r1, at1) = (now(), Instant::now());
        let clock = r1.ns() - r0.ns();
        let instant = u64::try_from(at1.duration_since(at0).as_nanos()).unwrap();
        // Within 1% plus the reads' own time: a wrong rate or unit would be far off.
        assert!(
            clock.abs_diff(instant) < instant / 100 + 20_000,
            "{clock} against {instant} ns ({:?})",
            source()
        );
        assert!(r0.elapsed_ns() >= clock && r0.elapsed_ns() < 10_000_000_000);
        let later = now();
        assert_eq!(Reading(later.0 + 1_000_000_000).elapsed_ns(), 0);
        assert_eq!(elapsed_since(now_ns() + 1_000_000_000), 0);
    }

    #[test]
    fn the_counter_is_the_clock_where_the_kernel_keeps_time_by_it() {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if kernel_clocksource_is_tsc() {
            assert!(matches!(source(), Source::Tsc { .. }), "{:?}", source());
            return;
        }
        assert!(
            matches!(source(), Source::Monotonic { .. }),
            "{:?}",
            source()
        );
    }

    #[test]
    fn rates_outside_any_counter_are_refused() {
        assert_eq!(plausible_rate(0, 1_000), None);
        // 2.5 GHz: 0.4 ns a tick.
        let q32 = plausible_rate(500_000, 200_000).unwrap();
        assert_eq!(ticks_to_ns(2_500_000_000, q32), 999_999_999);
        assert_eq!(plausible_rate(1_000, 1_000), Some(1 << 32));
        // 50 GHz and 10 MHz.
        assert_eq!(plausible_rate(10_000_000, 200_000), None);
        assert_eq!(plausible_rate(2_000, 200_000), None);
    }

    #[test]
    fn ticks_convert_without_overflow() {
        assert_eq!(ticks_to_ns(u64::MAX, 1 << 32), u64::MAX);
        assert_eq!(ticks_to_ns(u64::MAX, 10 << 32), u64::MAX);
        assert_eq!(ticks_to_ns(7, 3 << 31), 10);
    }
}
