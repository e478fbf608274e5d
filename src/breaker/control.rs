//! An operator's hands on a breaker: forcing it open, disabling it,
//! resetting it, and running it in metrics-only mode.

use super::*;

impl Breaker {
    /// Rejects every call until [`reset`](Self::reset). Does not advance the
    /// reopen backoff.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, State};
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// assert!(breaker.admit().is_err());
    /// assert_eq!(breaker.state(), State::ForcedOpen);
    /// ```
    pub fn force_open(&self) {
        self.shared
            .set_manual(State::ForcedOpen, Reason::ForcedOpen);
    }

    /// Admits every call and records nothing, until [`reset`](Self::reset).
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, Outcome, State};
    /// let breaker = Breaker::builder().consecutive_failures(1).build().unwrap();
    /// breaker.disable();
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// assert_eq!(breaker.state(), State::Disabled);
    /// ```
    pub fn disable(&self) {
        self.shared.set_manual(State::Disabled, Reason::Disabled);
    }

    /// Closes the circuit with an empty window and the reopen backoff reset.
    /// Lifetime counters are kept.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, State};
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// breaker.reset();
    /// assert_eq!(breaker.state(), State::Closed);
    /// ```
    pub fn reset(&self) {
        self.shared.set_manual(State::Closed, Reason::Reset);
    }

    /// Whether the breaker is in metrics-only (shadow) mode.
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().metrics_only(true).build().unwrap();
    /// assert!(breaker.is_metrics_only());
    /// ```
    #[inline]
    #[must_use]
    pub fn is_metrics_only(&self) -> bool {
        self.shared.hot.metrics_only.load(Ordering::Acquire)
    }

    /// Turns shadow mode on or off: the breaker keeps recording and making
    /// transitions, but admits the calls it would have rejected (counted in
    /// [`Counters::would_reject`]).
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.set_metrics_only(true);
    /// breaker.force_open();
    /// assert!(breaker.admit().is_ok(), "shadow mode never rejects");
    /// assert_eq!(breaker.snapshot().counters.would_reject, 1);
    /// ```
    pub fn set_metrics_only(&self, on: bool) {
        self.shared.hot.metrics_only.store(on, Ordering::Release);
    }
}
