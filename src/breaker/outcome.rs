//! [`Outcome`]: what one call says about the upstream, the core's word that
//! classifiers produce.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower_circuit_breaker::Outcome;
//!
//! let slow_down = Outcome::RateLimited { retry_after: Some(Duration::from_secs(5)) };
//! assert_ne!(slow_down, Outcome::Failure);
//! ```

use std::time::Duration;

/// What one call says about the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The upstream did its job.
    Success,
    /// The upstream failed (5xx, connection error, attempt timeout, an error
    /// inside a stream).
    Failure,
    /// Says nothing about the upstream (a bad request, a content filter, a
    /// cancelled call). Counts nowhere and gives back a half-open slot.
    Ignored,
    /// The upstream asked to slow down. Passed through to the caller, neutral
    /// for every rule.
    RateLimited {
        /// How long the upstream asked to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// The account's quota or credit ran out (OpenAI's `insufficient_quota`,
    /// HTTP 402): the upstream is healthy but will refuse this caller until
    /// someone pays, so retrying soon is pointless. Neutral for every rule,
    /// like [`RateLimited`](Self::RateLimited).
    QuotaExhausted,
}
