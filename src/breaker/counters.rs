//! Lifetime counters striped across cache lines, so that threads recording
//! calls at once don't fight over one line.
//!
//! The first threads to touch a breaker's counters (in practice a runtime's
//! workers) each own one stripe outright and count with a plain load and
//! store: nobody else writes it. Later threads share one more stripe and
//! count with atomic read-modify-writes.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::AtomicU64;

use super::state::Counters;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Rejected,
    Successes,
    Failures,
    Ignored,
    RateLimited,
    QuotaExhausted,
    Dropped,
    Slow,
    WouldReject,
    VolumeLimited,
    ProbeSuccesses,
    ProbeFailures,
}

const COUNTERS: usize = 12;

/// One stripe fills its own pair of cache lines (adjacent-line prefetch makes
/// 128 bytes the unit of false sharing on x86).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe([AtomicU64; COUNTERS]);

#[derive(Debug)]
pub(crate) struct Striped {
    /// Stripe `i` is written only by the thread whose index is `i`.
    owned: Box<[Stripe]>,
    /// Written by every other thread, atomically.
    shared: Stripe,
}

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

#[inline]
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
    /// `owned` stripes for the first threads, plus one they share.
    pub(crate) fn new(owned: usize) -> Self {
        Striped {
            owned: (0..owned).map(|_| Stripe::default()).collect(),
            shared: Stripe::default(),
        }
    }

    #[inline]
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        let i = thread_index();
        match self.owned.get(i) {
            // Thread indices are unique, so this thread is the stripe's only
            // writer: no read-modify-write needed. Under loom every model
            // thread shares one index, so it counts atomically.
            Some(stripe) if !cfg!(loom) => {
                let c = &stripe.0[counter as usize];
                c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
            }
            _ => {
                self.shared.0[counter as usize].fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    #[inline]
    pub(crate) fn incr(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// Sums the stripes; `in_flight` is the number of live permits.
    pub(crate) fn sum(&self, in_flight: u64) -> Counters {
        let mut total = [0u64; COUNTERS];
        for stripe in self.owned.iter().chain([&self.shared]) {
            for (t, c) in total.iter_mut().zip(stripe.0.iter()) {
                *t += c.load(Ordering::Relaxed);
            }
        }
        let get = |c: Counter| total[c as usize];
        Counters {
            // Every admitted call holds a permit until it records an outcome
            // or is dropped, so admissions need no counter of their own.
            admitted: get(Counter::Successes)
                + get(Counter::Failures)
                + get(Counter::Ignored)
                + get(Counter::RateLimited)
                + get(Counter::QuotaExhausted)
                + get(Counter::Dropped)
                + in_flight,
            in_flight,
            rejected: get(Counter::Rejected),
            successes: get(Counter::Successes),
            failures: get(Counter::Failures),
            ignored: get(Counter::Ignored),
            rate_limited: get(Counter::RateLimited),
            quota_exhausted: get(Counter::QuotaExhausted),
            dropped: get(Counter::Dropped),
            slow: get(Counter::Slow),
            would_reject: get(Counter::WouldReject),
            volume_limited: get(Counter::VolumeLimited),
            probe_successes: get(Counter::ProbeSuccesses),
            probe_failures: get(Counter::ProbeFailures),
        }
    }
}
