//! [`StackBuilder`]: the stack's settings, checked to fit by `build()`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{HealthSpec, StackDeadlines, StackError, StackLayer, StackSelect};
use crate::breaker::{Breaker, Builder, Config, Window};
use crate::classify::HttpClassifier;
use crate::deadline::StreamDeadlines;
use crate::health::{HealthProbeBuilder, MakeHealthRequest};
use crate::keyed::{Keyed, KeyedBreakers, KeyedConfigError};
use crate::retry::RetryPolicy;

/// Builds a [`StackLayer`]; see the [module docs](super).
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
///
/// With [`keyed`](Self::keyed) (the `P` parameter is then [`Keyed`]), the
/// stack has a breaker per key; every key's settings, per-key overrides
/// included, are checked and capped as one breaker's are.
pub struct StackBuilder<C = HttpClassifier, D = (), P: StackSelect = Breaker> {
    attempt_timeout: Duration,
    total_timeout: Option<Duration>,
    breaker: Builder<Breaker>,
    /// What only a keyed set has: its bounds, overrides and key function.
    select: P::Spec,
    classifier: C,
    /// The retry's settings; the stack gives it its classifier and breaker.
    retry: RetryPolicy<()>,
    /// A backoff whose base was above its cap, as given.
    backoff_inverted: bool,
    seed: Option<u64>,
    deadlines: D,
    /// The health prober's settings and request, if there is one.
    health: Option<HealthSpec>,
}

impl<C: fmt::Debug, D: fmt::Debug, P: StackSelect> fmt::Debug for StackBuilder<C, D, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder")
            .field("attempt_timeout", &self.attempt_timeout)
            .field("total_timeout", &self.total_timeout)
            .field("breaker", &self.breaker)
            .field("select", &self.select)
            .field("classifier", &self.classifier)
            .field("retry", &self.retry)
            .field("deadlines", &self.deadlines)
            .field("health", &self.health)
            .finish()
    }
}

impl Default for StackBuilder {
    fn default() -> Self {
        StackBuilder {
            attempt_timeout: Duration::from_secs(60),
            total_timeout: None,
            breaker: Breaker::builder(),
            select: (),
            classifier: HttpClassifier,
            retry: RetryPolicy::new().with_classifier(()),
            backoff_inverted: false,
            seed: None,
            deadlines: (),
            health: None,
        }
    }
}

impl StackBuilder {
    /// A builder with the defaults.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl<C, P: StackSelect> StackBuilder<C, (), P> {
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
    pub fn stream_deadlines(
        self,
        deadlines: StreamDeadlines,
    ) -> StackBuilder<C, StreamDeadlines, P> {
        StackBuilder {
            attempt_timeout: self.attempt_timeout,
            total_timeout: self.total_timeout,
            breaker: self.breaker,
            select: self.select,
            classifier: self.classifier,
            retry: self.retry,
            backoff_inverted: self.backoff_inverted,
            seed: self.seed,
            deadlines,
            health: self.health,
        }
    }
}

impl<C, D> StackBuilder<C, D> {
    /// The breaker's configuration (name, window, rules, listeners).
    #[must_use]
    pub fn breaker(mut self, breaker: Builder<Breaker>) -> Self {
        self.breaker = breaker;
        self
    }
}

impl<C, D, P: StackSelect> StackBuilder<C, D, P> {
    /// A breaker per key instead of one: `breakers` configures every key
    /// (bounds and per-key overrides included, see
    /// [`KeyedBreakers`]), and `key` takes the key from each request, as
    /// for [`CircuitBreakerLayer::keyed`](crate::CircuitBreakerLayer::keyed).
    /// The stack's retry [watches](RetryPolicy::watch_keyed) the request's
    /// own key: a request whose key opens stops retrying at once, while
    /// other keys retry as before. Replaces any [`breaker`](Self::breaker)
    /// configuration given before. [`Stack::keyed`](super::Stack::keyed) is
    /// the shorthand.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::stack::{Stack, StackError};
    ///
    /// let layer = Stack::builder()
    ///     .attempt_timeout(Duration::from_secs(30))
    ///     .keyed(KeyedBreakers::builder().max_keys(1_000), keyed::header("x-model"))
    ///     .build()?;
    /// assert!(layer.breakers().is_empty());
    ///
    /// // Every key's settings must fit the stack, overrides included.
    /// let err = Stack::keyed(
    ///     KeyedBreakers::builder()
    ///         .override_key("slow-model", |b| b.probe_timeout(Duration::from_secs(90))),
    ///     keyed::header("x-model"),
    /// )
    /// .build()
    /// .unwrap_err();
    /// assert!(matches!(err, StackError::Misfit(_)));
    /// # Ok::<_, StackError>(())
    /// ```
    pub fn keyed<K>(self, breakers: Builder<KeyedBreakers>, key: K) -> StackBuilder<C, D, Keyed<K>>
    where
        Keyed<K>: StackSelect<Spec = (crate::keyed::KeyedSettings, K)>,
    {
        StackBuilder {
            attempt_timeout: self.attempt_timeout,
            total_timeout: self.total_timeout,
            breaker: Builder::with_config(breakers.config),
            select: (breakers.extra, key),
            classifier: self.classifier,
            retry: self.retry,
            backoff_inverted: self.backoff_inverted,
            seed: self.seed,
            deadlines: self.deadlines,
            health: self.health,
        }
    }

    /// Probes the upstream with `request` while a circuit is not closed, on
    /// `probe`'s schedule (see [`health`](crate::health)): the stack's
    /// services then hand back their prober as a future,
    /// [`Stack::health_prober`](super::Stack::health_prober), which the
    /// caller runs (or [spawns on a runtime](crate::health::HealthProber::spawn_on)).
    /// Probes go through the client the stack wraps (not through its
    /// breaker or retry) and are judged by the stack's classifier.
    ///
    /// `request` is one request sent for every probe (any of the ready-made
    /// ones: [`openai_completion_request`](crate::health::openai_completion_request),
    /// [`anthropic_messages_request`](crate::health::anthropic_messages_request),
    /// …), or a function of the breaker probed, whose name is the key in a
    /// keyed stack. A probe timeout longer than the attempt timeout is a
    /// misfit; without one, the probe timeout is the interval, capped at
    /// the attempt timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use tower_circuit_breaker::health::{anthropic_messages_request, HealthProbe, HealthProbeError};
    /// use tower_circuit_breaker::stack::{Stack, StackError};
    ///
    /// let request = anthropic_messages_request::<Bytes>(
    ///     "https://api.anthropic.com/v1",
    ///     "sk-ant-...",
    ///     "claude-3-5-haiku-latest",
    /// )?;
    /// let layer = Stack::builder()
    ///     .health_probe(HealthProbe::builder(Duration::from_secs(5)), request)
    ///     .build();
    /// assert!(layer.is_ok());
    ///
    /// // Bad settings are refused by `build()`.
    /// let err = Stack::builder()
    ///     .health_probe(HealthProbe::builder(Duration::ZERO), |_: &tower_circuit_breaker::Breaker| {
    ///         http::Request::new(Bytes::new())
    ///     })
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err, StackError::HealthProbe(HealthProbeError::ZeroInterval));
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn health_probe(
        mut self,
        probe: HealthProbeBuilder,
        request: impl MakeHealthRequest,
    ) -> Self {
        self.health = Some(HealthSpec {
            probe,
            request: Arc::new(request),
        });
        self
    }

    /// How long one attempt may take (to the response head). Default 60 s.
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// How long the caller waits at most, retries and backoff included.
    /// Default: no limit.
    #[must_use]
    pub fn total_timeout(mut self, timeout: Duration) -> Self {
        self.total_timeout = Some(timeout);
        self
    }

    /// The retry's settings (retries, backoff, `Retry-After` cap, budget):
    /// a [`RetryPolicy`] as you would build it for `tower::retry` yourself.
    /// The stack gives it the stack's classifier and has it watch the
    /// stack's breaker (with [`keyed`](Self::keyed), the request's own
    /// key). Default: [`RetryPolicy::new`].
    #[must_use]
    pub fn retry<R>(mut self, policy: RetryPolicy<R>) -> Self {
        self.retry = policy.with_classifier(());
        self.backoff_inverted = false;
        self
    }

    /// Shorthand for [`RetryPolicy::max_retries`] on the stack's retry.
    #[must_use]
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.retry = self.retry.max_retries(retries);
        self
    }

    /// Shorthand for [`RetryPolicy::backoff`] on the stack's retry; a base
    /// above the cap is a misfit here.
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.retry = self.retry.backoff(base, max);
        self.backoff_inverted = base > max;
        self
    }

    /// Shorthand for [`RetryPolicy::retry_after_cap`] on the stack's retry.
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry = self.retry.retry_after_cap(cap);
        self
    }

    /// Seeds the retry jitter and the breaker's open-duration jitter, for runs
    /// that must repeat exactly.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Classifies attempts (for the breaker and the retry) with `classifier`.
    pub fn classifier<C2>(self, classifier: C2) -> StackBuilder<C2, D, P> {
        StackBuilder {
            attempt_timeout: self.attempt_timeout,
            total_timeout: self.total_timeout,
            breaker: self.breaker,
            select: self.select,
            classifier,
            retry: self.retry,
            backoff_inverted: self.backoff_inverted,
            seed: self.seed,
            deadlines: self.deadlines,
            health: self.health,
        }
    }
}

impl<C: Clone, D: StackDeadlines, P: StackSelect> StackBuilder<C, D, P> {
    /// Checks that the pieces fit and builds the layer.
    ///
    /// # Errors
    ///
    /// A [`StackError`]: the breaker's, the deadlines' or the health probe's
    /// own settings are invalid, or the pieces do not fit together
    /// ([`StackError::Misfit`]).
    pub fn build(mut self) -> Result<StackLayer<C, D, P>, StackError> {
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
        let health = match self.health.take() {
            Some(HealthSpec { probe, request }) => {
                probe.check()?;
                let probe = match probe.given_timeout() {
                    Some(t) if t > attempt => {
                        return Err(Misfit(
                            "the health probe timeout is longer than the attempt timeout",
                        ));
                    }
                    Some(_) => probe,
                    None => {
                        let interval = probe.interval();
                        probe.timeout(interval.min(attempt))
                    }
                };
                Some(Arc::new(HealthSpec { probe, request }))
            }
            None => None,
        };
        let mut breaker = self.breaker;
        fits(&breaker.config, attempt)?;
        if let Some(seed) = self.seed {
            breaker = breaker.seed(seed);
        }
        if let Some(settings) = P::keyed_settings(&mut self.select) {
            // Each key with its own settings must fit as one breaker would,
            // and have its default probe deadline capped as one breaker's
            // is: its override applies to the shared settings as the user
            // gave them, before the stack capped them.
            let given = breaker.config.probe_timeout;
            for (key, f) in settings.overrides_mut() {
                let user = Arc::clone(f);
                let unchecked = move |mut b: Builder<Breaker>| {
                    b.config.probe_timeout = given;
                    user(b)
                };
                let own = unchecked(breaker.clone());
                own.config
                    .validate()
                    .map_err(|error| KeyedConfigError::Override {
                        key: key.into(),
                        error,
                    })?;
                fits(&own.config, attempt)?;
                *f = Arc::new(move |b| cap_probe_deadline(unchecked(b), attempt));
            }
        }
        let breaker = P::build(cap_probe_deadline(breaker, attempt), self.select)?;
        let mut retry = breaker.watched_by(self.retry);
        if let Some(seed) = self.seed {
            retry = retry.seed(seed);
        }
        Ok(StackLayer {
            attempt_timeout: attempt,
            total_timeout: self.total_timeout,
            retry: retry.with_classifier(self.classifier.clone()),
            classifier: self.classifier,
            select: breaker,
            deadlines: self.deadlines,
            health,
        })
    }
}

/// Whether one breaker's settings fit an attempt timeout of `attempt`.
fn fits(config: &Config, attempt: Duration) -> Result<(), StackError> {
    use StackError::Misfit;
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
    Ok(())
}

/// A probe cannot wait for its head longer than its attempt does.
fn cap_probe_deadline(breaker: Builder<Breaker>, attempt: Duration) -> Builder<Breaker> {
    let config = &breaker.config;
    if config.probe_timeout.is_none() && config.probe_deadline() > attempt {
        breaker.probe_timeout(attempt)
    } else {
        breaker
    }
}
