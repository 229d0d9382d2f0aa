//! The simulator's random numbers: SplitMix64 (Steele, Lea, Flood, "Fast splittable
//! pseudorandom number generators", OOPSLA 2014).
//!
//! Hand-written rather than taken from a crate because the simulator promises
//! byte-identical output for a seed across releases: SplitMix64 is fixed by its three
//! published constants, so no dependency update can change a run.

/// A SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2^-32 for
    /// the small `n` used here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `ns` scaled by a factor drawn uniformly from `[1 - jitter, 1 + jitter]`.
    pub fn jitter(&mut self, ns: u64, jitter: f64) -> u64 {
        if jitter <= 0.0 || ns == 0 {
            return ns;
        }
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        crate::events::to_ns(ns as f64 * (1.0 - jitter + 2.0 * jitter * unit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // The reference implementation's first outputs for seed 0.
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn bounded_draws_stay_in_range() {
        let mut rng = Rng::new(7);
        for _ in 0..1000 {
            assert!(rng.below(5) < 5);
            let j = rng.jitter(1000, 0.1);
            assert!((900..=1100).contains(&j), "{j}");
        }
        assert_eq!(rng.jitter(1000, 0.0), 1000);
    }
}
