//! The spend guard's settings ([`SpendGuard`]) and the builder method
//! that sets them; the ledger that applies them is `breaker/spend.rs`.

use super::{Build, Builder, ConfigError, MAX_DURATION};
use crate::breaker::spent::{Period, Unit, SLICES};

/// A spend budget: a rule of a breaker (and of each key of a keyed set)
/// that rejects calls with [`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded)
/// once the calls of the period cost the budget. Set with
/// [`Builder::spend_guard`]; see [`crate::spend`] for what a call costs.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::spend::{Period, SpendGuard, Unit};
///
/// // $50 per rolling hour, a warning at 80 %, and a call whose usage never
/// // came charged 20 cents.
/// let guard = SpendGuard::micro_dollars(50_000_000, Period::Rolling(Duration::from_secs(3600)))
///     .warn_at(0.8)
///     .unknown_cost(200_000);
/// assert_eq!(guard.unit(), Unit::MicroDollars);
/// assert_eq!(guard.budget(), 50_000_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpendGuard {
    pub(crate) budget: u64,
    pub(crate) unit: Unit,
    pub(crate) period: Period,
    pub(crate) shadow: bool,
    pub(crate) warn_at: Option<f64>,
    pub(crate) unknown: Option<u64>,
}

impl SpendGuard {
    /// A budget of `budget` millionths of a dollar per `period`.
    #[must_use]
    pub const fn micro_dollars(budget: u64, period: Period) -> Self {
        SpendGuard::new(budget, Unit::MicroDollars, period)
    }

    /// A budget of `budget` tokens per `period`.
    #[must_use]
    pub const fn tokens(budget: u64, period: Period) -> Self {
        SpendGuard::new(budget, Unit::Tokens, period)
    }

    const fn new(budget: u64, unit: Unit, period: Period) -> Self {
        SpendGuard {
            budget,
            unit,
            period,
            shadow: false,
            warn_at: None,
            unknown: None,
        }
    }

    /// Shadow mode: a spent budget rejects nothing; the calls it would have
    /// rejected are counted (`would_reject` in the snapshot's counters) and
    /// the crossing is logged, so a budget can be tried on live traffic.
    #[must_use]
    pub const fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Warns once per period when the spend reaches `fraction` of the
    /// budget: a `tracing` warning (and, with the `metrics` feature, the
    /// counter `circuit_breaker_spend_warnings_total`). `fraction` in
    /// `(0, 1]`.
    #[must_use]
    pub const fn warn_at(mut self, fraction: f64) -> Self {
        self.warn_at = Some(fraction);
        self
    }

    /// What a call is charged when its usage never arrives (a hang, a
    /// reset, a cancelled call, a hedge loser, a malformed `usage`) and the
    /// price table has no amount of its own for the model. By default the
    /// running average of the calls whose usage was observed (0 before the
    /// first).
    #[must_use]
    pub const fn unknown_cost(mut self, cost: u64) -> Self {
        self.unknown = Some(cost);
        self
    }

    /// The budget, in [`unit`](Self::unit)s.
    #[must_use]
    pub const fn budget(&self) -> u64 {
        self.budget
    }

    /// What the budget counts.
    #[must_use]
    pub const fn unit(&self) -> Unit {
        self.unit
    }

    /// The period the budget holds for.
    #[must_use]
    pub const fn period(&self) -> Period {
        self.period
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let e = ConfigError::SpendGuard;
        if self.budget == 0 {
            return Err(e("the budget is zero"));
        }
        if let Period::Rolling(d) = self.period
            && (d.as_nanos() < SLICES as u128 || d > MAX_DURATION)
        {
            return Err(e("a rolling period must be between 60 ns and a week"));
        }
        if let Some(f) = self.warn_at
            && !(f > 0.0 && f <= 1.0)
        {
            return Err(e("the warning threshold must be in (0, 1]"));
        }
        Ok(())
    }
}

impl<T: Build> Builder<T> {
    /// A spend budget (see [`SpendGuard`] and [`crate::spend`]): each call
    /// is charged what it cost as it completes, and once the period's calls
    /// cost the budget, calls are rejected with
    /// [`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded) until it
    /// resets. With a keyed set, every key has a budget of its own.
    ///
    /// # Overshoot
    ///
    /// The guard decides at admission and charges at completion, so the
    /// calls in flight as the budget runs out still complete and are
    /// charged: the spend of a period stays below the budget plus the
    /// calls in flight at the crossing times the largest cost of one call.
    /// Shared through Redis, the budget is the fleet's, and the bound
    /// across the fleet is the budget plus (the calls in flight + the
    /// calls admitted in one exchange interval) times the largest cost of
    /// one call (see [`crate::spend`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
    /// use tower_circuit_breaker::{Breaker, Outcome, Rejection};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::Rolling(Duration::from_secs(3600))))
    ///     .build()
    ///     .unwrap();
    /// let mut permit = breaker.admit().unwrap();
    /// permit.charge(Charge::Observed(1_200_000)); // $1.20: this call crosses
    /// permit.record(Outcome::Success);
    /// let open = breaker.admit().unwrap_err();
    /// assert_eq!(open.reason(), Rejection::SpendExceeded);
    /// let spent = open.spend().unwrap();
    /// assert_eq!((spent.spent(), spent.budget()), (1_200_000, 1_000_000));
    /// assert_eq!(open.retry_after(), Some(Duration::from_secs(3600)));
    /// # }
    /// ```
    #[must_use]
    pub fn spend_guard(mut self, guard: SpendGuard) -> Self {
        self.config.spend = Some(guard);
        self
    }
}

pub(crate) fn validate(guard: Option<&SpendGuard>) -> Result<(), ConfigError> {
    guard.map_or(Ok(()), SpendGuard::validate)
}
