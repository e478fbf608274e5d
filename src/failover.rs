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
//! A "same client, other model" fallback is one line: the same service with
//! a request rewrite, via [`Failover::fallback_with`].
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
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::util::{Oneshot, ServiceExt};
use tower_service::Service;

use crate::classify::{Classify, HttpClassifier};
use crate::guard::{self, Judged};
use crate::retry::AttemptError;
use crate::rng::Rng;
use crate::Outcome;

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
/// The upstream services are shared by every call through an `Arc`, so the
/// response future is `Send` when they are `Send + Sync` (a hyper-util
/// client, a [`CircuitBreaker`](crate::CircuitBreaker) around one,
/// `tower::util::BoxCloneSyncService`).
///
/// See the [module docs](self) for an example.
pub struct Failover<S, Req, C = HttpClassifier> {
    routes: Arc<[Route<S, Req>]>,
    classifier: C,
    jitter: (Duration, Duration),
    rng: Rng,
}

impl<S, Req> Failover<S, Req> {
    /// A failover whose first (primary) upstream is `primary`.
    pub fn new(primary: S) -> Self {
        Failover {
            routes: Arc::new([Route {
                service: primary,
                rewrite: None,
            }]),
            classifier: HttpClassifier,
            jitter: (Duration::from_millis(50), Duration::from_millis(200)),
            rng: Rng::random(),
        }
    }
}

impl<S: Clone, Req, C> Failover<S, Req, C> {
    /// Adds an upstream, tried after those added before it.
    pub fn fallback(self, service: S) -> Self {
        self.push(Route {
            service,
            rewrite: None,
        })
    }

    /// Adds an upstream that gets the request rewritten by `rewrite` first
    /// (another model on the same client, another base URL).
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
        self.routes = routes.into();
        self
    }
}

impl<S, Req, C> Failover<S, Req, C> {
    /// Pauses a random time in `[low, high]` before each fallback that
    /// follows a failed attempt. `Duration::ZERO` twice turns the pause off.
    /// Skipping an open upstream never pauses.
    pub fn jitter(mut self, low: Duration, high: Duration) -> Self {
        self.jitter = (low.min(high), high);
        self
    }

    /// Seeds the jitter, for runs that must repeat exactly.
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Rng::new(seed);
        self
    }

    /// Decides which answers fail over with `classifier` instead.
    pub fn with_classifier<C2>(self, classifier: C2) -> Failover<S, Req, C2> {
        Failover {
            routes: self.routes,
            classifier,
            jitter: self.jitter,
            rng: self.rng,
        }
    }

    /// How many upstreams there are.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Always `false`: there is at least the primary.
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
    S::Error: AttemptError,
    Req: Clone,
    C: Classify + Clone,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Req, C>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        ResponseFuture {
            routes: Arc::clone(&self.routes),
            request: Some(request),
            next: 0,
            classifier: self.classifier.clone(),
            jitter: self.jitter,
            rng: self.rng.clone(),
            last: None,
            rejected: None,
            state: Step::Start,
        }
    }
}

// === ResponseFuture ===

pin_project! {
    /// Response future of [`Failover`].
    pub struct ResponseFuture<S, Req, C>
    where
        S: Service<Req>,
    {
        routes: Arc<[Route<S, Req>]>,
        // The request as the caller sent it; the last upstream takes it.
        request: Option<Req>,
        next: usize,
        classifier: C,
        jitter: (Duration, Duration),
        rng: Rng,
        // The answer of the last upstream that was actually called.
        last: Option<Result<S::Response, S::Error>>,
        // The last rejection by an open circuit.
        rejected: Option<S::Error>,
        #[pin]
        state: Step<Oneshot<S, Req>>,
    }
}

pin_project! {
    #[project = StepProj]
    enum Step<F> {
        Start,
        Pausing {
            #[pin]
            sleep: Sleep,
        },
        Calling {
            #[pin]
            future: F,
        },
    }
}

impl<S, Req, C> fmt::Debug for ResponseFuture<S, Req, C>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("next", &self.next)
            .field("upstreams", &self.routes.len())
            .finish_non_exhaustive()
    }
}

/// What to do after an attempt.
enum Then {
    /// Return this answer.
    Return,
    /// The circuit was open: try the next upstream at once.
    Skip,
    /// The upstream failed: pause, then try the next one.
    Fallback,
}

impl<S, Req, C, B> Future for ResponseFuture<S, Req, C>
where
    S: Service<Req, Response = Response<B>> + Clone,
    S::Error: AttemptError,
    Req: Clone,
    C: Classify,
{
    type Output = Result<Response<B>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StepProj::Start => {
                    let i = *this.next;
                    *this.next += 1;
                    let route = &this.routes[i];
                    let mut request = if *this.next == this.routes.len() {
                        this.request.take()
                    } else {
                        this.request.clone()
                    }
                    .expect("polled after completion");
                    if let Some(rewrite) = &route.rewrite {
                        rewrite(&mut request);
                    }
                    let future = route.service.clone().oneshot(request);
                    this.state.set(Step::Calling { future });
                }
                StepProj::Pausing { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(Step::Start);
                }
                StepProj::Calling { future } => {
                    let result = ready!(future.poll(cx));
                    let then = match guard::judge(&*this.classifier, &result) {
                        Judged::Said(outcome) => then(outcome),
                        Judged::Rejected => Then::Skip,
                        Judged::Opaque => Then::Return,
                    };
                    let pause = match then {
                        Then::Return => return Poll::Ready(result),
                        Then::Skip => {
                            *this.rejected = result.err();
                            false
                        }
                        Then::Fallback => {
                            *this.last = Some(result);
                            true
                        }
                    };
                    if *this.next == this.routes.len() {
                        let answer = match this.last.take() {
                            Some(last) => last,
                            None => Err(this.rejected.take().expect("an attempt was made")),
                        };
                        return Poll::Ready(answer);
                    }
                    let (low, high) = *this.jitter;
                    if pause && !high.is_zero() {
                        let sleep = tokio::time::sleep(this.rng.between(low, high));
                        this.state.set(Step::Pausing { sleep });
                    } else {
                        this.state.set(Step::Start);
                    }
                }
            }
        }
    }
}

fn then(outcome: Outcome) -> Then {
    match outcome {
        Outcome::Failure | Outcome::RateLimited { .. } | Outcome::QuotaExhausted => Then::Fallback,
        _ => Then::Return,
    }
}
