//! The whole client stack in the order that works: total timeout → retry →
//! circuit breaker → attempt timeout → client.
//!
//! Each piece has its place for a reason:
//!
//! - the **retry** sits outside the breaker, so every attempt is admitted and
//!   recorded, and an open circuit ends the retry loop at once (the retry
//!   [watches the breaker](crate::retry::RetryPolicy::watch_breaker), so
//!   not even a backoff sleep is spent on an upstream known to be down);
//! - the **attempt timeout** sits inside the breaker, so a hanging call is a
//!   recorded failure;
//! - the optional **total timeout** sits outermost and bounds what the
//!   caller waits, retries included.
//!
//! [`StackBuilder::build`] refuses pieces that do not fit, with
//! [`StackError::Misfit`]: a total timeout shorter than one attempt, a time
//! window shorter than two attempt timeouts, a slow-call threshold the
//! attempt timeout never lets a call reach, a probe timeout longer than the
//! attempt timeout (the default one is capped there), a probe lease that
//! expires before the attempt timeout, a stall or first-frame deadline
//! longer than the total timeout, a `Retry-After` cap the total timeout
//! would cut short.
//!
//! [`Stack::keyed`] builds the same stack over a keyed set, one breaker per
//! key (a model, a region, a hashed API key): the layers and their order are
//! the same, every key's settings are checked as one breaker's are, and the
//! retry watches the request's own key, so a request whose model's circuit
//! opens stops retrying at once while requests for other models retry as
//! before. A keyed stack is a [`Failover`](crate::failover::Failover)
//! member like any other: a request whose key is open in it skips it.
//!
//! With [`StackBuilder::health_probe`], the stack also recovers with no code
//! of yours: given a health request (a one-token completion, Anthropic's
//! Messages, `GET /v1/models`, or a function of the key), each service
//! the layer makes hands back its [health prober](crate::health) as a future
//! ([`Stack::health_prober`]), to run in a task of yours or
//! [spawn on a runtime](crate::health::HealthProber::spawn_on). The crate
//! starts no task itself, so building a stack outside a runtime loses
//! nothing: the prober runs where it is spawned.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Layer, Service, ServiceExt};
//! use tower_circuit_breaker::retry::RetryPolicy;
//! use tower_circuit_breaker::stack::{Stack, StackError};
//! use tower_circuit_breaker::{Breaker, BoxError, CircuitOpen, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(503).body(String::new()).unwrap(),
//!     )
//! });
//!
//! // Defaults: attempt 60 s, a window of 20 calls, 50 %, open 30 s,
//! // 3 probes, 2 to close, 3 retries. All or nothing here; left at the
//! // default, a call without a fallback is graded instead (see `TripMode`).
//! let layer = Stack::builder()
//!     .breaker(Breaker::builder().trip_mode(TripMode::Open).count_window(10).min_calls(3))
//!     .retry(RetryPolicy::new().max_retries(3))
//!     .build()?;
//! let breaker = layer.breaker().clone();
//! let mut client = layer.layer(upstream);
//!
//! // Three failed attempts open the circuit: the first retry that meets the
//! // open circuit is rejected without reaching the upstream, and the loop
//! // ends there.
//! let err = client.ready().await?.call(http::Request::new(String::new())).await.unwrap_err();
//! assert!(CircuitOpen::find(&*err).is_some());
//! assert_eq!(breaker.snapshot().counters.failures, 3);
//! assert_eq!(breaker.snapshot().counters.rejected, 1);
//!
//! // Pieces that do not fit are refused.
//! let err = Stack::builder()
//!     .attempt_timeout(Duration::from_secs(60))
//!     .total_timeout(Duration::from_secs(30))
//!     .build()
//!     .unwrap_err();
//! assert!(matches!(err, StackError::Misfit(_)));
//! # Ok(()) }
//! ```
//!
//! Keyed by model:
//!
//! ```
//! use tower::{Layer, Service, ServiceExt};
//! use tower_circuit_breaker::keyed::{self, KeyedBreakers};
//! use tower_circuit_breaker::stack::Stack;
//! use tower_circuit_breaker::{BoxError, CircuitOpen, State, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // The big model is down; the small one is fine.
//! let upstream = tower::service_fn(|req: http::Request<String>| async move {
//!     let status = if req.headers()["x-model"] == "big" { 503 } else { 200 };
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(status).body(String::new()).unwrap(),
//!     )
//! });
//! let layer = Stack::keyed(KeyedBreakers::builder().trip_mode(TripMode::Open).consecutive_failures(2), keyed::header("x-model"))
//!     .max_retries(3)
//!     .build()?;
//! let models = layer.breakers().clone();
//! let mut client = layer.layer(upstream);
//! let call = |model: &str| http::Request::get("/").header("x-model", model).body(String::new());
//!
//! let err = client.ready().await?.call(call("big")?).await.unwrap_err();
//! assert!(CircuitOpen::find(&*err).is_some());
//! assert_eq!(models.get("big").unwrap().state(), State::Open);
//! let res = client.ready().await?.call(call("small")?).await?;
//! assert_eq!(res.status(), 200);
//! # Ok(()) }
//! ```

mod builder;
mod error;
mod select;

pub use self::builder::StackBuilder;
pub use self::error::StackError;
pub use self::select::{StackDeadlines, StackSelect};

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;

use tower::retry::Retry;
use tower::timeout::Timeout;
use tower::util::{Either, MapErr};
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{Breaker, Builder};
use crate::classify::{Classify, HttpClassifier};
use crate::health::{HealthProbeBuilder, HealthProber, MakeHealthRequest};
use crate::keyed::{Keyed, KeyedBreakers};
use crate::retry::RetryPolicy;
use crate::{BoxError, CircuitBreaker, Error};

/// The retry and everything inside it.
type Retried<S, C, D, P> =
    Retry<RetryPolicy<C, <P as StackSelect>::Watch>, CircuitBreaker<Timeout<S>, C, P, D>>;

/// With or without a total timeout, the error is a [`BoxError`].
type Outer<S, C, D, P> =
    Either<Timeout<Retried<S, C, D, P>>, MapErr<Retried<S, C, D, P>, fn(Error) -> BoxError>>;

/// Wraps a client in the whole stack; built by [`StackBuilder`].
///
/// Every service it makes shares its one breaker (or its one keyed set).
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_circuit_breaker::stack::Stack;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let layer = Stack::builder().max_retries(1).build().unwrap();
/// let client = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// // Every service the layer makes shares its one breaker.
/// let (a, b) = (layer.layer(client.clone()), layer.layer(client));
/// assert!(a.breaker().ptr_eq(b.breaker()));
/// assert_eq!(a.oneshot(http::Request::new(String::new())).await.unwrap().status(), 200);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct StackLayer<C = HttpClassifier, D = (), P: StackSelect = Breaker> {
    attempt_timeout: Duration,
    total_timeout: Option<Duration>,
    select: P,
    classifier: C,
    retry: RetryPolicy<C, P::Watch>,
    deadlines: D,
    health: Option<Arc<HealthSpec>>,
}

/// A stack's health prober settings and request, checked by `build()`.
#[derive(Clone)]
pub(crate) struct HealthSpec {
    pub(crate) probe: HealthProbeBuilder,
    pub(crate) request: Arc<dyn MakeHealthRequest>,
}

impl fmt::Debug for HealthSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The request carries credentials: never shown.
        f.debug_struct("HealthSpec")
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

/// What a stack's service keeps to make its health prober: the settings,
/// the client it wraps (probes go to it directly) and the classifier.
#[derive(Clone)]
struct StackHealth<S, C> {
    spec: Arc<HealthSpec>,
    client: S,
    classifier: C,
}

impl<S, C> fmt::Debug for StackHealth<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.spec, f)
    }
}

impl<C, D> StackLayer<C, D> {
    /// The shared breaker, for snapshots and manual control.
    ///
    /// ```
    /// use tower_circuit_breaker::stack::Stack;
    /// use tower_circuit_breaker::State;
    ///
    /// let layer = Stack::builder().build().unwrap();
    /// assert_eq!(layer.breaker().state(), State::Closed);
    /// layer.breaker().force_open(); // an operator's switch
    /// assert_eq!(layer.breaker().state(), State::ForcedOpen);
    /// ```
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<C, D, K: Clone + fmt::Debug> StackLayer<C, D, Keyed<K>> {
    /// The keyed set, for snapshots, manual control, a
    /// [status page](crate::status) or a [health prober](crate::health).
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::keyed(KeyedBreakers::builder(), keyed::header("x-model")).build().unwrap();
    /// assert!(layer.breakers().is_empty(), "keys come with requests");
    /// ```
    pub fn breakers(&self) -> &KeyedBreakers {
        self.select.breakers()
    }
}

impl<C, D, P: StackSelect> StackLayer<C, D, P> {
    /// The attempt timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::builder().attempt_timeout(Duration::from_secs(30)).build().unwrap();
    /// assert_eq!(layer.attempt_timeout(), Duration::from_secs(30));
    /// ```
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The total timeout, if there is one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::builder()
    ///     .attempt_timeout(Duration::from_secs(30))
    ///     .total_timeout(Duration::from_secs(90))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(layer.total_timeout(), Some(Duration::from_secs(90)));
    /// ```
    pub fn total_timeout(&self) -> Option<Duration> {
        self.total_timeout
    }
}

impl<S: Clone, C: Clone, D: Clone, P: StackSelect> Layer<S> for StackLayer<C, D, P> {
    type Service = Stack<S, C, D, P>;

    fn layer(&self, client: S) -> Stack<S, C, D, P> {
        let health = self.health.as_ref().map(|spec| StackHealth {
            spec: Arc::clone(spec),
            client: client.clone(),
            classifier: self.classifier.clone(),
        });
        let attempt = Timeout::new(client, self.attempt_timeout);
        let breaker = CircuitBreaker::from_parts(
            attempt,
            self.select.clone(),
            self.classifier.clone(),
            self.deadlines.clone(),
        );
        let retried = Retry::new(self.retry.clone(), breaker);
        let inner = match self.total_timeout {
            Some(total) => Either::Left(Timeout::new(retried, total)),
            None => Either::Right(MapErr::new(
                retried,
                BoxError::from as fn(Error) -> BoxError,
            )),
        };
        Stack {
            inner,
            select: self.select.clone(),
            health,
        }
    }
}

/// A client wrapped in total timeout → retry → circuit breaker → attempt
/// timeout; made by [`StackLayer`].
///
/// Its error is a [`BoxError`]: a [`CircuitOpen`](crate::CircuitOpen), a
/// `tower::timeout::error::Elapsed` (the attempt or the total timeout), or
/// the client's own error. Boxing is the one allocation a rejection costs
/// here (tower's timeout and retry speak `BoxError`); the bare
/// [`CircuitBreaker`] rejects without allocating.
///
/// The retry clones each request, so the request must be `Clone`
/// (`http::Request<String>`, `http::Request<Full<Bytes>>`): passed where a
/// `Service` of a request that is not, the compiler says
/// ``the trait `Clone` is not implemented for `http::Request<…>` `` and that
/// it is required for `Stack<…>` to implement `Service`; a method call such as
/// `stack.oneshot(request)` says only that `Stack<…>: Service<_>` is not
/// satisfied. For bodies that cannot be cloned (a stream being uploaded), use
/// [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) without a retry.
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_circuit_breaker::stack::Stack;
/// use tower_circuit_breaker::{BoxError, CircuitOpen};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let layer = Stack::builder().build().unwrap();
/// let client = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let stack = layer.layer(client);
/// stack.breaker().force_open();
/// let err: BoxError = stack.oneshot(http::Request::new(String::new())).await.unwrap_err();
/// assert!(CircuitOpen::find(&*err).is_some());
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Stack<S, C = HttpClassifier, D = (), P: StackSelect = Breaker> {
    inner: Outer<S, C, D, P>,
    select: P,
    health: Option<StackHealth<S, C>>,
}

impl Stack<(), HttpClassifier> {
    /// A builder with the defaults.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::builder()
    ///     .attempt_timeout(Duration::from_secs(60))
    ///     .max_retries(2)
    ///     .classifier(LlmClassifier::default())
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn builder() -> StackBuilder {
        StackBuilder::new()
    }

    /// A builder with the defaults and a breaker per key: shorthand for
    /// [`Stack::builder().keyed(breakers, key)`](StackBuilder::keyed).
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::keyed(KeyedBreakers::builder(), keyed::header("x-model"))
    ///     .max_retries(2)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn keyed<K>(
        breakers: Builder<KeyedBreakers>,
        key: K,
    ) -> StackBuilder<HttpClassifier, (), Keyed<K>>
    where
        Keyed<K>: StackSelect<Spec = (crate::keyed::KeyedSettings, K)>,
    {
        StackBuilder::new().keyed(breakers, key)
    }
}

impl<S, C, D> Stack<S, C, D> {
    /// The breaker, for snapshots and manual control.
    ///
    /// ```
    /// use tower::Layer;
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::builder().build().unwrap();
    /// let client = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let stack = layer.layer(client);
    /// assert!(stack.breaker().ptr_eq(layer.breaker()));
    /// ```
    pub fn breaker(&self) -> &Breaker {
        &self.select
    }
}

impl<S, C, D, K: Clone + fmt::Debug> Stack<S, C, D, Keyed<K>> {
    /// The keyed set, for snapshots and manual control.
    ///
    /// ```
    /// use tower::Layer;
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::stack::Stack;
    ///
    /// let layer = Stack::keyed(KeyedBreakers::builder(), keyed::header("x-model")).build().unwrap();
    /// let client = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let stack = layer.layer(client);
    /// assert!(stack.breakers().is_empty());
    /// ```
    pub fn breakers(&self) -> &KeyedBreakers {
        self.select.breakers()
    }
}

impl<S, C, D, P: StackSelect> Stack<S, C, D, P> {
    /// The health prober, for a stack built with
    /// [`health_probe`](StackBuilder::health_probe); `None` for one built
    /// without. A future that probes this stack's breaker (a keyed stack:
    /// every key whose circuit is not closed) through the client the stack
    /// wraps, for as long as it runs: the crate spawns nothing, so run it
    /// in a task of yours or [spawn it on a runtime](HealthProber::spawn_on).
    /// Every service a layer makes, and every clone, shares one breaker:
    /// one prober for all of them is enough.
    ///
    /// The stack's requests must have a body that a [`Bytes`] converts
    /// into (`Full<Bytes>`, `reqwest::Body`, `Bytes`), which the health
    /// request's body becomes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower::{Layer, Service, ServiceExt};
    /// use tower_circuit_breaker::health::HealthProbe;
    /// use tower_circuit_breaker::stack::Stack;
    /// use tower_circuit_breaker::{Breaker, BoxError, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), BoxError> {
    /// // Answers 503 to users and 200 to the health request.
    /// let upstream = tower::service_fn(|req: http::Request<Bytes>| async move {
    ///     let status = if req.uri().path() == "/health" { 200 } else { 503 };
    ///     Ok::<_, BoxError>(http::Response::builder().status(status).body(String::new())?)
    /// });
    /// let layer = Stack::builder()
    ///     .breaker(Breaker::builder().trip_mode(TripMode::Open).consecutive_failures(1).jitter(0.0))
    ///     .max_retries(0)
    ///     .health_probe(
    ///         HealthProbe::builder(Duration::from_secs(1)).jitter(0.0),
    ///         http::Request::get("http://upstream/health").body(Bytes::new())?,
    ///     )
    ///     .build()?;
    /// let mut client = layer.layer(upstream);
    /// tokio::spawn(client.health_prober().expect("built with a health request"));
    ///
    /// let _ = client.ready().await?.call(http::Request::new(Bytes::new())).await;
    /// assert_eq!(client.breaker().state(), State::Open);
    /// tokio::time::sleep(Duration::from_millis(1_500)).await;
    /// assert_eq!(client.breaker().state(), State::HalfOpen, "the probe found it healthy");
    /// # Ok(()) }
    /// ```
    ///
    /// [`Bytes`]: https://docs.rs/bytes/1/bytes/struct.Bytes.html
    pub fn health_prober<B, RB>(&self) -> Option<HealthProber>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
        S::Future: Send,
        S::Error: Into<crate::BoxError>,
        B: From<Bytes> + Send + 'static,
        RB: Body + Send + 'static,
        RB::Data: Send,
        C: Classify + Clone + Send + Sync + 'static,
        C::Stream: Send,
    {
        let health = self.health.as_ref()?;
        let request = Arc::clone(&health.spec.request);
        let probe = health
            .spec
            .probe
            .clone()
            .build(
                health.client.clone(),
                health.classifier.clone(),
                move |breaker: &Breaker| request.make(breaker).map(B::from),
            )
            .ok()?;
        Some(match self.select.probed() {
            (Some(breaker), _) => HealthProber::new(probe.run(breaker)),
            (None, Some(set)) => HealthProber::new(probe.run_keyed(set)),
            (None, None) => return None,
        })
    }
}

impl<S, C, D, P, Req> Service<Req> for Stack<S, C, D, P>
where
    P: StackSelect,
    // Said here, not only deep in the retry, so that a compile error names it.
    Req: Clone,
    Outer<S, C, D, P>: Service<Req, Error = BoxError>,
{
    type Response = <Outer<S, C, D, P> as Service<Req>>::Response;
    type Error = BoxError;
    type Future = <Outer<S, C, D, P> as Service<Req>>::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        self.inner.call(request)
    }
}
