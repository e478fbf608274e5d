//! The volume guard: a cap on calls admitted per period, against runaway
//! retry loops that hammer a healthy upstream.

use std::sync::atomic::Ordering;

use crate::sync::AtomicU64;

/// Admissions of the last `period`, in buckets packed as
/// `(bucket number << 32) | count`, so one compare-and-swap both rolls a
/// bucket over and counts in it.
#[derive(Debug)]
pub(crate) struct VolumeGuard {
    limit: u64,
    width: u64,
    buckets: Box<[AtomicU64]>,
}

const BUCKETS: u64 = 16;

impl VolumeGuard {
    pub(crate) fn new(limit: u32, period_ns: u64) -> Self {
        VolumeGuard {
            limit: u64::from(limit),
            width: (period_ns / BUCKETS).max(1),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one admission at `now`, unless the last period already holds
    /// `limit` of them; then returns how long until the oldest bucket expires.
    pub(crate) fn try_admit(&self, now: u64) -> Result<(), u64> {
        let current = now / self.width;
        let mut total = 0;
        let mut oldest_age = 0;
        for b in self.buckets.iter() {
            let (period, count) = unpack(b.load(Ordering::Acquire));
            let age = (current & MASK).wrapping_sub(period) & MASK;
            if count > 0 && age < BUCKETS {
                total += count;
                oldest_age = oldest_age.max(age);
            }
        }
        if total >= self.limit {
            let expires = (current - oldest_age + BUCKETS) * self.width;
            return Err(expires.saturating_sub(now).max(1));
        }
        let slot = &self.buckets[(current % BUCKETS) as usize];
        let mut word = slot.load(Ordering::Acquire);
        loop {
            let (period, count) = unpack(word);
            let next = if period == current & MASK && count > 0 {
                pack(current, count + 1)
            } else {
                pack(current, 1)
            };
            match slot.compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(actual) => word = actual,
            }
        }
    }

    pub(crate) fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Ordering::Release);
        }
    }
}

/// Bucket numbers are kept to 32 bits and compared with wrapping arithmetic;
/// a bucket untouched for exactly 2^32 bucket widths would alias, which only
/// makes the guard count a stale bucket once.
const MASK: u64 = 0xffff_ffff;

fn pack(period: u64, count: u64) -> u64 {
    ((period & MASK) << 32) | count.min(MASK)
}

fn unpack(word: u64) -> (u64, u64) {
    (word >> 32, word & MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_rejects_call_k_plus_one_and_admits_again_after_the_period() {
        let g = VolumeGuard::new(3, 1_600);
        for t in [0, 10, 20] {
            assert!(g.try_admit(t).is_ok());
        }
        let wait = g.try_admit(30).unwrap_err();
        assert_eq!(wait, 1_600 - 30);
        assert!(g.try_admit(1_599).is_err());
        assert!(g.try_admit(1_600).is_ok());
    }

    #[test]
    fn bucket_numbers_wrap_without_losing_the_window() {
        let g = VolumeGuard::new(2, 16);
        let far = (1u64 << 33) + 5;
        assert!(g.try_admit(far).is_ok());
        assert!(g.try_admit(far + 1).is_ok());
        assert!(g.try_admit(far + 2).is_err());
        assert!(g.try_admit(far + 16).is_ok());
    }
}
