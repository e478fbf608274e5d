//! A [`tower::retry::Policy`] that understands outcomes and listens to the
//! breaker.
//!
//! [`RetryPolicy`] retries what the upstream's health explains — a
//! [`Failure`](Outcome::Failure) or a [`RateLimited`](Outcome::RateLimited)
//! answer — and nothing else: never a bad request, never a
//! [`CircuitOpen`](crate::CircuitOpen) rejection (a graded admission's
//! refusal included, unless [`RetryPolicy::retry_graded`] says otherwise). Backoff is exponential with full jitter, and a
//! `Retry-After` under a cap is waited out exactly.
//!
//! A retry layer kept apart from its breaker has one known weakness: a call
//! sleeping out its backoff does not learn that the circuit opened meanwhile,
//! and sleeps on only to be rejected. [`RetryPolicy::watch_breaker`] closes
//! that gap: the backoff races [`Breaker::changed`], and when the circuit is
//! open the wait ends at once. The next attempt is then rejected by the
//! breaker without touching the upstream, and that rejection is what the
//! caller sees.
//!
//! Put the retry *outside* the breaker, so that every attempt is admitted and
//! recorded (see [`stack`](crate::stack) for the whole order). Every retry
//! it sends carries the [`Retried`](crate::Retried) mark, so a
//! [`Failover`](crate::failover::Failover) below never hedges it.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{retry::RetryLayer, Service, ServiceBuilder, ServiceExt};
//! use tower_circuit_breaker::retry::RetryPolicy;
//! use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, CircuitOpen, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::convert::Infallible>(
//!         http::Response::builder().status(503).body(String::new()).unwrap(),
//!     )
//! });
//! let breaker = CircuitBreakerLayer::builder().trip_mode(TripMode::Open).consecutive_failures(2).build()?;
//! let policy = RetryPolicy::new()
//!     .max_retries(5)
//!     .backoff(Duration::from_millis(100), Duration::from_secs(2))
//!     .seed(7)
//!     .watch_breaker(breaker.breaker().clone());
//!
//! let mut client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(policy))
//!     .layer(breaker)
//!     .timeout(Duration::from_secs(60))
//!     .service(upstream);
//!
//! // Two failures open the circuit; the third attempt is rejected without
//! // reaching the upstream, and the retry loop ends there.
//! let err = client.ready().await?.call(http::Request::new(String::new())).await.unwrap_err();
//! assert!(err.is_circuit_open());
//! # Ok(()) }
//! ```
//!
//! [`tower::retry::Policy`]: https://docs.rs/tower/0.5/tower/retry/trait.Policy.html

mod backoff;
mod budget;
mod watch;

pub use self::backoff::Backoff;
pub use self::budget::{RetryBudget, RetryBudgetError};
pub use self::watch::{KeyedWatch, Watch};
pub use crate::guard::AttemptError;

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower::retry::Policy;

use crate::breaker::Breaker;
use crate::classify::{Classify, HttpClassifier};
use crate::guard::{self, Judged};
use crate::keyed::{Keyed, KeyedBreakers};
use crate::rng::Rng;
use crate::{Fallback, Outcome, Rejection};

// === RetryPolicy ===

/// Retries failed and rate-limited attempts, with exponential backoff and
/// full jitter, and stops as soon as the watched breaker opens.
///
/// | what the attempt said | what the policy does |
/// |---|---|
/// | [`Failure`](Outcome::Failure) (5xx, timeout, connection error) | waits a random time in `[0, min(max, base × 2ⁿ))`, then retries |
/// | [`RateLimited`](Outcome::RateLimited) with `Retry-After` ≤ the cap | waits exactly `Retry-After`, then retries |
/// | [`RateLimited`](Outcome::RateLimited) with `Retry-After` > the cap | gives up: the 429 goes to the caller, who can read the header |
/// | [`RateLimited`](Outcome::RateLimited) without `Retry-After` | backs off as for a failure |
/// | [`Success`](Outcome::Success), [`Ignored`](Outcome::Ignored), [`QuotaExhausted`](Outcome::QuotaExhausted) | returns the answer |
/// | a [`CircuitOpen`](crate::CircuitOpen) rejection, by this breaker or one nested inside the service | returns it: never retried |
///
/// When the classifier defers its verdict to the body (an
/// [`LlmClassifier`](crate::classify::LlmClassifier) reading a stream or a 429's error body), the policy
/// decides on the head: a success is returned (its body is on its way to
/// the caller); 429 and 409 are rate-limited, with the wait read as
/// [`LlmClassifier::retry_after`](crate::classify::LlmClassifier::retry_after) reads it; 402 is a quota; 5xx a failure;
/// other statuses are returned.
///
/// At most [`max_retries`](Self::max_retries) retries follow the first
/// attempt, and with a [`budget`](Self::budget) only as many as it holds. Defaults: 3 retries, base 500 ms, cap 10 s, `Retry-After` cap
/// 20 s, no breaker watched, a random jitter seed.
///
/// Requests are cloned for each retry, so the request type must be `Clone`
/// (`http::Request<String>`, `http::Request<Full<Bytes>>`). With no retries
/// configured, nothing is cloned.
///
/// `tower::retry::Retry` clones the policy for every request: the retry count
/// lives in that clone, while the jitter generator is shared by all clones,
/// so concurrent requests draw different waits (and, seeded, the same
/// sequence every run).
///
/// See the [module docs](self) for an example.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use tower::{retry::RetryLayer, ServiceBuilder, ServiceExt};
/// use tower_circuit_breaker::retry::RetryPolicy;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let calls = Arc::new(AtomicU32::new(0));
/// let seen = calls.clone();
/// // A 400 says nothing about the upstream: it is returned, never retried.
/// let upstream = tower::service_fn(move |_req: http::Request<String>| {
///     seen.fetch_add(1, Ordering::SeqCst);
///     async { Ok::<_, std::convert::Infallible>(http::Response::builder().status(400).body(String::new()).unwrap()) }
/// });
/// let client = ServiceBuilder::new().layer(RetryLayer::new(RetryPolicy::new())).service(upstream);
/// let res = client.oneshot(http::Request::new(String::new())).await.unwrap();
/// assert_eq!(res.status(), 400);
/// assert_eq!(calls.load(Ordering::SeqCst), 1);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RetryPolicy<C = HttpClassifier, W = ()> {
    classifier: C,
    max_retries: u32,
    base: Duration,
    max: Duration,
    retry_after_cap: Duration,
    watch: Arc<[Breaker]>,
    /// The request's own key in keyed sets (`()`: none).
    keyed: W,
    rng: Rng,
    budget: Option<RetryBudget>,
    /// Whether a graded admission's rejection is retried.
    retry_graded: bool,
    /// Retries made so far for the request this clone serves.
    retries: u32,
}

impl RetryPolicy {
    /// A policy with the defaults, classifying with [`HttpClassifier`].
    ///
    /// ```
    /// use tower::retry::RetryLayer;
    /// use tower_circuit_breaker::retry::RetryPolicy;
    ///
    /// // 3 retries, backoff from 500 ms up to 10 s, `Retry-After` waited out up to 20 s.
    /// let layer = RetryLayer::new(RetryPolicy::new());
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn new() -> Self {
        RetryPolicy {
            classifier: HttpClassifier,
            max_retries: 3,
            base: Duration::from_millis(500),
            max: Duration::from_secs(10),
            retry_after_cap: Duration::from_secs(20),
            watch: Arc::new([]),
            keyed: (),
            rng: Rng::random(),
            budget: None,
            retry_graded: false,
            retries: 0,
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::new()
    }
}

impl<C, W> RetryPolicy<C, W> {
    /// Classifies attempts with `classifier` instead.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::LlmClassifier;
    /// use tower_circuit_breaker::retry::RetryPolicy;
    ///
    /// // Judge attempts with the LLM rules (a content filter's 400 is not retried,
    /// // an overloaded 529 is), as the breaker does.
    /// let policy = RetryPolicy::new().with_classifier(LlmClassifier::default());
    /// # let _ = policy;
    /// ```
    pub fn with_classifier<C2>(self, classifier: C2) -> RetryPolicy<C2, W> {
        RetryPolicy {
            classifier,
            max_retries: self.max_retries,
            base: self.base,
            max: self.max,
            retry_after_cap: self.retry_after_cap,
            watch: self.watch,
            keyed: self.keyed,
            rng: self.rng,
            budget: self.budget,
            retry_graded: self.retry_graded,
            retries: self.retries,
        }
    }

    /// The most retries after the first attempt.
    pub(crate) fn retry_limit(&self) -> u32 {
        self.max_retries
    }

    /// The longest `Retry-After` waited out.
    pub(crate) fn retry_after_limit(&self) -> Duration {
        self.retry_after_cap
    }

    /// Retries only within `budget`: at most its percentage of first
    /// attempts over the last 10 s (see [`RetryBudget`]). A first attempt a
    /// circuit rejected is not counted: it never reached the upstream, and
    /// an open period must not bank retries to spend the moment it ends. Over budget, the
    /// attempt's own answer or error goes to the caller. Every clone of the
    /// policy, and every policy given a clone of the budget, draws on the
    /// one budget: give each breaker (or key) its own.
    ///
    /// ```
    /// use tower_circuit_breaker::retry::{RetryBudget, RetryPolicy};
    ///
    /// # fn main() -> Result<(), tower_circuit_breaker::retry::RetryBudgetError> {
    /// let policy = RetryPolicy::new().budget(RetryBudget::new(20.0)?);
    /// # let _ = policy; Ok(()) }
    /// ```
    #[must_use]
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Retries a call that graded admission refused
    /// ([`Rejection::Graded`]), after a backoff
    /// and within the budget, as it would a failure. Off by default: any
    /// rejection ends the retry loop, a graded one as an open circuit's
    /// does. A graded breaker refuses a call with the probability that its
    /// upstream cannot serve it, so a retry of a refused call is a draw
    /// against the same odds, admitted or not, at the cost of the user's
    /// wait; without a budget it also undoes the shedding. Replayed over
    /// every shipped scenario (the outage replay's `[client] retry_graded`,
    /// medians of 11 seeds), retrying them answered more of what no breaker
    /// answers in two stacks (stalled streams, 0.947 → 0.961) and fewer in
    /// two (a brownout, 0.969 → 0.948; eight replicas on an overloaded
    /// upstream, 0.575 → 0.473), so it is off by default.
    ///
    /// ```
    /// use tower_circuit_breaker::retry::{RetryBudget, RetryPolicy};
    ///
    /// // Retry graded refusals too, within a 20 % budget.
    /// let policy = RetryPolicy::new()
    ///     .max_retries(2)
    ///     .budget(RetryBudget::new(20.0).unwrap())
    ///     .retry_graded(true);
    /// # let _ = policy;
    /// ```
    #[must_use]
    pub fn retry_graded(mut self, retry: bool) -> Self {
        self.retry_graded = retry;
        self
    }

    /// The retry budget, if there is one.
    ///
    /// ```
    /// use tower_circuit_breaker::retry::{RetryBudget, RetryPolicy};
    ///
    /// assert!(RetryPolicy::new().retry_budget().is_none());
    /// let policy = RetryPolicy::new().budget(RetryBudget::new(20.0).unwrap());
    /// assert!(policy.retry_budget().is_some());
    /// ```
    pub fn retry_budget(&self) -> Option<&RetryBudget> {
        self.budget.as_ref()
    }

    /// At most `retries` retries after the first attempt. 0 turns retrying
    /// off.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use tower::{retry::RetryLayer, ServiceBuilder, ServiceExt};
    /// use tower_circuit_breaker::retry::RetryPolicy;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let calls = Arc::new(AtomicU32::new(0));
    /// let seen = calls.clone();
    /// let upstream = tower::service_fn(move |_req: http::Request<String>| {
    ///     seen.fetch_add(1, Ordering::SeqCst);
    ///     async { Ok::<_, std::convert::Infallible>(http::Response::builder().status(503).body(String::new()).unwrap()) }
    /// });
    /// let client = ServiceBuilder::new()
    ///     .layer(RetryLayer::new(RetryPolicy::new().max_retries(2)))
    ///     .service(upstream);
    /// let res = client.oneshot(http::Request::new(String::new())).await.unwrap();
    /// assert_eq!(res.status(), 503, "the last attempt's answer");
    /// assert_eq!(calls.load(Ordering::SeqCst), 3, "the first attempt and 2 retries");
    /// # }
    /// ```
    #[must_use]
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Retry `n` (from 0) waits a uniformly random time below
    /// `min(max, base × 2ⁿ)` ("full jitter"). A `base` above `max` is
    /// lowered to `max`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{retry::RetryLayer, ServiceBuilder, ServiceExt};
    /// use tower_circuit_breaker::retry::RetryPolicy;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::builder().status(503).body(String::new()).unwrap())
    /// });
    /// let policy = RetryPolicy::new()
    ///     .max_retries(3)
    ///     .backoff(Duration::from_secs(1), Duration::from_secs(2));
    /// let client = ServiceBuilder::new().layer(RetryLayer::new(policy)).service(upstream);
    /// let start = tokio::time::Instant::now();
    /// client.oneshot(http::Request::new(String::new())).await.unwrap();
    /// // Waits below 1 s, 2 s and 2 s (the cap): under 5 s in all.
    /// assert!(start.elapsed() < Duration::from_secs(5));
    /// # }
    /// ```
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base = base.min(max);
        self.max = max;
        self
    }

    /// The longest `Retry-After` the policy waits out. A rate-limited answer
    /// asking for longer is not retried: it goes to the caller as it is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{retry::RetryLayer, ServiceBuilder, ServiceExt};
    /// use tower_circuit_breaker::retry::RetryPolicy;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // Asked to come back in an hour: not worth waiting, the 429 goes to the caller.
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(
    ///         http::Response::builder().status(429).header("retry-after", "3600").body(String::new()).unwrap(),
    ///     )
    /// });
    /// let policy = RetryPolicy::new().retry_after_cap(Duration::from_secs(30));
    /// let client = ServiceBuilder::new().layer(RetryLayer::new(policy)).service(upstream);
    /// let start = tokio::time::Instant::now();
    /// let res = client.oneshot(http::Request::new(String::new())).await.unwrap();
    /// assert_eq!(res.status(), 429);
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// # }
    /// ```
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// Seeds the jitter, for runs that must repeat exactly.
    ///
    /// ```
    /// use tower_circuit_breaker::retry::RetryPolicy;
    ///
    /// // The same seed draws the same sequence of waits, run after run.
    /// let policy = RetryPolicy::new().seed(42);
    /// # let _ = policy;
    /// ```
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Rng::new(seed);
        self
    }

    /// Ends a backoff as soon as `breaker` is open, so the retry is rejected
    /// at once instead of after sleeping. Watching several breakers (one per
    /// upstream behind a [`Failover`](crate::failover::Failover)) ends the
    /// wait when all of them are open.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{retry::RetryLayer, ServiceBuilder, ServiceExt};
    /// use tower_circuit_breaker::retry::RetryPolicy;
    /// use tower_circuit_breaker::{CircuitBreakerLayer, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::builder().status(503).body(String::new()).unwrap())
    /// });
    /// let breaker = CircuitBreakerLayer::builder().trip_mode(TripMode::Open).consecutive_failures(1).build().unwrap();
    /// let policy = RetryPolicy::new()
    ///     .backoff(Duration::from_secs(5), Duration::from_secs(10))
    ///     .watch_breaker(breaker.breaker().clone());
    /// let client = ServiceBuilder::new()
    ///     .layer(RetryLayer::new(policy))
    ///     .layer(breaker)
    ///     .service(upstream);
    /// let start = tokio::time::Instant::now();
    /// let err = client.oneshot(http::Request::new(String::new())).await.unwrap_err();
    /// // The first failure opened the circuit: no backoff was slept out.
    /// assert!(err.is_circuit_open());
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// # }
    /// ```
    #[must_use]
    pub fn watch_breaker(mut self, breaker: Breaker) -> Self {
        let mut watch = self.watch.to_vec();
        watch.push(breaker);
        self.watch = watch.into();
        self
    }

    /// Ends a backoff as soon as the request's own key is open in
    /// `breakers`, the key taken from the request by `key` as the keyed
    /// layer over `breakers` takes it: a request for a model whose circuit
    /// opens stops retrying at once, while requests for other keys back off
    /// and retry as before.
    ///
    /// Watching several sets (one per keyed upstream behind a
    /// [`Failover`](crate::failover::Failover)), or a set and
    /// [breakers](Self::watch_breaker), ends the wait when the request's
    /// breaker is open in all of them. The key is taken from the request as
    /// the retry sees it, before any failover rewrite; when a fallback
    /// rewrites the key, give its set a key function that reads the
    /// rewritten one. A key the set does not hold (never admitted, or
    /// evicted) cannot be open, so its backoff runs its course.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{retry::RetryLayer, Service, ServiceBuilder, ServiceExt};
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::retry::RetryPolicy;
    /// use tower_circuit_breaker::{BoxError, CircuitBreakerLayer, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), BoxError> {
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(
    ///         http::Response::builder().status(503).body(String::new()).unwrap(),
    ///     )
    /// });
    /// let models = KeyedBreakers::builder().trip_mode(TripMode::Open).consecutive_failures(1).build()?;
    /// let policy = RetryPolicy::new()
    ///     .max_retries(5)
    ///     .backoff(Duration::from_secs(5), Duration::from_secs(10))
    ///     .watch_keyed(models.clone(), keyed::header("x-model"));
    /// let mut client = ServiceBuilder::new()
    ///     .layer(RetryLayer::new(policy))
    ///     .layer(CircuitBreakerLayer::keyed(models.clone(), keyed::header("x-model")))
    ///     .service(upstream);
    ///
    /// let start = tokio::time::Instant::now();
    /// let request = http::Request::get("/").header("x-model", "big").body(String::new())?;
    /// let err = client.ready().await?.call(request).await.unwrap_err();
    /// // The failure opened "big": the retry after it did not wait, and
    /// // was rejected without reaching the upstream.
    /// assert!(err.is_circuit_open());
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// assert_eq!(models.get("big").unwrap().snapshot().counters.failures, 1);
    /// # Ok(()) }
    /// ```
    pub fn watch_keyed<K>(
        self,
        breakers: KeyedBreakers,
        key: K,
    ) -> RetryPolicy<C, KeyedWatch<K, W>> {
        RetryPolicy {
            classifier: self.classifier,
            max_retries: self.max_retries,
            base: self.base,
            max: self.max,
            retry_after_cap: self.retry_after_cap,
            watch: self.watch,
            keyed: KeyedWatch::new(Keyed::new(breakers, key), self.keyed),
            rng: self.rng,
            budget: self.budget,
            retry_graded: self.retry_graded,
            retries: self.retries,
        }
    }

    /// The breakers whose opening ends the backoff before retrying
    /// `request`: all of them, or none when one of the request's keys is
    /// not in its set (it cannot be open).
    fn watched<Req>(&self, request: &Req) -> Arc<[Breaker]>
    where
        W: Watch<Req>,
    {
        if !W::PER_REQUEST {
            // Nothing keyed: the same list for every request, not copied.
            return Arc::clone(&self.watch);
        }
        let mut watch = self.watch.to_vec();
        if self.keyed.breakers_of(request, &mut watch) {
            watch.into()
        } else {
            Arc::new([])
        }
    }

    /// How long retry `n` (from 0) may wait at most: `min(max, base × 2ⁿ)`.
    fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// The wait before the next retry, or `None` to stop.
    fn wait_for(&mut self, outcome: Outcome) -> Option<Duration> {
        if self.retries >= self.max_retries {
            return None;
        }
        match outcome {
            Outcome::Failure | Outcome::RateLimited { retry_after: None } => {
                Some(self.ceiling(self.retries).mul_f64(self.rng.unit()))
            }
            Outcome::RateLimited {
                retry_after: Some(wait),
            } => (wait <= self.retry_after_cap).then_some(wait),
            _ => None,
        }
    }
}

impl<C, W, Req, B, E> Policy<Req, Response<B>, E> for RetryPolicy<C, W>
where
    C: Classify,
    W: Watch<Req>,
    Req: Clone + Fallback,
    E: AttemptError,
{
    type Future = Backoff;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Response<B>, E>) -> Option<Backoff> {
        let judged = guard::judge(&self.classifier, result);
        // A first attempt the breaker rejected never reached the upstream:
        // counted, an open period would bank retries for right after it.
        if self.retries == 0
            && !matches!(judged, Judged::Rejected)
            && let Some(budget) = &self.budget
        {
            budget.deposit();
        }
        let outcome = match judged {
            Judged::Said(outcome) => outcome,
            Judged::Rejected if self.retry_graded && graded(result) => Outcome::Failure,
            Judged::Rejected | Judged::Opaque => return None,
        };
        let wait = self.wait_for(outcome)?;
        if let Some(budget) = &self.budget
            && !budget.withdraw()
        {
            return None;
        }
        self.retries += 1;
        // `req` is what the retry sends: a failover below never hedges it.
        req.mark_retry();
        Some(Backoff::new(wait, self.watched(req)))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        (self.max_retries > 0).then(|| req.clone())
    }
}

/// Whether an attempt was refused by graded admission.
fn graded<R, E: AttemptError>(result: &Result<R, E>) -> bool {
    matches!(result, Err(e) if e.circuit_open().is_some_and(|o| o.reason() == Rejection::Graded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_the_cap() {
        let p = RetryPolicy::new().backoff(Duration::from_millis(500), Duration::from_secs(10));
        let ceilings: Vec<_> = (0..7).map(|n| p.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn full_jitter_stays_below_the_ceiling_and_repeats_with_a_seed() {
        let draw = |seed| {
            let mut p = RetryPolicy::new().max_retries(100).seed(seed);
            (0..50)
                .map(|_| {
                    let w = p.wait_for(Outcome::Failure).unwrap();
                    let ceiling = p.ceiling(p.retries);
                    assert!(
                        w < ceiling.max(Duration::from_nanos(1)),
                        "{w:?} >= {ceiling:?}"
                    );
                    p.retries += 1;
                    w
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
    }
}
