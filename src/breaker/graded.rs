//! Graded admission: when a trip rule fires, a call without a fallback is
//! refused only with the probability that the upstream cannot serve it.
//!
//! Client-side adaptive throttling (Google's SRE book; Envoy's
//! `admission_control`): over a window of its own, each call without a
//! fallback is rejected with probability
//! `max(0, (requests − K·accepts) / (requests + 1))`, where `requests`
//! counts rejected calls too and `accepts` are the calls that succeeded. A
//! call with a fallback is rejected outright, as an open circuit would (and
//! the circuit opens for it). An upstream whose accepts over the window are
//! (nearly) zero — fewer than one in [`NEARLY_ZERO`] requests, once there
//! are at least [`MIN_REQUESTS`] — opens the circuit for every call, and so
//! does a streak of [`DEAD_STREAK`] failures before any graded call has
//! succeeded. The streak is what sees a dead upstream at once: the window
//! is seeded with the accepts the rule saw before it fired, from when the
//! upstream still answered, and keeps them for a whole graded window. When
//! the rule fires with every failure it saw in the streak, after all its
//! accepts, and that order is unlikely for an upstream that did not change
//! (odds under 1 in [`CHANGE_ODDS`]), the circuit opens at once. Once
//! a graded call has succeeded the upstream is not dead, and only the
//! window decides (a capacity-bound upstream fails its queued calls in
//! bursts and still answers).

#![allow(
    clippy::cast_possible_truncation,
    reason = "the state word keeps the generation in its low 32 bits: a generation is compared as u32 by design; bucket indices are taken modulo BUCKETS"
)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::counters::Counter;
use super::permit::Permit;
use super::rejection::{CircuitOpen, Rejection};
use super::state::{Packed, Shed};
use super::{Events, Reason, Shared, State, WindowStats};
use crate::rng::Rng;
use crate::sync::{lock, Mutex};

/// How many buckets the graded window is cut into.
const BUCKETS: usize = 10;
/// Accepts below one in this many requests are (nearly) zero.
pub(crate) const NEARLY_ZERO: u64 = 100;
/// Requests the graded window must hold before its accepts can be called
/// (nearly) zero.
pub(crate) const MIN_REQUESTS: u64 = 10;
/// Failures in a row, graded calls' included, that open the circuit for
/// every call while no graded call has succeeded. An upstream that fails
/// half its calls at random has such a streak at a given call with odds of
/// about one in a million.
pub(crate) const DEAD_STREAK: u64 = 20;

/// How unlikely the order of the calls a rule saw must be, for an upstream
/// that did not change, before "answered, then failed every call since"
/// opens the circuit at once (see `answered_then_failed`): 10 accepts then
/// 10 failures have odds of 1 in 184,756; one accept then 19 failures, 1 in
/// 20.
const CHANGE_ODDS: f64 = 10_000.0;

/// The graded window's counts, by time bucket.
#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    requests: u64,
    accepts: u64,
    rejected: u64,
}

/// The state of graded admission, under its own lock (taken only while a
/// rule has fired, never on a closed circuit's path).
pub(super) struct Graded {
    inner: Mutex<Inner>,
    rng: Rng,
    /// The factor `K`.
    k: f64,
    bucket_ns: u64,
}

struct Inner {
    buckets: [Bucket; BUCKETS],
    /// The index (time / bucket_ns) of the newest bucket.
    head: u64,
    /// Why the rule fired and the window it saw, for the open circuit a
    /// call with a fallback turns it into.
    reason: Reason,
    stats: WindowStats,
    /// Whether a graded call has succeeded since grading began.
    answered: bool,
}

impl Graded {
    pub(super) fn new(k: f64, window_ns: u64, seed: Option<u64>) -> Self {
        Graded {
            inner: Mutex::new(Inner {
                buckets: [Bucket::default(); BUCKETS],
                head: 0,
                reason: Reason::FailureRate,
                stats: WindowStats::default(),
                answered: false,
            }),
            rng: seed.map_or_else(Rng::random, |s| Rng::new(s ^ 0x6a09_e667_f3bc_c908)),
            k,
            bucket_ns: (window_ns / BUCKETS as u64).max(1),
        }
    }

    /// The rejection probability for counts `(requests, accepts)`.
    fn probability(&self, requests: u64, accepts: u64) -> f64 {
        let r = requests as f64;
        ((r - self.k * accepts as f64) / (r + 1.0)).max(0.0)
    }
}

impl Inner {
    /// Moves the window to `now`, emptying the buckets it left behind.
    fn advance(&mut self, now: u64, bucket_ns: u64) {
        let index = now / bucket_ns;
        if index <= self.head {
            return;
        }
        let gone = (index - self.head).min(BUCKETS as u64);
        for i in 1..=gone {
            self.buckets[((self.head + i) % BUCKETS as u64) as usize] = Bucket::default();
        }
        self.head = index;
    }

    fn current(&mut self) -> &mut Bucket {
        &mut self.buckets[(self.head % BUCKETS as u64) as usize]
    }

    fn sum(&self) -> Bucket {
        self.buckets.iter().fold(Bucket::default(), |a, b| Bucket {
            requests: a.requests + b.requests,
            accepts: a.accepts + b.accepts,
            rejected: a.rejected + b.rejected,
        })
    }
}

/// Whether the calls the rule saw are its accepts, then every failure in
/// one streak, and that order says the upstream changed: among the orders
/// of `accepts` and `failures` an upstream that did not change gives with
/// equal odds, this one has odds of 1 in `C(calls, accepts)`, below 1 in
/// [`CHANGE_ODDS`].
fn answered_then_failed(stats: WindowStats, streak: u64) -> bool {
    if stats.failures == 0 || streak < stats.failures || stats.calls <= stats.failures {
        return false;
    }
    let (n, accepts) = (stats.calls, stats.calls - stats.failures);
    let k = accepts.min(n - accepts);
    let mut orders = 1.0_f64;
    for i in 0..k {
        orders = orders * (n - i) as f64 / (i + 1) as f64;
        if orders >= CHANGE_ODDS {
            return true;
        }
    }
    false
}

fn nearly_zero(sum: Bucket) -> bool {
    sum.requests >= MIN_REQUESTS && sum.accepts.saturating_mul(NEARLY_ZERO) < sum.requests
}

impl Shared {
    /// A trip rule fired on the closed circuit of `generation`: with
    /// graded admission, starts grading (seeding its window with the calls
    /// the rule saw) unless the upstream's accepts are (nearly) zero or,
    /// with no graded call answered yet, the failure streak is
    /// [`DEAD_STREAK`] long. Returns whether it opens instead.
    #[cold]
    pub(super) fn grade(
        &self,
        generation: u32,
        reason: Reason,
        stats: WindowStats,
        streak: u64,
    ) -> bool {
        let Some(graded) = &self.graded else {
            return true;
        };
        let word = self.load();
        if word.generation() as u32 != generation || word.state() != State::Closed {
            return false;
        }
        let now = self.now();
        let mut inner = lock(&graded.inner);
        inner.advance(now, graded.bucket_ns);
        if !word.is_graded() {
            inner.buckets = [Bucket::default(); BUCKETS];
            let requests = stats.calls.max(streak);
            *inner.current() = Bucket {
                requests,
                accepts: stats.calls.saturating_sub(stats.failures),
                rejected: 0,
            };
            inner.reason = reason;
            inner.stats = stats;
            inner.answered = false;
        }
        if (!word.is_graded() && answered_then_failed(stats, streak))
            || nearly_zero(inner.sum())
            || (streak >= DEAD_STREAK && !inner.answered)
        {
            return true;
        }
        if !word.is_graded() {
            let _ = self.hot.state.compare_exchange(
                word.0,
                Packed::graded(word.generation()).0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        false
    }

    /// While grading: a success of a graded call counts as an accept.
    #[cold]
    pub(super) fn graded_accept(&self, generation: u32) {
        let Some(graded) = &self.graded else { return };
        let word = self.load();
        if !word.is_graded() || word.generation() as u32 != generation {
            return;
        }
        let mut inner = lock(&graded.inner);
        inner.advance(self.now(), graded.bucket_ns);
        inner.current().accepts += 1;
        inner.answered = true;
    }

    /// While grading, the rules no longer fire: grading ends once the
    /// window would reject nothing.
    #[cold]
    pub(super) fn graded_settle(&self, generation: u32) {
        let Some(graded) = &self.graded else { return };
        let word = self.load();
        if !word.is_graded() || word.generation() as u32 != generation {
            return;
        }
        let mut inner = lock(&graded.inner);
        inner.advance(self.now(), graded.bucket_ns);
        let sum = inner.sum();
        if graded.probability(sum.requests, sum.accepts) == 0.0 {
            let _ = self.hot.state.compare_exchange(
                word.0,
                Packed::new(State::Closed, word.generation()).0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// Admission while grading.
    #[cold]
    #[inline(never)]
    pub(super) fn admit_graded(
        self: &Arc<Self>,
        word: Packed,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if let Some(rejected) = self.spend_check(fallback) {
            return rejected;
        }
        let Some(graded) = &self.graded else {
            return self.admit_closed(word.generation(), fallback);
        };
        let generation = word.generation();
        let now = self.now();
        let mut inner = lock(&graded.inner);
        inner.advance(now, graded.bucket_ns);
        let sum = inner.sum();
        if fallback || nearly_zero(sum) {
            // A call with somewhere else to go is refused outright: the
            // circuit opens, as it would without grading.
            let (reason, stats) = (inner.reason, inner.stats);
            drop(inner);
            self.open_graded(generation as u32, reason, stats);
            return self.admit(fallback);
        }
        let p = graded.probability(sum.requests, sum.accepts);
        inner.current().requests += 1;
        if p > 0.0 && graded.rng.unit() < p {
            inner.current().rejected += 1;
            drop(inner);
            self.counters.incr(Counter::GradedRejected);
            return self.reject(Rejection::Graded, None, fallback);
        }
        drop(inner);
        let mut permit = self.admit_closed(generation, fallback)?;
        permit.set_graded();
        Ok(permit)
    }

    /// Opens a grading circuit for every call.
    #[cold]
    fn open_graded(&self, generation: u32, reason: Reason, stats: WindowStats) {
        let mut ctl = lock(&self.control);
        if !self.is_current(State::Closed, generation) {
            return;
        }
        ctl.tripped = stats;
        let mut events = Events::default();
        events.push(self.transition(&mut ctl, State::Open, reason, self.now()));
        drop(ctl);
        self.emit(events);
    }

    /// What grading sheds now, if it is on.
    pub(super) fn shed(&self, word: Packed) -> Option<Shed> {
        let graded = self.graded.as_ref()?;
        if !word.is_graded() {
            return None;
        }
        let mut inner = lock(&graded.inner);
        inner.advance(self.now(), graded.bucket_ns);
        let sum = inner.sum();
        Some(Shed {
            requests: sum.requests,
            accepts: sum.accepts,
            rejected: sum.rejected,
            probability: graded.probability(sum.requests, sum.accepts),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(calls: u64, failures: u64) -> WindowStats {
        WindowStats {
            calls,
            failures,
            slow: 0,
        }
    }

    #[test]
    fn answered_then_failed_needs_every_failure_in_the_streak_and_an_unlikely_order() {
        // 10 accepts, then 10 failures in a row: 1 in 184,756.
        assert!(answered_then_failed(stats(20, 10), 10));
        // 6 then 14: 1 in 38,760; 5 then 10: 1 in 3,003.
        assert!(answered_then_failed(stats(20, 14), 14));
        assert!(!answered_then_failed(stats(15, 10), 10));
        // One accept, then 19 failures: 1 in 20, what an upstream that
        // answers 5 % gives often.
        assert!(!answered_then_failed(stats(20, 19), 19));
        // A failure the streak does not hold came before an accept.
        assert!(!answered_then_failed(stats(20, 10), 9));
        // No accepts (the window's own test decides), or no failures.
        assert!(!answered_then_failed(stats(20, 20), 20));
        assert!(!answered_then_failed(stats(20, 0), 0));
        // A long time window: it stops counting once past the odds.
        assert!(answered_then_failed(stats(100_000, 50_000), 50_000));
    }
}
