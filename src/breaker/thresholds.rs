//! The trip rules a snapshot's window and streak are judged by.

use std::time::Duration;

use super::{Config, Window};

/// The trip rules of a breaker, in its [`Snapshot`](super::Snapshot): what
/// its window's rates and its streak of failures can be read against. A
/// rule that is off is `None` (the rate rules are off without a window).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::{Breaker, Outcome};
///
/// let breaker = Breaker::builder()
///     .count_window(20)
///     .min_calls(10)
///     .failure_rate(0.5)
///     .slow_call(Duration::from_secs(20), 0.8)
///     .build()
///     .unwrap();
/// breaker.admit().unwrap().record(Outcome::Failure);
/// let snap = breaker.snapshot();
/// let rules = snap.thresholds;
/// assert_eq!(rules.failure_rate, Some(0.5));
/// assert_eq!(rules.slow_call, Some((Duration::from_secs(20), 0.8)));
/// assert_eq!(rules.consecutive_failures, None);
/// // 100 % failures, but 1 call of the 10 the rate rules wait for.
/// assert_eq!(snap.window.failure_rate(), 1.0);
/// assert!(snap.window.calls < u64::from(rules.min_calls));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Thresholds {
    /// The window the rates are counted over.
    pub window: Window,
    /// The calls the window must hold before a rate rule may trip (at
    /// least one).
    pub min_calls: u32,
    /// The circuit opens when failures reach this share of the window.
    pub failure_rate: Option<f64>,
    /// The circuit opens when calls slower than the duration (time to
    /// response head) reach the rate, a share of the window.
    pub slow_call: Option<(Duration, f64)>,
    /// The circuit opens after this many failures in a row.
    pub consecutive_failures: Option<u32>,
}

impl Thresholds {
    pub(super) fn of(config: &Config) -> Self {
        let windowed = !matches!(config.window, Window::None);
        Thresholds {
            window: config.window,
            min_calls: config.min_calls.max(1),
            failure_rate: config.failure_rate.filter(|_| windowed),
            slow_call: config.slow_call.filter(|_| windowed),
            consecutive_failures: config.consecutive_failures,
        }
    }
}
