//! The circuit breaker state machine, free of tower and HTTP.
//!
//! A [`Breaker`] admits a call and hands back a [`Permit`]; the permit records
//! the call's [`Outcome`]. A permit dropped without an outcome counts as
//! [`Outcome::Ignored`] (a cancelled call says nothing about the upstream).
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

mod config;
mod counters;
mod spare;
mod state;
mod volume;
mod window;

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

pub(crate) use self::config::{sealed, Config};
pub use self::config::{Build, Builder, ConfigError, Window};
pub use self::state::{Counters, Reason, Snapshot, State, Transition, WindowStats};

use self::counters::{Counter, Striped};
use self::state::Packed;
use self::volume::VolumeGuard;
use self::window::{InFlight, Rates, FAILED, SLOW};
use crate::error::{CircuitOpen, Deadline, Rejection};
use crate::rng::Rng;
use crate::sync::{lock, AtomicBool, AtomicU64, Mutex};
use crate::Outcome;

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
/// An open circuit opened inside a Tokio runtime with timers rejects without
/// reading the clock until a timer set just before its deadline fires; the
/// deadline is kept to the nanosecond all the same, in paused time too.
/// Elsewhere it reads the clock: outside a runtime, in a runtime without
/// timers (Tokio's panic on trying is caught, and its message printed, once
/// per breaker), and in builds with `panic = "abort"`, which never try.
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
    /// While open: when the next probe may be admitted (ns since `epoch`).
    open_until: AtomicU64,
    consecutive: AtomicU64,
    metrics_only: AtomicBool,
}

pub(crate) struct Shared {
    hot: Hot,
    /// Marks open deadlines as they pass, so that rejecting reads no clock.
    alarm: Arc<Alarm>,
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
    /// Neither a volume guard nor a slow-call rule: a closed circuit admits
    /// with nothing but a permit.
    plain: bool,
    epoch: Instant,
}

/// A coarse clock fed by the runtime's timer, so that rejecting while open
/// (or while every half-open probe slot is taken) reads no clock.
///
/// When the circuit opens inside a Tokio runtime (or its last probe slot is
/// taken), a timer is registered for one millisecond before the deadline
/// (the end of the open period, or of the first probe lease) (the driver rounds up to whole
/// milliseconds), with this as its waker. The driver wakes it as it
/// processes timers, before it polls any task, and the wake writes the
/// deadline into [`passed`](Self::passed). While the state word is
/// [`Packed::timed`] or [`Packed::probes_out`] and the deadline is above
/// `passed`, the deadline has
/// not come: the call is rejected without reading the clock. From then on
/// the clock decides, exactly, as it does where no timer could be armed.
/// A waker woken early, or by a driver shutting down, only sends calls to
/// the clock sooner.
#[derive(Default)]
struct Alarm {
    /// The deadline of the armed timer (ns since `epoch`).
    armed: AtomicU64,
    /// The latest deadline known to have come, or nearly (ns since `epoch`).
    passed: AtomicU64,
    /// Timers are not available (a runtime without a time driver).
    unavailable: AtomicBool,
}

impl std::task::Wake for Alarm {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let at = self.armed.load(Ordering::Acquire);
        self.passed.fetch_max(at, Ordering::AcqRel);
    }
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
    /// While open, or half-open with every slot taken: the timer that feeds
    /// [`Alarm`].
    timer: Option<Pin<Box<Sleep>>>,
}

/// Bookkeeping of one half-open cycle.
#[derive(Default)]
struct Cycle {
    /// Probes admitted and not yet finished: id, lease deadline, start.
    leases: Vec<(u32, u64, u64)>,
    successes: u32,
    failures: u32,
    next_id: u32,
}

impl Cycle {
    fn used(&self) -> u32 {
        self.leases.len() as u32 + self.successes + self.failures
    }

    /// Takes back the slots of probes whose lease ran out.
    fn reclaim(&mut self, now: u64) {
        self.leases.retain(|&(_, deadline, _)| deadline > now);
    }

    /// Ends probe `id`'s lease; `false` if it had already expired.
    fn release(&mut self, id: u32) -> bool {
        match self.leases.iter().position(|&(p, _, _)| p == id) {
            Some(i) => {
                self.leases.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

// === impl Breaker ===

impl Breaker {
    /// A builder with the default configuration.
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
                    open_until: AtomicU64::new(0),
                    consecutive: AtomicU64::new(0),
                    metrics_only: AtomicBool::new(config.metrics_only),
                },
                alarm: Arc::default(),
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
                    timer: None,
                }),
                plain: slow_ns.is_none() && config.volume_guard.is_none(),
                slow_ns,
                epoch: Instant::now(),
                name,
                config,
            }),
        }
    }

    /// Asks to make one call. Closed (and disabled) circuits admit at once,
    /// without a lock; open ones reject; half-open ones admit up to the probe
    /// budget.
    #[inline]
    pub fn admit(&self) -> Result<Permit, CircuitOpen> {
        self.shared.admit()
    }

    /// The current state.
    #[inline]
    pub fn state(&self) -> State {
        Packed(self.shared.hot.state.load(Ordering::Acquire)).state()
    }

    /// The breaker's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.shared.name.as_deref()
    }

    /// State, window, counters and timers at this moment.
    pub fn snapshot(&self) -> Snapshot {
        self.shared.snapshot()
    }

    /// Rejects every call until [`reset`](Self::reset). Does not advance the
    /// reopen backoff.
    pub fn force_open(&self) {
        self.shared
            .set_manual(State::ForcedOpen, Reason::ForcedOpen);
    }

    /// Admits every call and records nothing, until [`reset`](Self::reset).
    pub fn disable(&self) {
        self.shared.set_manual(State::Disabled, Reason::Disabled);
    }

    /// Closes the circuit with an empty window and the reopen backoff reset.
    /// Lifetime counters are kept.
    pub fn reset(&self) {
        self.shared.set_manual(State::Closed, Reason::Reset);
    }

    /// Whether the breaker is in metrics-only (shadow) mode.
    #[inline]
    pub fn is_metrics_only(&self) -> bool {
        self.shared.hot.metrics_only.load(Ordering::Acquire)
    }

    /// Turns shadow mode on or off: the breaker keeps recording and making
    /// transitions, but admits the calls it would have rejected (counted in
    /// [`Counters::would_reject`]).
    pub fn set_metrics_only(&self, on: bool) {
        self.shared.hot.metrics_only.store(on, Ordering::Release);
    }

    /// A future that completes at the next state change after this call.
    ///
    /// A retry waiting out its backoff can race its sleep against this, so it
    /// learns at once that the circuit opened instead of sleeping first.
    pub fn changed(&self) -> Changed {
        Changed {
            inner: Arc::clone(&self.shared.changes).notified_owned(),
        }
    }

    /// Controls for a shared-state backend (such as the Redis one) that keeps
    /// this breaker in step with other replicas.
    pub fn remote(&self) -> Remote<'_> {
        Remote {
            shared: &self.shared,
        }
    }

    /// Whether two handles share one breaker.
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

// === impl Shared ===

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

    /// Arms the timer that marks `until` in [`Alarm`]; `false` when none
    /// could be armed (no runtime at hand, or one without timers).
    ///
    /// Tokio offers no way to ask whether a runtime has timers but to try
    /// and catch its panic, so builds that abort on panic never try.
    fn arm(&self, ctl: &mut Control, until: u64) -> bool {
        ctl.timer = None;
        if cfg!(loom) || cfg!(panic = "abort") || self.alarm.unavailable.load(Ordering::Relaxed) {
            return false;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return false;
        }
        self.alarm.armed.store(until, Ordering::Release);
        let at = self.deadline(until.saturating_sub(TIMER_LEAD)).instant();
        // A runtime without a time driver panics here, once per breaker.
        let Ok(mut sleep) = std::panic::catch_unwind(|| Box::pin(tokio::time::sleep_until(at)))
        else {
            self.alarm.unavailable.store(true, Ordering::Relaxed);
            return false;
        };
        let waker = Waker::from(Arc::clone(&self.alarm));
        if sleep
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            return false;
        }
        ctl.timer = Some(sleep);
        true
    }

    /// Under the control lock: arms the timer for `until`, publishes
    /// `until` as the deadline and returns `marked`, or `plain` if no timer
    /// could be armed. The timer is armed before the deadline is published,
    /// so a reader that sees this deadline with the marked word can trust it.
    fn mark_until(&self, ctl: &mut Control, until: u64, marked: Packed, plain: Packed) -> Packed {
        let word = if self.arm(ctl, until) { marked } else { plain };
        self.hot.open_until.store(until, Ordering::Release);
        word
    }

    /// Sets the deadline of an open circuit and arms its timer, or falls
    /// back to the clock. Called under the control lock.
    fn open_until(&self, ctl: &mut Control, until: u64, generation: u64) {
        let word = self.mark_until(
            ctl,
            until,
            Packed::timed(generation),
            Packed::new(State::Open, generation),
        );
        self.hot.state.store(word.0, Ordering::Release);
    }

    #[inline]
    fn load(&self) -> Packed {
        Packed(self.hot.state.load(Ordering::Acquire))
    }

    #[inline]
    fn admit(self: &Arc<Self>) -> Result<Permit, CircuitOpen> {
        let word = self.load();
        if word.is_closed() && self.plain {
            return Ok(Permit::new(self, word.generation(), Kind::Closed, 0));
        }
        if word.has_deadline() {
            let until = self.hot.open_until.load(Ordering::Acquire);
            if self.alarm.passed.load(Ordering::Acquire) < until && !clock_turn() {
                // The timer for this deadline has not fired: not due yet.
                return match word.state() {
                    State::Open => self.reject(Rejection::Open, Some(until)),
                    _ => self.reject(Rejection::HalfOpenFull, None),
                };
            }
        }
        self.admit_other(word)
    }

    /// Every admission but a closed circuit's without a volume guard or
    /// slow-call rule, and an open one's whose timer is pending.
    #[inline(never)]
    fn admit_other(self: &Arc<Self>, word: Packed) -> Result<Permit, CircuitOpen> {
        match word.state() {
            State::Closed => self.admit_closed(word.generation()),
            State::Disabled => Ok(Permit::new(self, word.generation(), Kind::Passive, 0)),
            State::Open => self.admit_open(self.hot.open_until.load(Ordering::Acquire)),
            State::HalfOpen => self.admit_probe(self.now()),
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
        let (crossed, id) = {
            let mut f = lock(in_flight);
            (f.sweep(now, threshold), f.start(now))
        };
        let permit = Permit::new(self, generation, Kind::Tracked, id);
        if crossed > 0 {
            // Calls still hanging past the threshold are slow now, not when
            // their timeouts finally return. This call was admitted while
            // closed, even if these crossings open the circuit.
            self.counters.add(Counter::Slow, crossed);
            for _ in 0..crossed {
                self.record_closed(generation as u32, SLOW, false, now);
            }
        }
        Ok(permit)
    }

    /// An open circuit whose deadline may have passed: the clock decides.
    #[cold]
    fn admit_open(self: &Arc<Self>, until: u64) -> Result<Permit, CircuitOpen> {
        let now = self.now();
        if now < until {
            self.reject(Rejection::Open, Some(until))
        } else {
            self.admit_probe(now)
        }
    }

    #[cold]
    fn admit_probe(self: &Arc<Self>, now: u64) -> Result<Permit, CircuitOpen> {
        let mut ctl = lock(&self.control);
        let word = self.load();
        let mut event = None;
        match word.state() {
            State::Open => {
                let until = self.hot.open_until.load(Ordering::Acquire);
                if now < until {
                    drop(ctl);
                    return self.reject(Rejection::Open, Some(until));
                }
                event = Some(self.transition(&mut ctl, State::HalfOpen, Reason::OpenElapsed, now));
            }
            State::HalfOpen => {}
            // It changed while we waited for the lock.
            State::Closed | State::Disabled | State::ForcedOpen => {
                drop(ctl);
                return self.admit();
            }
        }
        let generation = self.load().generation();
        ctl.cycle.reclaim(now);
        let admitted = (ctl.cycle.used() < self.budget(&ctl)).then(|| {
            let id = ctl.cycle.next_id;
            ctl.cycle.next_id = id.wrapping_add(1);
            let deadline = now + nanos(self.config.lease());
            ctl.cycle.leases.push((id, deadline, now));
            id
        });
        self.mark_probes(&mut ctl, generation);
        drop(ctl);
        if let Some(t) = event {
            self.emit(t);
        }
        match admitted {
            Some(id) => Ok(Permit::new(self, generation, Kind::Probe, id)),
            None => self.reject(Rejection::HalfOpenFull, None),
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

    /// In half-open, under the control lock: marks the state word when every
    /// probe slot is taken, so that admissions are refused without the lock
    /// (or the clock) until the first lease may run out.
    fn mark_probes(&self, ctl: &mut Control, generation: u64) {
        let word = if ctl.cycle.used() < self.budget(ctl) {
            ctl.timer = None;
            Packed::new(State::HalfOpen, generation)
        } else {
            match ctl
                .cycle
                .leases
                .iter()
                .map(|&(_, deadline, _)| deadline)
                .min()
            {
                // Only the lock's holders can free a slot.
                None => {
                    ctl.timer = None;
                    self.hot.open_until.store(u64::MAX, Ordering::Release);
                    Packed::probes_out(generation)
                }
                // Already marked, and its timer still pending.
                Some(until)
                    if self.load() == Packed::probes_out(generation)
                        && self.hot.open_until.load(Ordering::Acquire) == until
                        && ctl.timer.is_some() =>
                {
                    return;
                }
                Some(until) => self.mark_until(
                    ctl,
                    until,
                    Packed::probes_out(generation),
                    Packed::new(State::HalfOpen, generation),
                ),
            }
        };
        // Every admission reads this word: write it only when it changes.
        if self.load() != word {
            self.hot.state.store(word.0, Ordering::Release);
        }
    }

    /// After probe slots or the budget changed, under the control lock:
    /// marks a half-open state word again.
    fn remark(&self, ctl: &mut Control) {
        let word = self.load();
        if word.state() == State::HalfOpen {
            self.mark_probes(ctl, word.generation());
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

    /// Records a finished call.
    fn record(&self, permit: Ticket, head: &mut Head, outcome: Outcome) {
        if *head == Head::Pending {
            *head = self.judge_head(permit);
        }
        let slow = *head == Head::Slow;
        match permit.kind {
            Kind::Passive => {}
            Kind::Closed | Kind::Tracked => {
                let entry = match outcome {
                    Outcome::Success => 0,
                    Outcome::Failure => FAILED,
                    // Neutral everywhere: not in any window, and the streak
                    // of failures goes on.
                    _ => return,
                };
                let now = if matches!(self.rates, Rates::Time(_)) {
                    self.now()
                } else {
                    0
                };
                let entry = entry | if slow { SLOW } else { 0 };
                self.record_closed(permit.generation, entry, true, now);
            }
            Kind::Probe => self.record_probe(permit.generation, permit.id, outcome, slow),
        }
    }

    /// Judges the call's time to head, now: slow, fast, or already counted
    /// as slow while it was in flight. Counts a slow call.
    fn judge_head(&self, permit: Ticket) -> Head {
        let Some(threshold) = self.slow_ns else {
            return Head::Fast;
        };
        let started = match permit.kind {
            Kind::Tracked => match self
                .in_flight
                .as_ref()
                .and_then(|f| lock(f).finish(permit.id))
            {
                Some(started) => started,
                None => return Head::Crossed,
            },
            Kind::Probe => {
                let ctl = lock(&self.control);
                match ctl.cycle.leases.iter().find(|l| l.0 == permit.id) {
                    Some(&(_, _, started)) => started,
                    // Its lease ran out: its outcome will be dropped anyway.
                    None => return Head::Fast,
                }
            }
            Kind::Closed | Kind::Passive => return Head::Fast,
        };
        if self.now().saturating_sub(started) > threshold {
            self.counters.incr(Counter::Slow);
            Head::Slow
        } else {
            Head::Fast
        }
    }

    /// Adds one entry to the window and the streak. `finished` is false for
    /// a call counted as slow while still in flight: it is no outcome, so it
    /// does not break a failure streak.
    fn record_closed(&self, generation: u32, entry: u8, finished: bool, now: u64) {
        if !self.is_current(State::Closed, generation) {
            // An outcome counts only in the period that admitted its call.
            return;
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
        let stats = self.rates.record(entry, now);
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
        let t = self.transition(&mut ctl, State::Open, reason, self.now());
        drop(ctl);
        self.emit(t);
    }

    #[cold]
    fn record_probe(&self, generation: u32, id: u32, outcome: Outcome, slow: bool) {
        let mut ctl = lock(&self.control);
        let now = self.now();
        // A lease that ran out is over whether or not an admission has
        // reclaimed its slot yet.
        ctl.cycle.reclaim(now);
        if !self.is_current(State::HalfOpen, generation) || !ctl.cycle.release(id) {
            // From an older cycle, or its lease expired: dropped. Expired
            // leases may have freed slots all the same.
            self.remark(&mut ctl);
            return;
        }
        let c = &self.config;
        let next = match outcome {
            Outcome::Success if !slow => {
                ctl.cycle.successes += 1;
                self.counters.incr(Counter::ProbeSuccesses);
                (ctl.cycle.successes >= c.close_after)
                    .then_some((State::Closed, Reason::ProbesSucceeded))
            }
            Outcome::Success | Outcome::Failure => {
                ctl.cycle.failures += 1;
                self.counters.incr(Counter::ProbeFailures);
                (c.probes - ctl.cycle.failures < c.close_after)
                    .then_some((State::Open, Reason::ProbesFailed))
            }
            // Ignored, rate-limited and quota-exhausted probes give their
            // slot back.
            _ => None,
        };
        // With a shared-state backend the cluster decides the cycle.
        let next = next.filter(|_| !ctl.remote);
        if let Some((to, reason)) = next {
            let t = self.transition(&mut ctl, to, reason, now);
            drop(ctl);
            self.emit(t);
        } else {
            self.remark(&mut ctl);
        }
    }

    #[cold]
    fn set_manual(&self, to: State, reason: Reason) {
        let mut ctl = lock(&self.control);
        if to == State::Closed {
            ctl.reopens = 0;
        }
        let t = self.transition(&mut ctl, to, reason, self.now());
        drop(ctl);
        self.emit(t);
    }

    /// Moves to `to` under the control lock, starting a new generation.
    fn transition(&self, ctl: &mut Control, to: State, reason: Reason, now: u64) -> Transition {
        self.transition_for(ctl, to, reason, now, None)
    }

    /// Like [`transition`](Self::transition); an `Open` state lasts `open_ns`
    /// when given, instead of the backoff's next duration.
    fn transition_for(
        &self,
        ctl: &mut Control,
        to: State,
        reason: Reason,
        now: u64,
        open_ns: Option<u64>,
    ) -> Transition {
        let from = self.load();
        let generation = from.generation() + 1;
        let mut open_for = None;
        let mut until = 0;
        ctl.cycle = Cycle::default();
        ctl.allowance = 0;
        match to {
            State::Open => {
                if from.state() == State::HalfOpen {
                    ctl.reopens = ctl.reopens.saturating_add(1);
                }
                let d = open_ns.unwrap_or_else(|| self.open_duration(ctl)).max(1);
                until = now.saturating_add(d);
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
        if to == State::Open {
            self.open_until(ctl, until, generation);
        } else {
            ctl.timer = None;
            self.hot
                .state
                .store(Packed::new(to, generation).0, Ordering::Release);
        }
        self.changes.notify_waiters();
        Transition {
            key: self.name.clone(),
            from: from.state(),
            to,
            reason,
            at: self.epoch + Duration::from_nanos(now),
            open_for,
        }
    }

    fn open_duration(&self, ctl: &mut Control) -> u64 {
        let c = &self.config;
        let base = nanos(c.open) as f64;
        let cap = nanos(c.open_max) as f64;
        let grown = (base * c.backoff_multiplier.powi(ctl.reopens.min(1024) as i32)).min(cap);
        let jitter = if c.jitter > 0.0 {
            c.jitter * ctl.rng.unit()
        } else {
            0.0
        };
        ((grown * (1.0 - jitter)) as u64).max(1)
    }

    fn emit(&self, t: Transition) {
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
            listener(&t);
        }
    }

    fn snapshot(&self) -> Snapshot {
        let now = self.now();
        let ctl = lock(&self.control);
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
        Snapshot {
            key: self.name.clone(),
            state: word.state(),
            window,
            consecutive_failures: self.hot.consecutive.load(Ordering::Acquire),
            retry_in,
            reopens: ctl.reopens,
            counters: self.counters.sum(),
            metrics_only: self.hot.metrics_only.load(Ordering::Acquire),
        }
    }
}

// === impl Remote ===

/// The controls a shared-state backend uses to keep a breaker in step with
/// its replicas; see [`Breaker::remote`].
///
/// In shared mode the breaker still evaluates its own rules (a trip is
/// local first, then shared), but a half-open cycle admits only the probes
/// the backend granted from the cluster-wide budget, and the cluster decides
/// when the cycle closes or reopens. Leaving shared mode (when the store is
/// unreachable) restores local half-open decisions at once.
pub struct Remote<'a> {
    shared: &'a Shared,
}

impl fmt::Debug for Remote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("name", &self.shared.name)
            .finish()
    }
}

impl Remote<'_> {
    /// Enters or leaves shared mode.
    pub fn set_shared(&self, on: bool) {
        let mut ctl = lock(&self.shared.control);
        ctl.remote = on;
        self.shared.remark(&mut ctl);
    }

    /// Whether the breaker is in shared mode.
    pub fn is_shared(&self) -> bool {
        lock(&self.shared.control).remote
    }

    /// Lets the current half-open cycle admit `n` more probes. Ignored unless
    /// the circuit is half-open in shared mode.
    pub fn grant_probes(&self, n: u32) {
        let mut ctl = lock(&self.shared.control);
        if ctl.remote && self.shared.load().state() == State::HalfOpen {
            ctl.allowance = ctl.allowance.saturating_add(n);
            self.shared.remark(&mut ctl);
        }
    }

    /// Opens the circuit for `remaining`, as the cluster decided (the reopen
    /// backoff is the cluster's too). Already open: only the deadline moves.
    /// Forced-open and disabled circuits are left alone.
    pub fn open_for(&self, remaining: Duration) {
        let s = self.shared;
        let mut ctl = lock(&s.control);
        let now = s.now();
        let until = now.saturating_add(nanos(remaining).max(1));
        match s.load().state() {
            State::ForcedOpen | State::Disabled => {}
            State::Open => s.open_until(&mut ctl, until, s.load().generation()),
            State::Closed | State::HalfOpen => {
                if s.load().state() == State::Closed {
                    ctl.tripped = s.rates.stats(now);
                }
                let t = s.transition_for(
                    &mut ctl,
                    State::Open,
                    Reason::Remote,
                    now,
                    Some(until - now),
                );
                drop(ctl);
                s.emit(t);
            }
        }
    }

    /// Closes an open or half-open circuit, as the cluster decided.
    pub fn close(&self) {
        let s = self.shared;
        let mut ctl = lock(&s.control);
        if matches!(s.load().state(), State::Open | State::HalfOpen) {
            let t = s.transition(&mut ctl, State::Closed, Reason::Remote, s.now());
            drop(ctl);
            s.emit(t);
        }
    }
}

// === impl Changed ===

pin_project_lite::pin_project! {
    /// Completes at the next state change; see [`Breaker::changed`].
    pub struct Changed {
        #[pin]
        inner: tokio::sync::futures::OwnedNotified,
    }
}

impl fmt::Debug for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changed").finish_non_exhaustive()
    }
}

impl std::future::Future for Changed {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.project().inner.poll(cx)
    }
}

// === impl Permit ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Admitted while closed.
    Closed,
    /// Admitted while closed, and tracked in flight by the slow-call rule.
    Tracked,
    /// A half-open probe.
    Probe,
    /// Admitted but never recorded: disabled, or a shadow-mode call that
    /// would have been rejected.
    Passive,
}

/// What the slow-call rule made of the call's time to head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// Not judged yet.
    Pending,
    Fast,
    Slow,
    /// Counted as slow while still in flight; not counted again.
    Crossed,
}

/// The right to make one call, and the duty to report how it went.
///
/// Dropping a permit without [`record`](Self::record) counts as
/// [`Outcome::Ignored`]: a half-open probe gives its slot back at once.
#[must_use = "a permit records nothing until `record` is called or it is dropped"]
pub struct Permit {
    /// `None` once the outcome is recorded (or the permit moved out).
    shared: Option<Arc<Shared>>,
    ticket: Ticket,
    head: Head,
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
    fn new(shared: &Arc<Shared>, generation: u64, kind: Kind, id: u32) -> Self {
        shared.counters.incr(Counter::Admitted);
        Permit {
            shared: Some(spare::take(shared)),
            ticket: Ticket {
                generation: generation as u32,
                id,
                kind,
            },
            head: Head::Pending,
        }
    }

    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.ticket.kind == Kind::Probe
    }

    /// Marks the arrival of the response head: the slow-call rule measures
    /// time to head (time to first token for a streamed answer), not time to
    /// the end of the body, so a long stream with a quick first token is not
    /// slow.
    #[inline]
    pub fn head_received(&mut self) {
        if let Some(shared) = &self.shared {
            if self.head == Head::Pending && shared.slow_ns.is_some() {
                self.head = shared.judge_head(self.ticket);
            }
        }
    }

    /// Records the call's outcome.
    #[inline]
    pub fn record(mut self, outcome: Outcome) {
        self.finish(outcome);
    }

    /// Records the outcome in place, leaving a permit that holds nothing
    /// (see [`is_finished`](Self::is_finished)).
    #[inline]
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.settle(Counter::from(outcome), outcome);
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
            },
        )
    }

    /// Counts the call as `counter`, records `outcome` and gives the
    /// reference back to this thread; nothing if already done.
    #[inline(always)]
    fn settle(&mut self, counter: Counter, outcome: Outcome) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        shared.counters.incr(counter);
        // The healthy steady state: a success in a full, clean window with no
        // streak to break changes nothing, so it writes nothing.
        let unchanged = outcome == Outcome::Success
            && self.ticket.kind == Kind::Closed
            && shared.hot.consecutive.load(Ordering::Relaxed) == 0
            && shared.rates.is_clean();
        if !unchanged {
            shared.record(self.ticket, &mut self.head, outcome);
        }
        spare::give_back(shared);
    }
}

/// What the state machine needs to know of a permit to record it.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    /// The low bits of the generation that admitted the call.
    generation: u32,
    /// The probe's id, or the tracked call's id in flight.
    id: u32,
    kind: Kind,
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

impl Permit {
    #[cold]
    fn abandon(&mut self) {
        self.settle(Counter::Dropped, Outcome::Ignored);
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

// === helpers ===

thread_local! {
    static TIMED_REJECTIONS: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread's timed rejection should consult the clock anyway:
/// one in [`CLOCK_EVERY`], so that a timer on a runtime nobody drives any
/// more (a breaker opened on one runtime and used from another) cannot
/// keep a circuit open past its deadline for more than that many calls.
#[inline]
fn clock_turn() -> bool {
    TIMED_REJECTIONS.with(|n| {
        let v = n.get().wrapping_add(1);
        n.set(v);
        v % CLOCK_EVERY == 0
    })
}

const CLOCK_EVERY: u32 = 64;

/// How long before an open deadline its timer is set: the driver fires at
/// whole milliseconds, rounding up, and must not fire after the deadline.
const TIMER_LEAD: u64 = 1_000_000;

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}
