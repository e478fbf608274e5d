//! What a keyed set's cap on open keys asks of one breaker: whether it is
//! open, since when, and ending that open period early.

use std::time::Duration;

use tokio::time::Instant;

use super::{Breaker, Events, Reason, State};
use crate::sync::lock;

impl Breaker {
    /// While open on a verdict about the upstream (not for an exhausted
    /// quota) and its open period not over: when it opened. Applies no
    /// deadline and makes no transition, so a caller may hold its own lock.
    pub(crate) fn open_since(&self) -> Option<Instant> {
        let s = &*self.shared;
        let ctl = lock(&s.control);
        let word = s.load();
        let open = word.state() == State::Open
            && !word.is_quota_open()
            && s.before(s.hot.open_until.load(std::sync::atomic::Ordering::Acquire));
        open.then(|| s.epoch + Duration::from_nanos(ctl.opened_at))
    }

    /// Ends the open period that began at `opened_at`, if it is still the
    /// current one: half-open, with [`Reason::OpenKeysCap`], so real
    /// traffic finds out whether the upstream healed. Returns whether it
    /// did.
    pub(crate) fn end_open_period(&self, opened_at: Instant) -> bool {
        let s = &*self.shared;
        let mut ctl = lock(&s.control);
        let now = s.now();
        let mut events = Events::default();
        s.catch_up(&mut ctl, now, &mut events);
        let word = s.load();
        let current = word.state() == State::Open
            && !word.is_quota_open()
            && s.epoch + Duration::from_nanos(ctl.opened_at) == opened_at;
        if current {
            events.push(s.transition(&mut ctl, State::HalfOpen, Reason::OpenKeysCap, now));
            s.remark(&mut ctl);
        }
        drop(ctl);
        s.emit(events);
        current
    }
}
