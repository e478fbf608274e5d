//! Garbage from the network is classified, never a panic.

use crate::support;
use tower_circuit_breaker::TripMode;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proptest::prelude::*;
use tokio::net::TcpListener;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::classify::{
    parse_rate_limit_reset, parse_retry_after, Classify, ClassifyStream, GrpcClassifier,
    LlmClassifier, SseEvent, SseScanner, SseStream, Verdict,
};
use tower_circuit_breaker::{CircuitBreakerLayer, Outcome, State};

use support::*;

#[tokio::test]
async fn garbage_rate_limit_headers_mean_no_known_wait() {
    let hits = Hits::default();
    let addr = serve(llm_upstream(hits.clone())).await;
    let mut client = llm_client(1);

    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/garbage-headers"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let (parts, body) = res.into_parts();
    let body = read_all(body).await.unwrap();
    assert_eq!(parts.headers["retry-after"], "soon");
    assert_eq!(parts.headers["retry-after-ms"], "-5");

    assert_eq!(parse_retry_after(&parts.headers), None);
    assert_eq!(LlmClassifier::retry_after(&parts.headers), None);
    let Verdict::Defer(mut stream) =
        LlmClassifier::new().classify_response(parts.status, &parts.headers)
    else {
        panic!("a 429 is read")
    };
    // The body is a truncated JSON document, too.
    assert_eq!(stream.on_data(&body), None);
    assert_eq!(stream.on_end(), Outcome::RateLimited { retry_after: None });

    let snap = client.breaker().snapshot();
    assert_eq!(snap.counters.rate_limited, 1);
    assert_eq!(snap.state, State::Closed);
}

#[tokio::test]
async fn truncated_sse_event_is_a_failure() {
    let hits = Hits::default();
    let addr = serve(llm_upstream(hits)).await;
    let mut client = llm_client(1);

    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/truncated"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // The body itself ends cleanly: only its content is cut.
    let body = read_all(res.into_body()).await.unwrap();
    assert!(body.ends_with(b"\"Hel"));
    let snap = client.breaker().snapshot();
    assert_eq!(snap.counters.failures, 1);
    assert_eq!(snap.state, State::Open);
}

#[tokio::test]
async fn ten_megabytes_without_a_newline_pass_through_and_count_once() {
    let hits = Hits::default();
    let addr = serve(llm_upstream(hits)).await;
    let mut client = llm_client(2);

    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/no-newline"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = read_all(res.into_body()).await.unwrap();
    assert_eq!(body.len(), 10 * 1024 * 1024);
    assert!(body.iter().all(|&b| b == b'x'));
    // Not one complete event: a stream that ended inside its only line.
    let counters = client.breaker().snapshot().counters;
    assert_eq!((counters.failures, counters.successes), (1, 0));
}

#[test]
fn ten_megabytes_without_a_newline_in_bounded_memory() {
    let mut stream = SseStream::new();
    let chunk = vec![b'z'; 4096];
    for _ in 0..(10 * 1024 * 1024 / chunk.len()) {
        assert_eq!(stream.on_data(&chunk), None);
        assert!(stream.scanner().buffered_capacity() <= 2 * 64 * 1024);
    }
    assert_eq!(stream.on_end(), Outcome::Failure);
}

/// An HTTP/2 server that answers like a broken gRPC server.
async fn broken_grpc_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let message = Bytes::from_static(b"\0\0\0\0\x02\x08\x01");
                        let trailers = |v: Option<&'static [u8]>| {
                            let mut t = HeaderMap::new();
                            if let Some(v) = v {
                                t.insert("grpc-status", HeaderValue::from_bytes(v).unwrap());
                            }
                            Frame::trailers(t)
                        };
                        let mut head = None::<&'static [u8]>;
                        let frames = match req.uri().path() {
                            "/head/abc" => {
                                head = Some(b"abc");
                                vec![]
                            }
                            "/head/huge" => {
                                head = Some(b"99999999999999999999999");
                                vec![]
                            }
                            "/head/not-utf8" => {
                                head = Some(b"\xff\xfe");
                                vec![]
                            }
                            "/trailers/banana" => {
                                vec![Frame::data(message), trailers(Some(b"banana"))]
                            }
                            "/trailers/negative" => {
                                vec![Frame::data(message), trailers(Some(b"-1"))]
                            }
                            "/trailers/out-of-range" => {
                                vec![Frame::data(message), trailers(Some(b"17"))]
                            }
                            "/trailers/missing" => vec![Frame::data(message), trailers(None)],
                            "/no-trailers" => vec![Frame::data(message)],
                            "/ok" => vec![Frame::data(message), trailers(Some(b"0"))],
                            _ => vec![],
                        };
                        let mut res =
                            Response::builder().header("content-type", "application/grpc");
                        if let Some(v) = head {
                            res = res.header("grpc-status", HeaderValue::from_bytes(v).unwrap());
                        }
                        let body = StreamBody::new(futures::stream::iter(
                            frames.into_iter().map(Ok::<_, Infallible>),
                        ));
                        Ok::<_, Infallible>(res.body(body).unwrap())
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn malformed_grpc_status_over_http2_is_a_failure() {
    let addr = broken_grpc_server().await;
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1000)
        .build()
        .unwrap()
        .with_classifier(GrpcClassifier);
    let mut client = tower::Layer::layer(&layer, http2_client());

    let broken = [
        "/head/abc",
        "/head/huge",
        "/head/not-utf8",
        "/trailers/banana",
        "/trailers/negative",
        "/trailers/out-of-range",
        "/trailers/missing",
        "/no-trailers",
    ];
    for (i, path) in broken.iter().enumerate() {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, path))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let _ = read_all(res.into_body()).await.unwrap();
        assert_eq!(
            client.breaker().snapshot().counters.failures,
            i as u64 + 1,
            "{path}"
        );
    }
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/ok"))
        .await
        .unwrap();
    read_all(res.into_body()).await.unwrap();
    let counters = client.breaker().snapshot().counters;
    assert_eq!(
        (counters.failures, counters.successes),
        (broken.len() as u64, 1)
    );
}

// === properties ===

fn events_of(chunks: &[&[u8]]) -> Vec<String> {
    let mut scanner = SseScanner::with_max_line(48);
    let mut seen = Vec::new();
    let mut push = |ev: &SseEvent<'_>| {
        seen.push(format!(
            "{}|{:?}|{}|{}",
            ev.event(),
            ev.data(),
            ev.is_data_truncated(),
            ev.is_complete()
        ));
        None
    };
    for chunk in chunks {
        let _ = scanner.feed(chunk, &mut push);
    }
    let _ = scanner.finish(&mut push);
    seen
}

/// Bytes that exercise the scanner: line endings, colons, field names,
/// multi-byte characters, a byte-order mark and arbitrary bytes.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b":".to_vec()),
        Just(b" ".to_vec()),
        Just(b"data".to_vec()),
        Just(b"event".to_vec()),
        Just(b"error".to_vec()),
        Just(b"[DONE]".to_vec()),
        Just("\u{feff}".as_bytes().to_vec()),
        Just("\u{1f980}\u{e9}".as_bytes().to_vec()),
        Just(b"{\"error\":{\"type\":\"overloaded_error\"}}".to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

/// Pieces of `usage` objects of every provider, broken and reassembled.
fn usage_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"[".to_vec()),
        Just(b",".to_vec()),
        Just(b":".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"data: ".to_vec()),
        Just(b"\"usage\":".to_vec()),
        Just(b"\"usageMetadata\":".to_vec()),
        Just(b"\"message\":".to_vec()),
        Just(b"\"model\":\"gpt-4o\"".to_vec()),
        Just(b"\"prompt_tokens\":".to_vec()),
        Just(b"\"input_tokens\":".to_vec()),
        Just(b"\"prompt_tokens_details\":".to_vec()),
        Just(b"\"cached_tokens\":".to_vec()),
        Just(b"\"promptTokenCount\":".to_vec()),
        Just(b"99999999999999999999999".to_vec()),
        Just(b"12".to_vec()),
        Just(b"-3".to_vec()),
        Just(b"null".to_vec()),
        prop::collection::vec(any::<u8>(), 0..12),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sse_events_do_not_depend_on_chunking(body in sse_bytes(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut start = 0;
        for p in points {
            chunks.push(&body[start..p]);
            start = p;
        }
        chunks.push(&body[start..]);
        prop_assert_eq!(events_of(&chunks), events_of(&[&body]));
    }

    #[test]
    fn llm_streams_never_panic(body in sse_bytes(), split in any::<prop::sample::Index>(), status in 100u16..600) {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
        let status = StatusCode::from_u16(status).unwrap();
        if let Verdict::Defer(mut stream) = LlmClassifier::new().classify_response(status, &headers) {
            let (a, b) = body.split_at(split.index(body.len() + 1));
            if stream.on_data(a).or_else(|| stream.on_data(b)).is_none() {
                let _ = stream.on_end();
            }
        }
    }

    #[test]
    fn usage_parsing_never_panics_and_unparsed_usage_is_charged_as_unknown(
        body in usage_bytes(),
        split in any::<prop::sample::Index>(),
        sse in any::<bool>(),
    ) {
        use tower_circuit_breaker::spend::{read_usage, Charge, Meter, Prices, Usage};
        let _ = read_usage(&body, &body);
        let mut headers = HeaderMap::new();
        if sse {
            headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
        }
        let meter = Meter::new(LlmClassifier::new(), Prices::tokens());
        let Verdict::Defer(mut stream) = meter.classify_response(StatusCode::OK, &headers) else {
            panic!("a 2xx answer is read for its usage");
        };
        let (a, b) = body.split_at(split.index(body.len() + 1));
        if stream.on_data(a).is_none() {
            let _ = stream.on_data(b);
        }
        let charge = stream.charge();
        if !sse {
            match Usage::from_json(&body) {
                Some(u) => prop_assert_eq!(charge, Charge::Observed(u.total())),
                None => prop_assert_eq!(charge, Charge::Unknown),
            }
        }
    }

    #[test]
    fn header_parsers_never_panic(value in prop::collection::vec(any::<u8>(), 0..40), text in ".{0,40}") {
        let _ = parse_rate_limit_reset(&text);
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            for name in ["retry-after", "retry-after-ms", "x-ratelimit-reset-requests", "grpc-status", "grpc-retry-pushback-ms"] {
                let mut h = HeaderMap::new();
                h.insert(name, v.clone());
                h.insert("grpc-status", HeaderValue::from_static("8"));
                let _ = parse_retry_after(&h);
                let _ = LlmClassifier::retry_after(&h);
                let _ = GrpcClassifier.classify_response(StatusCode::OK, &h);
                let mut t = HeaderMap::new();
                t.insert(name, v.clone());
                if let Verdict::Defer(mut s) = GrpcClassifier.classify_response(StatusCode::OK, &HeaderMap::new()) {
                    let _ = s.on_trailers(&t);
                }
            }
        }
    }

    #[test]
    fn grpc_retry_pushback_is_bounded(digits in "[0-9]{1,40}") {
        if let Outcome::RateLimited { retry_after: Some(d) } = grpc_pushback(&digits) {
            prop_assert!(d <= Duration::from_secs(3600), "{digits}: {d:?}");
        }
    }

    #[test]
    fn rate_limit_reset_is_bounded(text in "[0-9.hmsun\u{b5}]{0,12}") {
        if let Some(d) = parse_rate_limit_reset(&text) {
            prop_assert!(d <= Duration::from_secs(7 * 24 * 3600));
        }
    }
}

fn grpc_pushback(value: &str) -> Outcome {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from_static("8"));
    h.insert(
        "grpc-retry-pushback-ms",
        HeaderValue::from_str(value).unwrap(),
    );
    match GrpcClassifier.classify_response(StatusCode::OK, &h) {
        Verdict::Done(o) => o,
        Verdict::Defer(_) => panic!("a trailers-only answer decides on the head"),
    }
}

#[test]
fn grpc_retry_pushback_is_capped_at_one_hour() {
    let hour = Some(Duration::from_secs(3600));
    // Twelve digits was 31 years; any longer run of digits is still a long wait.
    for long in [
        "999999999999",
        "3600001",
        "18446744073709551615",
        "99999999999999999999999",
    ] {
        assert_eq!(
            grpc_pushback(long),
            Outcome::RateLimited { retry_after: hour },
            "{long}"
        );
    }
    assert_eq!(
        grpc_pushback("3600000"),
        Outcome::RateLimited { retry_after: hour }
    );
    assert_eq!(
        grpc_pushback("1500"),
        Outcome::RateLimited {
            retry_after: Some(Duration::from_millis(1500))
        }
    );
    for bad in ["-1", "", "1e3", "soon", "12 34"] {
        assert_eq!(
            grpc_pushback(bad),
            Outcome::RateLimited { retry_after: None },
            "{bad:?}"
        );
    }
}
