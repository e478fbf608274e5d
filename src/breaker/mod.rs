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
//! use tower_circuit_breaker::{Breaker, Outcome, State};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let breaker = Breaker::builder()
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

mod changed;
mod config;
mod counters;
mod half_open;
mod outcome;
mod permit;
mod rejection;
mod remote;
mod spare;
mod state;
mod volume;
mod window;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::changed::Changed;
pub(crate) use self::config::{sealed, Config};
pub use self::config::{Build, Builder, ConfigError, Window};
pub use self::outcome::Outcome;
pub use self::permit::Permit;
pub use self::remote::Remote;
pub use self::state::{Counters, Reason, Snapshot, State, Transition, WindowStats};

use self::counters::{Counter, Striped};
use self::half_open::{Cycle, Expiry};
use self::permit::{Head, Kind, Ticket};
use self::rejection::Deadline;
pub use self::rejection::{CircuitOpen, Rejection};
use self::state::Packed;
use self::volume::VolumeGuard;
use self::window::{InFlight, Rates, FAILED, SLOW};
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
}

pub(crate) struct Shared {
    hot: Hot,
    /// Woken on every transition.
    changes: Arc<Notify>,
    rates: Rates,
    /// Calls in flight, tracked only when the slow-call rule is on.
    in_flight: Option<Mutex<InFlight>>,
    volume: Option<VolumeGuard>,
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
    /// Neither a volume guard nor a slow-call rule: a closed circuit admits
    /// with nothing but a permit.
    plain: bool,
    epoch: Instant,
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
        Breaker {
            shared: Arc::new(Shared {
                hot: Hot {
                    state: AtomicU64::new(Packed::new(State::Closed, 0).0),
                    open_until: AtomicU64::new(u64::MAX),
                    consecutive: AtomicU64::new(0),
                    metrics_only: AtomicBool::new(config.metrics_only),
                },
                changes: Arc::new(Notify::new()),
                rates: if has_window {
                    Rates::new(config.window)
                } else {
                    Rates::None
                },
                in_flight: slow_ns.map(|_| Mutex::new(InFlight::default())),
                volume: config
                    .volume_guard
                    .map(|(limit, period)| VolumeGuard::new(limit, nanos(period))),
                counters: Striped::new(config.counter_stripes, config.stripes_when_busy),
                control: Mutex::new(Control {
                    reopens: 0,
                    tripped: WindowStats::default(),
                    cycle: Cycle::default(),
                    rng: config.seed.map_or_else(Rng::random, Rng::new),
                    remote: false,
                    allowance: 0,
                }),
                plain: slow_ns.is_none() && config.volume_guard.is_none(),
                slow_ns,
                probe_deadline_ns: nanos(config.probe_deadline()),
                lease_ns: config.probe_lease.map(nanos),
                epoch: Instant::now(),
                name,
                config,
            }),
        }
    }

    /// Asks to make one call. Closed (and disabled) circuits admit at once,
    /// without a lock; open ones reject; half-open ones admit up to the probe
    /// budget.
    ///
    /// ```
    /// use tower_circuit_breaker::{Breaker, Outcome};
    /// let breaker = Breaker::builder().build().unwrap();
    /// let permit = breaker.admit().expect("a new breaker is closed");
    /// permit.record(Outcome::Success);
    /// ```
    #[inline]
    pub fn admit(&self) -> Result<Permit, CircuitOpen> {
        self.shared.admit()
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
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Rejects every call until [`reset`](Self::reset). Does not advance the
    /// reopen backoff.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, State};
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// assert!(breaker.admit().is_err());
    /// assert_eq!(breaker.state(), State::ForcedOpen);
    /// ```
    pub fn force_open(&self) {
        self.shared
            .set_manual(State::ForcedOpen, Reason::ForcedOpen);
    }

    /// Admits every call and records nothing, until [`reset`](Self::reset).
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, Outcome, State};
    /// let breaker = Breaker::builder().consecutive_failures(1).build().unwrap();
    /// breaker.disable();
    /// breaker.admit().unwrap().record(Outcome::Failure);
    /// assert_eq!(breaker.state(), State::Disabled);
    /// ```
    pub fn disable(&self) {
        self.shared.set_manual(State::Disabled, Reason::Disabled);
    }

    /// Closes the circuit with an empty window and the reopen backoff reset.
    /// Lifetime counters are kept.
    ///
    /// ```
    /// # use tower_circuit_breaker::{Breaker, State};
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.force_open();
    /// breaker.reset();
    /// assert_eq!(breaker.state(), State::Closed);
    /// ```
    pub fn reset(&self) {
        self.shared.set_manual(State::Closed, Reason::Reset);
    }

    /// Whether the breaker is in metrics-only (shadow) mode.
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().metrics_only(true).build().unwrap();
    /// assert!(breaker.is_metrics_only());
    /// ```
    #[inline]
    pub fn is_metrics_only(&self) -> bool {
        self.shared.hot.metrics_only.load(Ordering::Acquire)
    }

    /// Turns shadow mode on or off: the breaker keeps recording and making
    /// transitions, but admits the calls it would have rejected (counted in
    /// [`Counters::would_reject`]).
    ///
    /// ```
    /// # use tower_circuit_breaker::Breaker;
    /// let breaker = Breaker::builder().build().unwrap();
    /// breaker.set_metrics_only(true);
    /// breaker.force_open();
    /// assert!(breaker.admit().is_ok(), "shadow mode never rejects");
    /// assert_eq!(breaker.snapshot().counters.would_reject, 1);
    /// ```
    pub fn set_metrics_only(&self, on: bool) {
        self.shared.hot.metrics_only.store(on, Ordering::Release);
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
    pub fn changed(&self) -> Changed {
        Changed::new(&self.shared)
    }

    /// Records the answer of a health probe: the breaker's own cheap request
    /// to a circuit that is not closed (see [`crate::health`]). A
    /// [`Success`](Outcome::Success) ends the open period at once (the
    /// circuit goes half-open, so real traffic confirms the heal), and
    /// starts a fresh half-open cycle when every probe slot of the current
    /// one is held by calls still waiting for their response head. Anything
    /// else changes nothing. Health probes never enter the window, never
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
    pub fn ptr_eq(&self, other: &Breaker) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The validated configuration, for backends that apply the same rules
    /// elsewhere.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn config(&self) -> &Config {
        &self.shared.config
    }
}

// === impl Shared: time ===

impl Shared {
    #[inline]
    fn now(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.epoch))
    }

    /// The moment `ns` after `epoch`.
    #[inline]
    fn deadline(&self, ns: u64) -> Deadline {
        Deadline {
            epoch: self.epoch,
            ns,
        }
    }

    #[inline]
    fn load(&self) -> Packed {
        Packed(self.hot.state.load(Ordering::Acquire))
    }

    /// The next moment time alone changes the state; `u64::MAX` for none.
    fn next_deadline(&self) -> u64 {
        match self.load().state() {
            State::Open | State::HalfOpen => self.hot.open_until.load(Ordering::Acquire),
            _ => u64::MAX,
        }
    }

    fn set_open_until(&self, until: u64) {
        self.hot.open_until.store(until, Ordering::Release);
    }

    /// Applies the deadlines that have passed and returns the state.
    fn touch(&self) -> State {
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
    fn catch_up(&self, ctl: &mut Control, now: u64, events: &mut Events) {
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

// === impl Shared: admission ===

impl Shared {
    #[inline]
    fn admit(self: &Arc<Self>) -> Result<Permit, CircuitOpen> {
        let word = self.load();
        if word.is_closed() && self.plain {
            return Ok(Permit::new(self, word.generation(), Kind::Closed, 0));
        }
        self.admit_other(word)
    }

    /// Every admission but a plain closed circuit's.
    #[inline(never)]
    fn admit_other(self: &Arc<Self>, word: Packed) -> Result<Permit, CircuitOpen> {
        match word.state() {
            State::Closed => self.admit_closed(word.generation()),
            State::Disabled => Ok(Permit::new(self, word.generation(), Kind::Passive, 0)),
            State::Open => {
                let until = self.hot.open_until.load(Ordering::Acquire);
                let now = self.now();
                if now < until {
                    self.reject(Rejection::Open, Some(until))
                } else {
                    self.admit_probe(now)
                }
            }
            State::HalfOpen => {
                let now = self.now();
                if word.is_probes_out() && now < self.hot.open_until.load(Ordering::Acquire) {
                    // Every slot is taken and no deadline has come.
                    return self.reject(Rejection::HalfOpenFull, None);
                }
                self.admit_probe(now)
            }
            State::ForcedOpen => self.reject(Rejection::ForcedOpen, None),
        }
    }

    /// Whether the circuit is still in the period that admitted a call.
    /// Generations are compared modulo 2^32.
    #[inline]
    fn is_current(&self, state: State, generation: u32) -> bool {
        let word = self.load();
        word.state() == state && word.generation() as u32 == generation
    }

    #[inline]
    fn admit_closed(self: &Arc<Self>, generation: u64) -> Result<Permit, CircuitOpen> {
        if let Some(guard) = &self.volume {
            let now = self.now();
            if let Err(wait) = guard.try_admit(now) {
                self.counters.incr(Counter::VolumeLimited);
                return self.reject(Rejection::VolumeGuard, Some(now.saturating_add(wait)));
            }
        }
        let Some(in_flight) = &self.in_flight else {
            return Ok(Permit::new(self, generation, Kind::Closed, 0));
        };
        let now = self.now();
        let threshold = self.slow_ns.unwrap_or(u64::MAX);
        let mut f = lock(in_flight);
        let crossed = f.sweep(now, threshold);
        if crossed.is_empty() {
            let id = f.start(now);
            drop(f);
            return Ok(Permit::new(self, generation, Kind::Tracked, id));
        }
        drop(f);
        self.record_crossings(generation as u32, &crossed, now);
        if self.is_current(State::Closed, generation as u32) {
            let id = lock(in_flight).start(now);
            return Ok(Permit::new(self, generation, Kind::Tracked, id));
        }
        // The crossings this admission found tripped the circuit: it is the
        // first call the open circuit turns away, not one more call to an
        // upstream already known to hang.
        self.admit()
    }

    /// Calls still hanging past the slow threshold are slow now, not when
    /// their timeouts finally return; each takes its one place in the
    /// window here.
    #[cold]
    fn record_crossings(&self, generation: u32, crossed: &[u32], now: u64) {
        self.counters.add(Counter::Slow, crossed.len() as u64);
        for &id in crossed {
            let slot = self.record_closed(generation, SLOW, false, now);
            if let (Some(slot), Some(f)) = (slot, &self.in_flight) {
                lock(f).crossed_at(id, slot);
            }
        }
    }

    #[cold]
    fn admit_probe(self: &Arc<Self>, now: u64) -> Result<Permit, CircuitOpen> {
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
                return self.admit();
            }
        };
        self.remark(&mut ctl);
        drop(ctl);
        self.emit(events);
        match admitted {
            Ok(id) => Ok(Permit::new(self, word.generation(), Kind::Probe, id)),
            Err(Some(until)) => self.reject(Rejection::Open, Some(until)),
            Err(None) => self.reject(Rejection::HalfOpenFull, None),
        }
    }

    /// Probes the current half-open cycle may hold.
    fn budget(&self, ctl: &Control) -> u32 {
        if ctl.remote {
            ctl.allowance
        } else {
            self.config.probes
        }
    }

    /// In half-open, under the control lock: publishes the next probe
    /// deadline and marks the state word when every probe slot is taken, so
    /// that admissions are refused without the lock until a deadline comes.
    fn remark(&self, ctl: &mut Control) {
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
    fn reject(
        self: &Arc<Self>,
        cause: Rejection,
        deadline: Option<u64>,
    ) -> Result<Permit, CircuitOpen> {
        if self.hot.metrics_only.load(Ordering::Acquire) {
            self.counters.incr(Counter::WouldReject);
            return Ok(Permit::new(
                self,
                self.load().generation(),
                Kind::Passive,
                0,
            ));
        }
        self.counters.incr(Counter::Rejected);
        Err(CircuitOpen::new(
            self.name.clone(),
            cause,
            deadline.map(|ns| self.deadline(ns)),
        ))
    }
}

// === impl Shared: recording ===

impl Shared {
    /// Records a finished call.
    fn record(&self, permit: Ticket, head: &mut Head, outcome: Outcome) {
        if *head == Head::Pending {
            *head = self.judge_head(permit);
        }
        let slow = *head == Head::Slow;
        match permit.kind {
            Kind::Passive => {}
            Kind::Closed | Kind::Tracked => {
                let failed = match outcome {
                    Outcome::Success => false,
                    Outcome::Failure => true,
                    // Neutral everywhere: not in any window, and the streak
                    // of failures goes on.
                    _ => return,
                };
                let now = if matches!(self.rates, Rates::Time(_)) {
                    self.now()
                } else {
                    0
                };
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

    /// Judges the call's time to head, now: slow, fast, or already counted
    /// as slow while it was in flight. Counts a slow call. For a probe,
    /// marks its head as come, so its deadline no longer applies.
    fn judge_head(&self, permit: Ticket) -> Head {
        let started = match permit.kind {
            Kind::Tracked => match self.in_flight.as_ref().map(|f| lock(f).finish(permit.id)) {
                Some(window::Finished::Running(started)) => started,
                Some(window::Finished::Crossed(slot)) => return Head::Crossed(slot),
                Some(window::Finished::Gone) | None => return Head::Fast,
            },
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
            Kind::Closed | Kind::Passive => return Head::Fast,
        };
        let Some(threshold) = self.slow_ns else {
            return Head::Fast;
        };
        if self.now().saturating_sub(started) > threshold {
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
    fn record_closed(
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

    /// Runs the trip rules over the streak and the window.
    fn evaluate(&self, generation: u32, streak: u64, stats: WindowStats) {
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
            self.trip(generation, reason, stats);
        }
    }

    #[cold]
    fn trip(&self, generation: u32, reason: Reason, stats: WindowStats) {
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
    fn verdict(&self, ctl: &Control) -> Option<(State, Reason)> {
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
    fn record_probe(&self, generation: u32, id: u32, outcome: Outcome, slow: bool) {
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

    #[cold]
    fn record_health(&self, healthy: bool) {
        if !healthy {
            self.counters.incr(Counter::HealthProbeFailures);
            return;
        }
        self.counters.incr(Counter::HealthProbeSuccesses);
        let mut ctl = lock(&self.control);
        let now = self.now();
        let mut events = Events::default();
        self.catch_up(&mut ctl, now, &mut events);
        let restart = match self.load().state() {
            State::Open => true,
            // Every slot is held by calls still waiting for their heads
            // (hung, most likely, from before the heal) and nothing has
            // succeeded yet: real traffic could not confirm the heal until
            // their deadlines, so start a fresh cycle instead.
            State::HalfOpen => {
                ctl.cycle.successes == 0
                    && ctl.cycle.used() >= self.budget(&ctl)
                    && ctl.cycle.all_waiting_for_head()
            }
            _ => false,
        };
        if restart {
            events.push(self.transition(&mut ctl, State::HalfOpen, Reason::HealthProbe, now));
            self.remark(&mut ctl);
        }
        drop(ctl);
        self.emit(events);
    }

    #[cold]
    fn set_manual(&self, to: State, reason: Reason) {
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

// === impl Shared: transitions ===

impl Shared {
    /// Moves to `to` under the control lock at `at` (ns since `epoch`),
    /// starting a new generation.
    fn transition(&self, ctl: &mut Control, to: State, reason: Reason, at: u64) -> Transition {
        self.transition_for(ctl, to, reason, at, None)
    }

    /// Like [`transition`](Self::transition); an `Open` state lasts `open_ns`
    /// when given, instead of the backoff's next duration.
    fn transition_for(
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
                if from.state() == State::HalfOpen {
                    ctl.reopens = ctl.reopens.saturating_add(1);
                }
                let d = open_ns.unwrap_or_else(|| self.open_duration(ctl)).max(1);
                until = at.saturating_add(d);
                open_for = Some(Duration::from_nanos(d));
            }
            State::Closed => {
                ctl.reopens = 0;
                ctl.tripped = WindowStats::default();
                self.rates.clear();
                self.hot.consecutive.store(0, Ordering::Release);
                if let Some(guard) = &self.volume {
                    guard.clear();
                }
            }
            State::HalfOpen | State::ForcedOpen | State::Disabled => {}
        }
        if let Some(f) = &self.in_flight {
            lock(f).clear();
        }
        // The deadline before the word: a reader that sees the new word
        // reads its deadline.
        self.set_open_until(until);
        self.hot
            .state
            .store(Packed::new(to, generation).0, Ordering::Release);
        self.changes.notify_waiters();
        Transition {
            key: self.name.clone(),
            from: from.state(),
            to,
            reason,
            at: self.epoch + Duration::from_nanos(at),
            open_for,
        }
    }

    fn open_duration(&self, ctl: &mut Control) -> u64 {
        let c = &self.config;
        let base = nanos(c.open) as f64;
        let cap = nanos(c.open_max()) as f64;
        let grown = (base * c.backoff_multiplier.powi(ctl.reopens.min(1024) as i32)).min(cap);
        let jitter = if c.jitter > 0.0 {
            c.jitter * ctl.rng.unit()
        } else {
            0.0
        };
        ((grown * (1.0 - jitter)) as u64).max(1)
    }

    /// Traces each transition and calls the listeners, outside the control
    /// lock. A listener that panics is logged, counted and skipped: the
    /// panic never reaches the caller (nor a backend's task) that happened
    /// to make the transition. Under `panic = "abort"` nothing can be
    /// caught.
    fn emit(&self, events: Events) {
        for t in events.list.into_iter().flatten() {
            tracing::info!(
                target: "tower_circuit_breaker",
                key = t.key.as_deref().unwrap_or(""),
                from = t.from.as_str(),
                to = t.to.as_str(),
                reason = t.reason.as_str(),
                open_for_ms = t.open_for.map(|d| d.as_millis() as u64),
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

    fn snapshot(&self) -> Snapshot {
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
        };
        drop(ctl);
        self.emit(events);
        snapshot
    }
}

// === helpers ===

pub(crate) fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}
