//! A reqwest-middleware client with CircuitBreakerMiddleware -> the local
//! OpenAI-compatible server on 127.0.0.1:0.
//!
//! Time is paused (see tests/reqwest.rs for why that is sound here).

use crate::support_openai;
use tower_circuit_breaker::TripMode;

use std::time::Duration;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use support_openai::{closed_port, Mode, OpenAiServer};
use tower::{Layer, ServiceExt};
use tower_circuit_breaker::reqwest::ReqwestService;
use tower_circuit_breaker::reqwest_middleware::{circuit_open, CircuitBreakerMiddleware};
use tower_circuit_breaker::{Breaker, CircuitBreakerLayer, CircuitOpen, State};

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

fn breaker() -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .name("chat")
        .count_window(10)
        .min_calls(4)
        .failure_rate(0.5)
        .open_duration(Duration::from_secs(30))
        .probes(2)
        .close_after(2)
        .jitter(0.0)
        .build()
        .unwrap()
}

fn client(middleware: impl reqwest_middleware::Middleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest_client())
        .with(middleware)
        .build()
}

async fn chat(
    client: &ClientWithMiddleware,
    server: &OpenAiServer,
) -> reqwest_middleware::Result<reqwest::Response> {
    client
        .post(server.chat_url())
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-test","messages":[]}"#)
        .send()
        .await
}

fn rejection(err: &reqwest_middleware::Error) -> Option<&CircuitOpen> {
    match err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<CircuitOpen>(),
        reqwest_middleware::Error::Reqwest(_) => None,
    }
}

// === health ===

#[tokio::test(start_paused = true)]
async fn middleware_trips_on_5xx_rejects_as_a_middleware_error_and_heals_through_half_open() {
    let server = OpenAiServer::start(Mode::ServerError(500)).await;
    let breaker = breaker();
    let client = client(CircuitBreakerMiddleware::new(breaker.clone()));

    for _ in 0..4 {
        let res = chat(&client, &server).await.unwrap();
        assert_eq!(res.status(), 500);
    }
    assert_eq!(breaker.state(), State::Open);

    let err = chat(&client, &server).await.unwrap_err();
    assert!(err.is_middleware());
    let open = rejection(&err).expect("a CircuitOpen inside Error::Middleware");
    assert_eq!(open.key(), Some("chat"));
    assert_eq!(open.retry_after(), Some(Duration::from_secs(30)));
    assert_eq!(server.hits(), 4);

    server.set(Mode::Json);
    tokio::time::advance(Duration::from_secs(30)).await;
    for _ in 0..2 {
        assert_eq!(chat(&client, &server).await.unwrap().status(), 200);
    }
    assert_eq!(breaker.state(), State::Closed);
    let res = chat(&client, &server).await.unwrap();
    let body: serde_json::Value = res.json_bytes().await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(server.hits(), 7);
}

#[tokio::test(start_paused = true)]
async fn middleware_stays_closed_on_content_filter_400s() {
    let server = OpenAiServer::start(Mode::ContentFilter).await;
    let breaker = breaker();
    let client = client(CircuitBreakerMiddleware::new(breaker.clone()));

    for _ in 0..12 {
        let res = chat(&client, &server).await.unwrap();
        assert_eq!(res.status(), 400);
        let body: serde_json::Value = res.json_bytes().await;
        assert_eq!(body["error"]["code"], "content_policy_violation");
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.ignored, 12);
}

#[tokio::test(start_paused = true)]
async fn middleware_passes_429s_through() {
    let server = OpenAiServer::start(Mode::RateLimited { retry_after: 3 }).await;
    let breaker = breaker();
    let client = client(CircuitBreakerMiddleware::new(breaker.clone()));

    for _ in 0..12 {
        let res = chat(&client, &server).await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()["retry-after"], "3");
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.rate_limited, 12);
}

#[tokio::test(start_paused = true)]
async fn middleware_counts_refused_connections_and_keeps_the_reqwest_error() {
    let addr = closed_port();
    let breaker = Breaker::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(2)
        .build()
        .unwrap();
    let client = client(CircuitBreakerMiddleware::new(breaker.clone()));
    let url = format!("http://{addr}/v1/chat/completions");

    for _ in 0..2 {
        let err = client.post(&url).send().await.unwrap_err();
        assert!(matches!(&err, reqwest_middleware::Error::Reqwest(e) if e.is_connect()));
    }
    assert_eq!(breaker.state(), State::Open);
    let err = client.post(&url).send().await.unwrap_err();
    assert!(rejection(&err).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_call_releases_its_permit_as_dropped() {
    let server = OpenAiServer::start(Mode::Hang).await;
    let breaker = breaker();
    let client = client(CircuitBreakerMiddleware::new(breaker.clone()));

    let cancelled = tokio::time::timeout(Duration::from_secs(5), chat(&client, &server)).await;
    assert!(cancelled.is_err());
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.admitted, counters.dropped), (1, 1));
    assert_eq!(counters.failures, 0);
}

// === one breaker, two clients ===

#[tokio::test(start_paused = true)]
async fn a_tower_stack_and_a_middleware_client_share_one_breaker() {
    let server = OpenAiServer::start(Mode::ServerError(503)).await;
    let layer = CircuitBreakerLayer::new(breaker());
    let middleware = CircuitBreakerMiddleware::from(&layer);
    assert!(middleware.breaker().ptr_eq(layer.breaker()));
    let client = client(middleware);
    let tower = layer.layer(ReqwestService::new(reqwest_client()));

    // Two failures through each path open the shared circuit.
    for _ in 0..2 {
        let req = http::Request::post(server.chat_url()).body("{}").unwrap();
        assert_eq!(tower.clone().oneshot(req).await.unwrap().status(), 503);
        assert_eq!(chat(&client, &server).await.unwrap().status(), 503);
    }
    assert_eq!(layer.breaker().state(), State::Open);

    // Both paths now reject.
    assert!(rejection(&chat(&client, &server).await.unwrap_err()).is_some());
    let req = http::Request::post(server.chat_url()).body("{}").unwrap();
    assert!(tower.oneshot(req).await.unwrap_err().is_circuit_open());
    assert_eq!(server.hits(), 4);
}

// === streams ===

#[tokio::test(start_paused = true)]
async fn middleware_hands_a_deferred_verdict_to_the_reqwest_body() {
    let server = OpenAiServer::start(Mode::StreamError).await;
    let breaker = breaker();
    // The default classifier, LlmClassifier, reads SSE streams.
    let client = client(CircuitBreakerMiddleware::new(breaker.clone()));

    // The error event decides when it is read, not when the head arrives.
    let res = chat(&client, &server).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.url().as_str(),
        server.chat_url(),
        "the URL survives the body swap"
    );
    assert_eq!(breaker.snapshot().counters.failures, 0);
    let text = res.text().await.unwrap();
    assert!(text.contains("event: error"));
    assert_eq!(breaker.snapshot().counters.failures, 1);

    // `[DONE]`, then the body is dropped on a stream that never ends.
    server.set(Mode::Stream);
    let mut res = chat(&client, &server).await.unwrap();
    let mut seen = Vec::new();
    while !seen.ends_with(b"data: [DONE]\n\n") {
        seen.extend_from_slice(&res.chunk().await.unwrap().unwrap());
    }
    drop(res);
    assert_eq!(breaker.snapshot().counters.successes, 1);

    // Dropped before any deciding event: says nothing.
    let res = chat(&client, &server).await.unwrap();
    drop(res);
    let counters = breaker.snapshot().counters;
    assert_eq!(
        (counters.successes, counters.failures, counters.ignored),
        (1, 1, 1)
    );
}

trait JsonBytes {
    async fn json_bytes(self) -> serde_json::Value;
}

impl JsonBytes for reqwest::Response {
    async fn json_bytes(self) -> serde_json::Value {
        serde_json::from_slice(&self.bytes().await.unwrap()).unwrap()
    }
}

// === nested breakers ===

/// A middleware that wraps every error it passes on, as logging or
/// annotating middleware does.
struct Annotate;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Annotate {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        next.run(request, extensions)
            .await
            .map_err(reqwest_middleware::Error::middleware)
    }
}

fn one_failure_opens(name: &'static str) -> Breaker {
    Breaker::builder()
        .trip_mode(TripMode::Open)
        .name(name)
        .consecutive_failures(1)
        .jitter(0.0)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_inner_middlewares_rejection_is_ignored_by_the_outer_one() {
    let (outer, inner) = (one_failure_opens("global"), one_failure_opens("gpt"));
    inner.force_open();
    let client = ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(outer.clone()))
        .with(CircuitBreakerMiddleware::new(inner.clone()))
        .build();
    let url = format!("http://{}/v1/chat/completions", closed_port());

    let err = client.post(&url).send().await.unwrap_err();
    assert_eq!(rejection(&err).and_then(CircuitOpen::key), Some("gpt"));
    assert_eq!(outer.state(), State::Closed);
    let counters = outer.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn an_inner_rejection_another_middleware_wrapped_is_still_a_rejection() {
    let (outer, inner) = (one_failure_opens("global"), one_failure_opens("gpt"));
    inner.force_open();
    let client = ClientBuilder::new(reqwest_client())
        .with(CircuitBreakerMiddleware::new(outer.clone()))
        .with(Annotate)
        .with(CircuitBreakerMiddleware::new(inner.clone()))
        .build();
    let url = format!("http://{}/v1/chat/completions", closed_port());

    for _ in 0..3 {
        let err = client.post(&url).send().await.unwrap_err();
        let open = circuit_open(&err).expect("the inner rejection, seen through the wrapping");
        assert_eq!(open.key(), Some("gpt"));
    }
    assert_eq!(outer.state(), State::Closed);
    let counters = outer.snapshot().counters;
    assert_eq!((counters.failures, counters.ignored), (0, 3));
    assert_eq!(inner.snapshot().counters.rejected, 3);
}
