//! The retry budget: retries as a share of first attempts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A budget of retries: at most `percent` % of the first attempts seen over
/// a sliding 10 s window (ten 1 s slots), plus `min_per_sec` retries a
/// second that need no first attempts (none by default). The shape of
/// tower's `TpsBudget` and Finagle's, with `min_per_sec` 0 unless set.
/// [`RetryPolicy`](super::RetryPolicy) deposits only first attempts that
/// reached the upstream: a call a circuit rejected is no load on it, and an
/// open period counted as traffic would bank retries for the moment it
/// ends.
///
/// A retry storm multiplies load exactly when an upstream is weakest; a
/// budget caps the multiplier: at 20 %, attempts stay within 1.2 times the
/// requests however many retries each request may make.
///
/// It is its own type, not tower's `TpsBudget`, because that one turns a
/// percentage into a whole number of retries per first attempt's share
/// (30 % becomes one retry per 3 deposits, 33 %; 40 % becomes 50 %), and
/// panics on settings out of range where this crate returns a
/// [`RetryBudgetError`]. Cheap to clone; clones share the budget.
///
/// ```
/// use tower_circuit_breaker::retry::RetryBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let budget = RetryBudget::new(20.0).unwrap();
/// for _ in 0..10 {
///     budget.deposit(); // ten first attempts
/// }
/// assert!(budget.withdraw());
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw(), "20 % of 10 is 2");
/// assert_eq!(budget.denied(), 1);
/// assert!(RetryBudget::new(-1.0).is_err());
/// # }
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    shared: Arc<BudgetState>,
}

struct BudgetState {
    percent: f64,
    /// Retries allowed without first attempts over the window.
    reserve: f64,
    ring: std::sync::Mutex<Ring>,
    denied: std::sync::atomic::AtomicU64,
}

/// Ten 1 s slots of (first attempts, retries).
struct Ring {
    slots: [(u64, u64); SLOTS],
    index: usize,
    /// When the current slot ends: kept as that moment rather than its
    /// start, so that finding which slot a call falls in compares two
    /// instants and subtracts none.
    ends: tokio::time::Instant,
}

/// A retry budget that cannot work, refused by [`RetryBudget::new`].
///
/// ```
/// use tower_circuit_breaker::retry::{RetryBudget, RetryBudgetError};
///
/// let err = RetryBudget::new(-5.0).unwrap_err();
/// assert_eq!(err, RetryBudgetError::Percent(-5.0));
/// assert_eq!(err.to_string(), "retry budget: the percentage must be within 0..=1000, got -5");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum RetryBudgetError {
    /// The percentage is not within `0..=1000` (or not a number).
    Percent(f64),
}

impl std::fmt::Display for RetryBudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetryBudgetError::Percent(p) => {
                write!(
                    f,
                    "retry budget: the percentage must be within 0..=1000, got {p}"
                )
            }
        }
    }
}

impl std::error::Error for RetryBudgetError {}

const SLOTS: usize = 10;
const SLOT: Duration = Duration::from_secs(1);

impl RetryBudget {
    /// Retries at most `percent` % of first attempts over the last 10 s
    /// (`20.0` for 20 %), with no minimum. `percent` must be within
    /// `0..=1000`.
    ///
    /// # Errors
    ///
    /// A [`RetryBudgetError`] when `percent` is outside `0..=1000`.
    pub fn new(percent: f64) -> Result<Self, RetryBudgetError> {
        RetryBudget::with_min_per_sec(percent, 0)
    }

    /// [`new`](Self::new), plus `min_per_sec` retries a second that need no
    /// first attempts.
    ///
    /// # Errors
    ///
    /// A [`RetryBudgetError`] when `percent` is outside `0..=1000`.
    pub fn with_min_per_sec(percent: f64, min_per_sec: u32) -> Result<Self, RetryBudgetError> {
        if !(0.0..=1000.0).contains(&percent) {
            return Err(RetryBudgetError::Percent(percent));
        }
        Ok(RetryBudget {
            shared: Arc::new(BudgetState {
                percent,
                reserve: f64::from(min_per_sec) * (SLOTS as f64),
                ring: std::sync::Mutex::new(Ring {
                    slots: [(0, 0); SLOTS],
                    index: 0,
                    ends: tokio::time::Instant::now() + SLOT,
                }),
                denied: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// Counts a first attempt.
    pub fn deposit(&self) {
        let mut ring = self.ring();
        let i = ring.index;
        ring.slots[i].0 += 1;
    }

    /// Takes one retry from the budget, if it holds one.
    #[allow(
        clippy::must_use_candidate,
        reason = "called for its effect; the value is a by-product"
    )]
    pub fn withdraw(&self) -> bool {
        let mut ring = self.ring();
        let (firsts, retries) = ring
            .slots
            .iter()
            .fold((0, 0), |(f, r), &(sf, sr)| (f + sf, r + sr));
        let allowed = (retries + 1) as f64
            <= firsts as f64 * self.shared.percent / 100.0 + self.shared.reserve;
        if allowed {
            let i = ring.index;
            ring.slots[i].1 += 1;
        } else {
            self.shared
                .denied
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        allowed
    }

    /// Gives back a withdrawal that was not spent (a hedge that every
    /// circuit rejected before it was sent).
    pub(crate) fn refund(&self) {
        let mut ring = self.ring();
        if let Some(slot) = (0..SLOTS)
            .map(|back| (ring.index + SLOTS - back) % SLOTS)
            .find(|&i| ring.slots[i].1 > 0)
        {
            ring.slots[slot].1 -= 1;
        }
    }

    /// Retries refused so far.
    #[must_use]
    pub fn denied(&self) -> u64 {
        self.shared
            .denied
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ring, with the slots that ended since it was last touched cleared.
    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        let mut ring = self
            .shared
            .ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        let mut steps = 0;
        while now >= ring.ends && steps < SLOTS {
            ring.index = (ring.index + 1) % SLOTS;
            let i = ring.index;
            ring.slots[i] = (0, 0);
            ring.ends += SLOT;
            steps += 1;
        }
        if now >= ring.ends {
            // Idle for longer than the window: every slot is clear.
            ring.ends = now + SLOT;
        }
        ring
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("percent", &self.shared.percent)
            .field("min_per_sec", &(self.shared.reserve / SLOTS as f64))
            .field("denied", &self.denied())
            .finish()
    }
}
