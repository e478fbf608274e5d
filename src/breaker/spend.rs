//! The spend guard's budget and its ledger: a cost number charged as each
//! call completes, checked at admission. What a call costs is read above
//! the core (see [`crate::spend`]); here it is a `u64`.

#![allow(
    clippy::cast_possible_truncation,
    reason = "indices are taken modulo a slice's length, which fits in usize"
)]

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::shared::Fleet;
#[cfg_attr(not(feature = "redis"), allow(unused_imports))]
pub(crate) use self::shared::Shape;
pub use super::config::SpendGuard;
use super::spent::SLICES;
pub use super::spent::{Period, Spend, Unit};
use crate::sync::{lock, AtomicU64, Mutex};

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
    #[must_use]
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// What the period's calls cost when the budget was found spent.
    #[must_use]
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// What the budget counts.
    #[must_use]
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// The budget's period.
    #[must_use]
    pub fn period(&self) -> Period {
        self.period
    }

    /// When the budget resets (see [`Period`]) and calls are admitted again.
    #[must_use]
    pub fn resets_at(&self) -> Instant {
        self.resets_at
    }
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
    /// This breaker's own charges, by slice.
    slices: Box<[u64]>,
    /// Absolute index of the newest slice.
    newest: u64,
    /// This breaker's own charges of the period.
    spent: u64,
    /// Charged here and not yet handed to a shared-state backend.
    unsent: u64,
    /// Handed to the backend and not yet in a reply of the store.
    sending: u64,
    /// The fleet's spend as the backend last read it; `None` while the
    /// breaker decides on its own spend (no backend, or the store
    /// unreachable).
    fleet: Option<Fleet>,
    /// The last reading of the fleet's spend found it at the budget.
    fleet_over: bool,
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
                unsent: 0,
                sending: 0,
                fleet: None,
                fleet_over: false,
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
        let spent = self.total(&book, now);
        if spent >= self.guard.budget {
            let at = self.resets_at(&book, now);
            return Err(self.block(&mut book, at, spent));
        }
        book.record = None;
        self.blocked_until.store(0, Ordering::Release);
        Ok(())
    }

    /// Refuses calls until `at`, and makes what the rejections say.
    fn block(&self, book: &mut Book, at: u64, spent: u64) -> Arc<SpendExceeded> {
        let record = Arc::new(SpendExceeded {
            budget: self.guard.budget,
            spent,
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
        self.add(&mut book, cost, now)
    }

    /// Adds `cost` to the current slice, and settles.
    #[inline]
    fn add(&self, book: &mut Book, cost: u64, now: u64) -> Crossed {
        let at = (book.newest % book.slices.len() as u64) as usize;
        book.slices[at] = book.slices[at].saturating_add(cost);
        book.spent = book.spent.saturating_add(cost);
        book.unsent = book.unsent.saturating_add(cost);
        self.settle(book, now)
    }

    /// Blocks admissions if the period's spend reached the budget, or warns
    /// if it reached the warning threshold; says which it crossed first.
    fn settle(&self, book: &mut Book, now: u64) -> Crossed {
        let spent = self.total(book, now);
        let budget = self.guard.budget;
        if spent >= budget {
            let first = self.blocked_until.load(Ordering::Acquire) == 0;
            let until = self.resets_at(book, now);
            self.block(book, until, spent);
            book.warned = true;
            return if first {
                Crossed::Budget(spent)
            } else {
                Crossed::Nothing
            };
        }
        if let Some(f) = self.guard.warn_at
            && !book.warned
            && spent as f64 >= f * budget as f64
        {
            book.warned = true;
            return Crossed::Warning(spent);
        }
        Crossed::Nothing
    }

    /// What the period's calls cost at `now`: this breaker's own, or, in
    /// shared mode, the fleet's as last read plus what this breaker charged
    /// since.
    fn total(&self, book: &Book, now: u64) -> u64 {
        let Some(fleet) = &book.fleet else {
            return book.spent;
        };
        fleet.live(now).map(|(_, amount)| amount).fold(
            book.sending.saturating_add(book.unsent),
            u64::saturating_add,
        )
    }

    /// Charges a health probe's answer at `now`: what its usage reports, and
    /// nothing when none came. It feeds neither the running average nor the
    /// counts of calls.
    fn charge_probe(&self, charge: Charge, now: u64) -> Crossed {
        let (Charge::Observed(cost) | Charge::Estimated(cost)) = charge else {
            return Crossed::Nothing;
        };
        if cost == 0 {
            return Crossed::Nothing;
        }
        let mut book = lock(&self.book);
        self.roll(&mut book, now);
        self.add(&mut book, cost, now)
    }

    /// Ages out the slices that left the period by `now`.
    #[inline]
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
        if (self.total(book, now) as f64) < level {
            book.warned = false;
        }
    }

    /// The first moment (ns since the epoch) the spend falls below the
    /// budget again, with no more charges; never before `now + 1`.
    fn resets_at(&self, book: &Book, now: u64) -> u64 {
        let at = match &book.fleet {
            None => self.own_reset(book),
            Some(fleet) => {
                // What this breaker charged since the last read ages out
                // last: a period from now at the latest.
                let mut remaining = self.total(book, now);
                let mut at = None;
                for (out, amount) in fleet.live(now) {
                    remaining = remaining.saturating_sub(amount);
                    if remaining < self.guard.budget {
                        at = Some(out);
                        break;
                    }
                }
                at.unwrap_or_else(|| self.period_end(book, now))
            }
        };
        at.max(now.saturating_add(1))
    }

    /// When a charge made at `now` has left the period at the latest.
    fn period_end(&self, book: &Book, now: u64) -> u64 {
        match self.guard.period {
            Period::Rolling(d) => now.saturating_add(super::nanos(d)),
            Period::UtcHour | Period::UtcDay => (book.newest + 1)
                .saturating_mul(self.slice_ns)
                .saturating_sub(self.offset),
        }
    }

    /// [`resets_at`](Self::resets_at) over this breaker's own charges.
    fn own_reset(&self, book: &Book) -> u64 {
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
        let spent = self.total(&book, now);
        Spend {
            budget: self.guard.budget,
            spent,
            unit: self.guard.unit,
            period: self.guard.period,
            exceeded: spent >= self.guard.budget,
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
        let crossed = ledger.charge(charge, self.now());
        self.tell(crossed);
    }

    /// Logs a crossing (and counts a warning), if the charge made one.
    #[inline]
    fn tell(&self, crossed: Crossed) {
        if crossed != Crossed::Nothing {
            self.log_crossing(crossed);
        }
    }

    #[cold]
    fn log_crossing(&self, crossed: Crossed) {
        let Some(ledger) = &self.spend else {
            return;
        };
        let guard = ledger.guard();
        let key = self.name.as_deref().unwrap_or("");
        match crossed {
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

impl super::Breaker {
    /// Charges a health probe (see [`crate::health`]) what its answer's
    /// usage reports, asked of `charge` only when the breaker has a spend
    /// guard. A probe is the breaker's own request: the guard never turns
    /// it away, and a probe whose usage never came costs nothing (not the
    /// unknown cost of a user's call, which would charge a one-token
    /// completion as an average call at every interval).
    pub(crate) fn charge_health_probe(&self, charge: impl FnOnce() -> Charge) {
        let s = &self.shared;
        if let Some(ledger) = &s.spend {
            let crossed = ledger.charge_probe(charge(), s.now());
            s.tell(crossed);
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

mod shared;
#[cfg(test)]
mod tests;
