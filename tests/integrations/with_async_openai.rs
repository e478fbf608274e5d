//! A real async-openai client whose HTTP stack holds the breaker, against the
//! local OpenAI-compatible server on 127.0.0.1:0.
//!
//! Time is paused: async-openai's retry sleeps (backoff, `Retry-After`) pass
//! at once and exactly, and the breaker's open duration is moved with
//! `tokio::time::advance`. The reqwest client has no pool-idle timer.

use crate::support_openai;
use tower_circuit_breaker::TripMode;

use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::retry::SimpleRetryPolicy;
use async_openai::middleware::ReqwestService;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::Client;
use futures::StreamExt;
use support_openai::{closed_port, Mode, OpenAiServer};
use tokio::time::Instant;
use tower::ServiceBuilder;
use tower_circuit_breaker::async_openai::{circuit_open, http_service, OpenAiCircuitBreakerLayer};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, State};

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

fn breaker(min_calls: u32) -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("gpt-test")
        .count_window(10)
        .min_calls(min_calls)
        .failure_rate(0.5)
        .open_duration(Duration::from_secs(30))
        .probes(2)
        .close_after(2)
        .jitter(0.0)
        .build()
        .unwrap()
}

fn config(server: &OpenAiServer) -> OpenAIConfig {
    OpenAIConfig::new()
        .with_api_base(server.api_base())
        .with_api_key("sk-test")
}

fn request() -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("gpt-test")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("ping")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap()
}

fn is_open(err: &OpenAIError) -> bool {
    matches!(err, OpenAIError::Boxed(e) if e.is::<CircuitOpen>())
}

fn api_status(err: &OpenAIError) -> Option<u16> {
    match err {
        OpenAIError::ApiError(e) => Some(e.status_code.as_u16()),
        _ => None,
    }
}

// === health ===

#[tokio::test(start_paused = true)]
async fn async_openai_trips_on_5xx_and_heals_through_half_open() {
    let server = OpenAiServer::start(Mode::ServerError(500)).await;
    let breaker = breaker(4);
    let client = Client::with_config(config(&server))
        .with_http_service(http_service(reqwest_client(), breaker.clone()));

    // One call: async-openai's retry makes four attempts, all 500s; the
    // fourth opens the circuit and the caller sees the last 500.
    let err = client.chat().create(request()).await.unwrap_err();
    assert_eq!(api_status(&err), Some(500));
    assert_eq!(server.hits(), 4);
    assert_eq!(breaker.state(), State::Open);

    // While open: the rejection, at once, with no retry and no backoff sleep.
    let started = Instant::now();
    let err = client.chat().create(request()).await.unwrap_err();
    assert!(is_open(&err), "{err:?}");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(server.hits(), 4);
    let retry_after = circuit_open(&err).unwrap().retry_after().unwrap();
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(30));

    server.set(Mode::Json);
    tokio::time::advance(retry_after).await;
    for _ in 0..2 {
        let answer = client.chat().create(request()).await.unwrap();
        assert_eq!(answer.choices[0].message.content.as_deref(), Some("pong"));
    }
    assert_eq!(breaker.state(), State::Closed);
    assert_eq!(server.hits(), 6);
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_ends_async_openais_retry_loop() {
    let server = OpenAiServer::start(Mode::ServerError(503)).await;
    let breaker = breaker(2);
    let client = Client::with_config(config(&server))
        .with_http_service(http_service(reqwest_client(), breaker.clone()));

    // Two 503s open the circuit; the retry's third attempt is rejected and
    // the rejection is not retried.
    let err = client.chat().create(request()).await.unwrap_err();
    assert!(is_open(&err), "{err:?}");
    assert_eq!(server.hits(), 2);
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.failures, counters.rejected), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn tower_retry_with_simple_retry_policy_does_not_retry_a_rejection() {
    let server = OpenAiServer::start(Mode::ServerError(503)).await;
    let breaker = breaker(2);
    let service = ServiceBuilder::new()
        .retry(SimpleRetryPolicy::new(5))
        .layer(OpenAiCircuitBreakerLayer::new(breaker.clone()))
        .service(ReqwestService::new(reqwest_client()));
    let client = Client::with_config(config(&server)).with_http_service(service);

    let err = client.chat().create(request()).await.unwrap_err();
    assert!(is_open(&err), "{err:?}");
    assert_eq!(server.hits(), 2);
    assert_eq!(breaker.snapshot().counters.rejected, 1);
}

#[tokio::test(start_paused = true)]
async fn async_openai_stays_closed_on_content_filter_400s() {
    let server = OpenAiServer::start(Mode::ContentFilter).await;
    let breaker = breaker(4);
    let client = Client::with_config(config(&server))
        .with_http_service(http_service(reqwest_client(), breaker.clone()));

    for _ in 0..12 {
        let err = client.chat().create(request()).await.unwrap_err();
        let OpenAIError::ApiError(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            e.api_error.code.as_deref(),
            Some("content_policy_violation")
        );
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.ignored, 12);
    assert_eq!(server.hits(), 12);
}

#[tokio::test(start_paused = true)]
async fn async_openai_gets_429s_with_retry_after_and_the_breaker_stays_closed() {
    let server = OpenAiServer::start(Mode::RateLimited { retry_after: 2 }).await;
    let breaker = breaker(4);
    let client = Client::with_config(config(&server))
        .with_http_service(http_service(reqwest_client(), breaker.clone()));

    // async-openai's retry sees every 429 and waits its Retry-After: three
    // retries of 2 s each.
    let started = Instant::now();
    let err = client.chat().create(request()).await.unwrap_err();
    assert_eq!(api_status(&err), Some(429));
    assert_eq!(started.elapsed(), Duration::from_secs(6));
    assert_eq!(server.hits(), 4);

    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.rate_limited, 4);
    assert_eq!(snap.counters.failures, 0);
}

#[tokio::test(start_paused = true)]
async fn refused_connections_are_failures_and_async_openai_sees_the_reqwest_error() {
    let addr = closed_port();
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(2)
        .build()
        .unwrap();
    let service = ServiceBuilder::new()
        .layer(OpenAiCircuitBreakerLayer::new(breaker.clone()))
        .service(ReqwestService::new(reqwest_client()));
    let config = OpenAIConfig::new().with_api_base(format!("http://{addr}/v1"));
    let client = Client::with_config(config).with_http_service(service);

    for _ in 0..2 {
        let err = client.chat().create(request()).await.unwrap_err();
        assert!(
            matches!(&err, OpenAIError::Reqwest(e) if e.is_connect()),
            "{err:?}"
        );
    }
    assert_eq!(breaker.state(), State::Open);
    assert!(is_open(&client.chat().create(request()).await.unwrap_err()));
}

#[tokio::test(start_paused = true)]
async fn a_layer_shares_its_breaker_with_the_async_openai_stack() {
    let server = OpenAiServer::start(Mode::ServerError(500)).await;
    let layer = CircuitBreakerLayer::new(breaker(2));
    let service = ServiceBuilder::new()
        .layer(OpenAiCircuitBreakerLayer::from(&layer))
        .service(ReqwestService::new(reqwest_client()));
    let client = Client::with_config(config(&server)).with_http_service(service);

    for _ in 0..2 {
        let err = client.chat().create(request()).await.unwrap_err();
        assert_eq!(api_status(&err), Some(500));
    }
    assert_eq!(layer.breaker().state(), State::Open);
}

// === streams, with the default classifier (LlmClassifier) ===

#[tokio::test(start_paused = true)]
async fn a_streamed_chat_completion_read_to_done_is_a_success() {
    let server = OpenAiServer::start(Mode::Stream).await;
    let breaker = breaker(4);
    let client = Client::with_config(config(&server))
        .with_http_service(http_service(reqwest_client(), breaker.clone()));

    let mut stream = client.chat().create_stream(request()).await.unwrap();
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        text.push_str(chunk.choices[0].delta.content.as_deref().unwrap_or(""));
    }
    assert_eq!(text, "pong");
    // The server never ends the body after `[DONE]`; async-openai drops it.
    let counters = breaker.snapshot().counters;
    assert_eq!(
        (counters.successes, counters.failures, counters.ignored),
        (1, 0, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_streamed_chat_completion_that_ends_in_an_error_event_is_a_failure() {
    let server = OpenAiServer::start(Mode::StreamError).await;
    let breaker = breaker(4);
    let client = Client::with_config(config(&server))
        .with_http_service(http_service(reqwest_client(), breaker.clone()));

    let stream = client.chat().create_stream(request()).await.unwrap();
    let items: Vec<_> = stream.collect().await;
    assert!(items[0].is_ok());
    assert!(
        items.last().unwrap().is_err(),
        "the caller sees the error event"
    );
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.successes, counters.failures), (0, 1));
}

// === nested breakers ===

fn one_failure_opens(name: &'static str) -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .name(name)
        .consecutive_failures(1)
        .jitter(0.0)
        .build()
        .unwrap()
}

fn unreachable_config() -> OpenAIConfig {
    OpenAIConfig::new()
        .with_api_base(format!("http://{}/v1", closed_port()))
        .with_api_key("sk-test")
}

#[tokio::test(start_paused = true)]
async fn an_inner_breakers_rejection_is_ignored_by_the_outer_one() {
    let (outer, inner) = (one_failure_opens("global"), one_failure_opens("gpt"));
    inner.force_open();
    let service = ServiceBuilder::new()
        .layer(OpenAiCircuitBreakerLayer::new(outer.clone()))
        .layer(OpenAiCircuitBreakerLayer::new(inner.clone()))
        .service(ReqwestService::new(reqwest_client()));
    let client = Client::with_config(unreachable_config()).with_http_service(service);

    let err = client.chat().create(request()).await.unwrap_err();
    assert_eq!(circuit_open(&err).and_then(CircuitOpen::key), Some("gpt"));
    assert_eq!(outer.state(), State::Closed);
    let counters = outer.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn an_inner_rejection_boxed_again_by_an_attempt_timeout_is_still_a_rejection() {
    // Global breaker -> attempt timeout -> per-model breaker -> client: the
    // timeout boxes the inner `OpenAIError`, and the outer breaker boxes
    // that once more.
    let (outer, inner) = (one_failure_opens("global"), one_failure_opens("gpt"));
    inner.force_open();
    let service = ServiceBuilder::new()
        .layer(OpenAiCircuitBreakerLayer::new(outer.clone()))
        .timeout(Duration::from_secs(60))
        .layer(OpenAiCircuitBreakerLayer::new(inner.clone()))
        .service(ReqwestService::new(reqwest_client()));
    let client = Client::with_config(unreachable_config()).with_http_service(service);

    for _ in 0..3 {
        let err = client.chat().create(request()).await.unwrap_err();
        let open = circuit_open(&err).expect("the inner rejection, seen through both boxes");
        assert_eq!(open.key(), Some("gpt"));
    }
    assert_eq!(outer.state(), State::Closed);
    let counters = outer.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 3));
    assert_eq!(inner.snapshot().counters.rejected, 3);
}
