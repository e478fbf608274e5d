//! [`RateLimit`]: a request limit a scripted upstream keeps, announced in
//! OpenAI's `x-ratelimit-*` headers.

use std::time::Duration;

use http::{HeaderMap, HeaderValue};

/// A limit of `requests` calls per `period`, in fixed windows from the
/// upstream's start (`[0, period)`, `[period, 2 × period)`, …), as a
/// [`ScriptedUpstream`](super::ScriptedUpstream) keeps it (see
/// [`ScriptBuilder::rate_limit`](super::ScriptBuilder::rate_limit)).
///
/// Every answer's head carries `x-ratelimit-limit-requests`,
/// `x-ratelimit-remaining-requests` (the calls left in the window after
/// this one) and `x-ratelimit-reset-requests` (the time from the head to
/// the window's end, as `1.250s`). A call beyond the limit is not drawn
/// from the script: it is answered at once with a 429 carrying the same
/// headers, remaining `0`, and no `Retry-After`. The call that takes the
/// window's last request says remaining `0` itself, so a client that reads
/// the headers (the breaker's
/// [`pace_rate_limits`](crate::Builder::pace_rate_limits)) can wait for the
/// reset before any 429 comes.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceExt;
/// use tower_circuit_breaker::testing::{Answer, Phase, RateLimit, Script, ScriptedUpstream};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let script = Script::builder()
///     .rate_limit(RateLimit::new(2, Duration::from_secs(10)))
///     .phase(Phase::new(Duration::ZERO).answer(1.0, Answer::ok()))
///     .build()
///     .unwrap();
/// let upstream = ScriptedUpstream::new(script);
/// let call = || upstream.clone().oneshot(http::Request::new(String::new()));
/// let first = call().await.unwrap();
/// assert_eq!(first.headers()["x-ratelimit-remaining-requests"], "1");
/// let second = call().await.unwrap();
/// assert_eq!(second.status(), 200);
/// assert_eq!(second.headers()["x-ratelimit-remaining-requests"], "0");
/// assert_eq!(second.headers()["x-ratelimit-reset-requests"], "10.000s");
/// assert_eq!(call().await.unwrap().status(), 429);
/// tokio::time::advance(Duration::from_secs(10)).await;
/// assert_eq!(call().await.unwrap().status(), 200, "a new window");
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub(super) requests: u32,
    pub(super) period: Duration,
}

impl RateLimit {
    /// `requests` calls per `period`. Zero of either is refused by
    /// [`ScriptBuilder::build`](super::ScriptBuilder::build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::testing::{Answer, Phase, RateLimit, Script, ScriptError};
    ///
    /// let ok = Phase::new(Duration::ZERO).answer(1.0, Answer::ok());
    /// let none = Script::builder().rate_limit(RateLimit::new(0, Duration::from_secs(60))).phase(ok);
    /// assert_eq!(none.build().unwrap_err(), ScriptError::RateLimit);
    /// ```
    #[must_use]
    pub const fn new(requests: u32, period: Duration) -> RateLimit {
        RateLimit { requests, period }
    }

    /// The calls allowed per window.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_circuit_breaker::testing::RateLimit;
    /// assert_eq!(RateLimit::new(150, Duration::from_secs(60)).requests(), 150);
    /// ```
    #[must_use]
    pub const fn requests(&self) -> u32 {
        self.requests
    }

    /// The window's length.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower_circuit_breaker::testing::RateLimit;
    /// assert_eq!(RateLimit::new(150, Duration::from_secs(60)).period(), Duration::from_secs(60));
    /// ```
    #[must_use]
    pub const fn period(&self) -> Duration {
        self.period
    }

    /// The window a call at `at` (since the start) falls in.
    pub(super) fn window(&self, at: Duration) -> u64 {
        let period = self.period.as_nanos().max(1);
        u64::try_from(at.as_nanos() / period).unwrap_or(u64::MAX)
    }

    /// When window `w` ends, since the start.
    pub(super) fn window_end(&self, w: u64) -> Duration {
        let n = u32::try_from(w.saturating_add(1)).unwrap_or(u32::MAX);
        self.period.saturating_mul(n)
    }
}

/// The `x-ratelimit-*` headers of an answer: `remaining` calls left, the
/// window's reset `reset` from now.
pub(super) fn set_headers(headers: &mut HeaderMap, limit: u32, remaining: u32, reset: Duration) {
    headers.insert("x-ratelimit-limit-requests", HeaderValue::from(limit));
    headers.insert(
        "x-ratelimit-remaining-requests",
        HeaderValue::from(remaining),
    );
    let reset = format!("{}.{:03}s", reset.as_secs(), reset.subsec_millis());
    if let Ok(value) = HeaderValue::from_str(&reset) {
        headers.insert("x-ratelimit-reset-requests", value);
    }
}
