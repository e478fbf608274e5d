//! The breaker inside an [`async_openai::Client`],
//! through its `middleware` feature.
//!
//! async-openai sends every call through a tower stack of
//! `Service<HttpRequestFactory, Response = reqwest::Response>` installed with
//! `Client::with_http_service`. [`http_service`] builds that stack in one
//! line, in the order this crate recommends: async-openai's own retry layer
//! outside, the breaker inside, reqwest at the bottom. For another order or
//! other layers, use [`OpenAiCircuitBreakerLayer`] in a `ServiceBuilder`.
//!
//! # What callers see
//!
//! * An open circuit fails the call with
//!   `OpenAIError::Boxed(Box<CircuitOpen>)`: match it with
//!   `Err(OpenAIError::Boxed(e)) if e.is::<CircuitOpen>()`, or use
//!   [`circuit_open`] to get at the [`CircuitOpen`] and its
//!   [`retry_after`](CircuitOpen::retry_after).
//! * async-openai's retry (`OpenAIRetryLayer` and `SimpleRetryPolicy`) retries
//!   429s, 5xx and `OpenAIError::Reqwest` connect errors only, so it never
//!   retries a rejection: an open circuit ends the retry loop at once.
//! * A streamed chat completion passes through: the body is wrapped so the
//!   stream classifier sees it to the end. async-openai stops reading at
//!   `data: [DONE]` and drops the body; the default classifier,
//!   [`LlmClassifier`](crate::classify::LlmClassifier), records that as a
//!   success, and a stream that carries an `event: error` (overloaded, API
//!   error) as a failure.
//!
//! # Classification
//!
//! [`LlmClassifier`](crate::classify::LlmClassifier) unless told otherwise
//! (`with_classifier`): 5xx fail, 400 content filters and other caller errors
//! are ignored, 429s are rate-limited and passed through to the retry layer.
//!
//! `OpenAIError::Reqwest` (connect, reset, timeout) goes to
//! [`Classify::classify_error`] as the `reqwest::Error`, and
//! `OpenAIError::Boxed` (say, a tower timeout inside the breaker) as the boxed
//! error. The other variants are raised on the caller's side before or
//! instead of a call (invalid arguments, unreadable files) and are
//! [`Outcome::Ignored`](crate::Outcome::Ignored).
//!
//! # Example
//!
//! ```
//! use async_openai::{config::OpenAIConfig, error::OpenAIError, Client};
//! use tower_circuit_breaker::{async_openai::http_service, Breaker, CircuitOpen};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let breaker = Breaker::builder().name("openai").build()?;
//! let config = OpenAIConfig::new().with_api_base("http://127.0.0.1:9/v1");
//! let client = Client::with_config(config)
//!     .with_http_service(http_service(reqwest::Client::new(), breaker.clone()));
//!
//! breaker.force_open();
//! let err = client.models().list().await.unwrap_err();
//! assert!(matches!(&err, OpenAIError::Boxed(e) if e.is::<CircuitOpen>()));
//! # Ok(()) }
//! ```
//!
//! [`async_openai::Client`]: https://docs.rs/async-openai/0.43/async_openai/struct.Client.html

use std::task::{Context, Poll};

use ::async_openai::error::OpenAIError;
use ::async_openai::middleware::retry::{OpenAIRetry, OpenAIRetryLayer};
use ::async_openai::middleware::{HttpRequestFactory, ReqwestService};
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{Breaker, CircuitOpen};
use crate::classify::Classify;
use crate::guard::Guard;
use crate::integrations::DefaultClassifier;
use crate::service::Select;
use crate::CircuitBreakerLayer;

/// The stack for `async_openai::Client::with_http_service`: async-openai's
/// default retry (three retries with backoff, honouring `Retry-After`)
/// around the breaker around `client`.
///
/// See the [module docs](self) for an example.
///
/// ```
/// use async_openai::{config::OpenAIConfig, Client};
/// use tower_circuit_breaker::{async_openai::http_service, Breaker};
///
/// let breaker = Breaker::builder().name("openai").consecutive_failures(5).build().unwrap();
/// let client = Client::with_config(OpenAIConfig::new())
///     .with_http_service(http_service(reqwest::Client::new(), breaker.clone()));
/// # let _ = client;
/// ```
#[must_use]
pub fn http_service(
    client: ::reqwest::Client,
    breaker: Breaker,
) -> OpenAIRetry<OpenAiCircuitBreaker<ReqwestService>> {
    OpenAIRetryLayer::default().layer(OpenAiCircuitBreaker::new(
        ReqwestService::new(client),
        breaker,
    ))
}

/// The rejection inside an async-openai error, if a circuit rejected the
/// call: this one, or one nested further in (an `OpenAiCircuitBreaker` behind
/// another, with a tower layer between them that boxed the error again).
///
/// ```
/// use async_openai::error::OpenAIError;
/// use tower_circuit_breaker::{async_openai::circuit_open, Breaker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().build().unwrap();
/// breaker.force_open();
/// let err = OpenAIError::Boxed(Box::new(breaker.admit().unwrap_err()));
/// assert!(circuit_open(&err).is_some());
/// assert!(circuit_open(&OpenAIError::InvalidArgument("model".into())).is_none());
/// # }
/// ```
#[must_use]
pub fn circuit_open(error: &OpenAIError) -> Option<&CircuitOpen> {
    crate::CircuitOpen::find(error)
}

// === impl OpenAiCircuitBreaker ===

/// A breaker for async-openai's middleware stack: a
/// `Service<HttpRequestFactory>` answering `reqwest::Response` with
/// `OpenAIError`, as `Client::with_http_service` and `OpenAIRetryLayer`
/// expect.
///
/// Like [`CircuitBreaker`](crate::CircuitBreaker), `poll_ready` only drives
/// the inner service and the decision is made in `call`.
///
/// ```
/// use async_openai::middleware::ReqwestService;
/// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
/// use tower_circuit_breaker::Breaker;
///
/// let breaker = Breaker::builder().build().unwrap();
/// let service = OpenAiCircuitBreaker::new(ReqwestService::new(reqwest::Client::new()), breaker);
/// let client = async_openai::Client::new().with_http_service(service);
/// # let _ = client;
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiCircuitBreaker<S = ReqwestService, C = DefaultClassifier, P = Breaker> {
    inner: S,
    select: P,
    classifier: C,
}

impl<S> OpenAiCircuitBreaker<S> {
    /// Wraps `inner` (usually async-openai's `ReqwestService`), classifying
    /// with [`LlmClassifier`](crate::classify::LlmClassifier).
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let breaker = Breaker::builder().name("openai").build().unwrap();
    /// let service = OpenAiCircuitBreaker::new(ReqwestService::new(reqwest::Client::new()), breaker);
    /// assert_eq!(service.breaker().name(), Some("openai"));
    /// ```
    pub fn new(inner: S, breaker: Breaker) -> Self {
        OpenAiCircuitBreaker {
            inner,
            select: breaker,
            classifier: DefaultClassifier::default(),
        }
    }
}

impl<S, C> OpenAiCircuitBreaker<S, C> {
    /// The breaker, for snapshots and manual control.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::{Breaker, State};
    ///
    /// let service = OpenAiCircuitBreaker::new(
    ///     ReqwestService::new(reqwest::Client::new()),
    ///     Breaker::builder().build().unwrap(),
    /// );
    /// service.breaker().force_open();
    /// assert_eq!(service.breaker().state(), State::ForcedOpen);
    /// ```
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<S, C, P> OpenAiCircuitBreaker<S, C, P> {
    /// Wraps `inner`, choosing a breaker per request with `select` and
    /// classifying with `classifier`.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// // One breaker, a classifier of your own:
    /// let service = OpenAiCircuitBreaker::with_classifier(
    ///     ReqwestService::new(reqwest::Client::new()),
    ///     Breaker::builder().build().unwrap(),
    ///     LlmClassifier::default(),
    /// );
    /// # let _ = service;
    /// # let _ = KeyedBreakers::builder();
    /// ```
    pub const fn with_classifier(inner: S, select: P, classifier: C) -> Self {
        OpenAiCircuitBreaker {
            inner,
            select,
            classifier,
        }
    }

    /// What chooses the breaker for each request.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// let service = OpenAiCircuitBreaker::new(ReqwestService::new(reqwest::Client::new()), breaker.clone());
    /// assert!(service.select().ptr_eq(&breaker));
    /// ```
    pub fn select(&self) -> &P {
        &self.select
    }

    /// The classifier.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::classify::{Classify, Verdict};
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// let service = OpenAiCircuitBreaker::new(
    ///     ReqwestService::new(reqwest::Client::new()),
    ///     Breaker::builder().build().unwrap(),
    /// );
    /// // The default classifier ignores a 400 (the caller's mistake, not the upstream's).
    /// let verdict = service.classifier().classify_response(http::StatusCode::BAD_REQUEST, &http::HeaderMap::new());
    /// assert!(matches!(verdict, Verdict::Done(Outcome::Ignored)));
    /// ```
    pub fn classifier(&self) -> &C {
        &self.classifier
    }

    /// A reference to the inner service.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let service = OpenAiCircuitBreaker::new(
    ///     ReqwestService::new(reqwest::Client::new()),
    ///     Breaker::builder().build().unwrap(),
    /// );
    /// let _inner: &ReqwestService = service.get_ref();
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let mut service = OpenAiCircuitBreaker::new(
    ///     ReqwestService::new(reqwest::Client::new()),
    ///     Breaker::builder().build().unwrap(),
    /// );
    /// *service.get_mut() = ReqwestService::new(reqwest::Client::new());
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    ///
    /// ```
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreaker;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let service = OpenAiCircuitBreaker::new(
    ///     ReqwestService::new(reqwest::Client::new()),
    ///     Breaker::builder().build().unwrap(),
    /// );
    /// let _unwrapped: ReqwestService = service.into_inner();
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, C, P> Service<HttpRequestFactory> for OpenAiCircuitBreaker<S, C, P>
where
    S: Service<HttpRequestFactory, Response = ::reqwest::Response>,
    S::Error: Into<OpenAIError>,
    C: Classify + Clone,
    C::Stream: Send + Sync + 'static,
    P: Select<HttpRequestFactory>,
{
    type Response = ::reqwest::Response;
    type Error = OpenAIError;
    type Future = ResponseFuture<S::Future, C>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: HttpRequestFactory) -> Self::Future {
        match Guard::admit(&self.select, &request) {
            Ok(guard) => {
                ResponseFuture::called(self.inner.call(request), guard, self.classifier.clone())
            }
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}

// === impl OpenAiCircuitBreakerLayer ===

/// Applies [`OpenAiCircuitBreaker`] to an async-openai HTTP service.
///
/// Build it from a [`CircuitBreakerLayer`] to share that layer's breaker and
/// classifier, or from a [`Breaker`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use async_openai::middleware::{retry::OpenAIRetryLayer, ReqwestService};
/// use tower::ServiceBuilder;
/// use tower_circuit_breaker::async_openai::OpenAiCircuitBreakerLayer;
/// use tower_circuit_breaker::Breaker;
///
/// let breaker = Breaker::builder().build().unwrap();
/// let service = ServiceBuilder::new()
///     .layer(OpenAIRetryLayer::new(2))
///     .layer(OpenAiCircuitBreakerLayer::new(breaker))
///     .service(ReqwestService::new(reqwest::Client::new()));
/// let client = async_openai::Client::new().with_http_service(service);
/// # let _ = client;
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiCircuitBreakerLayer<C = DefaultClassifier, P = Breaker> {
    select: P,
    classifier: C,
}

impl OpenAiCircuitBreakerLayer {
    /// A layer around `breaker`, classifying with
    /// [`LlmClassifier`](crate::classify::LlmClassifier).
    ///
    /// ```
    /// use tower::Layer;
    /// use async_openai::middleware::ReqwestService;
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreakerLayer;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let breaker = Breaker::builder().build().unwrap();
    /// let service = OpenAiCircuitBreakerLayer::new(breaker.clone())
    ///     .layer(ReqwestService::new(reqwest::Client::new()));
    /// assert!(service.breaker().ptr_eq(&breaker));
    /// ```
    #[must_use]
    pub fn new(breaker: Breaker) -> Self {
        OpenAiCircuitBreakerLayer {
            select: breaker,
            classifier: DefaultClassifier::default(),
        }
    }
}

impl<C, P> OpenAiCircuitBreakerLayer<C, P> {
    /// Uses another classifier.
    ///
    /// ```
    /// use tower_circuit_breaker::async_openai::OpenAiCircuitBreakerLayer;
    /// use tower_circuit_breaker::classify::HttpClassifier;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// // Plain HTTP rules instead of the LLM ones:
    /// let layer = OpenAiCircuitBreakerLayer::new(Breaker::builder().build().unwrap())
    ///     .with_classifier(HttpClassifier);
    /// # let _ = layer;
    /// ```
    pub fn with_classifier<C2>(self, classifier: C2) -> OpenAiCircuitBreakerLayer<C2, P> {
        OpenAiCircuitBreakerLayer {
            select: self.select,
            classifier,
        }
    }
}

impl From<Breaker> for OpenAiCircuitBreakerLayer {
    fn from(breaker: Breaker) -> Self {
        OpenAiCircuitBreakerLayer::new(breaker)
    }
}

/// Shares the layer's breaker (or keyed breakers) and classifier.
impl<C: Clone, P: Clone> From<&CircuitBreakerLayer<C, P>> for OpenAiCircuitBreakerLayer<C, P> {
    fn from(layer: &CircuitBreakerLayer<C, P>) -> Self {
        OpenAiCircuitBreakerLayer {
            select: layer.select().clone(),
            classifier: layer.classifier().clone(),
        }
    }
}

impl<S, C: Clone, P: Clone> Layer<S> for OpenAiCircuitBreakerLayer<C, P> {
    type Service = OpenAiCircuitBreaker<S, C, P>;

    fn layer(&self, inner: S) -> Self::Service {
        OpenAiCircuitBreaker::with_classifier(inner, self.select.clone(), self.classifier.clone())
    }
}

// === ResponseFuture ===

/// Response future of [`OpenAiCircuitBreaker`]: the crate's one
/// [`ResponseFuture`](crate::future::ResponseFuture), answering
/// `reqwest::Response` and failing with `OpenAIError`.
///
/// Dropping it before it completes releases the call's permit as
/// [`Ignored`](crate::Outcome::Ignored).
///
/// ```
/// use async_openai::{config::OpenAIConfig, error::OpenAIError, Client};
/// use tower_circuit_breaker::{async_openai::{circuit_open, http_service}, Breaker};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // Every call of the client goes through a `ResponseFuture`; a rejected one
/// // completes at once, without a request.
/// let breaker = Breaker::builder().build().unwrap();
/// let config = OpenAIConfig::new().with_api_base("http://127.0.0.1:9/v1");
/// let client = Client::with_config(config)
///     .with_http_service(http_service(reqwest::Client::new(), breaker.clone()));
/// breaker.force_open();
/// let err: OpenAIError = client.models().list().await.unwrap_err();
/// assert!(circuit_open(&err).is_some());
/// # }
/// ```
pub type ResponseFuture<F, C> = crate::future::ResponseFuture<F, C, adapter::OpenAi>;

mod adapter {
    use ::async_openai::error::OpenAIError;

    use crate::breaker::CircuitOpen;
    use crate::classify::ErrorRef;
    use crate::future::Adapt;
    use crate::integrations::ReqwestAdapter;

    /// async-openai's types: `reqwest::Response`s in and out, `OpenAIError`.
    #[derive(Debug)]
    pub struct OpenAi;

    impl Adapt for OpenAi {
        type Refused = CircuitOpen;

        fn reject(open: CircuitOpen) -> CircuitOpen {
            open
        }
    }

    impl<E: Into<OpenAIError>> ReqwestAdapter<E> for OpenAi {
        type Error = OpenAIError;

        /// `OpenAIError::Reqwest` goes to the classifier as the
        /// `reqwest::Error`, `OpenAIError::Boxed` as the boxed error; the
        /// other variants are raised on the caller's side, before or
        /// instead of a call.
        fn error(error: E, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> OpenAIError {
            let error = error.into();
            judge(match &error {
                OpenAIError::Reqwest(e) => Some(e),
                OpenAIError::Boxed(e) => Some(&**e),
                _ => None,
            });
            error
        }

        fn refused(open: CircuitOpen) -> OpenAIError {
            OpenAIError::Boxed(Box::new(open))
        }
    }
}
