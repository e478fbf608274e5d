use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use tower_service::Service;

use crate::body::{ResponseBody, TimedBody};
use crate::breaker::Breaker;
use crate::classify::{Classify, HttpClassifier};
use crate::deadline::{DeadlineError, StreamDeadlines};
use crate::future::{ResponseFuture, TimedResponseFuture};
use crate::guard::Guard;
pub use crate::guard::Select;
use crate::{BoxError, Error};

/// A service that asks a [`Breaker`] before every call and records how the
/// call went.
///
/// `poll_ready` only drives the inner service: an open circuit never makes the
/// service unready. The decision is made in `call`; a rejected call returns a
/// ready future that yields [`Error`] holding a
/// [`CircuitOpen`](crate::CircuitOpen), without touching the inner service.
///
/// # Example
///
/// ```
/// use tower::{Service, ServiceExt};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker, TripMode};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let upstream = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(
///         http::Response::builder().status(503).body(String::new()).unwrap(),
///     )
/// });
/// // All or nothing; by default a call without a fallback is graded.
/// let breaker = Breaker::builder().trip_mode(TripMode::Open).consecutive_failures(2).build().unwrap();
/// let mut svc = CircuitBreaker::new(upstream, breaker);
///
/// for _ in 0..2 {
///     let res = svc.ready().await.unwrap().call(http::Request::new(String::new())).await.unwrap();
///     assert_eq!(res.status(), 503);
/// }
/// let err = svc.ready().await.unwrap().call(http::Request::new(String::new())).await.unwrap_err();
/// assert!(err.is_circuit_open());
/// # }
/// ```
///
/// With [`stream_deadlines`](Self::stream_deadlines) (the `D` parameter is
/// then [`StreamDeadlines`]), the body is a [`TimedBody`] that keeps them;
/// see [`deadline`](crate::deadline).
#[derive(Debug, Clone)]
pub struct CircuitBreaker<S, C = HttpClassifier, P = Breaker, D = ()> {
    inner: S,
    select: P,
    classifier: C,
    deadlines: D,
}

impl<S> CircuitBreaker<S> {
    /// Wraps `inner`, classifying with [`HttpClassifier`].
    pub const fn new(inner: S, breaker: Breaker) -> Self {
        CircuitBreaker {
            inner,
            select: breaker,
            classifier: HttpClassifier,
            deadlines: (),
        }
    }
}

impl<S, C, D> CircuitBreaker<S, C, Breaker, D> {
    /// The breaker, for snapshots and manual control.
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<S, C, P> CircuitBreaker<S, C, P> {
    /// Wraps `inner`, choosing a breaker per request with `select` (a
    /// [`Breaker`], or [`Keyed`](crate::keyed::Keyed) breakers) and
    /// classifying with `classifier`.
    pub const fn with_classifier(inner: S, select: P, classifier: C) -> Self {
        CircuitBreaker {
            inner,
            select,
            classifier,
            deadlines: (),
        }
    }

    /// Keeps `deadlines` on every response body: the first frame, stalls
    /// and the total time (see [`deadline`](crate::deadline)). Refuses
    /// deadlines that cannot work with a [`DeadlineError`].
    ///
    /// # Errors
    ///
    /// A [`DeadlineError`] from [`StreamDeadlines::validate`](crate::deadline::StreamDeadlines::validate).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let svc = CircuitBreaker::new(upstream, Breaker::builder().build().unwrap())
    ///     .stream_deadlines(StreamDeadlines::new().stall(Duration::from_secs(15)))
    ///     .unwrap();
    /// assert_eq!(svc.deadlines().stall_timeout(), Some(Duration::from_secs(15)));
    /// ```
    pub fn stream_deadlines(
        self,
        deadlines: StreamDeadlines,
    ) -> Result<CircuitBreaker<S, C, P, StreamDeadlines>, DeadlineError> {
        deadlines.validate()?;
        Ok(CircuitBreaker::from_parts(
            self.inner,
            self.select,
            self.classifier,
            deadlines,
        ))
    }
}

impl<S, C, P, D> CircuitBreaker<S, C, P, D> {
    pub(crate) const fn from_parts(inner: S, select: P, classifier: C, deadlines: D) -> Self {
        CircuitBreaker {
            inner,
            select,
            classifier,
            deadlines,
        }
    }

    /// The stream deadlines (`()` without them).
    pub fn deadlines(&self) -> &D {
        &self.deadlines
    }

    /// What chooses the breaker for each request.
    pub fn select(&self) -> &P {
        &self.select
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, C, P, Request, B> Service<Request> for CircuitBreaker<S, C, P>
where
    S: Service<Request, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body,
    C: Classify + Clone,
    P: Select<Request>,
{
    type Response = Response<ResponseBody<B, C::Stream>>;
    type Error = Error;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_inner(e.into()))
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        match Guard::admit(&self.select, &request) {
            Ok(guard) => {
                ResponseFuture::called(self.inner.call(request), guard, self.classifier.clone())
            }
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}

impl<S, C, P, Request, B> Service<Request> for CircuitBreaker<S, C, P, StreamDeadlines>
where
    S: Service<Request, Response = Response<B>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    C: Classify + Clone,
    P: Select<Request>,
{
    type Response = Response<TimedBody<B, C::Stream>>;
    type Error = Error;
    type Future = TimedResponseFuture<S::Future, C, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::from_inner(e.into()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match Guard::admit(&self.select, &request) {
            Ok(guard) => TimedResponseFuture::called(
                self.inner.call(request),
                guard,
                self.classifier.clone(),
                self.deadlines,
            ),
            Err(open) => TimedResponseFuture::rejected(open, self.deadlines),
        }
    }
}
