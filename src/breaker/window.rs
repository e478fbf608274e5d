//! Sliding windows: the last N calls, the last D of time, and the calls still
//! in flight that the slow-call rule watches.

#![allow(
    clippy::cast_possible_truncation,
    reason = "indices are taken modulo a slice's length, which fits in usize"
)]

use std::sync::atomic::Ordering;

use crate::sync::{lock, AtomicU32, AtomicU64, AtomicU8, Mutex};

use super::config::Window;
use super::state::WindowStats;

mod inflight;
#[doc(hidden)]
pub use self::inflight::InFlightRing;
pub(crate) use self::inflight::{InFlight, Taken};

/// One call as the window sees it.
pub(crate) const FAILED: u8 = 0b01;
pub(crate) const SLOW: u8 = 0b10;

/// Where in a window one call was recorded: the count window's write index,
/// or the time window's bucket period, in their low 32 bits (a permit
/// carries one, and every call moves its permit). Compared modulo 2^32:
/// the count window holds far fewer calls than that, and a time window's
/// bucket periods pass 2^32 only after 2^32 buckets' time (49 days at 1 ms
/// buckets; a call slow in flight then goes unmarked, or, once in 2^32
/// periods, marks the bucket of a later one). The one index in 2^32 that
/// reads as [`NONE`](Slot::NONE) goes unmarked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot(u32);

impl Slot {
    /// Recorded nowhere (yet).
    pub(crate) const NONE: Slot = Slot(u32::MAX);

    fn of(at: u64) -> Slot {
        // The low 32 bits, by design (see above).
        Slot(at as u32)
    }

    /// As the calls in flight keep it in the low bits of a word, where
    /// [`NONE`](Slot::NONE) is every bit of `inflight::LOW`.
    fn low(self) -> u64 {
        if self == Slot::NONE {
            inflight::LOW
        } else {
            u64::from(self.0)
        }
    }

    fn from_low(low: u64) -> Slot {
        u32::try_from(low).map_or(Slot::NONE, Slot)
    }
}

/// The rate rules' window, whichever kind is configured.
#[derive(Debug)]
pub(crate) enum Rates {
    None,
    Count(CountWindow),
    Time(Mutex<TimeWindow>),
}

impl Rates {
    pub(crate) fn new(window: Window) -> Self {
        match window {
            Window::None => Rates::None,
            Window::Count(n) => Rates::Count(CountWindow::new(n)),
            Window::Time { span, buckets } => Rates::Time(Mutex::new(TimeWindow::new(
                u64::try_from(span.as_nanos()).unwrap_or(u64::MAX),
                buckets,
            ))),
        }
    }

    /// Adds one call; returns the window after it, and where the call went.
    #[inline]
    pub(crate) fn record(&self, entry: u8, now: u64) -> (WindowStats, Slot) {
        match self {
            Rates::None => (WindowStats::default(), Slot::NONE),
            Rates::Count(w) => w.record(entry),
            Rates::Time(w) => lock(w).record(entry, now),
        }
    }

    /// Marks the call recorded at `slot` failed too, unless the window has
    /// moved past it; returns the window after it.
    pub(crate) fn mark_failed(&self, slot: Slot, now: u64) -> WindowStats {
        match self {
            Rates::None => WindowStats::default(),
            Rates::Count(w) => w.mark_failed(slot),
            Rates::Time(w) => lock(w).mark_failed(slot, now),
        }
    }

    /// Whether one more success would leave the window exactly as it is.
    #[inline]
    pub(crate) fn is_clean(&self) -> bool {
        match self {
            Rates::None => true,
            Rates::Count(w) => w.is_full_and_clean(),
            Rates::Time(_) => false,
        }
    }

    /// The window, if it is a count window that has held all its calls: a
    /// success recorded into it can only lower its rates, never trip.
    #[inline]
    pub(crate) fn full_count(&self) -> Option<&CountWindow> {
        match self {
            Rates::Count(w) if w.head.load(Ordering::Acquire) >= w.len() => Some(w),
            _ => None,
        }
    }

    pub(crate) fn stats(&self, now: u64) -> WindowStats {
        match self {
            Rates::None => WindowStats::default(),
            Rates::Count(w) => w.stats(),
            Rates::Time(w) => lock(w).stats(now),
        }
    }

    /// Empties the window, under the breaker's control lock. Records of an
    /// earlier period may still be landing.
    pub(crate) fn clear(&self) {
        match self {
            Rates::None => {}
            Rates::Count(w) => w.clear(),
            Rates::Time(w) => lock(w).clear(),
        }
    }
}

// === impl CountWindow ===

/// The last `n` calls, lock-free.
///
/// Each slot holds one call's bits; `failures` and `slow` count the set bits
/// across slots. A success that would replace a success leaves the window as
/// it was, so once the window is full and clean the record path only reads.
#[derive(Debug)]
pub(crate) struct CountWindow {
    slots: Box<[AtomicU8]>,
    /// Calls recorded since the last clear; the next slot is `head % n`.
    head: AtomicU64,
    failures: AtomicU32,
    slow: AtomicU32,
}

impl CountWindow {
    fn new(n: u32) -> Self {
        CountWindow {
            slots: (0..n).map(|_| AtomicU8::new(0)).collect(),
            head: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            slow: AtomicU32::new(0),
        }
    }

    fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    #[inline]
    fn record(&self, entry: u8) -> (WindowStats, Slot) {
        if entry == 0 && self.is_full_and_clean() {
            let stats = WindowStats {
                calls: self.len(),
                failures: 0,
                slow: 0,
            };
            return (stats, Slot::NONE);
        }
        let at = self.write(entry);
        (self.stats(), Slot::of(at))
    }

    /// Adds a success, asking nothing of the window after it.
    #[inline]
    pub(crate) fn add_success(&self) {
        self.write(0);
    }

    /// Writes `entry` into the next slot; returns where it went.
    #[inline]
    fn write(&self, entry: u8) -> u64 {
        let at = self.head.fetch_add(1, Ordering::AcqRel);
        let old = self.slots[(at % self.len()) as usize].swap(entry, Ordering::AcqRel);
        // Whatever order racing writers swap in, the deltas telescope: each
        // counter ends equal to the number of slots with its bit set.
        adjust(&self.failures, old & FAILED != 0, entry & FAILED != 0);
        adjust(&self.slow, old & SLOW != 0, entry & SLOW != 0);
        at
    }

    /// Sets the failed bit of the call written at `slot`, if no later call
    /// has taken its place. (A writer racing past it in that instant may get
    /// the bit instead: the counters stay equal to the bits either way.)
    fn mark_failed(&self, slot: Slot) -> WindowStats {
        let head = self.head.load(Ordering::Acquire);
        // How many calls were recorded since (modulo 2^32): the slot is
        // still the call's while that is at most the window's length.
        let since = (head as u32).wrapping_sub(slot.0);
        if slot != Slot::NONE
            && since >= 1
            && u64::from(since) <= self.len()
            && let Some(at) = head.checked_sub(u64::from(since))
        {
            let old = self.slots[(at % self.len()) as usize].fetch_or(FAILED, Ordering::AcqRel);
            adjust(&self.failures, old & FAILED != 0, true);
        }
        self.stats()
    }

    #[inline]
    fn is_full_and_clean(&self) -> bool {
        self.failures.load(Ordering::Acquire) == 0
            && self.slow.load(Ordering::Acquire) == 0
            && self.head.load(Ordering::Acquire) >= self.len()
    }

    fn stats(&self) -> WindowStats {
        let calls = self.head.load(Ordering::Acquire).min(self.len());
        WindowStats {
            calls,
            failures: settled(&self.failures, calls),
            slow: settled(&self.slow, calls),
        }
    }

    fn clear(&self) {
        // Every change of a slot goes with its own counter update, here too:
        // a record racing this clear (a late outcome, or `reset()` while
        // closed) then still leaves each counter equal to its bits in the
        // slots once both are done, instead of one off for good.
        for slot in self.slots.iter() {
            let old = slot.swap(0, Ordering::AcqRel);
            adjust(&self.failures, old & FAILED != 0, false);
            adjust(&self.slow, old & SLOW != 0, false);
        }
        self.head.store(0, Ordering::Release);
    }
}

/// Reads a counter that racing writers may have pushed transiently below
/// zero (a decrement landing before the increment it undoes) or above the
/// calls, as a count in `0..=calls`.
fn settled(counter: &AtomicU32, calls: u64) -> u64 {
    #[allow(
        clippy::cast_possible_wrap,
        reason = "a count pushed below zero wraps; read back as negative"
    )]
    let n = counter.load(Ordering::Acquire) as i32;
    u64::try_from(n).unwrap_or(0).min(calls)
}

fn adjust(counter: &AtomicU32, was: bool, is: bool) {
    match (was, is) {
        (false, true) => {
            counter.fetch_add(1, Ordering::AcqRel);
        }
        (true, false) => {
            counter.fetch_sub(1, Ordering::AcqRel);
        }
        _ => {}
    }
}

// === impl TimeWindow ===

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Which bucket period (`now / width`) these counts belong to.
    period: u64,
    calls: u64,
    failures: u64,
    slow: u64,
}

/// The calls of the last `span`, in `buckets` buckets; exact to one bucket.
#[derive(Debug)]
pub(crate) struct TimeWindow {
    width: u64,
    buckets: Box<[Bucket]>,
}

impl TimeWindow {
    fn new(span: u64, buckets: u32) -> Self {
        let width = (span / u64::from(buckets)).max(1);
        TimeWindow {
            width,
            buckets: vec![Bucket::default(); buckets as usize].into_boxed_slice(),
        }
    }

    fn record(&mut self, entry: u8, now: u64) -> (WindowStats, Slot) {
        let period = now / self.width;
        let n = self.buckets.len() as u64;
        let bucket = &mut self.buckets[(period % n) as usize];
        if bucket.period != period || bucket.calls == 0 {
            *bucket = Bucket {
                period,
                ..Bucket::default()
            };
        }
        bucket.calls += 1;
        bucket.failures += u64::from(entry & FAILED != 0);
        bucket.slow += u64::from(entry & SLOW != 0);
        (self.stats(now), Slot::of(period))
    }

    fn mark_failed(&mut self, slot: Slot, now: u64) -> WindowStats {
        let n = self.buckets.len() as u64;
        if slot != Slot::NONE {
            let bucket = &mut self.buckets[(u64::from(slot.0) % n) as usize];
            if Slot::of(bucket.period) == slot && bucket.calls > bucket.failures {
                bucket.failures += 1;
            }
        }
        self.stats(now)
    }

    fn stats(&self, now: u64) -> WindowStats {
        let period = now / self.width;
        let n = self.buckets.len() as u64;
        let mut stats = WindowStats::default();
        for b in self.buckets.iter() {
            if b.calls > 0 && b.period <= period && period - b.period < n {
                stats.calls += b.calls;
                stats.failures += b.failures;
                stats.slow += b.slow;
            }
        }
        stats
    }

    fn clear(&mut self) {
        self.buckets.fill(Bucket::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_window_slides_over_the_last_n_calls() {
        let w = CountWindow::new(4);
        for _ in 0..100 {
            w.record(0);
        }
        assert_eq!(w.stats().calls, 4);
        w.record(FAILED);
        w.record(FAILED);
        assert_eq!(w.stats().failures, 2);
        for _ in 0..4 {
            w.record(0);
        }
        assert_eq!(w.stats().failures, 0);
        w.record(SLOW | FAILED);
        assert_eq!((w.stats().failures, w.stats().slow), (1, 1));
    }

    #[test]
    fn time_window_forgets_buckets_older_than_its_span() {
        let mut w = TimeWindow::new(10_000, 10);
        w.record(FAILED, 0);
        w.record(0, 5_000);
        assert_eq!(w.stats(9_999).calls, 2);
        assert_eq!(w.stats(10_000).calls, 1);
        assert_eq!(w.stats(15_000).calls, 0);
        // A bucket reused after a full turn starts empty.
        let (s, _) = w.record(0, 20_000);
        assert_eq!((s.calls, s.failures), (1, 0));
    }

    #[test]
    fn a_crossed_call_that_fails_marks_its_own_entry() {
        let w = CountWindow::new(4);
        let (_, slot) = w.record(SLOW);
        w.record(0);
        let s = w.mark_failed(slot);
        assert_eq!((s.calls, s.failures, s.slow), (2, 1, 1));
        for _ in 0..4 {
            w.record(0);
        }
        let s = w.mark_failed(slot);
        assert_eq!(
            s.failures, 0,
            "an entry the window moved past is left alone"
        );

        let mut t = TimeWindow::new(10_000, 10);
        let (_, slot) = t.record(SLOW, 100);
        let s = t.mark_failed(slot, 2_000);
        assert_eq!((s.calls, s.failures, s.slow), (1, 1, 1));
        let s = t.mark_failed(slot, 2_000);
        assert_eq!(s.failures, 1, "never more failures than calls in a bucket");
    }
}
