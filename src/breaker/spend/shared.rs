//! The spend guard in shared mode: the fleet's spend as a shared-state
//! backend reads it from its store, and the hooks the backend uses.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Book, Crossed, Ledger, Period, SpendGuard, Unit};
use crate::breaker::spent::SLICES;
use crate::sync::lock;

/// The fleet's spend of the period as a shared-state backend read it from
/// its store, placed on this breaker's clock.
pub(super) struct Fleet {
    /// The store's slices, oldest first.
    pub(super) slices: Box<[u64]>,
    /// When (ns since the epoch) the oldest slice leaves the period; each
    /// next one leaves `width` later.
    pub(super) first_out: u64,
    pub(super) width: u64,
}

impl Fleet {
    /// The slices still in the period at `now`: when each leaves it, and
    /// what it holds.
    pub(super) fn live(&self, now: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slices
            .iter()
            .enumerate()
            .filter_map(move |(i, &amount)| {
                let out = self
                    .first_out
                    .saturating_add(self.width.saturating_mul(i as u64));
                (now < out).then_some((out, amount))
            })
    }
}

/// How a guard's period is cut into slices for a shared store: `slices`
/// slices of `width`, the newest the current one. A rolling period's
/// slices together cover at least the period (its sixtieths, rounded up to
/// whole milliseconds); a calendar period is one slice, whose boundaries
/// the store places on its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Shape {
    pub(crate) width: Duration,
    pub(crate) slices: u32,
    pub(crate) unit: Unit,
    pub(crate) period: Period,
}

impl Shape {
    fn of(guard: &SpendGuard) -> Shape {
        let (width, slices) = match guard.period {
            Period::Rolling(d) => {
                let ms = d.as_millis().div_ceil(SLICES as u128).max(1);
                let ms = u64::try_from(ms).unwrap_or(u64::MAX);
                (
                    Duration::from_millis(ms),
                    u32::try_from(SLICES).unwrap_or(u32::MAX),
                )
            }
            Period::UtcHour => (Duration::from_secs(3_600), 1),
            Period::UtcDay => (Duration::from_secs(86_400), 1),
        };
        Shape {
            width,
            slices,
            unit: guard.unit,
            period: guard.period,
        }
    }
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Ledger {
    /// Hands what was charged here since the last call to the backend
    /// (never more than this breaker's own spend still in the period: a
    /// long time away sends what is still worth counting).
    pub(super) fn take_unsent(&self, now: u64) -> u64 {
        let mut book = lock(&self.book);
        self.roll(&mut book, now);
        let amount = std::mem::take(&mut book.unsent).min(book.spent);
        book.sending = book.sending.saturating_add(amount);
        amount
    }

    /// The store's answer: its slices (oldest first) with the time left in
    /// the newest, which include everything handed over before. Says what
    /// the reading crossed, and whether it is the first to find the store's
    /// sum at the budget after this breaker added to it (`added`).
    pub(super) fn fold(
        &self,
        slices: &[u64],
        left: Duration,
        added: bool,
        now: u64,
    ) -> (Crossed, bool) {
        let mut book = lock(&self.book);
        let over = slices.iter().fold(0u64, |a, &b| a.saturating_add(b)) >= self.guard.budget;
        let first = over && added && !book.fleet_over;
        book.fleet_over = over;
        self.roll(&mut book, now);
        let width = crate::breaker::nanos(Shape::of(&self.guard).width);
        book.fleet = Some(Fleet {
            slices: slices.into(),
            first_out: now.saturating_add(crate::breaker::nanos(left)),
            width,
        });
        book.sending = 0;
        let crossed = self.settle(&mut book, now);
        self.release_if_under(&mut book, now);
        (crossed, first)
    }

    /// Back to this breaker's own spend (the store is unreachable or the
    /// backend detached).
    pub(super) fn leave(&self, now: u64) {
        let mut book = lock(&self.book);
        if book.fleet.take().is_none() {
            return;
        }
        book.fleet_over = false;
        book.sending = 0;
        self.roll(&mut book, now);
        self.settle(&mut book, now);
        self.release_if_under(&mut book, now);
    }

    /// Lifts a block the spend no longer warrants (another reading of the
    /// fleet, or the breaker's own spend after leaving shared mode).
    fn release_if_under(&self, book: &mut Book, now: u64) {
        if self.total(book, now) < self.guard.budget
            && self.blocked_until.load(Ordering::Acquire) != 0
        {
            book.record = None;
            self.blocked_until.store(0, Ordering::Release);
        }
    }
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl crate::breaker::remote::Remote<'_> {
    /// How the breaker's spend guard, if it has one, cuts its period for a
    /// shared store.
    pub(crate) fn spend_shape(&self) -> Option<Shape> {
        self.shared.spend.as_ref().map(|l| Shape::of(l.guard()))
    }

    /// What the breaker charged since the last call, for the store; the
    /// breaker counts it as sent until [`fold_spend`](Self::fold_spend).
    pub(crate) fn take_spend(&self) -> u64 {
        let s = self.shared;
        s.spend.as_ref().map_or(0, |l| l.take_unsent(s.now()))
    }

    /// Whether the breaker has charged anything since the last
    /// [`take_spend`](Self::take_spend).
    pub(crate) fn has_unsent_spend(&self) -> bool {
        self.shared
            .spend
            .as_ref()
            .is_some_and(|l| lock(&l.book).unsent > 0)
    }

    /// The fleet's spend as the store summed it (slices oldest first, and
    /// the time left in the newest), after an exchange that `added` the
    /// breaker's charges or only read: from now on the guard decides on it
    /// plus what the breaker charges meanwhile. Returns whether the other
    /// replicas should be told: the store's sum reached the budget with
    /// this breaker's charges, and no earlier reading had found it there.
    pub(crate) fn fold_spend(&self, slices: &[u64], left: Duration, added: bool) -> bool {
        let s = self.shared;
        let Some(ledger) = &s.spend else {
            return false;
        };
        let (crossed, first) = ledger.fold(slices, left, added, s.now());
        s.tell(crossed);
        first
    }

    /// Leaves the fleet's spend: the guard decides on the breaker's own
    /// again.
    pub(crate) fn leave_spend(&self) {
        let s = self.shared;
        if let Some(ledger) = &s.spend {
            ledger.leave(s.now());
        }
    }
}
