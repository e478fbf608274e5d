//! The default classifier for plain HTTP upstreams.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use super::{Classify, ErrorRef, NeverDefer, Outcome, Verdict};

/// Classifies on the status code alone.
///
/// | response | outcome |
/// |---|---|
/// | 1xx, 2xx, 3xx | `Success` |
/// | 429 | `RateLimited`, with `Retry-After` / `retry-after-ms` parsed |
/// | other 4xx | `Ignored` (the request's fault, not the upstream's) |
/// | 5xx | `Failure` |
/// | any inner error (connect, reset, attempt timeout) | `Failure` |
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tower_circuit_breaker::classify::{Classify, HttpClassifier, Verdict};
/// use tower_circuit_breaker::Outcome;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "7".parse().unwrap());
/// let verdict = HttpClassifier.classify_response(StatusCode::TOO_MANY_REQUESTS, &headers);
/// assert!(matches!(
///     verdict,
///     Verdict::Done(Outcome::RateLimited { retry_after: Some(d) }) if d == Duration::from_secs(7)
/// ));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpClassifier;

impl Classify for HttpClassifier {
    type Stream = NeverDefer;

    #[inline]
    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<NeverDefer> {
        Verdict::Done(classify_status(status, headers))
    }

    fn classify_error(&self, _error: ErrorRef<'_>) -> Outcome {
        Outcome::Failure
    }
}

#[inline]
pub(crate) fn classify_status(status: StatusCode, headers: &HeaderMap) -> Outcome {
    if status == StatusCode::TOO_MANY_REQUESTS {
        Outcome::RateLimited {
            retry_after: parse_retry_after(headers),
        }
    } else if status.is_server_error() {
        Outcome::Failure
    } else if status.is_client_error() {
        Outcome::Ignored
    } else {
        Outcome::Success
    }
}

/// The longest wait a header may ask for, 7 days: `Retry-After` or
/// `retry-after-ms` asking longer is treated as garbage (no wait announced).
///
/// It is also the default of
/// [`Builder::max_rate_limit_wait`](crate::Builder::max_rate_limit_wait),
/// the longest an announced wait paces or quota-gates a circuit; lower that
/// setting to cap how long one answer can gate a key.
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::classify::{parse_retry_after, MAX_RETRY_AFTER};
///
/// assert_eq!(MAX_RETRY_AFTER, Duration::from_secs(604_800));
/// let mut h = http::HeaderMap::new();
/// h.insert("retry-after", "604800".parse().unwrap());
/// assert_eq!(parse_retry_after(&h), Some(MAX_RETRY_AFTER));
/// h.insert("retry-after", "604801".parse().unwrap());
/// assert_eq!(parse_retry_after(&h), None);
/// ```
pub const MAX_RETRY_AFTER: Duration = crate::breaker::MAX_DURATION;

/// Reads how long an upstream asked the caller to wait.
///
/// `retry-after-ms` (milliseconds, as OpenAI sends it) wins over
/// `Retry-After`, which may be seconds or an HTTP date. Values that are
/// negative, not numbers, not valid UTF-8 or longer than a week are ignored.
/// A date in the past means "now" (zero).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_circuit_breaker::classify::parse_retry_after;
///
/// let mut h = http::HeaderMap::new();
/// h.insert("retry-after", "soon".parse().unwrap());
/// assert_eq!(parse_retry_after(&h), None);
/// h.insert("retry-after-ms", "1500".parse().unwrap());
/// assert_eq!(parse_retry_after(&h), Some(Duration::from_millis(1500)));
/// ```
pub fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_seconds(v, 1e-3))
    {
        return Some(ms);
    }
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Some(d) = parse_seconds(value, 1.0) {
        return Some(d);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let wait = at
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    (wait <= MAX_RETRY_AFTER).then_some(wait)
}

/// Parses a non-negative decimal number of `unit` seconds.
pub(crate) fn parse_seconds(value: &str, unit: f64) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let n: f64 = value.parse().ok()?;
    let d = Duration::try_from_secs_f64(n * unit).ok()?;
    (d <= MAX_RETRY_AFTER).then_some(d)
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

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", "7")])),
            Some(Duration::from_secs(7))
        );
        let in_a_minute = SystemTime::now() + Duration::from_secs(60);
        let date = httpdate::fmt_http_date(in_a_minute);
        let d = parse_retry_after(&headers(&[("retry-after", &date)])).unwrap();
        assert!(
            d > Duration::from_secs(55) && d <= Duration::from_secs(60),
            "{d:?}"
        );
        let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(60));
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after", &past)])),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn garbage_retry_after_is_none_not_a_panic() {
        for bad in [
            "soon",
            "-5",
            "",
            "1e9999",
            "NaN",
            "inf",
            "9999999999999999999999",
            "1.2.3",
        ] {
            assert_eq!(
                parse_retry_after(&headers(&[("retry-after", bad)])),
                None,
                "{bad}"
            );
        }
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after-ms", "-20")])),
            None
        );
        // A garbage millisecond value falls back to the seconds header.
        assert_eq!(
            parse_retry_after(&headers(&[("retry-after-ms", "x"), ("retry-after", "2")])),
            Some(Duration::from_secs(2))
        );
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            http::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        );
        assert_eq!(parse_retry_after(&h), None);
    }

    #[test]
    fn status_classes_map_to_outcomes() {
        let h = HeaderMap::new();
        assert_eq!(classify_status(StatusCode::OK, &h), Outcome::Success);
        assert_eq!(
            classify_status(StatusCode::BAD_REQUEST, &h),
            Outcome::Ignored
        );
        assert_eq!(
            classify_status(StatusCode::SERVICE_UNAVAILABLE, &h),
            Outcome::Failure
        );
        assert_eq!(
            classify_status(StatusCode::TOO_MANY_REQUESTS, &h),
            Outcome::RateLimited { retry_after: None }
        );
    }
}
