//! The circuit breaker state machine, free of tower and HTTP.
//!
//! A [`Breaker`] admits a call and hands back a [`Permit`]; the permit records
//! the call's [`Outcome`]. A permit dropped without an outcome counts as
//! [`Outcome::Ignored`] (a cancelled call says nothing about the upstream).
//!
//! # Time
//!
//! Time comes from [`tokio::time::Instant`], so `tokio::time::pause()` drives
//! every deadline in tests. The breaker arms no timer of its own: deadlines
//! (the end of the open period, a probe's deadline or lease) are checked
//! whenever the breaker is touched (an admission, a recorded outcome,
//! [`Breaker::state`], [`Breaker::snapshot`]) and applied at the moment they
//! came, not the moment they were noticed. [`Breaker::changed`] sleeps in the
//! waiter's own task. So a breaker works the same on a runtime built without
//! timers, or on none.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower_circuit_breaker::{Breaker, Outcome, State, TripMode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let breaker = Breaker::builder()
//!     .trip_mode(TripMode::Open)
//!     .consecutive_failures(3)
//!     .open_duration(Duration::from_secs(30))
//!     .build()
//!     .unwrap();
//!
//! for _ in 0..3 {
//!     let permit = breaker.admit().expect("closed circuits admit");
//!     permit.record(Outcome::Failure);
//! }
//! assert_eq!(breaker.state(), State::Open);
//!
//! let rejected = breaker.admit().unwrap_err();
//! assert!(rejected.retry_after().unwrap() <= Duration::from_secs(30));
//! # }
//! ```
//!
//! [`tokio::time::Instant`]: https://docs.rs/tokio/1/tokio/time/struct.Instant.html

mod admission;
mod changed;
mod clock;
mod config;
mod control;
pub(crate) use config::MAX_DURATION;
mod counters;
mod graded;
mod half_open;
mod limit;
mod observe;
mod open_cap;
mod outcome;
mod permit;
mod record;
mod rejection;
mod remote;
mod spare;
pub(crate) mod spend;
mod spent;
mod state;
mod thresholds;
mod transition;
mod turns;
mod volume;
mod window;

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::changed::Changed;
pub(crate) use self::clock::{nanos, past};
// Only the `metrics` feature makes observers (and times first bytes).
pub(crate) use self::config::{sealed, Config, SharedRules};
pub use self::config::{Build, Builder, ConfigError, InFlightLimit, TripMode, Window};
pub(crate) use self::limit::Signal;
#[cfg_attr(not(feature = "metrics"), allow(unused_imports))]
pub(crate) use self::observe::{MakeObserver, Observe};
pub use self::outcome::Outcome;
pub use self::permit::Permit;
pub use self::remote::Remote;
pub use self::state::{Counters, Reason, Shed, Snapshot, State, Transition, WindowStats};
pub use self::thresholds::Thresholds;
#[cfg(feature = "redis")]
pub(crate) use self::turns::Turn;
pub(crate) use self::turns::Turns;

use self::counters::{Counter, Striped};
use self::half_open::{Cycle, Expiry};
use self::limit::Limiter;
use self::rejection::Deadline;
pub use self::rejection::{CircuitOpen, Rejection};
use self::state::Packed;
use self::volume::VolumeGuard;
#[doc(hidden)]
pub use self::window::InFlightRing;
use self::window::{InFlight, Rates};
use crate::rng::Rng;
use crate::sync::{lock, AtomicBool, AtomicU64, Mutex};

/// A handle to one circuit breaker. Cheap to clone; every clone shares the
/// same state.
///
/// See the [module docs](self) for an example.
///
/// # Cost per call
///
/// A closed circuit admits with one atomic load and records a success with
/// a few loads and a store to a counter only the calling thread writes; it
/// touches no lock and no shared reference count (a finished permit leaves
/// its reference with its thread for the next call, so a thread may keep a
/// dropped breaker's state alive until it calls another breaker or exits).
/// An open circuit rejects with two atomic loads and one clock read.
///
/// ```
/// use tower_circuit_breaker::{Breaker, Outcome, State, TripMode};
///
/// let breaker = Breaker::builder().trip_mode(TripMode::Open).name("gpt-4o").consecutive_failures(2).build().unwrap();
/// breaker.admit().unwrap().record(Outcome::Failure);
/// breaker.admit().unwrap().record(Outcome::Failure);
/// let rejected = breaker.admit().unwrap_err();
/// assert_eq!(rejected.state(), State::Open);
/// assert_eq!(rejected.key(), Some("gpt-4o"));
/// ```
#[derive(Clone)]
pub struct Breaker {
    shared: Arc<Shared>,
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.shared.name)
            .field("state", &self.state())
            .finish()
    }
}

/// State read on every admission, kept on its own cache lines so that writes
/// to reference counts and counters elsewhere do not evict it.
#[repr(align(128))]
struct Hot {
    /// [`Packed`] state and generation.
    state: AtomicU64,
    /// The next moment time alone changes the state (ns since `epoch`):
    /// while open, the end of the open period; while half-open, the first
    /// probe deadline or lease; `u64::MAX` for none.
    open_until: AtomicU64,
    consecutive: AtomicU64,
    metrics_only: AtomicBool,
    /// With pacing on: calls are rejected until then (ns since `epoch`); 0
    /// for no known rate limit.
    paced_until: AtomicU64,
    /// An in-flight limit's watch or a ramp is on: closed admissions go
    /// through them.
    guarded: AtomicBool,
}

pub(crate) struct Shared {
    hot: Hot,
    /// Woken on every transition.
    changes: Arc<Notify>,
    rates: Rates,
    /// Calls in flight, tracked only when the slow-call rule is on.
    in_flight: Option<InFlight>,
    volume: Option<VolumeGuard>,
    /// The in-flight limit and the ramp after half-open, if either is on.
    limiter: Option<Limiter>,
    /// Graded admission, when a trip rule may fire and the trip mode is
    /// graded.
    graded: Option<graded::Graded>,
    /// The spend guard's ledger, if the breaker has one.
    spend: Option<spend::Ledger>,
    counters: Striped,
    control: Mutex<Control>,
    name: Option<Arc<str>>,
    config: Arc<Config>,
    /// Threshold of the slow-call rule, in ns.
    slow_ns: Option<u64>,
    /// A half-open probe's deadline for its response head, in ns.
    probe_deadline_ns: u64,
    /// A half-open probe's lease, in ns.
    lease_ns: Option<u64>,
    /// Neither a volume guard, a slow-call rule nor pacing: a closed
    /// circuit admits with nothing but a permit.
    plain: bool,
    /// Pacing on known rate limits is on.
    pace: bool,
    /// A response head has work to do beyond a probe's: the slow-call rule
    /// or pacing.
    head_work: bool,
    /// Quota gating: how long a quota answer that announced no reset opens
    /// the circuit, in ns.
    quota_gate_ns: Option<u64>,
    /// The longest an announced wait paces or quota-gates, in ns.
    max_wait_ns: u64,
    epoch: Instant,
    /// Told of calls, rejections and transitions, if anyone listens. Only
    /// the `metrics` feature makes observers: without it the field is not
    /// there, and no report tests it.
    #[cfg(feature = "metrics")]
    observer: Option<Box<dyn Observe>>,
}

/// Everything that changes only on transitions or in half-open.
struct Control {
    /// Reopens since the circuit last closed; drives the backoff.
    reopens: u32,
    /// The window that tripped the circuit, reported while it is open.
    tripped: WindowStats,
    cycle: Cycle,
    rng: Rng,
    /// A shared-state backend decides half-open cycles (see [`Remote`]).
    remote: bool,
    /// In remote mode: probes this replica may admit in the current cycle.
    allowance: u32,
    /// Why the circuit entered its current state.
    reason: Option<Reason>,
    /// When the circuit last opened (ns since `epoch`).
    opened_at: u64,
    /// The open generation whose one last-resort call was granted.
    last_resort: Option<u64>,
    /// A shared-state backend's say on whose turn it is to send the health
    /// probe (read by probers only, once an interval).
    turns: Option<Arc<dyn Turns>>,
}

/// Transitions made under the control lock, emitted once it is released.
/// One touch makes at most three (open -> half-open -> open -> half-open,
/// when a probe deadline passed long ago) and a recorded probe one more.
#[derive(Default)]
pub(crate) struct Events {
    list: [Option<Transition>; 4],
}

impl Events {
    fn push(&mut self, t: Transition) {
        match self.list.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some(t),
            None => debug_assert!(false, "more transitions in one touch than expected"),
        }
    }
}

// === impl Breaker ===

impl Breaker {
    /// A builder with the default configuration.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, State};
    /// let breaker = Breaker::builder().build().unwrap();
    /// assert_eq!(breaker.state(), State::Closed);
    /// ```
    #[must_use]
    pub fn builder() -> Builder<Breaker> {
        Builder::new()
    }

    pub(crate) fn from_config(config: Config) -> Self {
        let name = config.name.clone();
        Breaker::with_config(Arc::new(config), name)
    }

    /// A breaker sharing a validated configuration with others (keyed
    /// breakers), under its own name.
    pub(crate) fn with_config(config: Arc<Config>, name: Option<Arc<str>>) -> Self {
        let slow_ns = config.slow_call.map(|(t, _)| nanos(t));
        let has_window = config.has_rate_rule();
        let epoch = Instant::now();
        Breaker {
            shared: Arc::new(Shared {
                hot: Hot {
                    state: AtomicU64::new(Packed::new(State::Closed, 0).0),
                    open_until: AtomicU64::new(u64::MAX),
                    consecutive: AtomicU64::new(0),
                    metrics_only: AtomicBool::new(config.metrics_only),
                    paced_until: AtomicU64::new(0),
                    guarded: AtomicBool::new(false),
                },
                changes: Arc::new(Notify::new()),
                rates: if has_window {
                    Rates::new(config.window)
                } else {
                    Rates::None
                },
                in_flight: slow_ns.map(|t| InFlight::new(t, config.window, config.min_calls)),
                volume: config
                    .volume_guard
                    .map(|(limit, period)| VolumeGuard::new(limit, nanos(period))),
                limiter: Limiter::new(config.in_flight_limit, config.ramp),
                graded: config.graded_window().map(|window| {
                    graded::Graded::new(config.graded_k, nanos(window), config.seed)
                }),
                spend: config.spend.map(|guard| spend::Ledger::new(guard, epoch)),
                counters: Striped::new(config.counter_stripes, config.stripes_when_busy),
                control: Mutex::new(Control {
                    reopens: 0,
                    tripped: WindowStats::default(),
                    cycle: Cycle::default(),
                    rng: config.seed.map_or_else(Rng::random, Rng::new),
                    remote: false,
                    allowance: 0,
                    reason: None,
                    opened_at: 0,
                    last_resort: None,
                    turns: None,
                }),
                plain: slow_ns.is_none()
                    && config.volume_guard.is_none()
                    && !config.pace
                    && config.spend.is_none(),
                pace: config.pace,
                head_work: slow_ns.is_some() || config.pace,
                quota_gate_ns: config.quota_gate.map(nanos),
                max_wait_ns: nanos(config.max_rate_limit_wait),
                slow_ns,
                probe_deadline_ns: nanos(config.probe_deadline()),
                lease_ns: config.probe_lease.map(nanos),
                epoch,
                // A keyed set names each breaker by its key, never by the
                // name it gave the set.
                #[cfg(feature = "metrics")]
                observer: config.observer.as_ref().map(|make| {
                    let keyed = name.is_some()
                        && !matches!((&name, &config.name), (Some(a), Some(b)) if Arc::ptr_eq(a, b));
                    make.make(config.name.as_ref(), name.as_ref(), keyed)
                }),
                name,
                config,
            }),
        }
    }

    /// Asks to make one call. Closed (and disabled) circuits admit at once,
    /// without a lock; open ones reject; half-open ones admit up to the probe
    /// budget.
    ///
    /// # Errors
    ///
    /// A [`CircuitOpen`] when the circuit rejects the call: open, half-open
    /// with its probes taken, forced open, shedding, pacing or over a spend
    /// budget (its [`reason`](CircuitOpen::reason) says which).
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Outcome};
    /// let breaker = Breaker::builder().build().unwrap();
    /// let permit = breaker.admit().expect("a new breaker is closed");
    /// permit.record(Outcome::Success);
    /// ```
    #[inline]
    pub fn admit(&self) -> Result<Permit, CircuitOpen> {
        self.shared.admit(false)
    }

    /// [`admit`](Self::admit) for a call that has somewhere else to go if
    /// refused (see [`HasFallback`](crate::HasFallback)): the slow-call rule
    /// and the ramp after half-open apply to it, the in-flight limit does
    /// not.
    ///
    /// # Errors
    ///
    /// A [`CircuitOpen`], as [`admit`](Self::admit), and also wherever a
    /// call with a fallback is moved elsewhere rather than admitted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome, State, TripMode};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder()
    ///     .trip_mode(TripMode::Open)
    ///     .slow_call(Duration::from_secs(1), 0.5)
    ///     .count_window(4)
    ///     .min_calls(4)
    ///     .build()
    ///     .unwrap();
    /// // Slow calls without a fallback are answers: they move nothing.
    /// for _ in 0..4 {
    ///     let permit = breaker.admit().unwrap();
    ///     tokio::time::advance(Duration::from_secs(2)).await;
    ///     permit.record(Outcome::Success);
    /// }
    /// assert_eq!(breaker.state(), State::Closed);
    /// // With a fallback, the slow-call rule moves them elsewhere: two slow
    /// // calls of four reach its rate.
    /// for _ in 0..2 {
    ///     let permit = breaker.admit_with_fallback().unwrap();
    ///     tokio::time::advance(Duration::from_secs(2)).await;
    ///     permit.record(Outcome::Success);
    /// }
    /// assert_eq!(breaker.state(), State::Open);
    /// # }
    /// ```
    #[inline]
    pub fn admit_with_fallback(&self) -> Result<Permit, CircuitOpen> {
        self.shared.admit(true)
    }

    /// The in-flight limit calls without a fallback are held to now; `None`
    /// while it is unbounded (always, with the limit off). See
    /// [`Builder::in_flight_limit`].
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().build().unwrap();
    /// assert_eq!(breaker.in_flight_limit(), None);
    /// ```
    #[must_use]
    pub fn in_flight_limit(&self) -> Option<u64> {
        self.shared.limiter.as_ref().and_then(|l| l.current())
    }

    /// Admits a call whose fallback `fallback` tells, asked only where it
    /// can matter (never on a plain closed circuit).
    #[inline]
    pub(crate) fn admit_marked(
        &self,
        fallback: impl FnOnce() -> bool,
    ) -> Result<Permit, CircuitOpen> {
        self.shared.admit_marked(fallback)
    }

    /// The current state. Once the open period is over it says
    /// [`State::HalfOpen`], with no call needed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder().open_duration(Duration::from_secs(30)).jitter(0.0).build().unwrap();
    /// breaker.force_open();
    /// breaker.reset();
    /// assert_eq!(breaker.state(), State::Closed);
    /// # }
    /// ```
    #[inline]
    #[must_use]
    pub fn state(&self) -> State {
        let state = self.shared.load().state();
        match state {
            State::Open | State::HalfOpen => self.shared.touch(),
            _ => state,
        }
    }

    /// The breaker's name, if it has one.
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().name("gpt-4o").build().unwrap();
    /// assert_eq!(breaker.name(), Some("gpt-4o"));
    /// ```
    #[must_use]
    pub fn name(&self) -> Option<&str> {
        self.shared.name.as_deref()
    }

    /// State, window, counters and timers at this moment.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, State};
    /// let breaker = Breaker::builder().build().unwrap();
    /// let snap = breaker.snapshot();
    /// assert_eq!(snap.state, State::Closed);
    /// assert_eq!(snap.counters.admitted, 0);
    /// ```
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// A future that completes at the next state change after this call,
    /// including one that comes with time alone (the end of the open
    /// period), which it waits for in its own task.
    ///
    /// A retry waiting out its backoff can race its sleep against this, so it
    /// learns at once that the circuit opened instead of sleeping first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder().open_duration(Duration::from_secs(30)).jitter(0.0).build().unwrap();
    /// breaker.remote().open_for(Duration::from_secs(30));
    /// breaker.changed().await; // wakes when the open period is over
    /// assert_eq!(breaker.state(), State::HalfOpen);
    /// # }
    /// ```
    #[must_use]
    pub fn changed(&self) -> Changed {
        Changed::new(&self.shared)
    }

    /// Records the answer of a health probe: the breaker's own cheap request
    /// to a circuit that is not closed (see [`crate::health`]). A
    /// [`Success`](Outcome::Success) ends the open period at once (the
    /// circuit goes half-open, so real traffic confirms the heal) and does
    /// nothing else: a half-open cycle goes on with its probes in flight and
    /// its probe budget (a cycle held by hung probes ends at their
    /// `probe_timeout`, and the next healthy probe ends the open period
    /// that follows). Anything else changes nothing. Health probes never enter the window, never
    /// advance the reopen backoff, and are counted apart
    /// ([`Counters::health_probe_successes`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, Outcome, State};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.remote().open_for(Duration::from_secs(30));
    /// breaker.record_health_probe(Outcome::Success);
    /// assert_eq!(breaker.state(), State::HalfOpen);
    /// # }
    /// ```
    pub fn record_health_probe(&self, outcome: Outcome) {
        self.shared.record_health(outcome == Outcome::Success);
    }

    /// Controls for a shared-state backend (such as the Redis one) that keeps
    /// this breaker in step with other replicas.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::{Breaker, State};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // Another replica opened the shared circuit for 30 s more.
    /// let breaker = Breaker::builder().name("gpt-4o").build().unwrap();
    /// breaker.remote().open_for(Duration::from_secs(30));
    /// assert_eq!(breaker.state(), State::Open);
    /// # }
    /// ```
    #[must_use]
    pub fn remote(&self) -> Remote<'_> {
        Remote {
            shared: &self.shared,
        }
    }

    /// Whether two handles share one breaker.
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let a = Breaker::builder().build().unwrap();
    /// assert!(a.ptr_eq(&a.clone()));
    /// ```
    #[must_use]
    pub fn ptr_eq(&self, other: &Breaker) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// While open (not for an exhausted quota), with no last-resort call
    /// granted in this open period yet: when the circuit opened. The
    /// candidates of a [`Failover`](crate::failover::Failover) whose every
    /// upstream is open.
    pub(crate) fn last_resort_candidate(&self) -> Option<Instant> {
        if self.state() != State::Open {
            return None;
        }
        let ctl = lock(&self.shared.control);
        let word = self.shared.load();
        let granted = ctl.last_resort == Some(word.generation());
        let eligible = word.state() == State::Open && !word.is_quota_open() && !granted;
        eligible.then(|| self.shared.epoch + Duration::from_nanos(ctl.opened_at))
    }

    /// Lets the next call through this open circuit, once per open period
    /// (the generation that call counts in is the open period's: it moves
    /// no trip rule; a success ends the open period as a health probe's
    /// does). Returns whether the call was granted.
    pub(crate) fn grant_last_resort(&self) -> bool {
        let mut ctl = lock(&self.shared.control);
        let word = self.shared.load();
        if word.state() != State::Open
            || word.is_quota_open()
            || ctl.last_resort == Some(word.generation())
        {
            return false;
        }
        ctl.last_resort = Some(word.generation());
        self.shared
            .hot
            .state
            .store(Packed::last_resort(word.generation()).0, Ordering::Release);
        true
    }

    /// The rules a shared-state backend applies across replicas.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn shared_rules(&self) -> SharedRules {
        self.shared.config.shared_rules()
    }
}
