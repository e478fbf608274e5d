//! Recording: what a finished call (or a health probe) does to the window,
//! the streak and the half-open tally, and the trip rules run over them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::counters::Counter;
use super::permit::{Head, Kind, Ticket};
use super::window::{self, Rates, Taken, FAILED, SLOW};
use super::{nanos, past, Control, Events, Outcome, Reason, Shared, Signal, State, WindowStats};
use crate::sync::lock;

impl Shared {
    /// Records a finished call; `announced` says when a quota answer said
    /// the quota resets.
    pub(super) fn record(
        &self,
        permit: Ticket,
        head: &mut Head,
        outcome: Outcome,
        announced: &dyn Fn() -> Option<Duration>,
    ) {
        if permit.kind.is_counted() {
            self.counted_ended();
        }
        if *head == Head::Pending {
            // Only tracked calls and probes are timed to their heads.
            *head = match permit.kind {
                Kind::Tracked | Kind::CountedTracked | Kind::Probe => self.judge_head(permit),
                Kind::Closed
                | Kind::CountedClosed
                | Kind::Watched
                | Kind::Passive
                | Kind::LastResort => Head::Fast,
            };
        }
        let slow = *head == Head::Slow;
        if permit.kind != Kind::Passive {
            match outcome {
                Outcome::RateLimited {
                    retry_after: Some(wait),
                } if self.pace => self.pace_for(wait),
                Outcome::QuotaExhausted if self.quota_gate_ns.is_some() => {
                    return self.gate_quota(permit, announced());
                }
                _ => {}
            }
        }
        match permit.kind {
            Kind::Passive => {}
            Kind::LastResort => {
                if outcome == Outcome::Success {
                    self.record_last_resort(permit.generation);
                }
            }
            Kind::Closed
            | Kind::Tracked
            | Kind::Watched
            | Kind::CountedClosed
            | Kind::CountedTracked => {
                // A rate-limited outcome is a 429, whoever recorded it.
                let signal = match (permit.signal, outcome) {
                    (Signal::None, Outcome::RateLimited { .. }) => Signal::Throttled,
                    (signal, _) => signal,
                };
                if permit.kind == Kind::Watched || signal != Signal::None {
                    let watched = (permit.kind == Kind::Watched
                        && !matches!(outcome, Outcome::Ignored))
                    .then_some(permit.id);
                    self.limit_outcome(permit.generation, watched, signal);
                }
                let failed = match outcome {
                    Outcome::Success => {
                        if permit.graded {
                            self.graded_accept(permit.generation);
                        }
                        false
                    }
                    Outcome::Failure => true,
                    // Neutral everywhere: not in any window, and the streak
                    // of failures goes on.
                    _ => return,
                };
                if !failed && !slow && !permit.graded && !matches!(*head, Head::Crossed(_)) {
                    // A success judged fast, that no rule needs to see: as
                    // on the plain path (a call charged to a spend guard,
                    // one that carried an overload signal).
                    return self.record_plain_success(permit.generation);
                }
                let now = self.window_now();
                if let Head::Crossed(slot) = *head {
                    // Already in the window as slow: a failure marks that
                    // entry failed too, and only a failure counts further.
                    if failed && self.is_current(State::Closed, permit.generation) {
                        let streak = self.hot.consecutive.fetch_add(1, Ordering::AcqRel) + 1;
                        let stats = self.rates.mark_failed(slot, now);
                        self.evaluate(permit.generation, streak, stats);
                    }
                    return;
                }
                let entry = if failed { FAILED } else { 0 } | if slow { SLOW } else { 0 };
                self.record_closed(permit.generation, entry, true, now);
            }
            Kind::Probe => self.record_probe(permit.generation, permit.id, outcome, slow),
        }
    }

    /// A success that no rule needs to see: written to the window unless
    /// the window is full and clean with no streak to break, where it
    /// would change nothing.
    #[inline(always)]
    pub(super) fn record_plain_success(&self, generation: u32) {
        if self.hot.consecutive.load(Ordering::Relaxed) != 0 || !self.rates.is_clean() {
            self.record_success(generation);
        }
    }

    /// Records the success of a call admitted while closed whose head was
    /// judged fast (or never timed): the common outcome, without the
    /// general path's questions. In a full count window a success can only
    /// lower the rates, so the rules are not run.
    pub(super) fn record_success(&self, generation: u32) {
        if let Some(window) = self.rates.full_count() {
            if self.is_current(State::Closed, generation) {
                if self.hot.consecutive.load(Ordering::Acquire) != 0 {
                    self.hot.consecutive.store(0, Ordering::Release);
                }
                window.add_success();
            }
            return;
        }
        self.record_closed(generation, 0, true, self.window_now());
    }

    /// The moment a record lands in the window: only a time window reads
    /// the clock.
    #[inline]
    fn window_now(&self) -> u64 {
        if matches!(self.rates, Rates::Time(_)) {
            self.now()
        } else {
            0
        }
    }

    /// Judges the call's time to head, now: slow, fast, or already counted
    /// as slow while it was in flight. Counts a slow call. For a probe,
    /// marks its head as come, so its deadline no longer applies.
    #[inline]
    pub(super) fn judge_head(&self, permit: Ticket) -> Head {
        if !matches!(permit.kind, Kind::Tracked | Kind::CountedTracked) {
            return self.judge_other(permit);
        }
        let Some(in_flight) = &self.in_flight else {
            return Head::Fast;
        };
        let started = match in_flight.finish(permit.id, || self.now()) {
            Taken::Running(started) => started,
            Taken::Crossed(slot) => return Head::Crossed(slot),
            // Untracked, or forgotten by the transition that started its
            // own period as it was admitted: judged on its head.
            Taken::Forgotten(started) | Taken::Untracked(started)
                if self.is_current(State::Closed, permit.generation) =>
            {
                started
            }
            // Its period ended: its outcome will be dropped.
            Taken::Forgotten(_) | Taken::Untracked(_) => return Head::Fast,
        };
        self.judge_started(started)
    }

    /// [`judge_head`](Self::judge_head) for a probe (or a call that is not
    /// timed).
    #[cold]
    fn judge_other(&self, permit: Ticket) -> Head {
        let started = match permit.kind {
            Kind::Probe => {
                let mut ctl = lock(&self.control);
                let now = self.now();
                let mut events = Events::default();
                self.catch_up(&mut ctl, now, &mut events);
                let started = if self.is_current(State::HalfOpen, permit.generation) {
                    ctl.cycle.head(permit.id)
                } else {
                    None
                };
                self.remark(&mut ctl);
                drop(ctl);
                self.emit(events);
                match started {
                    Some(started) => started,
                    // Decided by its deadline already: its outcome will be
                    // dropped anyway.
                    None => return Head::Fast,
                }
            }
            Kind::Tracked
            | Kind::CountedTracked
            | Kind::Closed
            | Kind::CountedClosed
            | Kind::Watched
            | Kind::Passive
            | Kind::LastResort => return Head::Fast,
        };
        self.judge_started(started)
    }

    /// Slow or fast, for a call that started at `started`; counts a slow one.
    #[inline]
    fn judge_started(&self, started: u64) -> Head {
        let Some(threshold) = self.slow_ns else {
            return Head::Fast;
        };
        // Slow: more than `threshold` after it started.
        if !self.before_own(past(started, threshold)) {
            self.counters.incr(Counter::Slow);
            Head::Slow
        } else {
            Head::Fast
        }
    }

    /// Adds one entry to the window and the streak; returns where in the
    /// window it went, if it counted. `finished` is false for a call
    /// counted as slow while still in flight: it is no outcome, so it does
    /// not break a failure streak.
    #[inline]
    pub(super) fn record_closed(
        &self,
        generation: u32,
        entry: u8,
        finished: bool,
        now: u64,
    ) -> Option<window::Slot> {
        if !self.is_current(State::Closed, generation) {
            // An outcome counts only in the period that admitted its call.
            return None;
        }
        let streak = if entry & FAILED != 0 {
            self.hot.consecutive.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            // Any finished call that did not fail, slow or not.
            if finished && self.hot.consecutive.load(Ordering::Acquire) != 0 {
                self.hot.consecutive.store(0, Ordering::Release);
            }
            0
        };
        let (stats, slot) = self.rates.record(entry, now);
        self.evaluate(generation, streak, stats);
        Some(slot)
    }

    /// Runs the trip rules over the streak and the window. This is their
    /// one home: a shared-state backend only sums what replicas report
    /// (`redis/sync.lua` keeps no rule) and hands the sum back here through
    /// [`Remote::evaluate`](super::Remote::evaluate). A new rule goes here
    /// and, if it needs a new count summed across replicas, in the backend's
    /// script.
    pub(super) fn evaluate(&self, generation: u32, streak: u64, stats: WindowStats) {
        let c = &self.config;
        let reason = if c
            .consecutive_failures
            .is_some_and(|n| streak >= u64::from(n))
        {
            Some(Reason::ConsecutiveFailures)
        } else if stats.calls > 0 && stats.calls >= u64::from(c.min_calls) {
            if c.failure_rate.is_some_and(|r| stats.failure_rate() >= r) {
                Some(Reason::FailureRate)
            } else if c.slow_call.is_some_and(|(_, r)| stats.slow_rate() >= r) {
                Some(Reason::SlowCallRate)
            } else {
                None
            }
        } else {
            None
        };
        if let Some(reason) = reason {
            if self.graded.is_some() && !self.grade(generation, reason, stats, streak) {
                return;
            }
            self.trip(generation, reason, stats);
        } else if self.load().is_graded() {
            self.graded_settle(generation);
        }
    }

    #[cold]
    pub(super) fn trip(&self, generation: u32, reason: Reason, stats: WindowStats) {
        let mut ctl = lock(&self.control);
        if !self.is_current(State::Closed, generation) {
            return;
        }
        ctl.tripped = stats;
        let mut events = Events::default();
        events.push(self.transition(&mut ctl, State::Open, reason, self.now()));
        drop(ctl);
        self.emit(events);
    }

    /// What the tally of the current half-open cycle decides, if anything.
    /// With a shared-state backend the cluster decides instead.
    pub(super) fn verdict(&self, ctl: &Control) -> Option<(State, Reason)> {
        let c = &self.config;
        if ctl.remote {
            None
        } else if ctl.cycle.successes >= c.close_after {
            Some((State::Closed, Reason::ProbesSucceeded))
        } else if c.probes.saturating_sub(ctl.cycle.failures) < c.close_after {
            Some((State::Open, Reason::ProbesFailed))
        } else {
            None
        }
    }

    #[cold]
    pub(super) fn record_probe(&self, generation: u32, id: u32, outcome: Outcome, slow: bool) {
        let mut ctl = lock(&self.control);
        let now = self.now();
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        if self.is_current(State::HalfOpen, generation) && ctl.cycle.release(id) {
            match outcome {
                Outcome::Success if !slow => {
                    ctl.cycle.successes += 1;
                    self.counters.incr(Counter::ProbeSuccesses);
                }
                Outcome::Success | Outcome::Failure => {
                    ctl.cycle.failures += 1;
                    self.counters.incr(Counter::ProbeFailures);
                }
                // Ignored, rate-limited and quota-exhausted probes give their
                // slot back.
                _ => {}
            }
            if let Some((to, reason)) = self.verdict(&ctl) {
                events.push(self.transition(&mut ctl, to, reason, now));
            }
        }
        // Otherwise from an older cycle, or decided by its deadline: dropped.
        self.remark(&mut ctl);
        drop(ctl);
        self.emit(events);
    }

    /// A known rate limit is used up for `wait`: closed admissions are
    /// rejected until then. The later of two such moments holds.
    #[cold]
    pub(super) fn pace_for(&self, wait: Duration) {
        let wait = nanos(wait).min(self.max_wait_ns);
        let until = self.now().saturating_add(wait).max(1);
        self.hot.paced_until.fetch_max(until, Ordering::AcqRel);
    }

    /// The account's quota ran out: opens the circuit of the period that
    /// admitted the call until the announced reset, or for the configured
    /// time, without advancing the reopen backoff.
    #[cold]
    pub(super) fn gate_quota(&self, permit: Ticket, announced: Option<Duration>) {
        let Some(default) = self.quota_gate_ns else {
            return;
        };
        let open_ns = announced.map_or(default, |d| nanos(d).min(self.max_wait_ns));
        let mut ctl = lock(&self.control);
        let now = self.now();
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        let current = match permit.kind {
            Kind::Closed
            | Kind::Tracked
            | Kind::Watched
            | Kind::CountedClosed
            | Kind::CountedTracked => self.is_current(State::Closed, permit.generation),
            Kind::Probe => self.is_current(State::HalfOpen, permit.generation),
            Kind::Passive | Kind::LastResort => false,
        };
        if current {
            events.push(self.transition_for(
                &mut ctl,
                State::Open,
                Reason::QuotaExhausted,
                now,
                Some(open_ns),
            ));
        }
        self.remark(&mut ctl);
        drop(ctl);
        self.emit(events);
    }

    /// The last-resort call through an open circuit succeeded: like a
    /// healthy health probe, it ends that open period (half-open, so real
    /// traffic confirms).
    #[cold]
    pub(super) fn record_last_resort(&self, generation: u32) {
        let mut ctl = lock(&self.control);
        let now = self.now();
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        if self.is_current(State::Open, generation) {
            events.push(self.transition(&mut ctl, State::HalfOpen, Reason::LastResort, now));
            self.remark(&mut ctl);
        }
        drop(ctl);
        self.emit(events);
    }

    #[cold]
    pub(super) fn record_health(&self, healthy: bool) {
        if !healthy {
            self.counters.incr(Counter::HealthProbeFailures);
            return;
        }
        self.counters.incr(Counter::HealthProbeSuccesses);
        let mut ctl = lock(&self.control);
        let now = self.now();
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        // A heal ends an open period and nothing else. A half-open cycle
        // already lets real traffic confirm it; restarting one would drop
        // the probes in flight from the tally while they still hold the
        // upstream, so the budget would no longer bound them. A cycle held
        // by hung probes ends at their deadlines, and the next healthy
        // probe ends the open period that follows.
        let restart = self.load().state() == State::Open;
        if restart {
            events.push(self.transition(&mut ctl, State::HalfOpen, Reason::HealthProbe, now));
            self.remark(&mut ctl);
        }
        drop(ctl);
        self.emit(events);
    }

    #[cold]
    pub(super) fn set_manual(&self, to: State, reason: Reason) {
        let mut ctl = lock(&self.control);
        if to == State::Closed {
            ctl.reopens = 0;
        }
        let mut events = Events::default();
        events.push(self.transition(&mut ctl, to, reason, self.now()));
        drop(ctl);
        self.emit(events);
    }
}
