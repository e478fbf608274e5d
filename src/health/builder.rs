//! [`HealthProbeBuilder`]: a health probe's settings, and
//! [`HealthProbeError`] for those that cannot work.

use std::fmt;
use std::time::Duration;

use crate::breaker::MAX_DURATION;
use crate::rng::Rng;

use super::HealthProbe;

/// Health probe settings that cannot work, refused by
/// [`HealthProbeBuilder::build`].
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::health::{HealthProbe, HealthProbeError};
///
/// let err = HealthProbe::builder(Duration::from_secs(5)).jitter(1.5).build((), (), ()).unwrap_err();
/// assert_eq!(err, HealthProbeError::Jitter(1.5));
/// assert_eq!(err.to_string(), "health probe: jitter must be in [0, 1), got 1.5");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum HealthProbeError {
    /// The interval between probes is zero.
    ZeroInterval,
    /// The probe timeout is zero.
    ZeroTimeout,
    /// The interval or the timeout is longer than its upper bound, a week.
    TooLong {
        /// Which setting.
        setting: &'static str,
        /// Its upper bound.
        max: Duration,
    },
    /// The jitter fraction is outside `[0, 1)`.
    Jitter(f64),
    /// `max_in_flight` is zero, so no probe could ever be sent.
    ZeroMaxInFlight,
}

impl fmt::Display for HealthProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthProbeError::ZeroInterval => f.write_str("health probe: the interval is zero"),
            HealthProbeError::ZeroTimeout => f.write_str("health probe: the probe timeout is zero"),
            HealthProbeError::TooLong { setting, max } => {
                write!(
                    f,
                    "health probe: {setting} is longer than its upper bound {max:?}"
                )
            }
            HealthProbeError::Jitter(j) => {
                write!(f, "health probe: jitter must be in [0, 1), got {j}")
            }
            HealthProbeError::ZeroMaxInFlight => f.write_str("health probe: max_in_flight is zero"),
        }
    }
}

impl std::error::Error for HealthProbeError {}

/// Settings of a [`HealthProbe`]. `build()` refuses a zero interval or
/// timeout, and one longer than a week ([`HealthProbeError::TooLong`]).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::health::{HealthProbe, HealthProbeError};
///
/// let bad = HealthProbe::builder(Duration::ZERO)
///     .build((), (), ())
///     .unwrap_err();
/// assert_eq!(bad, HealthProbeError::ZeroInterval);
/// let unbounded = HealthProbe::builder(Duration::MAX).build((), (), ()).unwrap_err();
/// assert!(matches!(unbounded, HealthProbeError::TooLong { .. }));
/// ```
#[derive(Debug, Clone)]
pub struct HealthProbeBuilder {
    interval: Duration,
    timeout: Option<Duration>,
    jitter: f64,
    max_in_flight: usize,
    seed: Option<u64>,
}

impl HealthProbe<(), (), ()> {
    /// Probes every `interval` while a circuit is not closed.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_circuit_breaker::health::HealthProbe;
    /// let builder = HealthProbe::builder(Duration::from_secs(5)).timeout(Duration::from_secs(2));
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn builder(interval: Duration) -> HealthProbeBuilder {
        HealthProbeBuilder {
            interval,
            timeout: None,
            jitter: 0.1,
            max_in_flight: 4,
            seed: None,
        }
    }
}

impl HealthProbeBuilder {
    /// How long one probe may take, to the end of its classification.
    /// Default: the interval.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::health::HealthProbe;
    ///
    /// // Probe every 5 s; give each probe 2 s to answer.
    /// let builder = HealthProbe::builder(Duration::from_secs(5)).timeout(Duration::from_secs(2));
    /// assert!(HealthProbe::builder(Duration::from_secs(5))
    ///     .timeout(Duration::ZERO)
    ///     .build((), (), ())
    ///     .is_err());
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Each wait is shortened by a random fraction of up to `jitter` of the
    /// interval, so replicas don't probe in lockstep. Default 0.1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::health::HealthProbe;
    ///
    /// let builder = HealthProbe::builder(Duration::from_secs(5)).jitter(0.2);
    /// # let _ = builder;
    /// assert!(HealthProbe::builder(Duration::from_secs(5)).jitter(1.5).build((), (), ()).is_err());
    /// ```
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// With [`HealthProbe::run_keyed`]: how many keys are probed at once.
    /// Default 4.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::health::HealthProbe;
    ///
    /// // A keyed set with many open keys: at most 8 probes at once.
    /// let builder = HealthProbe::builder(Duration::from_secs(5)).max_in_flight(8);
    /// # let _ = builder;
    /// assert!(HealthProbe::builder(Duration::from_secs(5)).max_in_flight(0).build((), (), ()).is_err());
    /// ```
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Seeds the jitter, for runs that must repeat exactly.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::health::HealthProbe;
    ///
    /// // The same seed gives the same jittered waits, run after run.
    /// let builder = HealthProbe::builder(Duration::from_secs(5)).seed(42);
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Whether the settings are usable, as [`build`](Self::build) checks.
    pub(crate) fn check(&self) -> Result<(), HealthProbeError> {
        self.clone().build((), (), ()).map(drop)
    }

    /// The interval between probes.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// The probe timeout, if one was set.
    pub(crate) fn given_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// A prober sending `make_request(breaker)` through `service`, judged by
    /// `classifier`.
    ///
    /// # Errors
    ///
    /// A [`HealthProbeError`] when the interval or the timeout is zero or too
    /// long, or the jitter is outside `0..=1`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::HttpClassifier;
    /// use tower_circuit_breaker::health::{openai_models_request, HealthProbe};
    /// use tower_circuit_breaker::{Breaker, BoxError};
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<bytes::Bytes>| async {
    ///     Ok::<_, BoxError>(http::Response::new(String::new()))
    /// });
    /// let prober = HealthProbe::builder(Duration::from_secs(5))
    ///     .build(upstream, HttpClassifier, |_: &Breaker| {
    ///         openai_models_request::<bytes::Bytes>("http://127.0.0.1:9/v1", "sk-...").unwrap()
    ///     })
    ///     .unwrap();
    /// # let _ = prober;
    /// ```
    pub fn build<S, C, F>(
        self,
        service: S,
        classifier: C,
        make_request: F,
    ) -> Result<HealthProbe<S, C, F>, HealthProbeError> {
        let timeout = self.timeout.unwrap_or(self.interval);
        if self.interval.is_zero() {
            return Err(HealthProbeError::ZeroInterval);
        }
        if timeout.is_zero() {
            return Err(HealthProbeError::ZeroTimeout);
        }
        // The next probe is a moment on the clock: bounded, it exists.
        for (setting, d) in [
            ("health probe interval", self.interval),
            ("health probe timeout", timeout),
        ] {
            if d > MAX_DURATION {
                return Err(HealthProbeError::TooLong {
                    setting,
                    max: MAX_DURATION,
                });
            }
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(HealthProbeError::Jitter(self.jitter));
        }
        if self.max_in_flight == 0 {
            return Err(HealthProbeError::ZeroMaxInFlight);
        }
        Ok(HealthProbe {
            service,
            classifier,
            make_request,
            interval: self.interval,
            timeout,
            jitter: self.jitter,
            max_in_flight: self.max_in_flight,
            rng: self.seed.map_or_else(Rng::random, Rng::new),
        })
    }
}
