//! Stream deadlines, and the one table of every deadline a call can meet.
//!
//! An attempt timeout (`tower::timeout`) covers a call up to its response
//! head. A streamed LLM answer can then stall: a 200 that sends a few tokens
//! and stops, or never sends the first one. [`StreamDeadlines`] bound the
//! body: the time to the first body frame (the first token), the longest gap
//! between two frames (a stall), and the total time of the call, body
//! included. A deadline that passes ends the body with a [`StreamElapsed`]
//! error and records the call as a [`Failure`](crate::Outcome::Failure);
//! the caller dropping the body itself stays what the classifier says of a
//! drop ([`Ignored`](crate::Outcome::Ignored) for a stream cut short).
//!
//! Set them with [`CircuitBreakerLayer::stream_deadlines`](crate::CircuitBreakerLayer::stream_deadlines),
//! [`CircuitBreaker::stream_deadlines`](crate::CircuitBreaker::stream_deadlines)
//! or [`StackBuilder::stream_deadlines`](crate::stack::StackBuilder::stream_deadlines).
//! The service then answers with a [`TimedBody`](crate::body::TimedBody),
//! whose error is a [`BoxError`](crate::BoxError) (the inner body's error, or
//! a [`StreamElapsed`]), and needs the inner body to be `Unpin` (hyper's
//! `Incoming`, reqwest's, axum's and tonic's bodies are). Without them the
//! body is a [`ResponseBody`](crate::ResponseBody), whose error is the inner
//! body's, unchanged, and no timer is armed.
//!
//! # Moving on before the first byte, never after
//!
//! With a first-frame deadline, the response future resolves only once the
//! first body frame has come (the frame is held and handed back as the
//! body's first), or fails with [`StreamElapsed`] at the deadline. So a
//! retry ([`RetryPolicy`](crate::retry::RetryPolicy)) or a
//! [`Failover`](crate::failover::Failover) outside the breaker can still act
//! on an upstream that answers a head and then nothing; once the first frame
//! is out, the answer is the caller's, and a stall after it reaches the
//! caller as the body's error.
//!
//! With a first-frame deadline, "time to head" means time to the first body
//! frame for the slow-call rule and for a half-open probe's deadline
//! ([`Builder::probe_timeout`](crate::Builder::probe_timeout)): the first
//! token, which is what a streamed answer's speed is.
//!
//! With stream deadlines, a success decided on the head is recorded when
//! the body ends, so that a deadline can still fail the call; a body that
//! breaks after such a head is a failure; a body the caller drops keeps the
//! head's verdict.
//!
//! # Every deadline
//!
//! | deadline | set by | measured | when it passes |
//! |---|---|---|---|
//! | attempt timeout | `tower::timeout` inside the breaker; [`StackBuilder::attempt_timeout`](crate::stack::StackBuilder::attempt_timeout) | from the call to the response head | the attempt fails with `Elapsed`, a recorded failure |
//! | total timeout | `tower::timeout` outside the retry; [`StackBuilder::total_timeout`](crate::stack::StackBuilder::total_timeout) | from the caller's call to the response head, retries and backoff included | the caller gets `Elapsed`; the attempt in flight is dropped (`Ignored`) |
//! | probe deadline | [`Builder::probe_timeout`](crate::Builder::probe_timeout) (default: the open duration, or the slow threshold) | a half-open probe, from admission to its head (first frame with a first-frame deadline) | a failed probe at that moment; its late outcome is dropped |
//! | lease | [`Builder::probe_lease`](crate::Builder::probe_lease) | a half-open probe, from admission to its end | the slot is freed without a verdict |
//! | slow threshold | [`Builder::slow_call`](crate::Builder::slow_call) | from admission to the head (first frame with a first-frame deadline) | counted slow once, when crossed |
//! | first frame | [`StreamDeadlines::first_frame`] | from the call to the first body frame | the response future fails with [`StreamElapsed`]; a failure |
//! | stall | [`StreamDeadlines::stall`] | the gap between two body frames (from the head, or the first frame) | the body ends with [`StreamElapsed`]; a failure |
//! | total stream | [`StreamDeadlines::total`] | from the call to the end of the body | the body ends with [`StreamElapsed`]; a failure |
//!
//! [`StackBuilder::build`](crate::stack::StackBuilder::build) refuses the
//! combinations that cannot work: a probe deadline or slow threshold beyond
//! the attempt timeout, a lease not beyond it, a stall deadline longer than
//! the total timeout or the total stream time, a first-frame deadline longer
//! than the total stream time.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower::{Layer, Service, ServiceExt};
//! use tower_circuit_breaker::deadline::StreamDeadlines;
//! use tower_circuit_breaker::error::{StreamDeadline, StreamElapsed};
//! use tower_circuit_breaker::{BoxError, CircuitBreakerLayer};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), BoxError> {
//! // An upstream that sends a head and then nothing.
//! let upstream = tower::service_fn(|_req: http::Request<String>| async {
//!     let body = http_body_util::StreamBody::new(futures::stream::pending::<
//!         Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>,
//!     >());
//!     Ok::<_, std::convert::Infallible>(http::Response::new(body))
//! });
//! let layer = CircuitBreakerLayer::builder()
//!     .consecutive_failures(1)
//!     .build()?
//!     .stream_deadlines(StreamDeadlines::new().first_frame(Duration::from_secs(10)))?;
//! let breaker = layer.breaker().clone();
//! let mut client = layer.layer(upstream);
//!
//! let err = client.ready().await?.call(http::Request::new(String::new())).await.unwrap_err();
//! let err: BoxError = err.into_box();
//! let elapsed = err.downcast_ref::<StreamElapsed>().unwrap();
//! assert_eq!(elapsed.deadline(), StreamDeadline::FirstFrame);
//! assert_eq!(breaker.snapshot().counters.failures, 1);
//! # Ok(()) }
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::breaker::MAX_DURATION;

/// Which stream deadline passed; see [`StreamElapsed::deadline`].
///
/// ```
/// use tower_circuit_breaker::deadline::{StreamDeadline, StreamElapsed};
/// use tower_circuit_breaker::BoxError;
///
/// // What to tell the user, by which deadline passed.
/// fn explain(err: &BoxError) -> &'static str {
///     match err.downcast_ref::<StreamElapsed>().map(StreamElapsed::deadline) {
///         Some(StreamDeadline::FirstFrame) => "the model never started answering",
///         Some(StreamDeadline::Stall) => "the answer stopped mid-way",
///         Some(StreamDeadline::Total) => "the answer took too long",
///         Some(_) | None => "another error",
///     }
/// }
/// let other: BoxError = "connection reset".into();
/// assert_eq!(explain(&other), "another error");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamDeadline {
    /// No body frame came in time.
    FirstFrame,
    /// The gap between two frames grew too long.
    Stall,
    /// The call, body included, took too long.
    Total,
}

/// Deadlines for a response body; see the [module docs](self). All unset by
/// default.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::deadline::StreamDeadlines;
///
/// let d = StreamDeadlines::new()
///     .first_frame(Duration::from_secs(10))
///     .stall(Duration::from_secs(15))
///     .total(Duration::from_secs(300));
/// assert_eq!(d.first_frame_timeout(), Some(Duration::from_secs(10)));
/// assert!(d.validate().is_ok());
/// assert!(StreamDeadlines::new().stall(Duration::ZERO).validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamDeadlines {
    first_frame: Option<Duration>,
    stall: Option<Duration>,
    total: Option<Duration>,
}

impl StreamDeadlines {
    /// No deadline set.
    ///
    /// ```
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// assert!(StreamDeadlines::new().is_empty());
    /// assert_eq!(StreamDeadlines::new(), StreamDeadlines::default());
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        StreamDeadlines {
            first_frame: None,
            stall: None,
            total: None,
        }
    }

    /// The first body frame (the first token) must come within `timeout`
    /// of the call. The response future waits for it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// // A model that has not sent its first token in 10 s is treated as down.
    /// let d = StreamDeadlines::new().first_frame(Duration::from_secs(10));
    /// assert_eq!(d.first_frame_timeout(), Some(Duration::from_secs(10)));
    /// ```
    #[must_use]
    pub const fn first_frame(mut self, timeout: Duration) -> Self {
        self.first_frame = Some(timeout);
        self
    }

    /// No gap between two body frames (nor between the head and the first
    /// frame, without a first-frame deadline) may exceed `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// // Tokens usually come every few hundred milliseconds; 15 s of silence is a stall.
    /// let d = StreamDeadlines::new().stall(Duration::from_secs(15));
    /// assert_eq!(d.stall_timeout(), Some(Duration::from_secs(15)));
    /// ```
    #[must_use]
    pub const fn stall(mut self, timeout: Duration) -> Self {
        self.stall = Some(timeout);
        self
    }

    /// The whole call, body included, must end within `timeout` of the call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// let d = StreamDeadlines::new().total(Duration::from_secs(300));
    /// assert_eq!(d.total_timeout(), Some(Duration::from_secs(300)));
    /// ```
    #[must_use]
    pub const fn total(mut self, timeout: Duration) -> Self {
        self.total = Some(timeout);
        self
    }

    /// The first-frame deadline, if set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// assert_eq!(StreamDeadlines::new().first_frame_timeout(), None);
    /// let d = StreamDeadlines::new().first_frame(Duration::from_secs(5));
    /// assert_eq!(d.first_frame_timeout(), Some(Duration::from_secs(5)));
    /// ```
    #[must_use]
    pub const fn first_frame_timeout(&self) -> Option<Duration> {
        self.first_frame
    }

    /// The stall deadline, if set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// assert_eq!(StreamDeadlines::new().stall_timeout(), None);
    /// let d = StreamDeadlines::new().stall(Duration::from_secs(15));
    /// assert_eq!(d.stall_timeout(), Some(Duration::from_secs(15)));
    /// ```
    #[must_use]
    pub const fn stall_timeout(&self) -> Option<Duration> {
        self.stall
    }

    /// The total stream deadline, if set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// assert_eq!(StreamDeadlines::new().total_timeout(), None);
    /// let d = StreamDeadlines::new().total(Duration::from_secs(120));
    /// assert_eq!(d.total_timeout(), Some(Duration::from_secs(120)));
    /// ```
    #[must_use]
    pub const fn total_timeout(&self) -> Option<Duration> {
        self.total
    }

    /// Whether any deadline is set.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::StreamDeadlines;
    ///
    /// assert!(StreamDeadlines::new().is_empty());
    /// assert!(!StreamDeadlines::new().total(Duration::from_secs(60)).is_empty());
    /// ```
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.first_frame.is_none() && self.stall.is_none() && self.total.is_none()
    }

    /// Refuses a zero deadline, a deadline longer than a week
    /// ([`DeadlineError::TooLong`]), and a first-frame or stall deadline
    /// longer than the total stream time (it could never pass).
    ///
    /// # Errors
    ///
    /// A [`DeadlineError`] naming the deadline that could never work.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::deadline::{DeadlineError, StreamDeadlines};
    ///
    /// let ok = StreamDeadlines::new().stall(Duration::from_secs(15)).total(Duration::from_secs(300));
    /// assert!(ok.validate().is_ok());
    ///
    /// // A stall deadline longer than the whole stream could never pass.
    /// let never = StreamDeadlines::new().stall(Duration::from_secs(600)).total(Duration::from_secs(300));
    /// assert_eq!(never.validate(), Err(DeadlineError::AboveTotal("stall")));
    ///
    /// // No deadline is longer than a week.
    /// let unbounded = StreamDeadlines::new().total(Duration::MAX);
    /// assert!(matches!(unbounded.validate(), Err(DeadlineError::TooLong { setting: "total", .. })));
    /// ```
    pub fn validate(&self) -> Result<(), DeadlineError> {
        let all = [
            ("first_frame", self.first_frame),
            ("stall", self.stall),
            ("total", self.total),
        ];
        if let Some((setting, _)) = all.iter().find(|(_, d)| d.is_some_and(|d| d.is_zero())) {
            return Err(DeadlineError::Zero(setting));
        }
        // Each deadline becomes a moment on the clock when a request starts;
        // bounded here, that moment always exists.
        for (setting, d) in all {
            if d.is_some_and(|d| d > MAX_DURATION) {
                return Err(DeadlineError::TooLong {
                    setting,
                    max: MAX_DURATION,
                });
            }
        }
        if let Some(total) = self.total {
            if self.stall.is_some_and(|s| s > total) {
                return Err(DeadlineError::AboveTotal("stall"));
            }
            if self.first_frame.is_some_and(|f| f > total) {
                return Err(DeadlineError::AboveTotal("first_frame"));
            }
        }
        Ok(())
    }
}

// === DeadlineError ===

/// Stream deadlines that cannot work, refused by
/// [`StreamDeadlines::validate`] (and so by every `stream_deadlines` setter).
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::deadline::{DeadlineError, StreamDeadlines};
///
/// let err = StreamDeadlines::new().stall(Duration::ZERO).validate().unwrap_err();
/// assert_eq!(err, DeadlineError::Zero("stall"));
/// assert_eq!(err.to_string(), "stream deadlines: the stall deadline is zero");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadlineError {
    /// This deadline (`first_frame`, `stall` or `total`) is zero.
    Zero(&'static str),
    /// This deadline is longer than its upper bound, a week.
    TooLong {
        /// Which deadline.
        setting: &'static str,
        /// Its upper bound.
        max: Duration,
    },
    /// This deadline (`first_frame` or `stall`) is longer than the total
    /// stream time, so it could never pass.
    AboveTotal(&'static str),
}

impl fmt::Display for DeadlineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeadlineError::Zero(setting) => {
                write!(f, "stream deadlines: the {setting} deadline is zero")
            }
            DeadlineError::TooLong { setting, max } => write!(
                f,
                "stream deadlines: the {setting} deadline is longer than its upper bound {max:?}"
            ),
            DeadlineError::AboveTotal(setting) => write!(
                f,
                "stream deadlines: the {setting} deadline is longer than the total stream time"
            ),
        }
    }
}

impl StdError for DeadlineError {}

// === StreamElapsed ===

/// A stream deadline passed (see [`StreamDeadlines`]):
/// the first body frame did not come in time, the stream stalled, or it ran
/// past its total time. The call is recorded as a
/// [`Failure`](crate::Outcome::Failure).
///
/// It is the error of a body (or, for the first frame, of the response
/// future) under stream deadlines; downcast it out of the [`BoxError`](crate::BoxError):
///
/// ```
/// use tower_circuit_breaker::error::{StreamDeadline, StreamElapsed};
/// use tower_circuit_breaker::BoxError;
///
/// fn stalled(err: &BoxError) -> bool {
///     err.downcast_ref::<StreamElapsed>()
///         .is_some_and(|e| e.deadline() == StreamDeadline::Stall)
/// }
/// # let _ = stalled;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamElapsed {
    deadline: StreamDeadline,
}

impl StreamElapsed {
    pub(crate) const fn new(deadline: StreamDeadline) -> Self {
        StreamElapsed { deadline }
    }

    /// Which deadline passed.
    ///
    /// ```
    /// use tower_circuit_breaker::error::{StreamDeadline, StreamElapsed};
    /// use tower_circuit_breaker::BoxError;
    ///
    /// fn first_token_late(err: &BoxError) -> bool {
    ///     err.downcast_ref::<StreamElapsed>()
    ///         .is_some_and(|e| e.deadline() == StreamDeadline::FirstFrame)
    /// }
    /// let other: BoxError = "connection reset".into();
    /// assert!(!first_token_late(&other));
    /// ```
    #[must_use]
    pub fn deadline(&self) -> StreamDeadline {
        self.deadline
    }
}

impl fmt::Display for StreamElapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.deadline {
            StreamDeadline::FirstFrame => "first body frame deadline elapsed",
            StreamDeadline::Stall => "stream stalled",
            StreamDeadline::Total => "stream deadline elapsed",
        })
    }
}

impl StdError for StreamElapsed {}
