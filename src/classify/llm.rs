//! Classification for LLM APIs: OpenAI, Anthropic, Gemini and compatible.

use std::time::Duration;

use http::{HeaderMap, StatusCode};

use super::http::{parse_retry_after, parse_seconds};
use super::sse::{ClassifyEvent, SseEvent, SseStream, DEFAULT_MAX_LINE};
use super::{Classify, ClassifyStream, ErrorRef, Outcome, Verdict};

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
    pub const fn new() -> Self {
        LlmClassifier {
            max_line: DEFAULT_MAX_LINE,
            require_final: false,
        }
    }

    /// Caps SSE lines and event payloads at `max_line` bytes.
    pub const fn max_line(mut self, max_line: usize) -> Self {
        self.max_line = max_line;
        self
    }

    /// Counts a stream that ends without a final event (`data: [DONE]`,
    /// `message_stop`, `response.completed`) as a failure. Only for upstreams
    /// that always send one: Gemini does not.
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
    pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
        parse_retry_after(headers).or_else(|| rate_limit_reset(headers))
    }
}

impl Default for LlmClassifier {
    fn default() -> Self {
        LlmClassifier::new()
    }
}

impl Classify for LlmClassifier {
    type Stream = LlmStream;

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<LlmStream> {
        let outcome = match status.as_u16() {
            200..=299 if is_event_stream(headers) => {
                let sse = SseStream::new()
                    .max_line(self.max_line)
                    .require_final_event(self.require_final);
                return Verdict::Defer(LlmStream(Inner::Sse(sse)));
            }
            429 => {
                return Verdict::Defer(LlmStream(Inner::RateLimited(ErrorBody {
                    buf: Vec::new(),
                    retry_after: LlmClassifier::retry_after(headers),
                })))
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

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("text/event-stream"))
}

// === impl LlmStream ===

/// The body classifier of [`LlmClassifier`]: an SSE stream, or a 429 error
/// body read for `insufficient_quota`.
#[derive(Debug)]
pub struct LlmStream(Inner);

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
        match &mut self.0 {
            Inner::Sse(sse) => sse.on_data(chunk),
            Inner::RateLimited(body) => {
                let room = MAX_ERROR_BODY - body.buf.len();
                body.buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
                (body.buf.len() >= MAX_ERROR_BODY).then(|| body.decide())
            }
        }
    }

    fn on_end(self) -> Outcome {
        match self.0 {
            Inner::Sse(sse) => sse.on_end(),
            Inner::RateLimited(body) => body.decide(),
        }
    }

    fn on_error(self) -> Outcome {
        match self.0 {
            Inner::Sse(sse) => sse.on_error(),
            Inner::RateLimited(body) => body.head_only(),
        }
    }

    fn on_drop(self) -> Outcome {
        match self.0 {
            Inner::Sse(sse) => sse.on_drop(),
            Inner::RateLimited(body) => body.head_only(),
        }
    }
}

// === impl LlmEvents ===

/// Judges the events of an LLM answer streamed as server-sent events.
///
/// | event | outcome |
/// |---|---|
/// | `data: [DONE]` (OpenAI), `message_stop` (Anthropic), `response.completed` / `response.incomplete` (OpenAI Responses) | `Success`, decided at once: a caller may drop the rest |
/// | `event: error`, a `"type": "error"` or `response.failed` payload, or a payload with a top-level `"error"` object | by the error's `type` / `code` / `status`: server-side (`overloaded_error`, `api_error`, `server_error`, `UNAVAILABLE`, `INTERNAL`, 5xx, ...) and unknown errors are `Failure`; rate limits (`rate_limit_error`, `rate_limit_exceeded`, `RESOURCE_EXHAUSTED`) are `RateLimited`; `insufficient_quota` is `QuotaExhausted`; the caller's errors (`invalid_request_error`, `context_length_exceeded`, `content_filter`, `INVALID_ARGUMENT`, 4xx, ...) are `Ignored` |
/// | a finish reason that is a content filter (`finish_reason: "content_filter"`, Gemini `finishReason: "SAFETY"` and kin, `blockReason`, Anthropic `stop_reason: "refusal"`) | `Ignored` |
/// | anything else | keep reading |
///
/// Payloads are scanned, not deserialized: the scanner walks the JSON
/// structure once without allocating, so a word like `"error"` inside the
/// generated text is never mistaken for a field.
///
/// # Example
///
/// ```
/// use tower_circuit_breaker::classify::{ClassifyEvent, LlmEvents, SseEvent};
/// use tower_circuit_breaker::Outcome;
///
/// let mut events = LlmEvents;
/// let token = SseEvent::new("message", br#"{"choices":[{"delta":{"content":"an \"error\": none"}}]}"#);
/// assert_eq!(events.classify_event(&token), None);
/// let done = SseEvent::new("message", b"[DONE]");
/// assert_eq!(events.classify_event(&done), Some(Outcome::Success));
/// let gemini = SseEvent::new("message", br#"{"error":{"code":503,"status":"UNAVAILABLE"}}"#);
/// assert_eq!(events.classify_event(&gemini), Some(Outcome::Failure));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct LlmEvents;

impl ClassifyEvent for LlmEvents {
    fn classify_event(&mut self, event: &SseEvent<'_>) -> Option<Outcome> {
        classify_llm_event(event.event(), event.data())
    }
}

fn classify_llm_event(name: &str, data: &[u8]) -> Option<Outcome> {
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return Some(Outcome::Success);
    }
    let fields = json::scan(data);
    let ty = fields.ty.unwrap_or_default();
    if name == "error" || ty == b"error" || ty == b"response.failed" || fields.error.is_some() {
        return Some(classify_error_fields(&fields));
    }
    if fields.filtered {
        return Some(Outcome::Ignored);
    }
    let is_final = |t: &[u8]| {
        matches!(
            t,
            b"message_stop" | b"response.completed" | b"response.incomplete"
        )
    };
    if is_final(name.as_bytes()) || is_final(ty) {
        return Some(Outcome::Success);
    }
    None
}

/// What an error's `type`, `code` or `status` says, strongest last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Unknown,
    Caller,
    Upstream,
    RateLimited,
    Quota,
}

fn kind_of(token: &[u8]) -> Kind {
    if !token.is_empty() && token.iter().all(u8::is_ascii_digit) {
        return match std::str::from_utf8(token)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
        {
            Some(429) => Kind::RateLimited,
            Some(402) => Kind::Quota,
            Some(500..=599) => Kind::Upstream,
            Some(400..=499) => Kind::Caller,
            _ => Kind::Unknown,
        };
    }
    const QUOTA: &[&str] = &[
        "insufficient_quota",
        "billing_hard_limit_reached",
        "billing_not_active",
    ];
    const RATE: &[&str] = &[
        "rate_limit_error",
        "rate_limit_exceeded",
        "rate_limited",
        "too_many_requests",
        "resource_exhausted",
        "requests",
        "tokens",
    ];
    const UPSTREAM: &[&str] = &[
        "overloaded_error",
        "overloaded",
        "api_error",
        "server_error",
        "internal_error",
        "internal_server_error",
        "internal",
        "unavailable",
        "service_unavailable",
        "deadline_exceeded",
        "timeout",
        "timeout_error",
        "unknown",
        "engine_overloaded",
        "bad_gateway",
    ];
    const CALLER: &[&str] = &[
        "invalid_request_error",
        "invalid_request",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "invalid_argument",
        "failed_precondition",
        "permission_denied",
        "unauthenticated",
        "not_found",
        "out_of_range",
        "cancelled",
        "invalid_api_key",
        "model_not_found",
        "context_length_exceeded",
        "content_filter",
        "content_policy_violation",
        "invalid_prompt",
        "string_above_max_length",
    ];
    let is = |list: &[&str]| {
        list.iter()
            .any(|t| token.eq_ignore_ascii_case(t.as_bytes()))
    };
    if is(QUOTA) {
        Kind::Quota
    } else if is(RATE) {
        Kind::RateLimited
    } else if is(UPSTREAM) {
        Kind::Upstream
    } else if is(CALLER) {
        Kind::Caller
    } else {
        Kind::Unknown
    }
}

fn classify_error_fields(fields: &json::Fields<'_>) -> Outcome {
    let mut tokens = [None; 4];
    if let Some(e) = &fields.error {
        tokens[..3].copy_from_slice(&[e.ty, e.code, e.status]);
    }
    tokens[3] = fields.code;
    let kind = tokens.iter().flatten().map(|t| kind_of(t)).max();
    match kind.unwrap_or(Kind::Unknown) {
        Kind::Quota => Outcome::QuotaExhausted,
        Kind::RateLimited => Outcome::RateLimited {
            retry_after: fields
                .retry_delay
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(parse_rate_limit_reset),
        },
        Kind::Caller => Outcome::Ignored,
        // An error in the middle of an answer that we cannot place is the
        // upstream's: the caller's errors are refused before streaming starts.
        Kind::Upstream | Kind::Unknown => Outcome::Failure,
    }
}

// === rate-limit reset headers ===

/// Parses a rate-limit reset duration as OpenAI sends it in
/// `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`: Go's duration
/// format (`1s`, `6m0s`, `20ms`, `1h2m3.5s`, units `h`, `m`, `s`, `ms`,
/// `us`/`µs`, `ns`), or a plain number of seconds.
///
/// Negative values, garbage and waits longer than a week are `None`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::classify::parse_rate_limit_reset;
///
/// assert_eq!(parse_rate_limit_reset("6m0s"), Some(Duration::from_secs(360)));
/// assert_eq!(parse_rate_limit_reset("20ms"), Some(Duration::from_millis(20)));
/// assert_eq!(parse_rate_limit_reset("1.5"), Some(Duration::from_millis(1500)));
/// assert_eq!(parse_rate_limit_reset("soon"), None);
/// assert_eq!(parse_rate_limit_reset("-1s"), None);
/// ```
pub fn parse_rate_limit_reset(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if let Some(d) = parse_seconds(value, 1.0) {
        return Some(d);
    }
    let mut rest = value;
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits];
        if number.is_empty() || number.bytes().filter(|&b| b == b'.').count() > 1 || number == "." {
            return None;
        }
        let n: f64 = number.parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("\u{b5}s", 1e-6),
            ("\u{3bc}s", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .iter()
        .find(|(u, _)| rest.starts_with(u))
        .map(|(u, f)| (*f, u.len()))?;
        total += n * unit;
        rest = &rest[len..];
    }
    let d = Duration::try_from_secs_f64(total).ok()?;
    (d <= MAX_WAIT).then_some(d)
}

/// Longest wait a header may announce, as for `Retry-After`.
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The wait announced by `x-ratelimit-reset-*` headers.
fn rate_limit_reset(headers: &HeaderMap) -> Option<Duration> {
    const RESET: &str = "x-ratelimit-reset-";
    let mut hit = None::<Duration>;
    let mut any = None::<Duration>;
    for (name, value) in headers {
        let Some(limit) = name.as_str().strip_prefix(RESET) else {
            continue;
        };
        let Some(d) = value.to_str().ok().and_then(parse_rate_limit_reset) else {
            continue;
        };
        any = any.max(Some(d));
        let exhausted = headers
            .get_all(format!("x-ratelimit-remaining-{limit}").as_str())
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.trim() == "0"));
        if exhausted {
            hit = hit.max(Some(d));
        }
    }
    hit.or(any)
}

// === JSON field scanner ===

/// A single pass over a JSON document that picks out the few fields that
/// classify an LLM event, without allocating or recursing. Malformed or
/// truncated input stops the walk and keeps what was found.
mod json {
    #[derive(Debug, Default, Clone, Copy)]
    pub(super) struct ErrorFields<'a> {
        pub(super) ty: Option<&'a [u8]>,
        pub(super) code: Option<&'a [u8]>,
        pub(super) status: Option<&'a [u8]>,
    }

    #[derive(Debug, Default)]
    pub(super) struct Fields<'a> {
        /// Top-level `"type"`.
        pub(super) ty: Option<&'a [u8]>,
        /// Top-level `"code"` (the Responses API's `error` event).
        pub(super) code: Option<&'a [u8]>,
        /// A top-level `"error"` (or `response.error`) that is not null.
        pub(super) error: Option<ErrorFields<'a>>,
        /// A finish reason or block reason that is a content filter.
        pub(super) filtered: bool,
        /// Gemini's `RetryInfo.retryDelay`.
        pub(super) retry_delay: Option<&'a [u8]>,
    }

    const MAX_DEPTH: usize = 16;

    #[derive(Clone, Copy)]
    struct Frame<'a> {
        /// The key this container is the value of (`""` in arrays).
        key: &'a [u8],
        object: bool,
        error: bool,
    }

    pub(super) fn scan(input: &[u8]) -> Fields<'_> {
        let mut f = Fields::default();
        let mut stack = [Frame {
            key: b"",
            object: false,
            error: false,
        }; MAX_DEPTH];
        let mut depth = 0usize;
        let mut key: Option<&[u8]> = None;
        let mut i = 0;
        while let Some(&b) = input.get(i) {
            match b {
                b'{' | b'[' => {
                    let k = key.take().unwrap_or(b"");
                    let parent = depth.checked_sub(1).and_then(|d| stack.get(d)).copied();
                    let error = b == b'{' && k == b"error" && is_error_position(depth, parent);
                    if error {
                        f.error.get_or_insert_with(ErrorFields::default);
                    }
                    if let Some(slot) = stack.get_mut(depth) {
                        *slot = Frame {
                            key: k,
                            object: b == b'{',
                            error,
                        };
                    }
                    depth += 1;
                    i += 1;
                }
                b'}' | b']' => {
                    if depth == 0 {
                        break;
                    }
                    depth -= 1;
                    key = None;
                    i += 1;
                }
                b'"' => {
                    let Some((s, next)) = string(input, i) else {
                        break;
                    };
                    i = next;
                    let in_object = depth
                        .checked_sub(1)
                        .and_then(|d| stack.get(d))
                        .is_some_and(|fr| fr.object);
                    if in_object && key.is_none() {
                        let j = skip_ws(input, i);
                        if input.get(j) == Some(&b':') {
                            key = Some(s);
                            i = j + 1;
                            continue;
                        }
                    }
                    value(&mut f, &stack, depth, key.take(), s, true);
                }
                b',' | b':' | b' ' | b'\t' | b'\r' | b'\n' => i += 1,
                _ => {
                    let end = input[i..]
                        .iter()
                        .position(|c| {
                            matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n' | b':')
                        })
                        .map_or(input.len(), |p| i + p);
                    value(&mut f, &stack, depth, key.take(), &input[i..end], false);
                    i = end.max(i + 1);
                }
            }
        }
        f
    }

    /// `"error"` counts at the top level and as `response.error` (the
    /// Responses API); deeper ones belong to tools and content.
    fn is_error_position(depth: usize, parent: Option<Frame<'_>>) -> bool {
        depth == 1 || (depth == 2 && parent.is_some_and(|p| p.key == b"response"))
    }

    fn value<'a>(
        f: &mut Fields<'a>,
        stack: &[Frame<'a>; MAX_DEPTH],
        depth: usize,
        key: Option<&'a [u8]>,
        v: &'a [u8],
        is_string: bool,
    ) {
        let Some(key) = key else {
            return;
        };
        let frame = depth.checked_sub(1).and_then(|d| stack.get(d));
        if depth == 1 {
            match key {
                b"type" if is_string => f.ty = Some(v),
                b"code" => f.code = Some(v),
                _ => {}
            }
        }
        if key == b"error" && is_string && !v.is_empty() && is_error_position(depth, frame.copied())
        {
            f.error.get_or_insert_with(ErrorFields::default);
        }
        if let (Some(fr), Some(e)) = (frame, f.error.as_mut()) {
            if fr.error {
                match key {
                    b"type" => e.ty = Some(v),
                    b"code" => e.code = Some(v),
                    b"status" => e.status = Some(v),
                    _ => {}
                }
            }
        }
        if !is_string {
            return;
        }
        match key {
            b"finish_reason" | b"finishReason" | b"stop_reason" => f.filtered |= is_filter(v),
            b"blockReason" => f.filtered |= !v.is_empty() && v != b"BLOCK_REASON_UNSPECIFIED",
            b"reason" if frame.is_some_and(|fr| fr.key == b"incomplete_details") => {
                f.filtered |= is_filter(v)
            }
            b"retryDelay" => f.retry_delay = Some(v),
            _ => {}
        }
    }

    fn is_filter(v: &[u8]) -> bool {
        [
            &b"content_filter"[..],
            b"SAFETY",
            b"PROHIBITED_CONTENT",
            b"BLOCKLIST",
            b"SPII",
            b"RECITATION",
            b"IMAGE_SAFETY",
            b"refusal",
        ]
        .iter()
        .any(|t| v.eq_ignore_ascii_case(t))
    }

    /// The raw contents of the string starting at `input[start] == '"'` and
    /// the index after its closing quote; `None` if it never closes.
    fn string(input: &[u8], start: usize) -> Option<(&[u8], usize)> {
        let mut i = start + 1;
        while let Some(at) = input
            .get(i..)
            .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
        {
            i += at;
            if input[i] == b'"' {
                return Some((&input[start + 1..i], i + 1));
            }
            i += 2;
        }
        None
    }

    fn skip_ws(input: &[u8], mut i: usize) -> usize {
        while input.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn head(status: u16, h: &HeaderMap) -> Verdict<LlmStream> {
        LlmClassifier::new().classify_response(StatusCode::from_u16(status).unwrap(), h)
    }

    fn done(status: u16) -> Outcome {
        match head(status, &HeaderMap::new()) {
            Verdict::Done(o) => o,
            Verdict::Defer(_) => panic!("{status} deferred"),
        }
    }

    /// The outcome of a deferred answer whose body is `body`, read to the end.
    fn body(status: u16, h: &HeaderMap, body: &[u8]) -> Outcome {
        match head(status, h) {
            Verdict::Done(o) => panic!("{status} decided on the head: {o:?}"),
            Verdict::Defer(mut s) => s.on_data(body).unwrap_or_else(|| s.on_end()),
        }
    }

    #[test]
    fn status_table() {
        for s in [200, 201, 204, 301, 304] {
            assert_eq!(done(s), Outcome::Success, "{s}");
        }
        for s in [400, 401, 403, 404, 408, 413, 422, 499] {
            assert_eq!(done(s), Outcome::Ignored, "{s}");
        }
        for s in [500, 502, 503, 504, 520, 529, 599] {
            assert_eq!(done(s), Outcome::Failure, "{s}");
        }
        assert_eq!(done(409), Outcome::RateLimited { retry_after: None });
        assert_eq!(done(402), Outcome::QuotaExhausted);
        assert!(matches!(head(429, &HeaderMap::new()), Verdict::Defer(_)));
    }

    #[test]
    fn only_event_streams_are_read() {
        for ct in [
            "text/event-stream",
            "text/event-stream; charset=utf-8",
            "Text/Event-Stream",
        ] {
            assert!(
                matches!(
                    head(200, &headers(&[("content-type", ct)])),
                    Verdict::Defer(_)
                ),
                "{ct}"
            );
        }
        for ct in ["application/json", "text/plain", "text/event-streamx"] {
            assert!(
                matches!(
                    head(200, &headers(&[("content-type", ct)])),
                    Verdict::Done(Outcome::Success)
                ),
                "{ct}"
            );
        }
        let sse = headers(&[("content-type", "text/event-stream")]);
        assert!(matches!(head(503, &sse), Verdict::Done(Outcome::Failure)));
    }

    #[test]
    fn provider_error_bodies() {
        let none = HeaderMap::new();
        // Refused requests: the caller's problem, whatever the body says.
        assert_eq!(done(400), Outcome::Ignored);
        // OpenAI transient 429 vs. quota.
        assert_eq!(
            body(
                429,
                &headers(&[("retry-after", "7")]),
                br#"{"error":{"message":"Rate limit reached for gpt-4o","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#
            ),
            Outcome::RateLimited {
                retry_after: Some(Duration::from_secs(7))
            }
        );
        assert_eq!(
            body(
                429,
                &headers(&[("retry-after", "7")]),
                br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#
            ),
            Outcome::QuotaExhausted
        );
        // Gemini 429 with RetryInfo and no header.
        assert_eq!(
            body(
                429,
                &none,
                br#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}"#
            ),
            Outcome::RateLimited {
                retry_after: Some(Duration::from_secs(20))
            }
        );
        // Anthropic 429.
        assert_eq!(
            body(
                429,
                &headers(&[("retry-after", "3")]),
                br#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#
            ),
            Outcome::RateLimited {
                retry_after: Some(Duration::from_secs(3))
            }
        );
        // Not JSON at all.
        assert_eq!(
            body(429, &none, b"<html>Too Many Requests</html>"),
            Outcome::RateLimited { retry_after: None }
        );
        assert_eq!(
            body(429, &none, b""),
            Outcome::RateLimited { retry_after: None }
        );
    }

    #[test]
    fn unread_or_broken_429_bodies_stay_rate_limited() {
        let h = headers(&[("retry-after-ms", "250")]);
        let wait = Outcome::RateLimited {
            retry_after: Some(Duration::from_millis(250)),
        };
        let Verdict::Defer(s) = head(429, &h) else {
            panic!()
        };
        assert_eq!(s.on_drop(), wait);
        let Verdict::Defer(mut s) = head(429, &h) else {
            panic!()
        };
        assert_eq!(s.on_data(br#"{"error":{"code":"insuff"#), None);
        assert_eq!(s.on_error(), wait);
    }

    #[test]
    fn a_long_429_body_is_decided_without_reading_it_all() {
        let Verdict::Defer(mut s) = head(429, &HeaderMap::new()) else {
            panic!()
        };
        let mut decided = None;
        let mut chunks = 0;
        let mut body = br#"{"error":{"code":"insufficient_quota","message":""#.to_vec();
        body.resize(100_000, b'x');
        for chunk in body.chunks(1000) {
            chunks += 1;
            if let Some(o) = s.on_data(chunk) {
                decided = Some(o);
                break;
            }
        }
        assert_eq!(decided, Some(Outcome::QuotaExhausted));
        assert!(chunks <= MAX_ERROR_BODY / 1000 + 1, "{chunks}");
    }

    fn event(name: &str, data: &str) -> Option<Outcome> {
        classify_llm_event(name, data.as_bytes())
    }

    #[test]
    fn stream_event_table() {
        let failure = Some(Outcome::Failure);
        // Anthropic.
        assert_eq!(
            event(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            failure
        );
        assert_eq!(
            event("error", r#"{"type":"error","error":{"type":"api_error"}}"#),
            failure
        );
        assert_eq!(
            event(
                "error",
                r#"{"type":"error","error":{"type":"rate_limit_error"}}"#
            ),
            Some(Outcome::RateLimited { retry_after: None })
        );
        assert_eq!(
            event("message_stop", r#"{"type":"message_stop"}"#),
            Some(Outcome::Success)
        );
        assert_eq!(
            event(
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"refusal"}}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(
            event(
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#
            ),
            None
        );
        assert_eq!(event("ping", r#"{"type": "ping"}"#), None);
        // OpenAI chat completions.
        assert_eq!(event("message", "[DONE]"), Some(Outcome::Success));
        assert_eq!(event("message", " [DONE] "), Some(Outcome::Success));
        assert_eq!(
            event(
                "message",
                r#"{"error": {"message": "The server had an error", "type": "server_error", "param": null, "code": null}}"#
            ),
            failure
        );
        assert_eq!(
            event(
                "message",
                r#"{"error":{"type":"invalid_request_error","code":"context_length_exceeded"}}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(
            event(
                "message",
                r#"{"error":{"type":"insufficient_quota","code":"insufficient_quota"}}"#
            ),
            Some(Outcome::QuotaExhausted)
        );
        assert_eq!(
            event(
                "message",
                r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(
            event(
                "message",
                r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
            ),
            None
        );
        // Text that talks about errors is text.
        assert_eq!(
            event(
                "message",
                r#"{"choices":[{"delta":{"content":"{\"error\": {\"type\": \"server_error\"}} and finish_reason: content_filter"}}]}"#
            ),
            None
        );
        // A tool's error deep inside an item is not the upstream's.
        assert_eq!(
            event(
                "response.output_item.done",
                r#"{"type":"response.output_item.done","item":{"type":"mcp_call","error":"tool crashed"}}"#
            ),
            None
        );
        // OpenAI Responses API.
        assert_eq!(
            event(
                "response.created",
                r#"{"type":"response.created","response":{"id":"r","error":null}}"#
            ),
            None
        );
        assert_eq!(
            event(
                "response.completed",
                r#"{"type":"response.completed","response":{"error":null}}"#
            ),
            Some(Outcome::Success)
        );
        assert_eq!(
            event(
                "response.failed",
                r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"}}}"#
            ),
            failure
        );
        assert_eq!(
            event(
                "response.incomplete",
                r#"{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(
            event(
                "error",
                r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down"}"#
            ),
            Some(Outcome::RateLimited { retry_after: None })
        );
        // Gemini.
        assert_eq!(
            event(
                "message",
                r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#
            ),
            failure
        );
        assert_eq!(
            event(
                "message",
                r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"1.5s"}]}}"#
            ),
            Some(Outcome::RateLimited {
                retry_after: Some(Duration::from_millis(1500))
            })
        );
        assert_eq!(
            event(
                "message",
                r#"{"candidates":[{"content":{"parts":[]},"finishReason":"SAFETY"}]}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(
            event(
                "message",
                r#"{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"}}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(
            event(
                "message",
                r#"{"candidates":[{"finishReason":"STOP"}],"usageMetadata":{}}"#
            ),
            None
        );
        // Azure's content filter error and unknown errors.
        assert_eq!(
            event(
                "message",
                r#"{"error":{"code":"content_filter","status":400}}"#
            ),
            Some(Outcome::Ignored)
        );
        assert_eq!(event("error", "upstream connect error"), failure);
        assert_eq!(event("message", r#"{"error":"proxy timeout"}"#), failure);
        assert_eq!(event("message", r#"{"error":null,"choices":[]}"#), None);
        assert_eq!(
            event(
                "error",
                r#"{"type":"error","error":{"type":"brand_new_error"}}"#
            ),
            failure
        );
    }

    #[test]
    fn json_scan_survives_garbage() {
        let inputs: &[&[u8]] = &[
            b"",
            b"{",
            b"}}}]]]",
            b"\"",
            b"{\"error\":",
            b"{\"error\":{\"type\":\"overl",
            b"{\"a\":\"\\",
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[{\"error\":{}}]]]]",
            b"{\"error\":{\"code\":99999999999999999999999999}}",
            b"{::,,\"error\"::{\"type\"\"x\"}}",
            b"\xff\xfe{\"error\":{\"type\":\"\xff\"}}",
        ];
        for input in inputs {
            let _ = json::scan(input);
            let _ = classify_llm_event("error", input);
            let _ = classify_llm_event("message", input);
        }
        // Truncated, but the error and its type arrived.
        assert_eq!(
            classify_llm_event("message", br#"{"error":{"type":"overloaded_error","mess"#),
            Some(Outcome::Failure)
        );
        let f = json::scan(br#"{"error":{"type":"overloaded_error","mess"#);
        assert_eq!(f.error.and_then(|e| e.ty), Some(&b"overloaded_error"[..]));
    }

    #[test]
    fn rate_limit_reset_formats() {
        let ok = [
            ("1s", Duration::from_secs(1)),
            ("6m0s", Duration::from_secs(360)),
            ("20ms", Duration::from_millis(20)),
            ("1h2m3.5s", Duration::from_millis(3_723_500)),
            ("59.9s", Duration::from_millis(59_900)),
            ("2m59.56s", Duration::from_millis(179_560)),
            ("0s", Duration::ZERO),
            ("0", Duration::ZERO),
            ("150us", Duration::from_micros(150)),
            ("150\u{b5}s", Duration::from_micros(150)),
            ("7ns", Duration::from_nanos(7)),
            (" 12 ", Duration::from_secs(12)),
            ("0.25", Duration::from_millis(250)),
        ];
        for (s, d) in ok {
            let got = parse_rate_limit_reset(s).unwrap_or_else(|| panic!("{s:?}"));
            assert!(
                got.abs_diff(d) < Duration::from_micros(1),
                "{s:?}: {got:?} != {d:?}"
            );
        }
        for bad in [
            "", "s", "-1s", "1x", "1.2.3s", ".s", "1e3s", "soon", "1s2", "ms", "inf", "NaN",
            "9999999h", "1 s", "1S",
        ] {
            assert_eq!(parse_rate_limit_reset(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rate_limit_reset_headers_pick_the_exhausted_limit() {
        let h = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-remaining-tokens", "100"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(1)));
        let h = headers(&[
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ]);
        assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(1)));
        // The standard headers win.
        let h = headers(&[("retry-after", "7"), ("x-ratelimit-reset-requests", "1s")]);
        assert_eq!(LlmClassifier::retry_after(&h), Some(Duration::from_secs(7)));
        // Garbage everywhere: no wait, no panic.
        let h = headers(&[
            ("retry-after", "soon"),
            ("retry-after-ms", "-20"),
            ("x-ratelimit-reset-requests", "later"),
        ]);
        assert_eq!(LlmClassifier::retry_after(&h), None);
        assert_eq!(
            done(409),
            Outcome::RateLimited { retry_after: None },
            "409 without headers"
        );
    }
}
