//! The spend guard's budget and its ledger: a cost number charged as each
//! call completes, checked at admission. What a call costs is read above
//! the core (see [`crate::spend`]); here it is a `u64`.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

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
