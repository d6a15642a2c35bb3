//! Deterministic pseudo-random numbers for the simulated workload.
//!
//! A tiny splitmix64 generator (no `rand` dependency): every entity (node, pod, churn
//! replacement) draws from its own stream derived from `(seed, domain, index)`, so adding
//! one entity never shifts the values of another and a seed always yields the same cluster.

/// splitmix64 finaliser: a good 64-bit mixing function.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A splitmix64 pseudo-random generator.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for `(seed, domain, index)`: independent streams per entity.
    pub(crate) fn stream(seed: u64, domain: u64, index: u64) -> Self {
        Self { state: mix64(seed ^ mix64(domain.wrapping_add(mix64(index)))) }
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// A float uniformly in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        // 53 random mantissa bits; the conversions are exact.
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An integer uniformly in `[lo, hi]` (inclusive; `hi >= lo`).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi.saturating_sub(lo).saturating_add(1);
        // Modulo bias is irrelevant for a simulator's spans (all far below 2^32).
        lo + self.next_u64() % span
    }

    /// A float log-uniformly distributed in `[lo, hi)` (both > 0): small values as common
    /// per decade as big ones, like real resource usage.
    pub(crate) fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.next_f64() * (hi.ln() - lo.ln())).exp()
    }

    /// `true` with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_independent() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::stream(1, 2, 3);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SplitMix64::stream(1, 2, 3);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = SplitMix64::stream(1, 2, 4);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = SplitMix64::stream(9, 9, 9);
        for _ in 0..1000 {
            let v = r.range(5, 7);
            assert!((5..=7).contains(&v));
            let f = r.log_uniform(0.005, 0.8);
            assert!((0.005..0.8).contains(&f));
        }
    }
}
