//! Lifetime counters striped across cache lines, so that threads admitting
//! calls at once don't fight over one line.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::state::Counters;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Admitted,
    Rejected,
    Successes,
    Failures,
    Ignored,
    RateLimited,
    QuotaExhausted,
    Dropped,
    Slow,
    WouldReject,
}

const COUNTERS: usize = 10;

/// One stripe fills its own pair of cache lines (adjacent-line prefetch makes
/// 128 bytes the unit of false sharing on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe([AtomicU64; COUNTERS]);

#[derive(Debug)]
pub(crate) struct Striped {
    stripes: Box<[Stripe]>,
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn thread_index() -> usize {
    THREAD_INDEX.with(|i| {
        let mut v = i.get();
        if v == usize::MAX {
            v = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            i.set(v);
        }
        v
    })
}

impl Striped {
    /// `stripes` must be a power of two.
    pub(crate) fn new(stripes: usize) -> Self {
        debug_assert!(stripes.is_power_of_two());
        Striped {
            stripes: (0..stripes).map(|_| Stripe::default()).collect(),
        }
    }

    #[inline]
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        let stripe = if self.stripes.len() == 1 {
            &self.stripes[0]
        } else {
            &self.stripes[thread_index() & (self.stripes.len() - 1)]
        };
        stripe.0[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn incr(&self, counter: Counter) {
        self.add(counter, 1);
    }

    pub(crate) fn sum(&self) -> Counters {
        let mut total = [0u64; COUNTERS];
        for stripe in self.stripes.iter() {
            for (t, c) in total.iter_mut().zip(stripe.0.iter()) {
                *t += c.load(Ordering::Relaxed);
            }
        }
        let get = |c: Counter| total[c as usize];
        Counters {
            admitted: get(Counter::Admitted),
            rejected: get(Counter::Rejected),
            successes: get(Counter::Successes),
            failures: get(Counter::Failures),
            ignored: get(Counter::Ignored),
            rate_limited: get(Counter::RateLimited),
            quota_exhausted: get(Counter::QuotaExhausted),
            dropped: get(Counter::Dropped),
            slow: get(Counter::Slow),
            would_reject: get(Counter::WouldReject),
        }
    }
}
