//! The response bodies that finish a deferred classification, and keep
//! stream deadlines.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::classify::{ClassifyStream, NeverDefer};
use crate::deadline::StreamElapsed;
use crate::deadline::{StreamDeadline, StreamDeadlines};
use crate::guard::{BodyGuard, Held};
use crate::BoxError;

pin_project! {
    /// Response body of [`CircuitBreaker`](crate::CircuitBreaker).
    ///
    /// When the classifier deferred its verdict, the body holds the call's
    /// permit until the stream ends, fails, reaches a deciding event or is
    /// dropped, so a half-open probe covers the whole stream. Frames, data and
    /// errors pass through unchanged.
    ///
    /// It is `Send` and `Sync` whenever `B` and the stream classifier are, and
    /// `Default` whenever `B` is.
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::{CircuitBreakerLayer, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // A 200 whose event stream reports an error: the verdict waits for the body.
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     let body = "data: {\"choices\":[]}\n\nevent: error\ndata: {\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    ///     Ok::<_, std::convert::Infallible>(
    ///         http::Response::builder().header("content-type", "text/event-stream").body(body.to_string()).unwrap(),
    ///     )
    /// });
    /// let layer = CircuitBreakerLayer::builder().trip_mode(TripMode::Open).consecutive_failures(1).build().unwrap()
    ///     .with_classifier(LlmClassifier::default());
    /// let breaker = layer.breaker().clone();
    /// let res = layer.layer(upstream).oneshot(http::Request::new(String::new())).await.unwrap();
    /// assert_eq!(breaker.state(), State::Closed, "the head said 200");
    /// res.into_body().collect().await.unwrap();
    /// assert_eq!(breaker.state(), State::Open, "the stream said error");
    /// # }
    /// ```
    pub struct ResponseBody<B, S: ClassifyStream = NeverDefer> {
        #[pin]
        inner: B,
        pending: BodyGuard<S>,
    }

}

impl<B, S: ClassifyStream> ResponseBody<B, S> {
    pub(crate) fn decided(inner: B) -> Self {
        ResponseBody {
            inner,
            pending: BodyGuard::decided(),
        }
    }

    pub(crate) fn guarded(inner: B, mut pending: BodyGuard<S>) -> Self
    where
        B: Body,
    {
        // A body with nothing in it has ended already, and may be dropped
        // without ever being polled.
        if inner.is_end_stream() {
            pending.on_end();
        }
        ResponseBody { inner, pending }
    }

    /// Whether the body still holds its call's permit, waiting for the end of
    /// the stream to decide the outcome.
    ///
    /// ```
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new("hello".to_string()))
    /// });
    /// // The default classifier decides on the head: the body holds nothing.
    /// let res = CircuitBreakerLayer::builder().build().unwrap()
    ///     .layer(upstream)
    ///     .oneshot(http::Request::new(String::new()))
    ///     .await
    ///     .unwrap();
    /// assert!(!res.body().is_pending());
    /// # }
    /// ```
    pub fn is_pending(&self) -> bool {
        self.pending.is_pending()
    }
}

impl<B: Default, S: ClassifyStream> Default for ResponseBody<B, S> {
    fn default() -> Self {
        ResponseBody::decided(B::default())
    }
}

impl<B: std::fmt::Debug, S: ClassifyStream> std::fmt::Debug for ResponseBody<B, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("pending", &self.pending.is_pending())
            .finish()
    }
}

impl<B, S> Body for ResponseBody<B, S>
where
    B: Body,
    S: ClassifyStream,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let mut inner = this.inner;
        let frame = ready!(inner.as_mut().poll_frame(cx));
        this.pending.on_frame(&frame, || inner.is_end_stream());
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// === TimedBody ===

pin_project! {
    /// Response body of a [`CircuitBreaker`](crate::CircuitBreaker) under
    /// [`StreamDeadlines`]: the body of [`ResponseBody`], with a first frame
    /// held back by the response future handed back first, a stall and a
    /// total deadline, and a [`BoxError`] error (the inner body's error, or a
    /// [`StreamElapsed`](crate::error::StreamElapsed)).
    ///
    /// A deadline that passes ends the body with the error, records the
    /// call as a [`Failure`](crate::Outcome::Failure) if its verdict was
    /// still open, and the body then ends. The timer lives in the body, and
    /// runs in the task that polls it.
    ///
    /// It is `Send` and `Sync` whenever `B`, its data and the stream
    /// classifier are, and `Unpin` whenever `B` is. See [`deadline`](crate::deadline) for an example.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http_body_util::BodyExt;
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::deadline::{StreamDeadline, StreamDeadlines};
    /// use tower_circuit_breaker::error::StreamElapsed;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // One chunk, then silence: the stall deadline ends the body with an error.
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     let (tx, body) = tokio::sync::mpsc::channel::<Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>>(1);
    ///     tx.send(Ok(http_body::Frame::data(bytes::Bytes::from("data: hi\n\n")))).await.unwrap();
    ///     tokio::spawn(async move { let _tx = tx; std::future::pending::<()>().await });
    ///     let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(body));
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(body))
    /// });
    /// let layer = CircuitBreakerLayer::builder().build().unwrap()
    ///     .stream_deadlines(StreamDeadlines::new().stall(Duration::from_secs(15)))
    ///     .unwrap();
    /// let res = layer.layer(upstream).oneshot(http::Request::new(String::new())).await.unwrap();
    /// let err = res.into_body().collect().await.unwrap_err();
    /// assert_eq!(err.downcast_ref::<StreamElapsed>().unwrap().deadline(), StreamDeadline::Stall);
    /// # }
    /// ```
    pub struct TimedBody<B: Body, S: ClassifyStream = NeverDefer> {
        #[pin]
        inner: B,
        pending: BodyGuard<Held<S>>,
        // The first frame, which the response future waited for.
        held: Option<Frame<B::Data>>,
        stall: Option<Duration>,
        total_at: Option<Instant>,
        // Which deadline `sleep` is set to.
        next: StreamDeadline,
        // Boxed, so that the body is `Unpin` whenever `B` is (one
        // allocation per body, only with a stall or total deadline).
        sleep: Option<Pin<Box<Sleep>>>,
        ended: bool,
    }
}

impl<B: Body, S: ClassifyStream> TimedBody<B, S> {
    /// A body whose head came at `now`, for a call made at `start`.
    pub(crate) fn new(
        inner: B,
        pending: BodyGuard<Held<S>>,
        held: Option<Frame<B::Data>>,
        ended: bool,
        deadlines: &StreamDeadlines,
        start: Instant,
    ) -> Self {
        let mut body = TimedBody {
            inner,
            pending,
            held,
            stall: deadlines.stall_timeout(),
            total_at: deadlines.total_timeout().map(|t| start + t),
            next: StreamDeadline::Stall,
            sleep: None,
            ended,
        };
        if !body.ended
            && let Some((at, next)) = body.deadline_after(Instant::now())
        {
            body.next = next;
            body.sleep = Some(Box::pin(tokio::time::sleep_until(at)));
        }
        body
    }

    /// The next deadline after a frame (or the head) at `now`.
    fn deadline_after(&self, now: Instant) -> Option<(Instant, StreamDeadline)> {
        let stall = self.stall.map(|s| (now + s, StreamDeadline::Stall));
        let total = self.total_at.map(|t| (t, StreamDeadline::Total));
        match (stall, total) {
            (Some(s), Some(t)) if t.0 <= s.0 => Some(t),
            (Some(s), _) => Some(s),
            (None, t) => t,
        }
    }

    /// Whether the body still holds its call's permit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http_body_util::BodyExt;
    /// use tower::{Layer, ServiceExt};
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new("answer".to_string()))
    /// });
    /// let layer = CircuitBreakerLayer::builder().build().unwrap()
    ///     .stream_deadlines(StreamDeadlines::new().total(Duration::from_secs(60)))
    ///     .unwrap();
    /// let res = layer.layer(upstream).oneshot(http::Request::new(String::new())).await.unwrap();
    /// // Under deadlines the permit stays with the body until it ends: a
    /// // deadline that passes first is a failure.
    /// let mut body = res.into_body();
    /// assert!(body.is_pending());
    /// while let Some(frame) = body.frame().await {
    ///     frame.unwrap();
    /// }
    /// assert!(!body.is_pending());
    /// # }
    /// ```
    pub fn is_pending(&self) -> bool {
        self.pending.is_pending()
    }
}

impl<B, S> std::fmt::Debug for TimedBody<B, S>
where
    B: Body + std::fmt::Debug,
    S: ClassifyStream,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedBody")
            .field("inner", &self.inner)
            .field("pending", &self.pending.is_pending())
            .field("ended", &self.ended)
            .finish()
    }
}

impl<B, S> Body for TimedBody<B, S>
where
    B: Body,
    B::Error: Into<BoxError>,
    S: ClassifyStream,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let frame = match this.held.take() {
            // Seen by the classifier when it came.
            Some(frame) => Some(Ok(frame)),
            None => match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(frame) => {
                    let inner = this.inner.as_mut();
                    this.pending.on_frame(&frame, || inner.is_end_stream());
                    frame
                }
                Poll::Pending => {
                    let Some(sleep) = this.sleep.as_mut() else {
                        return Poll::Pending;
                    };
                    ready!(sleep.as_mut().poll(cx));
                    this.pending.on_deadline();
                    *this.ended = true;
                    let elapsed: BoxError = Box::new(StreamElapsed::new(*this.next));
                    return Poll::Ready(Some(Err(elapsed)));
                }
            },
        };
        match frame {
            Some(Ok(frame)) => {
                if this.sleep.is_some() {
                    // A frame came: the stall clock starts again.
                    let stall = this.stall.map(|s| Instant::now() + s);
                    let (at, next) = match (stall, *this.total_at) {
                        (Some(s), Some(t)) if t <= s => (t, StreamDeadline::Total),
                        (Some(s), _) => (s, StreamDeadline::Stall),
                        (None, Some(t)) => (t, StreamDeadline::Total),
                        (None, None) => unreachable!("a timer is set only for a deadline"),
                    };
                    *this.next = next;
                    if let Some(sleep) = this.sleep.as_mut()
                        && sleep.deadline() != at
                    {
                        sleep.as_mut().reset(at);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => {
                *this.ended = true;
                Poll::Ready(Some(Err(error.into())))
            }
            None => {
                *this.ended = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.held.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held = self
            .held
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.remaining() as u64);
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}
