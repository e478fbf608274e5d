//! Rate-limit reset headers (`x-ratelimit-reset-*`).

use std::time::Duration;

use http::HeaderMap;

use crate::classify::http::parse_seconds;

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
#[must_use]
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
pub(super) fn rate_limit_reset(headers: &HeaderMap) -> Option<Duration> {
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

/// The reset of the limits an answer says are used up: the longest
/// `x-ratelimit-reset-*` whose `x-ratelimit-remaining-*` twin is `0`.
pub(crate) fn exhausted_reset(headers: &HeaderMap) -> Option<Duration> {
    const REMAINING: &str = "x-ratelimit-remaining-";
    let mut hit = None::<Duration>;
    for (name, value) in headers {
        let Some(limit) = name.as_str().strip_prefix(REMAINING) else {
            continue;
        };
        if !value.to_str().is_ok_and(|v| v.trim() == "0") {
            continue;
        }
        let reset = headers
            .get_all(format!("x-ratelimit-reset-{limit}").as_str())
            .iter()
            .filter_map(|v| v.to_str().ok().and_then(parse_rate_limit_reset))
            .max();
        hit = hit.max(reset);
    }
    hit
}
