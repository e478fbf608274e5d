//! [`AttemptError`]: what the layers that judge an attempt by its result
//! (retry, failover) need to know of its error.

use std::convert::Infallible;

use crate::breaker::CircuitOpen;
use crate::classify::ErrorRef;

/// An error that [`RetryPolicy`](crate::RetryPolicy) and [`Failover`](crate::failover::Failover)
/// can look into: was it a [`CircuitOpen`] rejection, and if not, which
/// error should the classifier see?
///
/// Implemented for this crate's [`Error`](crate::Error), for [`BoxError`](crate::BoxError) (what
/// `tower::timeout` and most stacks return) and for [`Infallible`]. Both
/// error impls find a rejection anywhere in the error's chain, so a breaker
/// nested inside the service (a keyed set behind a global breaker, a library
/// that carries its own) stops the retry and is skipped by the failover.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::retry::AttemptError;
/// use tower_circuit_breaker::{BoxError, Breaker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().build().unwrap();
/// breaker.force_open();
/// let err: BoxError = breaker.admit().unwrap_err().into();
/// assert!(err.circuit_open().is_some());
/// assert!(err.as_error().is_none());
///
/// let err: BoxError = "connection reset".into();
/// assert!(err.circuit_open().is_none());
/// assert!(err.as_error().is_some());
/// # }
/// ```
pub trait AttemptError {
    /// The rejection, if a circuit rejected the call.
    ///
    /// ```
    /// use tower_circuit_breaker::retry::AttemptError;
    /// use tower_circuit_breaker::{BoxError, Breaker};
    ///
    /// let breaker = Breaker::builder().name("gpt").build().unwrap();
    /// breaker.force_open();
    /// let err: BoxError = breaker.admit().unwrap_err().into();
    /// assert_eq!(AttemptError::circuit_open(&err).and_then(|open| open.key()), Some("gpt"));
    /// ```
    fn circuit_open(&self) -> Option<&CircuitOpen>;

    /// The error to classify, if the call reached the inner service.
    ///
    /// ```
    /// use tower_circuit_breaker::retry::AttemptError;
    /// use tower_circuit_breaker::BoxError;
    ///
    /// let err: BoxError = std::io::Error::other("connection reset").into();
    /// assert_eq!(err.as_error().unwrap().to_string(), "connection reset");
    /// ```
    fn as_error(&self) -> Option<ErrorRef<'_>>;
}

impl AttemptError for Infallible {
    fn circuit_open(&self) -> Option<&CircuitOpen> {
        match *self {}
    }

    fn as_error(&self) -> Option<ErrorRef<'_>> {
        match *self {}
    }
}
