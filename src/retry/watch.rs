//! Which breakers a retry watches for a request: the request's own key in
//! keyed sets, besides the breakers given one by one.

use std::fmt;

use crate::breaker::Breaker;
use crate::keyed::{KeyFn, Keyed, KeyedBreakers};

/// What a [`RetryPolicy`](super::RetryPolicy) watches per request, besides
/// the breakers given to
/// [`watch_breaker`](super::RetryPolicy::watch_breaker): `()` for nothing
/// (the default), a [`KeyedWatch`] for the request's own key in keyed sets.
/// Sealed; made by [`watch_keyed`](super::RetryPolicy::watch_keyed).
///
/// ```
/// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
/// use tower_circuit_breaker::retry::{KeyedWatch, RetryPolicy, Watch};
///
/// fn watches<W: Watch<http::Request<String>>>(_: &RetryPolicy<tower_circuit_breaker::classify::HttpClassifier, W>) {}
///
/// let set = KeyedBreakers::builder().build().unwrap();
/// let policy: RetryPolicy<_, KeyedWatch<keyed::Header>> =
///     RetryPolicy::new().watch_keyed(set, keyed::header("x-model"));
/// watches(&policy);
/// watches(&RetryPolicy::new());
/// ```
pub trait Watch<Req>: sealed::Sealed {
    /// Whether anything is watched per request.
    #[doc(hidden)]
    const PER_REQUEST: bool;

    /// Adds the breakers that admit `request` to `out`; `false` when one of
    /// them is not in its set.
    #[doc(hidden)]
    fn breakers_of(&self, request: &Req, out: &mut Vec<Breaker>) -> bool;
}

impl<Req> Watch<Req> for () {
    const PER_REQUEST: bool = false;

    fn breakers_of(&self, _: &Req, _: &mut Vec<Breaker>) -> bool {
        true
    }
}

/// The request's own key in a keyed set, watched by a
/// [`RetryPolicy`](super::RetryPolicy) (and `W`, the sets watched before
/// it); made by [`watch_keyed`](super::RetryPolicy::watch_keyed).
///
/// ```
/// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
/// use tower_circuit_breaker::retry::RetryPolicy;
///
/// // Two keyed upstreams behind one failover: the backoff ends when the
/// // request's key is open in both.
/// let primary = KeyedBreakers::builder().build().unwrap();
/// let fallback = KeyedBreakers::builder().build().unwrap();
/// let policy = RetryPolicy::new()
///     .watch_keyed(primary, keyed::header("x-model"))
///     .watch_keyed(fallback, keyed::header("x-model"));
/// # let _ = policy;
/// ```
#[derive(Clone)]
pub struct KeyedWatch<K, W = ()> {
    keyed: Keyed<K>,
    rest: W,
}

impl<K, W> KeyedWatch<K, W> {
    pub(super) fn new(keyed: Keyed<K>, rest: W) -> Self {
        KeyedWatch { keyed, rest }
    }

    /// The set whose keys are watched.
    pub fn breakers(&self) -> &KeyedBreakers {
        self.keyed.breakers()
    }
}

impl<K, W: fmt::Debug> fmt::Debug for KeyedWatch<K, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedWatch")
            .field("breakers", self.keyed.breakers())
            .field("rest", &self.rest)
            .finish()
    }
}

impl<Req, K, W> Watch<Req> for KeyedWatch<K, W>
where
    K: KeyFn<Req>,
    W: Watch<Req>,
{
    const PER_REQUEST: bool = true;

    fn breakers_of(&self, request: &Req, out: &mut Vec<Breaker>) -> bool {
        if !self.rest.breakers_of(request, out) {
            return false;
        }
        match self.keyed.breaker_of(request) {
            Some(breaker) => {
                out.push(breaker);
                true
            }
            None => false,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for () {}
    impl<K, W> Sealed for super::KeyedWatch<K, W> {}
}
