//! One breaker per key (model + region, provider, account), bounded in
//! number.
//!
//! A global breaker is too blunt: one broken model must not block a healthy
//! one. [`KeyedBreakers`] gives every key its own [`Breaker`] with a shared
//! configuration (and optional per-key overrides); a [`KeyFn`] takes the key
//! from each request.
//!
//! # Bounds and eviction
//!
//! A bug or an attacker minting unique keys must not grow memory without
//! limit, so the set holds at most [`max_keys`](crate::Builder::max_keys)
//! breakers. Keys not used for an [`idle_timeout`](crate::Builder::idle_timeout)
//! are evicted (after between one and two idle timeouts, swept lazily when new
//! keys arrive) — but only while their circuit is closed. An open, half-open,
//! forced-open or disabled circuit is never evicted, so an outage in progress
//! is never silently forgotten. When the set is full of keys it may not
//! evict, new keys share one overflow breaker (named `(overflow)`) until room
//! frees up, and a warning is traced.
//!
//! Keys are the user's strings, so a key may be named `(overflow)` or
//! `(unkeyed)` too: it then has a breaker of its own like any key, and
//! [`snapshots`](KeyedBreakers::snapshots), metrics and the status page show
//! two breakers of that name (the set's own last). Within the crate the
//! overflow breaker is told apart by identity
//! ([`KeyedBreakers::is_overflow`]), never by name: a full set that learns
//! of a key named `(overflow)` from another replica sharing state through
//! Redis leaves its overflow breaker alone, as it does for any key it has no
//! room for.
//!
//! # A cap on open keys
//!
//! An upstream failing for every key at once (a provider-wide outage, a
//! bad deploy of the gateway in front of it) would open every key, and a
//! set with every key open serves no one. With
//! [`max_open_share`](crate::Builder::max_open_share), at most that share
//! of the keys the set holds may be open at once, and always at least one.
//! The rule for who goes first beyond the cap is the one
//! [`AllOpen::last_resort`](crate::failover::AllOpen::last_resort) uses:
//! **the circuit that opened longest ago, which has had the longest to
//! heal**. When a key opens and more keys are open than the cap allows,
//! the key that opened longest ago has its open period ended then: it goes
//! half-open ([`Reason::OpenKeysCap`](crate::Reason::OpenKeysCap)), and its
//! probes decide, as after any open period (failing, it reopens, and is now
//! the newest open key). The bound holds once the call that opened a key
//! returns; a thread reading states while another is opening a key may see
//! that one key over it, for as long as that call takes to finish.
//!
//! Only circuits the trip rules opened count: a key gated on an exhausted
//! quota ([`Builder::quota_gate`](crate::Builder::quota_gate)), forced open
//! by an operator, half-open or closed is not open for the cap, and is
//! never ended by it; neither are the `(overflow)` and `(unkeyed)`
//! breakers, which are not keys. The share applies to the keys the set
//! holds at the moment, so the cap grows with the set; when idle keys are
//! evicted, the cap is applied again at once. With state shared through
//! Redis, each replica applies the cap to its own set. Without a cap, no
//! admission and no recorded outcome runs any of it; adding and evicting a
//! key test whether a cap is set, and that is all.
//!
//! # When the key function panics
//!
//! A [`KeyFn`] is user code, and a bug in it must not fail the request: a
//! call whose key function panics is admitted by the same `(overflow)`
//! breaker, an error is traced (the first time, then at every power of two),
//! and it is counted in [`KeyedBreakers::key_fn_panics`]. The panic hook
//! still runs as for any panic. None of this holds in a build with
//! `panic = "abort"`, where the first panic ends the process.
//!
//! # Example
//!
//! ```
//! use tower_circuit_breaker::keyed::{self, KeyedBreakers};
//! use tower_circuit_breaker::{CircuitBreakerLayer, Outcome, State, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_circuit_breaker::keyed::KeyedConfigError> {
//! let breakers = KeyedBreakers::builder()
//!     .trip_mode(TripMode::Open)
//!     .consecutive_failures(3)
//!     .max_keys(10_000)
//!     .build()?;
//!
//! for _ in 0..3 {
//!     breakers.admit("gpt-4o/eu").unwrap().record(Outcome::Failure);
//! }
//! assert_eq!(breakers.get("gpt-4o/eu").unwrap().state(), State::Open);
//! assert!(breakers.admit("claude/us").is_ok(), "other keys are unaffected");
//!
//! // As a layer, keyed by a header:
//! let layer = CircuitBreakerLayer::keyed(breakers, keyed::header("x-model"));
//! # let _ = layer;
//! # Ok(()) }
//! ```

mod key;
mod last;
mod open_cap;
mod select;
mod settings;
mod shards;
#[cfg(test)]
mod tests;
mod touched;

pub use self::select::Keyed;
pub use self::settings::{KeyedConfigError, KeyedSettings};
#[cfg_attr(not(feature = "redis"), allow(unused_imports))]
pub(crate) use self::touched::Listening;

pub use self::key::{
    authority, extension, from_fn, header, header_hashed, Authority, ExtensionKey, FromFn,
    HashedHeader, Header, Key, KeyFn, KeySecret, KeySecretError,
};

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, HashTable};
use tokio::time::Instant;

use std::hash::{BuildHasher, Hasher};

use self::key::same_key;
use self::shards::{os_random_seed, read};
use crate::breaker::CircuitOpen;
use crate::breaker::{sealed, Breaker, Build, Config, Snapshot, State};
use crate::{Builder, Permit};

const SHARDS: usize = 16;

/// A bounded set of breakers, one per key, sharing one configuration.
///
/// Cheap to clone; clones share the set. See the [module docs](self).
///
/// ```
/// use tower_circuit_breaker::keyed::KeyedBreakers;
/// use tower_circuit_breaker::Outcome;
///
/// let set = KeyedBreakers::builder().consecutive_failures(5).build().unwrap();
/// let clone = set.clone();
/// clone.admit("gpt-4o").unwrap().record(Outcome::Success);
/// assert_eq!(set.len(), 1, "clones share the set");
/// ```
#[derive(Clone)]
pub struct KeyedBreakers {
    inner: Arc<Inner>,
}

struct Inner {
    shards: [RwLock<HashTable<Arc<Entry>>>; SHARDS],
    /// Changes whenever keys are evicted; see [`last`].
    version: AtomicU64,
    /// Counts every key added and every sweep that evicted any: a
    /// shared-state backend reads the set's keys again only when it moved.
    members: AtomicU64,
    hasher: DefaultHashBuilder,
    /// Mixed into every key's hash first: see [`Inner::hash`].
    seed: u128,
    config: Arc<Config>,
    overrides: Vec<(Box<str>, Arc<Config>)>,
    max_keys: usize,
    idle: Duration,
    len: AtomicUsize,
    /// Shared by keys that arrive while the set is full of keys it may not
    /// evict.
    overflow: Breaker,
    /// For requests that carry no key.
    unkeyed: Breaker,
    /// When the last sweep ran; the lock also serializes sweeps.
    last_sweep: Mutex<Option<Instant>>,
    /// Calls whose key function panicked.
    key_fn_panics: AtomicU64,
    /// The cap on open keys, if one is set.
    open_cap: Option<Arc<open_cap::OpenCap>>,
    /// The keys that saw calls, for a shared-state backend.
    touched: touched::Touched,
}

struct Entry {
    key: Arc<str>,
    breaker: Breaker,
    /// Set on use; `USED` is cleared by each sweep (a key found unused by a
    /// sweep has been idle at least since the previous one), `UNSENT` by a
    /// backend's look (see [`touched`]).
    marks: touched::Marks,
}

impl fmt::Debug for KeyedBreakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBreakers")
            .field("keys", &self.len())
            .field("max_keys", &self.inner.max_keys)
            .finish()
    }
}

impl sealed::Sealed for KeyedBreakers {}

impl Build for KeyedBreakers {
    type Extra = KeyedSettings;
    type Error = KeyedConfigError;

    fn build_from(builder: Builder<Self>) -> Result<Self, KeyedConfigError> {
        let (mut config, extra) = (builder.config, builder.extra);
        config.validate()?;
        if extra.max_keys == 0 || extra.idle_timeout.is_zero() {
            return Err(KeyedConfigError::KeyBounds);
        }
        if let Some(share) = extra.max_open_share
            && !(share > 0.0 && share <= 1.0)
        {
            return Err(KeyedConfigError::MaxOpenShare(share));
        }
        let mut overrides = extra
            .key_overrides
            .into_iter()
            .map(|(key, f)| {
                let c = f(Builder::<Breaker>::with_config(config.clone())).config;
                match c.validate() {
                    Ok(()) => Ok((key, c)),
                    Err(error) => Err(KeyedConfigError::Override { key, error }),
                }
            })
            .collect::<Result<Vec<_>, KeyedConfigError>>()?;
        // Many breakers: keep each small until its key is busy.
        config.stripes_when_busy = true;
        config.counter_stripes = config
            .counter_stripes
            .min(std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get));
        // The overflow and unkeyed breakers are not keys: the cap on open
        // keys neither counts nor ends them.
        let unkeyed = Arc::new(config.clone());
        let inner = Arc::new_cyclic(|set| {
            let open_cap = extra.max_open_share.map(|share| {
                let cap = Arc::new(open_cap::OpenCap::new(share, set.clone()));
                // Weak: the cap holds every key's breaker, and each breaker
                // holds this listener; a strong one would keep a dropped
                // set alive.
                let listener = {
                    let cap = Arc::downgrade(&cap);
                    Arc::new(move |t: &crate::Transition| {
                        if let Some(cap) = cap.upgrade() {
                            cap.on_transition(t);
                        }
                    })
                };
                config.listeners.push(listener.clone());
                for (_, c) in &mut overrides {
                    c.listeners.push(listener.clone());
                }
                cap
            });
            let config = Arc::new(config);
            Inner {
                shards: std::array::from_fn(|_| RwLock::new(HashTable::new())),
                version: AtomicU64::new(last::next_version()),
                members: AtomicU64::new(0),
                hasher: DefaultHashBuilder::default(),
                seed: os_random_seed(),
                max_keys: extra.max_keys,
                idle: extra.idle_timeout,
                overflow: Breaker::with_config(unkeyed.clone(), Some("(overflow)".into())),
                unkeyed: Breaker::with_config(unkeyed, Some("(unkeyed)".into())),
                config,
                overrides: overrides
                    .into_iter()
                    .map(|(k, c)| (k, Arc::new(c)))
                    .collect(),
                len: AtomicUsize::new(0),
                last_sweep: Mutex::new(None),
                key_fn_panics: AtomicU64::new(0),
                open_cap,
                touched: touched::Touched::new(),
            }
        });
        Ok(KeyedBreakers { inner })
    }
}

impl KeyedBreakers {
    /// Moves whenever a key is added or evicted: equal readings mean
    /// [`breakers`](Self::breakers) holds the same breakers as before.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn membership(&self) -> u64 {
        self.inner.members.load(Ordering::Acquire)
    }

    /// Completes at the next transition of any breaker of the set (taken
    /// before a look at the set, it misses none that follow the look).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn any_change(&self) -> tokio::sync::futures::OwnedNotified {
        Arc::clone(&self.inner.config.any_change).notified_owned()
    }

    /// A builder with the default configuration; the breaker settings apply
    /// to every key.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    ///
    /// let set = KeyedBreakers::builder()
    ///     .failure_rate(0.5)
    ///     .min_calls(20)
    ///     .build()
    ///     .unwrap();
    /// assert!(set.is_empty());
    /// ```
    #[must_use]
    pub fn builder() -> Builder<KeyedBreakers> {
        Builder::new()
    }

    /// Admits a call for `key`, creating its breaker on first use.
    ///
    /// # Errors
    ///
    /// A [`CircuitOpen`] when the key's circuit rejects the call (its
    /// [`reason`](crate::CircuitOpen::reason) says why).
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::{Outcome, TripMode};
    ///
    /// let set = KeyedBreakers::builder().trip_mode(TripMode::Open).consecutive_failures(1).build().unwrap();
    /// set.admit("gpt-4o").unwrap().record(Outcome::Failure);
    /// let rejected = set.admit("gpt-4o").unwrap_err();
    /// assert_eq!(rejected.key(), Some("gpt-4o"));
    /// assert!(set.admit("claude").is_ok());
    /// ```
    #[inline]
    pub fn admit(&self, key: &str) -> Result<Permit, CircuitOpen> {
        self.admit_marked(key, || false)
    }

    /// [`admit`](Self::admit) for a call that has somewhere else to go if
    /// refused (see [`HasFallback`](crate::HasFallback)).
    ///
    /// # Errors
    ///
    /// A [`CircuitOpen`] when the key's circuit rejects the call (its
    /// [`reason`](crate::CircuitOpen::reason) says why).
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// set.admit_with_fallback("gpt-4o").unwrap().record(Outcome::Success);
    /// ```
    #[inline]
    pub fn admit_with_fallback(&self, key: &str) -> Result<Permit, CircuitOpen> {
        self.admit_marked(key, || true)
    }

    /// Admits a call for `key` whose fallback `fallback` tells, asked only
    /// where it can matter.
    #[inline]
    pub(crate) fn admit_marked(
        &self,
        key: &str,
        fallback: impl Fn() -> bool + Copy,
    ) -> Result<Permit, CircuitOpen> {
        let inner = &*self.inner;
        let version = inner.version.load(Ordering::Acquire);
        if let Some(admitted) = last::admit(version, key, &inner.touched, fallback) {
            return admitted;
        }
        let hash = inner.hash(key);
        {
            let table = read(inner.shard(hash));
            if let Some(e) = table.find(hash, |e| same_key(&e.key, key)) {
                e.touch(&inner.touched);
                last::looked_up(version, hash, e);
                return e.breaker.admit_marked(fallback);
            }
        }
        inner.admit_new(key, hash, fallback())
    }

    /// Admits a call that carries no key (it shares the `(unkeyed)` breaker).
    ///
    /// # Errors
    ///
    /// A [`CircuitOpen`] when the overflow breaker rejects
    /// the call.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// set.admit_unkeyed().unwrap().record(Outcome::Success);
    /// assert_eq!(set.len(), 0, "the unkeyed breaker is not a key");
    /// ```
    pub fn admit_unkeyed(&self) -> Result<Permit, CircuitOpen> {
        self.inner.unkeyed.admit()
    }

    fn admit_unkeyed_marked(&self, fallback: impl FnOnce() -> bool) -> Result<Permit, CircuitOpen> {
        self.inner.unkeyed.admit_marked(fallback)
    }

    /// The breaker of `key`, if the set holds one.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    /// use tower_circuit_breaker::State;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// assert!(set.get("gpt-4o").is_none(), "no breaker before the first call");
    /// set.admit("gpt-4o").unwrap().record(Outcome::Success);
    /// assert_eq!(set.get("gpt-4o").unwrap().state(), State::Closed);
    /// ```
    #[must_use]
    pub fn get(&self, key: &str) -> Option<Breaker> {
        self.inner.get(key)
    }

    /// The breaker of `key`, created if the set has none yet (the overflow
    /// breaker if the set is full). A shared-state backend uses this to apply
    /// another replica's decision to a key this one has not seen yet.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::State;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// // Another replica tripped "gpt-4o": apply it here before any call arrives.
    /// set.get_or_insert("gpt-4o").force_open();
    /// assert_eq!(set.get("gpt-4o").unwrap().state(), State::ForcedOpen);
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is a by-product"
    )]
    pub fn get_or_insert(&self, key: &str) -> Breaker {
        let hash = self.inner.hash(key);
        self.get(key)
            .unwrap_or_else(|| self.inner.insert(key, hash))
    }

    /// How many keys may be open at once under the cap on open keys, for
    /// the keys the set holds now; `None` without a cap.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let set = KeyedBreakers::builder().max_open_share(0.1).build().unwrap();
    /// assert_eq!(set.max_open(), Some(1), "always at least one");
    /// for i in 0..50 {
    ///     set.admit(&format!("k{i}")).unwrap().record(Outcome::Success);
    /// }
    /// assert_eq!(set.max_open(), Some(5));
    /// assert_eq!(KeyedBreakers::builder().build().unwrap().max_open(), None);
    /// ```
    #[must_use]
    pub fn max_open(&self) -> Option<usize> {
        let cap = self.inner.open_cap.as_ref()?;
        Some(cap.allowed(self.len()))
    }

    /// Whether `breaker` is the set's `(overflow)` breaker, the one that keys
    /// without room share (and calls whose key function panicked). Tell it
    /// by this, never by its name: a key may be named `(overflow)` too.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    ///
    /// let set = KeyedBreakers::builder().max_keys(1).build().unwrap();
    /// let own = set.get_or_insert("(overflow)");
    /// assert!(!set.is_overflow(&own), "a key of that name has its own breaker");
    /// let shared = set.get_or_insert("gpt-4o");
    /// assert!(set.is_overflow(&shared), "no room for a second key");
    /// assert_eq!(shared.name(), own.name(), "the same name, two breakers");
    /// ```
    #[must_use]
    pub fn is_overflow(&self, breaker: &Breaker) -> bool {
        breaker.ptr_eq(&self.inner.overflow)
    }

    /// How many keys the set holds.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// for key in ["a", "b", "a"] {
    ///     set.admit(key).unwrap().record(Outcome::Success);
    /// }
    /// assert_eq!(set.len(), 2);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Relaxed)
    }

    /// Whether the set holds no key.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// assert!(set.is_empty());
    /// set.admit("a").unwrap().record(Outcome::Success);
    /// assert!(!set.is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many calls of a keyed layer over this set found its key function
    /// panicking (each was admitted by the `(overflow)` breaker instead; see
    /// the [module docs](self#when-the-key-function-panics)).
    ///
    /// ```
    /// use tower::{Layer, Service, ServiceExt};
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::CircuitBreakerLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// let buggy = keyed::from_fn(|_: &http::Request<()>| -> Option<keyed::Key<'_>> { panic!("bug") });
    /// let layer = CircuitBreakerLayer::keyed(set.clone(), buggy);
    /// let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// # let hook = std::panic::take_hook();
    /// # std::panic::set_hook(Box::new(|_| {}));
    /// let answer = svc.oneshot(http::Request::new(())).await;
    /// # std::panic::set_hook(hook);
    /// assert!(answer.is_ok(), "the call still went through");
    /// assert_eq!(set.key_fn_panics(), 1);
    /// # }
    /// ```
    #[must_use]
    pub fn key_fn_panics(&self) -> u64 {
        self.inner.key_fn_panics.load(Ordering::Relaxed)
    }

    /// A snapshot of every key's breaker, plus the `(overflow)` and
    /// `(unkeyed)` breakers once they have seen a call.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::{Outcome, State, TripMode};
    ///
    /// let set = KeyedBreakers::builder().trip_mode(TripMode::Open).consecutive_failures(1).build().unwrap();
    /// set.admit("gpt-4o").unwrap().record(Outcome::Failure);
    /// set.admit("claude").unwrap().record(Outcome::Success);
    /// let open: Vec<_> = set
    ///     .snapshots()
    ///     .into_iter()
    ///     .filter(|s| s.state == State::Open)
    ///     .filter_map(|s| s.key)
    ///     .collect();
    /// assert_eq!(open.len(), 1);
    /// assert_eq!(&*open[0], "gpt-4o");
    /// ```
    pub fn snapshots(&self) -> Vec<Snapshot> {
        // A snapshot applies deadlines, which may make transitions: take
        // them outside the shards' locks.
        let mut out: Vec<Snapshot> = self.breakers().iter().map(Breaker::snapshot).collect();
        out.reserve(2);
        for extra in [&self.inner.overflow, &self.inner.unkeyed] {
            let snap = extra.snapshot();
            if snap.counters.admitted + snap.counters.rejected > 0 {
                out.push(snap);
            }
        }
        out
    }

    /// Every key's breaker, for manual control.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::KeyedBreakers;
    /// use tower_circuit_breaker::Outcome;
    /// use tower_circuit_breaker::State;
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// set.admit("a").unwrap().record(Outcome::Success);
    /// set.admit("b").unwrap().record(Outcome::Success);
    /// // An operator's "stop everything":
    /// for breaker in set.breakers() {
    ///     breaker.force_open();
    /// }
    /// assert!(set.breakers().iter().all(|b| b.state() == State::ForcedOpen));
    /// ```
    #[must_use]
    pub fn breakers(&self) -> Vec<Breaker> {
        let mut out = Vec::with_capacity(self.len());
        for shard in self.inner.shards.iter() {
            out.extend(read(shard).iter().map(|e| e.breaker.clone()));
        }
        out
    }
}
