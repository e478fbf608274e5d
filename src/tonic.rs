//! An open circuit as a [`tonic::Status`] with code
//! `UNAVAILABLE`, not `UNKNOWN`.
//!
//! A tonic client turns the error of its transport into a `Status` with
//! `Status::from_error`, which keeps a `Status` it finds and calls anything
//! else `UNKNOWN`. Put [`RejectionStatusLayer`] outside the breaker and the
//! rejection reaches the client as a `Status`:
//!
//! * code `UNAVAILABLE` (the call was not made and may be retried later),
//! * a message that says when the next probe may go out,
//! * `grpc-retry-pushback-ms` metadata with that delay in milliseconds (the
//!   gRPC retry design's server pushback; absent when no probe time is known,
//!   as in half-open or forced open),
//! * the [`CircuitOpen`] itself as the status's
//!   [`source`](std::error::Error::source).
//!
//! A call a spend guard rejected ([`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded))
//! is `PERMISSION_DENIED` instead, without pushback: no retry helps before
//! the budget resets, and `RESOURCE_EXHAUSTED` reads as a rate limit.
//!
//! `From<CircuitOpen> for tonic::Status` builds the same status by hand. To
//! trip on the statuses a server sends, classify with
//! [`GrpcClassifier`](crate::classify::GrpcClassifier).
//!
//! This feature needs Rust 1.88, tonic 0.14's minimum.
//!
//! # Example
//!
//! ```
//! use tonic::transport::Endpoint;
//! use tower::ServiceBuilder;
//! use tower_circuit_breaker::tonic::RejectionStatusLayer;
//! use tower_circuit_breaker::CircuitBreakerLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
//! let channel = ServiceBuilder::new()
//!     .layer(RejectionStatusLayer::new())
//!     .layer(CircuitBreakerLayer::builder().consecutive_failures(5).build()?)
//!     .service(channel);
//! // A generated client takes it as it is: `GreeterClient::new(channel)`.
//! let grpc = tonic::client::Grpc::new(channel);
//! # let _ = grpc;
//! # Ok(()) }
//! ```
//!
//! [`tonic::Status`]: https://docs.rs/tonic/0.14/tonic/struct.Status.html

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use ::tonic::metadata::MetadataValue;
use ::tonic::Status;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::State;
use crate::error::CircuitOpen;
use crate::BoxError;

/// The metadata key of the delay, in milliseconds, before a retry may help.
pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";

/// `UNAVAILABLE`, with the time until the next probe in the message and in
/// `grpc-retry-pushback-ms`, and the rejection as the status's source.
///
/// ```
/// use tonic::Code;
/// use tower_circuit_breaker::{Breaker, CircuitOpen, Outcome, TripMode};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// tokio::time::pause();
/// let breaker = Breaker::builder()
///     .trip_mode(TripMode::Open)
///     .consecutive_failures(1)
///     .open_duration(std::time::Duration::from_secs(30))
///     .jitter(0.0)
///     .build()
///     .unwrap();
/// breaker.admit().unwrap().record(Outcome::Failure);
///
/// let status = tonic::Status::from(breaker.admit().unwrap_err());
/// assert_eq!(status.code(), Code::Unavailable);
/// assert_eq!(status.message(), "circuit open; next probe in 30000 ms");
/// assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "30000");
/// let source = std::error::Error::source(&status).unwrap();
/// assert!(source.downcast_ref::<CircuitOpen>().is_some());
/// # }
/// ```
impl From<CircuitOpen> for Status {
    fn from(open: CircuitOpen) -> Status {
        if open.spend().is_some() {
            // Not `RESOURCE_EXHAUSTED`, which clients (and this crate) read
            // as a rate limit to wait out and retry.
            let mut status = Status::permission_denied(open.to_string());
            status.set_source(Arc::new(open));
            return status;
        }
        let wait = open.retry_after().map(|d| {
            // Round up: a client that waits exactly this long finds the
            // circuit ready for a probe.
            let ms = d.as_nanos().div_ceil(1_000_000);
            u64::try_from(ms).unwrap_or(u64::MAX)
        });
        let message = match (open.state(), wait) {
            (State::Closed, Some(ms)) => format!("circuit open (volume limit); retry in {ms} ms"),
            (State::Closed, None) => String::from("circuit open (volume limit)"),
            (_, Some(ms)) => format!("circuit open; next probe in {ms} ms"),
            (State::HalfOpen, None) => String::from("circuit open (half-open, probes in flight)"),
            (State::ForcedOpen, None) => String::from("circuit open (forced open)"),
            (_, None) => String::from("circuit open"),
        };
        let mut status = Status::unavailable(message);
        if let Some(ms) = wait {
            status
                .metadata_mut()
                .insert(RETRY_PUSHBACK_MS, MetadataValue::from(ms));
        }
        status.set_source(Arc::new(open));
        status
    }
}

/// Turns a boxed rejection (one [`CircuitOpen::find`] finds) into a
/// [`Status`]; passes any other error through.
///
/// ```
/// use tonic::Code;
/// use tower_circuit_breaker::{tonic::into_status_error, BoxError, Breaker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().build().unwrap();
/// breaker.force_open();
/// let err = into_status_error(breaker.admit().unwrap_err().into());
/// let status = tonic::Status::from_error(err);
/// assert_eq!(status.code(), Code::Unavailable);
/// # }
/// ```
///
/// [`Status`]: https://docs.rs/tonic/0.14/tonic/struct.Status.html
#[must_use]
pub fn into_status_error(error: BoxError) -> BoxError {
    match CircuitOpen::find(&*error) {
        Some(open) => Box::new(Status::from(open.clone())),
        None => error,
    }
}

// === impl RejectionStatus ===

/// Reports the breaker's rejections as [`Status`]es; see the
/// [module docs](self).
///
/// Wraps a service whose error converts into a [`BoxError`] (such as
/// [`CircuitBreaker`](crate::CircuitBreaker)); its error is that `BoxError`,
/// with a [`CircuitOpen`] replaced by a `Status`. Responses pass through.
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_circuit_breaker::tonic::RejectionStatus;
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = CircuitBreakerLayer::builder().build().unwrap();
/// let channel = tower::service_fn(|_: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let svc = RejectionStatus::new(layer.layer(channel));
/// layer.breaker().force_open();
/// let err = svc.oneshot(http::Request::new(String::new())).await.unwrap_err();
/// let status = err.downcast_ref::<tonic::Status>().unwrap();
/// assert_eq!(status.code(), tonic::Code::Unavailable);
/// # }
/// ```
///
/// [`Status`]: https://docs.rs/tonic/0.14/tonic/struct.Status.html
#[derive(Debug, Clone)]
pub struct RejectionStatus<S> {
    inner: S,
}

impl<S> RejectionStatus<S> {
    /// Wraps `inner`.
    ///
    /// ```
    /// use tower_circuit_breaker::tonic::RejectionStatus;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// let inner = tower::service_fn(|_: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let svc = RejectionStatus::new(CircuitBreaker::new(inner, Breaker::builder().build().unwrap()));
    /// # let _ = svc;
    /// ```
    pub const fn new(inner: S) -> Self {
        RejectionStatus { inner }
    }

    /// A reference to the inner service.
    ///
    /// ```
    /// use tower_circuit_breaker::tonic::RejectionStatus;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker, State};
    ///
    /// let inner = tower::service_fn(|_: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let svc = RejectionStatus::new(CircuitBreaker::new(inner, Breaker::builder().build().unwrap()));
    /// assert_eq!(svc.get_ref().breaker().state(), State::Closed);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    ///
    /// ```
    /// use tower_circuit_breaker::tonic::RejectionStatus;
    ///
    /// let mut svc = RejectionStatus::new(vec![1, 2]);
    /// svc.get_mut().push(3);
    /// assert_eq!(svc.get_ref().len(), 3);
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    ///
    /// ```
    /// use tower_circuit_breaker::tonic::RejectionStatus;
    ///
    /// let svc = RejectionStatus::new("inner");
    /// assert_eq!(svc.into_inner(), "inner");
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Request> Service<Request> for RejectionStatus<S>
where
    S: Service<Request>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| into_status_error(e.into()))
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(request),
        }
    }
}

/// Applies [`RejectionStatus`]; goes outside the breaker's layer.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_circuit_breaker::tonic::RejectionStatusLayer;
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// let breaker = CircuitBreakerLayer::builder().build().unwrap();
/// let stack = ServiceBuilder::new()
///     .layer(RejectionStatusLayer::new()) // outside the breaker
///     .layer(breaker)
///     .service(tower::service_fn(|_: http::Request<String>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
///     }));
/// # let _ = stack;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RejectionStatusLayer {
    _priv: (),
}

impl RejectionStatusLayer {
    /// A new layer.
    ///
    /// ```
    /// use tower::Layer;
    /// use tower_circuit_breaker::tonic::RejectionStatusLayer;
    ///
    /// let svc = RejectionStatusLayer::new().layer(tower::service_fn(|_: ()| async { Ok::<_, std::io::Error>(()) }));
    /// # let _ = svc;
    /// assert_eq!(format!("{:?}", RejectionStatusLayer::new()), format!("{:?}", RejectionStatusLayer::default()));
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        RejectionStatusLayer { _priv: () }
    }
}

impl<S> Layer<S> for RejectionStatusLayer {
    type Service = RejectionStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RejectionStatus::new(inner)
    }
}

pin_project! {
    /// Response future of [`RejectionStatus`].
    ///
    /// ```
    /// use tower::{Service, ServiceExt};
    /// use tower_circuit_breaker::tonic::RejectionStatus;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // Errors other than a rejection pass through the future unchanged.
    /// let mut svc = RejectionStatus::new(tower::service_fn(|_: ()| async {
    ///     Err::<(), _>(std::io::Error::other("reset"))
    /// }));
    /// let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    /// assert_eq!(err.to_string(), "reset");
    /// # }
    /// ```
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(self.project().inner.poll(cx));
        Poll::Ready(result.map_err(|e| into_status_error(e.into())))
    }
}
