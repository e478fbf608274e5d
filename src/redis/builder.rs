//! Building a [`Backend`]: its settings and their checks.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::conn::Store;
use super::{Backend, Client, FleetView, Quorum, Settings, SetupError};

/// Builds a [`Backend`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::redis::{Backend, Client};
///
/// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
///     .prefix("checkout")
///     .window(Duration::from_secs(30), 10)
///     .flush_interval(Duration::from_millis(100))
///     .build()?;
/// # let _ = backend;
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub struct BackendBuilder {
    settings: Settings,
    /// Why the store given cannot work, found before `build`.
    invalid: Option<&'static str>,
}

impl fmt::Debug for BackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl BackendBuilder {
    pub(super) fn new(store: Result<Store, &'static str>) -> BackendBuilder {
        let (store, invalid) = match store {
            Ok(store) => (store, None),
            Err(why) => {
                // A placeholder that is never connected to: `build` fails.
                let client = Client::open("redis://127.0.0.1/").expect("a valid url");
                (Store::Single(client), Some(why))
            }
        };
        BackendBuilder {
            settings: Settings::defaults(store),
            invalid,
        }
    }

    /// The prefix of every key and of the channel (default `tcb`). Replicas
    /// share state when they use the same prefix and breaker name.
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// // One prefix per service (and per environment) sharing the server.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .prefix("search-prod")
    ///     .build()?;
    /// # let _ = backend;
    /// // Braces would break Redis Cluster's hash tags.
    /// assert!(Backend::builder(Client::open("redis://127.0.0.1:6379/")?).prefix("{x}").build().is_err());
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// The cluster window for breakers that count their window in calls
    /// (default 10 s in 10 buckets); breakers with a time window use theirs
    /// unless this is set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// // Count the cluster's failures over the last 30 s, in 15 buckets of 2 s.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .window(Duration::from_secs(30), 15)
    ///     .build()?;
    /// # let _ = backend;
    /// assert!(Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .window(Duration::from_secs(30), 0)
    ///     .build()
    ///     .is_err());
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn window(mut self, span: Duration, buckets: u32) -> Self {
        self.settings.window = Some((span, buckets));
        self
    }

    /// How often local outcomes are sent to Redis (default 50 ms).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// // Fewer round trips, at the cost of the cluster seeing outcomes later.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .flush_interval(Duration::from_millis(200))
    ///     .build()?;
    /// # let _ = backend;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn flush_interval(mut self, every: Duration) -> Self {
        self.settings.flush = every;
        self
    }

    /// How often every breaker's cluster state is read again, in case a
    /// message was lost (default 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .resync_interval(Duration::from_secs(5))
    ///     .build()?;
    /// # let _ = backend;
    /// assert!(Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .resync_interval(Duration::ZERO)
    ///     .build()
    ///     .is_err());
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn resync_interval(mut self, every: Duration) -> Self {
        self.settings.resync = every;
        self
    }

    /// How long a connection attempt or an exchange may take before Redis
    /// counts as unavailable (default 500 ms).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// // Redis slower than 100 ms counts as down: the breakers fall back to local state.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .timeout(Duration::from_millis(100))
    ///     .build()?;
    /// # let _ = backend;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.settings.timeout = limit;
        self
    }

    /// The delay before reconnecting, doubling from `min` up to `max`
    /// (default 100 ms to 5 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .reconnect_backoff(Duration::from_millis(50), Duration::from_secs(2))
    ///     .build()?;
    /// # let _ = backend;
    /// assert!(Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .reconnect_backoff(Duration::from_secs(2), Duration::from_millis(50))
    ///     .build()
    ///     .is_err());
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.settings.backoff = (min, max);
        self
    }

    /// Opens a shared circuit only when the failures behind it came from at
    /// least `replicas` distinct replicas within the cluster window (default
    /// 1: any replica's trip opens everyone's circuit).
    ///
    /// A replica whose own rules trip while the quorum is not met stays open
    /// on its own (its path to the upstream may be the broken one) and opens
    /// no one else's circuit. Replicas count as alive for three resync
    /// intervals after their last heartbeat; when fewer than `replicas` are
    /// alive, the quorum falls to the number alive, and a warning says so.
    /// Every replica of a prefix should use the same quorum.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client};
    ///
    /// // Two replicas must see the upstream fail before anyone's circuit opens.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .quorum(2)
    ///     .build()?;
    /// # let _ = backend;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn quorum(mut self, replicas: u32) -> Self {
        self.settings.quorum = Quorum::Replicas(replicas);
        self
    }

    /// Opens a shared circuit only when the failures behind it came from at
    /// least `share` of the replicas alive (by their heartbeats), rounded
    /// up and never fewer than one: with `0.5` and 7 replicas alive, 4 must
    /// agree. Unlike [`quorum`](Self::quorum), it follows the fleet as it
    /// grows and shrinks; [`Attachment::fleet`](super::Attachment::fleet)
    /// shows the replicas alive and the quorum in force. `share` must be in
    /// (0, 1]; the last of `quorum` and `quorum_fraction` called applies.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client, SetupError};
    ///
    /// // Half the replicas alive must see the upstream fail.
    /// let backend = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .quorum_fraction(0.5)
    ///     .build()?;
    /// # let _ = backend;
    /// let err = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .quorum_fraction(1.5)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, SetupError::Invalid(_)));
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn quorum_fraction(mut self, share: f64) -> Self {
        self.settings.quorum = Quorum::Fraction(share);
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    ///
    /// A [`SetupError`] when a setting is out of range
    /// ([`SetupError::Invalid`] names it).
    ///
    /// ```
    /// use tower_circuit_breaker::redis::{Backend, Client, SetupError};
    ///
    /// let err = Backend::builder(Client::open("redis://127.0.0.1:6379/")?)
    ///     .quorum(0)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, SetupError::Invalid(_)));
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<Backend, SetupError> {
        if let Some(why) = self.invalid {
            return Err(SetupError::Invalid(why));
        }
        match self.settings.quorum {
            Quorum::Replicas(0) => {
                return Err(SetupError::Invalid("quorum must be at least 1"));
            }
            Quorum::Fraction(f) if !(f > 0.0 && f <= 1.0) => {
                return Err(SetupError::Invalid("quorum fraction must be in (0, 1]"));
            }
            _ => {}
        }
        if self.settings.prefix.is_empty() || self.settings.prefix.contains(['{', '}']) {
            return Err(SetupError::Invalid(
                "prefix must be non-empty and free of `{` and `}`",
            ));
        }
        if let Some((span, buckets)) = self.settings.window
            && (span < Duration::from_millis(1) || buckets == 0 || buckets > 1000)
        {
            return Err(SetupError::Invalid(
                "window needs a span of at least 1ms and 1 to 1000 buckets",
            ));
        }
        if self.settings.flush.is_zero()
            || self.settings.resync.is_zero()
            || self.settings.timeout.is_zero()
        {
            return Err(SetupError::Invalid(
                "flush interval, resync interval and timeout must be non-zero",
            ));
        }
        if self.settings.backoff.0.is_zero() || self.settings.backoff.1 < self.settings.backoff.0 {
            return Err(SetupError::Invalid(
                "reconnect backoff needs 0 < min <= max",
            ));
        }
        // One backend is one replica: every breaker attached to it counts
        // once towards a quorum, under one id, whichever task runs it.
        let replica = format!("{:016x}", crate::rng::random_seed()).into();
        Ok(Backend {
            settings: Arc::new(Settings {
                replica,
                ..self.settings
            }),
        })
    }
}

impl Settings {
    /// The default settings, on `store`.
    pub(super) fn defaults(store: Store) -> Settings {
        Settings {
            store,
            prefix: "tcb".into(),
            window: None,
            flush: Duration::from_millis(50),
            resync: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            backoff: (Duration::from_millis(100), Duration::from_secs(5)),
            quorum: Quorum::Replicas(1),
            fleet: FleetView::default(),
            replica: "".into(),
            leases: AtomicU64::new(0),
        }
    }
}
