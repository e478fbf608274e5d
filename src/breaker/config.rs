//! Breaker configuration, its builder and its validation.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::state::Transition;
use super::Breaker;

/// Which calls the rate rules look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Window {
    /// No window: the failure-rate and slow-call-rate rules are off.
    None,
    /// The last `n` recorded calls.
    Count(u32),
    /// The calls recorded in the last `span`, kept in `buckets` buckets, so
    /// the window is exact to one bucket (`span / buckets`).
    Time {
        /// How far back the window reaches.
        span: Duration,
        /// How many buckets the span is cut into.
        buckets: u32,
    },
}

pub(crate) type Listener = Arc<dyn Fn(&Transition) + Send + Sync>;
pub(crate) type Override = Arc<dyn Fn(Builder<Breaker>) -> Builder<Breaker> + Send + Sync>;

/// A validated breaker configuration.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) name: Option<Arc<str>>,
    pub(crate) window: Window,
    pub(crate) min_calls: u32,
    pub(crate) failure_rate: Option<f64>,
    pub(crate) consecutive_failures: Option<u32>,
    pub(crate) slow_call: Option<(Duration, f64)>,
    pub(crate) open: Duration,
    /// The reopen backoff's cap; `None`: [`DEFAULT_CAP_MULTIPLE`] times
    /// the open duration.
    pub(crate) open_max: Option<Duration>,
    pub(crate) backoff_multiplier: f64,
    pub(crate) jitter: f64,
    pub(crate) probes: u32,
    pub(crate) close_after: u32,
    pub(crate) probe_lease: Option<Duration>,
    pub(crate) probe_timeout: Option<Duration>,
    pub(crate) metrics_only: bool,
    pub(crate) volume_guard: Option<(u32, Duration)>,
    pub(crate) seed: Option<u64>,
    pub(crate) counter_stripes: usize,
    /// Owned counter stripes only once the breaker is busy (keyed breakers).
    pub(crate) stripes_when_busy: bool,
    pub(crate) listeners: Vec<Listener>,
    pub(crate) max_keys: usize,
    pub(crate) idle_timeout: Duration,
    pub(crate) key_overrides: Vec<(Box<str>, Override)>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("name", &self.name)
            .field("window", &self.window)
            .field("min_calls", &self.min_calls)
            .field("failure_rate", &self.failure_rate)
            .field("consecutive_failures", &self.consecutive_failures)
            .field("slow_call", &self.slow_call)
            .field("open", &self.open)
            .field("open_max", &self.open_max)
            .field("backoff_multiplier", &self.backoff_multiplier)
            .field("jitter", &self.jitter)
            .field("probes", &self.probes)
            .field("close_after", &self.close_after)
            .field("probe_lease", &self.probe_lease)
            .field("probe_timeout", &self.probe_timeout)
            .field("metrics_only", &self.metrics_only)
            .field("volume_guard", &self.volume_guard)
            .field("listeners", &self.listeners.len())
            .field("max_keys", &self.max_keys)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: None,
            window: Window::Count(20),
            min_calls: 20,
            failure_rate: Some(0.5),
            consecutive_failures: None,
            slow_call: None,
            open: Duration::from_secs(30),
            open_max: None,
            backoff_multiplier: 2.0,
            jitter: 0.1,
            probes: 3,
            close_after: 2,
            probe_lease: None,
            probe_timeout: None,
            metrics_only: false,
            volume_guard: None,
            seed: None,
            counter_stripes: 16,
            stripes_when_busy: false,
            listeners: Vec::new(),
            max_keys: 10_000,
            idle_timeout: Duration::from_secs(600),
            key_overrides: Vec::new(),
        }
    }
}

impl Config {
    /// How long a half-open probe's slot is held at most: its lease, or
    /// else its deadline.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lease(&self) -> Duration {
        self.probe_lease.unwrap_or_else(|| self.probe_deadline())
    }

    /// A half-open probe whose response head has not come by then is a
    /// failed probe: the probe timeout, or the slow-call threshold when that
    /// is shorter (or no timeout is set), or else the base open duration.
    pub(crate) fn probe_deadline(&self) -> Duration {
        match (self.probe_timeout, self.slow_call) {
            (Some(t), Some((slow, _))) => t.min(slow),
            (Some(t), None) => t,
            (None, Some((slow, _))) => slow,
            (None, None) => self.open,
        }
    }

    /// The cap of the reopen backoff.
    pub(crate) fn open_max(&self) -> Duration {
        self.open_max.unwrap_or_else(|| {
            self.open
                .saturating_mul(DEFAULT_CAP_MULTIPLE)
                .min(MAX_DURATION.max(self.open))
        })
    }

    pub(crate) fn has_rate_rule(&self) -> bool {
        !matches!(self.window, Window::None)
            && (self.failure_rate.is_some() || self.slow_call.is_some())
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        use ConfigError as E;
        fn rate_ok(r: f64) -> bool {
            r > 0.0 && r <= 1.0
        }
        if self.open.is_zero() {
            return Err(E::ZeroOpenDuration);
        }
        let too_long = |setting, d: Duration| {
            (d > MAX_DURATION).then_some(E::TooLong {
                setting,
                max: MAX_DURATION,
            })
        };
        let too_many = |setting, n: u64, max: u64| (n > max).then_some(E::TooMany { setting, max });
        if let Some(e) = too_long("open_duration", self.open)
            .or_else(|| self.open_max.and_then(|m| too_long("max_open_duration", m)))
            .or_else(|| {
                self.probe_timeout
                    .and_then(|t| too_long("probe_timeout", t))
            })
            .or_else(|| too_many("probes", self.probes.into(), MAX_PROBES.into()))
            .or_else(|| too_many("min_calls", self.min_calls.into(), MAX_COUNT_WINDOW.into()))
            .or_else(|| {
                self.consecutive_failures.and_then(|n| {
                    too_many("consecutive_failures", n.into(), MAX_COUNT_WINDOW.into())
                })
            })
            .or_else(|| {
                too_many(
                    "counter_stripes",
                    self.counter_stripes as u64,
                    MAX_COUNTER_STRIPES as u64,
                )
            })
        {
            return Err(e);
        }
        if self.open_max() < self.open {
            return Err(E::OpenMaxBelowOpen {
                open: self.open,
                open_max: self.open_max(),
            });
        }
        if !(self.backoff_multiplier >= 1.0 && self.backoff_multiplier.is_finite()) {
            return Err(E::BackoffMultiplier(self.backoff_multiplier));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(E::Jitter(self.jitter));
        }
        if self.probes == 0 {
            return Err(E::ZeroProbes);
        }
        if self.close_after == 0 || self.close_after > self.probes {
            return Err(E::CloseAfter {
                close_after: self.close_after,
                probes: self.probes,
            });
        }
        if self.probe_timeout.is_some_and(|t| t.is_zero()) {
            return Err(E::ZeroProbeTimeout);
        }
        if let Some(lease) = self.probe_lease {
            if lease.is_zero() {
                return Err(E::ZeroProbeLease);
            }
            if lease < self.probe_deadline() {
                return Err(E::LeaseBelowProbeTimeout {
                    lease,
                    probe_timeout: self.probe_deadline(),
                });
            }
        }
        if let Some(rate) = self.failure_rate {
            if !rate_ok(rate) {
                return Err(E::Rate {
                    rule: "failure_rate",
                    value: rate,
                });
            }
        }
        if let Some((threshold, rate)) = self.slow_call {
            if threshold.is_zero() {
                return Err(E::ZeroSlowThreshold);
            }
            if !rate_ok(rate) {
                return Err(E::Rate {
                    rule: "slow_call_rate",
                    value: rate,
                });
            }
        }
        if let Some((limit, period)) = self.volume_guard {
            if limit == 0 || period.is_zero() {
                return Err(E::VolumeGuard);
            }
        }
        if self.max_keys == 0 || self.idle_timeout.is_zero() {
            return Err(E::KeyBounds);
        }
        if self.consecutive_failures == Some(0) {
            return Err(E::ZeroConsecutiveFailures);
        }
        match self.window {
            Window::None => {}
            Window::Count(n) => {
                if n == 0 {
                    return Err(E::EmptyWindow);
                }
                if n > MAX_COUNT_WINDOW {
                    return Err(E::WindowTooLarge(n));
                }
                if self.min_calls > n {
                    return Err(E::MinCallsAboveWindow {
                        min_calls: self.min_calls,
                        window: n,
                    });
                }
            }
            Window::Time { span, buckets } => {
                if span.is_zero() || buckets == 0 {
                    return Err(E::EmptyWindow);
                }
                if buckets > MAX_BUCKETS || span < Duration::from_nanos(buckets.into()) {
                    return Err(E::TooManyBuckets(buckets));
                }
            }
        }
        Ok(())
    }
}

/// The largest count window accepted; also the most `min_calls` and
/// `consecutive_failures` may ask for.
pub(crate) const MAX_COUNT_WINDOW: u32 = 1 << 20;
/// The longest open duration, backoff cap or probe timeout accepted: a week.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most probes one half-open cycle may admit.
pub(crate) const MAX_PROBES: u32 = 1 << 16;
/// The most counter stripes a breaker may have (each is 128 bytes).
pub(crate) const MAX_COUNTER_STRIPES: usize = 1024;
/// With no cap set, the reopen backoff stops at this many open durations.
pub(crate) const DEFAULT_CAP_MULTIPLE: u32 = 10;
/// The most buckets a time window may have.
pub(crate) const MAX_BUCKETS: u32 = 4096;

/// A configuration that [`Builder::build`] refused.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The open duration is zero, so the circuit could never stay open.
    ZeroOpenDuration,
    /// The cap of the reopen backoff is below the base open duration.
    OpenMaxBelowOpen {
        /// The base open duration.
        open: Duration,
        /// The cap.
        open_max: Duration,
    },
    /// The backoff multiplier is below 1 or not finite.
    BackoffMultiplier(f64),
    /// The jitter fraction is outside `[0, 1)`.
    Jitter(f64),
    /// Half-open admits no probe, so the circuit could never close.
    ZeroProbes,
    /// `close_after` is zero or larger than `probes`.
    CloseAfter {
        /// Successes needed to close.
        close_after: u32,
        /// Probes admitted per half-open cycle.
        probes: u32,
    },
    /// The probe lease is zero.
    ZeroProbeLease,
    /// The probe timeout is zero.
    ZeroProbeTimeout,
    /// The probe lease is shorter than the probe deadline, so a probe's
    /// verdict could be lost.
    LeaseBelowProbeTimeout {
        /// The lease.
        lease: Duration,
        /// The probe deadline (the probe timeout, or the slow-call threshold).
        probe_timeout: Duration,
    },
    /// A duration setting above its upper bound (a week), at which the
    /// circuit could not complete a cycle in any useful time.
    TooLong {
        /// Which setting.
        setting: &'static str,
        /// Its upper bound.
        max: Duration,
    },
    /// A count setting above its upper bound.
    TooMany {
        /// Which setting.
        setting: &'static str,
        /// Its upper bound.
        max: u64,
    },
    /// A rate threshold is outside `(0, 1]`.
    Rate {
        /// Which rule.
        rule: &'static str,
        /// The value given.
        value: f64,
    },
    /// The slow-call threshold is zero.
    ZeroSlowThreshold,
    /// The consecutive-failure rule asks for zero failures.
    ZeroConsecutiveFailures,
    /// A window of zero calls, zero span or zero buckets.
    EmptyWindow,
    /// A count window larger than 2^20 calls.
    WindowTooLarge(u32),
    /// More than 4096 buckets, or buckets shorter than a nanosecond.
    TooManyBuckets(u32),
    /// `min_calls` is larger than the count window, so the rate rules could
    /// never fire.
    MinCallsAboveWindow {
        /// The minimum number of calls.
        min_calls: u32,
        /// The count window.
        window: u32,
    },
    /// The volume guard allows zero calls or has a zero period.
    VolumeGuard,
    /// Keyed breakers with room for no key, or a zero idle timeout.
    KeyBounds,
    /// A stack's pieces do not fit together.
    Stack(&'static str),
    /// A health prober's settings are unusable.
    HealthProbe(&'static str),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroOpenDuration => f.write_str("open duration must be greater than zero"),
            ConfigError::OpenMaxBelowOpen { open, open_max } => write!(
                f,
                "backoff cap {open_max:?} is below the base open duration {open:?}"
            ),
            ConfigError::BackoffMultiplier(m) => {
                write!(
                    f,
                    "backoff multiplier must be a finite number >= 1, got {m}"
                )
            }
            ConfigError::Jitter(j) => write!(f, "jitter must be in [0, 1), got {j}"),
            ConfigError::ZeroProbes => f.write_str("half-open must admit at least one probe"),
            ConfigError::CloseAfter {
                close_after,
                probes,
            } => write!(
                f,
                "close_after must be between 1 and probes ({probes}), got {close_after}"
            ),
            ConfigError::ZeroProbeLease => f.write_str("probe lease must be greater than zero"),
            ConfigError::ZeroProbeTimeout => f.write_str("probe timeout must be greater than zero"),
            ConfigError::LeaseBelowProbeTimeout {
                lease,
                probe_timeout,
            } => write!(
                f,
                "probe lease {lease:?} is shorter than the probe deadline {probe_timeout:?}"
            ),
            ConfigError::TooLong { setting, max } => {
                write!(f, "{setting} is longer than its upper bound {max:?}")
            }
            ConfigError::TooMany { setting, max } => {
                write!(f, "{setting} is above its upper bound {max}")
            }
            ConfigError::Rate { rule, value } => {
                write!(f, "{rule} must be in (0, 1], got {value}")
            }
            ConfigError::ZeroSlowThreshold => {
                f.write_str("slow-call threshold must be greater than zero")
            }
            ConfigError::ZeroConsecutiveFailures => {
                f.write_str("consecutive failures must be at least 1")
            }
            ConfigError::EmptyWindow => f.write_str("window must hold at least one call or bucket"),
            ConfigError::WindowTooLarge(n) => {
                write!(f, "count window of {n} calls exceeds {MAX_COUNT_WINDOW}")
            }
            ConfigError::TooManyBuckets(n) => write!(
                f,
                "time window of {n} buckets: at most {MAX_BUCKETS}, each at least 1ns"
            ),
            ConfigError::MinCallsAboveWindow { min_calls, window } => write!(
                f,
                "min_calls ({min_calls}) is larger than the count window ({window})"
            ),
            ConfigError::VolumeGuard => {
                f.write_str("volume guard needs a limit of at least 1 and a non-zero period")
            }
            ConfigError::KeyBounds => {
                f.write_str("keyed breakers need max_keys >= 1 and a non-zero idle timeout")
            }
            ConfigError::Stack(why) => write!(f, "stack does not fit: {why}"),
            ConfigError::HealthProbe(why) => write!(f, "health probe: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Builds a [`Breaker`] (or, through
/// [`CircuitBreakerLayer::builder`](crate::CircuitBreakerLayer::builder), a
/// layer) from a validated configuration.
///
/// Defaults follow the numbers of a typical LLM outage: a count window of 20
/// calls, a 50 % failure rate once 20 calls are seen, 30 s open, reopen
/// backoff doubling up to ten open durations (300 s) with 10 % jitter, 3
/// probes and 2 successes to close, each probe failed if its response head
/// has not come within the open duration.
///
/// # Upper bounds
///
/// Settings at which a circuit could not trip, half-open and close in any
/// useful time are [`ConfigError`]s: `open_duration`, `max_open_duration`
/// and `probe_timeout` above a week; `probes` above 65,536; a count window,
/// `min_calls` or `consecutive_failures` above 2^20; `counter_stripes` above
/// 1,024. Durations that mean "never" (a probe lease, a slow-call threshold,
/// a volume-guard period) saturate instead.
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
pub struct Builder<T = Breaker> {
    pub(crate) config: Config,
    _target: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("config", &self.config)
            .finish()
    }
}

impl<T> Clone for Builder<T> {
    fn clone(&self) -> Self {
        Builder {
            config: self.config.clone(),
            _target: PhantomData,
        }
    }
}

impl<T> Default for Builder<T> {
    fn default() -> Self {
        Builder {
            config: Config::default(),
            _target: PhantomData,
        }
    }
}

/// What a [`Builder`] can build: a [`Breaker`], a
/// [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) or
/// [`KeyedBreakers`](crate::keyed::KeyedBreakers).
pub trait Build: sealed::Sealed + Sized {
    /// Builds from a validated configuration.
    #[doc(hidden)]
    fn build_from(builder: Builder<Self>) -> Result<Self, ConfigError>;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

impl sealed::Sealed for Breaker {}

impl Build for Breaker {
    fn build_from(builder: Builder<Self>) -> Result<Self, ConfigError> {
        builder.config.validate()?;
        Ok(Breaker::from_config(builder.config))
    }
}

impl<T: Build> Builder<T> {
    /// Validates the configuration and builds.
    pub fn build(self) -> Result<T, ConfigError> {
        T::build_from(self)
    }

    /// The same settings, building something else (a [`Breaker`] from a
    /// layer's builder, say).
    pub fn into_builder<U: Build>(self) -> Builder<U> {
        Builder {
            config: self.config,
            _target: PhantomData,
        }
    }
}

impl<T> Builder<T> {
    pub(crate) fn with_config(config: Config) -> Self {
        Builder {
            config,
            _target: PhantomData,
        }
    }

    /// A builder with the default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the breaker; the name appears in events, snapshots and
    /// [`CircuitOpen`](crate::CircuitOpen).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// Rate rules look at the last `calls` recorded calls.
    pub fn count_window(mut self, calls: u32) -> Self {
        self.config.window = Window::Count(calls);
        self
    }

    /// Rate rules look at the calls recorded in the last `span`, kept in
    /// `buckets` buckets (exact to `span / buckets`).
    pub fn time_window(mut self, span: Duration, buckets: u32) -> Self {
        self.config.window = Window::Time { span, buckets };
        self
    }

    /// Turns the window off, and with it the failure-rate and slow-call-rate
    /// rules.
    pub fn no_window(mut self) -> Self {
        self.config.window = Window::None;
        self
    }

    /// Sets the window.
    pub fn window(mut self, window: Window) -> Self {
        self.config.window = window;
        self
    }

    /// The rate rules fire only once the window holds at least this many
    /// calls.
    pub fn min_calls(mut self, calls: u32) -> Self {
        self.config.min_calls = calls;
        self
    }

    /// Opens when failures reach this fraction of the window's calls.
    pub fn failure_rate(mut self, rate: f64) -> Self {
        self.config.failure_rate = Some(rate);
        self
    }

    /// Turns the failure-rate rule off (the window may still serve the
    /// slow-call rule).
    pub fn no_failure_rate(mut self) -> Self {
        self.config.failure_rate = None;
        self
    }

    /// Opens after `n` failures in a row. Ignored and rate-limited outcomes
    /// neither count nor break the streak.
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.config.consecutive_failures = Some(n);
        self
    }

    /// Opens when calls slower than `threshold` (time to response head) reach
    /// `rate` of the window. A call still in flight is counted as slow as soon
    /// as it crosses the threshold, so a hanging upstream trips the circuit
    /// long before its timeouts come back. In half-open, a slow probe is a
    /// failed probe.
    pub fn slow_call(mut self, threshold: Duration, rate: f64) -> Self {
        self.config.slow_call = Some((threshold, rate));
        self
    }

    /// How long the circuit stays open after it trips (before jitter).
    pub fn open_duration(mut self, open: Duration) -> Self {
        self.config.open = open;
        self
    }

    /// The cap of the reopen backoff. Unset, it is ten open durations, so
    /// setting only [`open_duration`](Self::open_duration) always builds.
    pub fn max_open_duration(mut self, open_max: Duration) -> Self {
        self.config.open_max = Some(open_max);
        self
    }

    /// Each reopen from half-open multiplies the open duration by this factor,
    /// up to the cap. Default 2.
    pub fn backoff_multiplier(mut self, multiplier: f64) -> Self {
        self.config.backoff_multiplier = multiplier;
        self
    }

    /// Each open duration is shortened by a random fraction of up to `jitter`
    /// of itself, so replicas don't probe in lockstep. Default 0.1; 0 turns it
    /// off.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.config.jitter = jitter;
        self
    }

    /// How many probe calls one half-open cycle admits.
    pub fn probes(mut self, probes: u32) -> Self {
        self.config.probes = probes;
        self
    }

    /// How many probe successes close the circuit.
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
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.config.probe_timeout = Some(timeout);
        self
    }

    /// A probe still unfinished after this long (its head came in time, its
    /// body is still streaming) gives its slot back without a verdict, and
    /// its late outcome is dropped. Unset by default: a probe holds its slot
    /// until it finishes. May not be shorter than the probe deadline (see
    /// [`probe_timeout`](Self::probe_timeout)); `Duration::MAX` means never.
    pub fn probe_lease(mut self, lease: Duration) -> Self {
        self.config.probe_lease = Some(lease);
        self
    }

    /// Shadow mode: the breaker records and reports every transition it would
    /// make, but never rejects a call.
    pub fn metrics_only(mut self, on: bool) -> Self {
        self.config.metrics_only = on;
        self
    }

    /// The volume guard: while `limit` calls have been admitted within the
    /// last `period`, further calls are rejected (with
    /// [`Rejection::VolumeGuard`](crate::error::Rejection::VolumeGuard)), whatever the
    /// upstream's health. A runaway retry loop against a healthy upstream is
    /// an incident too. Needs no failure rule; no half-open cycle is
    /// involved. Exact to a sixteenth of `period`.
    pub fn volume_guard(mut self, limit: u32, period: Duration) -> Self {
        self.config.volume_guard = Some((limit, period));
        self
    }

    /// Seeds the jitter, for runs that must repeat exactly.
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// Calls `listener` after every state change.
    pub fn on_transition(mut self, listener: impl Fn(&Transition) + Send + Sync + 'static) -> Self {
        self.config.listeners.push(Arc::new(listener));
        self
    }

    /// How many threads get a counter stripe of their own (two cache lines
    /// each, counted without atomic read-modify-writes); later threads share
    /// one more stripe. More saves time when many threads call through one
    /// breaker; fewer saves memory when there are many breakers. Default 16.
    /// Keyed breakers start with the shared stripe alone and get theirs (at
    /// most one per CPU) once a key has admitted 1,024 calls. At most 1,024.
    pub fn counter_stripes(mut self, stripes: usize) -> Self {
        self.config.counter_stripes = stripes;
        self
    }
}
