//! [`ReqwestClient`]: a breaker in front of a `reqwest::Client`, and the
//! request builder extension that sends through it.

use std::task::{Context, Poll};

use tower_service::Service;

use crate::classify::Classify;
use crate::classify::HttpClassifier;
use crate::future::ResponseFuture;
use crate::guard::Guard;
use crate::{Breaker, CircuitBreakerLayer, Error, Select};

use super::Pending;

// === ReqwestClient ===

/// A `reqwest::Client` behind a breaker, keeping reqwest's own types: a
/// `tower::Service` that takes a `reqwest::Request` and answers a
/// `reqwest::Response`, so code written against reqwest keeps its
/// builder, `json()`, `text()` and `error_for_status()`. (Where a whole
/// request is built with a `reqwest::RequestBuilder`,
/// [`RequestBuilderExt::send_through`] sends it through the same layer.)
///
/// It shares the state of the [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) it was made from: the
/// same breaker (or keyed breakers) and classifier guard a tower stack, a
/// reqwest-middleware client and this client alike. A deferred
/// classification (a streamed answer) sees the end of the body: the
/// response's body carries the call's permit. Errors are
/// [`Error`](crate::Error)s holding the `reqwest::Error`, or the
/// [`CircuitOpen`](crate::CircuitOpen) of a rejection; both downcast out of
/// a [`BoxError`](crate::BoxError). Keyed breakers take their key with
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
/// use tower_circuit_breaker::{CircuitBreakerLayer, State, TripMode};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_circuit_breaker::BoxError> {
/// let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
/// let layer = CircuitBreakerLayer::builder().trip_mode(TripMode::Open).consecutive_failures(1).build()?;
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
    /// [`Breaker`](crate::Breaker), or [`Keyed`](crate::keyed::Keyed) breakers) and
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
        Ok(guard) => SendFuture::called(
            Service::call(&mut client.clone(), request),
            guard,
            classifier.clone(),
        ),
        Err(open) => SendFuture::rejected(open),
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
/// use tower_circuit_breaker::{CircuitBreakerLayer, State, TripMode};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_circuit_breaker::BoxError> {
/// let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
/// let layer = CircuitBreakerLayer::builder().trip_mode(TripMode::Open).name("chat").consecutive_failures(1).build()?;
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
            (_, Err(error)) => SendFuture::refused(Error::from_inner(Box::new(error))),
        }
    }
}

// === SendFuture ===

/// Response future of [`ReqwestClient`] and
/// [`RequestBuilderExt::send_through`]: the crate's one
/// [`ResponseFuture`](crate::future::ResponseFuture), answering
/// `reqwest::Response` and failing with the crate's [`Error`].
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
pub type SendFuture<C> = ResponseFuture<Pending, C, adapter::Reqwest>;

mod adapter {
    use crate::breaker::CircuitOpen;
    use crate::classify::ErrorRef;
    use crate::future::Adapt;
    use crate::integrations::ReqwestAdapter;
    use crate::Error;

    /// reqwest's own types: a `reqwest::Response` in and out, the crate's
    /// [`Error`] holding the `reqwest::Error` or the rejection, or the
    /// builder's error of a request that was never sent.
    #[derive(Debug)]
    pub struct Reqwest;

    impl Adapt for Reqwest {
        type Refused = Error;

        fn reject(open: CircuitOpen) -> Error {
            Error::open(open)
        }
    }

    impl ReqwestAdapter<::reqwest::Error> for Reqwest {
        type Error = Error;

        fn error(error: ::reqwest::Error, judge: impl FnOnce(Option<ErrorRef<'_>>)) -> Error {
            judge(Some(&error));
            Error::from_inner(Box::new(error))
        }

        fn refused(refused: Error) -> Error {
            refused
        }
    }
}
