//! The right to make one call, and the duty to report how it went.

#![allow(
    clippy::cast_possible_truncation,
    reason = "the state word keeps the generation in its low 32 bits: a generation is compared as u32 by design"
)]

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::counters::Counter;
use super::observe::Observe;
use super::outcome::Outcome;
use super::spend::Charge;
use super::{spare, Shared, Signal};

/// The kind of call a permit admitted. Whether the in-flight limit counts
/// it in its calls in flight is part of the kind ([`Kind::is_counted`]),
/// so that the plain closed path's one test of the kind also tells that it
/// has nothing to count out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    /// Admitted while closed.
    Closed = 0,
    /// Admitted while closed, and tracked in flight by the slow-call rule.
    Tracked = 1,
    /// A half-open probe.
    Probe = 2,
    /// Admitted but never recorded: disabled, or a shadow-mode call that
    /// would have been rejected.
    Passive = 3,
    /// The one call let through an open circuit by the "every upstream
    /// open" policy: counts in the open period's generation, where no rule
    /// runs; a success ends the open period, as a health probe's does.
    LastResort = 4,
    /// Admitted while closed without a fallback while the in-flight limit
    /// watches: its id is the calls in flight as it was admitted. Counted.
    Watched = COUNTED | 5,
    /// [`Closed`](Kind::Closed), counted in the in-flight limit's calls in
    /// flight (a call with a fallback admitted while it watches).
    CountedClosed = COUNTED,
    /// [`Tracked`](Kind::Tracked), counted likewise.
    CountedTracked = COUNTED | 1,
}

/// The bit of a [`Kind`] that says the in-flight limit counts the call.
const COUNTED: u8 = 8;

impl Kind {
    /// Counted in the in-flight limit's calls in flight (admitted while it
    /// watches): its end counts it out.
    #[inline]
    pub(super) fn is_counted(self) -> bool {
        self as u8 & COUNTED != 0
    }

    /// The same kind, counted.
    fn counted(self) -> Kind {
        match self {
            Kind::Closed => Kind::CountedClosed,
            Kind::Tracked => Kind::CountedTracked,
            other => other,
        }
    }
}

/// What the slow-call rule (or a probe's deadline) made of the call's time
/// to head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Head {
    /// Not judged yet.
    Pending,
    Fast,
    Slow,
    /// Counted as slow while still in flight, at this place in the window;
    /// not counted again.
    Crossed(super::window::Slot),
}

/// What the state machine needs to know of a permit to record it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    /// The low bits of the generation that admitted the call.
    pub(super) generation: u32,
    /// The probe's id, or the tracked call's id in flight.
    pub(super) id: u32,
    pub(super) kind: Kind,
    /// The overload signal its end carried (see [`Permit::signal`]).
    pub(super) signal: Signal,
    /// The call has somewhere else to go if refused (see
    /// [`HasFallback`](crate::HasFallback)).
    pub(super) fallback: bool,
    /// Admitted by graded admission: its success is an accept.
    pub(super) graded: bool,
    /// The breaker has a spend guard and the call is not charged yet.
    pub(super) metered: bool,
}

/// The right to make one call, and the duty to report how it went.
///
/// Dropping a permit without [`record`](Self::record) counts as
/// [`Outcome::Ignored`]: a half-open probe gives its slot back at once.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::{Breaker, Outcome};
///
/// let breaker = Breaker::builder().build().unwrap();
/// let mut permit = breaker.admit().unwrap();
/// permit.head_received(); // the response head came
/// permit.record(Outcome::Success);
/// assert_eq!(breaker.snapshot().counters.successes, 1);
///
/// // A call the caller gave up on says nothing about the upstream.
/// drop(breaker.admit().unwrap());
/// assert_eq!(breaker.snapshot().counters.dropped, 1);
/// ```
#[must_use = "a permit records nothing until `record` is called or it is dropped"]
pub struct Permit {
    /// `None` once the outcome is recorded (or the permit moved out).
    shared: Option<Arc<Shared>>,
    ticket: Ticket,
    head: Head,
    /// The observer's token for the call's start, when its time to first
    /// byte is reported (0: not timed); it fits in the padding after the
    /// ticket, so a permit is no larger for it.
    #[cfg(feature = "metrics")]
    start: u32,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("generation", &self.ticket.generation)
            .field("kind", &self.ticket.kind)
            .finish()
    }
}

impl Permit {
    #[inline]
    pub(super) fn new(
        shared: &Arc<Shared>,
        generation: u64,
        kind: Kind,
        id: u32,
        fallback: bool,
    ) -> Self {
        // Read on every admission but a plain closed circuit's (see
        // `plain`): a breaker with a guard is never plain.
        let metered = shared.spend.is_some();
        Permit::make(shared, generation, kind, id, fallback, metered)
    }

    /// Marks the call as counted in the in-flight limit's calls in flight.
    pub(super) fn count_in_flight(&mut self) {
        self.ticket.kind = self.ticket.kind.counted();
    }

    #[inline(always)]
    fn make(
        shared: &Arc<Shared>,
        generation: u64,
        kind: Kind,
        id: u32,
        fallback: bool,
        metered: bool,
    ) -> Self {
        shared.counters.incr(Counter::Admitted);
        Permit {
            shared: Some(spare::take(shared)),
            ticket: Ticket {
                generation: generation as u32,
                id,
                kind,
                signal: Signal::None,
                fallback,
                graded: false,
                metered,
            },
            head: Head::Pending,
            #[cfg(feature = "metrics")]
            start: 0,
        }
    }

    /// Times the call to its response head for the observer, if there is
    /// one (see [`Observe::start`]); [`report_head`](Self::report_head)
    /// reports it.
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn time_head(&mut self) {
        if let Some(observer) = self.observer() {
            self.start = observer.start();
        }
    }

    /// The response head came: tells the observer how long it took, if
    /// the call is timed.
    #[cfg(feature = "metrics")]
    #[inline]
    pub(crate) fn report_head(&self) {
        if self.start != 0
            && let Some(observer) = self.observer()
        {
            observer.head(self.start, self.is_probe());
        }
    }

    /// Whether this call is a half-open probe.
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().build().unwrap();
    /// assert!(!breaker.admit().unwrap().is_probe());
    /// ```
    #[must_use]
    pub fn is_probe(&self) -> bool {
        self.ticket.kind == Kind::Probe
    }

    /// Marks a call admitted by graded admission.
    #[inline]
    pub(super) fn set_graded(&mut self) {
        self.ticket.graded = true;
    }

    /// Whether the call was admitted as one with a fallback. Known on every
    /// admission but a plain closed circuit's (no slow-call rule, volume
    /// guard or pacing), where nothing reads it and it is `false`.
    #[allow(dead_code)]
    #[inline]
    pub(crate) fn has_fallback(&self) -> bool {
        self.ticket.fallback
    }

    /// Marks the arrival of the response head: the slow-call rule measures
    /// time to head (time to first token for a streamed answer), not time to
    /// the end of the body, so a long stream with a quick first token is not
    /// slow; and a half-open probe whose head came in time is no longer held
    /// to its probe deadline.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, Outcome};
    /// let breaker = Breaker::builder().build().unwrap();
    /// let mut permit = breaker.admit().unwrap();
    /// permit.head_received();
    /// permit.record(Outcome::Success);
    /// ```
    #[inline]
    pub fn head_received(&mut self) {
        self.head_came(|| None);
    }

    /// [`head_received`](Self::head_received), where the head may also
    /// announce that a rate limit is used up until a moment: `exhausted`
    /// says how long until it resets, and is asked only with pacing on.
    #[inline]
    pub(crate) fn head_came(&mut self, exhausted: impl FnOnce() -> Option<Duration>) {
        if let Some(shared) = &self.shared
            && self.head == Head::Pending
            && (self.ticket.kind == Kind::Probe || shared.head_work)
        {
            if self.ticket.kind == Kind::Probe || shared.slow_ns.is_some() {
                self.head = shared.judge_head(self.ticket);
            }
            if shared.pace
                && self.ticket.kind != Kind::Passive
                && let Some(wait) = exhausted()
            {
                shared.pace_for(wait);
            }
        }
    }

    /// The call's end carried an overload signal (an attempt timeout, a
    /// 429, a 503), for the in-flight limit; read with its outcome.
    #[inline]
    pub(crate) fn signal(&mut self, signal: Signal) {
        self.ticket.signal = signal;
    }

    /// Marks the call's end as an overload signal (the upstream answered
    /// 503, or the attempt timed out) for the in-flight limit (see
    /// [`Builder::in_flight_limit`](crate::Builder::in_flight_limit)); record the outcome after.
    /// The tower service marks 503s, 429s and attempt timeouts itself.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Outcome};
    /// let breaker = Breaker::builder().build().unwrap();
    /// let mut permit = breaker.admit().unwrap();
    /// permit.overloaded();
    /// permit.record(Outcome::Failure);
    /// // One signal says nothing yet of how it depends on the load.
    /// assert_eq!(breaker.in_flight_limit(), None);
    /// ```
    pub fn overloaded(&mut self) {
        self.signal(Signal::Unavailable);
    }

    /// With pacing on: a known rate limit is used up for `wait`.
    pub(crate) fn pace_for(&self, wait: Duration) {
        if let Some(shared) = &self.shared
            && shared.pace
            && self.ticket.kind != Kind::Passive
        {
            shared.pace_for(wait);
        }
    }

    /// Charges the call what it cost, with the breaker's spend guard (see
    /// [`Builder::spend_guard`](crate::Builder::spend_guard)); the first
    /// charge counts, later ones are ignored. A permit finished without a
    /// charge is charged [`Charge::Unknown`]. Nothing without a spend guard.
    /// The tower service charges calls itself, through a
    /// [`Meter`](crate::spend::Meter) classifier.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::spend::{Charge, Period, SpendGuard};
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .spend_guard(SpendGuard::tokens(10_000, Period::UtcDay))
    ///     .build()
    ///     .unwrap();
    /// let mut permit = breaker.admit().unwrap();
    /// permit.charge(Charge::Observed(1_234));
    /// permit.record(Outcome::Success);
    /// assert_eq!(breaker.snapshot().spend.unwrap().spent, 1_234);
    /// # }
    /// ```
    #[inline]
    pub fn charge(&mut self, charge: Charge) {
        if self.ticket.metered
            && let Some(shared) = &self.shared
        {
            self.ticket.metered = false;
            shared.charge(charge);
        }
    }

    /// [`new`](Self::new) for a plain closed circuit's call, which no
    /// rule but the window's sees, and nobody charges.
    #[inline]
    pub(super) fn plain(shared: &Arc<Shared>, generation: u64) -> Self {
        Permit::make(shared, generation, Kind::Closed, 0, false, false)
    }

    /// Whether the call is still to be charged (its breaker has a spend
    /// guard).
    #[inline]
    pub(crate) fn is_metered(&self) -> bool {
        self.ticket.metered
    }

    /// Records the call's outcome.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, Outcome, TripMode};
    /// let breaker = Breaker::builder().trip_mode(TripMode::Open).consecutive_failures(1).build().unwrap();
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// assert!(breaker.admit().is_err());
    /// ```
    #[inline]
    pub fn record(mut self, outcome: Outcome) {
        self.finish(outcome);
    }

    /// Records the outcome in place, leaving a permit that holds nothing
    /// (see [`is_finished`](Self::is_finished)).
    #[inline]
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.settle(Counter::from(outcome), outcome, &|| None);
    }

    /// [`finish`](Self::finish), where the answer may have announced when
    /// the account's quota resets: `announced` is asked only for a
    /// [`QuotaExhausted`](Outcome::QuotaExhausted) outcome with quota gating on.
    #[inline]
    pub(crate) fn finish_announced(
        &mut self,
        outcome: Outcome,
        announced: &dyn Fn() -> Option<Duration>,
    ) {
        self.settle(Counter::from(outcome), outcome, announced);
    }

    /// Whether [`finish`](Self::finish) or [`take`](Self::take) emptied it.
    #[inline]
    pub(crate) fn is_finished(&self) -> bool {
        self.shared.is_none()
    }

    /// Moves the permit out, leaving an empty one in its place.
    #[inline]
    pub(crate) fn take(&mut self) -> Permit {
        std::mem::replace(
            self,
            Permit {
                shared: None,
                ticket: self.ticket,
                head: self.head,
                #[cfg(feature = "metrics")]
                start: self.start,
            },
        )
    }

    /// Counts the call as `counter`, records `outcome` and gives the
    /// reference back to this thread; nothing if already done.
    #[inline(always)]
    fn settle(
        &mut self,
        counter: Counter,
        outcome: Outcome,
        announced: &dyn Fn() -> Option<Duration>,
    ) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        shared.counters.incr(counter);
        if let Some(observer) = shared.observer() {
            observer.outcome(
                outcome,
                matches!(counter, Counter::Dropped),
                shared.load().state(),
            );
        }
        // The healthy steady state: a success in a full, clean window with no
        // streak to break changes nothing, so it writes nothing. A call the
        // slow-call rule tracked is such a success once its head was judged
        // fast (which took it out of the calls in flight).
        let success = outcome == Outcome::Success
            // One test for both: a call still to charge is never plain.
            && !(self.ticket.graded | self.ticket.metered);
        // Nor is one to count out of the calls in flight: its kind says so.
        let plain_success = success
            && (self.ticket.kind == Kind::Closed
                || (self.ticket.kind == Kind::Tracked && self.head == Head::Fast));
        if !plain_success
            && success
            && self.ticket.signal == Signal::None
            && matches!(self.ticket.kind, Kind::Watched | Kind::CountedClosed)
        {
            // While the in-flight limit watches: the common end, counted
            // out and added to the watch, and otherwise a plain success.
            shared.counted_success(self.ticket.generation, self.ticket.kind, self.ticket.id);
        } else if !plain_success {
            if self.ticket.metered {
                self.ticket.metered = false;
                shared.charge(Charge::Unknown);
            }
            shared.record(self.ticket, &mut self.head, outcome, announced);
        } else if shared.hot.consecutive.load(Ordering::Relaxed) != 0 || !shared.rates.is_clean() {
            shared.record_success(self.ticket.generation);
        }
        spare::give_back(shared);
    }

    /// The breaker's observer, if it has one, while the permit holds its
    /// call.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    #[inline]
    pub(crate) fn observer(&self) -> Option<&dyn Observe> {
        self.shared.as_deref()?.observer()
    }

    #[cold]
    fn abandon(&mut self) {
        self.settle(Counter::Dropped, Outcome::Ignored, &|| None);
    }
}

impl Drop for Permit {
    #[inline]
    fn drop(&mut self) {
        // Most permits were recorded already; the rest are cancelled calls.
        if !self.is_finished() {
            self.abandon();
        }
    }
}

impl From<Outcome> for Counter {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Success => Counter::Successes,
            Outcome::Failure => Counter::Failures,
            Outcome::Ignored => Counter::Ignored,
            Outcome::RateLimited { .. } => Counter::RateLimited,
            Outcome::QuotaExhausted => Counter::QuotaExhausted,
        }
    }
}
