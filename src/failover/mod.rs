//! Ordered failover across upstreams, each behind its own breaker.
//!
//! [`Failover`] tries its upstreams in order. An upstream whose circuit is
//! open rejects at once without being called, and the next one is tried
//! straight away; an upstream that answers with a
//! [`Failure`](crate::Outcome::Failure) or
//! [`RateLimited`](crate::Outcome::RateLimited) outcome is followed by the next
//! one after a short random pause (50–200 ms by default), so that callers
//! failing over together do not all land on the fallback in the same
//! instant. Any other answer is returned as it is.
//!
//! A rejection by a breaker nested inside an upstream (its own keyed set, a
//! library's breaker) is skipped the same way. The caller sees a
//! [`CircuitOpen`](crate::CircuitOpen) only when every upstream rejected the
//! call. When the last upstream tried failed, its
//! answer (the 503, the timeout) is returned.
//!
//! A spent budget is not skipped: a rejection with
//! [`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded) (see
//! [`spend`](crate::spend)) is returned at once, and no later upstream is
//! tried, since each would spend on.
//!
//! A "same client, other model" fallback is one line: the same service with
//! a request rewrite, via [`Failover::fallback_with`].
//!
//! A slow start is not a failure, and does not move on by itself:
//! [`Failover::hedge`] sends a first attempt that has no response head after
//! a delay (fixed, or a percentile of that member's own recent time to first
//! byte) to the next member whose circuit admits it as well (with a
//! [`Selection`], the member it would try second), within a budget of its
//! own, and keeps the first head; with members under a first-frame deadline,
//! the first token of a stream instead; see [`Hedge`].
//!
//! Two opt-in policies change the walk. [`Failover::on_kind`] sends an
//! answer on by what went wrong, read from its body by
//! [`ReadKind`](crate::kind::ReadKind) around each member (a context-length
//! 400 to a long-context member, a refusal to another provider, a refused key
//! to the next key); [`Failover::select`] chooses the member tried first
//! among equivalent ones ([`Selection`]: a peak-EWMA of time to first byte
//! with two random choices, or the cheapest), never an open one.
//!
//! Upstreams may be keyed: a [`CircuitBreaker`](crate::CircuitBreaker) over
//! a keyed set, or a whole [`Stack::keyed`](crate::stack::Stack::keyed)
//! stack. Such an upstream is skipped for a request whose key is open in it
//! (the key it takes from the request as that upstream receives it, after
//! any rewrite), and serves the requests whose keys are closed. A
//! [`RetryPolicy`](crate::retry::RetryPolicy) around the failover that
//! [watches each upstream's set](crate::retry::RetryPolicy::watch_keyed)
//! ends its backoff as soon as the request's key is open in all of them.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Service, ServiceExt};
//! use tower_circuit_breaker::failover::Failover;
//! use tower_circuit_breaker::{Breaker, CircuitBreaker};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // One client; the model is named in the body. The big model is down.
//! let client = tower::service_fn(|req: http::Request<String>| async move {
//!     let status = if req.body().contains("big-model") { 503 } else { 200 };
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(status).body(req.into_body()).unwrap(),
//!     )
//! });
//! let big = Breaker::builder().name("big-model").consecutive_failures(3).build().unwrap();
//! let light = Breaker::builder().name("light-model").consecutive_failures(3).build().unwrap();
//!
//! let mut svc = Failover::new(CircuitBreaker::new(client.clone(), big.clone()))
//!     .fallback_with(CircuitBreaker::new(client, light), |req: &mut http::Request<String>| {
//!         *req.body_mut() = req.body().replace("big-model", "light-model")
//!     });
//!
//! for _ in 0..5 {
//!     let req = http::Request::new(r#"{"model":"big-model"}"#.to_owned());
//!     let res = svc.ready().await.unwrap().call(req).await.unwrap();
//!     assert_eq!(res.status(), 200);
//! }
//! // After three failures the big model's circuit is open: it is skipped
//! // without being called, and without a pause.
//! assert_eq!(big.snapshot().counters.admitted, 3);
//! # }
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use tower_service::Service;

use crate::breaker::Breaker;
use crate::classify::{Classify, HttpClassifier};
use crate::keyed::KeyedBreakers;
use crate::retry::AttemptError;
use crate::rng::Rng;
use crate::Fallback;

mod all_open;
mod by_kind;
mod drain;
mod future;
mod hedge;
mod latency;
mod race;
mod select;
mod then;

pub use self::all_open::{AllOpen, LastResortCircuit};
pub use self::by_kind::{FallbackTo, RuleError};
pub use self::future::ResponseFuture;
use self::hedge::Hedging;
pub use self::hedge::{Hedge, HedgeError};
pub use self::latency::Latency;
pub use self::select::{Selection, SelectionError, DEFAULT_DECAY};

use self::by_kind::Rules;

type Rewrite<Req> = Arc<dyn Fn(&mut Req) + Send + Sync>;

/// One upstream: its service and how to rewrite a request for it.
struct Route<S, Req> {
    service: S,
    rewrite: Option<Rewrite<Req>>,
}

impl<S: Clone, Req> Clone for Route<S, Req> {
    fn clone(&self) -> Self {
        Route {
            service: self.service.clone(),
            rewrite: self.rewrite.clone(),
        }
    }
}

/// Tries upstreams in order, skipping those whose circuit is open.
///
/// Each upstream is normally a [`CircuitBreaker`](crate::CircuitBreaker)
/// (with an attempt timeout inside it); any service whose error implements
/// [`AttemptError`] works, so a list of plain services gives the naive
/// "try the next one on any failure" behaviour, without skipping.
///
/// The request must be `Clone`: every upstream but the last gets a clone.
/// Readiness is awaited per attempt inside the response future (each attempt
/// is a `oneshot` on a clone of that upstream's service), so `poll_ready`
/// is always ready.
///
/// A failed, rate-limited or quota-exhausted answer (another provider's
/// quota may be fine) moves on; any other answer is returned. When the
/// classifier defers its verdict to the body, the head decides, as for
/// [`RetryPolicy`](crate::retry::RetryPolicy): a success streams to the
/// caller, and there is no failing over once its head is out.
///
/// An error answer it moves on from (a 429, or a 400, 413 or 422 a rule
/// sends on) has its body read while the next member's attempt is under
/// way, through that member's own body wrapper, so its breaker judges the
/// body (a 429 that says `insufficient_quota` opens a quota-gated circuit)
/// before the answer is dropped; at most 4 KiB, and never past the next
/// attempt's answer. That is why the response body must be an
/// [`http_body::Body`] and `Unpin` (hyper's `Incoming`, a
/// [`ResponseBody`](crate::ResponseBody) over one, `Full`, `String`). Should
/// the next attempt be rejected after all, the answer handed back lacks what
/// was read of its body.
///
/// The upstream services are shared by every call through an `Arc`, so the
/// response future is `Send` when they are `Send + Sync` (a hyper-util
/// client, a [`CircuitBreaker`](crate::CircuitBreaker) around one,
/// `tower::util::BoxCloneSyncService`).
///
/// See the [module docs](self) for an example.
///
/// ```
/// use tower::ServiceExt;
/// use tower_circuit_breaker::failover::Failover;
/// use tower_circuit_breaker::{Breaker, CircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let answer = |status: u16| {
///     tower::service_fn(move |_req: http::Request<String>| async move {
///         Ok::<_, std::convert::Infallible>(http::Response::builder().status(status).body(String::new()).unwrap())
///     })
/// };
/// let primary = Breaker::builder().build().unwrap();
/// let failover = Failover::new(CircuitBreaker::new(answer(503), primary))
///     .fallback(CircuitBreaker::new(answer(200), Breaker::builder().build().unwrap()));
/// // The primary failed: the fallback answered.
/// let res = failover.oneshot(http::Request::new(String::new())).await.unwrap();
/// assert_eq!(res.status(), 200);
/// # }
/// ```
pub struct Failover<S, Req, C = HttpClassifier> {
    routes: Arc<[Route<S, Req>]>,
    classifier: C,
    jitter: (Duration, Duration),
    rng: Rng,
    all_open: AllOpen,
    hedge: Option<Arc<Hedging>>,
    rules: Option<Arc<Rules>>,
    selection: Option<Selection>,
}

impl<S, Req> Failover<S, Req> {
    /// A failover whose first (primary) upstream is `primary`.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Failover;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// let primary = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let failover = Failover::<_, http::Request<String>>::new(CircuitBreaker::new(primary, Breaker::builder().build().unwrap()));
    /// assert_eq!(failover.len(), 1);
    /// ```
    pub fn new(primary: S) -> Self {
        Failover {
            routes: Arc::new([Route {
                service: primary,
                rewrite: None,
            }]),
            classifier: HttpClassifier,
            jitter: (Duration::from_millis(50), Duration::from_millis(200)),
            rng: Rng::random(),
            all_open: AllOpen::FailFast,
            hedge: None,
            rules: None,
            selection: None,
        }
    }
}

impl<S: Clone, Req, C> Failover<S, Req, C> {
    /// Adds an upstream, tried after those added before it.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Failover;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let breaker = || Breaker::builder().build().unwrap();
    /// let failover = Failover::<_, http::Request<String>>::new(CircuitBreaker::new(upstream.clone(), breaker()))
    ///     .fallback(CircuitBreaker::new(upstream.clone(), breaker()))
    ///     .fallback(CircuitBreaker::new(upstream, breaker()));
    /// assert_eq!(failover.len(), 3);
    /// ```
    #[must_use]
    pub fn fallback(self, service: S) -> Self {
        self.push(Route {
            service,
            rewrite: None,
        })
    }

    /// Adds an upstream that gets the request rewritten by `rewrite` first
    /// (another model on the same client, another base URL).
    ///
    /// ```
    /// use tower::ServiceExt;
    /// use tower_circuit_breaker::failover::Failover;
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // One gateway; the model is a header. A 503 for the big model sends the
    /// // request on to the small one, on the same client.
    /// let gateway = tower::service_fn(|req: http::Request<String>| async move {
    ///     let status = if req.headers()["x-model"] == "big" { 503 } else { 200 };
    ///     Ok::<_, std::convert::Infallible>(http::Response::builder().status(status).body(String::new()).unwrap())
    /// });
    /// let failover = Failover::new(CircuitBreaker::new(gateway.clone(), Breaker::builder().build().unwrap()))
    ///     .fallback_with(CircuitBreaker::new(gateway, Breaker::builder().build().unwrap()), |req: &mut http::Request<String>| {
    ///         req.headers_mut().insert("x-model", "small".parse().unwrap());
    ///     });
    /// let request = http::Request::builder().header("x-model", "big").body(String::new()).unwrap();
    /// assert_eq!(failover.oneshot(request).await.unwrap().status(), 200);
    /// # }
    /// ```
    #[must_use]
    pub fn fallback_with<F>(self, service: S, rewrite: F) -> Self
    where
        F: Fn(&mut Req) + Send + Sync + 'static,
    {
        self.push(Route {
            service,
            rewrite: Some(Arc::new(rewrite)),
        })
    }

    fn push(mut self, route: Route<S, Req>) -> Self {
        let mut routes = self.routes.to_vec();
        routes.push(route);
        if let Some(hedging) = &mut self.hedge {
            Arc::make_mut(hedging).grow(routes.len());
        }
        self.routes = routes.into();
        self
    }
}

impl<S, Req, C> Failover<S, Req, C> {
    /// Pauses a random time in `[low, high]` before each fallback that
    /// follows a failed attempt. `Duration::ZERO` twice turns the pause off.
    /// Skipping an open upstream never pauses.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Failover;
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// // Fall over at once, with no pause.
    /// let failover = Failover::<_, http::Request<String>>::new(upstream.clone())
    ///     .fallback(upstream)
    ///     .jitter(Duration::ZERO, Duration::ZERO);
    /// # let _ = failover;
    /// ```
    #[must_use]
    pub fn jitter(mut self, low: Duration, high: Duration) -> Self {
        self.jitter = (low.min(high), high);
        self
    }

    /// Seeds the jitter, for runs that must repeat exactly.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Failover;
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// // The same pauses before each fallback, run after run.
    /// let failover = Failover::<_, http::Request<String>>::new(upstream.clone()).fallback(upstream).seed(7);
    /// # let _ = failover;
    /// ```
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Rng::new(seed);
        self
    }

    /// What to do when every upstream rejected the call; see [`AllOpen`].
    ///
    /// ```
    /// use tower::ServiceExt;
    /// use tower_circuit_breaker::failover::{AllOpen, Failover};
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let (a, b) = (Breaker::builder().build().unwrap(), Breaker::builder().build().unwrap());
    /// a.force_open();
    /// b.force_open();
    /// let failover = Failover::new(CircuitBreaker::new(upstream.clone(), a))
    ///     .fallback(CircuitBreaker::new(upstream, b))
    ///     .when_all_open(AllOpen::FailFast);
    /// let err = failover.oneshot(http::Request::new(String::new())).await.unwrap_err();
    /// assert!(err.is_circuit_open());
    /// # }
    /// ```
    #[must_use]
    pub fn when_all_open(mut self, policy: AllOpen) -> Self {
        self.all_open = policy;
        self
    }

    /// Decides which answers fail over with `classifier` instead.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::failover::Failover;
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// // Decide which answers fail over by the LLM rules (a 529 "overloaded" does).
    /// let failover = Failover::<_, http::Request<String>>::new(upstream.clone()).fallback(upstream).with_classifier(LlmClassifier::default());
    /// # let _ = failover;
    /// ```
    pub fn with_classifier<C2>(self, classifier: C2) -> Failover<S, Req, C2> {
        Failover {
            routes: self.routes,
            classifier,
            jitter: self.jitter,
            rng: self.rng,
            all_open: self.all_open,
            hedge: self.hedge,
            rules: self.rules,
            selection: self.selection,
        }
    }

    /// How many upstreams there are.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Failover;
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// assert_eq!(Failover::<_, http::Request<String>>::new(upstream.clone()).fallback(upstream).len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Always `false`: there is at least the primary.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Failover;
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// assert!(!Failover::<_, http::Request<String>>::new(upstream).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl<S, Req, C: Clone> Clone for Failover<S, Req, C> {
    fn clone(&self) -> Self {
        Failover {
            routes: Arc::clone(&self.routes),
            classifier: self.classifier.clone(),
            jitter: self.jitter,
            rng: self.rng.clone(),
            all_open: self.all_open.clone(),
            hedge: self.hedge.clone(),
            rules: self.rules.clone(),
            selection: self.selection.clone(),
        }
    }
}

impl<S, Req, C> fmt::Debug for Failover<S, Req, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failover")
            .field("upstreams", &self.routes.len())
            .field("jitter", &self.jitter)
            .finish()
    }
}

impl<S, Req, C, B> Service<Req> for Failover<S, Req, C>
where
    S: Service<Req, Response = Response<B>> + Clone,
    B: http_body::Body + Unpin,
    S::Error: AttemptError,
    Req: Clone + Fallback,
    C: Classify + Clone,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Req, C>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let last_resort = match &self.all_open {
            AllOpen::LastResort(breakers) => Some(Arc::clone(breakers)),
            AllOpen::FailFast => None,
        };
        ResponseFuture::new(
            Arc::clone(&self.routes),
            request,
            last_resort,
            self.classifier.clone(),
            self.jitter,
            self.rng.clone(),
            (
                self.hedge.clone(),
                self.rules.clone(),
                self.selection.clone(),
            ),
        )
    }
}
