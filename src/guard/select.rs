//! [`Select`]: which breaker admits a request.

use crate::breaker::{Breaker, CircuitOpen, Permit};
use crate::fallback::Fallback;

/// Chooses the breaker that admits a request: one [`Breaker`] for every
/// request, or one per key with [`Keyed`](crate::keyed::Keyed). Both read
/// the request's [`HasFallback`](crate::HasFallback) mark through
/// [`Fallback`].
pub trait Select<Request> {
    /// Asks the request's breaker for a permit.
    ///
    /// # Errors
    ///
    /// A [`CircuitOpen`] when the chosen breaker rejects the call.
    fn admit(&self, request: &Request) -> Result<Permit, CircuitOpen>;
}

impl<Request: Fallback> Select<Request> for Breaker {
    #[inline]
    fn admit(&self, request: &Request) -> Result<Permit, CircuitOpen> {
        self.admit_marked(|| request.has_fallback())
    }
}
