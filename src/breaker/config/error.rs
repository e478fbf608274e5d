//! [`ConfigError`]: a configuration that `build()` refused.

use std::fmt;
use std::time::Duration;

use super::{MAX_BUCKETS, MAX_COUNT_WINDOW};

/// A configuration that [`Builder::build`](super::Builder::build) refused.
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
    /// An in-flight limit that cannot work (see
    /// [`InFlightLimit`](crate::InFlightLimit)).
    InFlightLimit(&'static str),
    /// The quota gate's open time is zero, so a quota answer would gate nothing.
    ZeroQuotaGate,
    /// [`max_rate_limit_wait`](crate::Builder::max_rate_limit_wait) is
    /// zero, so no announced wait could ever hold.
    ZeroRateLimitWait,
    /// A spend budget that cannot work (see
    /// [`SpendGuard`](crate::spend::SpendGuard)).
    SpendGuard(&'static str),
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
    /// Graded admission's `K` is outside `[2.5, 10)` (or not a number).
    GradedK(f64),
    /// Graded admission's own window is zero.
    ZeroGradedWindow,
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
            ConfigError::ZeroQuotaGate => f.write_str("quota gate must be greater than zero"),
            ConfigError::ZeroRateLimitWait => {
                f.write_str("max_rate_limit_wait must be greater than zero")
            }
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
            ConfigError::SpendGuard(why) => write!(f, "spend guard: {why}"),
            ConfigError::InFlightLimit(why) => write!(f, "in-flight limit: {why}"),
            ConfigError::GradedK(k) => {
                write!(f, "graded admission's K must be in [2.5, 10), got {k}")
            }
            ConfigError::ZeroGradedWindow => f.write_str("graded window must be greater than zero"),
        }
    }
}

impl std::error::Error for ConfigError {}
