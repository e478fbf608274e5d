//! Whether a call has somewhere else to go if the breaker refuses it.
//!
//! A breaker treats a call with a fallback differently from one without: a
//! refusal costs the first a detour and the second its answer. A
//! [`Failover`](crate::failover::Failover) marks the request it sends to
//! every member but its last with [`HasFallback`]; the last member gets the
//! caller's request as it came, so a `Failover` nested inside another
//! inherits the outer mark. Users may insert the mark themselves.
//!
//! # Example
//!
//! ```
//! use tower_circuit_breaker::{Fallback, HasFallback};
//!
//! let mut request = http::Request::new(String::new());
//! assert!(!request.has_fallback());
//! request.extensions_mut().insert(HasFallback);
//! assert!(request.has_fallback());
//! ```

/// A request extension: this call has somewhere else to go if the breaker
/// refuses it (another upstream, a cache, a default answer).
///
/// ```
/// use tower_circuit_breaker::HasFallback;
///
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(HasFallback);
/// assert_eq!(request.extensions().get::<HasFallback>(), Some(&HasFallback));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HasFallback;

/// A request extension: this request is a retry of an earlier attempt.
/// [`RetryPolicy`](crate::retry::RetryPolicy) marks every retry it sends,
/// and a [`Failover`](crate::failover::Failover) never
/// [hedges](crate::failover::Hedge) a request that carries it, so retries and
/// hedges do not multiply.
///
/// ```
/// use tower_circuit_breaker::{Fallback, Retried};
///
/// let mut request = http::Request::new(());
/// assert!(!request.is_retry());
/// request.extensions_mut().insert(Retried);
/// assert!(request.is_retry());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retried;

/// A request that can say whether it has a fallback: implemented for
/// [`http::Request`] by reading and writing the [`HasFallback`] extension
/// (and, with their features, for `reqwest::Request` and async-openai's
/// request factory, which never have one). A request type of your own
/// implements it to go through a [`CircuitBreaker`](crate::CircuitBreaker)
/// or a [`Failover`](crate::failover::Failover); `false` and a no-op are a
/// complete implementation.
///
/// ```
/// use tower_circuit_breaker::Fallback;
///
/// let mut request = http::Request::new(());
/// request.mark_fallback();
/// assert!(request.has_fallback());
/// ```
///
/// [`http::Request`]: https://docs.rs/http/1/http/request/struct.Request.html
pub trait Fallback {
    /// Whether the request carries [`HasFallback`].
    fn has_fallback(&self) -> bool;

    /// Marks the request as one with a fallback.
    fn mark_fallback(&mut self);

    /// Whether the request is a retry (carries [`Retried`]). `false` unless
    /// implemented: such a request may be hedged.
    ///
    /// ```
    /// use tower_circuit_breaker::Fallback;
    ///
    /// let mut request = http::Request::new(());
    /// request.mark_retry();
    /// assert!(request.is_retry());
    /// ```
    #[inline]
    fn is_retry(&self) -> bool {
        false
    }

    /// Marks the request as a retry; does nothing unless implemented.
    #[inline]
    fn mark_retry(&mut self) {}
}

impl<B> Fallback for http::Request<B> {
    #[inline]
    fn has_fallback(&self) -> bool {
        self.extensions().get::<HasFallback>().is_some()
    }

    #[inline]
    fn mark_fallback(&mut self) {
        self.extensions_mut().insert(HasFallback);
    }

    #[inline]
    fn is_retry(&self) -> bool {
        self.extensions().get::<Retried>().is_some()
    }

    #[inline]
    fn mark_retry(&mut self) {
        self.extensions_mut().insert(Retried);
    }
}

/// A request of no content (a test's `()`) has no fallback.
impl Fallback for () {
    #[inline]
    fn has_fallback(&self) -> bool {
        false
    }

    #[inline]
    fn mark_fallback(&mut self) {}
}

/// reqwest keeps a request's extensions to itself: a `reqwest::Request`
/// has no fallback, and marking one does nothing. A client with somewhere
/// else to go admits through [`Breaker::admit_with_fallback`](crate::Breaker::admit_with_fallback).
/// Nor can it carry [`Retried`]; that costs nothing, since a
/// [`Failover`](crate::failover::Failover), the only thing that hedges, takes
/// members answering `http::Response`, which a reqwest client does not.
#[cfg(any(
    feature = "reqwest",
    feature = "reqwest-middleware",
    feature = "async-openai"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "reqwest",
        feature = "reqwest-middleware",
        feature = "async-openai"
    )))
)]
impl Fallback for ::reqwest::Request {
    #[inline]
    fn has_fallback(&self) -> bool {
        false
    }

    #[inline]
    fn mark_fallback(&mut self) {}
}

/// async-openai builds its requests inside the client, where no caller can
/// mark them: they have no fallback, and marking one does nothing.
#[cfg(feature = "async-openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "async-openai")))]
impl Fallback for ::async_openai::middleware::HttpRequestFactory {
    #[inline]
    fn has_fallback(&self) -> bool {
        false
    }

    #[inline]
    fn mark_fallback(&mut self) {}
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Breaker, Select};

    /// A breaker that is not plain (here: a slow-call rule) reads the mark
    /// and its permit remembers it.
    #[test]
    fn a_permit_remembers_the_mark() {
        let breaker = Breaker::builder()
            .slow_call(Duration::from_secs(10), 0.5)
            .build()
            .unwrap();
        assert!(breaker.admit_with_fallback().unwrap().has_fallback());
        assert!(!breaker.admit().unwrap().has_fallback());
        let mut request = http::Request::new(());
        assert!(!Select::admit(&breaker, &request).unwrap().has_fallback());
        request.mark_fallback();
        assert!(Select::admit(&breaker, &request).unwrap().has_fallback());
    }
}
