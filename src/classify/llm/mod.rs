//! Classification for LLM APIs: OpenAI, Anthropic, Gemini and compatible.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, StatusCode};

use super::http::parse_retry_after;
use super::sse::{SseStream, DEFAULT_MAX_LINE};
use super::{Classify, ClassifyStream, ErrorKind, ErrorRef, Outcome, Verdict};

mod events;
pub(crate) mod json;
mod kind;
mod rate_limit;
#[cfg(test)]
mod tests;

pub use self::events::LlmEvents;
pub(crate) use self::kind::MAX_KIND_BODY;
pub(crate) use self::rate_limit::exhausted_reset;
pub use self::rate_limit::parse_rate_limit_reset;

use self::events::{kind_of, Kind};
use self::rate_limit::rate_limit_reset;

/// The classifier for LLM HTTP APIs (OpenAI, Anthropic, Gemini, Azure OpenAI
/// and the many servers that speak their dialects).
///
/// | response | outcome |
/// |---|---|
/// | 2xx `text/event-stream` | deferred: the stream is read with [`SseStream`] and [`LlmEvents`] |
/// | other 1xx, 2xx, 3xx | `Success` |
/// | 429 | deferred to the (small) error body: `QuotaExhausted` when it says `insufficient_quota`, otherwise `RateLimited` with the wait taken from `retry-after-ms`, `Retry-After`, `x-ratelimit-reset-*` or Gemini's `retryDelay` |
/// | 409 | `RateLimited`, wait from the headers |
/// | 402 | `QuotaExhausted` (payment required: a billing matter, not an outage) |
/// | other 4xx: 400 (bad request, content filter, context too long), 401, 403, 404, 413, 422, ... | `Ignored` |
/// | 5xx, including Anthropic's 529 | `Failure` |
/// | any inner error: connect, reset, attempt timeout (`tower::timeout::error::Elapsed`) | `Failure` |
///
/// A 429 body the caller never reads (a retry layer that drops it) or that
/// breaks off still counts as `RateLimited`: the head already said so.
///
/// A 200 JSON answer (not streamed) is a `Success` on its head, content
/// filter or not: the upstream answered, and reading every body to the end
/// would hold each call's permit for as long.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tower_circuit_breaker::classify::{Classify, ClassifyStream, LlmClassifier, Verdict};
/// use tower_circuit_breaker::Outcome;
///
/// let llm = LlmClassifier::new();
/// let none = HeaderMap::new();
/// assert!(matches!(llm.classify_response(StatusCode::BAD_REQUEST, &none), Verdict::Done(Outcome::Ignored)));
/// let overloaded = StatusCode::from_u16(529).unwrap();
/// assert!(matches!(llm.classify_response(overloaded, &none), Verdict::Done(Outcome::Failure)));
///
/// // A quota that ran out is told apart from a transient 429.
/// let mut headers = HeaderMap::new();
/// headers.insert("x-ratelimit-reset-requests", "6m0s".parse().unwrap());
/// let Verdict::Defer(mut body) = llm.classify_response(StatusCode::TOO_MANY_REQUESTS, &headers) else {
///     unreachable!()
/// };
/// body.on_data(br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#);
/// assert_eq!(body.on_end(), Outcome::RateLimited { retry_after: Some(Duration::from_secs(360)) });
///
/// let Verdict::Defer(mut body) = llm.classify_response(StatusCode::TOO_MANY_REQUESTS, &none) else {
///     unreachable!()
/// };
/// body.on_data(br#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#);
/// assert_eq!(body.on_end(), Outcome::QuotaExhausted);
/// ```
///
/// With a layer:
///
/// ```
/// use tower_circuit_breaker::classify::LlmClassifier;
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// # fn main() -> Result<(), tower_circuit_breaker::ConfigError> {
/// let layer = CircuitBreakerLayer::builder()
///     .count_window(20)
///     .failure_rate(0.5)
///     .build()?
///     .with_classifier(LlmClassifier::new());
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LlmClassifier {
    max_line: usize,
    require_final: bool,
}

impl LlmClassifier {
    /// The classifier with its defaults: SSE lines capped at
    /// [`DEFAULT_MAX_LINE`], and a stream that ends cleanly between events
    /// without a final event counted as a success.
    #[must_use]
    pub const fn new() -> Self {
        LlmClassifier {
            max_line: DEFAULT_MAX_LINE,
            require_final: false,
        }
    }

    /// Caps SSE lines and event payloads at `max_line` bytes.
    #[must_use]
    pub const fn max_line(mut self, max_line: usize) -> Self {
        self.max_line = max_line;
        self
    }

    /// Counts a stream that ends without a final event (`data: [DONE]`,
    /// `message_stop`, `response.completed`) as a failure. Only for upstreams
    /// that always send one: Gemini does not.
    #[must_use]
    pub const fn require_final_event(mut self, on: bool) -> Self {
        self.require_final = on;
        self
    }

    /// How long a rate-limited answer asks the caller to wait:
    /// `retry-after-ms`, then `Retry-After` (seconds or an HTTP date), then
    /// the `x-ratelimit-reset-*` headers OpenAI sends (`1s`, `6m0s`, `20ms`).
    ///
    /// Of the `x-ratelimit-reset-*` headers, those whose
    /// `x-ratelimit-remaining-*` twin is `0` are the limits that were hit; the
    /// longest of them is taken (the longest of all when none says `0`).
    /// Anthropic's `anthropic-ratelimit-*-reset` timestamps are not read: its
    /// 429 answers carry `retry-after`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_circuit_breaker::classify::LlmClassifier;
    ///
    /// let mut h = http::HeaderMap::new();
    /// h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
    /// h.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
    /// h.insert("x-ratelimit-remaining-tokens", "1200".parse().unwrap());
    /// h.insert("x-ratelimit-reset-tokens", "6m0s".parse().unwrap());
    /// assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(1)));
    /// ```
    #[must_use]
    pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
        parse_retry_after(headers).or_else(|| rate_limit_reset(headers))
    }

    /// What went wrong, from an error answer's status and the first 4 KiB
    /// of its body (OpenAI, Anthropic and Gemini error shapes, and plain
    /// text): `None` for a status that is no error of the caller's or the
    /// account's (2xx, 5xx, 404, a plain rate limit).
    ///
    /// | status | kind |
    /// |---|---|
    /// | 401, 403 | [`Auth`](ErrorKind::Auth) |
    /// | 402 | [`QuotaExhausted`](ErrorKind::QuotaExhausted) |
    /// | 429 | `QuotaExhausted` when the body says `insufficient_quota`, else `None` |
    /// | 400, 413, 422 | by the body's codes, then its message: `ContextLength`, `ContentPolicy`, `QuotaExhausted`, `Auth`; otherwise `BadRequest` (`ContextLength` for a 413) |
    ///
    /// Truncated or garbage bodies are read as far as they go, never a
    /// panic. The outcome the classifier gives the breaker does not depend
    /// on it: a 400 is [`Ignored`](Outcome::Ignored) whatever its kind.
    ///
    /// ```
    /// use http::StatusCode;
    /// use tower_circuit_breaker::classify::{ErrorKind, LlmClassifier};
    ///
    /// let openai = br#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    /// assert_eq!(LlmClassifier::error_kind(StatusCode::BAD_REQUEST, openai), Some(ErrorKind::ContextLength));
    /// let gemini = br#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
    /// assert_eq!(LlmClassifier::error_kind(StatusCode::BAD_REQUEST, gemini), Some(ErrorKind::ContextLength));
    /// let refusal = br#"{"error":{"code":"content_policy_violation","message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error"}}"#;
    /// assert_eq!(LlmClassifier::error_kind(StatusCode::BAD_REQUEST, refusal), Some(ErrorKind::ContentPolicy));
    /// assert_eq!(LlmClassifier::error_kind(StatusCode::BAD_REQUEST, b"nonsense"), Some(ErrorKind::BadRequest));
    /// ```
    #[must_use]
    pub fn error_kind(status: StatusCode, body: &[u8]) -> Option<ErrorKind> {
        kind::error_kind(status, body)
    }
}

impl Default for LlmClassifier {
    fn default() -> Self {
        LlmClassifier::new()
    }
}

impl Classify for LlmClassifier {
    type Stream = LlmStream;

    #[inline]
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<LlmStream> {
        let outcome = match status.as_u16() {
            200..=299 if is_event_stream(headers) => {
                let sse = SseStream::new()
                    .max_line(self.max_line)
                    .require_final_event(self.require_final);
                return Verdict::Defer(LlmStream(Box::new(Inner::Sse(sse))));
            }
            429 => {
                return Verdict::Defer(LlmStream(Box::new(Inner::RateLimited(ErrorBody {
                    buf: Vec::new(),
                    retry_after: LlmClassifier::retry_after(headers),
                }))))
            }
            409 => Outcome::RateLimited {
                retry_after: LlmClassifier::retry_after(headers),
            },
            402 => Outcome::QuotaExhausted,
            500.. => Outcome::Failure,
            400..=499 => Outcome::Ignored,
            _ => Outcome::Success,
        };
        Verdict::Done(outcome)
    }

    fn classify_error(&self, _error: ErrorRef<'_>) -> Outcome {
        Outcome::Failure
    }
}

/// How many header values are looked at in order before the map is
/// searched by hash: an answer keeps its headers in the order they came, and
/// servers send `content-type` among the first (`date`, `content-type`, ...).
const SCAN: usize = 4;

/// The `content-type` header's first value, as `HeaderMap::get` finds it.
///
/// `get` hashes the name byte by byte (about 90 instructions on a JSON
/// 200); comparing a name costs a few, so the first [`SCAN`] values are
/// compared in order first, and only a later or missing `content-type`
/// costs the lookup too. The first value `HeaderMap::iter` yields for a
/// name is the one `get` returns (its first).
#[inline]
fn content_type(headers: &HeaderMap) -> Option<&HeaderValue> {
    let mut values = headers.iter();
    for _ in 0..SCAN {
        let (name, value) = values.next()?;
        if *name == CONTENT_TYPE {
            return Some(value);
        }
    }
    headers.get(CONTENT_TYPE)
}

#[inline]
fn is_event_stream(headers: &HeaderMap) -> bool {
    const SSE: &[u8] = b"text/event-stream";
    let Some(value) = content_type(headers) else {
        return false;
    };
    // Read as bytes, so that the common answer (a JSON one) is turned
    // down at its first letter; a value that is not visible ASCII is
    // not an event stream.
    let value = value.as_bytes();
    // A header value holds no whitespace but spaces and tabs.
    if !matches!(value.first(), Some(b't' | b'T' | b' ' | b'\t')) {
        return false;
    }
    let value = value.trim_ascii_start();
    let Some((media, params)) = value.split_at_checked(SSE.len()) else {
        return false;
    };
    media.eq_ignore_ascii_case(SSE)
        && matches!(params.trim_ascii_start().first(), None | Some(b';'))
        && value
            .iter()
            .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
}

// === impl LlmStream ===

/// The body classifier of [`LlmClassifier`]: an SSE stream, or a 429 error
/// body read for `insufficient_quota`.
#[derive(Debug)]
pub struct LlmStream(
    // Boxed: every response body has room for it, and an answer decided on
    // its head (the common JSON 200) would otherwise move a scanner's worth
    // of bytes along with it. A deferred answer allocates once.
    Box<Inner>,
);

#[derive(Debug)]
enum Inner {
    Sse(SseStream<LlmEvents>),
    RateLimited(ErrorBody),
}

/// The most of a 429 body that is read: error bodies are a few hundred bytes.
const MAX_ERROR_BODY: usize = 16 * 1024;

#[derive(Debug)]
struct ErrorBody {
    buf: Vec<u8>,
    retry_after: Option<Duration>,
}

impl ErrorBody {
    fn decide(&self) -> Outcome {
        let fields = json::scan(&self.buf);
        let quota = fields
            .error
            .iter()
            .flat_map(|e| [e.ty, e.code, e.status])
            .chain([fields.code])
            .flatten()
            .any(|t| matches!(kind_of(t), Kind::Quota));
        if quota {
            return Outcome::QuotaExhausted;
        }
        let retry_after = self.retry_after.or_else(|| {
            fields
                .retry_delay
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(parse_rate_limit_reset)
        });
        Outcome::RateLimited { retry_after }
    }

    fn head_only(&self) -> Outcome {
        Outcome::RateLimited {
            retry_after: self.retry_after,
        }
    }
}

impl ClassifyStream for LlmStream {
    fn on_data(&mut self, chunk: &[u8]) -> Option<Outcome> {
        match &mut *self.0 {
            Inner::Sse(sse) => sse.on_data(chunk),
            Inner::RateLimited(body) => {
                let room = MAX_ERROR_BODY - body.buf.len();
                body.buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
                (body.buf.len() >= MAX_ERROR_BODY).then(|| body.decide())
            }
        }
    }

    fn on_end(self) -> Outcome {
        match *self.0 {
            Inner::Sse(sse) => sse.on_end(),
            Inner::RateLimited(body) => body.decide(),
        }
    }

    fn on_error(self) -> Outcome {
        match *self.0 {
            Inner::Sse(sse) => sse.on_error(),
            Inner::RateLimited(body) => body.head_only(),
        }
    }

    fn announced_reset(&self) -> Option<Duration> {
        match &*self.0 {
            Inner::Sse(_) => None,
            Inner::RateLimited(body) => body.retry_after,
        }
    }

    fn on_drop(self) -> Outcome {
        match *self.0 {
            Inner::Sse(sse) => sse.on_drop(),
            Inner::RateLimited(body) => body.head_only(),
        }
    }
}

// === SseStream with the LLM rules ===

impl SseStream<LlmEvents> {
    /// A stream classifier with the [`LlmEvents`] rules.
    ///
    /// ```
    /// use tower_circuit_breaker::classify::{ClassifyStream, SseStream};
    /// use tower_circuit_breaker::Outcome;
    ///
    /// let mut stream = SseStream::new();
    /// // An Anthropic-style overload error in the middle of a 200 stream:
    /// let error = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    /// assert_eq!(stream.on_data(error), Some(Outcome::Failure));
    /// ```
    #[must_use]
    pub fn new() -> Self {
        SseStream::with_events(LlmEvents)
    }
}

impl Default for SseStream<LlmEvents> {
    fn default() -> Self {
        SseStream::new()
    }
}
