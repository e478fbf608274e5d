//! Deciding what a call says about the upstream's health.
//!
//! Every call ends in an [`Outcome`]. A [`Classify`] implementation looks at
//! the response head or the inner error and either decides at once or defers
//! to the end of the body with a [`ClassifyStream`] (trailers, a body error,
//! an error event in a server-sent-event stream).
//!
//! # Example
//!
//! A closure is a classifier that decides on the head:
//!
//! ```
//! use tower_circuit_breaker::classify::{Attempt, Classify, Verdict};
//! use tower_circuit_breaker::Outcome;
//!
//! let only_503s_count = |attempt: Attempt<'_>| match attempt {
//!     Attempt::Response { status, .. } if status == 503 => Outcome::Failure,
//!     Attempt::Response { .. } => Outcome::Success,
//!     Attempt::Error(_) => Outcome::Failure,
//! };
//! let headers = http::HeaderMap::new();
//! assert!(matches!(
//!     only_503s_count.classify_response(http::StatusCode::BAD_GATEWAY, &headers),
//!     Verdict::Done(Outcome::Success)
//! ));
//! ```

mod grpc;
mod http;
mod kind;
mod llm;
mod sse;

pub use self::grpc::{GrpcClassifier, GrpcStream};
pub use self::http::{parse_retry_after, HttpClassifier, MAX_RETRY_AFTER};
pub use self::kind::ErrorKind;
pub(crate) use self::llm::exhausted_reset;
pub(crate) use self::llm::json;
pub(crate) use self::llm::MAX_KIND_BODY;
pub use self::llm::{parse_rate_limit_reset, LlmClassifier, LlmEvents, LlmStream};
pub use self::sse::{ClassifyEvent, SseEvent, SseScanner, SseStream, DEFAULT_MAX_LINE};

pub use crate::breaker::Outcome;

use std::error::Error as StdError;
use std::time::Duration;

use ::http::{HeaderMap, StatusCode};

/// The error type classifiers see: the inner service's error, boxed.
pub type ErrorRef<'a> = &'a (dyn StdError + Send + Sync + 'static);

/// One finished attempt, as a closure classifier sees it.
///
/// ```
/// use tower_circuit_breaker::classify::Attempt;
/// use tower_circuit_breaker::Outcome;
///
/// // Gateways that answer 200 with an `x-error` header on failure:
/// let classify = |attempt: Attempt<'_>| match attempt {
///     Attempt::Response { headers, .. } if headers.contains_key("x-error") => Outcome::Failure,
///     Attempt::Response { status, .. } if status.is_server_error() => Outcome::Failure,
///     Attempt::Response { .. } => Outcome::Success,
///     Attempt::Error(_) => Outcome::Failure,
/// };
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-error", "overloaded".parse().unwrap());
/// let outcome = classify(Attempt::Response { status: http::StatusCode::OK, headers: &headers });
/// assert_eq!(outcome, Outcome::Failure);
/// ```
#[derive(Debug, Clone, Copy)]
pub enum Attempt<'a> {
    /// A response head arrived.
    Response {
        /// Its status.
        status: StatusCode,
        /// Its headers.
        headers: &'a HeaderMap,
    },
    /// The inner service failed.
    Error(ErrorRef<'a>),
}

/// A classifier's answer to a response head.
///
/// ```
/// use tower_circuit_breaker::classify::{Classify, HttpClassifier, Verdict};
/// use tower_circuit_breaker::Outcome;
///
/// let headers = http::HeaderMap::new();
/// match HttpClassifier.classify_response(http::StatusCode::SERVICE_UNAVAILABLE, &headers) {
///     Verdict::Done(outcome) => assert_eq!(outcome, Outcome::Failure),
///     Verdict::Defer(never) => match never {},
/// }
/// ```
#[derive(Debug)]
pub enum Verdict<S> {
    /// Decided now.
    Done(Outcome),
    /// Decide at the end of the body (or when the stream says so).
    Defer(S),
}

/// Turns a response head or an inner error into an [`Outcome`].
///
/// Implemented for closures over [`Attempt`]; see the [module docs](self).
/// A closure that panics records [`Outcome::Ignored`] and is logged, never
/// failing the call (except under `panic = "abort"`).
/// For body-aware classification, return [`Verdict::Defer`] with a
/// [`ClassifyStream`].
///
/// # Example
///
/// A classifier that treats a `x-upstream-degraded: 1` header as a failure
/// and otherwise defers to [`HttpClassifier`]:
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_circuit_breaker::classify::{Classify, ErrorRef, HttpClassifier, NeverDefer, Verdict};
/// use tower_circuit_breaker::Outcome;
///
/// #[derive(Clone, Copy)]
/// struct Degraded;
///
/// impl Classify for Degraded {
///     type Stream = NeverDefer;
///
///     fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<NeverDefer> {
///         if headers.get("x-upstream-degraded").is_some_and(|v| v == "1") {
///             return Verdict::Done(Outcome::Failure);
///         }
///         HttpClassifier.classify_response(status, headers)
///     }
///
///     fn classify_error(&self, error: ErrorRef<'_>) -> Outcome {
///         HttpClassifier.classify_error(error)
///     }
/// }
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-upstream-degraded", "1".parse().unwrap());
/// assert!(matches!(Degraded.classify_response(StatusCode::OK, &headers), Verdict::Done(Outcome::Failure)));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a response classifier: it does not implement `Classify`",
    label = "not a classifier",
    note = "a classifier implements `tower_circuit_breaker::classify::Classify`; use `HttpClassifier`, `LlmClassifier` or `GrpcClassifier`, or a closure `Fn(Attempt<'_>) -> Outcome`",
    note = "a closure over `Attempt` must take it by value and return an `Outcome` (not a `Verdict`)"
)]
pub trait Classify {
    /// The end-of-stream classifier this one may defer to.
    type Stream: ClassifyStream;

    /// Classifies a response head.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{Classify, HttpClassifier, Verdict};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// // A 429 is "slow down", not "broken": neutral for the trip rules.
    /// let headers = http::HeaderMap::new();
    /// let verdict = HttpClassifier.classify_response(http::StatusCode::TOO_MANY_REQUESTS, &headers);
    /// assert!(matches!(verdict, Verdict::Done(Outcome::RateLimited { .. })));
    /// ```
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<Self::Stream>;

    /// Classifies an error of the inner service (including an attempt
    /// timeout's `tower::timeout::error::Elapsed`).
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{Classify, HttpClassifier};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// // A transport error (connect refused, reset, an attempt timeout) is a failure.
    /// let error = std::io::Error::other("connection reset");
    /// assert_eq!(HttpClassifier.classify_error(&error), Outcome::Failure);
    /// ```
    fn classify_error(&self, error: ErrorRef<'_>) -> Outcome;

    /// What a response head says when a layer must decide on the head alone
    /// ([`RetryPolicy`](crate::RetryPolicy), [`Failover`](crate::Failover))
    /// and [`classify_response`](Self::classify_response) deferred to the
    /// body. The default: 429 and 409 a rate limit (waiting
    /// [`announced_wait`](Self::announced_wait)), 402 a quota, a 5xx a
    /// failure, another 4xx ignored, anything else a success.
    ///
    /// ```
    /// use http::{HeaderMap, StatusCode};
    /// use tower_circuit_breaker::classify::{Classify, LlmClassifier};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let mut h = HeaderMap::new();
    /// h.insert("retry-after", "3".parse().unwrap());
    /// let c = LlmClassifier::default();
    /// assert_eq!(
    ///     c.head_outcome(StatusCode::TOO_MANY_REQUESTS, &h),
    ///     Outcome::RateLimited { retry_after: Some(std::time::Duration::from_secs(3)) }
    /// );
    /// assert_eq!(c.head_outcome(StatusCode::BAD_GATEWAY, &h), Outcome::Failure);
    /// ```
    fn head_outcome(&self, status: StatusCode, headers: &HeaderMap) -> Outcome {
        match status.as_u16() {
            429 | 409 => Outcome::RateLimited {
                retry_after: self.announced_wait(headers),
            },
            402 => Outcome::QuotaExhausted,
            500.. => Outcome::Failure,
            400..=499 => Outcome::Ignored,
            // A success streams to the caller as it is.
            _ => Outcome::Success,
        }
    }

    /// How long a rate-limited or quota answer asks callers to wait, read
    /// from its head when a verdict carries no wait of its own. The default
    /// reads `Retry-After`, then the reset of a used-up
    /// `x-ratelimit-*` limit ([`LlmClassifier::retry_after`]).
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{Classify, HttpClassifier};
    ///
    /// let mut h = http::HeaderMap::new();
    /// h.insert("retry-after", "7".parse().unwrap());
    /// assert_eq!(HttpClassifier.announced_wait(&h), Some(std::time::Duration::from_secs(7)));
    /// ```
    fn announced_wait(&self, headers: &HeaderMap) -> Option<Duration> {
        LlmClassifier::retry_after(headers)
    }

    /// How long a used-up rate limit lasts, for pacing
    /// ([`Builder::pace_rate_limits`](crate::Builder::pace_rate_limits)):
    /// nothing when the head carries `Retry-After` (which wins, and which a
    /// rate-limited outcome carries itself), else the reset of a limit whose
    /// remaining count is `0`.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{Classify, HttpClassifier};
    ///
    /// let mut h = http::HeaderMap::new();
    /// h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
    /// h.insert("x-ratelimit-reset-requests", "2s".parse().unwrap());
    /// assert_eq!(HttpClassifier.pacing_wait(&h), Some(std::time::Duration::from_secs(2)));
    /// ```
    fn pacing_wait(&self, headers: &HeaderMap) -> Option<Duration> {
        match parse_retry_after(headers) {
            Some(_) => None,
            None => exhausted_reset(headers),
        }
    }
}

/// Finishes a deferred classification while the body streams.
///
/// Any method may be the last one called: the body stops consulting the
/// classifier once [`on_data`](Self::on_data) returns a verdict.
///
/// ```
/// use tower_circuit_breaker::classify::ClassifyStream;
/// use tower_circuit_breaker::Outcome;
///
/// /// A JSON-lines stream that reports failure as a line `{"error": ...}`.
/// struct JsonLines;
///
/// impl ClassifyStream for JsonLines {
///     fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
///         chunk
///             .split(|b| *b == b'\n')
///             .any(|line| line.starts_with(br#"{"error""#))
///             .then_some(Outcome::Failure)
///     }
///
///     fn on_end(self) -> Outcome {
///         Outcome::Success
///     }
/// }
///
/// let mut stream = JsonLines;
/// assert_eq!(stream.on_data(b"{\"token\":\"hi\"}\n"), None);
/// assert_eq!(stream.on_data(b"{\"error\":\"overloaded\"}\n"), Some(Outcome::Failure));
/// assert_eq!(JsonLines.on_end(), Outcome::Success);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify a response body: it does not implement `ClassifyStream`",
    label = "not a stream classifier",
    note = "`Classify::Stream` must implement `tower_circuit_breaker::classify::ClassifyStream` (at least `on_end`); use `NeverDefer` when the head decides"
)]
pub trait ClassifyStream {
    /// Sees each data chunk; returns an outcome to decide early (an SSE error
    /// event, or a final event after which the rest is irrelevant).
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, LlmEvents, SseStream};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// // The SSE classifier decides as soon as an error event arrives.
    /// let mut stream = SseStream::with_events(LlmEvents::default());
    /// assert_eq!(stream.on_data(b"data: {\"token\":\"hi\"}\n\n"), None);
    /// assert_eq!(stream.on_data(b"event: error\ndata: {}\n\n"), Some(Outcome::Failure));
    /// ```
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        let _ = chunk;
        None
    }

    /// Sees the trailers; returns an outcome to decide on them.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, GrpcClassifier, Classify, Verdict};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// // gRPC reports its status in the trailers: 14 is UNAVAILABLE.
    /// let head = http::HeaderMap::new();
    /// let Verdict::Defer(mut stream) = GrpcClassifier.classify_response(http::StatusCode::OK, &head) else {
    ///     panic!("a gRPC answer without a status in its head is decided by the trailers");
    /// };
    /// let mut trailers = http::HeaderMap::new();
    /// trailers.insert("grpc-status", "14".parse().unwrap());
    /// assert_eq!(stream.on_trailers(&trailers), Some(Outcome::Failure));
    /// ```
    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<Outcome> {
        let _ = trailers;
        None
    }

    /// The body ended cleanly.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, LlmEvents, SseStream};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let mut stream = SseStream::with_events(LlmEvents::default());
    /// assert_eq!(stream.on_data(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"), Some(Outcome::Success));
    ///
    /// // A stream that ends cleanly, between events, is a success by default.
    /// let mut stream = SseStream::with_events(LlmEvents::default());
    /// assert_eq!(stream.on_data(b"data: {\"choices\":[]}\n\n"), None);
    /// assert_eq!(stream.on_end(), Outcome::Success);
    /// ```
    fn on_end(self) -> Outcome;

    /// The body failed mid-stream.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, LlmEvents, SseStream};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// // A body that fails mid-stream is a failure by default.
    /// assert_eq!(SseStream::with_events(LlmEvents::default()).on_error(), Outcome::Failure);
    /// ```
    fn on_error(self) -> Outcome
    where
        Self: Sized,
    {
        Outcome::Failure
    }

    /// How long until the quota or limit this answer reports resets, when
    /// it said so (`Retry-After` on a quota answer): read just before the
    /// verdict, for quota gating (see
    /// [`Builder::quota_gate`](crate::Builder::quota_gate)). `None` by default.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, LlmEvents, SseStream};
    ///
    /// // Only quota answers announce a reset; a plain stream does not.
    /// assert_eq!(SseStream::with_events(LlmEvents::default()).announced_reset(), None);
    /// ```
    fn announced_reset(&self) -> Option<std::time::Duration> {
        None
    }

    /// The caller dropped the body before its end.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, LlmEvents, SseStream};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// // A caller who hangs up says nothing about the upstream.
    /// assert_eq!(SseStream::with_events(LlmEvents::default()).on_drop(), Outcome::Ignored);
    /// ```
    fn on_drop(self) -> Outcome
    where
        Self: Sized,
    {
        Outcome::Ignored
    }

    /// What the call cost, for a breaker with a spend guard (see
    /// [`crate::spend`]): asked once, just before the verdict is settled
    /// (`on_end`, `on_error`, `on_drop` or a deciding chunk), and only when
    /// the breaker has a spend guard. The default,
    /// [`Charge::Unknown`](crate::spend::Charge::Unknown), charges the call as
    /// one whose usage never arrived; [`Meter`](crate::spend::Meter) reads
    /// the usage the body reports.
    fn charge(&mut self) -> crate::breaker::spend::Charge {
        crate::breaker::spend::Charge::Unknown
    }
}

/// The stream classifier of classifiers that always decide on the head. It
/// cannot be constructed.
///
/// ```
/// use tower_circuit_breaker::classify::{Classify, ErrorRef, NeverDefer, Verdict};
/// use tower_circuit_breaker::Outcome;
///
/// /// Decides on the head alone: no stream classifier is ever made.
/// struct StatusOnly;
///
/// impl Classify for StatusOnly {
///     type Stream = NeverDefer;
///
///     fn classify_response(&self, status: http::StatusCode, _: &http::HeaderMap) -> Verdict<NeverDefer> {
///         Verdict::Done(if status.is_server_error() { Outcome::Failure } else { Outcome::Success })
///     }
///
///     fn classify_error(&self, _: ErrorRef<'_>) -> Outcome {
///         Outcome::Failure
///     }
/// }
///
/// let headers = http::HeaderMap::new();
/// assert!(matches!(StatusOnly.classify_response(http::StatusCode::OK, &headers), Verdict::Done(Outcome::Success)));
/// ```
#[derive(Debug, Clone, Copy)]
pub enum NeverDefer {}

impl ClassifyStream for NeverDefer {
    fn on_end(self) -> Outcome {
        match self {}
    }
}

/// A closure classifier is user code: a panic in it records
/// [`Outcome::Ignored`] (the call said nothing the breaker can trust) and is
/// logged, and the response or error reaches the caller as it came. Not under
/// `panic = "abort"`, where the first panic ends the process.
impl<F> Classify for F
where
    F: for<'a> Fn(Attempt<'a>) -> Outcome,
{
    type Stream = NeverDefer;

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<NeverDefer> {
        Verdict::Done(isolated(|| self(Attempt::Response { status, headers })))
    }

    fn classify_error(&self, error: ErrorRef<'_>) -> Outcome {
        isolated(|| self(Attempt::Error(error)))
    }
}

/// Runs a user classifier; its panic is an `Ignored` outcome.
#[inline]
fn isolated(classify: impl FnOnce() -> Outcome) -> Outcome {
    // Only the closure is inside the catch; it gets shared references and
    // leaves no state of ours half-changed.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(classify))
        .unwrap_or_else(|_| classifier_panicked())
}

#[cold]
#[inline(never)]
fn classifier_panicked() -> Outcome {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Process-wide, only to keep a classifier that panics on every call from
    // flooding the log: once, then at every power of two. The panic hook has
    // shown the message already; it is not repeated, as it could carry
    // response data.
    static PANICS: AtomicU64 = AtomicU64::new(0);
    let panics = PANICS.fetch_add(1, Ordering::Relaxed) + 1;
    if panics.is_power_of_two() {
        tracing::error!(
            target: "tower_circuit_breaker",
            panics,
            "classifier closure panicked; the call is recorded as ignored"
        );
    }
    Outcome::Ignored
}
