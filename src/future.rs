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
    /// Response future of [`CircuitBreaker`](crate::CircuitBreaker), and of
    /// every adapter that sends a call through a breaker (the async-openai
    /// service's [`ResponseFuture`](crate::async_openai::ResponseFuture) and
    /// reqwest's [`SendFuture`](crate::reqwest::SendFuture) are this future
    /// with their own types): the call is admitted, sent, and its answer or
    /// error judged the same way whatever sent it.
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
    pub struct ResponseFuture<F, C, A = Http>
    where
        A: Adapt,
    {
        #[pin]
        kind: Kind<F, C, A>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C, A>
    where
        A: Adapt,
    {
        Called {
            #[pin]
            future: F,
            guard: Guard,
            classifier: C,
        },
        Refused {
            error: Option<A::Refused>,
        },
    }
}

impl<F, C, A: Adapt> ResponseFuture<F, C, A> {
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
        Self::refused(A::reject(error))
    }

    /// A call that was never made: rejected, or (for an adapter that
    /// builds the request itself) not built.
    pub(crate) fn refused(error: A::Refused) -> Self {
        ResponseFuture {
            kind: Kind::Refused { error: Some(error) },
        }
    }
}

impl<F, C, A: Adapt> std::fmt::Debug for ResponseFuture<F, C, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, C, A, T, E> Future for ResponseFuture<F, C, A>
where
    F: Future<Output = Result<T, E>>,
    C: Classify,
    A: Adapter<T, E, C::Stream>,
{
    type Output = Result<A::Response, A::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called {
                future,
                guard,
                classifier,
            } => {
                assert!(!guard.is_finished(), "polled after completion");
                let answer = ready!(future.poll(cx));
                Poll::Ready(judged::<A, _, _, _>(guard, classifier, answer))
            }
            KindProj::Refused { error } => Poll::Ready(Err(A::refused(
                error.take().expect("polled after completion"),
            ))),
        }
    }
}

/// Judges a finished call through `guard`, whatever adapter made it: the
/// answer's head goes to [`Guard::on_head`] (a verdict deferred to the body
/// rides in a [`ResponseBody`]), the error the classifier is to see to
/// [`Guard::on_error`], and an error raised on the caller's side before or
/// instead of a call is [`Ignored`](crate::Outcome::Ignored). The adapter
/// only shuffles its types.
#[inline]
pub(crate) fn judged<A, T, E, C>(
    guard: &mut Guard,
    classifier: &C,
    answer: Result<T, E>,
) -> Result<A::Response, A::Error>
where
    C: Classify,
    A: Adapter<T, E, C::Stream>,
{
    match answer {
        Ok(answer) => Ok(A::answer(
            answer,
            |status, headers| guard.on_head(classifier, status, headers),
            ResponseBody::guarded,
        )),
        Err(error) => Err(A::error(error, |inner| match inner {
            Some(inner) => guard.on_error(classifier, inner),
            None => guard.on_caller_error(),
        })),
    }
}

// === adapters ===

pub(crate) use self::adapt::{Adapt, Adapter, Http};

/// How an adapter's types meet the one response future. Sealed: the
/// adapters are the crate's.
pub(crate) mod adapt {
    use http::{HeaderMap, Response, StatusCode};
    use http_body::Body;

    use crate::body::ResponseBody;
    use crate::breaker::CircuitOpen;
    use crate::classify::{ClassifyStream, ErrorRef};
    use crate::{BoxError, Error};

    /// What a future holds for a call that was never made.
    pub trait Adapt {
        /// A rejection, or the adapter's own error from before the call.
        type Refused;

        /// The rejection as this adapter holds it.
        fn reject(open: CircuitOpen) -> Self::Refused;
    }

    /// The types of one adapter: what its inner call answers (`T`) and
    /// fails with (`E`), and what its caller gets, for a classifier whose
    /// stream classifier is `S`.
    pub trait Adapter<T, E, S: ClassifyStream>: Adapt {
        /// The body a deferred verdict rides in.
        type Body: Body;
        /// What the caller gets for an answer.
        type Response;
        /// What the caller gets for an error or a refusal.
        type Error;

        /// Shows `head` the answer's status and headers; where it returns
        /// a pending verdict, rebuilds the answer with its body wrapped by
        /// `wrap` to carry it.
        fn answer<P>(
            answer: T,
            head: impl FnOnce(StatusCode, &HeaderMap) -> Option<P>,
            wrap: impl FnOnce(Self::Body, P) -> ResponseBody<Self::Body, S>,
        ) -> Self::Response;

        /// Shows `judge` the error the classifier is to see (`None`: raised
        /// on the caller's side, not by the upstream), and returns the
        /// caller's error.
        fn error(error: E, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> Self::Error;

        /// The caller's error for a call never made.
        fn refused(refused: Self::Refused) -> Self::Error;
    }

    /// The tower service's types: `http::Response`s in and out, the
    /// crate's [`Error`].
    #[derive(Debug)]
    pub struct Http;

    impl Adapt for Http {
        type Refused = CircuitOpen;

        #[inline]
        fn reject(open: CircuitOpen) -> CircuitOpen {
            open
        }
    }

    impl<B, E, S> Adapter<Response<B>, E, S> for Http
    where
        B: Body,
        E: Into<BoxError>,
        S: ClassifyStream,
    {
        type Body = B;
        type Response = Response<ResponseBody<B, S>>;
        type Error = Error;

        #[inline]
        fn answer<P>(
            answer: Response<B>,
            head: impl FnOnce(StatusCode, &HeaderMap) -> Option<P>,
            wrap: impl FnOnce(B, P) -> ResponseBody<B, S>,
        ) -> Self::Response {
            let (parts, body) = answer.into_parts();
            let body = match head(parts.status, &parts.headers) {
                None => ResponseBody::decided(body),
                Some(pending) => wrap(body, pending),
            };
            Response::from_parts(parts, body)
        }

        #[inline]
        fn error(error: E, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> Error {
            let error = error.into();
            judge(Some(&*error));
            Error::from_inner(error)
        }

        #[inline]
        fn refused(open: CircuitOpen) -> Error {
            Error::open(open)
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
