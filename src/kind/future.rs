//! Future types

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Buf;
use http::response::Parts;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use super::{by_status, reads_body, KindBody};
use crate::classify::{LlmClassifier, MAX_KIND_BODY};

pin_project! {
    /// Response future of [`ReadKind`](super::ReadKind): the inner call,
    /// then, for an error answer whose body tells the kind, the first
    /// frames of its body.
    ///
    /// ```
    /// use tower::{Service, ServiceExt};
    /// use tower_circuit_breaker::kind::ReadKind;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
    /// });
    /// let mut svc = ReadKind::new(upstream);
    /// let future = svc.ready().await.unwrap().call(http::Request::new(String::new()));
    /// assert_eq!(future.await.unwrap().status(), 200);
    /// # }
    /// ```
    pub struct ResponseFuture<F, B: Body> {
        #[pin]
        inner: F,
        reading: Option<Reading<B>>,
    }
}

struct Reading<B: Body> {
    head: Parts,
    body: B,
    frames: VecDeque<Frame<B>>,
    bytes: Vec<u8>,
}

type Frame<B> = http_body::Frame<<B as Body>::Data>;

impl<F, B: Body> ResponseFuture<F, B> {
    pub(super) fn new(inner: F) -> Self {
        ResponseFuture {
            inner,
            reading: None,
        }
    }
}

impl<F, B: Body> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("reading", &self.reading.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body + Unpin,
{
    type Output = Result<Response<KindBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.reading.is_none() {
            let response = ready!(this.inner.poll(cx))?;
            let status = response.status().as_u16();
            if !reads_body(status) || response.body().is_end_stream() {
                let kind = by_status(status).or_else(|| {
                    reads_body(status)
                        .then(|| LlmClassifier::error_kind(response.status(), b""))
                        .flatten()
                });
                let mut response = response.map(KindBody::passthrough);
                if let Some(kind) = kind {
                    response.extensions_mut().insert(kind);
                }
                return Poll::Ready(Ok(response));
            }
            let (head, body) = response.into_parts();
            *this.reading = Some(Reading {
                head,
                body,
                frames: VecDeque::new(),
                bytes: Vec::new(),
            });
        }
        let reading = this.reading.as_mut().expect("set above");
        let (error, done) = loop {
            if reading.bytes.len() >= MAX_KIND_BODY {
                break (None, false);
            }
            match ready!(Pin::new(&mut reading.body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let chunk = data.chunk();
                        let room = MAX_KIND_BODY - reading.bytes.len();
                        reading
                            .bytes
                            .extend_from_slice(&chunk[..chunk.len().min(room)]);
                    }
                    let trailers = frame.is_trailers();
                    reading.frames.push_back(frame);
                    if trailers || reading.body.is_end_stream() {
                        break (None, true);
                    }
                }
                Some(Err(error)) => break (Some(error), true),
                None => break (None, true),
            }
        };
        let Reading {
            head,
            body,
            frames,
            bytes,
        } = this.reading.take().expect("set above");
        let kind = LlmClassifier::error_kind(head.status, &bytes);
        let mut response = Response::from_parts(head, KindBody::read(body, frames, error, done));
        if let Some(kind) = kind {
            response.extensions_mut().insert(kind);
        }
        Poll::Ready(Ok(response))
    }
}
