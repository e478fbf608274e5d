//! [`Builder`]: the breaker's settings, validated by `build()`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::{Build, Config, Window};
use crate::breaker::{Breaker, InFlightLimit, Transition, TripMode};

/// Builds a [`Breaker`] (or, through
/// [`CircuitBreakerLayer::builder`](crate::CircuitBreakerLayer::builder), a
/// layer) from a validated configuration.
///
/// Defaults follow the numbers of a typical LLM outage: a count window of 20 calls, a 50 %
/// failure rate once 20 calls are seen, 30 s open, reopen backoff doubling up to two open
/// durations (60 s) with 10 % jitter, 3 probes and 2 successes to close, each probe failed if
/// its response head has not come within the open duration.
///
/// # Upper bounds
///
/// Settings at which a circuit could not trip, half-open and close in any useful time are
/// [`ConfigError`](crate::ConfigError)s: `open_duration`, `max_open_duration` and `probe_timeout` above a week;
/// `probes` above 65,536; a count window, `min_calls` or `consecutive_failures` above 2^20;
/// `counter_stripes` above 1,024. Durations that mean "never" (a probe lease, a slow-call
/// threshold, a volume-guard period) saturate instead.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{Breaker, ConfigError};
///
/// let breaker = Breaker::builder()
///     .count_window(10)
///     .min_calls(5)
///     .failure_rate(0.5)
///     .consecutive_failures(5)
///     .open_duration(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(breaker.state(), tower_circuit_breaker::State::Closed);
///
/// // Bad configuration is an error from `build`, never a panic later.
/// let err = Breaker::builder().count_window(10).min_calls(20).build().unwrap_err();
/// assert!(matches!(err, ConfigError::MinCallsAboveWindow { .. }));
/// # Ok::<_, ConfigError>(())
/// ```
pub struct Builder<T: Build = Breaker> {
    pub(crate) config: Config,
    /// Settings only `T` has (a keyed set's bounds, say).
    pub(crate) extra: T::Extra,
    _target: PhantomData<fn() -> T>,
}

impl<T: Build> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.config)
            .field("extra", &self.extra)
            .finish()
    }
}

impl<T: Build> Clone for Builder<T> {
    fn clone(&self) -> Self {
        Builder {
            config: self.config.clone(),
            extra: self.extra.clone(),
            _target: PhantomData,
        }
    }
}

impl<T: Build> Default for Builder<T> {
    fn default() -> Self {
        Builder {
            config: Config::default(),
            extra: T::Extra::default(),
            _target: PhantomData,
        }
    }
}

impl<T: Build> Builder<T> {
    /// Validates the configuration and builds.
    ///
    /// # Errors
    ///
    /// The type's own error ([`ConfigError`](crate::ConfigError) for a breaker) naming the first
    /// setting out of range or two settings that contradict each other.
    pub fn build(self) -> Result<T, T::Error> {
        T::build_from(self)
    }

    /// The same settings, building something else (a [`Breaker`] from a
    /// layer's builder, say). Settings only the old target had are left
    /// behind.
    pub fn into_builder<U: Build>(self) -> Builder<U> {
        Builder::with_config(self.config)
    }

    pub(crate) fn with_config(config: Config) -> Self {
        Builder {
            config,
            extra: T::Extra::default(),
            _target: PhantomData,
        }
    }

    /// A builder with the default configuration.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the breaker; the name appears in events, snapshots and
    /// [`CircuitOpen`](crate::CircuitOpen).
    #[must_use]
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// Rate rules look at the last `calls` recorded calls.
    #[must_use]
    pub fn count_window(mut self, calls: u32) -> Self {
        self.config.window = Window::Count(calls);
        self
    }

    /// Rate rules look at the calls recorded in the last `span`, kept in
    /// `buckets` buckets (exact to `span / buckets`).
    #[must_use]
    pub fn time_window(mut self, span: Duration, buckets: u32) -> Self {
        self.config.window = Window::Time { span, buckets };
        self
    }

    /// Turns the window off, and with it the failure-rate and slow-call-rate
    /// rules.
    #[must_use]
    pub fn no_window(mut self) -> Self {
        self.config.window = Window::None;
        self
    }

    /// Sets the window.
    #[must_use]
    pub fn window(mut self, window: Window) -> Self {
        self.config.window = window;
        self
    }

    /// The rate rules fire only once the window holds at least this many
    /// calls.
    #[must_use]
    pub fn min_calls(mut self, calls: u32) -> Self {
        self.config.min_calls = calls;
        self
    }

    /// Opens when failures reach this fraction of the window's calls.
    #[must_use]
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.config.failure_rate = Some(rate);
        self
    }

    /// Turns the failure-rate rule off (the window may still serve the
    /// slow-call rule).
    #[must_use]
    pub fn no_failure_rate(mut self) -> Self {
        self.config.failure_rate = None;
        self
    }

    /// Opens after `n` failures in a row. Ignored and rate-limited outcomes
    /// neither count nor break the streak.
    #[must_use]
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.config.consecutive_failures = Some(n);
        self
    }

    /// Opens when calls slower than `threshold` (time to response head) reach
    /// `rate` of the window. A call still in flight is counted as slow as soon
    /// as it crosses the threshold, so a hanging upstream trips the circuit
    /// long before its timeouts come back. In half-open, a slow probe is a
    /// failed probe.
    ///
    /// Calls in flight are tracked in a fixed ring of slots, eight for each
    /// call the count window holds (`min_calls` for a time window), at least
    /// 16 and at most 1,024, rounded up to a power of two: 256 slots, 2 KiB,
    /// for a window of 20, allocated when the breaker is built (for each key
    /// of a keyed set). Admissions take no lock. A call that finds every slot
    /// taken is judged on its response head alone (to the millisecond), not
    /// counted while it hangs.
    #[must_use]
    pub fn slow_call(mut self, threshold: Duration, rate: f64) -> Self {
        self.config.slow_call = Some((threshold, rate));
        self
    }

    /// How long the circuit stays open after it trips (before jitter).
    #[must_use]
    pub fn open_duration(mut self, open: Duration) -> Self {
        self.config.open = open;
        self
    }

    /// The cap of the reopen backoff. Unset, it is two open durations, so
    /// setting only [`open_duration`](Self::open_duration) always builds.
    ///
    /// Two was chosen by replaying every shipped outage scenario with the
    /// cap at 2, 4, 10 and 20 open durations and no health probes: a short
    /// cap answered the most requests in 5 of 7 (seed-000-night, breaker
    /// alone: 1,446 answers at 2×, 1,005 at 4×, 767 at 10×, where 10× and
    /// 20× left several circuits open at the end of the run), for a few
    /// cents more of probes that went to a still-broken upstream ($0.40
    /// against $0.32 wasted). Every half-open cycle costs the users whose
    /// calls are its probes; health probes ([`crate::health`]) remove that
    /// cost, and then a longer cap is cheap.
    #[must_use]
    pub fn max_open_duration(mut self, open_max: Duration) -> Self {
        self.config.open_max = Some(open_max);
        self
    }

    /// Each reopen from half-open multiplies the open duration by this factor,
    /// up to the cap. Default 2.
    #[must_use]
    pub fn backoff_multiplier(mut self, multiplier: f64) -> Self {
        self.config.backoff_multiplier = multiplier;
        self
    }

    /// Each open duration is shortened by a random fraction of up to `jitter`
    /// of itself, so replicas don't probe in lockstep. Default 0.1; 0 turns it
    /// off.
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.config.jitter = jitter;
        self
    }

    /// How many probe calls one half-open cycle admits.
    #[must_use]
    pub fn probes(mut self, probes: u32) -> Self {
        self.config.probes = probes;
        self
    }

    /// How many probe successes close the circuit.
    #[must_use]
    pub fn close_after(mut self, successes: u32) -> Self {
        self.config.close_after = successes;
        self
    }

    /// A half-open probe whose response head has not come by then is a
    /// failed probe, decided at that moment (the cycle reopens as soon as
    /// `close_after` is out of reach); its late outcome is dropped. Defaults
    /// to the base open duration; with the slow-call rule on, the slow
    /// threshold is the deadline unless this is shorter. So no setting can
    /// leave a hung upstream half-open for ever.
    #[must_use]
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.config.probe_timeout = Some(timeout);
        self
    }

    /// A probe still unfinished after this long (its head came in time, its
    /// body is still streaming) gives its slot back without a verdict, and
    /// its late outcome is dropped. Unset by default: a probe holds its slot
    /// until it finishes. May not be shorter than the probe deadline (see
    /// [`probe_timeout`](Self::probe_timeout)); `Duration::MAX` means never.
    #[must_use]
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.config.probe_lease = Some(lease);
        self
    }

    /// Shadow mode: the breaker records and reports every transition it would
    /// make, but never rejects a call.
    #[must_use]
    pub fn metrics_only(mut self, on: bool) -> Self {
        self.config.metrics_only = on;
        self
    }

    /// The volume guard: while `limit` calls have been admitted within the
    /// last `period`, further calls are rejected (with
    /// [`Rejection::VolumeGuard`](crate::Rejection::VolumeGuard)), whatever the
    /// upstream's health. A runaway retry loop against a healthy upstream is
    /// an incident too. Needs no failure rule; no half-open cycle is
    /// involved. Exact to a sixteenth of `period`.
    #[must_use]
    pub fn volume_guard(mut self, limit: u32, period: Duration) -> Self {
        self.config.volume_guard = Some((limit, period));
        self
    }

    /// Quota gating: an [`Outcome::QuotaExhausted`](crate::Outcome::QuotaExhausted)
    /// answer (OpenAI's `insufficient_quota`, HTTP 402) opens this circuit
    /// (this key's, with a keyed set: an API key, an account) with
    /// [`Reason::QuotaExhausted`](crate::Reason::QuotaExhausted), and calls are rejected with
    /// [`Rejection::Quota`](crate::Rejection::Quota) until the reset the answer announced
    /// (`Retry-After`, `retry-after-ms`, `x-ratelimit-reset-*`), or for `open_for` when it
    /// announced none (OpenAI's `insufficient_quota` never does). Then the circuit goes
    /// half-open as usual. A quota open does not advance the reopen backoff. Off by
    /// default: the answer is neutral.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome, Reason, Rejection};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let account = Breaker::builder().quota_gate(Duration::from_secs(60)).build().unwrap();
    /// account.admit().unwrap().record(Outcome::QuotaExhausted);
    /// let open = account.admit().unwrap_err();
    /// assert_eq!(open.reason(), Rejection::Quota);
    /// assert_eq!(open.retry_after(), Some(Duration::from_secs(60)));
    /// assert_eq!(account.snapshot().reason, Some(Reason::QuotaExhausted));
    /// # }
    /// ```
    #[must_use]
    pub fn quota_gate(mut self, open_for: Duration) -> Self {
        self.config.quota_gate = Some(open_for);
        self
    }

    /// Pacing on known rate limits: after a
    /// [`RateLimited`](crate::Outcome::RateLimited) answer that said when to
    /// come back (`Retry-After`), or an answer whose `x-ratelimit-remaining-*`
    /// count is `0` with its `x-ratelimit-reset-*` time, calls on this
    /// circuit (this key's) are rejected locally with
    /// [`Rejection::RateLimited`](crate::Rejection::RateLimited) until then, so
    /// no call is spent to hear "429" again. The circuit stays closed: pacing
    /// is no failure and no window entry.
    ///
    /// How the headers combine: on one answer, `Retry-After` (or
    /// `retry-after-ms`) wins, because the `x-ratelimit-reset-*` headers give
    /// the time to a *full* reset, which over-throttles; the reset of a limit
    /// whose remaining count is `0` is used only when there is no
    /// `Retry-After`. Across answers the later moment holds. A closed and a
    /// half-open circuit pace (an open one rejects anyway): until the reset,
    /// no half-open probe goes out, so at most the probes already in flight
    /// hear "429" again. Off by default; on, it costs a closed admission one
    /// atomic load.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome, Rejection};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let key = Breaker::builder().pace_rate_limits(true).build().unwrap();
    /// key.admit().unwrap().record(Outcome::RateLimited { retry_after: Some(Duration::from_secs(5)) });
    /// assert_eq!(key.admit().unwrap_err().reason(), Rejection::RateLimited);
    /// tokio::time::advance(Duration::from_secs(5)).await;
    /// assert!(key.admit().is_ok());
    /// # }
    /// ```
    #[must_use]
    pub fn pace_rate_limits(mut self, on: bool) -> Self {
        self.config.pace = on;
        self
    }

    /// The longest one announced wait (`Retry-After`, `retry-after-ms`,
    /// `x-ratelimit-reset-*`) holds this circuit, paced
    /// ([`pace_rate_limits`](Self::pace_rate_limits)) or quota-gated
    /// ([`quota_gate`](Self::quota_gate)): an answer asking longer holds it
    /// for `max`, and the first call after that asks the upstream again.
    /// Default 7 days ([`MAX_RETRY_AFTER`](crate::classify::MAX_RETRY_AFTER),
    /// beyond which a header is not believed at all), so a setting above it
    /// changes nothing. Zero is a [`ConfigError`](crate::ConfigError).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let key = Breaker::builder()
    ///     .pace_rate_limits(true)
    ///     .max_rate_limit_wait(Duration::from_secs(300))
    ///     .build()
    ///     .unwrap();
    /// // `429 Retry-After: 604800` gates the key for 5 minutes, not a week.
    /// key.admit().unwrap().record(Outcome::RateLimited { retry_after: Some(Duration::from_secs(604_800)) });
    /// assert_eq!(key.admit().unwrap_err().retry_after(), Some(Duration::from_secs(300)));
    /// tokio::time::advance(Duration::from_secs(300)).await;
    /// assert!(key.admit().is_ok());
    /// # }
    /// ```
    #[must_use]
    pub fn max_rate_limit_wait(mut self, max: Duration) -> Self {
        self.config.max_rate_limit_wait = max;
        self
    }

    /// The in-flight limit for calls without a fallback (on by default,
    /// with [`InFlightLimit::default`]): unbounded at the start, it falls
    /// only on overload signals (attempt timeouts, 429s, 503s), each only
    /// while its rate grows with the calls in flight, and grows back
    /// additively once they stop (AIMD). Calls beyond it are rejected with
    /// [`Rejection::InFlightLimit`](crate::Rejection::InFlightLimit). With it on, the slow-call rule
    /// looks only at calls with a fallback
    /// ([`Breaker::admit_with_fallback`](crate::Breaker::admit_with_fallback), or a request marked
    /// as having one): a slow answer within the caller's deadline is an
    /// answer. A calm circuit pays one flag load per admission for it. See
    /// [`InFlightLimit`] for the rule.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, InFlightLimit};
    /// let breaker = Breaker::builder().in_flight_limit(InFlightLimit::new().decrease(0.5)).build().unwrap();
    /// assert_eq!(breaker.in_flight_limit(), None);
    /// ```
    #[must_use]
    pub fn in_flight_limit(mut self, limit: InFlightLimit) -> Self {
        self.config.in_flight_limit = Some(limit);
        self
    }

    /// Turns the in-flight limit off: the slow-call rule then looks at
    /// every call, with a fallback or not, as before the limit existed.
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().no_in_flight_limit().build().unwrap();
    /// assert_eq!(breaker.in_flight_limit(), None);
    /// ```
    #[must_use]
    pub fn no_in_flight_limit(mut self) -> Self {
        self.config.in_flight_limit = None;
        self
    }

    /// The ramp after half-open: when probes close the circuit, calls with
    /// a fallback are admitted with a share rising linearly from 0 to 1 over
    /// `period`, the rest rejected with [`Rejection::Ramp`](crate::Rejection::Ramp) so they go to
    /// their fallback at once; calls without one ramp through the in-flight
    /// limit. A trip rule firing during the ramp reopens the circuit at once.
    /// Default 10 s; `Duration::ZERO` turns it off. At most a week.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome, Rejection, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .trip_mode(TripMode::Open)
    ///     .consecutive_failures(1)
    ///     .probes(1)
    ///     .close_after(1)
    ///     .jitter(0.0)
    ///     .ramp(Duration::from_secs(10))
    ///     .build()
    ///     .unwrap();
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// tokio::time::advance(Duration::from_secs(30)).await;
    /// breaker.admit().unwrap().record(Outcome::Success); // the probe closes it
    /// assert_eq!(breaker.state(), State::Closed);
    /// // At the start of the ramp, a call with a fallback goes there.
    /// assert_eq!(breaker.admit_with_fallback().unwrap_err().reason(), Rejection::Ramp);
    /// // One without a fallback is admitted.
    /// assert!(breaker.admit().is_ok());
    /// tokio::time::advance(Duration::from_secs(10)).await;
    /// assert!(breaker.admit_with_fallback().is_ok());
    /// # }
    /// ```
    #[must_use]
    pub fn ramp(mut self, period: Duration) -> Self {
        self.config.ramp = period;
        self
    }

    /// What a trip rule that fires does. [`TripMode::Graded`]: a call with a fallback (see [`HasFallback`](crate::HasFallback))
    /// is rejected outright and opens the circuit, as before; a call without
    /// one meets graded admission, rejected with probability
    /// `max(0, (requests − K·accepts) / (requests + 1))` over the graded
    /// window (see [`graded_k`](Self::graded_k) and
    /// [`graded_window`](Self::graded_window)), with its own reason
    /// [`Rejection::Graded`](crate::Rejection::Graded), while the state stays
    /// [`State::Closed`](crate::State::Closed) and
    /// [`Snapshot::shed`](crate::Snapshot::shed) shows what it sheds.
    /// Grading ends once the rules no longer fire and the window would
    /// reject nothing; the circuit opens for every call once the window's
    /// accepts are (nearly) zero: fewer than 1 in 100 requests, with at
    /// least 10 requests in it; at once when the rule fires on an upstream
    /// that answered and then failed every call since (every failure the
    /// rule saw is in the current streak, after all its accepts, an order
    /// with odds under 1 in 10,000 for an upstream that did not change:
    /// 10 accepts then 10 failures); or once 20 calls in a row have failed
    /// before any graded call succeeded (the window still holds the
    /// accepts from before the upstream died, the streak does not). Graded
    /// is the default. [`TripMode::Open`] is
    /// all-or-nothing opening for every call, the classical breaker.
    ///
    /// The counts are this process's own: with the Redis backend, the open
    /// circuit is shared but graded admission is local to each replica.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Outcome, Rejection, State, TripMode};
    ///
    /// let graded = Breaker::builder().consecutive_failures(2).trip_mode(TripMode::Graded).build().unwrap();
    /// let open = Breaker::builder().trip_mode(TripMode::Open).consecutive_failures(2).build().unwrap();
    /// for b in [&graded, &open] {
    ///     b.admit().unwrap().record(Outcome::Failure);
    ///     b.admit().unwrap().record(Outcome::Failure);
    /// }
    /// assert_eq!(graded.state(), State::Closed, "grading, not open");
    /// assert_eq!(open.admit().unwrap_err().reason(), Rejection::Open);
    /// // A call with a fallback opens the grading circuit and goes elsewhere.
    /// assert_eq!(graded.admit_with_fallback().unwrap_err().reason(), Rejection::Open);
    /// assert_eq!(graded.state(), State::Open);
    /// ```
    #[must_use]
    pub fn trip_mode(mut self, mode: TripMode) -> Self {
        self.config.trip_mode = mode;
        self
    }

    /// Graded admission's `K`: how many requests per accept the upstream is
    /// sent before calls are shed. With failures that do not depend on load
    /// and a success share `s`, nearly every call is admitted when `K·s` is
    /// well above 1, and calls are shed to a trickle when it is below.
    /// Between 2.5 and 10 (exclusive); `build()` refuses anything else with
    /// [`ConfigError::GradedK`](crate::ConfigError::GradedK). Default 5,
    /// chosen by replaying every shipped scenario over 11 seeds with K = 2.5,
    /// 3, 4, 5, 7 and 9.9: 5 answers the most summed over the breaker rows,
    /// more than 4 where they differ (stalled streams, brownout) and fewer
    /// nowhere, at a wasted cost still below no breaker's; above 5 the
    /// overload scenario loses answers. Medians over 11 seeds, answers
    /// within the deadline relative to no breaker (wasted $), for the
    /// scenarios where the columns differ:
    ///
    /// | scenario | no breaker | all or nothing | graded, K = 4 | graded, K = 5 |
    /// |---|---|---|---|---|
    /// | 503-storm-retry-budget | 1.000 ($0.00) | 0.745 ($0.00) | 1.000 ($0.00) | 1.000 ($0.00) |
    /// | all-open-last-resort | 1.000 ($0.00) | 0.959 ($0.00) | 0.919 ($0.00) | 0.919 ($0.00) |
    /// | brownout-ramp | 1.000 ($3.02) | 0.820 ($0.67) | 0.959 ($2.54) | 0.969 ($2.72) |
    /// | partial-outage-keyed | 1.000 ($6.30) | 0.852 ($3.30) | 0.988 ($6.22) | 0.988 ($6.22) |
    /// | recovery-after-a-long-outage | 1.000 ($40.71) | 0.974 ($0.14) | 0.658 ($0.12) | 0.658 ($0.12) |
    /// | regional-outage-keyed | 1.000 ($16.74) | 0.984 ($0.78) | 0.983 ($1.12) | 0.983 ($1.24) |
    /// | replicas-shared-breaker | 1.000 ($0.00) | 0.618 ($0.00) | 0.575 ($0.00) | 0.575 ($0.00) |
    /// | retry-overload-metastable | 1.000 ($61.25) | 5.859 ($0.36) | 6.068 ($0.67) | 6.089 ($0.73) |
    /// | runaway-retry-loop | 1.000 ($0.00) | 0.539 ($0.00) | 0.539 ($0.00) | 0.539 ($0.00) |
    /// | seed-000-night | 1.000 ($78.06) | 0.371 ($0.26) | 0.359 ($0.74) | 0.359 ($0.87) |
    /// | seed-000-night-slow | 1.000 ($78.06) | 0.506 ($0.26) | 0.433 ($0.75) | 0.433 ($0.87) |
    /// | seed-000-writeup | 1.000 ($27.66) | 0.862 ($0.36) | 0.862 ($0.36) | 0.862 ($0.36) |
    /// | seed-002-failover | 1.000 ($404.28) | 0.503 ($0.42) | 0.911 ($0.39) | 0.911 ($0.39) |
    /// | seed-002-writeup | 1.000 ($0.00) | 0.895 ($0.00) | 0.894 ($0.00) | 0.894 ($0.00) |
    /// | sse-midstream-overload | 1.000 ($6.47) | 0.779 ($1.76) | 1.000 ($6.47) | 1.000 ($6.47) |
    /// | stalled-streams | 1.000 ($4.85) | 0.785 ($0.75) | 0.843 ($1.73) | 0.954 ($3.92) |
    ///
    /// Printed by `cargo run --release --example outage_replay -- --seeds 11
    /// --graded-k 5 scenarios/NAME.toml` (rows `no-breaker`, `breaker-open`,
    /// `breaker`: `answers_vs_no_breaker` and `wasted_cost_usd`; the K = 4
    /// column by `--graded-k 4`); `scenarios/README.md` has every scenario.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, ConfigError};
    ///
    /// assert!(Breaker::builder().graded_k(4.0).build().is_ok());
    /// assert_eq!(Breaker::builder().graded_k(2.0).build().unwrap_err(), ConfigError::GradedK(2.0));
    /// assert!(Breaker::builder().graded_k(10.0).build().is_err());
    /// ```
    #[must_use]
    pub fn graded_k(mut self, k: f64) -> Self {
        self.config.graded_k = k;
        self
    }

    /// The window graded admission counts requests and accepts over, for
    /// a breaker whose rules have no time window of their own (a count
    /// window, or `consecutive_failures` alone); with a time window, its
    /// span. Default 30 s; zero is a
    /// [`ConfigError::ZeroGradedWindow`](crate::ConfigError::ZeroGradedWindow).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// assert!(Breaker::builder().graded_window(Duration::from_secs(10)).build().is_ok());
    /// assert!(Breaker::builder().graded_window(Duration::ZERO).build().is_err());
    /// ```
    #[must_use]
    pub fn graded_window(mut self, window: Duration) -> Self {
        self.config.graded_window = window;
        self
    }

    /// Seeds the jitter, for runs that must repeat exactly.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// Calls `listener` after every state change.
    #[must_use]
    pub fn on_transition(mut self, listener: impl Fn(&Transition) + Send + Sync + 'static) -> Self {
        self.config.listeners.push(Arc::new(listener));
        self
    }

    /// How many threads get a counter stripe of their own (four cache lines
    /// each, counted without atomic read-modify-writes); later threads share
    /// one more stripe. More saves time when many threads call through one
    /// breaker; fewer saves memory when there are many breakers. Default 16.
    /// Keyed breakers start with the shared stripe alone and get theirs (at
    /// most one per CPU) once a key has admitted 1,024 calls. At most 1,024.
    #[must_use]
    pub fn counter_stripes(mut self, stripes: usize) -> Self {
        self.config.counter_stripes = stripes;
        self
    }
}
