//! The events of a streamed LLM answer, and the provider error tables that judge them.

use crate::classify::{ClassifyEvent, Outcome, SseEvent};

use super::json;
use super::rate_limit::parse_rate_limit_reset;

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

pub(super) fn classify_llm_event(name: &str, data: &[u8]) -> Option<Outcome> {
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
pub(super) enum Kind {
    Unknown,
    Caller,
    Upstream,
    RateLimited,
    Quota,
}

pub(super) fn kind_of(token: &[u8]) -> Kind {
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

pub(super) fn classify_error_fields(fields: &json::Fields<'_>) -> Outcome {
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
