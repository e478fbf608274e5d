//! Error types

use std::fmt;

use crate::breaker::ConfigError;
use crate::deadline::DeadlineError;
use crate::health::HealthProbeError;
use crate::keyed::KeyedConfigError;

/// Why [`StackBuilder::build`](super::StackBuilder::build) refused.
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
    /// The stream deadlines are invalid on their own.
    Deadline(DeadlineError),
    /// The health probe's settings are invalid on their own.
    HealthProbe(HealthProbeError),
    /// The keyed set's own settings (its bounds, a key's override) are
    /// invalid; the breaker settings its keys share are a `Breaker` error.
    Keyed(KeyedConfigError),
    /// Each piece is valid, but they do not fit together.
    Misfit(&'static str),
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StackError::Breaker(e) => fmt::Display::fmt(e, f),
            StackError::Deadline(e) => fmt::Display::fmt(e, f),
            StackError::HealthProbe(e) => fmt::Display::fmt(e, f),
            StackError::Keyed(e) => fmt::Display::fmt(e, f),
            StackError::Misfit(why) => write!(f, "stack does not fit: {why}"),
        }
    }
}

impl std::error::Error for StackError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StackError::Breaker(e) => Some(e),
            StackError::Deadline(e) => Some(e),
            StackError::HealthProbe(e) => Some(e),
            StackError::Keyed(e) => Some(e),
            StackError::Misfit(_) => None,
        }
    }
}

impl From<ConfigError> for StackError {
    fn from(e: ConfigError) -> Self {
        StackError::Breaker(e)
    }
}

impl From<DeadlineError> for StackError {
    fn from(e: DeadlineError) -> Self {
        StackError::Deadline(e)
    }
}

impl From<HealthProbeError> for StackError {
    fn from(e: HealthProbeError) -> Self {
        StackError::HealthProbe(e)
    }
}

impl From<KeyedConfigError> for StackError {
    fn from(e: KeyedConfigError) -> Self {
        match e {
            KeyedConfigError::Breaker(e) => StackError::Breaker(e),
            e => StackError::Keyed(e),
        }
    }
}
