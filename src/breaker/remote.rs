//! The controls a shared-state backend uses to keep a breaker in step with
//! its replicas.

#![allow(
    clippy::cast_possible_truncation,
    reason = "the state word keeps the generation in its low 32 bits: a generation is compared as u32 by design"
)]

use std::fmt;
use std::time::Duration;

use super::{nanos, Events, Reason, Shared, State, WindowStats};
use crate::sync::lock;

/// The controls a shared-state backend uses to keep a breaker in step with
/// its replicas; see [`Breaker::remote`](crate::Breaker::remote).
///
/// In shared mode the breaker still evaluates its own rules (a trip is
/// local first, then shared), over its own window and over the window the
/// backend sums across replicas ([`evaluate`](Self::evaluate)): the rules
/// live in the core alone, and a backend only stores and sums. But a half-open cycle admits only the probes
/// the backend granted from the cluster-wide budget, and the cluster decides
/// when the cycle closes or reopens. Leaving shared mode (when the store is
/// unreachable) restores local half-open decisions at once.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{Breaker, State};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().build().unwrap();
/// let remote = breaker.remote();
/// remote.set_shared(true);
/// remote.open_for(Duration::from_secs(10)); // another replica tripped
/// assert_eq!(breaker.state(), State::Open);
/// remote.close();
/// assert_eq!(breaker.state(), State::Closed);
/// # }
/// ```
pub struct Remote<'a> {
    pub(super) shared: &'a Shared,
}

impl fmt::Debug for Remote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("name", &self.shared.name)
            .finish()
    }
}

impl Remote<'_> {
    /// Enters or leaves shared mode.
    pub fn set_shared(&self, on: bool) {
        let mut ctl = lock(&self.shared.control);
        ctl.remote = on;
        self.shared.remark(&mut ctl);
    }

    /// Whether the breaker is in shared mode.
    #[must_use]
    pub fn is_shared(&self) -> bool {
        lock(&self.shared.control).remote
    }

    /// Lets the current half-open cycle admit `n` more probes. Ignored unless
    /// the circuit is half-open in shared mode.
    pub fn grant_probes(&self, n: u32) {
        let mut ctl = lock(&self.shared.control);
        if ctl.remote && self.shared.load().state() == State::HalfOpen {
            ctl.allowance = ctl.allowance.saturating_add(n);
            self.shared.remark(&mut ctl);
        }
    }

    /// Opens the circuit for `remaining`, as the cluster decided (the reopen
    /// backoff is the cluster's too). Already open: only the deadline moves.
    /// Forced-open and disabled circuits are left alone.
    pub fn open_for(&self, remaining: Duration) {
        self.open_because(remaining, Reason::Remote);
    }

    /// The lifetime counters alone, as in a snapshot: no lock, no window,
    /// no clock.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn counters(&self) -> super::Counters {
        self.shared.counters.sum()
    }

    /// Opens the circuit for `remaining` because the account's quota ran
    /// out on another replica: a quota gate, as
    /// [`Builder::quota_gate`](crate::Builder::quota_gate) opens locally.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn gate_for(&self, remaining: Duration) {
        self.open_because(remaining, Reason::QuotaExhausted);
    }

    fn open_because(&self, remaining: Duration, reason: Reason) {
        let s = self.shared;
        let mut ctl = lock(&s.control);
        let now = s.now();
        let until = now.saturating_add(nanos(remaining).max(1));
        let mut events = Events::default();
        match s.load().state() {
            State::ForcedOpen | State::Disabled => {}
            State::Open => s.set_open_until(until),
            State::Closed | State::HalfOpen => {
                if s.load().state() == State::Closed {
                    ctl.tripped = s.rates.stats(now);
                }
                events.push(s.transition_for(
                    &mut ctl,
                    State::Open,
                    reason,
                    now,
                    Some(until - now),
                ));
            }
        }
        drop(ctl);
        s.emit(events);
    }

    /// Runs the breaker's rate rules (`min_calls`, `failure_rate`,
    /// `slow_call_rate`) over `window`, the calls every replica reported to
    /// a shared window, and trips the circuit as its own window would if
    /// one fires; the backend then shares the trip as any local one.
    /// Returns whether it tripped. Only a closed circuit trips; the
    /// consecutive-failures rule is a replica's own and is not judged here.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Reason, State, WindowStats, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let breaker = Breaker::builder().trip_mode(TripMode::Open).min_calls(10).failure_rate(0.5).build().unwrap();
    /// // Five replicas saw 4 calls each, 12 of the 20 failed.
    /// assert!(breaker.remote().evaluate(WindowStats::new(20, 12, 0)));
    /// assert_eq!(breaker.state(), State::Open);
    /// assert_eq!(breaker.snapshot().reason, Some(Reason::FailureRate));
    /// # }
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is a by-product"
    )]
    pub fn evaluate(&self, window: WindowStats) -> bool {
        let s = self.shared;
        let word = s.load();
        if word.state() != State::Closed {
            return false;
        }
        let generation = word.generation() as u32;
        s.evaluate(generation, 0, window);
        !s.is_current(State::Closed, generation)
    }

    /// Closes an open or half-open circuit, as the cluster decided.
    pub fn close(&self) {
        let s = self.shared;
        let mut ctl = lock(&s.control);
        let mut events = Events::default();
        if matches!(s.load().state(), State::Open | State::HalfOpen) {
            events.push(s.transition(&mut ctl, State::Closed, Reason::Remote, s.now()));
        }
        drop(ctl);
        s.emit(events);
    }
}
