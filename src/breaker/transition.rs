//! Transitions: moving between states, the reopen backoff, and telling
//! listeners, traces and snapshots about it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::counters::Counter;
use super::half_open::Cycle;
use super::state::Packed;
use super::{nanos, Control, Events, Reason, Shared, Snapshot, State, Transition, WindowStats};
use crate::sync::lock;

impl Shared {
    /// Moves to `to` under the control lock at `at` (ns since `epoch`),
    /// starting a new generation.
    pub(super) fn transition(
        &self,
        ctl: &mut Control,
        to: State,
        reason: Reason,
        at: u64,
    ) -> Transition {
        self.transition_for(ctl, to, reason, at, None)
    }

    /// Like [`transition`](Self::transition); an `Open` state lasts `open_ns`
    /// when given, instead of the backoff's next duration.
    pub(super) fn transition_for(
        &self,
        ctl: &mut Control,
        to: State,
        reason: Reason,
        at: u64,
        open_ns: Option<u64>,
    ) -> Transition {
        let from = self.load();
        let generation = from.generation() + 1;
        let mut open_for = None;
        let mut until = u64::MAX;
        ctl.cycle = Cycle::default();
        ctl.allowance = 0;
        match to {
            State::Open => {
                // A quota that ran out says nothing of the upstream's health.
                if from.state() == State::HalfOpen && reason != Reason::QuotaExhausted {
                    ctl.reopens = ctl.reopens.saturating_add(1);
                }
                ctl.opened_at = at;
                ctl.last_resort = None;
                let d = open_ns.unwrap_or_else(|| self.open_duration(ctl)).max(1);
                until = at.saturating_add(d);
                open_for = Some(Duration::from_nanos(d));
            }
            State::Closed => {
                if reason == Reason::Reset {
                    self.hot.paced_until.store(0, Ordering::Release);
                }
                ctl.reopens = 0;
                ctl.tripped = WindowStats::default();
                self.rates.clear();
                self.hot.consecutive.store(0, Ordering::Release);
                if let Some(guard) = &self.volume {
                    guard.clear();
                }
            }
            State::ForcedOpen | State::Disabled if from.state() == State::Closed => {
                // Held as a trip's is: the window as it stood when the
                // circuit left closed, reported until it closes again.
                ctl.tripped = self.rates.stats(at);
            }
            State::HalfOpen | State::ForcedOpen | State::Disabled => {}
        }
        // The deadline before the word: a reader that sees the new word
        // reads its deadline.
        ctl.reason = Some(reason);
        self.set_open_until(until);
        let word = if reason == Reason::QuotaExhausted && to == State::Open {
            Packed::quota_open(generation)
        } else {
            Packed::new(to, generation)
        };
        self.hot.state.store(word.0, Ordering::Release);
        // After the word: an admission of the ended period either has its
        // call forgotten here or sees the new word and lets its slot go.
        if let Some(f) = &self.in_flight {
            f.forget();
        }
        self.limit_transition(from.state(), to, at);
        self.changes.notify_waiters();
        self.config.any_change.notify_waiters();
        Transition {
            key: self.name.clone(),
            from: from.state(),
            to,
            reason,
            at: self.epoch + Duration::from_nanos(at),
            open_for,
        }
    }

    pub(super) fn open_duration(&self, ctl: &mut Control) -> u64 {
        let c = &self.config;
        let base = nanos(c.open) as f64;
        let cap = nanos(c.open_max()) as f64;
        let reopens = i32::try_from(ctl.reopens.min(1024)).unwrap_or(1024);
        let grown = (base * c.backoff_multiplier.powi(reopens)).min(cap);
        let jitter = if c.jitter > 0.0 {
            c.jitter * ctl.rng.unit()
        } else {
            0.0
        };
        // `as` saturates: `grown` is at most the cap, which came from a u64.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a float in [0, cap], cap a u64, converted by a saturating `as`"
        )]
        let ns = (grown * (1.0 - jitter)) as u64;
        ns.max(1)
    }

    /// Traces each transition and calls the listeners, outside the control
    /// lock. A listener that panics is logged, counted and skipped: the
    /// panic never reaches the caller (nor a backend's task) that happened
    /// to make the transition. Under `panic = "abort"` nothing can be
    /// caught.
    pub(super) fn emit(&self, events: Events) {
        for t in events.list.into_iter().flatten() {
            if let Some(observer) = self.observer() {
                observer.transition(&t);
            }
            tracing::info!(
                target: "tower_circuit_breaker",
                key = t.key.as_deref().unwrap_or(""),
                from = t.from.as_str(),
                to = t.to.as_str(),
                reason = t.reason.as_str(),
                open_for_ms = t.open_for.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "circuit {}",
                t.to
            );
            for listener in &self.config.listeners {
                if catch_unwind(AssertUnwindSafe(|| listener(&t))).is_err() {
                    self.counters.incr(Counter::ListenerPanics);
                    tracing::error!(
                        target: "tower_circuit_breaker",
                        key = t.key.as_deref().unwrap_or(""),
                        to = t.to.as_str(),
                        "a transition listener panicked; the breaker carries on"
                    );
                }
            }
        }
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let now = self.now();
        let mut ctl = lock(&self.control);
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        let word = self.load();
        let window = match word.state() {
            State::Closed => self.rates.stats(now),
            _ => ctl.tripped,
        };
        let retry_in = (word.state() == State::Open).then(|| {
            Duration::from_nanos(
                self.hot
                    .open_until
                    .load(Ordering::Acquire)
                    .saturating_sub(now),
            )
        });
        let snapshot = Snapshot {
            key: self.name.clone(),
            state: word.state(),
            window,
            consecutive_failures: self.hot.consecutive.load(Ordering::Acquire),
            retry_in,
            reopens: ctl.reopens,
            counters: self.counters.sum(),
            metrics_only: self.hot.metrics_only.load(Ordering::Acquire),
            reason: ctl.reason,
            paced_for: match self.hot.paced_until.load(Ordering::Acquire) {
                until if until > now && matches!(word.state(), State::Closed | State::HalfOpen) => {
                    Some(Duration::from_nanos(until - now))
                }
                _ => None,
            },
            shed: self.shed(word),
            spend: self.spend.as_ref().map(|ledger| ledger.snapshot(now)),
            thresholds: super::Thresholds::of(&self.config),
        };
        drop(ctl);
        self.emit(events);
        snapshot
    }
}
