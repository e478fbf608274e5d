//! A real tonic client, with the breaker layered on its `Channel`, against a
//! real tonic server on 127.0.0.1 (the one `examples/tonic_client.rs` runs).

#[path = "../../examples/tonic_client.rs"]
#[allow(dead_code)]
mod demo;

use std::error::Error as _;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use demo::{pb, LlmClient};
use tonic::Code;
use tower::ServiceBuilder;
use tower_circuit_breaker::classify::GrpcClassifier;
use tower_circuit_breaker::{CircuitBreakerLayer, CircuitOpen, State};

fn layer(failures: u32) -> CircuitBreakerLayer<GrpcClassifier> {
    CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(failures)
        .open_duration(Duration::from_secs(3600))
        .max_open_duration(Duration::from_secs(3600))
        .jitter(0.0)
        .build()
        .unwrap()
        .with_classifier(GrpcClassifier)
}

fn prompt(max_tokens: u32) -> pb::Prompt {
    pb::Prompt {
        text: "hi".into(),
        max_tokens,
    }
}

#[tokio::test]
async fn unavailable_in_trailers_after_streamed_messages_opens_the_circuit() {
    let (addr, upstream) = demo::spawn_server().await;
    let (channel, breaker) = demo::breaker_channel(addr, layer(3)).await.unwrap();
    let mut client = LlmClient::new(channel);
    upstream.fail(Code::Unavailable, 3);

    for i in 1..=3u64 {
        let stream = client.generate(prompt(5)).await.expect("the head is a 200");
        // Before the trailers, the call is still undecided.
        assert_eq!(breaker.snapshot().counters.failures, i - 1);
        let (text, end) = demo::collect(stream).await;
        assert_eq!(
            text, "tok0 tok1 tok2 ",
            "the messages before the error get through"
        );
        assert_eq!(end.unwrap_err().code(), Code::Unavailable);
        assert_eq!(breaker.snapshot().counters.failures, i);
    }
    assert_eq!(breaker.state(), State::Open);

    let status = client.generate(prompt(5)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "circuit open");
    assert_eq!(upstream.hits.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn trailers_only_unavailable_opens_the_circuit() {
    let (addr, upstream) = demo::spawn_server().await;
    let (channel, breaker) = demo::breaker_channel(addr, layer(4)).await.unwrap();
    let mut client = LlmClient::new(channel);
    upstream.fail(Code::Unavailable, 0);

    for i in 1..=2u64 {
        let status = client.complete(prompt(1)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(breaker.snapshot().counters.failures, 2 * i - 1);
        // A streaming call that fails before its first message is
        // trailers-only too.
        let status = client.generate(prompt(1)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(breaker.snapshot().counters.failures, 2 * i);
    }
    assert_eq!(breaker.state(), State::Open);
    let status = client.complete(prompt(1)).await.unwrap_err();
    assert_eq!(status.message(), "circuit open");
    assert_eq!(upstream.hits.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_hundred_invalid_arguments_leave_the_circuit_closed() {
    let (addr, upstream) = demo::spawn_server().await;
    let (channel, breaker) = demo::breaker_channel(addr, layer(1)).await.unwrap();
    let mut client = LlmClient::new(channel);
    upstream.fail(Code::InvalidArgument, 0);

    for _ in 0..100 {
        let status = client.complete(prompt(1)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    // In the trailers after messages, too.
    upstream.fail(Code::InvalidArgument, 2);
    for _ in 0..10 {
        let (_, end) = demo::collect(client.generate(prompt(4)).await.unwrap()).await;
        assert_eq!(end.unwrap_err().code(), Code::InvalidArgument);
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.ignored, 110);
    assert_eq!(snap.counters.failures, 0);
    assert_eq!(upstream.hits.load(Ordering::SeqCst), 110);

    // Armed all along: one real failure trips it.
    upstream.fail(Code::Internal, 0);
    let _ = client.complete(prompt(1)).await.unwrap_err();
    assert_eq!(breaker.state(), State::Open);
}

#[tokio::test]
async fn resource_exhausted_is_rate_limited_and_ok_is_a_success() {
    let (addr, upstream) = demo::spawn_server().await;
    let (channel, breaker) = demo::breaker_channel(addr, layer(1)).await.unwrap();
    let mut client = LlmClient::new(channel);

    for _ in 0..5 {
        let (text, end) = demo::collect(client.generate(prompt(3)).await.unwrap()).await;
        assert_eq!((text.as_str(), end.is_ok()), ("tok0 tok1 tok2 ", true));
        assert_eq!(client.complete(prompt(1)).await.unwrap().text, "echo: hi");
    }
    upstream.fail(Code::ResourceExhausted, 1);
    for _ in 0..5 {
        let (_, end) = demo::collect(client.generate(prompt(3)).await.unwrap()).await;
        assert_eq!(end.unwrap_err().code(), Code::ResourceExhausted);
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.counters.successes, 10);
    assert_eq!(snap.counters.rate_limited, 5);
    assert_eq!(snap.state, State::Closed);
}

#[tokio::test]
async fn a_stream_dropped_by_the_caller_is_ignored() {
    let (addr, _upstream) = demo::spawn_server().await;
    let (channel, breaker) = demo::breaker_channel(addr, layer(1)).await.unwrap();
    let mut client = LlmClient::new(channel);
    let mut stream = client.generate(prompt(1000)).await.unwrap();
    assert!(stream.message().await.unwrap().is_some());
    drop(stream);
    let counters = breaker.snapshot().counters;
    assert_eq!(
        (counters.ignored, counters.failures, counters.successes),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn tonic_accepts_the_breaker_error_type_on_a_bare_channel() {
    let (addr, upstream) = demo::spawn_server().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let layer = layer(1);
    let breaker = layer.breaker().clone();
    // No mapping: the service's error is `tower_circuit_breaker::Error`.
    let svc = ServiceBuilder::new().layer(layer).service(channel);
    let mut client = LlmClient::new(svc);

    upstream.fail(Code::Unavailable, 0);
    assert_eq!(
        client.complete(prompt(1)).await.unwrap_err().code(),
        Code::Unavailable
    );
    assert_eq!(breaker.state(), State::Open);

    let status = client.complete(prompt(1)).await.unwrap_err();
    // tonic does not know the error, so it reports UNKNOWN and keeps the
    // rejection as the status' source.
    assert_eq!(status.code(), Code::Unknown);
    let open = status
        .source()
        .and_then(CircuitOpen::find)
        .expect("the rejection is in the status' source");
    assert_eq!(open.state(), State::Open);
    assert!(open.retry_after().unwrap() <= Duration::from_secs(3600));
    assert_eq!(upstream.hits.load(Ordering::SeqCst), 1);
}
