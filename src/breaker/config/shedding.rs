//! The settings of how a closed circuit treats the calls it could turn
//! away: what a trip rule that fires does to them ([`TripMode`]), and the
//! in-flight limit ([`InFlightLimit`]). The mechanisms live in
//! `breaker/graded.rs` and `breaker/limit.rs`.

use std::time::Duration;

/// How a trip rule that fires treats calls (see
/// [`Builder::trip_mode`](crate::Builder::trip_mode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TripMode {
    /// A call with a fallback is rejected outright; one without meets
    /// graded admission. The default.
    #[default]
    Graded,
    /// Every call is rejected while the circuit is open: all or nothing.
    Open,
}

/// The in-flight limit's settings (see
/// [`Builder::in_flight_limit`](crate::Builder::in_flight_limit)).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{Breaker, InFlightLimit};
///
/// let limit = InFlightLimit::new()
///     .window(Duration::from_secs(20))
///     .decrease(0.5)
///     .increase(2)
///     .min_signals(10);
/// let breaker = Breaker::builder().in_flight_limit(limit).build().unwrap();
/// assert_eq!(breaker.in_flight_limit(), None, "unbounded at the start");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InFlightLimit {
    pub(crate) window: Duration,
    pub(crate) decrease: f64,
    pub(crate) increase: u32,
    pub(crate) min_signals: u32,
}

impl Default for InFlightLimit {
    fn default() -> Self {
        InFlightLimit {
            window: Duration::from_secs(10),
            decrease: 0.7,
            increase: 1,
            min_signals: 5,
        }
    }
}

impl InFlightLimit {
    /// The defaults: a 10 s window, a decrease to 0.7 times, an increase of
    /// 1 per step (a tenth of the window), at least 5 signals of one kind in
    /// the window before any counts.
    ///
    /// ```
    /// # use tower_circuit_breaker::InFlightLimit;
    /// assert_eq!(InFlightLimit::new(), InFlightLimit::default());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How far back the signals and the calls in flight they came with are
    /// looked at; a step is a tenth of it. Between 10 ms and a week.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_circuit_breaker::{Breaker, ConfigError, InFlightLimit};
    /// let err = Breaker::builder()
    ///     .in_flight_limit(InFlightLimit::new().window(Duration::ZERO))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, ConfigError::InFlightLimit(_)));
    /// ```
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// What the limit is multiplied by when a signal counts, in `(0, 1)`.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, ConfigError, InFlightLimit};
    /// let err = Breaker::builder().in_flight_limit(InFlightLimit::new().decrease(1.0)).build();
    /// assert!(matches!(err, Err(ConfigError::InFlightLimit(_))));
    /// ```
    #[must_use]
    pub fn decrease(mut self, factor: f64) -> Self {
        self.decrease = factor;
        self
    }

    /// How much the limit grows per step without a counted signal; at
    /// least 1.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, ConfigError, InFlightLimit};
    /// let err = Breaker::builder().in_flight_limit(InFlightLimit::new().increase(0)).build();
    /// assert!(matches!(err, Err(ConfigError::InFlightLimit(_))));
    /// ```
    #[must_use]
    pub fn increase(mut self, step: u32) -> Self {
        self.increase = step;
        self
    }

    /// The fewest signals of one kind in the window before any counts; at
    /// least 1.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, ConfigError, InFlightLimit};
    /// let err = Breaker::builder().in_flight_limit(InFlightLimit::new().min_signals(0)).build();
    /// assert!(matches!(err, Err(ConfigError::InFlightLimit(_))));
    /// ```
    #[must_use]
    pub fn min_signals(mut self, n: u32) -> Self {
        self.min_signals = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        if self.window < Duration::from_millis(10) || self.window > super::MAX_DURATION {
            return Err("the window must be between 10 ms and a week");
        }
        if !(self.decrease > 0.0 && self.decrease < 1.0) {
            return Err("the decrease must be in (0, 1)");
        }
        if self.increase == 0 {
            return Err("the increase must be at least 1");
        }
        if self.min_signals == 0 {
            return Err("min_signals must be at least 1");
        }
        Ok(())
    }
}
