//! Error types

use std::error::Error as StdError;
use std::fmt;

pub use crate::breaker::{CircuitOpen, Rejection};
use crate::classify::ErrorRef;
pub use crate::deadline::{StreamDeadline, StreamElapsed};
use crate::guard::{self, AttemptError};
use crate::BoxError;

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
/// It is a [`std::error::Error`] (`Send + Sync + 'static`), so `?` takes it
/// into `Box<dyn std::error::Error>`, a [`BoxError`] or an `anyhow::Result`
/// with no conversion. The box then holds this `Error`; find a rejection in
/// it, or in any error that tower's layers (`timeout`, `retry`, `buffer`)
/// made of it, with [`CircuitOpen::find`]:
///
/// ```
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
/// assert_eq!(CircuitOpen::find(&*err).unwrap().key(), Some("gpt"));
/// # }
/// ```
///
/// # Display and `source()`
///
/// A rejection displays as `rejected by the circuit breaker` and its
/// [`source()`](std::error::Error::source) is the [`CircuitOpen`], so a
/// report of the chain (anyhow's `{:#}`, a `tracing` error field) reads
/// `rejected by the circuit breaker: circuit 'gpt' open; half-open in 30s`.
/// An inner error is transparent: its own `Display` and its own `source()`,
/// as if the breaker were not there.
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
    #[must_use]
    pub fn circuit_open(&self) -> Option<&CircuitOpen> {
        match &self.kind {
            Kind::Open(o) => Some(o),
            Kind::Inner(e) => CircuitOpen::find(&**e),
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
    #[must_use]
    #[inline]
    pub fn is_circuit_open(&self) -> bool {
        // This breaker's own rejection is told from the variant alone; only
        // an inner error is searched.
        match &self.kind {
            Kind::Open(_) => true,
            Kind::Inner(e) => CircuitOpen::find(&**e).is_some(),
        }
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
    #[must_use]
    pub fn inner(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        match &self.kind {
            Kind::Inner(e) => Some(&**e),
            Kind::Open(_) => None,
        }
    }

    /// Takes the error apart into a [`BoxError`]: the [`CircuitOpen`] of
    /// this circuit's rejection or the inner error, without this wrapper.
    /// (`?` and `.into()` keep the wrapper; [`CircuitOpen::find`] finds a
    /// rejection either way.)
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, BoxError, CircuitOpen, Error};
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// let boxed: BoxError = Error::from(breaker.admit().unwrap_err()).into_box();
    /// assert!(boxed.downcast_ref::<CircuitOpen>().is_some());
    /// ```
    #[must_use]
    pub fn into_box(self) -> BoxError {
        match self.kind {
            Kind::Open(o) => Box::new(o),
            Kind::Inner(e) => e,
        }
    }

    /// The inner error if it is a bare rejection (an inner breaker's
    /// [`CircuitOpen`], not wrapped in an `Error`).
    fn inner_open(&self) -> Option<&CircuitOpen> {
        match &self.kind {
            Kind::Inner(e) => e.downcast_ref::<CircuitOpen>(),
            Kind::Open(_) => None,
        }
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
            Kind::Open(_) => f.write_str("rejected by the circuit breaker"),
            Kind::Inner(_) if self.inner_open().is_some() => {
                f.write_str("rejected by an inner circuit breaker")
            }
            Kind::Inner(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            Kind::Open(o) => Some(o),
            Kind::Inner(_) if self.inner_open().is_some() => self.inner_open().map(|o| o as _),
            Kind::Inner(e) => e.source(),
        }
    }
}

/// std boxes an error into `Box<dyn Error>` and `Box<dyn Error + Send + Sync>`
/// by itself; this is the `Send`-only box.
impl From<Error> for Box<dyn StdError + Send> {
    fn from(e: Error) -> Self {
        Box::new(e)
    }
}

impl From<CircuitOpen> for Error {
    fn from(o: CircuitOpen) -> Self {
        Error::open(o)
    }
}

// === CircuitOpen::find ===

/// How many links of an error chain are searched for a rejection. Chains are
/// a handful of links; the bound only keeps a cyclic `source()` (a bug in
/// someone's error type) from looping forever.
const MAX_CHAIN: usize = 32;

impl CircuitOpen {
    /// Finds the rejection in an error, wherever the crate's own types or
    /// tower's put it: this is the one call to ask "did a circuit reject
    /// this?" of any error.
    ///
    /// It accepts any `&(dyn Error + 'static)`, and looks at the error
    /// itself and down its [`source()`](std::error::Error::source) chain
    /// (up to 32 links), stepping into this crate's [`Error`] (whose inner
    /// error it searches too) and into the transparent wrappers of the
    /// integrations (`reqwest_middleware::Error::Middleware`,
    /// `async_openai`'s boxed error). What to pass:
    ///
    /// - a [`BoxError`] (what `tower::timeout`, `tower::retry`,
    ///   [`Stack`](crate::Stack) and most stacks return): `&*err`;
    /// - an `anyhow::Error`: `&*err` or `err.as_ref()` (anyhow dereferences
    ///   to the error it holds; no anyhow dependency is involved). One made
    ///   with `anyhow::Error::from_boxed` (or `anyhow!` of a box) holds the
    ///   box behind a private wrapper that reports only the boxed error's
    ///   `source()`: the crate's [`Error`] reports its rejection as its
    ///   source, so it is still found; a bare boxed `CircuitOpen` in there is
    ///   not (`err.downcast_ref::<BoxError>()` first);
    /// - this crate's [`Error`], a `tower::buffer::error::ServiceError`
    ///   (its source is the inner error), or any other error: `&err`.
    ///
    /// A `tower::timeout::error::Elapsed` is never a rejection: `None`.
    ///
    /// ```
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = CircuitBreakerLayer::builder().name("gpt").build().unwrap();
    /// let svc = tower::ServiceBuilder::new()
    ///     .timeout(std::time::Duration::from_secs(60)) // boxes the error
    ///     .layer(layer.clone())
    ///     .service(tower::service_fn(|_: http::Request<String>| async {
    ///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    ///     }));
    /// layer.breaker().force_open();
    /// let err: BoxError = svc.oneshot(http::Request::new(String::new())).await.unwrap_err();
    /// assert_eq!(CircuitOpen::find(&*err).and_then(CircuitOpen::key), Some("gpt"));
    ///
    /// let other: BoxError = "connection reset".into();
    /// assert!(CircuitOpen::find(&*other).is_none());
    /// # }
    /// ```
    pub fn find<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a CircuitOpen> {
        let mut next = Some(error);
        for _ in 0..MAX_CHAIN {
            let error = next?;
            if let Some(open) = error.downcast_ref::<CircuitOpen>() {
                return Some(open);
            }
            next = match error.downcast_ref::<Error>() {
                Some(Error {
                    kind: Kind::Open(open),
                }) => return Some(open),
                Some(Error {
                    kind: Kind::Inner(inner),
                }) => Some(&**inner as &(dyn StdError + 'static)),
                None => guard::transparent(error).or_else(|| error.source()),
            };
        }
        None
    }
}

// === AttemptError ===

impl AttemptError for Error {
    fn circuit_open(&self) -> Option<&CircuitOpen> {
        Error::circuit_open(self)
    }

    fn as_error(&self) -> Option<ErrorRef<'_>> {
        match self.is_circuit_open() {
            true => None,
            false => self.inner(),
        }
    }
}

impl AttemptError for BoxError {
    fn circuit_open(&self) -> Option<&CircuitOpen> {
        CircuitOpen::find(&**self)
    }

    fn as_error(&self) -> Option<ErrorRef<'_>> {
        // A boxed breaker error (what tower's timeout makes of it) is
        // classified by what it holds, as the bare error would be.
        if let Some(error) = self.downcast_ref::<Error>() {
            return AttemptError::as_error(error);
        }
        match CircuitOpen::find(&**self) {
            Some(_) => None,
            None => Some(&**self),
        }
    }
}
