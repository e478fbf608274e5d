//! The spend guard's budget and its ledger: a cost number charged as each
//! call completes, checked at admission. What a call costs is read above
//! the core (see [`crate::spend`]); here it is a `u64`.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::config::{Build, Builder, ConfigError};
use crate::sync::{lock, AtomicU64, Mutex};

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
const SLICES: usize = 60;

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
    budget: u64,
    unit: Unit,
    period: Period,
    shadow: bool,
    warn_at: Option<f64>,
    unknown: Option<u64>,
}

impl SpendGuard {
    /// A budget of `budget` millionths of a dollar per `period`.
    pub const fn micro_dollars(budget: u64, period: Period) -> Self {
        SpendGuard::new(budget, Unit::MicroDollars, period)
    }

    /// A budget of `budget` tokens per `period`.
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
    pub const fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Warns once per period when the spend reaches `fraction` of the
    /// budget: a `tracing` warning (and, with the `metrics` feature, the
    /// counter `circuit_breaker_spend_warnings_total`). `fraction` in
    /// `(0, 1]`.
    pub const fn warn_at(mut self, fraction: f64) -> Self {
        self.warn_at = Some(fraction);
        self
    }

    /// What a call is charged when its usage never arrives (a hang, a
    /// reset, a cancelled call, a hedge loser, a malformed `usage`) and the
    /// price table has no amount of its own for the model. By default the
    /// running average of the calls whose usage was observed (0 before the
    /// first).
    pub const fn unknown_cost(mut self, cost: u64) -> Self {
        self.unknown = Some(cost);
        self
    }

    /// The budget, in [`unit`](Self::unit)s.
    pub const fn budget(&self) -> u64 {
        self.budget
    }

    /// What the budget counts.
    pub const fn unit(&self) -> Unit {
        self.unit
    }

    /// The period the budget holds for.
    pub const fn period(&self) -> Period {
        self.period
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let e = ConfigError::SpendGuard;
        if self.budget == 0 {
            return Err(e("the budget is zero"));
        }
        if let Period::Rolling(d) = self.period
            && (d.as_nanos() < SLICES as u128 || d > super::MAX_DURATION)
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
    pub fn spend_guard(mut self, guard: SpendGuard) -> Self {
        self.config.spend = Some(guard);
        self
    }
}

pub(super) fn validate(guard: Option<&SpendGuard>) -> Result<(), ConfigError> {
    guard.map_or(Ok(()), SpendGuard::validate)
}

/// What a call cost, as told to its [`Permit`](crate::Permit) by
/// [`Permit::charge`](crate::Permit::charge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// The usage the answer reported, priced: it also feeds the running
    /// average that unknown calls are charged.
    Observed(u64),
    /// An amount charged without an observed usage (a price table's
    /// per-model amount for a call whose usage never came).
    Estimated(u64),
    /// The usage never arrived: charged [`SpendGuard::unknown_cost`], or the
    /// running average. A permit finished without a charge is charged so.
    Unknown,
    /// Nothing: the upstream billed nothing (an answer that is not a 2xx).
    Free,
}

/// Why a call was rejected with
/// [`Rejection::SpendExceeded`](crate::Rejection::SpendExceeded): which
/// budget, what the period's calls cost, and when it resets. `Copy`, read
/// from the [`CircuitOpen`](crate::CircuitOpen) without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpendExceeded {
    budget: u64,
    spent: u64,
    unit: Unit,
    period: Period,
    resets_at: Instant,
}

impl SpendExceeded {
    /// The budget, in [`unit`](Self::unit)s.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// What the period's calls cost when the budget was found spent.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// What the budget counts.
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// The budget's period.
    pub fn period(&self) -> Period {
        self.period
    }

    /// When the budget resets (see [`Period`]) and calls are admitted again.
    pub fn resets_at(&self) -> Instant {
        self.resets_at
    }
}

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

// === Ledger ===

/// One breaker's spend.
pub(super) struct Ledger {
    guard: SpendGuard,
    /// Admissions are refused until then (ns since the breaker's epoch); 0
    /// while under budget, so that admitting reads one atomic and no clock.
    blocked_until: AtomicU64,
    book: Mutex<Book>,
    epoch: Instant,
    /// Slice `k` covers `[k·slice_ns − offset, (k+1)·slice_ns − offset)` in
    /// ns since the epoch.
    slice_ns: u64,
    offset: u64,
}

struct Book {
    slices: Box<[u64]>,
    /// Absolute index of the newest slice.
    newest: u64,
    spent: u64,
    warned: bool,
    observed: u64,
    observed_sum: u64,
    unknown: u64,
    /// While blocked: what the rejections say, made once per block.
    record: Option<Arc<SpendExceeded>>,
}

/// What a charge crossed, to be logged outside the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Crossed {
    Nothing,
    Warning(u64),
    Budget(u64),
}

impl Ledger {
    pub(super) fn new(guard: SpendGuard, epoch: Instant) -> Self {
        let (slice_ns, slices, offset) = match guard.period {
            Period::Rolling(d) => ((super::nanos(d) / SLICES as u64).max(1), SLICES, 0),
            Period::UtcHour => (3_600_000_000_000, 1, wall_offset(epoch)),
            Period::UtcDay => (86_400_000_000_000, 1, wall_offset(epoch)),
        };
        Ledger {
            guard,
            blocked_until: AtomicU64::new(0),
            epoch,
            book: Mutex::new(Book {
                slices: vec![0; slices].into_boxed_slice(),
                newest: offset / slice_ns,
                spent: 0,
                warned: false,
                observed: 0,
                observed_sum: 0,
                unknown: 0,
                record: None,
            }),
            slice_ns,
            offset,
        }
    }

    pub(super) fn shadow(&self) -> bool {
        self.guard.shadow
    }

    /// Whether a call may be admitted at `now` (asked only once the budget
    /// was found spent).
    #[inline]
    pub(super) fn admits(&self, now: impl FnOnce() -> u64) -> Result<(), Arc<SpendExceeded>> {
        let until = self.blocked_until.load(Ordering::Acquire);
        if until == 0 {
            return Ok(());
        }
        self.recheck(until, now())
    }

    #[cold]
    fn recheck(&self, until: u64, now: u64) -> Result<(), Arc<SpendExceeded>> {
        let mut book = lock(&self.book);
        if now < until
            && let Some(record) = &book.record
        {
            return Err(Arc::clone(record));
        }
        self.roll(&mut book, now);
        if book.spent >= self.guard.budget {
            let at = self.resets_at(&book);
            return Err(self.block(&mut book, at));
        }
        book.record = None;
        self.blocked_until.store(0, Ordering::Release);
        Ok(())
    }

    /// Refuses calls until `at`, and makes what the rejections say.
    fn block(&self, book: &mut Book, at: u64) -> Arc<SpendExceeded> {
        let record = Arc::new(SpendExceeded {
            budget: self.guard.budget,
            spent: book.spent,
            unit: self.guard.unit,
            period: self.guard.period,
            resets_at: self.epoch + Duration::from_nanos(at),
        });
        book.record = Some(Arc::clone(&record));
        self.blocked_until.store(at.max(1), Ordering::Release);
        record
    }

    /// Charges one finished call at `now`.
    pub(super) fn charge(&self, charge: Charge, now: u64) -> Crossed {
        let mut book = lock(&self.book);
        self.roll(&mut book, now);
        let cost = match charge {
            Charge::Free => return Crossed::Nothing,
            Charge::Observed(c) => {
                book.observed += 1;
                book.observed_sum = book.observed_sum.saturating_add(c);
                c
            }
            Charge::Estimated(c) => {
                book.unknown += 1;
                c
            }
            Charge::Unknown => {
                book.unknown += 1;
                self.guard
                    .unknown
                    .unwrap_or_else(|| book.observed_sum.checked_div(book.observed).unwrap_or(0))
            }
        };
        if cost == 0 {
            return Crossed::Nothing;
        }
        let at = (book.newest % book.slices.len() as u64) as usize;
        book.slices[at] = book.slices[at].saturating_add(cost);
        book.spent = book.spent.saturating_add(cost);
        let budget = self.guard.budget;
        if book.spent >= budget {
            let first = self.blocked_until.load(Ordering::Acquire) == 0;
            let until = self.resets_at(&book);
            self.block(&mut book, until);
            book.warned = true;
            return if first {
                Crossed::Budget(book.spent)
            } else {
                Crossed::Nothing
            };
        }
        if let Some(f) = self.guard.warn_at
            && !book.warned
            && book.spent as f64 >= f * budget as f64
        {
            book.warned = true;
            return Crossed::Warning(book.spent);
        }
        Crossed::Nothing
    }

    /// Ages out the slices that left the period by `now`.
    fn roll(&self, book: &mut Book, now: u64) {
        let current = now.saturating_add(self.offset) / self.slice_ns;
        if current <= book.newest {
            return;
        }
        let n = book.slices.len() as u64;
        let steps = (current - book.newest).min(n);
        for k in 1..=steps {
            let i = ((book.newest + k) % n) as usize;
            book.spent = book.spent.saturating_sub(book.slices[i]);
            book.slices[i] = 0;
        }
        book.newest = current;
        let level = self
            .guard
            .warn_at
            .map_or(self.guard.budget as f64, |f| f * self.guard.budget as f64);
        if (book.spent as f64) < level {
            book.warned = false;
        }
    }

    /// The first moment (ns since the epoch) the spend falls below the
    /// budget again, with no more charges.
    fn resets_at(&self, book: &Book) -> u64 {
        let n = book.slices.len() as u64;
        let mut remaining = book.spent;
        let first = (book.newest + 1).saturating_sub(n);
        for abs in first..=book.newest {
            remaining = remaining.saturating_sub(book.slices[(abs % n) as usize]);
            if remaining < self.guard.budget {
                return (abs + n)
                    .saturating_mul(self.slice_ns)
                    .saturating_sub(self.offset);
            }
        }
        (book.newest + n)
            .saturating_mul(self.slice_ns)
            .saturating_sub(self.offset)
    }

    pub(super) fn snapshot(&self, now: u64) -> Spend {
        let mut book = lock(&self.book);
        self.roll(&mut book, now);
        Spend {
            budget: self.guard.budget,
            spent: book.spent,
            unit: self.guard.unit,
            period: self.guard.period,
            exceeded: book.spent >= self.guard.budget,
            observed_calls: book.observed,
            unknown_calls: book.unknown,
        }
    }

    pub(super) fn guard(&self) -> &SpendGuard {
        &self.guard
    }
}

// === impl Shared ===

impl super::Shared {
    /// Charges a finished call to the ledger, and tells of a crossing.
    pub(super) fn charge(&self, charge: Charge) {
        let Some(ledger) = &self.spend else {
            return;
        };
        let guard = ledger.guard();
        let key = self.name.as_deref().unwrap_or("");
        match ledger.charge(charge, self.now()) {
            Crossed::Nothing => {}
            Crossed::Warning(spent) => {
                tracing::warn!(
                    target: "tower_circuit_breaker",
                    key = key.escape_debug().to_string(),
                    spent = %Amount(spent, guard.unit),
                    budget = %Amount(guard.budget, guard.unit),
                    "spend budget nearly spent"
                );
                if let Some(observer) = self.observer() {
                    observer.spend_warning();
                }
            }
            Crossed::Budget(spent) => {
                tracing::warn!(
                    target: "tower_circuit_breaker",
                    key = key.escape_debug().to_string(),
                    spent = %Amount(spent, guard.unit),
                    budget = %Amount(guard.budget, guard.unit),
                    shadow = guard.shadow,
                    "spend budget exceeded; calls are rejected until it resets"
                );
            }
        }
    }
}

/// Nanoseconds from the Unix epoch to `epoch`, read from the system clock
/// now (0 if it reads before 1970).
fn wall_offset(epoch: Instant) -> u64 {
    let since = Instant::now().saturating_duration_since(epoch);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    super::nanos(wall.saturating_sub(since))
}

/// An amount in a unit: `$1.25`, `1200 tokens`.
pub(crate) struct Amount(pub(crate) u64, pub(crate) Unit);

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Unit::MicroDollars => {
                let cents = self.0.div_ceil(10_000);
                write!(f, "${}.{:02}", cents / 100, cents % 100)
            }
            Unit::Tokens => write!(f, "{} tokens", self.0),
        }
    }
}

#[cfg(test)]
mod tests;
