//! One breaker as the attachment's task keeps it in step with the cluster:
//! what it last saw of the cluster, the probe slots it holds, and the
//! counts it has not reported yet.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::script::{Cluster, Keys, Reply, Request, Rule, SpendReport};
use super::{Origin, Origins, Settings};
use crate::breaker::spend::Shape;
use crate::breaker::Counters;
use crate::sync::lock;
use crate::{Breaker, Reason, State};

/// Applied open durations run this much past the cluster's deadline, so a
/// replica never turns half-open before the cluster does.
pub(super) const MARGIN: Duration = Duration::from_millis(2);

/// Failed health probes in a row after which the replica holding the turn
/// to probe passes it to another replica.
pub(super) const PASS_AFTER: u64 = 3;

/// The cluster state of a breaker as this replica last learned it.
#[derive(Debug, Clone, Copy)]
pub(super) struct View {
    pub(super) cluster: Cluster,
    pub(super) epoch: u64,
}

/// One breaker kept in step.
pub(super) struct Tracked {
    pub(super) breaker: Breaker,
    pub(super) name: Arc<str>,
    pub(super) keys: Keys,
    pub(super) rule: Rule,
    /// Lifetime counters at the last exchange.
    pub(super) base: Counters,
    pub(super) view: Option<View>,
    /// Apply the next reply even if its epoch is known.
    pub(super) force: bool,
    /// A message said the cluster state changed.
    pub(super) dirty: bool,
    /// Probe slots granted to this replica in the current cycle, with the
    /// instant they must stop being used.
    pub(super) leases: VecDeque<(String, Instant)>,
    /// Granted slots the breaker could not take.
    pub(super) releases: Vec<String>,
    /// Marks breakers still in a keyed set.
    pub(super) seen: u64,
    /// The open epoch this replica knows of, and when it first learned of
    /// it, by its own clock: no period lasts past that plus the open cap.
    pub(super) opened: Option<(u64, Instant)>,
    /// A local trip was sent in this open period (a trip the quorum has not
    /// confirmed stays local, and is not sent again at every transition in the set).
    pub(super) trip_sent: bool,
    /// The longest an exchange may take: a reply's deadline is as old as
    /// that when it arrives.
    pub(super) slack: Duration,
    /// Calls admitted and rejected at the last resync: a closed breaker
    /// without calls since has nothing to protect and skips the next one.
    pub(super) activity: u64,
    /// At the last look it had nothing to tell or learn and no call in
    /// flight: until a call comes (a keyed set tells), a flush need not
    /// look again.
    pub(super) idle: bool,
    /// In the worker's set of breakers a flush looks at.
    pub(super) busy: bool,
    /// Taken from the keyed set's list of keys that saw calls since the
    /// last look: the call that put it there may not be counted yet, so
    /// the next look is followed by one more.
    pub(super) told: bool,
    /// The breaker runs its half-open cycle on its own: it was half-open
    /// when Redis turned out to hold no state for it (restarted empty,
    /// flushed), so no cluster cycle exists to grant its probes, and closing
    /// it without a probe would let lost state close a circuit.
    pub(super) local_cycle: bool,
    /// The length of the cluster's open period when it is a quota gate
    /// (zero otherwise): a gate may outlast the open cap.
    pub(super) gate: Duration,
    /// Health-probe successes and failures when this replica's current
    /// streak of failed health probes began.
    pub(super) streak: (u64, u64),
    /// The breaker's spend guard, as the store slices its period.
    pub(super) spend: Option<Shape>,
    /// Calls admitted at the last exchange that read the fleet's spend: a
    /// guarded breaker that admitted calls since reads it at the next flush.
    pub(super) spend_seen: u64,
    /// A reading of the fleet's spend found it at the budget for the first
    /// time, with this replica's charges: the other replicas are told at
    /// once.
    pub(super) announce: bool,
}

/// A request in flight, and what applying its reply needs.
pub(super) struct Pending {
    pub(super) name: Arc<str>,
    pub(super) request: Request,
    /// The breaker's state when the request was made.
    pub(super) local: State,
}

// === impl Tracked ===

impl Tracked {
    pub(super) fn new(breaker: Breaker, name: Arc<str>, settings: &Settings) -> Tracked {
        let rule = Rule::new(&breaker.shared_rules(), settings.window);
        let spend = breaker.remote().spend_shape();
        let mut keys = Keys::new(&settings.prefix, &name);
        if let Some(shape) = &spend {
            keys.spend = Keys::spend(&settings.prefix, &name, shape);
        }
        Tracked {
            keys,
            spend,
            spend_seen: 0,
            announce: false,
            base: breaker.snapshot().counters,
            breaker,
            name,
            rule,
            view: None,
            force: true,
            dirty: false,
            leases: VecDeque::new(),
            releases: Vec::new(),
            seen: 0,
            activity: 0,
            idle: false,
            busy: false,
            told: false,
            opened: None,
            local_cycle: false,
            gate: Duration::ZERO,
            streak: (0, 0),
            trip_sent: false,
            slack: settings.timeout,
        }
    }

    /// How long after first learning of an open period this replica holds
    /// it open at most, whatever the cluster's clock says: the open cap,
    /// plus the age a reply can have, so the cap never cuts a period the
    /// cluster's clock keeps honestly.
    pub(super) fn longest(&self) -> Duration {
        self.rule
            .open_max
            .max(self.gate)
            .saturating_add(self.slack)
            .saturating_add(MARGIN)
    }

    /// Whether the breaker tripped on its own since the cluster was last
    /// known closed.
    pub(super) fn tripped(&self) -> bool {
        !self.trip_sent
            && self.view.is_some_and(|v| v.cluster.is_closed())
            && self.breaker.state() == State::Open
    }

    /// Whether a health probe healed the breaker while the cluster holds it
    /// open, and the cluster has not been told.
    pub(super) fn healed(&self) -> bool {
        self.view
            .is_some_and(|v| matches!(v.cluster, Cluster::Open(_)))
            && self.breaker.state() == State::HalfOpen
            && {
                let snap = self.breaker.snapshot();
                !snap.metrics_only
                    && snap.counters.health_probe_successes > self.base.health_probe_successes
            }
    }

    /// Whether this replica should pass the health-probe turn on: its last
    /// [`PASS_AFTER`] health probes all failed. The streak starts again once
    /// it says so, so a replica given the turn back gets as many tries.
    pub(super) fn pass_turn(&mut self) -> bool {
        let c = self.breaker.snapshot().counters;
        let (ok, failed) = (c.health_probe_successes, c.health_probe_failures);
        if ok != self.streak.0 || failed < self.streak.1 {
            self.streak = (ok, failed);
        }
        let pass = failed - self.streak.1 >= PASS_AFTER;
        if pass {
            self.streak = (ok, failed);
        }
        pass
    }

    /// Whether the cluster holds the circuit open or half-open, as this
    /// replica last learned: then the replicas take turns to probe it.
    pub(super) fn held_open(&self) -> bool {
        self.view
            .is_some_and(|v| matches!(v.cluster, Cluster::Open(_) | Cluster::HalfOpen))
    }

    /// Whether the breaker moved on its own in a way the cluster must learn
    /// before the next flush: a trip, or a heal.
    pub(super) fn moved(&self) -> bool {
        self.tripped() || self.healed()
    }

    /// Whether a closed breaker the cluster holds closed has nothing to tell
    /// or learn: nothing recorded since the last exchange (nor since the
    /// last resync, for one), nothing owed or asked; if so, the calls it
    /// has in flight. Told from its counters alone, without a snapshot:
    /// most of a large keyed set at every resync.
    fn quiet(&self, all: bool) -> Option<u64> {
        let pending = self.force
            || self.dirty
            || self.local_cycle
            || self.spend.is_some()
            || !self.leases.is_empty()
            || !self.releases.is_empty();
        if pending
            || !self.view.is_some_and(|v| v.cluster.is_closed())
            || self.breaker.state() != State::Closed
        {
            return None;
        }
        let c = self.breaker.remote().counters();
        (c == self.base && (!all || c.admitted + c.rejected == self.activity))
            .then_some(c.in_flight)
    }

    /// What to tell the cluster, if anything; with the breaker's state at
    /// this moment.
    pub(super) fn prepare(
        &mut self,
        now: Instant,
        all: bool,
        shared: bool,
        claim: impl FnOnce() -> String,
    ) -> Option<(Request, State)> {
        self.idle = false;
        if let Some(in_flight) = self.quiet(all) {
            self.trip_sent = false;
            self.idle = in_flight == 0;
            return None;
        }
        let snap = self.breaker.snapshot();
        let (c, b) = (
            snap.counters,
            std::mem::replace(&mut self.base, snap.counters),
        );
        let probe_ok = c.probe_successes.saturating_sub(b.probe_successes);
        let probe_failed = c.probe_failures.saturating_sub(b.probe_failures);
        // Closed-state outcomes: the lifetime counters less the probes'.
        let successes = c
            .successes
            .saturating_sub(b.successes)
            .saturating_sub(probe_ok);
        let failures = c
            .failures
            .saturating_sub(b.failures)
            .saturating_sub(probe_failed);
        let slow = c.slow.saturating_sub(b.slow);
        let healthy = c.health_probe_successes > b.health_probe_successes;
        let rejected = c.rejected.saturating_sub(b.rejected);
        let local = snap.state;
        // A shadow-mode breaker listens but never opens anyone else's.
        let active = !snap.metrics_only;
        let view_closed = self.view.is_none_or(|v| v.cluster.is_closed());

        if self.local_cycle && local != State::HalfOpen {
            // Its own probes decided: back to the cluster's cycles.
            self.end_local_cycle();
        }
        let mut req = Request {
            epoch: self.view.map_or(0, |v| v.epoch),
            ..Request::default()
        };
        if self.leases.front().is_some_and(|&(_, until)| until <= now) {
            // The cluster takes an unreported slot back when its lease runs
            // out; stop using it first by starting a fresh local cycle.
            self.leases.clear();
            if local == State::HalfOpen {
                self.breaker.remote().open_for(Duration::ZERO);
            }
        }
        let count = |n| usize::try_from(n).unwrap_or(usize::MAX);
        let outcomes = std::iter::repeat_n("s", count(probe_ok))
            .chain(std::iter::repeat_n("f", count(probe_failed)));
        for code in outcomes {
            match self.leases.pop_front() {
                Some((id, _)) => req.reports.push((id, code)),
                None => break,
            }
        }
        if local != State::HalfOpen {
            req.reports
                .extend(self.leases.drain(..).map(|(id, _)| (id, "r")));
        }
        req.reports
            .extend(self.releases.drain(..).map(|id| (id, "r")));
        if local != State::Open {
            self.trip_sent = false;
        }
        if active && local == State::Open && view_closed {
            req.trip = true;
            self.trip_sent = true;
            // A quota gate is shared as one, with what is left of its reset.
            if snap.reason == Some(Reason::QuotaExhausted) {
                req.gate = snap.retry_in.filter(|d| !d.is_zero());
            }
        }
        // By this replica's clock the cluster's open period has outlasted
        // the open cap (the server's clock went back): end it.
        if let (Some(v), Some((epoch, at))) = (self.view, self.opened)
            && matches!(v.cluster, Cluster::Open(_))
            && v.epoch == epoch
            && now >= later(at, self.longest())
        {
            req.overdue = true;
        }
        // A health probe found the upstream answering while the cluster
        // holds the circuit open: the cluster ends that open period for
        // every replica (else the next exchange would undo the local heal).
        if active
            && healthy
            && matches!(local, State::Open | State::HalfOpen)
            && self
                .view
                .is_some_and(|v| matches!(v.cluster, Cluster::Open(_)))
        {
            req.heal = true;
        }
        if active && local == State::Closed && view_closed && self.rule.aggregates() {
            req.calls = successes + failures;
            req.failures = failures;
            req.slow = slow.min(req.calls);
        }
        if shared
            && !self.local_cycle
            && local == State::HalfOpen
            && rejected > 0
            && self.leases.len() < self.rule.probes as usize
        {
            req.claim = Some(claim());
        }
        let inconsistent = match (local, self.view) {
            (_, None) => true,
            (State::HalfOpen, Some(v)) => v.cluster.is_closed(),
            // A replica whose operator overrode a cluster-wide control is
            // left alone until the next cluster transition.
            (State::Closed, Some(v)) => matches!(v.cluster, Cluster::Open(_) | Cluster::HalfOpen),
            _ => false,
        };
        let activity = c.admitted + c.rejected;
        let resync = all
            && (activity != std::mem::replace(&mut self.activity, activity)
                || local != State::Closed
                || !view_closed);
        // A guarded breaker reads the fleet's spend at every exchange it
        // takes part in, and takes part in every flush after it admitted
        // or charged anything.
        let spend_due = self.spend.is_some()
            && (c.admitted != self.spend_seen || self.breaker.remote().has_unsent_spend());
        let needed =
            resync || self.force || self.dirty || inconsistent || spend_due || !req.is_read();
        if needed && let Some(shape) = self.spend {
            self.spend_seen = c.admitted;
            req.spend = Some(SpendReport {
                amount: self.breaker.remote().take_spend(),
                shape,
            });
        }
        needed.then_some((req, local))
    }

    /// Whether a flush looks at the breaker again after a look that sent
    /// it (`sent`) or not: a look that sent it awaits the reply, and one
    /// that found it idle ends its flushes' looks unless it was just taken
    /// from the set's list.
    pub(super) fn stays_busy(&mut self, sent: bool) -> bool {
        let told = std::mem::take(&mut self.told);
        sent || !self.idle || told
    }

    /// The breaker's name and epoch, once, if the other replicas are to
    /// be told that the fleet's spend reached its budget.
    pub(super) fn spent_news(&mut self) -> Option<(Arc<str>, u64)> {
        std::mem::take(&mut self.announce)
            .then(|| (self.name.clone(), self.view.map_or(0, |v| v.epoch)))
    }

    /// Hands the breaker's half-open decisions back to the cluster.
    fn end_local_cycle(&mut self) {
        self.local_cycle = false;
        self.breaker.remote().set_shared(true);
    }

    /// Applies the cluster's answer to the local breaker.
    pub(super) fn apply(
        &mut self,
        reply: Reply,
        pending: Pending,
        sent: Instant,
        flush: Duration,
        origins: &Origins,
    ) {
        let remote = self.breaker.remote();
        // The fleet's spend holds whatever the circuit's state.
        if let (Some(_), Some(spend)) = (self.spend, &reply.spend) {
            let added = pending.request.spend.is_some_and(|s| s.amount > 0);
            self.announce |= remote.fold_spend(&spend.slices, spend.left, added);
        }
        let mut local = self.breaker.state();
        if local != pending.local {
            // It moved on while we asked (a fresh local trip, say): ask
            // again rather than act on a stale picture.
            self.force = true;
            if reply.granted {
                self.releases.extend(pending.request.claim);
            }
            return;
        }
        let new_epoch = self.view.is_some_and(|v| v.epoch != reply.epoch);
        let changed =
            std::mem::take(&mut self.force) || self.view.is_none_or(|v| v.epoch != reply.epoch);
        self.dirty = false;
        if changed {
            // The cluster cleared its probe slots with the transition.
            self.leases.clear();
        }
        let before = local;
        let controlled = lock(origins)
            .get(&self.name)
            .is_some_and(|&(s, o)| s == local && o == Origin::ClusterControl);
        let mut by_control = false;
        match reply.cluster {
            Cluster::ForcedOpen if changed && local != State::ForcedOpen => {
                self.breaker.force_open();
                by_control = true;
            }
            Cluster::Disabled if changed && local != State::Disabled => {
                self.breaker.disable();
                by_control = true;
            }
            Cluster::ForcedOpen | Cluster::Disabled => {}
            _ => {
                // An operator reset every replica, or lifted the cluster's
                // own forced state: so does this replica.
                // Epoch 0 is no cluster transition but lost state: an
                // operator's control lost with it stays where it is.
                if (reply.reset && new_epoch) || (changed && controlled && reply.epoch != 0) {
                    self.breaker.reset();
                    local = self.breaker.state();
                }
            }
        }
        // When this replica first learned of the open period: the deadline
        // the cluster gives is trusted up to the open cap (or the gate's
        // length) from then.
        match reply.cluster {
            Cluster::Open(_) | Cluster::HalfOpen => match self.opened {
                Some((e, _)) if e == reply.epoch => {}
                _ => {
                    self.opened = Some((reply.epoch, sent));
                    self.gate = match reply.cluster {
                        Cluster::Open(left) if reply.gated => left,
                        _ => Duration::ZERO,
                    };
                }
            },
            _ => {
                self.opened = None;
                self.gate = Duration::ZERO;
            }
        }
        // A quota gate keeps its own reset: the cluster neither ends nor
        // moves it (an operator's controls above still apply).
        let gated_here =
            local == State::Open && self.breaker.snapshot().reason == Some(Reason::QuotaExhausted);
        let cap = self.opened.map_or(Duration::ZERO, |(_, at)| {
            later(at, self.longest()).saturating_duration_since(Instant::now())
        });
        let open = |left: Duration| {
            let left = left.saturating_add(MARGIN).min(cap);
            if reply.gated {
                remote.gate_for(left);
            } else {
                remote.open_for(left);
            }
        };
        match (reply.cluster, local) {
            _ if gated_here => {}
            // Epoch 0: Redis holds no state (it restarted empty, was
            // flushed). Lost state closes nothing: a half-open breaker
            // finishes its cycle on its own probes, and an open one trips
            // the cluster again (see `prepare`).
            (Cluster::Closed, State::HalfOpen) if reply.epoch == 0 && !self.local_cycle => {
                self.local_cycle = true;
                remote.set_shared(false);
            }
            (Cluster::Closed, State::HalfOpen) if reply.epoch == 0 => {}
            (Cluster::Closed, State::HalfOpen) => remote.close(),
            (Cluster::Closed, State::Open) if changed && reply.epoch != 0 => remote.close(),
            (Cluster::Open(left), State::Closed | State::HalfOpen) => open(left),
            (Cluster::Open(left), State::Open) if changed => open(left),
            (Cluster::HalfOpen, State::Closed) => remote.open_for(Duration::ZERO),
            // This replica's own heal: its half-open cycle began with it.
            (Cluster::HalfOpen, State::HalfOpen) if changed && pending.request.heal => {}
            (Cluster::HalfOpen, State::Open | State::HalfOpen) if changed => {
                remote.open_for(Duration::ZERO)
            }
            _ => {}
        }
        // The script sums the cluster's window and leaves the judging to
        // the breaker's own rules: a trip here is shared by the next
        // exchange, as any local trip.
        if let (Cluster::Closed, Some(window)) = (reply.cluster, reply.window) {
            remote.evaluate(window);
        }
        let after = self.breaker.state();
        if self.local_cycle && (reply.epoch != 0 || after != State::HalfOpen) {
            // The cluster holds a state again, or the cycle is over.
            self.local_cycle = false;
            remote.set_shared(true);
        }
        if after != before || by_control {
            let origin = if by_control {
                Origin::ClusterControl
            } else {
                Origin::Cluster
            };
            lock(origins).insert(self.name.clone(), (after, origin));
        }
        self.view = Some(View {
            cluster: reply.cluster,
            epoch: reply.epoch,
        });
        if let Some(id) = pending.request.claim.filter(|_| reply.granted) {
            if self.breaker.state() == State::HalfOpen && remote.is_shared() {
                remote.grant_probes(1);
                let until = lease_end(sent, self.rule.lease, flush);
                self.leases.push_back((id, until));
            } else {
                self.releases.push(id);
            }
        }
    }
}

// === helpers ===

/// The instant a slot granted at `sent` must stop being used: a little before
/// the cluster takes it back, so an outcome is never reported on a slot the
/// cluster already counts as free.
pub(super) fn lease_end(sent: Instant, lease: Duration, flush: Duration) -> Instant {
    later(sent, lease.saturating_sub(flush.saturating_mul(2)))
}

/// `at + d`, saturating at about thirty years from `at` (as tokio's own far
/// future), where `at + d` would overflow.
pub(super) fn later(at: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    at.checked_add(d).unwrap_or_else(|| at + FAR)
}

#[cfg(test)]
#[path = "tracked_tests.rs"]
pub(super) mod tests;
