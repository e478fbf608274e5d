//! [`Keyed`]: a keyed set and the function that takes the key from a
//! request, as a layer selects with it.

use super::*;

/// Keyed breakers plus the function that takes the key from a request: what
/// a keyed [`CircuitBreakerLayer`](crate::CircuitBreakerLayer) selects with.
///
/// ```
/// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// let set = KeyedBreakers::builder().build().unwrap();
/// let layer = CircuitBreakerLayer::keyed(set, keyed::header("x-model"));
/// assert!(layer.select().breakers().is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct Keyed<K> {
    breakers: KeyedBreakers,
    key: K,
}

impl<K> Keyed<K> {
    pub(crate) fn new(breakers: KeyedBreakers, key: K) -> Self {
        Keyed { breakers, key }
    }

    /// The set of breakers.
    ///
    /// ```
    /// use tower_circuit_breaker::keyed::{self, KeyedBreakers};
    /// use tower_circuit_breaker::{CircuitBreakerLayer, Outcome};
    ///
    /// let set = KeyedBreakers::builder().build().unwrap();
    /// let layer = CircuitBreakerLayer::keyed(set.clone(), keyed::header("x-model"));
    /// set.admit("gpt-4o").unwrap().record(Outcome::Success);
    /// assert_eq!(layer.select().breakers().len(), 1);
    /// ```
    pub fn breakers(&self) -> &KeyedBreakers {
        &self.breakers
    }

    pub(crate) fn key_fn(&self) -> &K {
        &self.key
    }

    /// The breaker that admits `request`, if the set holds it: the key's,
    /// `(unkeyed)` for a request without a key, `(overflow)` for a key the
    /// full set found no room for or a key function that panicked. Never
    /// creates a key.
    pub(crate) fn breaker_of<Req>(&self, request: &Req) -> Option<Breaker>
    where
        K: KeyFn<Req>,
    {
        let inner = &*self.breakers.inner;
        match panic::catch_unwind(AssertUnwindSafe(|| self.key.key(request))) {
            Ok(Some(key)) => self.breakers.get(key.as_str()).or_else(|| {
                // A key that is not in a full set shares the overflow breaker.
                (self.breakers.len() >= inner.max_keys).then(|| inner.overflow.clone())
            }),
            Ok(None) => Some(inner.unkeyed.clone()),
            Err(_) => Some(inner.overflow.clone()),
        }
    }
}

impl<K, Req> crate::Select<Req> for Keyed<K>
where
    K: KeyFn<Req>,
    Req: crate::Fallback,
{
    #[inline]
    fn admit(&self, request: &Req) -> Result<Permit, CircuitOpen> {
        // The key function is user code: a bug in it must not fail the call.
        // Only the callback is inside the catch; it sees the request through
        // a shared reference and leaves no state of ours half-changed.
        match panic::catch_unwind(AssertUnwindSafe(|| self.key.key(request))) {
            Ok(Some(key)) => self
                .breakers
                .admit_marked(key.as_str(), || request.has_fallback()),
            Ok(None) => self
                .breakers
                .admit_unkeyed_marked(|| request.has_fallback()),
            Err(_) => self.breakers.inner.key_fn_panicked(request.has_fallback()),
        }
    }
}
