//! The circuit's states, their packed form and the views the breaker reports.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The state of one circuit.
///
/// `Closed`, `Open` and `HalfOpen` are driven by the trip rules; `ForcedOpen`
/// and `Disabled` are set by an operator (see [`Breaker::force_open`] and
/// [`Breaker::disable`]) and stay until [`Breaker::reset`].
///
/// [`Breaker::force_open`]: crate::Breaker::force_open
/// [`Breaker::disable`]: crate::Breaker::disable
/// [`Breaker::reset`]: crate::Breaker::reset
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Calls flow and are recorded.
    Closed,
    /// Calls are rejected until the open duration has elapsed.
    Open,
    /// A bounded number of probe calls decide whether to close again.
    HalfOpen,
    /// Rejects every call until reset, whatever the upstream does.
    ForcedOpen,
    /// Admits every call and records nothing.
    Disabled,
}

impl State {
    pub(crate) const fn tag(self) -> u64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
            State::ForcedOpen => 3,
            State::Disabled => 4,
        }
    }

    const fn from_tag(tag: u64) -> State {
        match tag {
            0 => State::Closed,
            1 => State::Open,
            2 => State::HalfOpen,
            3 => State::ForcedOpen,
            _ => State::Disabled,
        }
    }

    /// The lowercase name used in events and errors (`"half-open"`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half-open",
            State::ForcedOpen => "forced-open",
            State::Disabled => "disabled",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const TAG_BITS: u32 = 4;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// The tag of a state open because the account's quota ran out.
const QUOTA_OPEN: u64 = 5;
/// The tag of a half-open state with every probe slot taken.
const PROBES_OUT: u64 = 6;
/// The tag of an open state that lets one last-resort call through.
const LAST_RESORT: u64 = 7;
/// The tag of a closed state whose trip rule fired: graded admission.
const GRADED: u64 = 8;

/// The state and its generation packed into one word, so that one atomic load
/// tells a caller both what to do and which period its outcome belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Packed(pub(crate) u64);

impl Packed {
    pub(crate) const fn new(state: State, generation: u64) -> Self {
        Packed((generation << TAG_BITS) | state.tag())
    }

    /// Half-open with every probe slot taken, and nothing but a probe
    /// deadline coming (see [`Hot::open_until`](super::Hot)) to free one
    /// before the control lock's holders say otherwise.
    pub(crate) const fn probes_out(generation: u64) -> Self {
        Packed((generation << TAG_BITS) | PROBES_OUT)
    }

    /// Open because the account's quota ran out (see
    /// [`Reason::QuotaExhausted`]): rejections say
    /// [`Rejection::Quota`](super::Rejection::Quota).
    pub(crate) const fn quota_open(generation: u64) -> Self {
        Packed((generation << TAG_BITS) | QUOTA_OPEN)
    }

    /// Open, with one last-resort call granted (see
    /// [`Breaker::grant_last_resort`](super::Breaker::grant_last_resort)).
    pub(crate) const fn last_resort(generation: u64) -> Self {
        Packed((generation << TAG_BITS) | LAST_RESORT)
    }

    /// Closed, with a trip rule fired: calls without a fallback meet graded
    /// admission, calls with one open the circuit.
    pub(crate) const fn graded(generation: u64) -> Self {
        Packed((generation << TAG_BITS) | GRADED)
    }

    /// Whether this is [`graded`](Self::graded).
    #[inline]
    pub(crate) const fn is_graded(self) -> bool {
        self.0 & TAG_MASK == GRADED
    }

    /// Whether this is [`last_resort`](Self::last_resort).
    #[inline]
    pub(crate) const fn is_last_resort(self) -> bool {
        self.0 & TAG_MASK == LAST_RESORT
    }

    /// Whether this is [`quota_open`](Self::quota_open).
    #[inline]
    pub(crate) const fn is_quota_open(self) -> bool {
        self.0 & TAG_MASK == QUOTA_OPEN
    }

    pub(crate) const fn state(self) -> State {
        match self.0 & TAG_MASK {
            PROBES_OUT => State::HalfOpen,
            QUOTA_OPEN | LAST_RESORT => State::Open,
            GRADED => State::Closed,
            tag => State::from_tag(tag),
        }
    }

    /// Whether the state is [`State::Closed`].
    #[inline]
    pub(crate) const fn is_closed(self) -> bool {
        self.0 & TAG_MASK == 0
    }

    /// Whether this is [`probes_out`](Self::probes_out).
    #[inline]
    pub(crate) const fn is_probes_out(self) -> bool {
        self.0 & TAG_MASK == PROBES_OUT
    }

    pub(crate) const fn generation(self) -> u64 {
        self.0 >> TAG_BITS
    }
}

/// Why a transition happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The failure rate over the window reached its threshold.
    FailureRate,
    /// The slow-call rate over the window reached its threshold.
    SlowCallRate,
    /// The configured number of consecutive failures was reached.
    ConsecutiveFailures,
    /// The open duration elapsed and a probe call arrived.
    OpenElapsed,
    /// Enough half-open probes succeeded.
    ProbesSucceeded,
    /// Too many half-open probes failed for the circuit to close.
    ProbesFailed,
    /// An operator called [`Breaker::force_open`](crate::Breaker::force_open).
    ForcedOpen,
    /// An operator called [`Breaker::disable`](crate::Breaker::disable).
    Disabled,
    /// An operator called [`Breaker::reset`](crate::Breaker::reset).
    Reset,
    /// A shared-state backend applied the cluster's decision.
    Remote,
    /// A health probe found the upstream answering again.
    HealthProbe,
    /// The account's quota ran out ([`Outcome::QuotaExhausted`](crate::Outcome::QuotaExhausted)
    /// with quota gating on, see [`Builder::quota_gate`](crate::Builder::quota_gate)): open until
    /// the reset the provider announced, or the configured time.
    QuotaExhausted,
    /// A call let through an open circuit by the "every upstream open"
    /// policy of a [`Failover`](crate::failover::Failover) succeeded.
    LastResort,
    /// A keyed set had more keys open than its cap allows, and this key's
    /// circuit had been open longest: its open period ended early (see
    /// [`max_open_share`](crate::Builder::max_open_share)).
    OpenKeysCap,
}

impl Reason {
    /// The lowercase name used in events.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::FailureRate => "failure rate",
            Reason::SlowCallRate => "slow-call rate",
            Reason::ConsecutiveFailures => "consecutive failures",
            Reason::OpenElapsed => "open duration elapsed",
            Reason::ProbesSucceeded => "probes succeeded",
            Reason::ProbesFailed => "probes failed",
            Reason::ForcedOpen => "forced open",
            Reason::Disabled => "disabled",
            Reason::Reset => "reset",
            Reason::Remote => "shared state",
            Reason::HealthProbe => "health probe succeeded",
            Reason::QuotaExhausted => "quota exhausted",
            Reason::LastResort => "last-resort call succeeded",
            Reason::OpenKeysCap => "open keys above the cap",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One state change, as handed to listeners and traced.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Transition {
    /// The breaker's name or key, if it has one.
    pub key: Option<Arc<str>>,
    /// The state it left.
    pub from: State,
    /// The state it entered.
    pub to: State,
    /// Why it changed.
    pub reason: Reason,
    /// When it changed.
    pub at: tokio::time::Instant,
    /// For a transition to [`State::Open`]: how long it stays open.
    pub open_for: Option<Duration>,
}

/// Calls, failures and slow calls in the window, and their rates.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct WindowStats {
    /// Calls in the window.
    pub calls: u64,
    /// Failed calls in the window.
    pub failures: u64,
    /// Slow calls in the window.
    pub slow: u64,
}

impl WindowStats {
    /// A window of `calls` calls, `failures` of them failed and `slow` of
    /// them slow: what a shared-state backend summed across replicas, for
    /// [`Remote::evaluate`](crate::breaker::Remote::evaluate).
    ///
    /// ```
    /// use tower_circuit_breaker::WindowStats;
    /// let w = WindowStats::new(20, 10, 0);
    /// assert_eq!(w.failure_rate(), 0.5);
    /// ```
    #[must_use]
    pub const fn new(calls: u64, failures: u64, slow: u64) -> Self {
        WindowStats {
            calls,
            failures,
            slow,
        }
    }

    /// Failures divided by calls (0 when the window is empty).
    #[must_use]
    pub fn failure_rate(&self) -> f64 {
        ratio(self.failures, self.calls)
    }

    /// Slow calls divided by calls (0 when the window is empty).
    #[must_use]
    pub fn slow_rate(&self) -> f64 {
        ratio(self.slow, self.calls)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Lifetime counters of a breaker, never reset.
///
/// Every admitted call ends in exactly one of `successes`, `failures`,
/// `ignored`, `rate_limited`, `quota_exhausted` or `dropped`, or is still
/// `in_flight`: `in_flight` is `admitted` less those. A permit that leaked
/// (neither recorded nor dropped) would stay in `in_flight` for ever. The
/// counters are summed from per-thread stripes without stopping the
/// threads, so a snapshot taken while calls finish may be a call or two
/// apart between fields.
/// Outcomes that arrive after the state that admitted them has ended are
/// counted here too, although the trip rules no longer see them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Calls admitted (including half-open probes and, in metrics-only mode,
    /// calls that would have been rejected).
    pub admitted: u64,
    /// Calls admitted whose outcome is not recorded yet.
    pub in_flight: u64,
    /// Calls rejected.
    pub rejected: u64,
    /// Outcomes recorded as [`Outcome::Success`](crate::Outcome::Success).
    pub successes: u64,
    /// Outcomes recorded as [`Outcome::Failure`](crate::Outcome::Failure).
    pub failures: u64,
    /// Outcomes recorded as [`Outcome::Ignored`](crate::Outcome::Ignored).
    pub ignored: u64,
    /// Outcomes recorded as [`Outcome::RateLimited`](crate::Outcome::RateLimited).
    pub rate_limited: u64,
    /// Outcomes recorded as [`Outcome::QuotaExhausted`](crate::Outcome::QuotaExhausted).
    pub quota_exhausted: u64,
    /// Permits dropped without an outcome (a cancelled call).
    pub dropped: u64,
    /// Calls counted as slow (at completion or while still in flight).
    pub slow: u64,
    /// Calls a metrics-only breaker would have rejected (they were admitted).
    pub would_reject: u64,
    /// Calls the volume guard turned away (also counted in `rejected`, or in
    /// `would_reject` in metrics-only mode).
    pub volume_limited: u64,
    /// Half-open probes that succeeded (also counted in `successes`).
    pub probe_successes: u64,
    /// Half-open probes that failed, were slow, or had no response head by
    /// their deadline (also counted in `successes` or `failures` once they
    /// finish).
    pub probe_failures: u64,
    /// Health probes that found the upstream answering (not counted
    /// anywhere else).
    pub health_probe_successes: u64,
    /// Health probes that failed, timed out or could not be made.
    pub health_probe_failures: u64,
    /// Transition listeners that panicked (each panic was logged and the
    /// breaker carried on).
    pub listener_panics: u64,
    /// Calls turned away (or, in metrics-only mode, that would have been)
    /// while the circuit was open for an exhausted quota (also counted in
    /// `rejected` or `would_reject`).
    pub quota_rejected: u64,
    /// Calls turned away (or that would have been) by pacing, until a known
    /// rate limit resets (also counted in `rejected` or `would_reject`).
    pub paced: u64,
    /// Calls without a fallback turned away (or that would have been) by
    /// graded admission (also counted in `rejected` or `would_reject`).
    pub graded_rejected: u64,
}

/// A point-in-time view of a breaker.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Snapshot {
    /// The breaker's name or key, if it has one.
    pub key: Option<Arc<str>>,
    /// The current state.
    pub state: State,
    /// The window: the live one while closed; while open or half-open, the
    /// window that tripped the circuit; while forced open or disabled from
    /// closed, the window as it stood then.
    pub window: WindowStats,
    /// Current streak of consecutive failures.
    pub consecutive_failures: u64,
    /// While open: the time until the next probe may be admitted.
    pub retry_in: Option<Duration>,
    /// How many times the circuit reopened since it last closed.
    pub reopens: u32,
    /// Lifetime counters.
    pub counters: Counters,
    /// Whether the breaker is in metrics-only (shadow) mode.
    pub metrics_only: bool,
    /// Why the circuit entered its current state ([`Reason::QuotaExhausted`]
    /// for a circuit open on a quota); `None` before the first transition.
    pub reason: Option<Reason>,
    /// While pacing holds calls back (see
    /// [`Builder::pace_rate_limits`](crate::Builder::pace_rate_limits)): the
    /// time until the known rate limit resets.
    pub paced_for: Option<Duration>,
    /// While a trip rule has fired and graded admission sheds calls without
    /// a fallback (the state says [`State::Closed`]): its window's counts.
    pub shed: Option<Shed>,
    /// With a spend guard (see
    /// [`Builder::spend_guard`](crate::Builder::spend_guard)): its budget
    /// and what the current period's calls cost.
    pub spend: Option<super::spent::Spend>,
    /// The trip rules the window and the streak are judged by.
    pub thresholds: super::Thresholds,
}

/// What graded admission sheds (see
/// [`Builder::trip_mode`](crate::Builder::trip_mode)): its window's counts
/// and the probability the next call without a fallback is rejected.
///
/// ```
/// use tower_circuit_breaker::{Breaker, Outcome, TripMode};
///
/// let breaker = Breaker::builder()
///     .consecutive_failures(3)
///     .trip_mode(TripMode::Graded)
///     .seed(7)
///     .build()
///     .unwrap();
/// for _ in 0..3 {
///     breaker.admit().unwrap().record(Outcome::Failure);
/// }
/// let shed = breaker.snapshot().shed.expect("the rule fired: grading");
/// assert_eq!((shed.requests, shed.accepts), (3, 0));
/// assert!(shed.probability > 0.7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Shed {
    /// Calls without a fallback over the window, rejected ones included
    /// (seeded with the calls the trip rule saw).
    pub requests: u64,
    /// Those of them that succeeded.
    pub accepts: u64,
    /// Those of them graded admission rejected.
    pub rejected: u64,
    /// `max(0, (requests − K·accepts) / (requests + 1))`.
    pub probability: f64,
}

impl Shed {
    /// The share of the window's calls that were rejected.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, Outcome, TripMode};
    /// # let breaker = Breaker::builder().consecutive_failures(3).trip_mode(TripMode::Graded).build().unwrap();
    /// # for _ in 0..3 { breaker.admit().unwrap().record(Outcome::Failure); }
    /// assert_eq!(breaker.snapshot().shed.unwrap().share(), 0.0);
    /// ```
    #[must_use]
    pub fn share(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.rejected as f64 / self.requests as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_round_trips_state_and_generation() {
        for state in [
            State::Closed,
            State::Open,
            State::HalfOpen,
            State::ForcedOpen,
            State::Disabled,
        ] {
            let p = Packed::new(state, 12_345);
            assert_eq!(p.state(), state);
            assert_eq!(p.generation(), 12_345);
            assert!(!p.is_probes_out());
        }
        let p = Packed::last_resort(12_345);
        assert_eq!(p.state(), State::Open);
        assert!(p.is_last_resort() && !p.is_quota_open());
        let p = Packed::quota_open(12_345);
        assert_eq!(p.state(), State::Open);
        assert!(p.is_quota_open() && !p.is_closed());
        let p = Packed::probes_out(12_345);
        assert_eq!(p.state(), State::HalfOpen);
        assert_eq!(p.generation(), 12_345);
        assert!(p.is_probes_out());
    }
}
