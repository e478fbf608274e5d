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
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Layer, Service, ServiceExt};
//! use tower_circuit_breaker::retry::RetryPolicy;
//! use tower_circuit_breaker::stack::{Stack, StackError};
//! use tower_circuit_breaker::{Breaker, BoxError, CircuitOpen};
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
//! // 3 probes, 2 to close, 3 retries.
//! let layer = Stack::builder()
//!     .breaker(Breaker::builder().count_window(10).min_calls(3))
//!     .retry(RetryPolicy::new().max_retries(3))
//!     .build()?;
//! let breaker = layer.breaker().clone();
//! let mut client = layer.layer(upstream);
//!
//! // Three failed attempts open the circuit: the first retry that meets the
//! // open circuit is rejected without reaching the upstream, and the loop
//! // ends there.
//! let err = client.ready().await?.call(http::Request::new(String::new())).await.unwrap_err();
//! assert!(err.downcast_ref::<CircuitOpen>().is_some());
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

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::retry::Retry;
use tower::timeout::Timeout;
use tower::util::{Either, MapErr};
use tower_layer::Layer;
use tower_service::Service;

use crate::breaker::{Breaker, Builder, ConfigError, Window};
use crate::classify::HttpClassifier;
use crate::deadline::StreamDeadlines;
use crate::retry::RetryPolicy;
use crate::{BoxError, CircuitBreaker, Error};

/// The retry and everything inside it.
type Retried<S, C, D> = Retry<RetryPolicy<C>, CircuitBreaker<Timeout<S>, C, Breaker, D>>;

/// With or without a total timeout, the error is a [`BoxError`].
type Outer<S, C, D> =
    Either<Timeout<Retried<S, C, D>>, MapErr<Retried<S, C, D>, fn(Error) -> BoxError>>;

/// Builds a [`StackLayer`]; see the [module docs](self).
///
/// Defaults follow the numbers of a typical LLM outage: 60 s per attempt, no
/// total timeout, the [`Breaker`] defaults (a window of 20 calls, 50 %
/// failures, open 30 s, 3 probes, 2 to close) and the
/// [`RetryPolicy`] defaults (3 retries, backoff from 500 ms to 10 s,
/// `Retry-After` waited up to 20 s).
///
/// A half-open probe is failed if its response head has not come by its
/// probe deadline (see [`Builder::probe_timeout`]); the stack refuses a probe
/// timeout longer than the attempt timeout, and caps the default one there.
///
/// With [`stream_deadlines`](Self::stream_deadlines) (the `D` parameter is
/// then [`StreamDeadlines`]), response bodies keep them; see
/// [`deadline`](crate::deadline) for every deadline in one table.
pub struct StackBuilder<C = HttpClassifier, D = ()> {
    attempt_timeout: Duration,
    total_timeout: Option<Duration>,
    breaker: Builder<Breaker>,
    classifier: C,
    /// The retry's settings; the stack gives it its classifier and breaker.
    retry: RetryPolicy<()>,
    /// A backoff whose base was above its cap, as given.
    backoff_inverted: bool,
    seed: Option<u64>,
    deadlines: D,
}

impl<C: fmt::Debug, D: fmt::Debug> fmt::Debug for StackBuilder<C, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder")
            .field("attempt_timeout", &self.attempt_timeout)
            .field("total_timeout", &self.total_timeout)
            .field("breaker", &self.breaker)
            .field("classifier", &self.classifier)
            .field("retry", &self.retry)
            .field("deadlines", &self.deadlines)
            .finish()
    }
}

impl Default for StackBuilder {
    fn default() -> Self {
        StackBuilder {
            attempt_timeout: Duration::from_secs(60),
            total_timeout: None,
            breaker: Breaker::builder(),
            classifier: HttpClassifier,
            retry: RetryPolicy::new().with_classifier(()),
            backoff_inverted: false,
            seed: None,
            deadlines: (),
        }
    }
}

impl StackBuilder {
    /// A builder with the defaults.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<C> StackBuilder<C> {
    /// Keeps `deadlines` on every response body: the first frame, stalls
    /// and the total stream time (see [`deadline`](crate::deadline)).
    /// [`build`](Self::build) refuses deadlines that cannot work, and a
    /// stall or first-frame deadline longer than the total timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    /// use tower_circuit_breaker::stack::{Stack, StackError};
    ///
    /// let err = Stack::builder()
    ///     .attempt_timeout(Duration::from_secs(30))
    ///     .total_timeout(Duration::from_secs(60))
    ///     .stream_deadlines(StreamDeadlines::new().stall(Duration::from_secs(90)))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, StackError::Misfit(_)));
    /// ```
    pub fn stream_deadlines(self, deadlines: StreamDeadlines) -> StackBuilder<C, StreamDeadlines> {
        StackBuilder {
            attempt_timeout: self.attempt_timeout,
            total_timeout: self.total_timeout,
            breaker: self.breaker,
            classifier: self.classifier,
            retry: self.retry,
            backoff_inverted: self.backoff_inverted,
            seed: self.seed,
            deadlines,
        }
    }
}

impl<C, D> StackBuilder<C, D> {
    /// How long one attempt may take (to the response head). Default 60 s.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long the caller waits at most, retries and backoff included.
    /// Default: no limit.
    pub fn total_timeout(mut self, timeout: Duration) -> Self {
        self.total_timeout = Some(timeout);
        self
    }

    /// The breaker's configuration (name, window, rules, listeners).
    pub fn breaker(mut self, breaker: Builder<Breaker>) -> Self {
        self.breaker = breaker;
        self
    }

    /// The retry's settings (retries, backoff, `Retry-After` cap, budget):
    /// a [`RetryPolicy`] as you would build it for `tower::retry` yourself.
    /// The stack gives it the stack's classifier and has it watch the
    /// stack's breaker. Default: [`RetryPolicy::new`].
    pub fn retry<R>(mut self, policy: RetryPolicy<R>) -> Self {
        self.retry = policy.with_classifier(());
        self.backoff_inverted = false;
        self
    }

    /// Shorthand for [`RetryPolicy::max_retries`] on the stack's retry.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.retry = self.retry.max_retries(retries);
        self
    }

    /// Shorthand for [`RetryPolicy::backoff`] on the stack's retry; a base
    /// above the cap is a misfit here.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.retry = self.retry.backoff(base, max);
        self.backoff_inverted = base > max;
        self
    }

    /// Shorthand for [`RetryPolicy::retry_after_cap`] on the stack's retry.
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry = self.retry.retry_after_cap(cap);
        self
    }

    /// Seeds the retry jitter and the breaker's open-duration jitter, for runs
    /// that must repeat exactly.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Classifies attempts (for the breaker and the retry) with `classifier`.
    pub fn classifier<C2>(self, classifier: C2) -> StackBuilder<C2, D> {
        StackBuilder {
            attempt_timeout: self.attempt_timeout,
            total_timeout: self.total_timeout,
            breaker: self.breaker,
            classifier,
            retry: self.retry,
            backoff_inverted: self.backoff_inverted,
            seed: self.seed,
            deadlines: self.deadlines,
        }
    }
}

impl<C: Clone, D: StackDeadlines> StackBuilder<C, D> {
    /// Checks that the pieces fit and builds the layer.
    pub fn build(self) -> Result<StackLayer<C, D>, StackError> {
        use StackError::Misfit;
        let attempt = self.attempt_timeout;
        if attempt.is_zero() {
            return Err(Misfit("the attempt timeout is zero"));
        }
        let (retries, retry_after_cap) = (self.retry.retry_limit(), self.retry.retry_after_limit());
        if let Some(total) = self.total_timeout {
            if total < attempt {
                return Err(Misfit(
                    "the total timeout is shorter than one attempt timeout",
                ));
            }
            if retries > 0 && retry_after_cap >= total {
                return Err(Misfit("the Retry-After cap is not below the total timeout"));
            }
        }
        if let Some(deadlines) = self.deadlines.get() {
            deadlines.validate()?;
            let total = self.total_timeout.unwrap_or(Duration::MAX);
            if deadlines.stall_timeout().is_some_and(|s| s > total) {
                return Err(Misfit(
                    "the stall deadline is longer than the total timeout",
                ));
            }
            if deadlines.first_frame_timeout().is_some_and(|f| f > total) {
                return Err(Misfit(
                    "the first-frame deadline is longer than the total timeout",
                ));
            }
        }
        if self.backoff_inverted {
            return Err(Misfit("the retry backoff base is above its cap"));
        }
        let mut breaker = self.breaker;
        let config = &breaker.config;
        if let Window::Time { span, .. } = config.window
            && span < attempt.saturating_mul(2)
        {
            return Err(Misfit(
                "the time window is shorter than two attempt timeouts",
            ));
        }
        if let Some((threshold, _)) = config.slow_call
            && threshold >= attempt
        {
            return Err(Misfit(
                "the slow-call threshold is not below the attempt timeout",
            ));
        }
        if config.probe_timeout.is_some_and(|t| t > attempt) {
            return Err(Misfit(
                "the probe timeout is longer than the attempt timeout",
            ));
        }
        if config.probe_lease.is_some_and(|lease| lease <= attempt) {
            return Err(Misfit(
                "the probe lease is not longer than the attempt timeout",
            ));
        }
        if config.probe_timeout.is_none() && config.probe_deadline() > attempt {
            // A probe cannot wait for its head longer than its attempt does.
            breaker = breaker.probe_timeout(attempt);
        }
        if let Some(seed) = self.seed {
            breaker = breaker.seed(seed);
        }
        let breaker = breaker.build()?;
        let mut retry = self.retry.watch_breaker(breaker.clone());
        if let Some(seed) = self.seed {
            retry = retry.seed(seed);
        }
        Ok(StackLayer {
            attempt_timeout: attempt,
            total_timeout: self.total_timeout,
            retry: retry.with_classifier(self.classifier.clone()),
            classifier: self.classifier,
            breaker,
            deadlines: self.deadlines,
        })
    }
}

// === StackError ===

/// Why [`StackBuilder::build`] refused.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::stack::{Stack, StackError};
/// use tower_circuit_breaker::{Breaker, ConfigError};
///
/// let err = Stack::builder().breaker(Breaker::builder().probes(0)).build().unwrap_err();
/// assert!(matches!(err, StackError::Breaker(ConfigError::ZeroProbes)));
/// let err = Stack::builder().attempt_timeout(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.to_string(), "stack does not fit: the attempt timeout is zero");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StackError {
    /// The breaker's own settings are invalid.
    Breaker(ConfigError),
    /// Each piece is valid, but they do not fit together.
    Misfit(&'static str),
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StackError::Breaker(e) => fmt::Display::fmt(e, f),
            StackError::Misfit(why) => write!(f, "stack does not fit: {why}"),
        }
    }
}

impl std::error::Error for StackError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StackError::Breaker(e) => Some(e),
            StackError::Misfit(_) => None,
        }
    }
}

impl From<ConfigError> for StackError {
    fn from(e: ConfigError) -> Self {
        StackError::Breaker(e)
    }
}

/// The stream deadlines a [`StackBuilder`] may carry: none (`()`), or
/// [`StreamDeadlines`]. Sealed.
pub trait StackDeadlines: Clone + sealed::Sealed {
    #[doc(hidden)]
    fn get(&self) -> Option<&StreamDeadlines>;
}

impl StackDeadlines for () {
    fn get(&self) -> Option<&StreamDeadlines> {
        None
    }
}

impl StackDeadlines for StreamDeadlines {
    fn get(&self) -> Option<&StreamDeadlines> {
        Some(self)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for () {}
    impl Sealed for crate::deadline::StreamDeadlines {}
}

/// Wraps a client in the whole stack; built by [`StackBuilder`].
///
/// Every service it makes shares its one breaker.
#[derive(Clone, Debug)]
pub struct StackLayer<C = HttpClassifier, D = ()> {
    attempt_timeout: Duration,
    total_timeout: Option<Duration>,
    breaker: Breaker,
    classifier: C,
    retry: RetryPolicy<C>,
    deadlines: D,
}

impl<C, D> StackLayer<C, D> {
    /// The shared breaker, for snapshots and manual control.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The attempt timeout.
    pub fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The total timeout, if there is one.
    pub fn total_timeout(&self) -> Option<Duration> {
        self.total_timeout
    }
}

impl<S, C: Clone, D: Clone> Layer<S> for StackLayer<C, D> {
    type Service = Stack<S, C, D>;

    fn layer(&self, client: S) -> Stack<S, C, D> {
        let attempt = Timeout::new(client, self.attempt_timeout);
        let breaker = CircuitBreaker::from_parts(
            attempt,
            self.breaker.clone(),
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
            breaker: self.breaker.clone(),
        }
    }
}

/// A client wrapped in total timeout → retry → circuit breaker → attempt
/// timeout; made by [`StackLayer`].
///
/// Its error is a [`BoxError`]: a [`CircuitOpen`](crate::CircuitOpen), a
/// `tower::timeout::error::Elapsed` (the attempt or the total timeout), or
/// the client's own error.
#[derive(Clone, Debug)]
pub struct Stack<S, C = HttpClassifier, D = ()> {
    inner: Outer<S, C, D>,
    breaker: Breaker,
}

impl Stack<(), HttpClassifier> {
    /// A builder with the defaults.
    pub fn builder() -> StackBuilder {
        StackBuilder::new()
    }
}

impl<S, C, D> Stack<S, C, D> {
    /// The breaker, for snapshots and manual control.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, C, D, Req> Service<Req> for Stack<S, C, D>
where
    Outer<S, C, D>: Service<Req, Error = BoxError>,
{
    type Response = <Outer<S, C, D> as Service<Req>>::Response;
    type Error = BoxError;
    type Future = <Outer<S, C, D> as Service<Req>>::Future;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        self.inner.call(request)
    }
}
