//! What an attempt's outcome makes a failover do next: shared by the plain
//! walk (`future.rs`) and the hedge race (`race.rs`).

use crate::Outcome;

/// What to do after an attempt.
pub(super) enum Then {
    /// Return this answer.
    Return,
    /// The circuit was open: try the next upstream at once.
    Skip,
    /// The upstream failed: pause, then try the next one.
    Fallback,
}

/// The step an attempt the upstream answered (or failed) calls for.
pub(super) fn then(outcome: Outcome) -> Then {
    match outcome {
        Outcome::Failure | Outcome::RateLimited { .. } | Outcome::QuotaExhausted => Then::Fallback,
        _ => Then::Return,
    }
}
