//! `parse_retry_after` and `HttpClassifier` on header maps built from fuzz
//! bytes: never a panic, never more than a week, integers read exactly.
#![no_main]

use std::time::Duration;

use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use tower_circuit_breaker::classify::{parse_retry_after, Classify, HttpClassifier, Verdict};
use tower_circuit_breaker::Outcome;
use tower_circuit_breaker_fuzz::{headers, RawHeader};

const WEEK: u64 = 7 * 24 * 3600;

/// A plain integer (what most upstreams send).
fn integer(headers: &http::HeaderMap, name: &str) -> Option<u64> {
    let v = headers.get(name)?.to_str().ok()?.trim();
    if v.is_empty() || v.len() > 18 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

fn is_date(headers: &http::HeaderMap) -> bool {
    headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| httpdate::parse_http_date(v.trim()).is_ok())
}

fuzz_target!(|raw: Vec<RawHeader>| {
    let h = headers(&raw);
    let got = parse_retry_after(&h);
    if let Some(d) = got {
        assert!(d <= Duration::from_secs(WEEK), "{d:?} from {h:?}");
    }

    // Integers are read exactly; milliseconds win when they parse.
    match (integer(&h, "retry-after-ms"), integer(&h, "retry-after")) {
        (Some(ms), _) if ms <= WEEK * 1000 => {
            assert_eq!(got, Some(Duration::from_millis(ms)), "{h:?}")
        }
        (None, Some(s)) if h.get("retry-after-ms").is_none() => {
            assert_eq!(got, (s <= WEEK).then(|| Duration::from_secs(s)), "{h:?}")
        }
        _ => {}
    }

    // The classifier hands a 429 the same value (a date is read against the
    // clock, so it may move by the time of the second read).
    match HttpClassifier.classify_response(StatusCode::TOO_MANY_REQUESTS, &h) {
        Verdict::Done(Outcome::RateLimited { retry_after }) => {
            if !is_date(&h) {
                assert_eq!(retry_after, got, "{h:?}");
            }
        }
        other => panic!("a 429 is rate-limited, got {other:?}"),
    }
});
