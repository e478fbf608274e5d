//! The body of an answer whose kind was read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// Response body of [`ReadKind`](super::ReadKind): the frames read to tell
    /// the kind, then the rest of the inner body, as the upstream sent them. A
    /// body error met while reading comes after the frames read before it.
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use tower::ServiceExt;
    /// use tower_circuit_breaker::kind::ReadKind;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::builder().status(400).body(String::from("bad")).unwrap())
    /// });
    /// let res = ReadKind::new(upstream).oneshot(http::Request::new(String::new())).await.unwrap();
    /// assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "bad");
    /// # }
    /// ```
    pub struct KindBody<B: Body> {
        held: VecDeque<Frame<B::Data>>,
        error: Option<B::Error>,
        #[pin]
        inner: B,
        // The inner body ended (or failed) while it was read.
        done: bool,
    }
}

impl<B: Body> KindBody<B> {
    pub(super) fn passthrough(inner: B) -> Self {
        KindBody {
            held: VecDeque::new(),
            error: None,
            inner,
            done: false,
        }
    }

    pub(super) fn read(
        inner: B,
        held: VecDeque<Frame<B::Data>>,
        error: Option<B::Error>,
        done: bool,
    ) -> Self {
        KindBody {
            held,
            error,
            inner,
            done,
        }
    }
}

impl<B: Body + std::fmt::Debug> std::fmt::Debug for KindBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindBody")
            .field("held", &self.held.len())
            .field("inner", &self.inner)
            .field("done", &self.done)
            .finish()
    }
}

impl<B: Body> Body for KindBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if let Some(frame) = this.held.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        if *this.done {
            return Poll::Ready(None);
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.error.is_none() && (self.done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self
            .held
            .iter()
            .filter_map(Frame::data_ref)
            .map(|d| d.remaining() as u64)
            .sum();
        if self.done {
            return SizeHint::with_exact(held);
        }
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(held));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}
