//! Latency histograms, written here rather than taken from `hdrhistogram`: recording
//! must be a few plain or relaxed atomic operations from any thread, with no lock.
//! Buckets are log-linear with 16 sub-buckets per power of two: values below 16 ns are
//! exact, others are reported with at most 1/16 relative error, in 7.8 KiB per histogram.

use crate::sync::{AtomicU64, Ordering::Relaxed};

use super::Latency;

const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// A lock-free log-linear histogram of nanosecond values, each recorded with a weight:
/// the items it stands for (`stats/sample.rs`).
pub(crate) struct Histogram {
    /// Weights by bucket.
    buckets: Box<[AtomicU64]>,
    /// The weights' sum.
    count: AtomicU64,
    /// Values recorded, whatever their weight.
    samples: AtomicU64,
    /// Values times their weights.
    sum: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
            max: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count.load(Relaxed))
            .finish()
    }
}

#[cfg_attr(not(feature = "stats"), allow(dead_code))]
fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let mantissa = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
    (exp - SUB_BITS + 1) as usize * SUB + mantissa
}

/// The largest value that falls in bucket `i`.
fn bucket_high(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let exp = (i / SUB) as u32 + SUB_BITS - 1;
    let mantissa = (i % SUB) as u64;
    let low = (SUB as u64 + mantissa) << (exp - SUB_BITS);
    low + ((1u64 << (exp - SUB_BITS)) - 1)
}

impl Histogram {
    /// Records `v` standing for `weight` items.
    #[inline]
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    pub(crate) fn record(&self, v: u64, weight: u64) {
        #[cfg(feature = "stats")]
        {
            self.buckets[bucket_of(v)].fetch_add(weight, Relaxed);
            self.count.fetch_add(weight, Relaxed);
            self.samples.fetch_add(1, Relaxed);
            self.sum.fetch_add(v.saturating_mul(weight), Relaxed);
            self.min.fetch_min(v, Relaxed);
            self.max.fetch_max(v, Relaxed);
        }
        #[cfg(not(feature = "stats"))]
        let _ = (v, weight);
    }

    /// Records `v` standing for `weight` items; only the histogram's one writer may
    /// call this (AW).
    #[inline]
    #[cfg_attr(not(feature = "stats"), allow(dead_code))]
    pub(crate) fn record_owned(&self, v: u64, weight: u64) {
        #[cfg(feature = "stats")]
        {
            let bump = |a: &AtomicU64, n: u64| a.store(a.load(Relaxed).wrapping_add(n), Relaxed);
            bump(&self.buckets[bucket_of(v)], weight);
            bump(&self.count, weight);
            bump(&self.samples, 1);
            bump(&self.sum, v.saturating_mul(weight));
            if v < self.min.load(Relaxed) {
                self.min.store(v, Relaxed);
            }
            if v > self.max.load(Relaxed) {
                self.max.store(v, Relaxed);
            }
        }
        #[cfg(not(feature = "stats"))]
        let _ = (v, weight);
    }

    /// Adds `other`'s values to this histogram.
    pub(super) fn absorb(&self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter().zip(other.buckets.iter()) {
            let n = theirs.load(Relaxed);
            if n > 0 {
                mine.fetch_add(n, Relaxed);
            }
        }
        self.count.fetch_add(other.count.load(Relaxed), Relaxed);
        self.samples.fetch_add(other.samples.load(Relaxed), Relaxed);
        self.sum.fetch_add(other.sum.load(Relaxed), Relaxed);
        self.min.fetch_min(other.min.load(Relaxed), Relaxed);
        self.max.fetch_max(other.max.load(Relaxed), Relaxed);
    }

    #[cfg(all(test, feature = "stats"))]
    pub(super) fn snapshot(&self) -> Latency {
        Histogram::merged_snapshot(std::iter::once(self))
    }

    /// The distribution of all values recorded in `parts`.
    pub(super) fn merged_snapshot<'a>(
        parts: impl Iterator<Item = &'a Histogram> + Clone,
    ) -> Latency {
        let mut counts = vec![0u64; BUCKETS];
        let (mut recorded, mut samples, mut sum, mut min, mut max) =
            (0u64, 0u64, 0u64, u64::MAX, 0u64);
        for h in parts {
            for (c, b) in counts.iter_mut().zip(h.buckets.iter()) {
                *c += b.load(Relaxed);
            }
            recorded += h.count.load(Relaxed);
            samples += h.samples.load(Relaxed);
            sum = sum.wrapping_add(h.sum.load(Relaxed));
            min = min.min(h.min.load(Relaxed));
            max = max.max(h.max.load(Relaxed));
        }
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return Latency::default();
        }
        let min = min.min(max);
        let mean = sum as f64 / recorded.max(1) as f64;
        let var = counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| {
                let low = if i == 0 { 0 } else { bucket_high(i - 1) + 1 };
                let mid = (low as f64 + bucket_high(i) as f64) / 2.0;
                n as f64 * (mid - mean) * (mid - mean)
            })
            .sum::<f64>()
            / count as f64;
        let quantile = |q: f64| {
            let rank = ((q * count as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, &n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return bucket_high(i).min(max).max(min);
                }
            }
            max
        };
        Latency {
            count,
            samples,
            min,
            mean,
            stdev: var.sqrt(),
            max,
            p50: quantile(0.5),
            p90: quantile(0.9),
            p99: quantile(0.99),
            p999: quantile(0.999),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b >= last, "{v}");
            last = b;
            assert!(
                bucket_high(b) >= v,
                "{v} above its bucket {}",
                bucket_high(b)
            );
            let low = if b == 0 { 0 } else { bucket_high(b - 1) + 1 };
            assert!(low <= v, "{v} below its bucket");
            assert!((bucket_high(b) - low) as f64 <= (v as f64 / 16.0).max(0.0) + 1.0);
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[cfg(feature = "stats")]
    #[test]
    fn histogram_quantiles() {
        let h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000, 1);
        }
        let l = h.snapshot();
        assert_eq!(l.count, 1000);
        assert_eq!(l.samples, 1000);
        assert_eq!(l.min, 1000);
        assert_eq!(l.max, 1_000_000);
        assert!((l.mean - 500_500.0).abs() < 1.0);
        for (got, want) in [(l.p50, 500_000.0), (l.p90, 900_000.0), (l.p99, 990_000.0)] {
            let err = (got as f64 - want).abs() / want;
            assert!(err <= 1.0 / 16.0, "{got} vs {want}");
        }
        assert!(l.stdev > 280_000.0 && l.stdev < 300_000.0, "{}", l.stdev);
        assert_eq!(Histogram::default().snapshot(), Latency::default());
    }

    /// A weighted value counts as that many: 10 values of 1 µs standing for 9 items
    /// each against 10 of 1 ms standing for 1 make the median 1 µs and the p99 1 ms.
    #[cfg(feature = "stats")]
    #[test]
    fn weights_count_as_items() {
        let h = Histogram::default();
        let owned = Histogram::default();
        for _ in 0..10 {
            h.record(1_000, 9);
            h.record(1_000_000, 1);
            owned.record_owned(1_000, 9);
            owned.record_owned(1_000_000, 1);
        }
        for l in [h.snapshot(), owned.snapshot()] {
            assert_eq!((l.count, l.samples), (100, 20));
            assert!(l.p50.abs_diff(1_000) <= 1_000 / 16, "{}", l.p50);
            assert!(l.p99.abs_diff(1_000_000) <= 1_000_000 / 16, "{}", l.p99);
            assert!((l.mean - 100_900.0).abs() < 1.0, "{}", l.mean);
        }
        let merged = Histogram::default();
        merged.absorb(&h);
        merged.absorb(&owned);
        assert_eq!(merged.snapshot().samples, 40);
    }
}
