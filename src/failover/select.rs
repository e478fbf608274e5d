//! Selection among equivalent members: which member a
//! [`Failover`](super::Failover) tries first, by a peak-EWMA of time to
//! first byte with two random choices, or by price.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Failover;
use crate::breaker::Breaker;
use crate::rng::Rng;
use crate::sync::{lock, Mutex};

/// How a [`Failover`](super::Failover) chooses the member it tries first,
/// among members that are equivalent (one model on several providers or
/// regions); set with [`Failover::select`](super::Failover::select). The
/// others follow in their order, as fallbacks. Without a selection the
/// first member is always the primary.
///
/// The selection is given each member's breaker, in the order of the
/// members, and reads their state without admitting: a member whose circuit
/// is open (or forced open) or that holds calls back for a known rate limit
/// is never chosen; a half-open one may be, so that it heals on real
/// traffic. When no member may be chosen, the walk starts at the primary as
/// without a selection.
///
/// - [`peak_ewma`](Selection::peak_ewma): of two members drawn at random,
///   the one with the lower peak-EWMA of time to first byte (the head of
///   the answer, or the error, of each attempt the failover makes), as
///   tower's `PeakEwma` keeps it: a sample above the estimate replaces it
///   at once; one below is averaged in with the weight `1 - e^(-Δt/decay)`
///   of the time since the last sample. A member with no sample for a
///   decay time (it was slow, or open) is stale: the next call goes to it,
///   one call per decay time, and its answer replaces the old estimate, so
///   a member that recovered is found within a decay time.
/// - [`cheapest`](Selection::cheapest): the member with the lowest cost
///   (the user's price per call, per token, any unit) that may be chosen;
///   ties go to the earlier member.
///
/// A peak-EWMA member's cost is its estimate times its attempts in flight
/// plus one (the failover's attempts to it that have no first byte yet), as
/// tower's `PeakEwma` weighs pending requests: a member busy with many calls
/// is chosen less before their samples arrive.
///
/// With [`Failover::hedge`](super::Failover::hedge), the hedge goes to the
/// member the selection would try second, and a hedge that lost feeds its
/// elapsed time to the estimate as a censored sample.
///
/// Clones share the estimates: keep one to feed it samples the failover does
/// not see ([`record_at_least`](Selection::record_at_least) for an attempt
/// that was cancelled before its first byte, such as a caller that left).
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceExt;
/// use tower_circuit_breaker::failover::{Failover, Selection};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let region = |name: &'static str| {
///     tower::service_fn(move |_req: http::Request<String>| async move {
///         let res = http::Response::builder().header("x-region", name).body(String::new());
///         Ok::<_, std::convert::Infallible>(res.unwrap())
///     })
/// };
/// let (east, west) = (Breaker::builder().build().unwrap(), Breaker::builder().build().unwrap());
/// let selection = Selection::peak_ewma([east.clone(), west.clone()]);
/// // West was slow a moment ago.
/// selection.record(0, Duration::from_millis(300));
/// selection.record(1, Duration::from_secs(2));
/// let failover = Failover::new(CircuitBreaker::new(region("east"), east))
///     .fallback(CircuitBreaker::new(region("west"), west))
///     .select(selection)
///     .unwrap();
/// let res = failover.oneshot(http::Request::new(String::new())).await.unwrap();
/// assert_eq!(res.headers()["x-region"], "east");
/// # }
/// ```
#[derive(Clone)]
pub struct Selection(Arc<Inner>);

struct Inner {
    breakers: Box<[Breaker]>,
    policy: Policy,
}

enum Policy {
    PeakEwma {
        estimates: Box<[Mutex<Estimate>]>,
        // The decay constant, at least a nanosecond.
        decay: Duration,
        // The failover's attempts to each member that have no first byte yet.
        in_flight: Box<[AtomicUsize]>,
    },
    Cheapest(Box<[f64]>),
}

/// A peak-EWMA of one member's time to first byte, in nanoseconds, as of
/// `at` (none before the first sample).
#[derive(Debug, Clone, Copy, Default)]
struct Estimate {
    ns: f64,
    at: Option<Instant>,
    // When a call was sent to learn what the member is like now, after its
    // estimate went stale; its sample replaces the estimate.
    probe: Option<Instant>,
}

/// The decay constant of [`Selection::peak_ewma`] unless set.
pub const DEFAULT_DECAY: Duration = Duration::from_secs(10);

impl Estimate {
    /// Whether the estimate is older than the decay time (or missing),
    /// with no probe sent within that time; `old_before` is the moment a
    /// decay time ago (`None` if the clock has not run that long), so that
    /// each estimate costs two comparisons and no arithmetic.
    fn stale(&self, old_before: Option<Instant>) -> bool {
        let old = |at: Option<Instant>| at.is_none_or(|at| old_before.is_some_and(|t| at <= t));
        old(self.at) && old(self.probe)
    }

    /// tower's `PeakEwma` rule: a sample above the estimate replaces it; one
    /// below is averaged in with the weight `1 - e^(-Δt/decay)` of the time
    /// since the last sample. A probe's sample replaces a stale estimate.
    fn sample(&mut self, sample_ns: f64, now: Instant, decay_ns: f64) {
        self.ns = match self.at {
            Some(at) if self.probe.is_none() && sample_ns <= self.ns => {
                let d = (-nanos(now.saturating_duration_since(at)) / decay_ns).exp();
                self.ns * d + sample_ns * (1.0 - d)
            }
            _ => sample_ns,
        };
        self.at = Some(now);
        self.probe = None;
    }

    /// A censored sample: the attempt took at least `ns`.
    fn at_least(&mut self, ns: f64, now: Instant) {
        if self.at.is_none() || ns > self.ns {
            self.ns = ns;
            self.at = Some(now);
            self.probe = None;
        }
    }
}

/// `d` in nanoseconds, exact below 2^53 ns (104 days). In 64-bit
/// arithmetic: converting `as_nanos`' `u128` takes a library call of
/// about 40 instructions, and each sample converts three durations.
#[allow(
    clippy::cast_precision_loss,
    reason = "seconds and nanoseconds far below 2^52"
)]
fn nanos(d: Duration) -> f64 {
    d.as_secs() as f64 * 1e9 + f64::from(d.subsec_nanos())
}

impl Selection {
    /// Two random choices on a peak-EWMA of time to first byte, over the
    /// members whose breakers are `breakers` (in the order of the
    /// members), with a decay of [`DEFAULT_DECAY`].
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Selection;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let selection = Selection::peak_ewma([Breaker::builder().build().unwrap(), Breaker::builder().build().unwrap()]);
    /// assert_eq!(selection.len(), 2);
    /// assert_eq!(selection.estimate(0), None, "no sample yet");
    /// ```
    pub fn peak_ewma<I: IntoIterator<Item = Breaker>>(breakers: I) -> Self {
        let breakers: Box<[Breaker]> = breakers.into_iter().collect();
        let estimates = breakers
            .iter()
            .map(|_| Mutex::new(Estimate::default()))
            .collect();
        let in_flight = breakers.iter().map(|_| AtomicUsize::new(0)).collect();
        Selection(Arc::new(Inner {
            breakers,
            policy: Policy::PeakEwma {
                estimates,
                decay: DEFAULT_DECAY,
                in_flight,
            },
        }))
    }

    /// The cheapest member that may be chosen; `members` are each member's
    /// breaker and cost, in the order of the members. A cost that is not a
    /// number counts as the highest.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::Selection;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let (a, b) = (Breaker::builder().build().unwrap(), Breaker::builder().build().unwrap());
    /// // Dollars per million input tokens.
    /// let selection = Selection::cheapest([(a, 2.5), (b, 1.1)]);
    /// assert_eq!(selection.len(), 2);
    /// ```
    pub fn cheapest<I: IntoIterator<Item = (Breaker, f64)>>(members: I) -> Self {
        let (breakers, costs): (Vec<Breaker>, Vec<f64>) = members
            .into_iter()
            .map(|(b, c)| (b, if c.is_nan() { f64::INFINITY } else { c }))
            .unzip();
        Selection(Arc::new(Inner {
            breakers: breakers.into(),
            policy: Policy::Cheapest(costs.into()),
        }))
    }

    /// Sets the decay constant of a peak-EWMA selection (how fast old
    /// samples are forgotten, and how long a member goes unsampled before it
    /// is probed); a zero decay is taken as a nanosecond. No effect on [`cheapest`](Selection::cheapest).
    ///
    /// Call it before the selection is shared: the estimates of a clone
    /// made earlier keep their constant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Selection;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// let selection = Selection::peak_ewma([Breaker::builder().build().unwrap()]).decay(Duration::from_secs(30));
    /// # let _ = selection;
    /// ```
    #[must_use]
    pub fn decay(self, decay: Duration) -> Self {
        let Inner { breakers, policy } = match Arc::try_unwrap(self.0) {
            Ok(inner) => inner,
            Err(shared) => return Selection(shared),
        };
        let policy = match policy {
            Policy::PeakEwma {
                estimates,
                in_flight,
                ..
            } => Policy::PeakEwma {
                estimates,
                decay: decay.max(Duration::from_nanos(1)),
                in_flight,
            },
            cheapest => cheapest,
        };
        Selection(Arc::new(Inner { breakers, policy }))
    }

    /// How many members the selection covers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.breakers.len()
    }

    /// Whether it covers no member.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.breakers.is_empty()
    }

    /// Records that `member` took `ttfb` to its first byte (its answer's
    /// head, or its error). The failover records every attempt it makes;
    /// an index out of range is ignored.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Selection;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let selection = Selection::peak_ewma([Breaker::builder().build().unwrap()]);
    /// selection.record(0, Duration::from_millis(400));
    /// assert_eq!(selection.estimate(0), Some(Duration::from_millis(400)));
    /// # }
    /// ```
    pub fn record(&self, member: usize, ttfb: Duration) {
        self.sample(member, |_| ttfb);
    }

    /// [`record`](Self::record) of an attempt that started at `started`
    /// and has its first byte now: the failover's own samples, timed with
    /// the one reading of the clock the sample is dated by.
    pub(super) fn record_since(&self, member: usize, started: Instant) {
        self.sample(member, |now| now.saturating_duration_since(started));
    }

    /// Feeds `member`'s estimate a sample dated now, of the time to first
    /// byte `ttfb` makes of that moment.
    fn sample(&self, member: usize, ttfb: impl FnOnce(Instant) -> Duration) {
        if let Policy::PeakEwma {
            estimates, decay, ..
        } = &self.0.policy
            && let Some(e) = estimates.get(member)
        {
            let now = Instant::now();
            lock(e).sample(nanos(ttfb(now)), now, nanos(*decay));
        }
    }

    /// Records a censored sample: `member` had not given its first byte
    /// after `elapsed` when its attempt was given up (a hedge that lost, a
    /// caller that left). It raises the estimate to `elapsed` when that is
    /// higher, and otherwise leaves it alone.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Selection;
    /// use tower_circuit_breaker::Breaker;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let selection = Selection::peak_ewma([Breaker::builder().build().unwrap()]);
    /// selection.record(0, Duration::from_millis(400));
    /// selection.record_at_least(0, Duration::from_millis(100));
    /// assert_eq!(selection.estimate(0), Some(Duration::from_millis(400)), "no news");
    /// selection.record_at_least(0, Duration::from_secs(3));
    /// assert_eq!(selection.estimate(0), Some(Duration::from_secs(3)));
    /// # }
    /// ```
    pub fn record_at_least(&self, member: usize, elapsed: Duration) {
        if let Policy::PeakEwma { estimates, .. } = &self.0.policy
            && let Some(e) = estimates.get(member)
        {
            lock(e).at_least(nanos(elapsed), Instant::now());
        }
    }

    /// A peak-EWMA member's estimate; `None` before its first sample, and
    /// for a cheapest selection.
    #[must_use]
    pub fn estimate(&self, member: usize) -> Option<Duration> {
        let Policy::PeakEwma { estimates, .. } = &self.0.policy else {
            return None;
        };
        let e = *lock(estimates.get(member)?);
        e.at?;
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "an average of u64 nanoseconds, converted by a saturating `as`"
        )]
        Some(Duration::from_nanos(e.ns as u64))
    }

    /// The member to try first.
    pub(super) fn choose(&self, rng: &Rng) -> usize {
        let breakers = &self.0.breakers;
        let eligible = |i: usize| breakers[i].selectable();
        match &self.0.policy {
            Policy::Cheapest(costs) => (0..breakers.len())
                .filter(|&i| eligible(i))
                .min_by(|&a, &b| costs[a].total_cmp(&costs[b]).then(a.cmp(&b)))
                .unwrap_or(0),
            Policy::PeakEwma {
                estimates,
                decay,
                in_flight,
                ..
            } => {
                let now = Instant::now();
                let old_before = now.checked_sub(*decay);
                // A member whose estimate is stale is probed first, once a
                // decay time: it may have become the fastest while it was
                // not called (slow, or open). The probe is claimed, so that
                // one call learns it, not every call until the answer.
                // The same walk counts the eligible.
                let mut n = 0;
                for (i, e) in estimates.iter().enumerate() {
                    if eligible(i) {
                        n += 1;
                        let mut e = lock(e);
                        if e.stale(old_before) {
                            e.probe = Some(now);
                            return i;
                        }
                    }
                }
                // Two distinct draws among the eligible, without a list:
                // pick by rank, which is the index itself when every
                // member is eligible (the common case, asked of no breaker
                // again).
                let every = n == breakers.len();
                let nth = |k: usize| match every {
                    true => Some(k),
                    false => (0..breakers.len()).filter(|&i| eligible(i)).nth(k),
                };
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "a float in [0, below), converted by a saturating `as`"
                )]
                let draw = |below: usize| ((rng.unit() * below as f64) as usize).min(below - 1);
                let (a, b) = match n {
                    0 => return 0,
                    1 => return nth(0).unwrap_or(0),
                    _ => {
                        let a = draw(n);
                        let b = (a + 1 + draw(n - 1)) % n;
                        (nth(a).unwrap_or(0), nth(b).unwrap_or(0))
                    }
                };
                // tower's `PeakEwma` cost: the estimate times the calls in
                // flight plus one, so a member busy with many slow calls is
                // chosen less before their samples arrive.
                #[allow(
                    clippy::cast_precision_loss,
                    reason = "a count of calls in flight, far below 2^52"
                )]
                let load = |i: usize| {
                    let pending = in_flight[i].load(Ordering::Relaxed) as f64;
                    lock(&estimates[i]).ns * (pending + 1.0)
                };
                if load(b) < load(a) {
                    b
                } else {
                    a
                }
            }
        }
    }
}

impl Selection {
    /// Counts an attempt to `member` as in flight until the returned guard
    /// is dropped (at its first byte, or when it is given up).
    pub(super) fn start(&self, member: usize) -> Option<InFlight> {
        let Policy::PeakEwma { in_flight, .. } = &self.0.policy else {
            return None;
        };
        in_flight.get(member)?.fetch_add(1, Ordering::Relaxed);
        Some(InFlight {
            selection: self.clone(),
            member,
        })
    }

    /// How many of the failover's attempts to `member` are in flight.
    #[cfg(test)]
    pub(super) fn pending(&self, member: usize) -> usize {
        match &self.0.policy {
            Policy::PeakEwma { in_flight, .. } => in_flight[member].load(Ordering::Relaxed),
            Policy::Cheapest(_) => 0,
        }
    }
}

/// One attempt counted in flight by a peak-EWMA [`Selection`].
pub(super) struct InFlight {
    selection: Selection,
    member: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Policy::PeakEwma { in_flight, .. } = &self.selection.0.policy {
            in_flight[self.member].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = match self.0.policy {
            Policy::PeakEwma { .. } => "peak_ewma",
            Policy::Cheapest(_) => "cheapest",
        };
        f.debug_struct("Selection")
            .field("policy", &policy)
            .field("members", &self.0.breakers.len())
            .finish()
    }
}

impl<S, Req, C> Failover<S, Req, C> {
    /// Chooses the member tried first by `selection` (see [`Selection`])
    /// instead of always the primary; the others follow in their order.
    /// The selection must cover every member: a count that differs is a
    /// [`SelectionError`].
    ///
    /// # Errors
    ///
    /// A [`SelectionError`] when the selection covers a different number of
    /// members than the failover has.
    ///
    /// ```
    /// use tower_circuit_breaker::failover::{Failover, Selection};
    /// use tower_circuit_breaker::{Breaker, CircuitBreaker};
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let (a, b) = (Breaker::builder().build().unwrap(), Breaker::builder().build().unwrap());
    /// let failover = Failover::<_, http::Request<String>>::new(CircuitBreaker::new(upstream.clone(), a.clone()))
    ///     .fallback(CircuitBreaker::new(upstream, b.clone()));
    /// assert!(failover.clone().select(Selection::cheapest([(a.clone(), 1.0), (b.clone(), 0.5)])).is_ok());
    /// assert_eq!(failover.select(Selection::cheapest([(a, 1.0)])).unwrap_err().to_string(), "selection covers 1 members of a failover with 2");
    /// ```
    pub fn select(mut self, selection: Selection) -> Result<Self, SelectionError> {
        if selection.len() != self.routes.len() {
            return Err(SelectionError {
                covers: selection.len(),
                members: self.routes.len(),
            });
        }
        self.selection = Some(selection);
        Ok(self)
    }
}

/// A [`Selection`] given to [`Failover::select`] that does not cover
/// exactly the failover's members.
///
/// ```
/// use tower_circuit_breaker::failover::{Failover, Selection};
/// use tower_circuit_breaker::Breaker;
///
/// let upstream = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let err = Failover::<_, http::Request<String>>::new(upstream)
///     .select(Selection::peak_ewma([]))
///     .unwrap_err();
/// assert_eq!(err.to_string(), "selection covers 0 members of a failover with 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionError {
    covers: usize,
    members: usize,
}

impl fmt::Display for SelectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "selection covers {} members of a failover with {}",
            self.covers, self.members
        )
    }
}

impl std::error::Error for SelectionError {}

/// The walk of one call: the chosen member first, then the others in their
/// order.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Walk {
    first: usize,
}

impl Walk {
    pub(super) fn starting_at(first: usize) -> Self {
        Walk { first }
    }

    /// The member at `position` of the walk.
    pub(super) fn member(self, position: usize) -> usize {
        match position {
            0 => self.first,
            p if p <= self.first => p - 1,
            p => p,
        }
    }

    /// The position of `member` in the walk.
    pub(super) fn position(self, member: usize) -> usize {
        match member {
            m if m == self.first => 0,
            m if m < self.first => m + 1,
            m => m,
        }
    }
}

#[cfg(test)]
#[path = "select_tests.rs"]
mod tests;
