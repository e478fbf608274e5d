//! Slowness without a fallback: an in-flight limit that falls only on
//! overload signals (AIMD), and the ramp after half-open.
//!
//! A slow answer within the caller's deadline is an answer. For a call with
//! nowhere else to go, the breaker does not refuse on latency; it caps the
//! calls in flight instead, and only when the upstream says it is overloaded
//! *because of the load*:
//!
//! - The overload signals are an attempt timeout, a 429 and a 503. Each is
//!   judged on its own.
//! - The limit starts unbounded. The first signal starts a watch: for a
//!   window, every call without a fallback is admitted with the number of
//!   calls in flight at that moment, and its end says whether it carried a
//!   signal. A signal counts only while its rate grows with the calls in
//!   flight: the calls of the window are split at the median of their
//!   in-flight counts, and the share of signals among the busier half must
//!   exceed the quieter half's by at least 0.25 and by four standard
//!   errors (a two-proportion test) to start the limit, by 0.15 and three
//!   standard errors once it is down. An upstream that hangs a share of its
//!   calls whatever the load shows the same share in both halves and is
//!   left alone; a capacity-bound one answers 503 only above its capacity.
//! - Each time it counts, at most once per step (a tenth of the window),
//!   the limit falls to [`InFlightLimit::decrease`] times the lesser of the
//!   limit and the calls in flight (at least 1); calls beyond it are
//!   rejected with [`Rejection::InFlightLimit`].
//! - When every call of the window came with about the same calls in
//!   flight (an upstream saturated at its queue holds them there) and at
//!   least 15 % of them carried one kind of signal, the halves cannot be
//!   told apart: the limit falls once, on trial, to 0.8 times, so calls come
//!   with fewer in flight. If the signal's share then grows with the calls
//!   in flight, it counts; if no signal counts within a window, the trial
//!   is undone.
//! - Once no signal counted for a step, the limit grows by
//!   [`InFlightLimit::increase`] per step, and is unbounded again once it
//!   is back above the most calls in flight it ever fell from. The watch
//!   ends after a window without any signal and an unbounded limit.
//! - Signals too rare to shed for end it too: a watch whose window holds at
//!   least 1,000 calls with signals on fewer than 1 in 20 of them, and an
//!   unbounded limit, ends at its next signal. From then on a signal starts
//!   a watch only once signals come on at least 1 in 20 calls over the last
//!   two steps (the calls read from the breaker's counters at each signal),
//!   or after two steps without one. A steady 2 % of 503s would otherwise
//!   keep every admission on the watched path for good.
//!
//! While no signal came for a window (a calm circuit), a closed admission
//! pays one more load of a flag on the state's cache line, nothing else.
//! While watching, the calls in flight are the breaker's counters summed at
//! most once per 1/1024 step, plus a counter of the calls admitted since
//! the watch began (one atomic add as such a call is admitted, one as it
//! ends). Between the moments the watch acts on (a signal, a step of
//! growth, a trial to undo, its end, a new half of the window), a watched
//! admission takes no lock, and a watched call that ends without a signal
//! adds itself to the window with one atomic add; only a signal, or a
//! moment come, takes the lock.
//!
//! The ramp: when probes close the circuit, calls with a fallback are
//! admitted with a share rising linearly from 0 to 1 over
//! [`Builder::ramp`](crate::Builder::ramp), the rest rejected with
//! [`Rejection::Ramp`] (so they go to their fallback at once); calls without
//! one ramp through the in-flight limit, which rejects nothing until an
//! overload signal. The trip rules run during the ramp as in any closed
//! period: one firing reopens the circuit at once and ends the ramp.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "bin indices are clamped below BINS, counts saturate at u32::MAX, and a step's float is clamped to [1, from] before its saturating `as`"
)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::config::InFlightLimit;
use super::counters::Counter;
use super::permit::{Kind, Permit};
use super::rejection::{CircuitOpen, Rejection};
use super::{nanos, Shared, State};
use crate::sync::{lock, AtomicU32, AtomicU64, Mutex};

/// An overload signal a call's end carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    None,
    /// The attempt timed out.
    Timeout,
    /// 429.
    Throttled,
    /// 503.
    Unavailable,
}

impl Signal {
    fn index(self) -> Option<usize> {
        match self {
            Signal::None => None,
            Signal::Timeout => Some(0),
            Signal::Throttled => Some(1),
            Signal::Unavailable => Some(2),
        }
    }
}

/// How much larger the busier half's share of a signal must be than the
/// quieter half's for the signal to count, in absolute terms and in
/// standard errors of the difference: `(by, standard errors)`. Strict while
/// the limit is unbounded, so that a mix of traffic whose failing part also
/// holds calls in flight (hangs of one model among several), which
/// correlates the two by a few points without any load dependence, does not
/// start it; a capacity-bound upstream's share jumps from about 0 to most
/// calls. Once the limit holds the calls in flight below it, their spread
/// is narrower and so is the difference: the looser test keeps the limit
/// where the overload is.
const TO_START: (f64, f64) = (0.25, 4.0);
const TO_GO_ON: (f64, f64) = (0.15, 3.0);

/// Signals on fewer than one call in this many are too rare to watch: a
/// watch whose window holds at least [`RARE_AFTER`] calls, signals on
/// fewer than one in `RARE` of them and an unbounded limit ends, and the
/// next watch waits for signals on at least one call in `RARE` (see
/// [`Gate`]). Shedding calls to spare so few errors would cost more
/// answers than it saves; a 2 % share of 503s would otherwise keep every
/// admission watched for good.
const RARE: u64 = 20;
/// The calls a watch's window must hold before its signals are called rare.
const RARE_AFTER: u64 = 1_000;

/// In-flight counts are binned exactly below 32, then in eighths of each
/// doubling.
#[cfg(not(loom))]
const BINS: usize = 128;
/// Under the model checker, where every atomic operation is a branch the
/// checker explores, the first four counts alone (its threads never hold
/// more in flight): clearing and summing 256 atomics would exceed its
/// branch limit. The mechanism is the same.
#[cfg(loom)]
const BINS: usize = 4;

fn bin(f: u64) -> usize {
    if f < 32 {
        return (f as usize).min(BINS - 1);
    }
    let log = 63 - f.leading_zeros() as usize;
    let sub = ((f >> (log - 3)) & 7) as usize;
    (32 + (log - 5) * 8 + sub).min(BINS - 1)
}

/// What the window says of one kind of signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Its share grows with the calls in flight.
    Grows,
    /// It does not, or there are too few signals to tell.
    No,
    /// Signals enough, but every call came with about the same calls in
    /// flight (a saturated upstream holds them there): only a lower limit
    /// can tell.
    Unknown,
}

/// The limit and the ramp of one breaker.
pub(crate) struct Limiter {
    /// The AIMD limit is on (else only the ramp is).
    aimd: bool,
    window_ns: u64,
    step_ns: u64,
    decrease: f64,
    increase: u64,
    min_signals: u64,
    ramp_ns: u64,
    /// The current limit; `u64::MAX` for none.
    limit: AtomicU64,
    /// Calls in flight admitted while a watch is on (with a fallback or
    /// not): counted up at admission and down as each ends (every one is
    /// recorded, dropped ones included). Reading it is one load, where
    /// summing the breaker's striped counters for every watched admission
    /// cost several times the closed path.
    watched: AtomicU64,
    /// The calls in flight that `watched` does not hold (admitted before the
    /// watch began), as of the last exact count: the striped counters are
    /// summed at most once per 1/1024 step, and the calls counted since are
    /// added to it.
    uncounted: AtomicU64,
    /// When that exact count was taken; `u64::MAX` to take it at the next
    /// watched admission (a watch began).
    summed_at: AtomicU64,
    /// Until when (ns) the watch's state holds as it is with time alone: a
    /// watch is on, no ramp, and no step of growth, trial to undo or end of
    /// the watch comes before then. A watched admission before it, and a
    /// watched call's end without a signal, need no lock (see
    /// [`Bins`]); 0 when no watch is on or a ramp is. Written under the
    /// lock whenever what it is worked out from changes.
    calm_until: AtomicU64,
    /// The calls of the watch's window, made at the first watch.
    bins: OnceLock<Box<Bins>>,
    inner: Mutex<Inner>,
}

/// The calls of a watch's window by the calls in flight they were admitted
/// with, in two halves: what every watched call's end adds to, so kept
/// outside the lock (an end before [`Limiter::calm_until`] in the current
/// half adds with one atomic add). The signals, which only the rare ends
/// that carry one add to, stay with the [`Watch`], under the lock.
///
/// The lock's holder moves the window on (a new half's number, then its
/// calls cleared): an end racing that may be added to the half before, or,
/// after a stall of a whole half, to a half being cleared, and be lost;
/// one call in a window of thousands either way.
struct Bins {
    /// The current half's number (`now / half`).
    half: AtomicU64,
    /// The highest bin any call of this watch went to: every bin above it
    /// is empty, so judging sums no further.
    top: AtomicU32,
    calls: [[AtomicU32; BINS]; 2],
}

impl Bins {
    fn new() -> Box<Self> {
        Box::new(Bins {
            half: AtomicU64::new(0),
            top: AtomicU32::new(0),
            calls: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
        })
    }

    fn calls(&self, slot: usize, b: usize) -> u64 {
        u64::from(self.calls[slot][b].load(Ordering::Relaxed))
    }

    fn clear(&self, slot: usize) {
        for c in &self.calls[slot] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Adds a call with `f` calls in flight to the half `slot`.
    #[inline]
    fn add(&self, slot: usize, f: u64) {
        let b = bin(f);
        if b as u32 > self.top.load(Ordering::Relaxed) {
            self.top.fetch_max(b as u32, Ordering::Relaxed);
        }
        // Not saturating: 2^32 calls in half a window of at least 10 ms
        // would be more than 400 billion a second.
        self.calls[slot][b].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Inner {
    watch: Option<Box<Watch>>,
    ramp: Option<Ramp>,
    /// Set when a watch ended on rare signals: what the next must wait for.
    gate: Option<Gate>,
}

/// The signals since a watch ended on rare signals ([`RARE`]), in two steps
/// of the window, the calls from the breaker's admissions counted at each
/// signal: a signal starts a watch again once signals come on at least one
/// call in `RARE` over the two, or after two quiet steps.
#[derive(Debug, Clone, Copy)]
struct Gate {
    /// When the current step began.
    start: u64,
    /// The admissions as the previous step began, and as the current one did.
    base: u64,
    mid: u64,
    /// The signals of the previous step and of the current one.
    prev: u64,
    cur: u64,
}

impl Gate {
    fn new(now: u64, admitted: u64) -> Self {
        Gate {
            start: now,
            base: admitted,
            mid: admitted,
            prev: 0,
            cur: 0,
        }
    }

    /// A signal at `now` with `admitted` calls admitted so far: whether it
    /// starts a watch.
    fn opens(&mut self, now: u64, admitted: u64, step_ns: u64) -> bool {
        let since = now.saturating_sub(self.start);
        if since >= step_ns.saturating_mul(2) {
            // Quiet for two steps: a signal now is not part of a rare run.
            return true;
        }
        if since >= step_ns {
            (self.base, self.mid) = (self.mid, admitted);
            (self.prev, self.cur) = (self.cur, 0);
            self.start = now;
        }
        self.cur += 1;
        (self.prev + self.cur).saturating_mul(RARE) >= admitted.saturating_sub(self.base)
    }
}

struct Ramp {
    start: u64,
    end: u64,
    /// The shares of the calls so far, less the calls admitted: a call is
    /// admitted when it reaches 1, so the admitted share follows the
    /// ramp's share of the moment.
    owed: f64,
}

/// The window of a watch, in two halves.
struct Watch {
    /// The signals of the window by kind, in the halves of [`Bins`].
    signals: [[[u32; BINS]; 3]; 2],
    /// The last signal of any kind, counted or not.
    last_signal: u64,
    /// The last signal that counted.
    last_counted: u64,
    /// The last change of the limit.
    last_change: u64,
    /// The most calls in flight the limit fell from.
    peak: u64,
    /// A trial decrease made to tell (see [`Judged::Unknown`]): when, and
    /// the limit before it, restored if no signal counts within a window.
    probe: Option<(u64, u64)>,
}

/// What a guarded closed admission decided.
pub(super) enum Guarded {
    /// Nothing to do: admit as usual.
    Pass,
    /// A watched call, with the calls in flight as it was admitted.
    Watch(u32),
    /// A call with a fallback, admitted while a watch is on: counted in the
    /// calls in flight, its outcome not watched.
    Count,
    Reject(Rejection),
}

impl Limiter {
    pub(crate) fn new(limit: Option<InFlightLimit>, ramp: Duration) -> Option<Self> {
        if limit.is_none() && ramp.is_zero() {
            return None;
        }
        let l = limit.unwrap_or_default();
        let window_ns = nanos(l.window).max(2);
        Some(Limiter {
            aimd: limit.is_some(),
            window_ns,
            step_ns: (window_ns / 10).max(1),
            decrease: l.decrease,
            increase: u64::from(l.increase),
            min_signals: u64::from(l.min_signals),
            ramp_ns: nanos(ramp),
            limit: AtomicU64::new(u64::MAX),
            watched: AtomicU64::new(0),
            uncounted: AtomicU64::new(0),
            summed_at: AtomicU64::new(u64::MAX),
            calm_until: AtomicU64::new(0),
            bins: OnceLock::new(),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The current limit, `None` for unbounded.
    pub(crate) fn current(&self) -> Option<u64> {
        match self.limit.load(Ordering::Acquire) {
            u64::MAX => None,
            n => Some(n),
        }
    }

    pub(crate) fn aimd(&self) -> bool {
        self.aimd
    }

    fn half_ns(&self) -> u64 {
        (self.window_ns / 2).max(1)
    }

    /// The window's calls, cleared for a watch that begins at `now`.
    fn fresh_bins(&self, now: u64) -> &Bins {
        let bins = self.bins.get_or_init(Bins::new);
        bins.half.store(now / self.half_ns(), Ordering::Release);
        bins.top.store(0, Ordering::Relaxed);
        bins.clear(0);
        bins.clear(1);
        bins
    }

    /// What [`calm_until`](Self::calm_until) is, for `inner` as it is now.
    fn calm(&self, inner: &Inner) -> u64 {
        let Some(watch) = inner.watch.as_deref() else {
            return 0;
        };
        if inner.ramp.is_some() {
            return 0;
        }
        // Each bound is where the locked path would first do something.
        let mut until = match self.current() {
            // The watch ends (`admit_guarded`).
            None => watch.last_signal.saturating_add(self.window_ns),
            // The limit grows (`grow`).
            Some(_) => watch
                .last_change
                .max(watch.last_counted)
                .saturating_add(self.step_ns),
        };
        if let Some((at, _)) = watch.probe {
            // A trial is undone (`expire_probe`).
            until = until.min(at.saturating_add(self.window_ns));
        }
        until
    }
}

impl Watch {
    fn new(now: u64) -> Box<Self> {
        Box::new(Watch {
            signals: [[[0; BINS]; 3]; 2],
            last_signal: now,
            last_counted: 0,
            last_change: now,
            peak: 0,
            probe: None,
        })
    }

    /// Under the lock: moves the window on to `now`'s half.
    fn roll(&mut self, bins: &Bins, now: u64, half_ns: u64) {
        let h = now / half_ns;
        let half = bins.half.load(Ordering::Acquire);
        if h == half {
            return;
        }
        // The new half first: ends from now on add to it.
        bins.half.store(h, Ordering::Release);
        let gap = h.saturating_sub(half);
        for k in 0..2u64 {
            // A half is cleared when the window moves past it.
            let slot = ((half + 1 + k) % 2) as usize;
            if k < gap {
                bins.clear(slot);
                self.signals[slot] = [[0; BINS]; 3];
            }
        }
    }

    /// Under the lock: a watched call ended with `f` calls in flight at its
    /// admission.
    fn observe(&mut self, bins: &Bins, f: u64, signal: Signal) {
        let slot = (bins.half.load(Ordering::Acquire) % 2) as usize;
        bins.add(slot, f);
        if let Some(k) = signal.index() {
            let b = bin(f);
            self.signals[slot][k][b] = self.signals[slot][k][b].saturating_add(1);
        }
    }

    /// Whether the window holds at least [`RARE_AFTER`] calls and signals
    /// (of any kind) on fewer than one in [`RARE`] of them.
    fn rare(&self, bins: &Bins) -> bool {
        let top = (bins.top.load(Ordering::Relaxed) as usize).min(BINS - 1);
        let mut calls = 0;
        let mut signals = 0;
        for h in 0..2 {
            for b in 0..=top {
                calls += bins.calls(h, b);
                signals += self.signals[h]
                    .iter()
                    .map(|kind| u64::from(kind[b]))
                    .sum::<u64>();
            }
        }
        calls >= RARE_AFTER && signals.saturating_mul(RARE) < calls
    }

    /// Whether signals of kind `k` grow with the calls in flight over the
    /// window.
    #[cfg(test)]
    fn load_dependent(&self, bins: &Bins, k: usize, min_signals: u64) -> bool {
        self.judge(bins, k, min_signals, false) == Judged::Grows
    }

    /// `limited`: the limit is already down (see [`TO_GO_ON`]).
    fn judge(&self, bins: &Bins, k: usize, min_signals: u64, limited: bool) -> Judged {
        let mut calls = [0u64; BINS];
        let mut sig = [0u64; BINS];
        // The bins above the top are empty (an end racing this may be
        // counted or not, as with any bin).
        let top = (bins.top.load(Ordering::Relaxed) as usize).min(BINS - 1);
        for h in 0..2 {
            for b in 0..=top {
                calls[b] += bins.calls(h, b);
                sig[b] += u64::from(self.signals[h][k][b]);
            }
        }
        let (calls, sig) = (&calls[..=top], &sig[..=top]);
        let n: u64 = calls.iter().sum();
        let s: u64 = sig.iter().sum();
        if s < min_signals || n < 2 * min_signals {
            return Judged::No;
        }
        // The median bin goes to whichever side leaves both non-empty.
        let mut cum = 0;
        let mut split = 0;
        for (b, c) in calls.iter().enumerate() {
            cum += c;
            if cum * 2 >= n {
                split = b;
                break;
            }
        }
        let side = |range: std::ops::Range<usize>| -> (u64, u64) {
            (calls[range.clone()].iter().sum(), sig[range].iter().sum())
        };
        let end = calls.len();
        let (mut lo, mut hi) = (side(0..split + 1), side(split + 1..end));
        if hi.0 == 0 {
            (lo, hi) = (side(0..split), side(split..end));
        }
        let ((n1, s1), (n2, s2)) = (lo, hi);
        if n1 == 0 || n2 == 0 {
            return if s as f64 >= 0.15 * n as f64 {
                Judged::Unknown
            } else {
                Judged::No
            };
        }
        let (p1, p2) = (s1 as f64 / n1 as f64, s2 as f64 / n2 as f64);
        let p = (s1 + s2) as f64 / (n1 + n2) as f64;
        let se = (p * (1.0 - p) * (1.0 / n1 as f64 + 1.0 / n2 as f64)).sqrt();
        let diff = p2 - p1;
        let (by, z) = if limited { TO_GO_ON } else { TO_START };
        if diff >= by && diff >= z * se {
            Judged::Grows
        } else {
            Judged::No
        }
    }
}

impl Shared {
    /// The closed path's guard flag: a watch or a ramp is on.
    #[inline]
    pub(super) fn is_guarded(&self) -> bool {
        self.hot.guarded.load(Ordering::Acquire)
    }

    /// Under the limiter's lock, as it is let go: publishes the guard
    /// flag and how long the watch stays calm.
    fn set_guarded(&self, l: &Limiter, inner: &Inner) {
        let calm = l.calm(inner);
        if l.calm_until.load(Ordering::Relaxed) != calm {
            l.calm_until.store(calm, Ordering::Release);
        }
        let on = inner.watch.is_some() || inner.ramp.is_some();
        if self.hot.guarded.load(Ordering::Relaxed) != on {
            self.hot.guarded.store(on, Ordering::Release);
        }
    }

    /// The calls in flight: those counted while watching, plus the others
    /// as of the last exact count (see [`Limiter::uncounted`]), taken again
    /// when 1/1024 of a step (a millisecond by default) has passed: calls
    /// from before the watch end within a call's time, and their ends are
    /// seen within that.
    fn in_flight_now(&self, l: &Limiter, now: u64) -> u64 {
        let at = l.summed_at.load(Ordering::Acquire);
        let since = now.saturating_sub(at);
        if at == u64::MAX || since >= l.step_ns / 1024 {
            let counted = l.watched.load(Ordering::Acquire);
            let exact = self.counters.sum().in_flight;
            l.uncounted
                .store(exact.saturating_sub(counted), Ordering::Release);
            l.summed_at.store(now, Ordering::Release);
            return exact;
        }
        l.watched.load(Ordering::Acquire) + l.uncounted.load(Ordering::Acquire)
    }

    /// A counted call ended, however it ended.
    #[inline]
    pub(super) fn counted_ended(&self) {
        if let Some(l) = &self.limiter {
            let was = l.watched.fetch_sub(1, Ordering::AcqRel);
            debug_assert!(was > 0, "a counted call ended twice");
        }
    }

    /// A closed admission while a watch or a ramp is on.
    #[inline]
    pub(super) fn admit_guarded(&self, fallback: bool) -> Guarded {
        let Some(l) = &self.limiter else {
            return Guarded::Pass;
        };
        let calm = l.calm_until.load(Ordering::Acquire);
        if fallback && calm != 0 {
            // A watch and no ramp: counted, as the locked path would.
            return Guarded::Count;
        }
        let now = self.now();
        if now < calm {
            // Nothing of the watch changes before `calm`: what the locked
            // path would find, without the lock.
            return self.watch_admission(l, now);
        }
        self.admit_guarded_locked(l, fallback, now)
    }

    /// [`admit_guarded`](Self::admit_guarded) when something may change:
    /// under the lock.
    #[cold]
    fn admit_guarded_locked(&self, l: &Limiter, fallback: bool, now: u64) -> Guarded {
        let mut inner = lock(&l.inner);
        if let Some(ramp) = &inner.ramp
            && now >= ramp.end
        {
            inner.ramp = None;
        }
        if fallback {
            let decided = match &mut inner.ramp {
                Some(ramp) => {
                    let share = (now - ramp.start) as f64 / (ramp.end - ramp.start) as f64;
                    ramp.owed += share;
                    if ramp.owed >= 1.0 {
                        ramp.owed -= 1.0;
                        Guarded::Pass
                    } else {
                        Guarded::Reject(Rejection::Ramp)
                    }
                }
                None => Guarded::Pass,
            };
            let decided = match decided {
                Guarded::Pass if inner.watch.is_some() => Guarded::Count,
                other => other,
            };
            self.set_guarded(l, &inner);
            return decided;
        }
        let Some(watch) = &mut inner.watch else {
            self.set_guarded(l, &inner);
            return Guarded::Pass;
        };
        l.grow(watch, now);
        if l.current().is_none() && now.saturating_sub(watch.last_signal) >= l.window_ns {
            inner.watch = None;
            self.set_guarded(l, &inner);
            return Guarded::Pass;
        }
        self.set_guarded(l, &inner);
        drop(inner);
        self.watch_admission(l, now)
    }

    /// A watched admission at `now`: the calls in flight, against the
    /// limit.
    #[inline]
    fn watch_admission(&self, l: &Limiter, now: u64) -> Guarded {
        let f = self.in_flight_now(l, now);
        if f >= l.limit.load(Ordering::Acquire) {
            return Guarded::Reject(Rejection::InFlightLimit);
        }
        Guarded::Watch(f.min(u64::from(u32::MAX)) as u32)
    }

    /// A counted call (see [`Kind::is_counted`]) succeeded with no
    /// signal: what [`record`](Self::record) would do with it, without its
    /// general questions.
    #[inline(never)]
    pub(super) fn counted_success(&self, generation: u32, kind: Kind, id: u32) {
        self.counted_ended();
        if kind == Kind::Watched {
            self.limit_outcome(generation, Some(id), Signal::None);
        }
        if self.hot.consecutive.load(Ordering::Relaxed) != 0 || !self.rates.is_clean() {
            self.record_success(generation);
        }
    }

    /// A call of the current closed period ended: `watched` is the calls in
    /// flight it was admitted with, if it was watched.
    #[inline]
    pub(super) fn limit_outcome(&self, generation: u32, watched: Option<u32>, signal: Signal) {
        let Some(l) = &self.limiter else { return };
        if !l.aimd || !self.is_current(State::Closed, generation) {
            return;
        }
        let now = self.now();
        if signal == Signal::None
            && let Some(f) = watched
            && now < l.calm_until.load(Ordering::Acquire)
            && let Some(bins) = l.bins.get()
        {
            let h = now / l.half_ns();
            if bins.half.load(Ordering::Acquire) == h {
                // The common end: no signal, in the current half, with
                // nothing due. All the locked path would do is this add.
                bins.add((h % 2) as usize, u64::from(f));
                return;
            }
        }
        self.limit_outcome_locked(l, watched, signal, now);
    }

    /// [`limit_outcome`](Self::limit_outcome) under the lock.
    #[cold]
    fn limit_outcome_locked(&self, l: &Limiter, watched: Option<u32>, signal: Signal, now: u64) {
        let mut inner = lock(&l.inner);
        let bins = match inner.watch {
            Some(_) => l.bins.get_or_init(Bins::new),
            None if signal == Signal::None => return,
            None => {
                if let Some(gate) = &mut inner.gate {
                    let admitted = self.counters.total(Counter::Admitted);
                    if !gate.opens(now, admitted, l.step_ns) {
                        return;
                    }
                    inner.gate = None;
                }
                // The first signal: watch from now on.
                inner.watch = Some(Watch::new(now));
                l.summed_at.store(u64::MAX, Ordering::Release);
                l.fresh_bins(now)
            }
        };
        let Some(watch) = inner.watch.as_deref_mut() else {
            return;
        };
        watch.roll(bins, now, l.half_ns());
        if signal != Signal::None {
            watch.last_signal = now;
        }
        if let Some(f) = watched {
            watch.observe(bins, u64::from(f), signal);
        }
        l.expire_probe(watch, now);
        if signal != Signal::None
            && l.current().is_none()
            && watch.probe.is_none()
            && watch.rare(bins)
        {
            // Too rare to watch: the closed path goes back to its plain
            // admissions until signals come more often.
            inner.watch = None;
            inner.gate = Some(Gate::new(now, self.counters.total(Counter::Admitted)));
            self.set_guarded(l, &inner);
            return;
        }
        if let Some(k) = signal.index() {
            let judged = watch.judge(bins, k, l.min_signals, l.current().is_some());
            let due = now.saturating_sub(watch.last_change) >= l.step_ns;
            let trial = judged == Judged::Unknown && watch.probe.is_none() && due;
            if judged == Judged::Grows {
                watch.last_counted = now;
                watch.probe = None;
            }
            if trial || (judged == Judged::Grows && (due || l.current().is_none())) {
                let f = self.in_flight_now(l, now).max(1);
                let before = l.limit.load(Ordering::Acquire);
                let from = before.min(f);
                // A trial falls less far: it only has to move the calls in
                // flight out of the bins they were stuck in.
                let factor = if trial {
                    l.decrease.max(0.8)
                } else {
                    l.decrease
                };
                let to = ((from as f64 * factor) as u64).max(1);
                if trial {
                    watch.probe = Some((now, before));
                }
                watch.peak = watch.peak.max(from);
                watch.last_change = now;
                l.limit.store(to, Ordering::Release);
            }
        }
        self.set_guarded(l, &inner);
    }

    /// Under a transition to `to` from `from` at `at`: a new period starts
    /// with an unbounded limit, and a close from half-open with the ramp.
    pub(super) fn limit_transition(&self, from: State, to: State, at: u64) {
        let Some(l) = &self.limiter else { return };
        let mut inner = lock(&l.inner);
        inner.watch = None;
        inner.ramp = None;
        inner.gate = None;
        l.limit.store(u64::MAX, Ordering::Release);
        if to == State::Closed && from == State::HalfOpen && l.ramp_ns > 0 {
            inner.ramp = Some(Ramp {
                start: at,
                end: at.saturating_add(l.ramp_ns),
                owed: 0.0,
            });
        }
        self.set_guarded(l, &inner);
    }

    /// Admits a watched call.
    #[inline]
    pub(super) fn admit_watched(self: &Arc<Self>, generation: u64, f: u32) -> Permit {
        self.counted(Permit::new(self, generation, Kind::Watched, f, false))
    }

    /// Counts `permit` in the calls in flight while watching.
    #[cold]
    pub(super) fn counted(&self, mut permit: Permit) -> Permit {
        if let Some(l) = &self.limiter {
            l.watched.fetch_add(1, Ordering::AcqRel);
            permit.count_in_flight();
        }
        permit
    }

    /// Rejects a call the limit or the ramp refused.
    #[cold]
    pub(super) fn reject_guarded(
        self: &Arc<Self>,
        cause: Rejection,
        fallback: bool,
    ) -> Result<Permit, CircuitOpen> {
        self.reject(cause, None, fallback)
    }
}

impl Limiter {
    /// Additive increase: one step per step without a counted signal; back
    /// to unbounded above the peak.
    fn grow(&self, watch: &mut Watch, now: u64) {
        self.expire_probe(watch, now);
        let Some(limit) = self.current() else { return };
        let since = now.saturating_sub(watch.last_change.max(watch.last_counted));
        let steps = since / self.step_ns;
        if steps == 0 {
            return;
        }
        let grown = limit.saturating_add(steps.saturating_mul(self.increase));
        watch.last_change = now;
        if grown > watch.peak {
            self.limit.store(u64::MAX, Ordering::Release);
        } else {
            self.limit.store(grown, Ordering::Release);
        }
    }
}

impl Limiter {
    /// A trial decrease that no counted signal confirmed within a window is
    /// undone.
    fn expire_probe(&self, watch: &mut Watch, now: u64) {
        if let Some((at, before)) = watch.probe
            && now.saturating_sub(at) >= self.window_ns
        {
            watch.probe = None;
            if watch.last_counted < at {
                self.limit.store(before, Ordering::Release);
                watch.last_change = now;
            }
        }
    }
}

impl super::Breaker {
    /// The in-flight limit's watch as the model checks see it: the calls it
    /// counts in flight and the calls its window holds; `None` while no
    /// watch is on.
    #[doc(hidden)]
    #[must_use]
    pub fn watch_counts(&self) -> Option<(u64, u64)> {
        let l = self.shared.limiter.as_ref()?;
        let inner = lock(&l.inner);
        inner.watch.as_ref()?;
        let bins = l.bins.get()?;
        let calls = (0..2)
            .flat_map(|h| (0..BINS).map(move |b| bins.calls(h, b)))
            .sum();
        Some((l.watched.load(Ordering::Acquire), calls))
    }
}

#[cfg(test)]
#[path = "limit_tests.rs"]
mod tests;
