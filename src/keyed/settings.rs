//! The settings only a keyed set has, the builder methods that set them, and
//! [`KeyedConfigError`] for those that cannot work.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::KeyedBreakers;
use crate::breaker::{Breaker, ConfigError};
use crate::Builder;

/// The settings only a keyed set has: its bounds and per-key overrides.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::keyed::KeyedBreakers;
///
/// // Set through the keyed builder:
/// let set = KeyedBreakers::builder()
///     .max_keys(1_000)
///     .idle_timeout(Duration::from_secs(300))
///     .build()
///     .unwrap();
/// # let _ = set;
/// ```
#[derive(Clone)]
pub struct KeyedSettings {
    pub(super) max_keys: usize,
    pub(super) idle_timeout: Duration,
    pub(super) key_overrides: Vec<(Box<str>, Override)>,
    pub(super) max_open_share: Option<f64>,
}

pub(crate) type Override = Arc<dyn Fn(Builder<Breaker>) -> Builder<Breaker> + Send + Sync>;

impl Default for KeyedSettings {
    fn default() -> Self {
        KeyedSettings {
            max_keys: 10_000,
            idle_timeout: Duration::from_secs(600),
            key_overrides: Vec::new(),
            max_open_share: None,
        }
    }
}

impl fmt::Debug for KeyedSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSettings")
            .field("max_keys", &self.max_keys)
            .field("idle_timeout", &self.idle_timeout)
            .field("key_overrides", &self.key_overrides.len())
            .field("max_open_share", &self.max_open_share)
            .finish()
    }
}

impl KeyedSettings {
    /// The per-key overrides, each with its key, in the order they were
    /// given.
    pub(crate) fn overrides_mut(&mut self) -> impl Iterator<Item = (&str, &mut Override)> {
        self.key_overrides.iter_mut().map(|(key, f)| (&**key, f))
    }
}

// === impl Builder<KeyedBreakers> ===

impl Builder<KeyedBreakers> {
    /// The most keys the set holds (default 10,000). Beyond it, new keys
    /// share one overflow breaker until idle keys are evicted.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let set = KeyedBreakers::builder().max_keys(2).build().unwrap();
    /// for key in ["a", "b", "c"] {
    ///     set.admit(key).unwrap().record(Outcome::Success);
    /// }
    /// assert_eq!(set.len(), 2, "the third key shares the overflow breaker");
    /// assert!(KeyedBreakers::builder().max_keys(0).build().is_err());
    /// ```
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.extra.max_keys = max_keys;
        self
    }

    /// How long a closed key may go unused before it can be evicted (default
    /// 10 minutes). Eviction happens between one and two idle timeouts after
    /// the last use.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    ///
    /// let set = KeyedBreakers::builder()
    ///     .idle_timeout(Duration::from_secs(60))
    ///     .build()
    ///     .unwrap();
    /// # let _ = set;
    /// assert!(KeyedBreakers::builder().idle_timeout(Duration::ZERO).build().is_err());
    /// ```
    #[must_use]
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.extra.idle_timeout = idle;
        self
    }

    /// Caps how many keys may be open at once: at most `share` of the keys
    /// the set holds (rounded down), and always at least one (Envoy's
    /// `max_ejection_percent`). Beyond the cap, the key whose circuit opened
    /// longest ago is admitted first: its open period ends early and it
    /// goes half-open ([`Reason::OpenKeysCap`](crate::Reason::OpenKeysCap)),
    /// so its probes find out whether it healed. See the [module
    /// docs](crate::keyed#a-cap-on-open-keys). Default: no cap. A share
    /// outside `(0, 1]` is a [`KeyedConfigError::MaxOpenShare`].
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{KeyedBreakers, KeyedConfigError};
    /// use tower_circuit_breaker::{Outcome, Reason, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // Ten keys, at most 20 % of them open.
    /// let set = KeyedBreakers::builder()
    ///     .trip_mode(TripMode::Open)
    ///     .consecutive_failures(1)
    ///     .max_open_share(0.2)
    ///     .build()
    ///     .unwrap();
    /// let keys: Vec<String> = (0..10).map(|i| format!("model-{i}")).collect();
    /// for key in &keys {
    ///     set.admit(key).unwrap().record(Outcome::Success);
    /// }
    /// for key in &keys[..3] {
    ///     set.admit(key).unwrap().record(Outcome::Failure);
    ///     tokio::time::advance(std::time::Duration::from_millis(1)).await;
    /// }
    /// // The third key to open pushed out the first, which opened longest ago.
    /// let first = set.get("model-0").unwrap();
    /// assert_eq!(first.state(), State::HalfOpen);
    /// assert_eq!(first.snapshot().reason, Some(Reason::OpenKeysCap));
    /// assert_eq!(set.get("model-2").unwrap().state(), State::Open);
    ///
    /// let bad = KeyedBreakers::builder().trip_mode(TripMode::Open).max_open_share(1.5).build().unwrap_err();
    /// assert_eq!(bad, KeyedConfigError::MaxOpenShare(1.5));
    /// # }
    /// ```
    #[must_use]
    pub fn max_open_share(mut self, share: f64) -> Self {
        self.extra.max_open_share = Some(share);
        self
    }

    /// Settings for one key, starting from the shared ones. Settings that
    /// cannot work are a [`KeyedConfigError::Override`] naming the key.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{KeyedBreakers, KeyedConfigError};
    /// use tower_circuit_breaker::ConfigError;
    ///
    /// let set = KeyedBreakers::builder()
    ///     .failure_rate(0.5)
    ///     .override_key("flaky-model", |b| b.failure_rate(0.8))
    ///     .build()
    ///     .unwrap();
    /// # let _ = set;
    ///
    /// let err = KeyedBreakers::builder()
    ///     .override_key("flaky-model", |b| b.probes(0))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(
    ///     &err,
    ///     KeyedConfigError::Override { key, error: ConfigError::ZeroProbes } if &**key == "flaky-model"
    /// ));
    /// ```
    #[must_use]
    pub fn override_key(
        mut self,
        key: &str,
        f: impl Fn(Builder<Breaker>) -> Builder<Breaker> + Send + Sync + 'static,
    ) -> Self {
        self.extra.key_overrides.push((key.into(), Arc::new(f)));
        self
    }
}

// === KeyedConfigError ===

/// A keyed set's configuration that
/// [`Builder::build`](crate::Builder::build) refused: the breaker settings
/// every key shares (a [`ConfigError`]), one key's override, or the set's
/// own bounds.
///
/// ```
/// use tower_circuit_breaker::keyed::{KeyedBreakers, KeyedConfigError};
/// use tower_circuit_breaker::ConfigError;
///
/// let err = KeyedBreakers::builder().max_keys(0).build().unwrap_err();
/// assert_eq!(err, KeyedConfigError::KeyBounds);
///
/// // The breaker settings every key shares are checked as a breaker's are.
/// let err = KeyedBreakers::builder().probes(0).build().unwrap_err();
/// assert_eq!(err, KeyedConfigError::Breaker(ConfigError::ZeroProbes));
/// assert_eq!(err.to_string(), "half-open must admit at least one probe");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum KeyedConfigError {
    /// The breaker settings every key shares cannot work.
    Breaker(ConfigError),
    /// One key's [`override_key`](crate::Builder::override_key) settings
    /// cannot work.
    Override {
        /// The key.
        key: Box<str>,
        /// What is wrong with its settings.
        error: ConfigError,
    },
    /// Room for no key (`max_keys` is zero), or a zero idle timeout.
    KeyBounds,
    /// The cap on open keys is not a share in `(0, 1]`.
    MaxOpenShare(f64),
}

impl fmt::Display for KeyedConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedConfigError::Breaker(e) => fmt::Display::fmt(e, f),
            KeyedConfigError::Override { key, error } => write!(f, "key '{key}': {error}"),
            KeyedConfigError::KeyBounds => {
                f.write_str("keyed breakers need max_keys >= 1 and a non-zero idle timeout")
            }
            KeyedConfigError::MaxOpenShare(share) => write!(
                f,
                "the share of keys that may be open must be in (0, 1], got {share}"
            ),
        }
    }
}

impl std::error::Error for KeyedConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyedConfigError::Breaker(e) => Some(e),
            KeyedConfigError::Override { error, .. } => Some(error),
            KeyedConfigError::KeyBounds | KeyedConfigError::MaxOpenShare(_) => None,
        }
    }
}

impl From<ConfigError> for KeyedConfigError {
    fn from(e: ConfigError) -> Self {
        KeyedConfigError::Breaker(e)
    }
}
