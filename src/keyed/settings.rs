//! The settings only a keyed set has, and the builder methods that set them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::KeyedBreakers;
use crate::breaker::Breaker;
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
}

pub(crate) type Override = Arc<dyn Fn(Builder<Breaker>) -> Builder<Breaker> + Send + Sync>;

impl Default for KeyedSettings {
    fn default() -> Self {
        KeyedSettings {
            max_keys: 10_000,
            idle_timeout: Duration::from_secs(600),
            key_overrides: Vec::new(),
        }
    }
}

impl fmt::Debug for KeyedSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedSettings")
            .field("max_keys", &self.max_keys)
            .field("idle_timeout", &self.idle_timeout)
            .field("key_overrides", &self.key_overrides.len())
            .finish()
    }
}

impl KeyedSettings {
    /// The per-key overrides, in the order they were given.
    pub(crate) fn overrides_mut(&mut self) -> impl Iterator<Item = &mut Override> {
        self.key_overrides.iter_mut().map(|(_, f)| f)
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
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.extra.idle_timeout = idle;
        self
    }

    /// Settings for one key, starting from the shared ones.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    ///
    /// let set = KeyedBreakers::builder()
    ///     .failure_rate(0.5)
    ///     .override_key("flaky-model", |b| b.failure_rate(0.8))
    ///     .build()
    ///     .unwrap();
    /// # let _ = set;
    /// ```
    pub fn override_key(
        mut self,
        key: &str,
        f: impl Fn(Builder<Breaker>) -> Builder<Breaker> + Send + Sync + 'static,
    ) -> Self {
        self.extra.key_overrides.push((key.into(), Arc::new(f)));
        self
    }
}
