//! The response body that finishes a deferred classification.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::breaker::Permit;
use crate::classify::{ClassifyStream, NeverDefer, Outcome};

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
    pub struct ResponseBody<B, S: ClassifyStream = NeverDefer> {
        #[pin]
        inner: B,
        pending: Pending<S>,
    }

}

impl<B, S: ClassifyStream> ResponseBody<B, S> {
    pub(crate) fn decided(inner: B) -> Self {
        ResponseBody {
            inner,
            pending: Pending(None),
        }
    }

    pub(crate) fn deferred(inner: B, permit: Permit, stream: S) -> Self
    where
        B: Body,
    {
        let mut pending = Pending(Some((permit, stream)));
        // A body with nothing in it has ended already, and may be dropped
        // without ever being polled.
        if inner.is_end_stream() {
            settle(&mut pending, S::on_end);
        }
        ResponseBody { inner, pending }
    }

    /// Whether the body still holds its call's permit, waiting for the end of
    /// the stream to decide the outcome.
    pub fn is_pending(&self) -> bool {
        self.pending.0.is_some()
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
            .field("pending", &self.pending.0.is_some())
            .finish()
    }
}

/// The permit and stream classifier of an undecided call; dropping it
/// records what the classifier says of a body dropped early.
struct Pending<S: ClassifyStream>(Option<(Permit, S)>);

impl<S: ClassifyStream> Drop for Pending<S> {
    fn drop(&mut self) {
        if let Some((permit, stream)) = self.0.take() {
            permit.record(stream.on_drop());
        }
    }
}

fn settle<S: ClassifyStream>(pending: &mut Pending<S>, f: impl FnOnce(S) -> Outcome) {
    if let Some((permit, stream)) = pending.0.take() {
        permit.record(f(stream));
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
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if let Some((_, stream)) = this.pending.0.as_mut() {
            let decided = match &frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        stream.on_data(data.chunk())
                    } else if let Some(trailers) = frame.trailers_ref() {
                        stream.on_trailers(trailers)
                    } else {
                        None
                    }
                }
                Some(Err(_)) => {
                    settle(&mut *this.pending, S::on_error);
                    None
                }
                None => {
                    settle(&mut *this.pending, S::on_end);
                    None
                }
            };
            if let Some(outcome) = decided {
                settle(&mut *this.pending, |_| outcome);
            } else if this.inner.is_end_stream() {
                settle(&mut *this.pending, S::on_end);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
