//! Future types

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use tokio::time::{Instant, Sleep};

use crate::body::{ResponseBody, TimedBody};
use crate::breaker::CircuitOpen;
use crate::classify::Classify;
use crate::deadline::StreamElapsed;
use crate::deadline::{StreamDeadline, StreamDeadlines};
use crate::guard::{BodyGuard, Guard, Held};
use crate::{BoxError, Error};

pin_project! {
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker).
    ///
    /// Dropping it before it completes releases the call's permit as
    /// [`Ignored`](crate::Outcome::Ignored).
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt};
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let layer = CircuitBreakerLayer::builder().build().unwrap();
    /// let mut svc = layer.layer(upstream);
    /// layer.breaker().force_open();
    /// // A rejected call's future is ready at once; the upstream is never called.
    /// let future = svc.ready().await.unwrap().call(http::Request::new(String::new()));
    /// assert!(future.await.unwrap_err().is_circuit_open());
    /// # }
    /// ```
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Called {
            #[pin]
            future: F,
            guard: Guard,
            classifier: C,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(future: F, guard: Guard, classifier: C) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                guard,
                classifier,
            },
        }
    }

    pub(crate) fn rejected(error: CircuitOpen) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, C> std::fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, C, B, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
    E: Into<BoxError>,
    C: Classify,
{
    type Output = Result<Response<ResponseBody<B, C::Stream>>, Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                future,
                guard,
                classifier,
            } => {
                assert!(!guard.is_finished(), "polled after completion");
                let (head, body) = match ready!(future.poll(cx)) {
                    Ok(response) => response.into_parts(),
                    Err(error) => {
                        let error = error.into();
                        guard.on_error(classifier, &*error);
                        return Poll::Ready(Err(Error::from_inner(error)));
                    }
                };
                let body = match guard.on_head(classifier, head.status, &head.headers) {
                    None => ResponseBody::decided(body),
                    Some(pending) => ResponseBody::guarded(body, pending),
                };
                Poll::Ready(Ok(Response::from_parts(head, body)))
            }
            KindProj::Rejected { error } => Poll::Ready(Err(Error::open(
                error.take().expect("polled after completion"),
            ))),
        }
    }
}

// === TimedResponseFuture ===

pin_project! {
    /// Response future of a [`CircuitBreaker`](crate::CircuitBreaker) under
    /// [`StreamDeadlines`].
    ///
    /// With a first-frame deadline, it resolves once the first body frame
    /// has come (handed back as the body's first), or fails with a
    /// [`StreamElapsed`](crate::error::StreamElapsed) at the deadline; a body
    /// that ends or fails before its first frame resolves the future with
    /// the ended body or the error. Dropping it before it completes releases
    /// the call's permit as [`Ignored`](crate::Outcome::Ignored).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::deadline::{StreamDeadline, StreamDeadlines};
    /// use tower_circuit_breaker::error::StreamElapsed;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // A head, then no first token: with a first-frame deadline the future
    /// // waits for it, and fails when it does not come.
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     let body = http_body_util::StreamBody::new(futures::stream::pending::<
    ///         Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>,
    ///     >());
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(body))
    /// });
    /// let layer = CircuitBreakerLayer::builder().build().unwrap()
    ///     .stream_deadlines(StreamDeadlines::new().first_frame(Duration::from_secs(10)))
    ///     .unwrap();
    /// let err = layer.layer(upstream).oneshot(http::Request::new(String::new())).await.unwrap_err();
    /// let elapsed = err.inner().and_then(|e| e.downcast_ref::<StreamElapsed>()).unwrap();
    /// assert_eq!(elapsed.deadline(), StreamDeadline::FirstFrame);
    /// # }
    /// ```
    pub struct TimedResponseFuture<F, C, B>
    where
        C: Classify,
        B: Body,
    {
        #[pin]
        kind: TimedKind<F, C, B>,
        deadlines: StreamDeadlines,
        start: Instant,
    }
}

pin_project! {
    #[project = TimedProj]
    enum TimedKind<F, C, B>
    where
        C: Classify,
        B: Body,
    {
        Called {
            #[pin]
            future: F,
            guard: Guard,
            classifier: C,
            // The first-frame deadline, once polled.
            #[pin]
            sleep: Option<Sleep>,
        },
        // Head came; waiting for the first body frame.
        Waiting {
            head: Option<http::response::Parts>,
            body: Option<B>,
            pending: BodyGuard<Held<C::Stream>>,
            #[pin]
            sleep: Sleep,
        },
        Rejected {
            error: Option<CircuitOpen>,
        },
    }
}

impl<F, C: Classify, B: Body> TimedResponseFuture<F, C, B> {
    pub(crate) fn called(
        future: F,
        guard: Guard,
        classifier: C,
        deadlines: StreamDeadlines,
    ) -> Self {
        TimedResponseFuture {
            kind: TimedKind::Called {
                future,
                guard,
                classifier,
                sleep: None,
            },
            deadlines,
            start: Instant::now(),
        }
    }

    pub(crate) fn rejected(error: CircuitOpen, deadlines: StreamDeadlines) -> Self {
        TimedResponseFuture {
            kind: TimedKind::Rejected { error: Some(error) },
            deadlines,
            start: Instant::now(),
        }
    }
}

impl<F, C: Classify, B: Body> std::fmt::Debug for TimedResponseFuture<F, C, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedResponseFuture")
            .field("deadlines", &self.deadlines)
            .finish_non_exhaustive()
    }
}

fn first_frame_elapsed() -> Error {
    Error::from_inner(Box::new(StreamElapsed::new(StreamDeadline::FirstFrame)))
}

impl<F, C, B, E> Future for TimedResponseFuture<F, C, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    E: Into<BoxError>,
    C: Classify,
{
    type Output = Result<Response<TimedBody<B, C::Stream>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let first_frame = this.deadlines.first_frame_timeout();
        loop {
            match this.kind.as_mut().project() {
                TimedProj::Called {
                    future,
                    guard,
                    classifier,
                    mut sleep,
                } => {
                    assert!(!guard.is_finished(), "polled after completion");
                    let result = match future.poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            let Some(timeout) = first_frame else {
                                return Poll::Pending;
                            };
                            if sleep.is_none() {
                                sleep.set(Some(tokio::time::sleep_until(*this.start + timeout)));
                            }
                            let sleep = sleep.as_pin_mut().expect("set above");
                            ready!(sleep.poll(cx));
                            guard.on_deadline();
                            return Poll::Ready(Err(first_frame_elapsed()));
                        }
                    };
                    let (head, body) = match result {
                        Ok(response) => response.into_parts(),
                        Err(error) => {
                            let error = error.into();
                            guard.on_error(classifier, &*error);
                            return Poll::Ready(Err(Error::from_inner(error)));
                        }
                    };
                    let mut pending = guard.on_timed_head(
                        classifier,
                        head.status,
                        &head.headers,
                        first_frame.is_some(),
                    );
                    let ended = body.is_end_stream();
                    if ended {
                        pending.on_end();
                    }
                    match first_frame {
                        // Wait for the first frame only while it can still
                        // decide the call.
                        Some(timeout) if !ended && pending.is_pending() => {
                            let sleep = tokio::time::sleep_until(*this.start + timeout);
                            this.kind.set(TimedKind::Waiting {
                                head: Some(head),
                                body: Some(body),
                                pending,
                                sleep,
                            });
                        }
                        _ => {
                            let body = TimedBody::new(
                                body,
                                pending,
                                None,
                                ended,
                                this.deadlines,
                                *this.start,
                            );
                            return Poll::Ready(Ok(Response::from_parts(head, body)));
                        }
                    }
                }
                TimedProj::Waiting {
                    head,
                    body,
                    pending,
                    sleep,
                } => {
                    let inner = body.as_mut().expect("polled after completion");
                    let frame = match Pin::new(&mut *inner).poll_frame(cx) {
                        Poll::Ready(frame) => frame,
                        Poll::Pending => {
                            ready!(sleep.poll(cx));
                            pending.on_deadline();
                            body.take();
                            return Poll::Ready(Err(first_frame_elapsed()));
                        }
                    };
                    pending.first_frame();
                    pending.on_frame(&frame, || inner.is_end_stream());
                    let head = head.take().expect("polled after completion");
                    let inner = body.take().expect("polled after completion");
                    let pending = std::mem::replace(pending, BodyGuard::decided());
                    let (held, ended) = match frame {
                        Some(Ok(frame)) => (Some(frame), false),
                        Some(Err(error)) => {
                            return Poll::Ready(Err(Error::from_inner(error.into())))
                        }
                        None => (None, true),
                    };
                    let body =
                        TimedBody::new(inner, pending, held, ended, this.deadlines, *this.start);
                    return Poll::Ready(Ok(Response::from_parts(head, body)));
                }
                TimedProj::Rejected { error } => {
                    return Poll::Ready(Err(Error::open(
                        error.take().expect("polled after completion"),
                    )))
                }
            }
        }
    }
}
