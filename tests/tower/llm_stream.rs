//! LLM answers over real connections: a hyper-util client behind the breaker
//! with the LLM classifier, against a local axum server that streams SSE.

use crate::support;
use tower_circuit_breaker::TripMode;

use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};
use tower_circuit_breaker::classify::{Classify, ClassifyStream, LlmClassifier, Verdict};
use tower_circuit_breaker::{Outcome, State};

use support::*;

async fn upstream() -> (std::net::SocketAddr, Hits) {
    let hits = Hits::default();
    let addr = serve(llm_upstream(hits.clone())).await;
    (addr, hits)
}

#[tokio::test]
async fn mid_stream_error_event_is_a_failure_and_opens_the_circuit() {
    let (addr, hits) = upstream().await;
    let mut client = llm_client(3);

    for i in 1..=3u64 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/overloaded"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "the head says all is well");
        // Until the error event arrives, nothing is recorded.
        assert_eq!(client.breaker().snapshot().counters.failures, i - 1);
        let body = read_all(res.into_body()).await.unwrap();
        assert_eq!(
            body,
            ANTHROPIC_OVERLOADED.as_bytes(),
            "the body passes through unchanged"
        );
        assert_eq!(client.breaker().snapshot().counters.failures, i);
    }
    assert_eq!(client.breaker().state(), State::Open);

    let err = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/overloaded"))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(hits.get(), 3, "a rejected call never reaches the upstream");
}

#[tokio::test]
async fn error_event_is_recorded_even_if_the_caller_stops_reading_after_it() {
    let (addr, _hits) = upstream().await;
    let mut client = llm_client(1);
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/overloaded"))
        .await
        .unwrap();
    let mut body = res.into_body();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("Overloaded\"}}\r\n\r\n") {
        let frame = body.frame().await.expect("more frames").unwrap();
        seen.extend_from_slice(frame.data_ref().unwrap());
    }
    // The verdict came with the error event, before the end of the body.
    assert!(!body.is_pending());
    drop(body);
    let counters = client.breaker().snapshot().counters;
    assert_eq!(
        (counters.failures, counters.ignored, counters.dropped),
        (1, 0, 0)
    );
    assert_eq!(client.breaker().state(), State::Open);
}

#[tokio::test]
async fn stream_cut_mid_body_is_a_failure() {
    // Chunked encoding, cut inside an event and before the last chunk.
    let event = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let partial = "data: {\"choices\":[{\"delta\":{\"co";
    let chunked = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{event}\r\n{:x}\r\n{partial}",
        event.len(),
        partial.len() + 40,
    )
    .into_bytes();
    // A declared length that never arrives.
    let sized =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 4096\r\n\r\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
            .to_vec();

    for response in [chunked, sized] {
        let (addr, hits) = serve_raw(response).await;
        let mut client = llm_client(2);
        for i in 1..=2u64 {
            let res = client
                .ready()
                .await
                .unwrap()
                .call(get_req(addr, "/"))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            read_all(res.into_body())
                .await
                .expect_err("the body was cut");
            assert_eq!(client.breaker().snapshot().counters.failures, i);
        }
        assert_eq!(client.breaker().state(), State::Open);
        let err = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/"))
            .await
            .unwrap_err();
        assert!(err.is_circuit_open());
        assert_eq!(hits.get(), 2);
    }
}

#[tokio::test]
async fn a_hundred_content_filter_answers_leave_the_circuit_closed() {
    let (addr, hits) = upstream().await;
    let mut client = llm_client(1);

    for _ in 0..100 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/filter-400"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        let body = read_all(res.into_body()).await.unwrap();
        assert_eq!(body, AZURE_FILTER_400.as_bytes());
    }
    for _ in 0..20 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/filtered"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        read_all(res.into_body()).await.unwrap();
    }
    let snap = client.breaker().snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.ignored, 120);
    assert_eq!(snap.counters.failures, 0);
    assert_eq!(snap.window.calls, 0, "ignored calls are in no window");
    assert_eq!(hits.get(), 120);

    // One real failure still trips it: the breaker was armed all along.
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/server-error"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(client.breaker().state(), State::Open);
}

#[tokio::test]
async fn rate_limited_429_passes_through_uncounted_with_its_wait() {
    let (addr, hits) = upstream().await;
    let mut client = llm_client(1);

    for i in 1..=50u64 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/rate-limited"))
            .await
            .unwrap();
        // The caller gets the 429 itself, headers and body untouched.
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "7");
        let (parts, body) = res.into_parts();
        let body = read_all(body).await.unwrap();
        assert_eq!(body, RATE_LIMIT_429.as_bytes());

        // What the classifier made of this very answer.
        let verdict = LlmClassifier::new().classify_response(parts.status, &parts.headers);
        let Verdict::Defer(mut stream) = verdict else {
            panic!("a 429 is read for its quota error")
        };
        let outcome = stream.on_data(&body).unwrap_or_else(|| stream.on_end());
        assert_eq!(
            outcome,
            Outcome::RateLimited {
                retry_after: Some(Duration::from_secs(7))
            }
        );

        let snap = client.breaker().snapshot();
        assert_eq!(snap.counters.rate_limited, i);
        assert_eq!(snap.counters.failures, 0);
        assert_eq!(snap.window.calls, 0);
        assert_eq!(snap.state, State::Closed);
    }
    assert_eq!(hits.get(), 50);
}

#[tokio::test]
async fn rate_limited_429_counts_even_when_the_body_is_never_read() {
    let (addr, _hits) = upstream().await;
    let mut client = llm_client(1);
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/rate-limited"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(res); // a retry layer does this
    let counters = client.breaker().snapshot().counters;
    assert_eq!(
        (counters.rate_limited, counters.ignored, counters.dropped),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn exhausted_quota_is_told_apart_from_a_transient_429() {
    let (addr, _hits) = upstream().await;
    let mut client = llm_client(1);
    for path in ["/quota", "/rate-limited", "/quota"] {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, path))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        read_all(res.into_body()).await.unwrap();
    }
    let snap = client.breaker().snapshot();
    assert_eq!(snap.counters.quota_exhausted, 2);
    assert_eq!(snap.counters.rate_limited, 1);
    assert_eq!(snap.counters.failures, 0);
    assert_eq!(snap.state, State::Closed);
}

#[tokio::test]
async fn dropping_the_body_after_done_is_a_success() {
    let (addr, _hits) = upstream().await;
    let mut client = llm_client(1);

    // The server sends `data: [DONE]` and then keeps the stream open, as a
    // slow proxy might; the caller stops reading at [DONE], as async-openai
    // does.
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/done-then-hang"))
        .await
        .unwrap();
    let mut body = res.into_body();
    let mut seen = Vec::new();
    while !seen.ends_with(b"data: [DONE]\n\n") {
        let frame = body.frame().await.expect("more frames").unwrap();
        seen.extend_from_slice(frame.data_ref().unwrap());
    }
    drop(body);
    let counters = client.breaker().snapshot().counters;
    assert_eq!(
        (counters.successes, counters.ignored, counters.dropped),
        (1, 0, 0)
    );

    // Dropped before [DONE]: the caller gave up, which says nothing.
    let res = client
        .ready()
        .await
        .unwrap()
        .call(get_req(addr, "/hang-before-done"))
        .await
        .unwrap();
    let mut body = res.into_body();
    let _ = body.frame().await.expect("a first frame").unwrap();
    drop(body);
    let counters = client.breaker().snapshot().counters;
    assert_eq!((counters.successes, counters.ignored), (1, 1));
    assert_eq!(client.breaker().state(), State::Closed);
}

#[tokio::test]
async fn complete_streams_are_successes() {
    let (addr, _hits) = upstream().await;
    let mut client = llm_client(1);
    for _ in 0..10 {
        let res = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/ok"))
            .await
            .unwrap();
        let body = read_all(res.into_body()).await.unwrap();
        assert_eq!(body, OPENAI_OK.as_bytes());
    }
    let snap = client.breaker().snapshot();
    assert_eq!(snap.counters.successes, 10);
    assert_eq!(snap.window.calls, 10);
}

#[tokio::test]
async fn connection_refused_is_a_failure() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut client = llm_client(2);
    for _ in 0..2 {
        let err = client
            .ready()
            .await
            .unwrap()
            .call(get_req(addr, "/"))
            .await
            .unwrap_err();
        assert!(!err.is_circuit_open());
        assert!(err.inner().is_some());
    }
    assert_eq!(client.breaker().state(), State::Open);
}

#[test]
fn response_bodies_stay_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<
        tower_circuit_breaker::ResponseBody<
            hyper::body::Incoming,
            tower_circuit_breaker::classify::LlmStream,
        >,
    >();
    send_sync::<
        tower_circuit_breaker::ResponseBody<
            hyper::body::Incoming,
            tower_circuit_breaker::classify::GrpcStream,
        >,
    >();
}

#[tokio::test(start_paused = true)]
async fn quota_exhausted_is_neutral_in_half_open_too() {
    let breaker = tower_circuit_breaker::Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(1))
        .probes(1)
        .close_after(1)
        .jitter(0.0)
        .build()
        .unwrap();
    breaker.admit().unwrap().record(Outcome::Failure);
    assert_eq!(breaker.state(), State::Open);
    tokio::time::advance(Duration::from_secs(1)).await;

    // The only probe slot, given back by a quota answer...
    breaker.admit().unwrap().record(Outcome::QuotaExhausted);
    assert_eq!(breaker.state(), State::HalfOpen);
    // ...so the next call is admitted as a probe and decides.
    breaker
        .admit()
        .expect("the slot came back")
        .record(Outcome::Success);
    assert_eq!(breaker.state(), State::Closed);
    let counters = breaker.snapshot().counters;
    assert_eq!(
        (
            counters.quota_exhausted,
            counters.failures,
            counters.successes
        ),
        (1, 1, 1)
    );
}
