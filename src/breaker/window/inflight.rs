//! The calls in flight that the slow-call rule watches, so that a call still
//! hanging past the threshold counts as slow the moment it crosses instead
//! of when (or if) it returns.
//!
//! A fixed ring of atomic slots, without a lock. An admission claims a free
//! slot with one compare-and-swap, writing its start; the call's response
//! head (or its outcome, or its drop) takes the slot back with one swap and
//! learns from what it held whether a sweep counted the call already. A
//! sweep looks for calls that have crossed the threshold; it runs only when
//! one may have: `due` holds the earliest moment a tracked call can cross,
//! and the admission that finds that moment come claims the sweep by
//! compare-and-swap. An admission reads `due` and writes it only when it
//! would cross earlier than any call tracked before it, which in a steady
//! stream of calls is once per sweep.
//!
//! Exactly once: a slot leaves a start value once, either to a sweep (a
//! compare-and-swap from that very start to "crossed") or to its owner (a
//! swap to free), so a call is counted as slow either by a sweep or by its
//! own head, never both, never neither.
//!
//! No call missed: an admission claims its slot before it reads `due`, and a
//! sweep takes `due` before it reads the slots with read-modify-writes. If
//! the sweep's read of a slot came first, the admission's claim read what
//! the sweep wrote there and so sees the sweep's `due` (or later), which
//! says "nothing tracked": the admission writes its own moment. Otherwise
//! the sweep sees the claim and keeps the call's moment in the `due` it
//! writes back.
//!
//! A transition forgets every tracked call (see [`InFlight::forget`]): no
//! sweep counts it in the period that follows; in the instant of the
//! transition a call of the new period may be forgotten too, and is then
//! judged on its head alone.
//!
//! A call that finds no free slot goes untracked: it is judged on its head
//! alone, to the millisecond (its start travels in its permit), and counted
//! slow then if it was. The ring holds eight times as many calls as the
//! window (at least 16, at most 1,024, rounded up to a power of two): LLM
//! traffic keeps many calls in flight (140 a second answering in 1.2 s is
//! 170 at once), and when the upstream slows down the trip comes as soon as
//! enough tracked calls cross, so a ring the size of the window alone would
//! fill with healthy calls and track too few of the slow ones (the slow
//! failover scenario's breaker sent 6 % more calls to the slow primary
//! with a ring of 32 than with 256). With more calls in flight than slots,
//! only the tracked ones are counted while they hang.

#![allow(
    clippy::cast_possible_truncation,
    reason = "slot ids and millisecond stamps are wrapped to 32 bits on purpose: only differences within the window are read"
)]

use std::sync::atomic::Ordering;

use crate::sync::AtomicU64;

use super::Slot;
use crate::breaker::config::Window;

/// A free slot (also [`FORGOT`] alone: a free slot a transition passed over).
const FREE: u64 = 0;
/// Set on a crossed call: the low bits say where in the window it went.
const CROSSED: u64 = 1 << 63;
/// Set by a transition on every slot: the call belongs to a period that
/// ended, and no sweep counts it.
const FORGOT: u64 = 1 << 62;
/// The bits below the two marks.
pub(super) const LOW: u64 = FORGOT - 1;
/// Crossed, and not (yet) in the window: the window slot [`Slot::NONE`].
const CROSSED_NOWHERE: u64 = CROSSED | LOW;

/// Marks a permit's id as an untracked call's, whose low bits hold the
/// millisecond it started, modulo 2^31.
const UNTRACKED: u32 = 1 << 31;
const NS_PER_MS: u64 = 1_000_000;

/// Slots in a ring for each call of the window.
const PER_CALL: usize = if cfg!(loom) { 1 } else { 8 };
/// Slots in a ring, whatever the window (rounded up to a power of two);
/// under loom a ring small enough for its models to explore.
const MIN_SLOTS: usize = if cfg!(loom) { 2 } else { 16 };
const MAX_SLOTS: usize = if cfg!(loom) { 4 } else { 1024 };

/// Calls admitted while closed that have not had their heads yet.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// Each slot: [`FREE`], a call's start plus one (ns since the epoch),
    /// or [`CROSSED`] with its place in the window; [`FORGOT`] may be set on
    /// any of them.
    slots: Box<[AtomicU64]>,
    /// The earliest moment (ns since the epoch) a tracked call may cross the
    /// threshold; `u64::MAX` when no call is tracked (or a sweep is under
    /// way, which writes it back).
    due: AtomicU64,
    threshold: u64,
}

/// What a call's slot held when the call took it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Not counted yet; it started then.
    Running(u64),
    /// Not counted, and its period ended while it ran; it started then.
    Forgotten(u64),
    /// Never tracked (the ring was full); it started in the millisecond
    /// that began then.
    Untracked(u64),
    /// Counted as slow by a sweep, here in the window.
    Crossed(Slot),
}

impl InFlight {
    /// A ring for calls slower than `threshold` (ns), sized for `window`.
    pub(crate) fn new(threshold: u64, window: Window, min_calls: u32) -> Self {
        let calls = match window {
            Window::Count(n) => n as usize,
            Window::Time { .. } | Window::None => min_calls as usize,
        };
        let n = calls
            .saturating_mul(PER_CALL)
            .clamp(MIN_SLOTS, MAX_SLOTS)
            .next_power_of_two();
        InFlight {
            slots: (0..n).map(|_| AtomicU64::new(FREE)).collect(),
            due: AtomicU64::new(u64::MAX),
            threshold,
        }
    }

    /// The moment a call started at `start` turns slow: more than the
    /// threshold later (see [`past`](crate::breaker::past)).
    fn crosses(&self, start: u64) -> u64 {
        crate::breaker::past(start, self.threshold)
    }

    /// Whether a tracked call may have crossed by `now`: then
    /// [`sweep`](Self::sweep) has work.
    #[inline]
    pub(crate) fn is_due(&self, now: u64) -> bool {
        now >= self.due.load(Ordering::Acquire)
    }

    /// Whether no tracked call is left for a sweep to find (or a sweep is
    /// under way): then [`is_due`](Self::is_due) is false for any moment
    /// the clock can give short of `u64::MAX`, and an admission that
    /// tracks nothing need not read the clock.
    #[inline]
    pub(crate) fn is_idle(&self) -> bool {
        self.due.load(Ordering::Acquire) == u64::MAX
    }

    /// Tracks a call that starts at `now`; returns the id its permit keeps.
    /// Nothing is written to the ring when it is full: the id then carries
    /// the start instead.
    #[inline]
    pub(crate) fn start(&self, now: u64) -> u32 {
        let mask = self.slots.len() - 1;
        let value = (now + 1).min(LOW);
        // Start where the clock points, so that racing admissions spread
        // out (under loom, whose models must not depend on the real clock,
        // at the first slot).
        let first = if cfg!(loom) { 0 } else { now as usize & mask };
        for k in 0..=mask {
            let i = (first + k) & mask;
            let slot = &self.slots[i];
            let seen = slot.load(Ordering::Acquire);
            if seen & !FORGOT == FREE
                && slot
                    .compare_exchange(seen, value, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // Claimed before `due` is read: see the module docs.
                let at = self.crosses(now);
                if self.due.load(Ordering::Acquire) > at {
                    self.due.fetch_min(at, Ordering::AcqRel);
                }
                return i as u32;
            }
        }
        UNTRACKED | ((now / NS_PER_MS) as u32 & !UNTRACKED)
    }

    /// Takes call `id`'s slot back (at `now`, for an untracked call) and
    /// says what it held. Called once per call: at its head, or at its
    /// outcome if no head was reported.
    #[inline]
    pub(crate) fn finish(&self, id: u32, now: impl FnOnce() -> u64) -> Taken {
        if id & UNTRACKED != 0 {
            // The millisecond it started, from the 31 bits the id kept.
            let now_ms = now() / NS_PER_MS;
            let ago = (now_ms as u32 & !UNTRACKED).wrapping_sub(id) & !UNTRACKED;
            return Taken::Untracked(now_ms.saturating_sub(u64::from(ago)) * NS_PER_MS);
        }
        let held = self.slots[id as usize].swap(FREE, Ordering::AcqRel);
        decode(held)
    }

    /// Counts every tracked call that has crossed the threshold by `now`,
    /// each once: `crossed` puts one in the window and says where (`None`:
    /// nowhere, its period ended). Returns how many crossed. If another
    /// admission took this sweep first, does nothing.
    pub(crate) fn sweep(&self, now: u64, mut crossed: impl FnMut() -> Option<Slot>) -> u64 {
        let mut due = self.due.load(Ordering::Acquire);
        loop {
            if now < due {
                return 0;
            }
            match self
                .due
                .compare_exchange(due, u64::MAX, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(seen) => due = seen,
            }
        }
        let mut count = 0;
        let mut next = u64::MAX;
        for slot in self.slots.iter() {
            // A read-modify-write, even of a free slot: see the module docs.
            let seen = slot.fetch_or(FREE, Ordering::AcqRel);
            if seen & (CROSSED | FORGOT) != 0 || seen == FREE {
                continue;
            }
            let at = self.crosses(seen - 1);
            if now < at {
                next = next.min(at);
                continue;
            }
            if slot
                .compare_exchange(seen, CROSSED_NOWHERE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Its head came, or a transition forgot it, meanwhile.
                continue;
            }
            count += 1;
            if let Some(place) = crossed() {
                // Unless its head came meanwhile: then it knows it crossed,
                // not where (a later failure does not mark this entry).
                let _ = slot.compare_exchange(
                    CROSSED_NOWHERE,
                    CROSSED | place.low(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
        if next != u64::MAX {
            self.due.fetch_min(next, Ordering::AcqRel);
        }
        count
    }

    /// Forgets every call: their period ended. Called after the new state is
    /// published, so that an admission of the old period either is seen here
    /// or sees the new state (and gives its slot back).
    pub(crate) fn forget(&self) {
        for slot in self.slots.iter() {
            slot.fetch_or(FORGOT, Ordering::AcqRel);
        }
    }
}

/// Not part of the API: the ring on its own, with the clock in the
/// caller's hands, so that the loom models can drive an admission and a
/// sweep at chosen moments (ns).
#[doc(hidden)]
#[derive(Debug)]
pub struct InFlightRing(InFlight);

impl InFlightRing {
    /// A ring for calls slower than `threshold` ns, of the smallest size.
    #[must_use]
    pub fn new(threshold: u64) -> Self {
        InFlightRing(InFlight::new(threshold, Window::Count(1), 1))
    }

    /// An admission's steps at `now`: sweeps if a tracked call may have
    /// crossed, then tracks the call. Returns its id and how many the
    /// sweep found crossed.
    pub fn admit(&self, now: u64) -> (u32, u64) {
        let crossed = if self.0.is_due(now) {
            self.sweep(now)
        } else {
            0
        };
        (self.0.start(now), crossed)
    }

    /// Whether a tracked call may have crossed by `now`.
    pub fn is_due(&self, now: u64) -> bool {
        self.0.is_due(now)
    }

    /// Counts the calls crossed by `now` (nowhere in a window).
    pub fn sweep(&self, now: u64) -> u64 {
        self.0.sweep(now, || None)
    }

    /// Takes call `id`'s slot back: whether a sweep had counted it.
    pub fn finish(&self, id: u32) -> bool {
        matches!(self.0.finish(id, || 0), Taken::Crossed(_))
    }
}

fn decode(held: u64) -> Taken {
    if held & CROSSED != 0 {
        let low = held & LOW;
        Taken::Crossed(Slot::from_low(low))
    } else if held & FORGOT != 0 {
        Taken::Forgotten((held & LOW).saturating_sub(1))
    } else {
        Taken::Running(held.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(slots: u32) -> InFlight {
        InFlight::new(100, Window::Count(slots), 1)
    }

    #[test]
    fn a_crossing_call_is_counted_once() {
        let f = ring(16);
        let a = f.start(0);
        let b = f.start(10);
        assert_eq!(f.finish(b, || 0), Taken::Running(10));
        assert!(!f.is_due(100), "exactly at the threshold is not slow");
        assert_eq!(f.sweep(100, || None), 0);
        assert!(f.is_due(101));
        assert_eq!(f.sweep(101, || Some(Slot(7))), 1);
        assert!(!f.is_due(500), "nothing left to cross");
        assert_eq!(f.sweep(u64::MAX - 1, || unreachable!()), 0);
        assert_eq!(
            f.finish(a, || 0),
            Taken::Crossed(Slot(7)),
            "a swept call knows it was counted, and where"
        );
    }

    #[test]
    fn the_next_sweep_is_due_when_the_oldest_call_can_cross() {
        let f = ring(16);
        let _a = f.start(50);
        let b = f.start(20);
        assert!(!f.is_due(120));
        assert!(f.is_due(121), "the earlier start sets the moment");
        f.finish(b, || 0);
        // The moment stays (early is safe); the sweep finds a still young
        // and moves the moment to it.
        assert_eq!(f.sweep(121, || None), 0);
        assert!(!f.is_due(150));
        assert_eq!(f.sweep(151, || None), 1);
    }

    #[test]
    fn a_full_ring_leaves_calls_untracked_and_timed_to_the_millisecond() {
        let f = ring(1);
        let ids: Vec<u32> = (0..16).map(|i| f.start(i)).collect();
        let late = f.start(3 * NS_PER_MS + 5);
        assert!(late & UNTRACKED != 0);
        assert_eq!(
            f.finish(late, || 9 * NS_PER_MS + 1),
            Taken::Untracked(3 * NS_PER_MS)
        );
        // Its slot freed, the next call is tracked again.
        f.finish(ids[4], || 0);
        assert_eq!(f.start(99), 4);
        // Across the 31-bit wrap of the milliseconds.
        let wrap = u64::from(UNTRACKED) * NS_PER_MS;
        let id = f.start(wrap - NS_PER_MS);
        assert_eq!(
            f.finish(id, || wrap + NS_PER_MS),
            Taken::Untracked(wrap - NS_PER_MS)
        );
    }

    #[test]
    fn forgotten_calls_are_never_swept_and_their_slots_are_free() {
        let f = ring(16);
        let a = f.start(0);
        let b = f.start(1);
        assert_eq!(f.sweep(200, || Some(Slot(3))), 2);
        f.finish(b, || 0);
        let c = f.start(150);
        f.forget();
        assert_eq!(f.sweep(10_000, || unreachable!()), 0);
        assert_eq!(f.finish(c, || 0), Taken::Forgotten(150));
        assert_eq!(f.finish(a, || 0), Taken::Crossed(Slot(3)));
        // Every slot is free again, forgotten or not.
        for i in 0..16 {
            assert!(f.start(20_000 + i) & UNTRACKED == 0);
        }
    }
}
