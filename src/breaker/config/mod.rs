//! Breaker configuration, its builder and its validation.

mod build;
mod builder;
mod error;
mod shedding;
mod spending;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::observe::Observer;
use super::state::Transition;

pub(crate) use self::build::sealed;
pub use self::build::Build;
pub use self::builder::Builder;
pub use self::error::ConfigError;
pub use self::shedding::{InFlightLimit, TripMode};
pub use self::spending::SpendGuard;

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
    /// Quota gating: how long a quota answer that announced no reset opens
    /// the circuit.
    pub(crate) quota_gate: Option<Duration>,
    /// Pacing on known rate limits.
    pub(crate) pace: bool,
    /// The longest an announced wait paces or quota-gates the circuit.
    pub(crate) max_rate_limit_wait: Duration,
    /// The in-flight limit for calls without a fallback.
    pub(crate) in_flight_limit: Option<InFlightLimit>,
    /// The ramp after half-open; zero for none.
    pub(crate) ramp: Duration,
    pub(crate) seed: Option<u64>,
    pub(crate) trip_mode: TripMode,
    pub(crate) graded_k: f64,
    pub(crate) graded_window: Duration,
    pub(crate) counter_stripes: usize,
    /// Owned counter stripes only once the breaker is busy (keyed breakers).
    pub(crate) stripes_when_busy: bool,
    pub(crate) listeners: Vec<Listener>,
    /// Woken on every transition of every breaker built from this
    /// configuration (and its clones): a keyed set's, for the shared-state
    /// backend to hear of a local trip without scanning the set.
    pub(crate) any_change: Arc<tokio::sync::Notify>,
    /// Gives each breaker its observer (the `metrics` feature's).
    pub(crate) observer: Option<Observer>,
    pub(crate) spend: Option<SpendGuard>,
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
            .field("quota_gate", &self.quota_gate)
            .field("pace", &self.pace)
            .field("max_rate_limit_wait", &self.max_rate_limit_wait)
            .field("in_flight_limit", &self.in_flight_limit)
            .field("ramp", &self.ramp)
            .field("trip_mode", &self.trip_mode)
            .field("graded_k", &self.graded_k)
            .field("graded_window", &self.graded_window)
            .field("listeners", &self.listeners.len())
            .field("observer", &self.observer.is_some())
            .field("spend", &self.spend)
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
            quota_gate: None,
            pace: false,
            // `classify::MAX_RETRY_AFTER` is this bound too.
            max_rate_limit_wait: MAX_DURATION,
            in_flight_limit: Some(InFlightLimit::default()),
            ramp: DEFAULT_RAMP,
            seed: None,
            trip_mode: TripMode::default(),
            graded_k: DEFAULT_GRADED_K,
            graded_window: DEFAULT_GRADED_WINDOW,
            counter_stripes: 16,
            stripes_when_busy: false,
            listeners: Vec::new(),
            any_change: Arc::default(),
            observer: None,
            spend: None,
        }
    }
}

/// The rules a shared-state backend applies across replicas: the one view of
/// a breaker's settings it reads.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct SharedRules {
    /// The breaker's time window (span, buckets), if it has one.
    pub(crate) time_window: Option<(Duration, u32)>,
    /// Only when a window is configured.
    pub(crate) failure_rate: Option<f64>,
    /// Only when a window is configured.
    pub(crate) slow_call_rate: Option<f64>,
    pub(crate) open: Duration,
    pub(crate) open_max: Duration,
    pub(crate) backoff_multiplier: f64,
    pub(crate) jitter: f64,
    pub(crate) probes: u32,
    pub(crate) close_after: u32,
    /// How long a probe slot is held at most.
    pub(crate) lease: Duration,
}

impl Default for SharedRules {
    fn default() -> Self {
        Config::default().shared_rules()
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

    /// What a shared-state backend needs to apply the same rules across
    /// replicas, and nothing else.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn shared_rules(&self) -> SharedRules {
        let windowed = !matches!(self.window, Window::None);
        SharedRules {
            time_window: match self.window {
                Window::Time { span, buckets } => Some((span, buckets)),
                _ => None,
            },
            failure_rate: self.failure_rate.filter(|_| windowed),
            slow_call_rate: self.slow_call.filter(|_| windowed).map(|(_, r)| r),
            open: self.open,
            open_max: self.open_max(),
            backoff_multiplier: self.backoff_multiplier,
            jitter: self.jitter,
            probes: self.probes,
            close_after: self.close_after,
            lease: self.lease(),
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

    /// The graded-admission window, when a trip rule may fire and the trip
    /// mode is graded: a time window's span, otherwise its own setting.
    pub(crate) fn graded_window(&self) -> Option<Duration> {
        let rule = self.has_rate_rule() || self.consecutive_failures.is_some();
        (rule && self.trip_mode == TripMode::Graded).then_some(match self.window {
            Window::Time { span, .. } if self.has_rate_rule() => span,
            _ => self.graded_window,
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
            .or_else(|| self.quota_gate.and_then(|t| too_long("quota_gate", t)))
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
        if let Some(e) = too_long("ramp", self.ramp) {
            return Err(e);
        }
        if let Some(limit) = &self.in_flight_limit {
            limit.validate().map_err(E::InFlightLimit)?;
        }
        if !(MIN_GRADED_K..MAX_GRADED_K).contains(&self.graded_k) {
            return Err(E::GradedK(self.graded_k));
        }
        if self.graded_window.is_zero() {
            return Err(E::ZeroGradedWindow);
        }
        if let Some(e) = too_long("graded_window", self.graded_window) {
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
        if self.quota_gate.is_some_and(|t| t.is_zero()) {
            return Err(E::ZeroQuotaGate);
        }
        if self.max_rate_limit_wait.is_zero() {
            return Err(E::ZeroRateLimitWait);
        }
        spending::validate(self.spend.as_ref())?;
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
        if let Some(rate) = self.failure_rate
            && !rate_ok(rate)
        {
            return Err(E::Rate {
                rule: "failure_rate",
                value: rate,
            });
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
        if let Some((limit, period)) = self.volume_guard
            && (limit == 0 || period.is_zero())
        {
            return Err(E::VolumeGuard);
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
pub(crate) const DEFAULT_CAP_MULTIPLE: u32 = 2;
/// The ramp after half-open, unless configured.
pub(crate) const DEFAULT_RAMP: Duration = Duration::from_secs(10);
/// The most buckets a time window may have.
pub(crate) const MAX_BUCKETS: u32 = 4096;
/// Graded admission's `K`, by default (see `Builder::graded_k`).
pub(crate) const DEFAULT_GRADED_K: f64 = 5.0;
pub(crate) const MIN_GRADED_K: f64 = 2.5;
pub(crate) const MAX_GRADED_K: f64 = 10.0;
/// Graded admission's own window, by default.
pub(crate) const DEFAULT_GRADED_WINDOW: Duration = Duration::from_secs(30);
