//! Hedging: a second attempt when the first is slow to start ([`Hedge`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::time::Instant;

use super::latency::Latency;
use super::Failover;
use crate::retry::RetryBudget;

/// When and how often a [`Failover`](super::Failover) hedges. Cheap to
/// clone; clones share the budget and the counters.
///
/// With a [`Hedge`] policy ([`Failover::hedge`](super::Failover::hedge)), a
/// request whose first attempt has no response head (or, for a member under
/// a first-frame deadline, no first body frame: [below](#the-first-token))
/// after the hedge's delay is sent again, to the next member of the failover
/// whose circuit admits it. The first of the two to produce its head wins
/// and is returned; the
/// other is dropped, which cancels it: its breaker records the call as
/// [`Ignored`](crate::Outcome::Ignored) (a lost race says nothing about the
/// upstream's health), its connection is dropped, and its elapsed time is
/// fed to that member's [`Latency`] as a censored sample, so an upstream that
/// keeps losing still shows how slow it is.
///
/// - **Delay**: fixed ([`Hedge::after`]), or a percentile of the waiting
///   member's own recent time to first byte ([`Hedge::at_percentile`]).
/// - **Budget**: hedges are a share of first attempts over the last 10 s (a
///   [`RetryBudget`] of its own, 10 % by default). Past it, a slow first
///   attempt is simply waited for.
/// - **Never a retry**: a request marked [`Retried`](crate::Retried) (every
///   retry a [`RetryPolicy`](crate::retry::RetryPolicy) sends) is not hedged;
///   put the retry outside the failover, as the [crate's order](crate::stack)
///   says. At worst a caller's request becomes
///   `(1 + retry budget) × (1 + hedge budget)` attempts (1.2 × 1.1 = 1.32 with
///   a 20 % retry budget and the default hedge budget).
/// - **Never to an open circuit**: a hedge goes to the next member whose
///   circuit admits it; a member that rejects it (open, half-open with its
///   probes out, paced by a rate limit) was never sent anything and is
///   skipped, and the budget is given back when no member admits the hedge.
/// - **Failures**: when one of the two fails (a 503, a timeout), the other
///   is waited for; when both fail, the failover goes on with the member
///   after them, as without hedging.
/// - **Clone**: the request is cloned for the hedge. A request whose body is
///   not `Clone` (a one-shot stream) cannot go through a `Failover`, so it is
///   never hedged.
///
/// - **With a selection**: in a failover with a
///   [`Selection`](super::Selection), the hedge goes to the member the
///   selection would try second (the next member of that call's walk that
///   admits it), and both attempts feed the selection's estimates: the
///   winner's time to first byte, the loser's elapsed time as a censored
///   sample ([`Selection::record_at_least`](super::Selection::record_at_least)),
///   so a member that keeps losing is chosen less.
///
/// Only the first attempt that reaches an upstream is hedged, once.
///
/// # The first token
///
/// The race is on each member's response future. A plain breaker's
/// resolves at the response head; one under a first-frame deadline
/// ([`StreamDeadlines::first_frame`](crate::deadline::StreamDeadlines::first_frame))
/// resolves at the body's first frame, handed back as the body's first. So
/// with such members an event stream whose head comes at once and whose
/// first token is late is hedged at the delay, the first token wins, and
/// [`Hedge::at_percentile`] learns each member's time to first token.
/// Without a first-frame deadline the head wins the race, and a late first
/// token is not hedged. Set the deadline to what a first token may take at
/// most (the attempt timeout, say): it is also a deadline.
///
/// ```
/// use std::time::Duration;
/// use http_body_util::BodyExt;
/// use tower::{Layer, ServiceExt};
/// use tower_circuit_breaker::classify::LlmClassifier;
/// use tower_circuit_breaker::deadline::StreamDeadlines;
/// use tower_circuit_breaker::failover::{Failover, Hedge};
/// use tower_circuit_breaker::{Breaker, CircuitBreakerLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // An event stream whose head comes at once; its first token comes after
/// // 5 s from the primary, 100 ms from the fallback.
/// let client = tower::service_fn(|req: http::Request<String>| async move {
///     let wait = Duration::from_millis(if req.body() == "fast" { 100 } else { 5000 });
///     // Boxed: a failover's bodies are `Unpin`.
///     let token = Box::pin(futures::stream::once(async move {
///         tokio::time::sleep(wait).await;
///         Ok::<_, std::convert::Infallible>(http_body::Frame::data(bytes::Bytes::from("data: hi\n\n")))
///     }));
///     let res = http::Response::builder()
///         .header("content-type", "text/event-stream")
///         .body(http_body_util::StreamBody::new(token))
///         .unwrap();
///     Ok::<_, std::convert::Infallible>(res)
/// });
/// let member = || {
///     CircuitBreakerLayer::new(Breaker::builder().build().unwrap())
///         .with_classifier(LlmClassifier::new())
///         .stream_deadlines(StreamDeadlines::new().first_frame(Duration::from_secs(60)))
///         .unwrap()
///         .layer(client.clone())
/// };
/// let hedge = Hedge::after(Duration::from_millis(500)).budget_percent(100.0).unwrap();
/// let failover = Failover::new(member())
///     .fallback_with(member(), |req: &mut http::Request<String>| *req.body_mut() = "fast".into())
///     .hedge(hedge.clone());
///
/// let started = tokio::time::Instant::now();
/// let res = failover.oneshot(http::Request::new("slow".to_owned())).await.unwrap();
/// // Hedged at 500 ms, the fallback's first token 100 ms later.
/// assert_eq!(started.elapsed(), Duration::from_millis(600));
/// assert_eq!(hedge.sent(), 1);
/// let body = res.into_body().collect().await.unwrap().to_bytes();
/// assert_eq!(body, "data: hi\n\n");
/// # }
/// ```
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceExt;
/// use tower_circuit_breaker::failover::{Failover, Hedge};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // One client; the primary model takes 5 s to answer, the fallback 100 ms.
/// let client = tower::service_fn(|req: http::Request<String>| async move {
///     let fast = req.body() == "fast";
///     let delay = Duration::from_millis(if fast { 100 } else { 5000 });
///     tokio::time::sleep(delay).await;
///     Ok::<_, std::convert::Infallible>(http::Response::new(req.into_body()))
/// });
/// let primary = Breaker::builder().build().unwrap();
/// let hedge = Hedge::after(Duration::from_millis(500)).budget_percent(100.0).unwrap();
/// let fallback = CircuitBreaker::new(client.clone(), Breaker::builder().build().unwrap());
/// let failover = Failover::new(CircuitBreaker::new(client, primary.clone()))
///     .fallback_with(fallback, |req: &mut http::Request<String>| *req.body_mut() = "fast".into())
///     .hedge(hedge.clone());
///
/// let started = tokio::time::Instant::now();
/// let res = failover.oneshot(http::Request::new("slow".to_owned())).await.unwrap();
/// // Hedged at 500 ms, answered by the fallback 100 ms later.
/// assert_eq!(res.status(), 200);
/// assert_eq!(started.elapsed(), Duration::from_millis(600));
/// assert_eq!(hedge.sent(), 1);
/// // The primary's attempt was cancelled: ignored by its trip rules.
/// assert_eq!(primary.snapshot().counters.failures, 0);
/// # }
/// ```
///
/// # The same upstream
///
/// A hedge to the same upstream is the same member twice. It doubles the
/// cost of a slow call to that one provider, so it pays where slowness is
/// per request (a slow replica behind a load balancer, a long queue at one
/// node) and not where the provider as a whole is slow, which a fallback to
/// another one serves better.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::failover::{Failover, Hedge};
/// use tower_circuit_breaker::{Breaker, CircuitBreaker};
///
/// let client = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let upstream = CircuitBreaker::new(client, Breaker::builder().build().unwrap());
/// let hedged = Failover::<_, http::Request<String>>::new(upstream.clone())
///     .fallback(upstream)
///     .hedge(Hedge::after(Duration::from_secs(2)));
/// assert_eq!(hedged.len(), 2);
/// ```
///
/// # Settings
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::failover::Hedge;
///
/// // Hedge after the primary's own p95 time to first byte (2 s until it
/// // has samples), for at most 5 % of first attempts.
/// let hedge = Hedge::at_percentile(95.0, Duration::from_secs(2))
///     .unwrap()
///     .budget_percent(5.0)
///     .unwrap();
/// assert_eq!(hedge.sent(), 0);
/// assert!(Hedge::at_percentile(120.0, Duration::from_secs(2)).is_err());
/// ```
#[derive(Clone)]
pub struct Hedge {
    delay: Delay,
    pub(super) budget: RetryBudget,
    pub(super) sent: Arc<AtomicU64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Delay {
    Fixed(Duration),
    Percentile { percentile: f64, initial: Duration },
}

/// The default budget: hedges at most 10 % of first attempts.
const DEFAULT_BUDGET_PERCENT: f64 = 10.0;

impl Hedge {
    /// Hedges a first attempt that has no response head after `delay`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Hedge;
    ///
    /// let hedge = Hedge::after(Duration::from_millis(800));
    /// # let _ = hedge;
    /// ```
    #[must_use]
    pub fn after(delay: Duration) -> Self {
        Hedge::with_delay(Delay::Fixed(delay))
    }

    /// Hedges a first attempt that has no response head after `percentile`
    /// (`0.0..=100.0` excluding 0; `95.0` for p95) of that member's recent
    /// time to first byte ([`Latency`]), or after `initial` while the member
    /// has fewer than [`Latency::MIN_SAMPLES`] samples.
    ///
    /// # Errors
    ///
    /// A [`HedgeError`] when `percentile` is not within `(0, 100]`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Hedge;
    ///
    /// assert!(Hedge::at_percentile(90.0, Duration::from_secs(1)).is_ok());
    /// assert!(Hedge::at_percentile(0.0, Duration::from_secs(1)).is_err());
    /// ```
    pub fn at_percentile(percentile: f64, initial: Duration) -> Result<Self, HedgeError> {
        if !(percentile > 0.0 && percentile <= 100.0) {
            return Err(HedgeError("the percentile is not within (0, 100]"));
        }
        Ok(Hedge::with_delay(Delay::Percentile {
            percentile,
            initial,
        }))
    }

    fn with_delay(delay: Delay) -> Self {
        Hedge {
            delay,
            budget: RetryBudget::new(DEFAULT_BUDGET_PERCENT)
                .expect("the default budget is within range"),
            sent: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Hedges at most `percent` % of the first attempts over the last 10 s
    /// (`0..=1000`; the default is 10 %).
    ///
    /// # Errors
    ///
    /// A [`HedgeError`] when `percent` is outside the retry budget's range.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Hedge;
    ///
    /// assert!(Hedge::after(Duration::from_secs(1)).budget_percent(2.0).is_ok());
    /// assert!(Hedge::after(Duration::from_secs(1)).budget_percent(-1.0).is_err());
    /// ```
    pub fn budget_percent(self, percent: f64) -> Result<Self, HedgeError> {
        let budget = RetryBudget::new(percent)
            .map_err(|_| HedgeError("the budget is not within 0..=1000 %"))?;
        Ok(self.budget(budget))
    }

    /// Takes hedges from `budget` (the shape of a retry budget: a share of
    /// first attempts, plus an optional floor a second). Give it a budget of
    /// its own: a hedge is not a retry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Hedge;
    /// use tower_circuit_breaker::retry::RetryBudget;
    ///
    /// let budget = RetryBudget::with_min_per_sec(5.0, 1).unwrap();
    /// let hedge = Hedge::after(Duration::from_secs(1)).budget(budget);
    /// # let _ = hedge;
    /// ```
    #[must_use]
    pub fn budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self
    }

    /// How many hedges were sent.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Hedge;
    ///
    /// assert_eq!(Hedge::after(Duration::from_secs(1)).sent(), 0);
    /// ```
    #[must_use]
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// How many hedges the budget refused.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::Hedge;
    ///
    /// assert_eq!(Hedge::after(Duration::from_secs(1)).denied(), 0);
    /// ```
    #[must_use]
    pub fn denied(&self) -> u64 {
        self.budget.denied()
    }
}

impl fmt::Debug for Hedge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hedge")
            .field("delay", &self.delay)
            .field("budget", &self.budget)
            .field("sent", &self.sent())
            .finish()
    }
}

/// A [`Hedge`] setting out of range.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::failover::Hedge;
///
/// let err = Hedge::at_percentile(f64::NAN, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.to_string(), "hedge: the percentile is not within (0, 100]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HedgeError(&'static str);

impl fmt::Display for HedgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hedge: {}", self.0)
    }
}

impl std::error::Error for HedgeError {}

// === the failover's hedging ===

impl<S, Req, C> Failover<S, Req, C> {
    /// Hedges slow first attempts by `policy`: a first attempt with no
    /// response head after the policy's delay is sent again to the next
    /// member whose circuit admits it, and the first head wins; see
    /// [`Hedge`] for the rules (a budget of its own, never a retry, never to
    /// an open circuit). With a retry outside, a caller's request becomes at
    /// most `(1 + retry budget) × (1 + hedge budget)` attempts. The request
    /// is cloned for the hedge; a request whose body is not `Clone` cannot
    /// go through a failover, so is never hedged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::{Failover, Hedge};
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// // Hedge after the primary's own p90 time to first byte, 1 s at first.
    /// let failover = Failover::<_, http::Request<String>>::new(upstream.clone())
    ///     .fallback(upstream)
    ///     .hedge(Hedge::at_percentile(90.0, Duration::from_secs(1)).unwrap());
    /// assert!(failover.latency(0).is_some());
    /// ```
    #[must_use]
    pub fn hedge(mut self, policy: Hedge) -> Self {
        self.hedge = Some(Arc::new(Hedging::new(policy, self.routes.len())));
        self
    }

    /// Member `member`'s (from 0, the primary) recent time to first byte,
    /// as the failover saw it; kept while hedging (see
    /// [`hedge`](Self::hedge)), `None` otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::failover::{Failover, Hedge};
    ///
    /// let upstream = tower::service_fn(|_req: http::Request<String>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let plain = Failover::<_, http::Request<String>>::new(upstream.clone());
    /// assert!(plain.latency(0).is_none());
    /// let hedged = plain.fallback(upstream).hedge(Hedge::after(Duration::from_secs(1)));
    /// assert_eq!(hedged.latency(1).map(|l| l.samples()), Some(0));
    /// ```
    pub fn latency(&self, member: usize) -> Option<&Latency> {
        self.hedge.as_deref()?.latency(member)
    }
}

/// A failover's policy and one latency estimate per member.
#[derive(Clone, Debug)]
pub(super) struct Hedging {
    pub(super) policy: Hedge,
    latency: Vec<Latency>,
}

impl Hedging {
    pub(super) fn new(policy: Hedge, members: usize) -> Self {
        Hedging {
            policy,
            latency: (0..members).map(|_| Latency::new()).collect(),
        }
    }

    /// One more member.
    pub(super) fn grow(&mut self, members: usize) {
        self.latency.resize_with(members, Latency::new);
    }

    pub(super) fn latency(&self, member: usize) -> Option<&Latency> {
        self.latency.get(member)
    }

    pub(super) fn delay(&self, member: usize) -> Duration {
        match self.policy.delay {
            Delay::Fixed(delay) => delay,
            Delay::Percentile {
                percentile,
                initial,
            } => self
                .latency(member)
                .and_then(|l| l.percentile(percentile))
                .unwrap_or(initial),
        }
    }

    /// An attempt that finished and reached its upstream.
    pub(super) fn finished<B, E>(
        &self,
        member: usize,
        since: Instant,
        result: &Result<Response<B>, E>,
    ) {
        if let Some(latency) = self.latency(member) {
            match result {
                Ok(_) => latency.record(since.elapsed()),
                // A timeout, a reset: no head came in that time.
                Err(_) => latency.record_censored(since.elapsed()),
            }
        }
    }

    /// An attempt dropped for the other's answer.
    pub(super) fn lost(&self, member: usize, since: Instant) {
        if let Some(latency) = self.latency(member) {
            latency.record_censored(since.elapsed());
        }
    }
}

#[cfg(test)]
#[path = "hedge_tests.rs"]
mod tests;
