//! The breaker's clock: moments kept as nanoseconds since the breaker's
//! epoch, and compared with the clock whenever the breaker is touched.

use super::*;
use crate::sync::thread_local;

impl Shared {
    #[inline]
    pub(super) fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// Whether the moment `ns` after `epoch` is still to come. Compares
    /// instants, so that the paths that only need that answer (an open
    /// circuit turning a call away) read the clock without turning the
    /// reading into a count of nanoseconds.
    ///
    /// For a moment many calls ask about (the end of the open period, the
    /// next probe deadline, a rate limit's reset); see [`moment`].
    #[inline]
    pub(super) fn before(&self, ns: u64) -> bool {
        match moment(self.epoch, ns) {
            Some(at) => Instant::now() < at,
            None => true,
        }
    }

    /// [`before`](Self::before), for a moment of one call's own (when it
    /// turns slow), which no other call asks about.
    #[inline]
    pub(super) fn before_own(&self, ns: u64) -> bool {
        match self.epoch.checked_add(Duration::from_nanos(ns)) {
            Some(at) => Instant::now() < at,
            None => true,
        }
    }

    /// The moment `ns` after `epoch`.
    #[inline]
    pub(super) fn deadline(&self, ns: u64) -> Deadline {
        Deadline {
            epoch: self.epoch,
            ns,
        }
    }

    /// The breaker's observer, if it has one.
    #[inline(always)]
    pub(super) fn observer(&self) -> Option<&dyn Observe> {
        #[cfg(feature = "metrics")]
        return self.observer.as_deref();
        #[cfg(not(feature = "metrics"))]
        None
    }

    #[inline]
    pub(super) fn load(&self) -> Packed {
        Packed(self.hot.state.load(Ordering::Acquire))
    }

    /// The next moment time alone changes the state; `u64::MAX` for none.
    pub(super) fn next_deadline(&self) -> u64 {
        match self.load().state() {
            State::Open | State::HalfOpen => self.hot.open_until.load(Ordering::Acquire),
            _ => u64::MAX,
        }
    }

    pub(super) fn set_open_until(&self, until: u64) {
        self.hot.open_until.store(until, Ordering::Release);
    }

    /// Applies the deadlines that have passed and returns the state.
    pub(super) fn touch(&self) -> State {
        let now = self.now();
        if now >= self.hot.open_until.load(Ordering::Acquire) {
            let mut ctl = lock(&self.control);
            let mut events = Events::default();
            self.catch_up(&mut ctl, now, &mut events);
            drop(ctl);
            self.emit(events);
        }
        self.load().state()
    }

    /// Under the control lock: applies every deadline that has passed by
    /// `now`, each at the moment it came, so that a breaker nobody touched
    /// for a while tells the same story as one touched all along.
    pub(super) fn catch_up(&self, ctl: &mut Control, now: u64, events: &mut Events) {
        loop {
            match self.load().state() {
                State::Open => {
                    let until = self.hot.open_until.load(Ordering::Acquire);
                    if now < until {
                        break;
                    }
                    events.push(self.transition(ctl, State::HalfOpen, Reason::OpenElapsed, until));
                }
                State::HalfOpen => {
                    let Some((at, expiry)) = ctl.cycle.pop_due(now) else {
                        break;
                    };
                    if expiry == Expiry::Failed {
                        // No response head by the probe deadline: a failed
                        // probe now; its late outcome will be dropped.
                        ctl.cycle.failures += 1;
                        self.counters.incr(Counter::ProbeFailures);
                        if let Some((to, reason)) = self.verdict(ctl) {
                            events.push(self.transition(ctl, to, reason, at));
                        }
                    }
                }
                _ => break,
            }
        }
        self.remark(ctl);
    }
}

// === helpers ===

thread_local! {
    /// The last moment [`moment`] worked out on this thread, and from what.
    static MOMENT: Cell<Option<(Instant, u64, Option<Instant>)>> = const { Cell::new(None) };
}

/// The moment `ns` after `epoch`; `None` past what an `Instant` can hold.
///
/// An open circuit asks for the same moment (the end of its open period)
/// on every call it turns away, so each thread keeps the last answer: a
/// pure function of its arguments, worked out again whenever they change.
/// That saves the addition of a duration to an instant, whose cost also
/// depends on the two values' nanoseconds.
#[inline]
pub(super) fn moment(epoch: Instant, ns: u64) -> Option<Instant> {
    if let Ok(Some((e, n, at))) = MOMENT.try_with(Cell::get)
        && n == ns
        && e == epoch
    {
        return at;
    }
    let at = epoch.checked_add(Duration::from_nanos(ns));
    let _ = MOMENT.try_with(|m| m.set(Some((epoch, ns, at))));
    at
}

/// The first moment past a deadline: a call or probe that started at
/// `start` (ns) and may take `limit` ns is past it from the nanosecond after
/// `start + limit`. Held exactly its limit, it is still in flight. Every
/// deadline in the core (the slow threshold, in closed and half-open alike,
/// the probe timeout and the probe lease) is this one comparison:
/// `now >= past(start, limit)`. Saturates: `u64::MAX` is never.
#[inline]
pub(crate) const fn past(start: u64, limit: u64) -> u64 {
    start.saturating_add(limit).saturating_add(1)
}

#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    // In 64-bit arithmetic: the 128-bit product `as_nanos` builds costs
    // the slow-call rule's every admission a multiplication and a
    // conversion more.
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::nanos;
    use std::time::Duration;

    #[test]
    fn a_duration_is_counted_in_nanoseconds_and_saturates_past_u64() {
        assert_eq!(nanos(Duration::ZERO), 0);
        assert_eq!(nanos(Duration::new(1, 500_000_000)), 1_500_000_000);
        assert_eq!(nanos(Duration::from_nanos(u64::MAX)), u64::MAX);
        // One second and one nanosecond past what 64 bits hold.
        let past = Duration::from_nanos(u64::MAX) + Duration::new(1, 1);
        assert_eq!(nanos(past), u64::MAX);
        assert_eq!(nanos(Duration::MAX), u64::MAX);
    }
}
