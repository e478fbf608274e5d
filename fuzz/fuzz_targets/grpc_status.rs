//! `GrpcClassifier` on arbitrary `grpc-status`, `grpc-retry-pushback-ms` and
//! other header values, in trailers-only heads and in trailers: never a
//! panic, the documented table for codes 0 to 16, the same verdict in the
//! head as in the trailers, and the breaker records what it decided.
#![no_main]

use std::time::Duration;

use http::{HeaderMap, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_circuit_breaker::classify::{
    Classify, ClassifyStream, GrpcClassifier, HttpClassifier, Verdict,
};
use tower_circuit_breaker::Outcome;
use tower_circuit_breaker_fuzz::{drive, headers, kind, recorded, Exchange, Step};

/// The documented table, by code.
fn table(code: u8, pushback: Option<Duration>) -> Outcome {
    match code {
        0 => Outcome::Success,
        8 => Outcome::RateLimited {
            retry_after: pushback,
        },
        2 | 4 | 13 | 14 | 15 => Outcome::Failure,
        1 | 3 | 5 | 6 | 7 | 9 | 10 | 11 | 12 | 16 => Outcome::Ignored,
        _ => unreachable!(),
    }
}

/// The code, when the value is one written the plain way (`7`, ` 14 `).
fn plain_code(h: &HeaderMap) -> Option<u8> {
    let v = h.get("grpc-status")?.to_str().ok()?.trim();
    (0..=16u8).find(|n| n.to_string() == v)
}

/// A pushback written the plain way (digits, without a leading zero).
fn plain_pushback(h: &HeaderMap) -> Option<Duration> {
    let v = h.get("grpc-retry-pushback-ms")?.to_str().ok()?.trim();
    let ms: u64 = v.parse().ok()?;
    (ms.to_string() == v && ms < 1_000_000_000_000).then(|| Duration::from_millis(ms))
}

/// What a map carrying `grpc-status` must give, where the table says.
fn check(h: &HeaderMap, got: Outcome) {
    let value = h.get("grpc-status").expect("a status");
    if let Some(code) = plain_code(h) {
        let pushback = plain_pushback(h);
        match (code, got) {
            // A pushback written some other way may or may not be read.
            (8, Outcome::RateLimited { retry_after }) if pushback.is_none() => {
                assert!(retry_after.is_none_or(|w| w < Duration::from_secs(1 << 40)))
            }
            _ => assert_eq!(got, table(code, pushback), "{h:?}"),
        }
    }
    // No digits, no verdict but `UNKNOWN`: a failure.
    if !value.as_bytes().iter().any(u8::is_ascii_digit) {
        assert_eq!(got, Outcome::Failure, "{h:?}");
    }
    // Only a real `OK` is a success.
    if got == Outcome::Success {
        let v = value.to_str().expect("OK is text").trim();
        assert!(!v.is_empty() && v.bytes().all(|b| b == b'0'), "{h:?}");
    }
    assert_ne!(got, Outcome::QuotaExhausted);
}

fuzz_target!(|ex: Exchange| {
    let status = ex.status();
    let head = headers(&ex.headers);

    // The head: another HTTP status is judged as plain HTTP; a 200 with a
    // status is trailers-only; a 200 without waits for the trailers.
    let (on_head, stream) = match GrpcClassifier.classify_response(status, &head) {
        Verdict::Done(got) if status != StatusCode::OK => {
            let Verdict::Done(http) = HttpClassifier.classify_response(status, &head);
            assert_eq!(got, http);
            (Some(got), None)
        }
        Verdict::Done(got) => {
            check(&head, got);
            (Some(got), None)
        }
        Verdict::Defer(s) => {
            assert_eq!(status, StatusCode::OK);
            assert!(!head.contains_key("grpc-status"));
            (None, Some(s))
        }
    };

    // Every trailer map, judged as trailers and as a trailers-only head.
    for step in &ex.steps {
        let Step::Trailers(raw) = step else { continue };
        let t = headers(raw);
        let Verdict::Defer(mut s) =
            GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new())
        else {
            unreachable!()
        };
        let got = s.on_trailers(&t).expect("trailers decide");
        match GrpcClassifier.classify_response(StatusCode::OK, &t) {
            Verdict::Done(on_head) => {
                assert_eq!(got, on_head, "{t:?}");
                check(&t, got);
            }
            Verdict::Defer(_) => assert_eq!(got, Outcome::Failure, "no status: {t:?}"),
        }
    }

    // Through the breaker: recorded as the head, the first trailers, a
    // body error or the end of the stream decide.
    let (breaker, _) = drive(GrpcClassifier, &ex);
    if ex.drop_after.is_none() {
        let expected = match (on_head, stream) {
            (Some(o), _) => o,
            (None, Some(mut s)) => ex
                .steps
                .iter()
                .find_map(|step| match step {
                    Step::Data(d) => {
                        assert_eq!(s.on_data(d), None, "data never decides");
                        None
                    }
                    Step::Trailers(t) => s.on_trailers(&headers(t)),
                    Step::Error => Some(Outcome::Failure),
                    Step::Pending => None,
                })
                .unwrap_or(Outcome::Failure),
            (None, None) => unreachable!(),
        };
        assert_eq!(recorded(&breaker), kind(expected));
    }
});
