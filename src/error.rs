//! Error types

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use tokio::time::Instant;

use crate::breaker::State;
use crate::BoxError;

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
}

/// The circuit rejected the call; the upstream was not called.
///
/// Downcast it out of a [`BoxError`]:
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

    /// The state the circuit was in (closed, when the volume guard rejected).
    pub fn state(&self) -> State {
        match self.cause {
            Rejection::Open => State::Open,
            Rejection::HalfOpenFull => State::HalfOpen,
            Rejection::ForcedOpen => State::ForcedOpen,
            Rejection::VolumeGuard => State::Closed,
        }
    }

    /// Why the call was rejected.
    pub fn reason(&self) -> Rejection {
        self.cause
    }

    /// While open: the time from now until the next probe may be admitted;
    /// for the volume guard, until a call may be admitted again. `None` in
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

/// The error of a [`CircuitBreaker`](crate::CircuitBreaker) service: the
/// circuit rejected the call, or the inner service failed.
///
/// A rejection is built without allocating. Converting into a [`BoxError`]
/// yields the [`CircuitOpen`] itself or the inner error unchanged (not this
/// wrapper), so `downcast_ref::<CircuitOpen>()` and downcasts to the inner
/// error type both work on the boxed form. That is why this type does not
/// implement `std::error::Error` itself.
///
/// ```
/// use tower_circuit_breaker::{BoxError, CircuitOpen, Error};
///
/// fn is_rejection(err: BoxError) -> bool {
///     err.downcast_ref::<CircuitOpen>().is_some()
/// }
/// # let _ = is_rejection;
/// # let _: Option<Error> = None;
/// ```
pub struct Error {
    kind: Kind,
}

enum Kind {
    Open(CircuitOpen),
    Inner(BoxError),
}

impl Error {
    pub(crate) fn open(open: CircuitOpen) -> Self {
        Error {
            kind: Kind::Open(open),
        }
    }

    pub(crate) fn from_inner(inner: BoxError) -> Self {
        Error {
            kind: Kind::Inner(inner),
        }
    }

    /// The rejection, if the circuit rejected the call.
    pub fn circuit_open(&self) -> Option<&CircuitOpen> {
        match &self.kind {
            Kind::Open(o) => Some(o),
            Kind::Inner(_) => None,
        }
    }

    /// Whether the circuit rejected the call.
    pub fn is_circuit_open(&self) -> bool {
        self.circuit_open().is_some()
    }

    /// The inner service's error, if it failed.
    pub fn inner(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        match &self.kind {
            Kind::Inner(e) => Some(&**e),
            Kind::Open(_) => None,
        }
    }

    /// Converts into a [`BoxError`]: the [`CircuitOpen`] or the inner error.
    pub fn into_box(self) -> BoxError {
        self.into()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Open(o) => fmt::Debug::fmt(o, f),
            Kind::Inner(e) => fmt::Debug::fmt(e, f),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Open(o) => fmt::Display::fmt(o, f),
            Kind::Inner(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl From<Error> for BoxError {
    fn from(e: Error) -> BoxError {
        match e.kind {
            Kind::Open(o) => Box::new(o),
            Kind::Inner(e) => e,
        }
    }
}

impl From<CircuitOpen> for Error {
    fn from(o: CircuitOpen) -> Self {
        Error::open(o)
    }
}
