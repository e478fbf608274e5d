//! A member's recent time to first byte ([`Latency`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The recent time to first byte (or first frame) of one upstream; clones
/// share the samples.
///
/// [`Latency`] keeps the last [`Latency::WINDOW`] times to first byte of one
/// member of a [`Failover`](super::Failover): exact samples (an answer's head
/// came after that long) and censored ones (an attempt was given up, or lost
/// a hedge, after that long: its head would have come later, if ever). Its
/// percentiles are Kaplan–Meier estimates, so an upstream that loses every
/// race still shows how slow it is instead of vanishing from its own
/// figures.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::failover::Latency;
///
/// let latency = Latency::new();
/// for ms in 1..=20 {
///     latency.record(Duration::from_millis(ms * 10));
/// }
/// assert_eq!(latency.percentile(50.0), Some(Duration::from_millis(100)));
/// // Twenty attempts given up after a second: half of all attempts take
/// // longer than a second, so the median moves past the exact samples.
/// for _ in 0..20 {
///     latency.record_censored(Duration::from_secs(1));
/// }
/// assert!(latency.percentile(50.0).unwrap() >= Duration::from_millis(200));
/// ```
///
/// With too few samples there is no percentile:
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::failover::Latency;
///
/// let latency = Latency::new();
/// assert_eq!(latency.percentile(90.0), None, "too few samples");
/// for _ in 0..Latency::MIN_SAMPLES {
///     latency.record(Duration::from_millis(300));
/// }
/// assert_eq!(latency.percentile(90.0), Some(Duration::from_millis(300)));
/// ```
#[derive(Clone, Default)]
pub struct Latency {
    samples: Arc<Mutex<Ring>>,
}

#[derive(Default)]
struct Ring {
    /// Nanoseconds, and whether the sample is censored.
    slots: Vec<(u64, bool)>,
    next: usize,
}

impl Latency {
    /// How many of the latest samples the estimate keeps.
    pub const WINDOW: usize = 128;

    /// How many samples a percentile needs; with fewer it is `None`.
    pub const MIN_SAMPLES: usize = 20;

    /// An estimate with no samples yet.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Latency;
    ///
    /// assert_eq!(Latency::new().samples(), 0);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Latency::default()
    }

    /// Records a time to first byte that was seen: the head came after
    /// `elapsed`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Latency;
    ///
    /// let latency = Latency::new();
    /// latency.record(Duration::from_millis(250));
    /// assert_eq!(latency.samples(), 1);
    /// ```
    pub fn record(&self, elapsed: Duration) {
        self.push(elapsed, false);
    }

    /// Records a censored sample: the attempt was dropped (it lost a hedge,
    /// it timed out) after `elapsed` with no head, so its time to first byte
    /// is at least `elapsed`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Latency;
    ///
    /// let latency = Latency::new();
    /// latency.record_censored(Duration::from_secs(2));
    /// assert_eq!(latency.samples(), 1);
    /// ```
    pub fn record_censored(&self, elapsed: Duration) {
        self.push(elapsed, true);
    }

    /// How many samples the estimate holds (at most [`WINDOW`](Self::WINDOW)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Latency;
    ///
    /// let latency = Latency::new();
    /// for _ in 0..500 {
    ///     latency.record(Duration::from_millis(1));
    /// }
    /// assert_eq!(latency.samples(), Latency::WINDOW);
    /// ```
    #[must_use]
    pub fn samples(&self) -> usize {
        self.ring().slots.len()
    }

    /// The `percentile` (`0.0..=100.0`, `99.0` for p99) of the time to first
    /// byte over the recent samples, censored ones included (Kaplan–Meier);
    /// `None` with fewer than [`MIN_SAMPLES`](Self::MIN_SAMPLES) samples.
    /// When the censored samples hide the percentile (too many attempts were
    /// given up), the longest sample is returned: the percentile is at least
    /// that.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Latency;
    ///
    /// let latency = Latency::new();
    /// for ms in 1..=100 {
    ///     latency.record(Duration::from_millis(ms));
    /// }
    /// assert_eq!(latency.percentile(90.0), Some(Duration::from_millis(90)));
    /// assert_eq!(latency.percentile(100.0), Some(Duration::from_millis(100)));
    /// ```
    #[must_use]
    pub fn percentile(&self, percentile: f64) -> Option<Duration> {
        let mut sorted = {
            let ring = self.ring();
            if ring.slots.len() < Self::MIN_SAMPLES {
                return None;
            }
            ring.slots.clone()
        };
        // At equal times an exact sample comes first: a censored one at the
        // same time is still at risk of an event (the usual convention).
        sorted.sort_unstable();
        Some(Duration::from_nanos(kaplan_meier(
            &sorted,
            percentile / 100.0,
        )))
    }

    fn push(&self, elapsed: Duration, censored: bool) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let mut ring = self.ring();
        if ring.slots.len() < Self::WINDOW {
            ring.slots.push((nanos, censored));
        } else {
            let i = ring.next;
            ring.slots[i] = (nanos, censored);
        }
        ring.next = (ring.next + 1) % Self::WINDOW;
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.samples.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The smallest sample time at which the estimated share of heads reaches
/// `q`, over samples sorted by time; the largest time if it never does.
fn kaplan_meier(sorted: &[(u64, bool)], q: f64) -> u64 {
    let mut survival = 1.0;
    let mut at_risk = sorted.len() as f64;
    for &(nanos, censored) in sorted {
        if !censored {
            survival *= 1.0 - 1.0 / at_risk;
            // A hair of slack, so p90 of 100 samples is the 90th (0.9 is not
            // exact in binary).
            if 1.0 - survival >= q - 1e-9 {
                return nanos;
            }
        }
        at_risk -= 1.0;
    }
    sorted.last().map_or(0, |&(nanos, _)| nanos)
}

impl fmt::Debug for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Latency")
            .field("samples", &self.samples())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_censoring_the_percentile_is_the_sample_rank() {
        let l = Latency::new();
        for ms in (1..=50).rev() {
            l.record(Duration::from_millis(ms));
        }
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(25)));
        assert_eq!(l.percentile(2.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn censored_samples_push_the_percentile_up() {
        let exact = Latency::new();
        let with_losers = Latency::new();
        for ms in 1..=40 {
            exact.record(Duration::from_millis(ms));
            with_losers.record(Duration::from_millis(ms));
        }
        // Ten losers cancelled at 20 ms: they would have answered later.
        for _ in 0..10 {
            with_losers.record_censored(Duration::from_millis(20));
        }
        let plain = exact.percentile(75.0).unwrap();
        let censored = with_losers.percentile(75.0).unwrap();
        assert!(censored > plain, "{censored:?} <= {plain:?}");
        // Ignoring them would have made the upstream look faster than it
        // is; dropping them as exact samples at 20 ms too.
    }

    #[test]
    fn all_censored_gives_the_longest_wait() {
        let l = Latency::new();
        for ms in 1..=30 {
            l.record_censored(Duration::from_millis(ms));
        }
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(30)));
    }

    #[test]
    fn the_window_keeps_the_latest_samples() {
        let l = Latency::new();
        for _ in 0..Latency::WINDOW {
            l.record(Duration::from_secs(9));
        }
        for _ in 0..Latency::WINDOW {
            l.record(Duration::from_millis(5));
        }
        assert_eq!(l.percentile(100.0), Some(Duration::from_millis(5)));
    }
}
