//! Inputs the fuzz targets in `fuzz/` found failing, replayed through the
//! public API. Each test names the target and gives the input as it was
//! minimized.

use std::convert::Infallible;

use bytes::Bytes;
use http::Response;
use http_body::Body;
use http_body_util::Empty;
use tower::{service_fn, Service, ServiceExt};
use tower_circuit_breaker::classify::{
    ClassifyStream, GrpcClassifier, SseEvent, SseScanner, SseStream,
};
use tower_circuit_breaker::{Breaker, CircuitBreaker, Outcome};

#[allow(dead_code)]
#[path = "../../examples/outage_replay/scenario.rs"]
mod scenario;

/// The events a scanner dispatches for `chunks` (name, data, truncated), and
/// whether the stream stopped inside an event.
fn scan(max_line: usize, chunks: &[&[u8]]) -> (Vec<(String, Vec<u8>, bool)>, bool) {
    let mut scanner = SseScanner::with_max_line(max_line);
    let mut seen = Vec::new();
    let mut record = |ev: &SseEvent<'_>| {
        seen.push((
            ev.event().to_owned(),
            ev.data().to_vec(),
            ev.is_data_truncated(),
        ));
        None
    };
    for chunk in chunks {
        assert_eq!(scanner.feed(chunk, &mut record), None);
    }
    let mid = scanner.is_mid_event();
    scanner.finish(&mut record);
    (seen, mid)
}

fn verdict(max_line: usize, chunks: &[&[u8]]) -> Outcome {
    let mut stream = SseStream::new().max_line(max_line);
    for chunk in chunks {
        if let Some(outcome) = stream.on_data(chunk) {
            return outcome;
        }
    }
    stream.on_end()
}

/// Every way to cut `body` in two, and byte by byte.
fn chunkings(body: &[u8]) -> Vec<Vec<&[u8]>> {
    let mut all: Vec<Vec<&[u8]>> = (0..=body.len())
        .map(|i| vec![&body[..i], &body[i..]])
        .collect();
    all.push(body.chunks(1).collect());
    all
}

/// `sse_stream`: `max_line: 0, body: [0xEF, 0xFF, b':', b':']`, fed whole
/// and byte by byte. A first line that is too long is thrown away, and the
/// scanner must still tell a comment from a field. It took any line starting
/// with 0xEF for a byte-order mark, and looked past it for the `:` only if
/// that byte had arrived before the line outgrew `max_line`: fed whole this
/// unterminated field line was a comment (a clean end, `Success`), fed byte
/// by byte a field (a truncated stream, `Failure`).
#[test]
fn sse_stream_overlong_first_line_starting_with_0xef() {
    let body = b"\xEF\xFF::";
    for max_line in 0..=3 {
        for chunks in chunkings(body) {
            assert_eq!(scan(max_line, &chunks), (vec![], true), "{chunks:?}");
            assert_eq!(verdict(max_line, &chunks), Outcome::Failure, "{chunks:?}");
        }
    }
    // Closed by a blank line, it is an event whose data was lost.
    let body = b"\xEF\xFF::\n\n";
    for chunks in chunkings(body) {
        let events = vec![("message".to_owned(), vec![], true)];
        assert_eq!(scan(1, &chunks), (events, false), "{chunks:?}");
    }
}

/// `sse_stream`: a stream opening with a byte-order mark and a comment,
/// with `max_line` 1 (the input before minimizing: the mark in one chunk,
/// a comment in later ones). The comment is too long and thrown away; it
/// must stay a comment however the mark arrives, and the stream ends
/// cleanly.
#[test]
fn sse_stream_overlong_comment_after_a_byte_order_mark() {
    let body = b"\xEF\xBB\xBF: keep-alive\n";
    for max_line in 0..=3 {
        for chunks in chunkings(body) {
            assert_eq!(scan(max_line, &chunks), (vec![], false), "{chunks:?}");
            assert_eq!(verdict(max_line, &chunks), Outcome::Success, "{chunks:?}");
        }
    }
}

/// `scenario`: `scenarios/seed-002-failover.toml` with `duration_s` set to
/// `5.445220688978541e-241`. The number is greater than 0, as the rule asks,
/// but under a nanosecond: the parser accepted a scenario of zero duration,
/// which replays no request at all and reports nothing wrong.
#[test]
fn scenario_duration_under_a_nanosecond() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/seed-002-failover.toml"
    );
    let shipped = std::fs::read_to_string(path).unwrap();
    assert!(scenario::parse(&shipped, "f.toml").is_ok());
    for tiny in ["5.445220688978541e-241", "1e-10", "4e-10"] {
        let text = shipped.replace("duration_s = 1080", &format!("duration_s = {tiny}"));
        let err = scenario::parse(&text, "f.toml").expect_err(tiny);
        assert_eq!(err.line, Some(7), "{err}");
        assert!(err.message.contains("`duration_s`"), "{err}");
    }
    // A nanosecond is enough.
    let text = shipped.replace("duration_s = 1080", "duration_s = 1e-9");
    let s = scenario::parse(&text, "f.toml").unwrap();
    assert_eq!(s.duration, std::time::Duration::from_nanos(1));
}

/// `response_body`: `Exchange { status: 48650, headers: [], steps: [],
/// drop_after: Some(0) }`, a deferred answer whose body is empty from the
/// start (`is_end_stream()`) and is dropped without a poll, as clients do
/// with a body that has nothing in it. The stream has ended: it must be
/// judged by `on_end` (for gRPC, a stream without trailers is a failure),
/// not counted as a body the caller gave up on.
#[tokio::test]
async fn response_body_empty_body_dropped_unpolled_has_ended() {
    let breaker = Breaker::builder().build().unwrap();
    let upstream =
        service_fn(|_: ()| async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) });
    let mut svc = CircuitBreaker::with_classifier(upstream, breaker.clone(), GrpcClassifier);
    let response = svc.ready().await.unwrap().call(()).await.unwrap();
    assert!(response.body().is_end_stream());
    drop(response);
    let c = breaker.snapshot().counters;
    assert_eq!((c.failures, c.ignored), (1, 0), "{c:?}");
}
