//! What went wrong with an answer, told beside its [`Outcome`](super::Outcome).

/// What went wrong with an answer the upstream turned down: read from the
/// status and a bounded prefix of the error body by
/// [`LlmClassifier::error_kind`](super::LlmClassifier::error_kind), and
/// carried in the response's extensions by
/// [`ReadKind`](crate::kind::ReadKind), beside the outcome the breaker
/// records (which it does not change: a content refusal is still
/// [`Ignored`](super::Outcome::Ignored) and trips nothing).
///
/// A [`Failover`](crate::failover::Failover) routes on it with
/// [`Failover::on_kind`](crate::failover::Failover::on_kind).
///
/// ```
/// use http::StatusCode;
/// use tower_circuit_breaker::classify::{ErrorKind, LlmClassifier};
///
/// let body = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
/// assert_eq!(LlmClassifier::error_kind(StatusCode::BAD_REQUEST, body), Some(ErrorKind::ContextLength));
/// assert_eq!(LlmClassifier::error_kind(StatusCode::UNAUTHORIZED, b""), Some(ErrorKind::Auth));
/// assert_eq!(LlmClassifier::error_kind(StatusCode::OK, b""), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is longer than the model's context window (OpenAI's
    /// `context_length_exceeded`, Anthropic's "prompt is too long", Gemini's
    /// "exceeds the maximum number of tokens"), or too large (413).
    ContextLength,
    /// The request or its answer was refused by a content or safety policy
    /// (OpenAI's `content_policy_violation`, Azure's `content_filter`, a
    /// Gemini safety block).
    ContentPolicy,
    /// Any other bad request (400, 413, 422 that says none of the above).
    BadRequest,
    /// The account's quota or credit is used up (402, `insufficient_quota`,
    /// Anthropic's "credit balance is too low").
    QuotaExhausted,
    /// The key was refused (401, 403, an invalid API key).
    Auth,
}
