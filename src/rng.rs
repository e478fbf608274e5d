//! Random numbers for jitter (backoff, open durations, fallbacks). Not for
//! anything that needs to be unpredictable to an adversary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A seed that differs between processes and between calls (from the
/// standard library's randomly keyed hasher).
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x853c_49e6_748f_ea9b);
    h.finish()
}

/// A jitter generator shared by clones: one atomic counter run through the
/// splitmix64 finalizer, so draws are well spread, lock-free, and repeat
/// exactly for a seed when the draws happen in the same order.
#[derive(Clone, Debug)]
pub(crate) struct Rng(Arc<AtomicU64>);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(Arc::new(AtomicU64::new(seed)))
    }

    pub(crate) fn random() -> Self {
        Rng::new(random_seed())
    }

    fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform number in `[0, 1)`.
    pub(crate) fn unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform duration in `[low, high]`.
    pub(crate) fn between(&self, low: Duration, high: Duration) -> Duration {
        low + (high - low).mul_f64(self.unit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_units_are_in_range_and_spread() {
        let rng = Rng::new(1);
        let draws: Vec<f64> = (0..10_000).map(|_| rng.unit()).collect();
        assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
        let below_half = draws.iter().filter(|&&u| u < 0.5).count();
        assert!((4_500..5_500).contains(&below_half), "{below_half}");
    }
}
