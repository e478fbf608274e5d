//! [`CircuitOpen`]: the core's word for a call it refused, with its
//! [`Rejection`] reason and when a call may be admitted again.
//!
//! # Example
//!
//! ```
//! use tower_circuit_breaker::{Breaker, CircuitOpen, Rejection};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let breaker = Breaker::builder().build().unwrap();
//! breaker.force_open();
//! let open: CircuitOpen = breaker.admit().unwrap_err();
//! assert_eq!(open.reason(), Rejection::ForcedOpen);
//! # }
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use super::spend::{Amount, SpendExceeded};
use super::state::State;

/// Why a call was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The circuit is open.
    Open,
    /// The circuit is half-open and its probes are out.
    HalfOpenFull,
    /// An operator forced the circuit open.
    ForcedOpen,
    /// The volume guard's limit of calls per period is reached.
    VolumeGuard,
    /// The circuit is open because the account's quota ran out (see
    /// [`Builder::quota_gate`](crate::Builder::quota_gate)).
    Quota,
    /// The upstream announced when its rate limit resets, and that moment
    /// has not come (see
    /// [`Builder::pace_rate_limits`](crate::Builder::pace_rate_limits)). The
    /// circuit itself is closed.
    RateLimited,
    /// The calls in flight without a fallback reached the in-flight limit,
    /// which fell because the upstream signals overload (see
    /// [`Builder::in_flight_limit`](crate::Builder::in_flight_limit)). The
    /// circuit itself is closed.
    InFlightLimit,
    /// The circuit just closed after half-open and admits only a rising
    /// share of the calls with a fallback (see
    /// [`Builder::ramp`](crate::Builder::ramp)); this one goes to its
    /// fallback.
    Ramp,
    /// A trip rule fired and graded admission turned this call (one
    /// without a fallback) away, with the probability the upstream cannot
    /// serve it (see [`Builder::trip_mode`](crate::Builder::trip_mode)).
    /// The circuit itself is closed.
    Graded,
    /// The spend guard's budget for the period is spent (see
    /// [`Builder::spend_guard`](crate::Builder::spend_guard) and
    /// [`CircuitOpen::spend`]). The circuit itself is closed. No retry
    /// helps before the budget resets: [`RetryPolicy`](crate::RetryPolicy)
    /// never retries it and [`Failover`](crate::Failover) returns it.
    SpendExceeded,
}

/// The circuit rejected the call; the upstream was not called.
///
/// Downcast it out of a [`BoxError`](crate::BoxError):
///
/// ```
/// use tower_circuit_breaker::{BoxError, Breaker, CircuitOpen, State};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let breaker = Breaker::builder().name("gpt").build().unwrap();
/// breaker.force_open();
/// let err: BoxError = breaker.admit().unwrap_err().into();
/// let open = err.downcast_ref::<CircuitOpen>().unwrap();
/// assert_eq!(open.key(), Some("gpt"));
/// assert_eq!(open.state(), State::ForcedOpen);
/// assert_eq!(open.retry_after(), None);
/// assert_eq!(open.retry_at(), None);
/// assert_eq!(open.to_string(), "circuit 'gpt' forced open");
/// # }
/// ```
#[derive(Clone)]
pub struct CircuitOpen {
    key: Option<Arc<str>>,
    cause: Rejection,
    /// When a call may be admitted again: a moment, not a duration, so
    /// that rejecting needs no clock read, and kept in the breaker's own
    /// terms until asked for.
    when: When,
}

/// When a call may be admitted again. A spent budget's detail is shared
/// with the ledger that made it (a reference count, no allocation per
/// rejection), and fits where a deadline does, so that no rejection is
/// larger for it.
#[derive(Clone)]
enum When {
    Unknown,
    At(Deadline),
    Spent(Arc<SpendExceeded>),
}

/// A moment `ns` nanoseconds after `epoch`.
#[derive(Clone, Copy)]
pub(crate) struct Deadline {
    pub(crate) epoch: Instant,
    pub(crate) ns: u64,
}

impl Deadline {
    pub(crate) fn instant(self) -> Instant {
        self.epoch + std::time::Duration::from_nanos(self.ns)
    }
}

impl CircuitOpen {
    pub(crate) fn new(key: Option<Arc<str>>, cause: Rejection, deadline: Option<Deadline>) -> Self {
        CircuitOpen {
            key,
            cause,
            when: match deadline {
                Some(d) => When::At(d),
                None => When::Unknown,
            },
        }
    }

    pub(crate) fn spent(key: Option<Arc<str>>, exceeded: Arc<SpendExceeded>) -> Self {
        CircuitOpen {
            key,
            cause: Rejection::SpendExceeded,
            when: When::Spent(exceeded),
        }
    }

    /// For [`Rejection::SpendExceeded`]: which budget, what the period's
    /// calls cost, and when it resets. `None` for every other reason.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::spend::{Charge, Period, SpendGuard, Unit};
    /// use tower_circuit_breaker::{Breaker, Outcome};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .name("agent")
    ///     .spend_guard(SpendGuard::tokens(1_000, Period::Rolling(Duration::from_secs(60))))
    ///     .build()
    ///     .unwrap();
    /// let mut permit = breaker.admit().unwrap();
    /// permit.charge(Charge::Observed(1_500));
    /// permit.record(Outcome::Success);
    /// let open = breaker.admit().unwrap_err();
    /// let spend = open.spend().unwrap();
    /// assert_eq!((spend.unit(), spend.spent(), spend.budget()), (Unit::Tokens, 1_500, 1_000));
    /// assert_eq!(
    ///     open.to_string(),
    ///     "circuit 'agent' spend budget exceeded: 1500 tokens of 1000 tokens; next call in 60 s"
    /// );
    /// # }
    /// ```
    #[must_use]
    pub fn spend(&self) -> Option<SpendExceeded> {
        match &self.when {
            When::Spent(spent) => Some(**spent),
            _ => None,
        }
    }

    /// The name or key of the breaker that rejected the call.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The state the circuit was in (closed, when the volume guard or
    /// pacing rejected; open, for an exhausted quota).
    #[must_use]
    pub fn state(&self) -> State {
        match self.cause {
            Rejection::Open | Rejection::Quota => State::Open,
            Rejection::HalfOpenFull => State::HalfOpen,
            Rejection::ForcedOpen => State::ForcedOpen,
            Rejection::VolumeGuard
            | Rejection::RateLimited
            | Rejection::InFlightLimit
            | Rejection::Ramp
            | Rejection::Graded
            | Rejection::SpendExceeded => State::Closed,
        }
    }

    /// Why the call was rejected.
    #[must_use]
    pub fn reason(&self) -> Rejection {
        self.cause
    }

    /// While open: the time from now until the next probe may be admitted;
    /// for the volume guard and pacing, until a call may be admitted again. `None` in
    /// half-open (the probes are out) and when forced open.
    ///
    /// Measured when asked, so it shrinks as the error is held: zero once
    /// the moment has passed.
    #[must_use]
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_at()
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// When a call may be admitted again; see
    /// [`retry_after`](Self::retry_after).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .trip_mode(TripMode::Open)
    ///     .consecutive_failures(1)
    ///     .open_duration(Duration::from_secs(30))
    ///     .jitter(0.0)
    ///     .build()
    ///     .unwrap();
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// let open = breaker.admit().unwrap_err();
    /// let at = open.retry_at().unwrap();
    /// assert_eq!(at - tokio::time::Instant::now(), Duration::from_secs(30));
    /// tokio::time::advance(Duration::from_secs(10)).await;
    /// assert_eq!(open.retry_after(), Some(Duration::from_secs(20)));
    /// # }
    /// ```
    #[must_use]
    pub fn retry_at(&self) -> Option<Instant> {
        match &self.when {
            When::Unknown => None,
            When::At(d) => Some(d.instant()),
            When::Spent(spent) => Some(spent.resets_at()),
        }
    }
}

impl fmt::Debug for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitOpen")
            .field("key", &self.key)
            .field("state", &self.state())
            .field("reason", &self.cause)
            .field("retry_after", &self.retry_after())
            .field("spend", &self.spend())
            .finish()
    }
}

/// Names the breaker (its stored key: a hashed key stays hashed), says why,
/// and how long until a call may be admitted again:
/// `circuit 'gpt-4o' open; next probe in 12 s`,
/// `circuit 'gpt-4o' volume guard: call limit reached; next call in 3 s`.
/// Waits are rounded up, so a caller that waits that long finds the circuit
/// ready.
impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("circuit ")?;
        if let Some(key) = self.key.as_deref() {
            // A key is request data: escaped, so it cannot forge a log line.
            write!(f, "'{}' ", key.escape_debug())?;
        }
        f.write_str(self.cause.describe())?;
        if let Some(spend) = self.spend() {
            let (spent, budget) = (spend.spent(), spend.budget());
            write!(
                f,
                ": {} of {}",
                Amount(spent, spend.unit()),
                Amount(budget, spend.unit())
            )?;
        }
        if let Some(wait) = self.retry_after() {
            write!(f, "; {} in {}", self.cause.waits_for(), Wait(wait))?;
        }
        Ok(())
    }
}

impl Rejection {
    /// A short lowercase name for the reason, fit for a metrics label
    /// (`"open"`, `"half_open_full"`, `"forced_open"`, `"volume_guard"`).
    ///
    /// ```
    /// use tower_circuit_breaker::Rejection;
    /// assert_eq!(Rejection::VolumeGuard.as_str(), "volume_guard");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Rejection::Open => "open",
            Rejection::HalfOpenFull => "half_open_full",
            Rejection::ForcedOpen => "forced_open",
            Rejection::VolumeGuard => "volume_guard",
            Rejection::Quota => "quota",
            Rejection::RateLimited => "rate_limited",
            Rejection::InFlightLimit => "in_flight_limit",
            Rejection::Ramp => "ramp",
            Rejection::Graded => "graded",
            Rejection::SpendExceeded => "spend_exceeded",
        }
    }

    /// What the rejection's message says after the breaker's name.
    const fn describe(self) -> &'static str {
        match self {
            Rejection::Open => "open",
            Rejection::HalfOpenFull => "half-open; its probes are out",
            Rejection::ForcedOpen => "forced open",
            Rejection::VolumeGuard => "volume guard: call limit reached",
            Rejection::Quota => "open: the quota ran out",
            Rejection::RateLimited => "paced: the upstream's rate limit has not reset",
            Rejection::InFlightLimit => "in-flight limit reached: the upstream signals overload",
            Rejection::Ramp => "ramping up after half-open; this call goes to its fallback",
            Rejection::Graded => "shedding: the upstream answers too few calls",
            Rejection::SpendExceeded => "spend budget exceeded",
        }
    }

    /// What the wait in the message is for.
    const fn waits_for(self) -> &'static str {
        match self {
            Rejection::Open | Rejection::HalfOpenFull | Rejection::Quota => "next probe",
            _ => "next call",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A wait, rounded up: whole seconds from one second on, else milliseconds.
struct Wait(std::time::Duration);

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns >= 1_000_000_000 {
            write!(f, "{} s", ns.div_ceil(1_000_000_000))
        } else {
            write!(f, "{} ms", ns.div_ceil(1_000_000))
        }
    }
}

impl StdError for CircuitOpen {}
