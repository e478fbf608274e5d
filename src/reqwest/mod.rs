//! A tower service around [`reqwest::Client`], so the
//! breaker can stand in front of it.
//!
//! reqwest has no request-level middleware hook of its own (its connector
//! layer sees connections, never a status code). [`ReqwestService`] makes a
//! `reqwest::Client` a `tower::Service` that takes an `http::Request<B>` and
//! answers an `http::Response<reqwest::Body>`, so
//! [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) wraps it like any other
//! HTTP client. Use [`into_reqwest_response`] to get a `reqwest::Response`
//! back, and [`reqwest_middleware`](crate::reqwest_middleware) to guard a
//! `reqwest_middleware::ClientWithMiddleware` with the same breaker.
//!
//! Code written against reqwest's own types keeps them: [`ReqwestClient`]
//! is a service over `reqwest::Request` that answers a `reqwest::Response`,
//! and [`RequestBuilderExt::send_through`] ends a `reqwest::RequestBuilder`
//! chain (`client.post(url).json(&body).send_through(&layer)`), both
//! sharing the layer's breaker.
//!
//! Errors round-trip: a `reqwest::Error` stays a `reqwest::Error` inside
//! [`Error`](crate::Error) ([`Error::inner`](crate::Error::inner)) and in the [`BoxError`] that
//! [`Error::into_box`](crate::Error::into_box) takes it apart into, so `is_connect()` and
//! `is_timeout()` still answer. The classifier sees it as
//! the inner error; the default classifiers count every transport error
//! (connect, reset, timeout) as a failure.
//!
//! # Example
//!
//! Two refused connections open the circuit; the third call never leaves the
//! process.
//!
//! ```
//! use tower::{Service, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::reqwest::ReqwestService;
//! use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen, State, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // A port that refuses connections.
//! let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
//! let url = format!("http://{closed}/v1/chat/completions");
//!
//! let layer = CircuitBreakerLayer::builder().trip_mode(TripMode::Open).consecutive_failures(2).build()?;
//! let breaker = layer.breaker().clone();
//! let mut client = ServiceBuilder::new()
//!     .layer(layer)
//!     .service(ReqwestService::new(reqwest::Client::new()));
//!
//! for _ in 0..2 {
//!     let request = http::Request::post(url.as_str()).body("{}")?;
//!     let err: BoxError = client.ready().await?.call(request).await.unwrap_err().into_box();
//!     let err = err.downcast::<reqwest::Error>().expect("a reqwest error");
//!     assert!(err.is_connect());
//! }
//! assert_eq!(breaker.state(), State::Open);
//!
//! let request = http::Request::post(url.as_str()).body("{}")?;
//! let err: BoxError = client.ready().await?.call(request).await.unwrap_err().into();
//! assert!(CircuitOpen::find(&*err).is_some());
//! # Ok(()) }
//! ```
//!
//! [`reqwest::Client`]: https://docs.rs/reqwest/0.13/reqwest/struct.Client.html

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Body as HttpBody;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::integrations::keep_url;
use crate::BoxError;

mod client;

pub use self::client::{RequestBuilderExt, ReqwestClient, SendFuture};

/// A [`reqwest::Client`] as a `tower::Service` over `http`
/// types.
///
/// It takes an `http::Request<B>` whose body converts into a
/// `reqwest::Body` (`String`, `Vec<u8>`, `Bytes`, `&'static str`,
/// `reqwest::Body` itself) and answers an `http::Response<reqwest::Body>`
/// that still carries the final URL (see [`into_reqwest_response`]). Like
/// hyper-util's client it is typed by its request body, which is usually
/// inferred from the first call. A `reqwest::Request` goes in through
/// `http::Request::try_from(request)`.
///
/// It is always ready. Its error is `reqwest::Error`, including for a request
/// whose URI reqwest cannot take (`is_builder()`).
///
/// See the [module docs](self) for an example.
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_circuit_breaker::reqwest::ReqwestService;
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// let layer = CircuitBreakerLayer::builder().name("chat").build().unwrap();
/// let client = ServiceBuilder::new()
///     .layer(layer)
///     .service(ReqwestService::<String>::new(reqwest::Client::new()));
/// # let _ = client;
/// ```
///
/// [`reqwest::Client`]: https://docs.rs/reqwest/0.13/reqwest/struct.Client.html
pub struct ReqwestService<B = ::reqwest::Body> {
    client: ::reqwest::Client,
    _body: PhantomData<fn(B)>,
}

impl<B> ReqwestService<B> {
    /// Sends requests with `client`.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::ReqwestService;
    ///
    /// let service: ReqwestService<Vec<u8>> = ReqwestService::new(reqwest::Client::new());
    /// # let _ = service;
    /// ```
    #[must_use]
    pub const fn new(client: ::reqwest::Client) -> Self {
        ReqwestService {
            client,
            _body: PhantomData,
        }
    }

    /// The client.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::ReqwestService;
    ///
    /// let service = ReqwestService::<String>::new(reqwest::Client::new());
    /// let _client: &reqwest::Client = service.get_ref();
    /// ```
    #[must_use]
    pub fn get_ref(&self) -> &::reqwest::Client {
        &self.client
    }

    /// The client.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::ReqwestService;
    ///
    /// let service = ReqwestService::<String>::new(reqwest::Client::new());
    /// let _client: reqwest::Client = service.into_inner();
    /// ```
    #[must_use]
    pub fn into_inner(self) -> ::reqwest::Client {
        self.client
    }
}

impl<B> Clone for ReqwestService<B> {
    fn clone(&self) -> Self {
        ReqwestService::new(self.client.clone())
    }
}

impl<B> Default for ReqwestService<B> {
    fn default() -> Self {
        ReqwestService::new(::reqwest::Client::default())
    }
}

impl<B> fmt::Debug for ReqwestService<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestService")
            .field("client", &self.client)
            .finish()
    }
}

impl<B> From<::reqwest::Client> for ReqwestService<B> {
    fn from(client: ::reqwest::Client) -> Self {
        ReqwestService::new(client)
    }
}

impl<B> Service<http::Request<B>> for ReqwestService<B>
where
    B: Into<::reqwest::Body>,
{
    type Response = http::Response<::reqwest::Body>;
    type Error = ::reqwest::Error;
    type Future = ResponseFuture;

    #[inline]
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match ::reqwest::Request::try_from(request) {
            Ok(request) => ResponseFuture::sent(Service::call(&mut self.client, request)),
            Err(error) => ResponseFuture::invalid(error),
        }
    }
}

/// Converts a response of a stack built on [`ReqwestService`] back into a
/// `reqwest::Response`, keeping its URL, headers and extensions. The body
/// (a [`ResponseBody`](crate::ResponseBody) behind a breaker) is wrapped
/// with `reqwest::Body::wrap`, so a deferred classification still sees the
/// end of the stream.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::reqwest::into_reqwest_response;
///
/// let response = http::Response::builder().status(201).body(String::from("{}")).unwrap();
/// let response = into_reqwest_response(response);
/// assert_eq!(response.status(), 201);
/// ```
pub fn into_reqwest_response<B>(response: http::Response<B>) -> ::reqwest::Response
where
    B: HttpBody + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    ::reqwest::Response::from(response.map(::reqwest::Body::wrap))
}

// === impl ResponseFuture ===

/// The future reqwest's client returns; it cannot be named otherwise.
type Pending = <::reqwest::Client as Service<::reqwest::Request>>::Future;

pin_project! {
    /// Response future of [`ReqwestService`].
    ///
    /// ```
    /// use tower::{Service, ServiceExt};
    /// use tower_circuit_breaker::reqwest::ReqwestService;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // Nothing listens on port 9: the future resolves to reqwest's connect error.
    /// let mut service = ReqwestService::<String>::new(reqwest::Client::new());
    /// let request = http::Request::get("http://127.0.0.1:9/").body(String::new()).unwrap();
    /// let err = service.ready().await.unwrap().call(request).await.unwrap_err();
    /// assert!(err.is_connect() || err.is_request());
    /// # }
    /// ```
    pub struct ResponseFuture {
        #[pin]
        kind: Kind,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Sent {
            #[pin]
            future: Pending,
        },
        Invalid {
            error: Option<::reqwest::Error>,
        },
    }
}

impl ResponseFuture {
    fn sent(future: Pending) -> Self {
        ResponseFuture {
            kind: Kind::Sent { future },
        }
    }

    fn invalid(error: ::reqwest::Error) -> Self {
        ResponseFuture {
            kind: Kind::Invalid { error: Some(error) },
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<::reqwest::Body>, ::reqwest::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Sent { future } => future.poll(cx).map_ok(|response| {
                let url = response.url().clone();
                let mut response = http::Response::from(response);
                keep_url(&mut response, url);
                response
            }),
            KindProj::Invalid { error } => {
                Poll::Ready(Err(error.take().expect("polled after completion")))
            }
        }
    }
}
