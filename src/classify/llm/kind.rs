//! The [`ErrorKind`] of an error answer, from its status and a bounded
//! prefix of its body.

use http::StatusCode;

use super::json;
use crate::classify::ErrorKind;

/// The most of an error body [`error_kind`] looks at.
pub(crate) const MAX_KIND_BODY: usize = 4 * 1024;

/// Codes and types (matched whole, case-insensitively) per kind.
const AUTH_CODES: &[&[u8]] = &[
    b"invalid_api_key",
    b"authentication_error",
    b"permission_error",
    b"API_KEY_INVALID",
    b"UNAUTHENTICATED",
    b"PERMISSION_DENIED",
];
const QUOTA_CODES: &[&[u8]] = &[
    b"insufficient_quota",
    b"billing_hard_limit_reached",
    b"billing_not_active",
];
const CONTEXT_CODES: &[&[u8]] = &[
    b"context_length_exceeded",
    b"request_too_large",
    b"string_above_max_length",
    b"max_tokens_exceeded",
];
const CONTENT_CODES: &[&[u8]] = &[
    b"content_policy_violation",
    b"content_filter",
    b"ResponsibleAIPolicyViolation",
    b"moderation_blocked",
    b"SAFETY",
    b"PROHIBITED_CONTENT",
];

/// Phrases (found anywhere in the message, case-insensitively) per kind.
const AUTH_TEXT: &[&[u8]] = &[
    b"api key not valid",
    b"incorrect api key",
    b"invalid api key",
];
const QUOTA_TEXT: &[&[u8]] = &[b"credit balance is too low", b"exceeded your current quota"];
const CONTEXT_TEXT: &[&[u8]] = &[
    b"prompt is too long",
    b"maximum context length",
    b"context length",
    b"context window",
    b"exceeds the maximum number of tokens",
    b"input token count",
    b"too many tokens",
];
const CONTENT_TEXT: &[&[u8]] = &[
    b"content management policy",
    b"content policy",
    b"safety system",
    b"usage policies",
    b"blocked due to safety",
    b"safety reasons",
];

/// See [`LlmClassifier::error_kind`](crate::classify::LlmClassifier::error_kind).
pub(crate) fn error_kind(status: StatusCode, body: &[u8]) -> Option<ErrorKind> {
    let body = &body[..body.len().min(MAX_KIND_BODY)];
    match status.as_u16() {
        401 | 403 => Some(ErrorKind::Auth),
        402 => Some(ErrorKind::QuotaExhausted),
        429 => (read(body) == Some(ErrorKind::QuotaExhausted)).then_some(ErrorKind::QuotaExhausted),
        400 | 413 | 422 => Some(
            read(body).unwrap_or(if status == StatusCode::PAYLOAD_TOO_LARGE {
                ErrorKind::ContextLength
            } else {
                ErrorKind::BadRequest
            }),
        ),
        _ => None,
    }
}

/// What the body says, by its codes first, then its message (the whole
/// prefix when it has no JSON message: a proxy's plain text).
fn read(body: &[u8]) -> Option<ErrorKind> {
    let fields = json::scan(body);
    let codes = fields
        .error
        .iter()
        .flat_map(|e| [e.ty, e.code, e.status])
        .chain([fields.code])
        .flatten();
    let mut by_code = None;
    for code in codes {
        let code = code.trim_ascii();
        let kind = [
            (AUTH_CODES, ErrorKind::Auth),
            (QUOTA_CODES, ErrorKind::QuotaExhausted),
            (CONTEXT_CODES, ErrorKind::ContextLength),
            (CONTENT_CODES, ErrorKind::ContentPolicy),
        ]
        .into_iter()
        .find(|(codes, _)| codes.iter().any(|c| code.eq_ignore_ascii_case(c)))
        .map(|(_, kind)| kind);
        by_code = by_code.or(kind);
    }
    if by_code.is_some() {
        return by_code;
    }
    let text = fields.error.and_then(|e| e.message).unwrap_or(body);
    // Gemini names an invalid key in a detail's `reason`, deeper than the
    // fields the scan picks out.
    if contains(body, b"API_KEY_INVALID") {
        return Some(ErrorKind::Auth);
    }
    [
        (AUTH_TEXT, ErrorKind::Auth),
        (QUOTA_TEXT, ErrorKind::QuotaExhausted),
        (CONTEXT_TEXT, ErrorKind::ContextLength),
        (CONTENT_TEXT, ErrorKind::ContentPolicy),
    ]
    .into_iter()
    .find(|(phrases, _)| phrases.iter().any(|p| contains(text, p)))
    .map(|(_, kind)| kind)
}

/// Whether `needle` occurs in `haystack`, ASCII case ignored.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.len() >= needle.len()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(status: u16, body: &str) -> Option<ErrorKind> {
        error_kind(StatusCode::from_u16(status).unwrap(), body.as_bytes())
    }

    #[test]
    fn openai_shapes() {
        let context = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(kind(400, context), Some(ErrorKind::ContextLength));
        let policy = r#"{"error":{"code":"content_policy_violation","message":"Your request was rejected as a result of our safety system.","param":null,"type":"invalid_request_error"}}"#;
        assert_eq!(kind(400, policy), Some(ErrorKind::ContentPolicy));
        let azure = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
        assert_eq!(kind(400, azure), Some(ErrorKind::ContentPolicy));
        let bad = r#"{"error":{"message":"Invalid value for 'temperature'.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}"#;
        assert_eq!(kind(400, bad), Some(ErrorKind::BadRequest));
        let key = r#"{"error":{"message":"Incorrect API key provided: sk-abc.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
        assert_eq!(kind(401, key), Some(ErrorKind::Auth));
        let quota = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        assert_eq!(kind(429, quota), Some(ErrorKind::QuotaExhausted));
        let rate = r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#;
        assert_eq!(kind(429, rate), None, "a plain rate limit has no kind");
    }

    #[test]
    fn anthropic_shapes() {
        let long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
        assert_eq!(kind(400, long), Some(ErrorKind::ContextLength));
        let large = r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}"#;
        assert_eq!(kind(413, large), Some(ErrorKind::ContextLength));
        let credit = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
        assert_eq!(kind(400, credit), Some(ErrorKind::QuotaExhausted));
        let auth = r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
        assert_eq!(kind(401, auth), Some(ErrorKind::Auth));
        let plain = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be positive"}}"#;
        assert_eq!(kind(400, plain), Some(ErrorKind::BadRequest));
    }

    #[test]
    fn gemini_shapes() {
        let long = r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(kind(400, long), Some(ErrorKind::ContextLength));
        let key = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}]}}"#;
        assert_eq!(kind(400, key), Some(ErrorKind::Auth));
        let safety = r#"{"error":{"code":400,"message":"The request was blocked due to safety reasons: PROHIBITED_CONTENT.","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(kind(400, safety), Some(ErrorKind::ContentPolicy));
        let denied =
            r#"{"error":{"code":403,"message":"Permission denied.","status":"PERMISSION_DENIED"}}"#;
        assert_eq!(kind(403, denied), Some(ErrorKind::Auth));
        let plain = r#"{"error":{"code":400,"message":"Request contains an invalid argument.","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(kind(400, plain), Some(ErrorKind::BadRequest));
    }

    #[test]
    fn garbage_and_truncated_bodies_never_panic() {
        let long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#;
        for cut in 0..long.len() {
            let k = kind(400, &long[..cut]);
            assert!(
                matches!(k, Some(ErrorKind::ContextLength | ErrorKind::BadRequest)),
                "{cut}: {k:?}"
            );
        }
        for body in [
            "",
            "{",
            "}",
            "\"",
            "\\",
            "[[[[[[[[[[[[[[[[[[[[[[[[",
            "{\"error\":\"",
            "\u{0}\u{ff}",
        ] {
            assert_eq!(kind(400, body), Some(ErrorKind::BadRequest), "{body:?}");
        }
        assert_eq!(
            kind(413, "<html>413 Request Entity Too Large</html>"),
            Some(ErrorKind::ContextLength)
        );
        assert_eq!(
            kind(400, "upstream: prompt is too long"),
            Some(ErrorKind::ContextLength)
        );
        for status in [200, 204, 302, 404, 500, 503, 529] {
            assert_eq!(kind(status, "prompt is too long"), None, "{status}");
        }
    }

    #[test]
    fn only_the_first_kib_are_read() {
        let mut body = vec![b' '; MAX_KIND_BODY];
        body.extend_from_slice(b"prompt is too long");
        assert_eq!(
            error_kind(StatusCode::BAD_REQUEST, &body),
            Some(ErrorKind::BadRequest)
        );
    }
}
