//! What a spend budget counts and reports: its [`Unit`], its [`Period`],
//! and its state in a snapshot ([`Spend`]). Plain data, for the settings
//! (`config/spending.rs`), the ledger (`spend.rs`) and the snapshot alike.

use std::time::Duration;

/// What a spend budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// Millionths of a US dollar: `1_000_000` is $1.
    MicroDollars,
    /// Tokens (input, output and cached input alike).
    Tokens,
}

impl Unit {
    /// A short lowercase name, fit for a metrics label or a JSON field
    /// (`"usd_micros"`, `"tokens"`).
    ///
    /// ```
    /// use tower_circuit_breaker::spend::Unit;
    /// assert_eq!(Unit::MicroDollars.as_str(), "usd_micros");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::MicroDollars => "usd_micros",
            Unit::Tokens => "tokens",
        }
    }
}

/// The period a spend budget holds for, and when it resets.
///
/// - [`Rolling`](Period::Rolling): the spend of the last `period`, counted
///   in sixtieths of it. A spent budget resets at the first moment enough of
///   the spend has aged out of the last period for it to fall below the
///   budget again (a charge ages out between 59/60 and 60/60 of the period
///   after it was made).
/// - [`UtcHour`](Period::UtcHour), [`UtcDay`](Period::UtcDay): the spend since
///   the start of the current UTC hour or day; a spent budget resets at the
///   next boundary (`hh:00:00` UTC, midnight UTC). Boundaries are placed from
///   the system clock read once as the breaker is built, and followed with
///   the monotonic clock after that (so paused time in tests moves them, and
///   a wall-clock step does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Period {
    /// The last `Duration`, sliding.
    Rolling(Duration),
    /// The current UTC hour.
    UtcHour,
    /// The current UTC day.
    UtcDay,
}

/// Slices a rolling period is counted in.
pub(crate) const SLICES: usize = 60;

/// A budget's state, in a [`Snapshot`](crate::Snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Spend {
    /// The budget.
    pub budget: u64,
    /// What the current period's calls cost.
    pub spent: u64,
    /// What the budget counts.
    pub unit: Unit,
    /// The budget's period.
    pub period: Period,
    /// Whether calls are refused (or, in shadow mode, would be) until the
    /// budget resets.
    pub exceeded: bool,
    /// Calls whose usage was observed, over the breaker's life.
    pub observed_calls: u64,
    /// Calls charged without an observed usage, over the breaker's life.
    pub unknown_calls: u64,
}
