//! Lifetime counters striped across cache lines, so that threads recording
//! calls at once don't fight over one line.
//!
//! Every thread that counts gets a small index, unique among the threads
//! alive, and handed on to a new thread when its thread exits (so runtimes
//! that come and go do not use the indices up). The thread with index `i`
//! owns stripe `i` of every breaker outright and counts with a plain load
//! and store: nobody else writes it. Threads beyond the owned stripes share
//! one more stripe and count with atomic read-modify-writes.
//!
//! Breakers that come by the thousand (keyed ones) start with the shared
//! stripe alone and get their owned stripes once they have admitted
//! [`BUSY`] calls: only keys with traffic pay the memory.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::sync::{model_static, thread_local, AtomicU64};

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
    VolumeLimited,
    ProbeSuccesses,
    ProbeFailures,
    HealthProbeSuccesses,
    HealthProbeFailures,
    ListenerPanics,
    QuotaRejected,
    Paced,
    GradedRejected,
}

const COUNTERS: usize = 19;

/// One stripe fills its own cache lines, a whole number of 128-byte pairs
/// (adjacent-line prefetch makes 128 bytes the unit of false sharing on
/// x86): eighteen counters take two pairs.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe([AtomicU64; COUNTERS]);

#[derive(Debug)]
pub(crate) struct Striped {
    /// Stripe `i` is written only by the thread whose index is `i`.
    owned: Box<[Stripe]>,
    /// The same, for a breaker that gets its owned stripes once busy.
    later: OnceLock<Box<[Stripe]>>,
    /// How many stripes `later` gets; 0 when `owned` was filled at the start.
    later_len: usize,
    /// Written by every other thread, atomically.
    shared: Stripe,
}

/// Admissions after which a breaker with stripes to come gets them.
pub(crate) const BUSY: u64 = 1024;

fn stripes(n: usize) -> Box<[Stripe]> {
    (0..n).map(|_| Stripe::default()).collect()
}

/// Thread indices are unique, so the thread counting in its own stripe is
/// the stripe's only writer: no read-modify-write needed.
#[inline]
fn add_owned(stripe: &Stripe, counter: Counter, n: u64) {
    let c = &stripe.0[counter as usize];
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// The thread indices handed out and given back.
struct Indices {
    next: AtomicUsize,
    /// Indices of threads that have exited, for the next threads to take.
    /// The lock orders a thread's last counts before the next owner's
    /// first. (Under loom it is std's too: loom runs no synchronisation in
    /// a thread-local's destructor. The models join a thread before another
    /// takes its index, so loom sees that order through the join.)
    free: Mutex<Vec<usize>>,
}

model_static! {
    static INDICES: Indices = Indices {
        next: AtomicUsize::new(0),
        free: Mutex::new(Vec::new()),
    };
}

thread_local! {
    /// This thread's index; read on every count, so it has no destructor
    /// to register and check.
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Holds the index too, and gives it back when the thread exits;
    /// touched only when the index is taken.
    static RETURN_INDEX: ReturnIndex = const { ReturnIndex(Cell::new(usize::MAX)) };
}

struct ReturnIndex(Cell<usize>);

impl Drop for ReturnIndex {
    fn drop(&mut self) {
        let i = self.0.get();
        if i != usize::MAX {
            // Whatever this thread counts from here on (in other
            // thread-locals' destructors) goes to the shared stripe.
            let _ = THREAD_INDEX.try_with(|t| t.set(usize::MAX));
            INDICES
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(i);
        }
    }
}

#[inline]
fn thread_index() -> usize {
    THREAD_INDEX
        .try_with(|i| {
            let mut v = i.get();
            if v == usize::MAX {
                v = new_index();
                i.set(v);
            }
            v
        })
        .unwrap_or(usize::MAX)
}

#[cold]
fn new_index() -> usize {
    // Without a way to give the index back (the thread is exiting), count
    // in the shared stripe.
    RETURN_INDEX
        .try_with(|r| {
            let mut free = INDICES.free.lock().unwrap_or_else(|e| e.into_inner());
            // The lowest free index: low indices are the owned stripes.
            let i = match free.iter().enumerate().min_by_key(|&(_, &i)| i) {
                Some((at, _)) => free.swap_remove(at),
                None => INDICES.next.fetch_add(1, Ordering::Relaxed),
            };
            r.0.set(i);
            i
        })
        .unwrap_or(usize::MAX)
}

impl Striped {
    /// `owned` stripes for the first threads, plus one they share; with
    /// `when_busy`, the owned stripes come after [`BUSY`] admissions.
    pub(crate) fn new(owned: usize, when_busy: bool) -> Self {
        let (now, later_len) = if when_busy { (0, owned) } else { (owned, 0) };
        Striped {
            owned: stripes(now),
            later: OnceLock::new(),
            later_len,
            shared: Stripe::default(),
        }
    }

    #[inline]
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        let i = thread_index();
        match self.owned.get(i) {
            Some(stripe) => add_owned(stripe, counter, n),
            _ => self.add_other(i, counter, n),
        }
    }

    /// Counts in a stripe that came once the breaker was busy, or in the
    /// shared one.
    #[inline]
    fn add_other(&self, i: usize, counter: Counter, n: u64) {
        if self.later_len == 0 {
            self.shared.0[counter as usize].fetch_add(n, Ordering::Relaxed);
            return;
        }
        match self.later.get().and_then(|later| later.get(i)) {
            Some(stripe) => add_owned(stripe, counter, n),
            None => {
                let before = self.shared.0[counter as usize].fetch_add(n, Ordering::Relaxed);
                if matches!(counter, Counter::Admitted) && before < BUSY && before + n >= BUSY {
                    self.later.get_or_init(|| stripes(self.later_len));
                }
            }
        }
    }

    #[inline]
    pub(crate) fn incr(&self, counter: Counter) {
        self.add(counter, 1);
    }

    /// Shows `f` every stripe: the owned ones, those that came once the
    /// breaker was busy, and the shared one. Plain loops, not a chain of
    /// iterators, which costs a reader of one counter twice as much.
    #[inline]
    fn for_each(&self, mut f: impl FnMut(&Stripe)) {
        self.owned.iter().for_each(&mut f);
        if let Some(later) = self.later.get() {
            later.iter().for_each(&mut f);
        }
        f(&self.shared);
    }

    /// One counter summed over the stripes: for a reader that needs no
    /// other, at a nineteenth of [`sum`](Self::sum)'s reads. Never less
    /// than an earlier reading: each stripe only grows.
    pub(crate) fn total(&self, counter: Counter) -> u64 {
        let mut total = 0;
        self.for_each(|stripe| total += stripe.0[counter as usize].load(Ordering::Relaxed));
        total
    }

    /// Sums the stripes.
    pub(crate) fn sum(&self) -> Counters {
        let mut total = [0u64; COUNTERS];
        self.for_each(|stripe| {
            for (t, c) in total.iter_mut().zip(stripe.0.iter()) {
                *t += c.load(Ordering::Relaxed);
            }
        });
        let get = |c: Counter| total[c as usize];
        let finished = get(Counter::Successes)
            + get(Counter::Failures)
            + get(Counter::Ignored)
            + get(Counter::RateLimited)
            + get(Counter::QuotaExhausted)
            + get(Counter::Dropped);
        // Stripes written while they are summed may show a call finished
        // before its admission; it is in flight at most once either way.
        let admitted = get(Counter::Admitted).max(finished);
        Counters {
            admitted,
            in_flight: admitted - finished,
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
            health_probe_successes: get(Counter::HealthProbeSuccesses),
            health_probe_failures: get(Counter::HealthProbeFailures),
            listener_panics: get(Counter::ListenerPanics),
            quota_rejected: get(Counter::QuotaRejected),
            paced: get(Counter::Paced),
            graded_rejected: get(Counter::GradedRejected),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `total` reads every stripe `sum` does: the owned ones, those that
    /// come once the breaker is busy, and the shared one (where a busy
    /// breaker's first admissions land).
    #[test]
    fn one_counter_totals_what_the_sum_gives() {
        for when_busy in [false, true] {
            let counters = Striped::new(64, when_busy);
            std::thread::scope(|s| {
                for t in 0..5 {
                    let counters = &counters;
                    s.spawn(move || {
                        for _ in 0..BUSY + t {
                            counters.incr(Counter::Admitted);
                        }
                        counters.add(Counter::Failures, t);
                    });
                }
            });
            let sum = counters.sum();
            assert_eq!(counters.total(Counter::Admitted), 5 * BUSY + 10);
            assert_eq!(counters.total(Counter::Admitted), sum.admitted);
            assert_eq!(counters.total(Counter::Failures), 10);
            assert_eq!(counters.total(Counter::Failures), sum.failures);
        }
    }
}
