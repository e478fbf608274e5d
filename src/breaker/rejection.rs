//! [`CircuitOpen`]: the core's word for a call it refused, with its
//! [`Rejection`] reason and when a call may be admitted again.
//!
//! # Example
//!
//! ```
//! use tower_circuit_breaker::{Breaker, CircuitOpen, Rejection};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let breaker = Breaker::builder().build().unwrap();
//! breaker.force_open();
//! let open: CircuitOpen = breaker.admit().unwrap_err();
//! assert_eq!(open.reason(), Rejection::ForcedOpen);
//! # }
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use super::state::State;

/// Why a call was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The circuit is open.
    Open,
    /// The circuit is half-open and its probes are out.
    HalfOpenFull,
    /// An operator forced the circuit open.
    ForcedOpen,
    /// The volume guard's limit of calls per period is reached.
    VolumeGuard,
    /// The circuit is open because the account's quota ran out (see
    /// [`Builder::quota_gate`](crate::Builder::quota_gate)).
    Quota,
    /// The upstream announced when its rate limit resets, and that moment
    /// has not come (see
    /// [`Builder::pace_rate_limits`](crate::Builder::pace_rate_limits)). The
    /// circuit itself is closed.
    RateLimited,
}

/// The circuit rejected the call; the upstream was not called.
///
/// Downcast it out of a [`BoxError`](crate::BoxError):
///
/// ```
/// use tower_circuit_breaker::{BoxError, Breaker, CircuitOpen, State};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().name("gpt").build().unwrap();
/// breaker.force_open();
/// let err: BoxError = breaker.admit().unwrap_err().into();
/// let open = err.downcast_ref::<CircuitOpen>().unwrap();
/// assert_eq!(open.key(), Some("gpt"));
/// assert_eq!(open.state(), State::ForcedOpen);
/// assert_eq!(open.retry_after(), None);
/// assert_eq!(open.retry_at(), None);
/// assert_eq!(open.to_string(), "circuit open");
/// # }
/// ```
#[derive(Clone)]
pub struct CircuitOpen {
    key: Option<Arc<str>>,
    cause: Rejection,
    /// When a call may be admitted again: a moment, not a duration, so
    /// that rejecting needs no clock read, and kept in the breaker's own
    /// terms until asked for.
    deadline: Option<Deadline>,
}

/// A moment `ns` nanoseconds after `epoch`.
#[derive(Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) epoch: Instant,
    pub(crate) ns: u64,
}

impl Deadline {
    pub(crate) fn instant(self) -> Instant {
        self.epoch + std::time::Duration::from_nanos(self.ns)
    }
}

impl CircuitOpen {
    pub(crate) fn new(key: Option<Arc<str>>, cause: Rejection, deadline: Option<Deadline>) -> Self {
        CircuitOpen {
            key,
            cause,
            deadline,
        }
    }

    /// The name or key of the breaker that rejected the call.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The state the circuit was in (closed, when the volume guard or
    /// pacing rejected; open, for an exhausted quota).
    pub fn state(&self) -> State {
        match self.cause {
            Rejection::Open | Rejection::Quota => State::Open,
            Rejection::HalfOpenFull => State::HalfOpen,
            Rejection::ForcedOpen => State::ForcedOpen,
            Rejection::VolumeGuard | Rejection::RateLimited => State::Closed,
        }
    }

    /// Why the call was rejected.
    pub fn reason(&self) -> Rejection {
        self.cause
    }

    /// While open: the time from now until the next probe may be admitted;
    /// for the volume guard and pacing, until a call may be admitted again. `None` in
    /// half-open (the probes are out) and when forced open.
    ///
    /// Measured when asked, so it shrinks as the error is held: zero once
    /// the moment has passed.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_at()
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// When a call may be admitted again; see
    /// [`retry_after`](Self::retry_after).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .consecutive_failures(1)
    ///     .open_duration(Duration::from_secs(30))
    ///     .jitter(0.0)
    ///     .build()
    ///     .unwrap();
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// let open = breaker.admit().unwrap_err();
    /// let at = open.retry_at().unwrap();
    /// assert_eq!(at - tokio::time::Instant::now(), Duration::from_secs(30));
    /// tokio::time::advance(Duration::from_secs(10)).await;
    /// assert_eq!(open.retry_after(), Some(Duration::from_secs(20)));
    /// # }
    /// ```
    pub fn retry_at(&self) -> Option<Instant> {
        self.deadline.map(Deadline::instant)
    }
}

impl fmt::Debug for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitOpen")
            .field("key", &self.key)
            .field("state", &self.state())
            .field("reason", &self.cause)
            .field("retry_after", &self.retry_after())
            .finish()
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit open")
    }
}

impl StdError for CircuitOpen {}
