//! The response body that finishes a deferred classification.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::classify::{ClassifyStream, NeverDefer};
use crate::guard::BodyGuard;

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
