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
pub(crate) struct Rng(Arc<State>);

#[derive(Debug)]
struct State {
    counter: AtomicU64,
    /// Not seeded by the user: with the `testing` feature, the seed is
    /// taken at the first draw from the thread's scripted upstream, if it
    /// has one (see [`script_seed`]).
    #[cfg(feature = "testing")]
    unseeded: std::sync::atomic::AtomicBool,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(Arc::new(State {
            counter: AtomicU64::new(seed),
            #[cfg(feature = "testing")]
            unseeded: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// A generator with a seed of its own, different every run; with the
    /// `testing` feature, drawn from the script's seed instead when a
    /// scripted upstream was made on the thread of its first draw.
    pub(crate) fn random() -> Self {
        let rng = Rng::new(random_seed());
        #[cfg(feature = "testing")]
        rng.0.unseeded.store(true, Ordering::Relaxed);
        rng
    }

    fn next_u64(&self) -> u64 {
        #[cfg(feature = "testing")]
        if self.0.unseeded.load(Ordering::Relaxed)
            && self.0.unseeded.swap(false, Ordering::AcqRel)
            && let Some(seed) = script::next_seed()
        {
            self.0.counter.store(seed, Ordering::Relaxed);
        }
        let mut z = self
            .0
            .counter
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
        low + high.saturating_sub(low).mul_f64(self.unit())
    }
}

/// The `testing` feature's seeds for jitter nobody seeded: a scripted
/// upstream made on a thread gives that thread its script's seed, and each
/// unseeded generator's first draw on the thread takes the next seed of
/// that sequence. On a current-thread runtime in paused time the draws come
/// in the same order every run, so the seeds repeat with the script's.
#[cfg(feature = "testing")]
pub(crate) mod script {
    use std::cell::Cell;

    thread_local! {
        /// (the script's seed, seeds handed out since)
        static SEEDS: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
    }

    /// Jitter first drawn on this thread from now on comes from `seed`.
    pub(crate) fn set(seed: u64) {
        SEEDS.with(|s| s.set(Some((seed, 0))));
    }

    /// The next seed for an unseeded generator, if a script set one.
    pub(super) fn next_seed() -> Option<u64> {
        SEEDS.with(|s| {
            let (seed, n) = s.get()?;
            s.set(Some((seed, n + 1)));
            // Apart from the script's own draws, and from each other.
            Some(
                super::Rng::new(
                    seed ^ 0x6a09_e667_f3bc_c908 ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                )
                .next_u64(),
            )
        })
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
