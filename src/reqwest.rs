//! A tower service around [`reqwest::Client`], so the
//! breaker can stand in front of it.
//!
//! reqwest has no request-level middleware hook of its own (its connector
//! layer sees connections, never a status code). [`ReqwestService`] makes a
//! `reqwest::Client` a `tower::Service` that takes an `http::Request<B>` and
//! answers an `http::Response<reqwest::Body>`, so
//! [`CircuitBreakerLayer`] wraps it like any other
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
//! [`Error`] ([`Error::inner`]) and in the [`BoxError`] that
//! [`Error::into_box`] takes it apart into, so `is_connect()` and
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
//! use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen, State};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! // A port that refuses connections.
//! let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
//! let url = format!("http://{closed}/v1/chat/completions");
//!
//! let layer = CircuitBreakerLayer::builder().consecutive_failures(2).build()?;
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

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::Body as HttpBody;
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::classify::Classify;
use crate::classify::HttpClassifier;
use crate::guard::Guard;
use crate::integrations::{keep_url, record_response};
use crate::{BoxError, Breaker, CircuitBreakerLayer, Error, Select};

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

// === ReqwestClient ===

/// A `reqwest::Client` behind a breaker, keeping reqwest's own types: a
/// `tower::Service` that takes a `reqwest::Request` and answers a
/// `reqwest::Response`, so code written against reqwest keeps its
/// builder, `json()`, `text()` and `error_for_status()`. (Where a whole
/// request is built with a `reqwest::RequestBuilder`,
/// [`RequestBuilderExt::send_through`] sends it through the same layer.)
///
/// It shares the state of the [`CircuitBreakerLayer`] it was made from: the
/// same breaker (or keyed breakers) and classifier guard a tower stack, a
/// reqwest-middleware client and this client alike. A deferred
/// classification (a streamed answer) sees the end of the body: the
/// response's body carries the call's permit. Errors are
/// [`Error`]s holding the `reqwest::Error`, or the
/// [`CircuitOpen`](crate::CircuitOpen) of a rejection; both downcast out of
/// a [`BoxError`]. Keyed breakers take their key with
/// [`keyed::from_fn`](crate::keyed::from_fn) over `&reqwest::Request`.
///
/// `CircuitBreaker<reqwest::Client>` cannot be this service: tower's
/// `CircuitBreaker` serves any inner service that answers an
/// `http::Response`, and Rust does not let a second impl cover a client
/// that answers a `reqwest::Response`.
///
/// # Example
///
/// ```
/// use tower::{Service, ServiceExt};
/// use tower_circuit_breaker::reqwest::ReqwestClient;
/// use tower_circuit_breaker::{CircuitBreakerLayer, State};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_circuit_breaker::BoxError> {
/// let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
/// let layer = CircuitBreakerLayer::builder().consecutive_failures(1).build()?;
/// let http = reqwest::Client::new();
/// let mut client = ReqwestClient::new(http.clone(), &layer);
///
/// let request = http.get(format!("http://{closed}/v1/models")).build()?;
/// let err = client.ready().await?.call(request).await.unwrap_err();
/// assert!(err.inner().is_some_and(|e| e.is::<reqwest::Error>()));
/// assert_eq!(layer.breaker().state(), State::Open);
///
/// let request = http.get(format!("http://{closed}/v1/models")).build()?;
/// let err = client.execute(request).await.unwrap_err();
/// assert!(err.is_circuit_open());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ReqwestClient<C = HttpClassifier, P = Breaker> {
    client: ::reqwest::Client,
    select: P,
    classifier: C,
}

impl<C: Clone, P: Clone> ReqwestClient<C, P> {
    /// Sends with `client`, admitted by `layer`'s breaker (or keyed
    /// breakers) and judged by its classifier.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::ReqwestClient;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// let layer = CircuitBreakerLayer::builder().name("chat").build().unwrap();
    /// let client = ReqwestClient::new(reqwest::Client::new(), &layer);
    /// assert_eq!(client.breaker().name(), Some("chat"));
    /// ```
    pub fn new(client: ::reqwest::Client, layer: &CircuitBreakerLayer<C, P>) -> Self {
        ReqwestClient::with_select(client, layer.select().clone(), layer.classifier().clone())
    }
}

impl<C> ReqwestClient<C> {
    /// The breaker, for snapshots and manual control.
    ///
    /// ```
    /// # use tower_circuit_breaker::{reqwest::ReqwestClient, CircuitBreakerLayer};
    /// let layer = CircuitBreakerLayer::builder().name("chat").build().unwrap();
    /// let client = ReqwestClient::new(reqwest::Client::new(), &layer);
    /// assert!(client.breaker().ptr_eq(layer.breaker()));
    /// ```
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<C, P> ReqwestClient<C, P> {
    /// Sends with `client`, choosing a breaker per request with `select` (a
    /// [`Breaker`], or [`Keyed`](crate::keyed::Keyed) breakers) and
    /// classifying with `classifier`.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::reqwest::ReqwestClient;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let breaker = Breaker::builder().name("chat").build().unwrap();
    /// let client = ReqwestClient::with_select(reqwest::Client::new(), breaker, LlmClassifier::new());
    /// assert_eq!(client.select().name(), Some("chat"));
    /// ```
    pub const fn with_select(client: ::reqwest::Client, select: P, classifier: C) -> Self {
        ReqwestClient {
            client,
            select,
            classifier,
        }
    }

    /// What chooses the breaker for each request.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::reqwest::ReqwestClient;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// let layer = CircuitBreakerLayer::keyed(set, keyed::header("x-model"));
    /// let client = ReqwestClient::new(reqwest::Client::new(), &layer);
    /// assert!(client.select().breakers().is_empty());
    /// ```
    pub fn select(&self) -> &P {
        &self.select
    }

    /// The classifier that judges every call.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{Classify, LlmClassifier, Verdict};
    /// use tower_circuit_breaker::reqwest::ReqwestClient;
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// let client = ReqwestClient::with_select(reqwest::Client::new(), breaker, LlmClassifier::new());
    /// let verdict = client.classifier().classify_response(http::StatusCode::BAD_GATEWAY, &http::HeaderMap::new());
    /// assert!(matches!(verdict, Verdict::Done(Outcome::Failure)));
    /// ```
    pub fn classifier(&self) -> &C {
        &self.classifier
    }

    /// The client.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::ReqwestClient;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// let layer = CircuitBreakerLayer::builder().build().unwrap();
    /// let client = ReqwestClient::new(reqwest::Client::new(), &layer);
    /// // reqwest's own builder API stays at hand:
    /// let request = client.get_ref().get("http://127.0.0.1:9/v1/models").build().unwrap();
    /// assert_eq!(request.method(), http::Method::GET);
    /// ```
    pub fn get_ref(&self) -> &::reqwest::Client {
        &self.client
    }

    /// The client.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::ReqwestClient;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// let layer = CircuitBreakerLayer::builder().build().unwrap();
    /// let _plain: reqwest::Client = ReqwestClient::new(reqwest::Client::new(), &layer).into_inner();
    /// ```
    pub fn into_inner(self) -> ::reqwest::Client {
        self.client
    }

    /// Sends `request` through the breaker, like `reqwest::Client::execute`.
    ///
    /// ```
    /// # use tower_circuit_breaker::{reqwest::ReqwestClient, Breaker, classify::HttpClassifier};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_circuit_breaker::BoxError> {
    /// let breaker = Breaker::builder().build()?;
    /// breaker.force_open();
    /// let client = ReqwestClient::with_select(reqwest::Client::new(), breaker, HttpClassifier);
    /// let request = client.get_ref().get("http://127.0.0.1:9/").build()?;
    /// assert!(client.execute(request).await.unwrap_err().is_circuit_open());
    /// # Ok(()) }
    /// ```
    pub fn execute(&self, request: ::reqwest::Request) -> SendFuture<C>
    where
        C: Classify + Clone,
        C::Stream: Send + Sync + 'static,
        P: Select<::reqwest::Request>,
    {
        send(&self.select, &self.classifier, &self.client, request)
    }
}

impl<C, P> Service<::reqwest::Request> for ReqwestClient<C, P>
where
    C: Classify + Clone,
    C::Stream: Send + Sync + 'static,
    P: Select<::reqwest::Request>,
{
    type Response = ::reqwest::Response;
    type Error = Error;
    type Future = SendFuture<C>;

    #[inline]
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ::reqwest::Request) -> Self::Future {
        self.execute(request)
    }
}

fn send<C, P>(
    select: &P,
    classifier: &C,
    client: &::reqwest::Client,
    request: ::reqwest::Request,
) -> SendFuture<C>
where
    C: Classify + Clone,
    P: Select<::reqwest::Request>,
{
    match Guard::admit(select, &request) {
        Ok(guard) => SendFuture {
            kind: SendKind::Called {
                future: Service::call(&mut client.clone(), request),
                guard,
                classifier: classifier.clone(),
            },
        },
        Err(open) => SendFuture {
            kind: SendKind::Done {
                error: Some(Error::open(open)),
            },
        },
    }
}

// === RequestBuilderExt ===

/// Sends a `reqwest::RequestBuilder` through a breaker, so reqwest's API is
/// kept to the last call: `.send_through(&layer)` instead of `.send()`.
///
/// The request goes out on the builder's own client, admitted and recorded
/// by the layer's breaker (or keyed breakers) and classifier, exactly as
/// [`ReqwestClient`] would. A
/// request that fails to build is not admitted: its `reqwest::Error`
/// (`is_builder()`) comes back at once.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::reqwest::RequestBuilderExt;
/// use tower_circuit_breaker::{CircuitBreakerLayer, State};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_circuit_breaker::BoxError> {
/// let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
/// let layer = CircuitBreakerLayer::builder().name("chat").consecutive_failures(1).build()?;
/// let client = reqwest::Client::new();
///
/// let url = format!("http://{closed}/v1/chat/completions");
/// let err = client.post(&url).body("{}").send_through(&layer).await.unwrap_err();
/// assert!(!err.is_circuit_open(), "refused: a reqwest error");
/// assert_eq!(layer.breaker().state(), State::Open);
///
/// let err = client.post(&url).body("{}").send_through(&layer).await.unwrap_err();
/// assert_eq!(err.circuit_open().and_then(|o| o.key()), Some("chat"));
/// # Ok(()) }
/// ```
pub trait RequestBuilderExt: sealed::Sealed {
    /// Builds the request and sends it through `layer`'s breaker.
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::RequestBuilderExt;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = CircuitBreakerLayer::builder().name("chat").build().unwrap();
    /// layer.breaker().force_open();
    /// let err = reqwest::Client::new()
    ///     .post("http://127.0.0.1:9/v1/chat/completions")
    ///     .header("authorization", "Bearer sk-...")
    ///     .body("{}")
    ///     .send_through(&layer)
    ///     .await
    ///     .unwrap_err();
    /// assert_eq!(err.circuit_open().and_then(|open| open.key()), Some("chat"));
    /// # }
    /// ```
    fn send_through<C, P>(self, layer: &CircuitBreakerLayer<C, P>) -> SendFuture<C>
    where
        C: Classify + Clone,
        C::Stream: Send + Sync + 'static,
        P: Select<::reqwest::Request>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for ::reqwest::RequestBuilder {}
}

impl RequestBuilderExt for ::reqwest::RequestBuilder {
    fn send_through<C, P>(self, layer: &CircuitBreakerLayer<C, P>) -> SendFuture<C>
    where
        C: Classify + Clone,
        C::Stream: Send + Sync + 'static,
        P: Select<::reqwest::Request>,
    {
        match self.build_split() {
            (client, Ok(request)) => send(layer.select(), layer.classifier(), &client, request),
            (_, Err(error)) => SendFuture {
                kind: SendKind::Done {
                    error: Some(Error::from_inner(Box::new(error))),
                },
            },
        }
    }
}

// === SendFuture ===

pin_project! {
    /// Response future of [`ReqwestClient`] and
    /// [`RequestBuilderExt::send_through`].
    ///
    /// Dropping it before it completes releases the call's permit as
    /// [`Ignored`](crate::Outcome::Ignored).
    ///
    /// ```
    /// use tower_circuit_breaker::reqwest::RequestBuilderExt;
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = CircuitBreakerLayer::builder().build().unwrap();
    /// layer.breaker().force_open();
    /// // A rejected call completes at once, without a request.
    /// let err = reqwest::Client::new()
    ///     .get("http://127.0.0.1:9/v1/models")
    ///     .send_through(&layer)
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_circuit_open());
    /// # }
    /// ```
    pub struct SendFuture<C> {
        #[pin]
        kind: SendKind<C>,
    }
}

pin_project! {
    #[project = SendProj]
    enum SendKind<C> {
        Called {
            #[pin]
            future: Pending,
            guard: Guard,
            classifier: C,
        },
        Done {
            error: Option<Error>,
        },
    }
}

impl<C> fmt::Debug for SendFuture<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendFuture").finish_non_exhaustive()
    }
}

impl<C> Future for SendFuture<C>
where
    C: Classify,
    C::Stream: Send + Sync + 'static,
{
    type Output = Result<::reqwest::Response, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            SendProj::Called {
                future,
                guard,
                classifier,
            } => {
                assert!(!guard.is_finished(), "polled after completion");
                Poll::Ready(match ready!(future.poll(cx)) {
                    Ok(response) => Ok(record_response(guard, classifier, response)),
                    Err(error) => {
                        guard.on_error(classifier, &error);
                        Err(Error::from_inner(Box::new(error)))
                    }
                })
            }
            SendProj::Done { error } => {
                Poll::Ready(Err(error.take().expect("polled after completion")))
            }
        }
    }
}
