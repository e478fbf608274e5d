//! Reading what went wrong from error bodies: [`ReadKind`] puts an
//! [`ErrorKind`] in the extensions of 400, 401, 402, 403, 413, 422 and 429
//! answers, beside the outcome.
//!
//! The kind is read from the status and, for 400, 413, 422 and 429, from
//! the first 4 KiB of the body (see
//! [`LlmClassifier::error_kind`](crate::classify::LlmClassifier::error_kind)), which
//! the response future reads before it hands the answer back. The caller
//! still gets the whole body, frame for frame: the frames read are held in
//! [`KindBody`] and given back first. Any other answer, a 2xx above all,
//! passes through with its body unread.
//!
//! The read waits for 4 KiB, the end of the body, its trailers or its error
//! (error bodies are a few hundred bytes and come with their head); a body
//! that stalls holds its answer back as long, so keep a total timeout
//! outside it.
//!
//! Nothing here changes what a breaker records: put `ReadKind` around a
//! [`CircuitBreaker`](crate::CircuitBreaker) (or inside it), and a
//! context-length 400 is still [`Ignored`](crate::Outcome::Ignored).
//! [`Failover::on_kind`](crate::failover::Failover::on_kind) routes on it.
//!
//! # Example
//!
//! ```
//! use http_body_util::BodyExt;
//! use tower::{Layer, ServiceExt};
//! use tower_circuit_breaker::classify::ErrorKind;
//! use tower_circuit_breaker::kind::ReadKindLayer;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let body = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
//! let upstream = tower::service_fn(move |_req: http::Request<String>| async move {
//!     let res = http::Response::builder().status(400).body(http_body_util::Full::new(bytes::Bytes::from(body)));
//!     Ok::<_, std::convert::Infallible>(res.unwrap())
//! });
//! let res = ReadKindLayer::new().layer(upstream).oneshot(http::Request::new(String::new())).await.unwrap();
//! assert_eq!(res.extensions().get::<ErrorKind>(), Some(&ErrorKind::ContextLength));
//! // The caller reads the body as the upstream sent it.
//! assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), body);
//! # }
//! ```

use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::classify::ErrorKind;

mod body;
pub mod future;

pub use self::body::KindBody;

/// A service whose error answers carry their [`ErrorKind`] in their
/// extensions; see the [module docs](self).
///
/// The inner body must be `Unpin` (hyper's `Incoming`, a
/// [`ResponseBody`](crate::ResponseBody) over one, `Full`, `String`): the
/// frames of an error body are read before the head is handed back.
///
/// ```
/// use tower::ServiceExt;
/// use tower_circuit_breaker::classify::ErrorKind;
/// use tower_circuit_breaker::kind::ReadKind;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let upstream = tower::service_fn(|_req: http::Request<String>| async {
///     let res = http::Response::builder().status(401).body(String::from("{}"));
///     Ok::<_, std::convert::Infallible>(res.unwrap())
/// });
/// let res = ReadKind::new(upstream).oneshot(http::Request::new(String::new())).await.unwrap();
/// assert_eq!(res.extensions().get::<ErrorKind>(), Some(&ErrorKind::Auth));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ReadKind<S> {
    inner: S,
}

impl<S> ReadKind<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        ReadKind { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, by value.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req, B> Service<Req> for ReadKind<S>
where
    S: Service<Req, Response = Response<B>>,
    B: Body + Unpin,
{
    type Response = Response<KindBody<B>>;
    type Error = S::Error;
    type Future = future::ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        future::ResponseFuture::new(self.inner.call(request))
    }
}

/// The layer of [`ReadKind`].
///
/// ```
/// use tower::Layer;
/// use tower_circuit_breaker::kind::ReadKindLayer;
///
/// let upstream = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let svc = ReadKindLayer::new().layer(upstream);
/// # let _ = svc;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadKindLayer(());

impl ReadKindLayer {
    /// The layer.
    #[must_use]
    pub const fn new() -> Self {
        ReadKindLayer(())
    }
}

impl<S> Layer<S> for ReadKindLayer {
    type Service = ReadKind<S>;

    fn layer(&self, inner: S) -> ReadKind<S> {
        ReadKind::new(inner)
    }
}

/// Whether answers with `status` have their body read for a kind.
pub(crate) fn reads_body(status: u16) -> bool {
    matches!(status, 400 | 413 | 422 | 429)
}

/// Whether the status alone names a kind.
pub(crate) fn by_status(status: u16) -> Option<ErrorKind> {
    match status {
        401 | 403 => Some(ErrorKind::Auth),
        402 => Some(ErrorKind::QuotaExhausted),
        _ => None,
    }
}
