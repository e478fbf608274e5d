//! Error types

use std::error::Error as StdError;
use std::fmt;

pub use crate::breaker::{CircuitOpen, Rejection};
pub use crate::deadline::StreamDeadline;
use crate::{guard, BoxError};

/// The error of a [`CircuitBreaker`](crate::CircuitBreaker) service: the
/// circuit rejected the call, or the inner service failed.
///
/// A rejection is built without allocating. An inner breaker's rejection
/// (a [`CircuitOpen`] anywhere in the inner error's chain, as when the inner
/// service carries breakers of its own) stays a rejection:
/// [`is_circuit_open`](Self::is_circuit_open) and
/// [`circuit_open`](Self::circuit_open) see through the nesting, and the
/// outer breaker records such a call as [`Ignored`](crate::Outcome::Ignored).
///
/// # With `?`
///
/// `?` converts it into a `Box<dyn std::error::Error>` (with or without
/// `Send + Sync`; [`BoxError`] is one), and so does `.into()`. The box holds
/// the [`CircuitOpen`] itself or the inner error unchanged, not this wrapper,
/// so `downcast_ref::<CircuitOpen>()` and downcasts to the inner error type
/// work on it, as they do on the `BoxError` that tower's own layers
/// (`timeout`, `retry`, `buffer`) make of it.
///
/// ```
/// use std::error::Error as _;
/// use tower::{Service, ServiceExt};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker, CircuitOpen};
///
/// async fn send(
///     svc: &mut CircuitBreaker<impl Service<http::Request<String>, Response = http::Response<String>, Error = std::convert::Infallible>>,
/// ) -> Result<u16, Box<dyn std::error::Error>> {
///     let res = svc.ready().await?.call(http::Request::new(String::new())).await?;
///     Ok(res.status().as_u16())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let upstream = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let breaker = Breaker::builder().name("gpt").build().unwrap();
/// let mut svc = CircuitBreaker::new(upstream, breaker.clone());
/// assert_eq!(send(&mut svc).await.unwrap(), 200);
///
/// breaker.force_open();
/// let err = send(&mut svc).await.unwrap_err();
/// assert_eq!(err.downcast_ref::<CircuitOpen>().unwrap().key(), Some("gpt"));
/// assert!(err.source().is_none());
/// # }
/// ```
///
/// # Why it is not `std::error::Error`, and anyhow
///
/// If this type implemented `std::error::Error`, Rust's blanket conversion
/// into `BoxError` would box the wrapper itself, and
/// `downcast_ref::<CircuitOpen>()` would stop working on every error that
/// tower's layers box, which is how most code finds a rejection. That is
/// kept; what gives way is that `?` cannot go straight into
/// `anyhow::Result` (or into anything that takes `impl std::error::Error`).
/// The route is one call, through the box:
///
/// ```ignore
/// let res = svc.call(req).await.map_err(|e| anyhow::Error::from_boxed(e.into_box()))?;
/// ```
///
/// (`anyhow::anyhow!(e.into_box())` does the same on older anyhow
/// releases.) anyhow keeps a boxed error as a `BoxError`: find the rejection
/// with `err.downcast_ref::<BoxError>().and_then(|e| e.downcast_ref::<CircuitOpen>())`,
/// or ask [`is_circuit_open`](Self::is_circuit_open) before converting.
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

    /// The rejection, if this circuit or one inside the inner service
    /// rejected the call.
    ///
    /// ```
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let breaker = Breaker::builder().name("gpt").build().unwrap();
    /// breaker.force_open();
    /// let err = tower_circuit_breaker::Error::from(breaker.admit().unwrap_err());
    /// assert_eq!(err.circuit_open().and_then(|open| open.key()), Some("gpt"));
    /// # }
    /// ```
    pub fn circuit_open(&self) -> Option<&CircuitOpen> {
        match &self.kind {
            Kind::Open(o) => Some(o),
            Kind::Inner(e) => guard::rejection(&**e),
        }
    }

    /// Whether this circuit, or one inside the inner service, rejected the
    /// call.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Error};
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// let err = Error::from(breaker.admit().unwrap_err());
    /// assert!(err.is_circuit_open());
    /// ```
    pub fn is_circuit_open(&self) -> bool {
        self.circuit_open().is_some()
    }

    /// The inner service's error, if the call reached the inner service (an
    /// inner breaker's rejection included).
    ///
    /// ```
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = CircuitBreakerLayer::builder().build().unwrap();
    /// let svc = layer.layer(tower::service_fn(|_: http::Request<String>| async {
    ///     Err::<http::Response<String>, _>(std::io::Error::other("connection refused"))
    /// }));
    /// let err = svc.oneshot(http::Request::new(String::new())).await.unwrap_err();
    /// assert!(!err.is_circuit_open());
    /// assert_eq!(err.inner().unwrap().to_string(), "connection refused");
    /// # }
    /// ```
    pub fn inner(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        match &self.kind {
            Kind::Inner(e) => Some(&**e),
            Kind::Open(_) => None,
        }
    }

    /// Converts into a [`BoxError`]: the [`CircuitOpen`] or the inner error.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, BoxError, CircuitOpen, Error};
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// let boxed: BoxError = Error::from(breaker.admit().unwrap_err()).into_box();
    /// assert!(boxed.downcast_ref::<CircuitOpen>().is_some());
    /// ```
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

impl From<Error> for Box<dyn StdError + Send> {
    fn from(e: Error) -> Self {
        BoxError::from(e)
    }
}

impl From<Error> for Box<dyn StdError> {
    fn from(e: Error) -> Self {
        BoxError::from(e)
    }
}

impl From<CircuitOpen> for Error {
    fn from(o: CircuitOpen) -> Self {
        Error::open(o)
    }
}

// === StreamElapsed ===

/// A stream deadline passed (see [`StreamDeadlines`](crate::deadline::StreamDeadlines)):
/// the first body frame did not come in time, the stream stalled, or it ran
/// past its total time. The call is recorded as a
/// [`Failure`](crate::Outcome::Failure).
///
/// It is the error of a body (or, for the first frame, of the response
/// future) under stream deadlines; downcast it out of the [`BoxError`]:
///
/// ```
/// use tower_circuit_breaker::error::{StreamDeadline, StreamElapsed};
/// use tower_circuit_breaker::BoxError;
///
/// fn stalled(err: &BoxError) -> bool {
///     err.downcast_ref::<StreamElapsed>()
///         .is_some_and(|e| e.deadline() == StreamDeadline::Stall)
/// }
/// # let _ = stalled;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamElapsed {
    deadline: StreamDeadline,
}

impl StreamElapsed {
    pub(crate) const fn new(deadline: StreamDeadline) -> Self {
        StreamElapsed { deadline }
    }

    /// Which deadline passed.
    ///
    /// ```
    /// use tower_circuit_breaker::error::{StreamDeadline, StreamElapsed};
    /// use tower_circuit_breaker::BoxError;
    ///
    /// fn first_token_late(err: &BoxError) -> bool {
    ///     err.downcast_ref::<StreamElapsed>()
    ///         .is_some_and(|e| e.deadline() == StreamDeadline::FirstFrame)
    /// }
    /// let other: BoxError = "connection reset".into();
    /// assert!(!first_token_late(&other));
    /// ```
    pub fn deadline(&self) -> StreamDeadline {
        self.deadline
    }
}

impl fmt::Display for StreamElapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.deadline {
            StreamDeadline::FirstFrame => "first body frame deadline elapsed",
            StreamDeadline::Stall => "stream stalled",
            StreamDeadline::Total => "stream deadline elapsed",
        })
    }
}

impl StdError for StreamElapsed {}
