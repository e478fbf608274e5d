//! One half-open cycle: the probes it admitted, each probe's deadline and
//! lease, and the tally that decides whether the circuit closes or reopens.
//!
//! A probe whose response head has not come by its deadline is a failed
//! probe, decided at that moment; a lease (optional, never shorter than the
//! deadline) frees the slot of a probe that is still streaming its body,
//! without a verdict. Held exactly its deadline or lease, a probe is still
//! in flight (see [`past`](super::past)). Both are plain numbers compared with the clock when the
//! breaker is next touched: nothing here arms a timer.

/// A probe admitted and not finished yet.
use super::past;

#[derive(Debug, Clone, Copy)]
struct Probe {
    id: u32,
    /// When it was admitted (ns since the breaker's epoch).
    started: u64,
    /// Failed if its head has not come before then; `u64::MAX` once it has.
    verdict_at: u64,
    /// Its slot is freed without a verdict then; `u64::MAX` for never.
    lease_at: u64,
}

impl Probe {
    fn due(&self) -> u64 {
        self.verdict_at.min(self.lease_at)
    }
}

/// What a passing deadline did to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// Its head did not come in time: a failed probe.
    Failed,
    /// Its lease ran out: the slot is free again, no verdict.
    Freed,
}

/// Bookkeeping of one half-open cycle.
#[derive(Debug, Default)]
pub(super) struct Cycle {
    probes: Vec<Probe>,
    pub(super) successes: u32,
    pub(super) failures: u32,
    next_id: u32,
}

impl Cycle {
    /// Slots used: probes in flight and probes with a verdict.
    pub(super) fn used(&self) -> u32 {
        u32::try_from(self.probes.len()).unwrap_or(u32::MAX) + self.successes + self.failures
    }

    /// Admits a probe at `now`; returns its id.
    pub(super) fn start(&mut self, now: u64, deadline: u64, lease: Option<u64>) -> u32 {
        let id = self.next_id;
        self.next_id = id.wrapping_add(1);
        self.probes.push(Probe {
            id,
            started: now,
            // Held exactly its deadline (or lease), a probe is still in
            // flight: both come the nanosecond after.
            verdict_at: past(now, deadline),
            lease_at: lease.map_or(u64::MAX, |l| past(now, l)),
        });
        id
    }

    /// The earliest moment a deadline changes this cycle; `u64::MAX` when
    /// none will.
    pub(super) fn next_deadline(&self) -> u64 {
        self.probes.iter().map(Probe::due).min().unwrap_or(u64::MAX)
    }

    /// Takes out the probe whose deadline came first, if it came by `now`,
    /// with the moment it came and what it did.
    pub(super) fn pop_due(&mut self, now: u64) -> Option<(u64, Expiry)> {
        let (i, p) = self
            .probes
            .iter()
            .enumerate()
            .min_by_key(|(_, p)| p.due())?;
        let at = p.due();
        if at > now {
            return None;
        }
        let expiry = if p.verdict_at <= p.lease_at {
            Expiry::Failed
        } else {
            Expiry::Freed
        };
        self.probes.swap_remove(i);
        Some((at, expiry))
    }

    /// Marks probe `id`'s head as come (its deadline no longer applies) and
    /// returns when it started; `None` if it is no longer in flight.
    pub(super) fn head(&mut self, id: u32) -> Option<u64> {
        let p = self.probes.iter_mut().find(|p| p.id == id)?;
        p.verdict_at = u64::MAX;
        Some(p.started)
    }

    /// Ends probe `id`; `false` if a deadline already ended it.
    pub(super) fn release(&mut self, id: u32) -> bool {
        match self.probes.iter().position(|p| p.id == id) {
            Some(i) => {
                self.probes.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_without_a_head_by_its_deadline_fails_then() {
        let mut c = Cycle::default();
        c.start(10, 5, None);
        assert_eq!(c.next_deadline(), 16, "held exactly 5, still in flight");
        assert_eq!(c.pop_due(15), None);
        assert_eq!(c.pop_due(100), Some((16, Expiry::Failed)));
        assert_eq!(c.used(), 0, "the caller counts the failure");
    }

    #[test]
    fn a_probe_with_its_head_is_freed_by_its_lease_only() {
        let mut c = Cycle::default();
        let id = c.start(0, 5, Some(8));
        assert_eq!(c.head(id), Some(0));
        assert_eq!(c.next_deadline(), 9);
        assert_eq!(c.pop_due(8), None, "held exactly its lease");
        assert_eq!(c.pop_due(20), Some((9, Expiry::Freed)));
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let mut c = Cycle::default();
        c.start(u64::MAX - 1, u64::MAX, Some(u64::MAX));
        assert_eq!(c.next_deadline(), u64::MAX);
        assert_eq!(c.pop_due(u64::MAX - 1), None);
    }

    #[test]
    fn deadlines_come_in_order() {
        let mut c = Cycle::default();
        c.start(0, 30, None);
        c.start(5, 10, None);
        assert_eq!(c.pop_due(100), Some((16, Expiry::Failed)));
        assert_eq!(c.pop_due(100), Some((31, Expiry::Failed)));
        assert_eq!(c.pop_due(100), None);
    }
}
