//! Classification for gRPC: the status arrives in the trailers.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

use super::http::classify_status;
use super::{Classify, ClassifyStream, ErrorRef, Outcome, Verdict};

/// The classifier for gRPC calls, such as those of a `tonic` channel.
///
/// A gRPC answer is an HTTP 200 whose verdict, `grpc-status`, comes last: in
/// the trailers after the streamed messages, or in the response headers of a
/// trailers-only answer (an error before any message). The classifier reads
/// it from whichever carries it, so a server stream that fails after ten
/// messages counts as a failure.
///
/// | `grpc-status` | outcome |
/// |---|---|
/// | `OK` (0) | `Success` |
/// | `UNKNOWN` (2), `DEADLINE_EXCEEDED` (4), `INTERNAL` (13), `UNAVAILABLE` (14), `DATA_LOSS` (15) | `Failure` |
/// | `RESOURCE_EXHAUSTED` (8) | `RateLimited`, waiting `grpc-retry-pushback-ms` if given (at most an hour) |
/// | `CANCELLED` (1), and the caller's errors: `INVALID_ARGUMENT` (3), `NOT_FOUND` (5), `ALREADY_EXISTS` (6), `PERMISSION_DENIED` (7), `FAILED_PRECONDITION` (9), `ABORTED` (10), `OUT_OF_RANGE` (11), `UNIMPLEMENTED` (12), `UNAUTHENTICATED` (16) | `Ignored` |
/// | not a number from 0 to 16 (`abc`, `-1`, `99`, not UTF-8) | as `UNKNOWN`: `Failure` |
/// | missing: the stream ended without trailers, or trailers without `grpc-status` | `Failure` |
/// | HTTP status other than 200 (a proxy's 503, 429, 404) | as [`HttpClassifier`](super::HttpClassifier): 5xx fail, 429 is rate-limited, other 4xx are ignored |
/// | the stream broke (reset, connection lost) | `Failure` |
/// | the caller dropped the response stream first | `Ignored` |
/// | inner error (connect, attempt timeout) | `Failure` |
///
/// A status that is missing or malformed is the upstream breaking the
/// protocol, which is what gRPC clients report as `UNKNOWN` or `INTERNAL`;
/// both count as failures here too.
///
/// This reads gRPC over HTTP/2. gRPC-Web, which carries its trailers inside
/// the body, is not understood: its answers would all lack a status.
///
/// # Example
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// use tower_circuit_breaker::classify::{Classify, ClassifyStream, GrpcClassifier, Verdict};
/// use tower_circuit_breaker::Outcome;
///
/// // Trailers-only: decided on the head.
/// let mut head = HeaderMap::new();
/// head.insert("grpc-status", "3".parse().unwrap()); // INVALID_ARGUMENT
/// assert!(matches!(GrpcClassifier.classify_response(StatusCode::OK, &head), Verdict::Done(Outcome::Ignored)));
///
/// // A stream: decided on the trailers.
/// let Verdict::Defer(mut stream) = GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new()) else {
///     unreachable!()
/// };
/// assert_eq!(stream.on_data(b"\0\0\0\0\x02\x08\x01"), None);
/// let mut trailers = HeaderMap::new();
/// trailers.insert("grpc-status", "14".parse().unwrap()); // UNAVAILABLE
/// assert_eq!(stream.on_trailers(&trailers), Some(Outcome::Failure));
/// ```
///
/// On a tonic channel:
///
/// ```no_run
/// use tower_circuit_breaker::classify::GrpcClassifier;
/// use tower_circuit_breaker::CircuitBreakerLayer;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect().await?;
/// let layer = CircuitBreakerLayer::builder().consecutive_failures(5).build()?.with_classifier(GrpcClassifier);
/// let channel = tower::ServiceBuilder::new().layer(layer).service(channel);
/// let client = tonic::client::Grpc::new(channel);
/// # let _ = client; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcClassifier;

impl Classify for GrpcClassifier {
    type Stream = GrpcStream;

    fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Verdict<GrpcStream> {
        if status != StatusCode::OK {
            return Verdict::Done(classify_status(status, headers));
        }
        match headers.get(GRPC_STATUS) {
            Some(code) => Verdict::Done(classify_code(code, headers)),
            None => Verdict::Defer(GrpcStream { _priv: () }),
        }
    }

    fn classify_error(&self, _error: ErrorRef<'_>) -> Outcome {
        Outcome::Failure
    }
}

/// The body classifier of [`GrpcClassifier`]: waits for the trailers.
#[derive(Debug)]
pub struct GrpcStream {
    _priv: (),
}

impl ClassifyStream for GrpcStream {
    fn on_trailers(&mut self, trailers: &HeaderMap) -> Option<Outcome> {
        Some(match trailers.get(GRPC_STATUS) {
            Some(code) => classify_code(code, trailers),
            None => Outcome::Failure,
        })
    }

    /// The stream ended without trailers: no status, a protocol error.
    fn on_end(self) -> Outcome {
        Outcome::Failure
    }
}

const GRPC_STATUS: &str = "grpc-status";

/// `UNKNOWN`, which is what a status that cannot be read means.
const UNKNOWN: u8 = 2;

fn parse_code(value: &HeaderValue) -> u8 {
    let code = value.to_str().ok().map(str::trim).unwrap_or("");
    if code.is_empty() || code.len() > 2 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return UNKNOWN;
    }
    match code.parse::<u8>() {
        Ok(n) if n <= 16 => n,
        _ => UNKNOWN,
    }
}

fn classify_code(value: &HeaderValue, headers: &HeaderMap) -> Outcome {
    match parse_code(value) {
        0 => Outcome::Success,
        8 => Outcome::RateLimited {
            retry_after: retry_pushback(headers),
        },
        2 | 4 | 13 | 14 | 15 => Outcome::Failure,
        _ => Outcome::Ignored,
    }
}

/// The longest wait a `grpc-retry-pushback-ms` can ask for; longer ones are
/// cut to it.
const MAX_PUSHBACK: Duration = Duration::from_secs(3600);

/// `grpc-retry-pushback-ms`: a non-negative number of milliseconds, capped at
/// [`MAX_PUSHBACK`]. A negative one means "do not retry", which has no wait to
/// give.
fn retry_pushback(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-retry-pushback-ms")?.to_str().ok()?.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // A server asking for more than the cap has asked for "a long time"; the
    // digits past the cap (however many) change nothing, so stop reading there.
    let cap = u64::try_from(MAX_PUSHBACK.as_millis()).unwrap_or(u64::MAX);
    let mut ms: u64 = 0;
    for b in value.bytes() {
        ms = ms * 10 + u64::from(b - b'0');
        if ms >= cap {
            return Some(MAX_PUSHBACK);
        }
    }
    Some(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_str(code).unwrap());
        h
    }

    fn on_head(h: &HeaderMap) -> Outcome {
        match GrpcClassifier.classify_response(StatusCode::OK, h) {
            Verdict::Done(o) => o,
            Verdict::Defer(_) => panic!("deferred"),
        }
    }

    fn on_trailers(h: &HeaderMap) -> Outcome {
        let Verdict::Defer(mut s) =
            GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new())
        else {
            panic!("decided on the head");
        };
        assert_eq!(s.on_data(b"\0\0\0\0\0"), None);
        s.on_trailers(h).expect("trailers decide")
    }

    #[test]
    fn status_table_in_headers_and_trailers() {
        let rate_limited = Outcome::RateLimited { retry_after: None };
        let table = [
            ("0", Outcome::Success),
            ("1", Outcome::Ignored),
            ("2", Outcome::Failure),
            ("3", Outcome::Ignored),
            ("4", Outcome::Failure),
            ("5", Outcome::Ignored),
            ("6", Outcome::Ignored),
            ("7", Outcome::Ignored),
            ("8", rate_limited),
            ("9", Outcome::Ignored),
            ("10", Outcome::Ignored),
            ("11", Outcome::Ignored),
            ("12", Outcome::Ignored),
            ("13", Outcome::Failure),
            ("14", Outcome::Failure),
            ("15", Outcome::Failure),
            ("16", Outcome::Ignored),
        ];
        for (code, outcome) in table {
            assert_eq!(on_head(&status(code)), outcome, "headers, {code}");
            assert_eq!(on_trailers(&status(code)), outcome, "trailers, {code}");
        }
    }

    #[test]
    fn malformed_status_is_unknown() {
        for bad in [
            "",
            "abc",
            "-1",
            "17",
            "99",
            "014",
            "1.0",
            "256",
            "99999999999999999999",
            "1 4",
            "+1",
        ] {
            assert_eq!(on_head(&status(bad)), Outcome::Failure, "{bad:?}");
            assert_eq!(on_trailers(&status(bad)), Outcome::Failure, "{bad:?}");
        }
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(on_head(&h), Outcome::Failure);
        // Surrounding blanks are tolerated.
        assert_eq!(on_head(&status(" 0 ")), Outcome::Success);
    }

    #[test]
    fn missing_status() {
        assert_eq!(on_trailers(&HeaderMap::new()), Outcome::Failure);
        let Verdict::Defer(s) = GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new())
        else {
            panic!()
        };
        assert_eq!(s.on_end(), Outcome::Failure);
        let Verdict::Defer(s) = GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new())
        else {
            panic!()
        };
        assert_eq!(s.on_error(), Outcome::Failure);
        let Verdict::Defer(s) = GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new())
        else {
            panic!()
        };
        assert_eq!(s.on_drop(), Outcome::Ignored);
    }

    #[test]
    fn retry_pushback() {
        let mut h = status("8");
        h.insert("grpc-retry-pushback-ms", HeaderValue::from_static("1500"));
        assert_eq!(
            on_trailers(&h),
            Outcome::RateLimited {
                retry_after: Some(Duration::from_millis(1500))
            }
        );
        for bad in ["-1", "soon", "", "1e3"] {
            h.insert(
                "grpc-retry-pushback-ms",
                HeaderValue::from_str(bad).unwrap(),
            );
            assert_eq!(
                on_head(&h),
                Outcome::RateLimited { retry_after: None },
                "{bad:?}"
            );
        }
    }

    #[test]
    fn http_status_other_than_200_is_classified_like_http() {
        let h = status("0");
        let http =
            |s: u16| match GrpcClassifier.classify_response(StatusCode::from_u16(s).unwrap(), &h) {
                Verdict::Done(o) => o,
                Verdict::Defer(_) => panic!(),
            };
        assert_eq!(http(503), Outcome::Failure);
        assert_eq!(http(502), Outcome::Failure);
        assert_eq!(http(404), Outcome::Ignored);
        assert_eq!(http(429), Outcome::RateLimited { retry_after: None });
        assert_eq!(http(204), Outcome::Success);
    }
}
