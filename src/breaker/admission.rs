//! Admission: who may make a call, in each state.

#![allow(
    clippy::cast_possible_truncation,
    reason = "the state word keeps the generation in its low 32 bits: a generation is compared as u32 by design"
)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::counters::Counter;
use super::limit::Guarded;
use super::permit::{Kind, Permit};
use super::rejection::{CircuitOpen, Rejection};
use super::spend::SpendExceeded;
use super::state::Packed;
use super::window::SLOW;
use super::{Control, Events, Shared, State};
use crate::sync::lock;

impl Shared {
    /// Admits a call; `fallback`: whether it has somewhere else to go if
    /// refused.
    #[inline]
    pub(super) fn admit(self: &Arc<Self>, fallback: bool) -> Result<Permit, CircuitOpen> {
        self.admit_marked(|| fallback)
    }

    /// [`admit`](Self::admit), asking `fallback` only off the plain closed
    /// path: a plain closed circuit admits every call alike, so a request's
    /// mark is read only where it can matter.
    #[inline]
    pub(super) fn admit_marked(
        self: &Arc<Self>,
        fallback: impl FnOnce() -> bool,
    ) -> Result<Permit, CircuitOpen> {
        let word = self.load();
        if word.is_closed() && self.plain && !self.is_guarded() {
            return Ok(Permit::plain(self, word.generation()));
        }
        self.admit_other(word, fallback())
    }

    /// [`admit_closed`](Self::admit_closed) for a plain closed circuit (no
    /// spend guard, pacing, volume guard or slow-call rule) while the
    /// in-flight limit watches or the ramp is on.
    #[inline]
    fn admit_plain_guarded(
        self: &Arc<Self>,
        generation: u64,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        Ok(match self.admit_guarded(fallback) {
            Guarded::Pass => Permit::new(self, generation, Kind::Closed, 0, fallback),
            Guarded::Count => {
                self.counted(Permit::new(self, generation, Kind::Closed, 0, fallback))
            }
            Guarded::Watch(f) => self.admit_watched(generation, f),
            Guarded::Reject(cause) => return self.reject_guarded(cause, fallback),
        })
    }

    /// Every admission but a plain closed circuit's.
    #[inline(never)]
    pub(super) fn admit_other(
        self: &Arc<Self>,
        word: Packed,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        match word.state() {
            State::Closed if word.is_graded() => self.admit_graded(word, fallback),
            State::Closed if self.plain => self.admit_plain_guarded(word.generation(), fallback),
            State::Closed => self.admit_closed(word.generation(), fallback),
            State::Disabled => Ok(Permit::new(
                self,
                word.generation(),
                Kind::Passive,
                0,
                fallback,
            )),
            State::Open => {
                let until = self.hot.open_until.load(Ordering::Acquire);
                if self.before(until) {
                    if word.is_last_resort() {
                        return self.admit_last_resort(word, fallback);
                    }
                    self.reject_open(word, until, fallback)
                } else {
                    self.admit_probe(self.now(), fallback)
                }
            }
            State::HalfOpen => {
                if word.is_probes_out() && self.before(self.hot.open_until.load(Ordering::Acquire))
                {
                    // Every slot is taken and no deadline has come.
                    return self.reject(Rejection::HalfOpenFull, None, fallback);
                }
                self.admit_probe(self.now(), fallback)
            }
            State::ForcedOpen => self.reject(Rejection::ForcedOpen, None, fallback),
        }
    }

    /// The spend guard's say on a call about to be admitted, if the breaker
    /// has one: a rejection once its budget is spent (outside shadow mode).
    #[inline(always)]
    pub(super) fn spend_check(
        self: &Arc<Self>,
        fallback: bool,
    ) -> Option<Result<Permit, CircuitOpen>> {
        let ledger = self.spend.as_ref()?;
        self.spend_check_ledger(ledger, fallback)
    }

    /// [`spend_check`](Self::spend_check) past the question whether there
    /// is a spend guard, which every admission off the plain path asks.
    #[inline(never)]
    fn spend_check_ledger(
        self: &Arc<Self>,
        ledger: &super::spend::Ledger,
        fallback: bool,
    ) -> Option<Result<Permit, CircuitOpen>> {
        let exceeded = ledger.admits(|| self.now()).err()?;
        if ledger.shadow() {
            self.counters.incr(Counter::WouldReject);
            return None;
        }
        Some(self.reject_spend(exceeded, fallback))
    }

    /// Whether the circuit is still in the period that admitted a call.
    /// Generations are compared modulo 2^32.
    #[inline]
    pub(super) fn is_current(&self, state: State, generation: u32) -> bool {
        let word = self.load();
        word.state() == state && word.generation() as u32 == generation
    }

    #[inline]
    pub(super) fn admit_closed(
        self: &Arc<Self>,
        generation: u64,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if let Some(rejected) = self.spend_check(fallback) {
            return rejected;
        }
        if self.pace {
            let until = self.hot.paced_until.load(Ordering::Acquire);
            if until != 0
                && let Some(rejected) = self.pace_check(until, fallback)
            {
                return rejected;
            }
        }
        if let Some(guard) = &self.volume {
            let now = self.now();
            if let Err(wait) = guard.try_admit(now) {
                self.counters.incr(Counter::VolumeLimited);
                return self.reject(
                    Rejection::VolumeGuard,
                    Some(now.saturating_add(wait)),
                    fallback,
                );
            }
        }
        let (mut watched, mut counted) = (None, false);
        if self.is_guarded() {
            match self.admit_guarded(fallback) {
                Guarded::Pass => {}
                Guarded::Count => counted = true,
                Guarded::Watch(f) => watched = Some(f),
                Guarded::Reject(cause) => return self.reject_guarded(cause, fallback),
            }
        }
        let Some(in_flight) = &self.in_flight else {
            return Ok(match (watched, counted) {
                (Some(f), _) => self.admit_watched(generation, f),
                (None, true) => {
                    self.counted(Permit::new(self, generation, Kind::Closed, 0, fallback))
                }
                (None, false) => Permit::new(self, generation, Kind::Closed, 0, fallback),
            });
        };
        // Slowness without a fallback is no reason to refuse: the in-flight
        // limit watches such calls instead of this rule.
        let untracked = !fallback && self.limiter.as_ref().is_some_and(|l| l.aimd());
        let untracked_permit = |watched| match watched {
            Some(f) => self.admit_watched(generation, f),
            None => Permit::new(self, generation, Kind::Closed, 0, false),
        };
        if untracked && in_flight.is_idle() {
            // No tracked call to sweep for and none to track: no clock read.
            return Ok(untracked_permit(watched));
        }
        let now = self.now();
        let current = generation as u32;
        if in_flight.is_due(now)
            && self.record_crossings(current, now) > 0
            && !self.is_current(State::Closed, current)
        {
            // The crossings this admission found tripped the circuit: it is
            // the first call the open circuit turns away, not one more call
            // to an upstream already known to hang.
            return self.admit(fallback);
        }
        if untracked {
            return Ok(untracked_permit(watched));
        }
        let (mut kind, mut id) = (Kind::Tracked, in_flight.start(now));
        if !self.is_current(State::Closed, current) {
            // The period that admitted the call ended as it took its slot:
            // its outcome will be dropped, so it is not watched either.
            in_flight.finish(id, || now);
            (kind, id) = (Kind::Closed, 0);
        }
        let permit = Permit::new(self, generation, kind, id, fallback);
        Ok(match counted {
            true => self.counted(permit),
            false => permit,
        })
    }

    /// Calls still hanging past the slow threshold are slow now, not when
    /// their timeouts finally return; each takes its one place in the
    /// window here. Returns how many crossed (none if another admission
    /// is sweeping).
    #[cold]
    pub(super) fn record_crossings(&self, generation: u32, now: u64) -> u64 {
        let Some(in_flight) = &self.in_flight else {
            return 0;
        };
        in_flight.sweep(now, || {
            self.counters.incr(Counter::Slow);
            self.record_closed(generation, SLOW, false, now)
        })
    }

    #[cold]
    pub(super) fn admit_probe(
        self: &Arc<Self>,
        now: u64,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if let Some(rejected) = self.spend_check(fallback) {
            return rejected;
        }
        // A known rate limit holds in half-open too: a probe sent before
        // its reset would only hear "429" again, and a 429 gives its slot
        // back, so nothing else would stop the next one.
        if self.pace {
            let until = self.hot.paced_until.load(Ordering::Acquire);
            if until != 0
                && let Some(rejected) = self.pace_check(until, fallback)
            {
                return rejected;
            }
        }
        let mut ctl = lock(&self.control);
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        let word = self.load();
        let admitted = match word.state() {
            State::Open => Err(Some(self.hot.open_until.load(Ordering::Acquire))),
            State::HalfOpen if ctl.cycle.used() < self.budget(&ctl) => {
                Ok(ctl.cycle.start(now, self.probe_deadline_ns, self.lease_ns))
            }
            State::HalfOpen => Err(None),
            // It changed while we waited for the lock.
            State::Closed | State::Disabled | State::ForcedOpen => {
                drop(ctl);
                self.emit(events);
                return self.admit(fallback);
            }
        };
        self.remark(&mut ctl);
        drop(ctl);
        self.emit(events);
        match admitted {
            Ok(id) => Ok(Permit::new(
                self,
                word.generation(),
                Kind::Probe,
                id,
                fallback,
            )),
            Err(Some(until)) => self.reject_open(self.load(), until, fallback),
            Err(None) => self.reject(Rejection::HalfOpenFull, None, fallback),
        }
    }

    /// A known rate limit resets at `until`: rejects the call if that has
    /// not come yet.
    #[cold]
    fn pace_check(
        self: &Arc<Self>,
        until: u64,
        fallback: bool,
    ) -> Option<Result<Permit, CircuitOpen>> {
        if self.before(until) {
            self.counters.incr(Counter::Paced);
            return Some(self.reject(Rejection::RateLimited, Some(until), fallback));
        }
        // Over: later admissions skip the clock.
        let _ =
            self.hot
                .paced_until
                .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed);
        None
    }

    /// Rejects a call to an open circuit, saying why it opened.
    #[inline(always)]
    fn reject_open(
        self: &Arc<Self>,
        word: Packed,
        until: u64,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if word.is_quota_open() {
            self.counters.incr(Counter::QuotaRejected);
            self.reject(Rejection::Quota, Some(until), fallback)
        } else {
            self.reject(Rejection::Open, Some(until), fallback)
        }
    }

    /// The one last-resort call granted for this open period, if no other
    /// call took it first.
    #[cold]
    fn admit_last_resort(
        self: &Arc<Self>,
        word: Packed,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if let Some(rejected) = self.spend_check(fallback) {
            return rejected;
        }
        let generation = word.generation();
        let taken = self.hot.state.compare_exchange(
            word.0,
            Packed::new(State::Open, generation).0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        match taken {
            Ok(_) => Ok(Permit::new(self, generation, Kind::LastResort, 0, fallback)),
            Err(_) => self.admit(fallback),
        }
    }

    /// Probes the current half-open cycle may hold.
    pub(super) fn budget(&self, ctl: &Control) -> u32 {
        if ctl.remote {
            ctl.allowance
        } else {
            self.config.probes
        }
    }

    /// In half-open, under the control lock: publishes the next probe
    /// deadline and marks the state word when every probe slot is taken, so
    /// that admissions are refused without the lock until a deadline comes.
    pub(super) fn remark(&self, ctl: &mut Control) {
        let word = self.load();
        if word.state() != State::HalfOpen {
            return;
        }
        let generation = word.generation();
        self.set_open_until(ctl.cycle.next_deadline());
        let marked = if ctl.cycle.used() < self.budget(ctl) {
            Packed::new(State::HalfOpen, generation)
        } else {
            Packed::probes_out(generation)
        };
        // Every admission reads this word: write it only when it changes.
        if word != marked {
            self.hot.state.store(marked.0, Ordering::Release);
        }
    }

    /// Rejects a call; `deadline` (ns since `epoch`) is when one may be
    /// admitted again.
    #[inline(always)]
    pub(super) fn reject(
        self: &Arc<Self>,
        cause: Rejection,
        deadline: Option<u64>,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if self.hot.metrics_only.load(Ordering::Acquire) {
            return self.admit_shadow(fallback);
        }
        self.counters.incr(Counter::Rejected);
        if let Some(observer) = self.observer() {
            observer.rejected(cause, self.load().state());
        }
        Err(CircuitOpen::new(
            self.name.clone(),
            cause,
            deadline.map(|ns| self.deadline(ns)),
        ))
    }

    /// Rejects a call because the spend budget is spent.
    #[cold]
    fn reject_spend(
        self: &Arc<Self>,
        exceeded: Arc<SpendExceeded>,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        if self.hot.metrics_only.load(Ordering::Acquire) {
            return self.admit_shadow(fallback);
        }
        self.counters.incr(Counter::Rejected);
        if let Some(observer) = self.observer() {
            observer.rejected(Rejection::SpendExceeded, self.load().state());
        }
        Err(CircuitOpen::spent(self.name.clone(), exceeded))
    }

    /// In shadow mode: admits the call that would have been rejected.
    #[cold]
    fn admit_shadow(self: &Arc<Self>, fallback: bool) -> Result<Permit, CircuitOpen> {
        self.counters.incr(Counter::WouldReject);
        Ok(Permit::new(
            self,
            self.load().generation(),
            Kind::Passive,
            0,
            fallback,
        ))
    }
}

// === selection ===

impl super::Breaker {
    /// Whether a selection among equivalent members may choose this
    /// breaker now, without admitting: not open, not forced open, and not
    /// holding calls back for a known rate limit.
    pub(crate) fn selectable(&self) -> bool {
        if !matches!(
            self.state(),
            State::Closed | State::HalfOpen | State::Disabled
        ) {
            return false;
        }
        let until = self.shared.hot.paced_until.load(Ordering::Acquire);
        until == 0 || !self.shared.before(until)
    }
}
