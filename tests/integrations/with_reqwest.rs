//! The tower path: CircuitBreakerLayer -> ReqwestService -> a real
//! reqwest::Client -> the local OpenAI-compatible server on 127.0.0.1:0.
//!
//! Time is paused: the reqwest clients here have no pool-idle timer, so the
//! only timers are the breaker's open duration (moved with
//! `tokio::time::advance`) and reqwest's own timeout where a test sets one.

use crate::support_openai;
use tower_circuit_breaker::TripMode;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use support_openai::classify::SseDone;
use support_openai::{closed_port, Mode, OpenAiServer};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::{Classify, LlmClassifier, LlmStream, NeverDefer};
use tower_circuit_breaker::reqwest::{into_reqwest_response, ReqwestService};
use tower_circuit_breaker::{
    BoxError, CircuitBreaker, CircuitBreakerLayer, CircuitOpen, ResponseBody, State,
};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .build()
        .unwrap()
}

fn layer() -> CircuitBreakerLayer {
    CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
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

fn chat(url: &str) -> http::Request<&'static str> {
    http::Request::post(url)
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-test","messages":[]}"#)
        .unwrap()
}

// === static guarantees ===

fn assert_send_sync<T: Send + Sync>() {}
fn assert_default<T: Default>() {}
fn assert_body<B: http_body::Body<Data = Bytes, Error = reqwest::Error>>() {}
fn assert_wrappable<B>(body: B) -> reqwest::Body
where
    B: http_body::Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    reqwest::Body::wrap(body)
}

#[test]
fn response_body_over_reqwest_is_send_sync_default_and_forwards_data_and_error() {
    assert_send_sync::<ResponseBody<reqwest::Body>>();
    assert_send_sync::<ResponseBody<reqwest::Body, LlmStream>>();
    assert_default::<ResponseBody<reqwest::Body, LlmStream>>();
    assert_body::<ResponseBody<reqwest::Body, LlmStream>>();
    let _ = assert_wrappable(ResponseBody::<reqwest::Body, LlmStream>::default());
    assert_send_sync::<ResponseBody<reqwest::Body, <SseDone as Classify>::Stream>>();
    assert_default::<ResponseBody<reqwest::Body>>();
    assert_default::<ResponseBody<reqwest::Body, <SseDone as Classify>::Stream>>();
    assert_body::<ResponseBody<reqwest::Body>>();
    assert_body::<ResponseBody<reqwest::Body, NeverDefer>>();
    let _ = assert_wrappable(ResponseBody::<reqwest::Body>::default());
    assert_send_sync::<CircuitBreaker<ReqwestService<String>>>();
    assert_send_sync::<tower_circuit_breaker::reqwest::ResponseFuture>();
}

// === health ===

#[tokio::test(start_paused = true)]
async fn reqwest_trips_on_5xx_skips_the_upstream_while_open_and_heals_through_half_open() {
    let server = OpenAiServer::start(Mode::ServerError(503)).await;
    let layer = layer();
    let breaker = layer.breaker().clone();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(ReqwestService::new(client()));
    let url = server.chat_url();

    for _ in 0..4 {
        let res = svc.ready().await.unwrap().call(chat(&url)).await.unwrap();
        assert_eq!(res.status(), 503);
        res.into_body().collect().await.unwrap();
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(server.hits(), 4);

    let err = svc
        .ready()
        .await
        .unwrap()
        .call(chat(&url))
        .await
        .unwrap_err();
    let open = err.circuit_open().expect("rejected");
    assert_eq!(open.retry_after(), Some(Duration::from_secs(30)));
    assert_eq!(
        server.hits(),
        4,
        "an open circuit does not call the upstream"
    );

    server.set(Mode::Json);
    tokio::time::advance(Duration::from_secs(30)).await;
    for _ in 0..2 {
        let res = svc.ready().await.unwrap().call(chat(&url)).await.unwrap();
        assert_eq!(res.status(), 200);
    }
    assert_eq!(breaker.state(), State::Closed);
    let res = svc.oneshot(chat(&url)).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"{\"id\":\"chatcmpl-1\""));
    assert_eq!(server.hits(), 7);
}

#[tokio::test(start_paused = true)]
async fn reqwest_stays_closed_on_content_filter_400s() {
    let server = OpenAiServer::start(Mode::ContentFilter).await;
    let layer = layer();
    let breaker = layer.breaker().clone();
    let mut svc = layer.layer(ReqwestService::new(client()));
    let url = server.chat_url();

    for _ in 0..12 {
        let res = svc.ready().await.unwrap().call(chat(&url)).await.unwrap();
        assert_eq!(res.status(), 400);
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.ignored, 12);
    assert_eq!(snap.window.calls, 0, "ignored calls stay out of the window");
    assert_eq!(server.hits(), 12);
}

#[tokio::test(start_paused = true)]
async fn reqwest_passes_429s_through_with_their_retry_after() {
    let server = OpenAiServer::start(Mode::RateLimited { retry_after: 7 }).await;
    let layer = layer();
    let breaker = layer.breaker().clone();
    let mut svc = layer.layer(ReqwestService::new(client()));
    let url = server.chat_url();

    for _ in 0..12 {
        let res = svc.ready().await.unwrap().call(chat(&url)).await.unwrap();
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()["retry-after"], "7");
    }
    let snap = breaker.snapshot();
    assert_eq!(snap.state, State::Closed);
    assert_eq!(snap.counters.rate_limited, 12);
    assert_eq!(snap.counters.failures, 0);
}

// === errors ===

#[tokio::test(start_paused = true)]
async fn refused_connections_are_failures_and_stay_reqwest_errors() {
    let addr = closed_port();
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(3)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let mut svc = layer.layer(ReqwestService::new(client()));
    let url = format!("http://{addr}/v1/chat/completions");

    for _ in 0..3 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(chat(&url))
            .await
            .unwrap_err();
        let inner = err.inner().expect("an inner error, not a rejection");
        assert!(inner.downcast_ref::<reqwest::Error>().unwrap().is_connect());
        let boxed: BoxError = err.into_box();
        let reqwest_err = boxed.downcast::<reqwest::Error>().unwrap();
        assert!(reqwest_err.is_connect());
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(breaker.snapshot().counters.failures, 3);

    let boxed: BoxError = svc
        .ready()
        .await
        .unwrap()
        .call(chat(&url))
        .await
        .unwrap_err()
        .into();
    assert!(CircuitOpen::find(&*boxed).is_some());
}

#[tokio::test(start_paused = true)]
async fn reqwest_timeouts_are_failures_and_stay_reqwest_errors() {
    let server = OpenAiServer::start(Mode::Hang).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_idle_timeout(None)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let layer = CircuitBreakerLayer::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(2)
        .build()
        .unwrap();
    let breaker = layer.breaker().clone();
    let mut svc = layer.layer(ReqwestService::new(client));
    let url = server.chat_url();

    for _ in 0..2 {
        let started = tokio::time::Instant::now();
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(chat(&url))
            .await
            .unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        let boxed: BoxError = err.into_box();
        assert!(boxed.downcast::<reqwest::Error>().unwrap().is_timeout());
    }
    assert_eq!(breaker.state(), State::Open);
    assert_eq!(server.hits(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_uri_reqwest_cannot_take_is_a_builder_error_not_a_panic() {
    let mut svc = ReqwestService::new(client());
    let request = http::Request::get("/relative/only").body("").unwrap();
    let err = svc.ready().await.unwrap().call(request).await.unwrap_err();
    assert!(err.is_builder());
}

// === reqwest types both ways ===

#[tokio::test(start_paused = true)]
async fn reqwest_requests_go_through_and_come_back_as_reqwest_responses() {
    let server = OpenAiServer::start(Mode::Json).await;
    let client = client();
    let layer = layer();
    let breaker = layer.breaker().clone();
    let svc = layer.layer(ReqwestService::new(client.clone()));

    let request = client
        .post(server.chat_url())
        .body(r#"{"model":"gpt-test","messages":[]}"#)
        .build()
        .unwrap();
    let request = http::Request::try_from(request).unwrap();
    let res = svc.oneshot(request).await.unwrap();
    let res = into_reqwest_response(res);
    assert_eq!(res.status(), 200);
    assert_eq!(res.url().as_str(), server.chat_url());
    let body: serde_json::Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "pong");
    assert_eq!(breaker.snapshot().counters.successes, 1);
}

// === streams ===

#[tokio::test(start_paused = true)]
async fn the_llm_classifier_decides_a_reqwest_stream_at_its_events() {
    let server = OpenAiServer::start(Mode::StreamError).await;
    let layer = layer().with_classifier(LlmClassifier::new());
    let breaker = layer.breaker().clone();
    let svc = layer.layer(ReqwestService::new(client()));

    // An error event mid-stream: a failure, decided when the event is read.
    let res = svc.clone().oneshot(chat(&server.chat_url())).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.body().is_pending());
    assert_eq!(breaker.snapshot().counters.failures, 0);
    let res = into_reqwest_response(res);
    let text = res.text().await.unwrap();
    assert!(text.contains("overloaded_error"));
    assert_eq!(breaker.snapshot().counters.failures, 1);

    // `[DONE]` and then a stream that never ends: a success once `[DONE]` is
    // read, though the body is dropped unfinished.
    server.set(Mode::Stream);
    let res = svc.oneshot(chat(&server.chat_url())).await.unwrap();
    let mut res = into_reqwest_response(res);
    let mut seen = Vec::new();
    while !seen.ends_with(b"data: [DONE]\n\n") {
        seen.extend_from_slice(&res.chunk().await.unwrap().unwrap());
    }
    drop(res);
    let counters = breaker.snapshot().counters;
    assert_eq!((counters.successes, counters.failures), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn any_deferring_classifier_plugs_in() {
    let server = OpenAiServer::start(Mode::StreamError).await;
    let layer = layer().with_classifier(SseDone);
    let breaker = layer.breaker().clone();
    let svc = layer.layer(ReqwestService::new(client()));

    let res = svc.oneshot(chat(&server.chat_url())).await.unwrap();
    assert!(res.body().is_pending());
    into_reqwest_response(res).text().await.unwrap();
    assert_eq!(breaker.snapshot().counters.failures, 1);
}

// === reqwest's own types: ReqwestClient and send_through ===

fn chat_request(client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"model":"gpt-test","messages":[]}"#)
}

#[tokio::test(start_paused = true)]
async fn a_reqwest_client_behind_the_breaker_takes_and_answers_reqwest_types() {
    use tower_circuit_breaker::reqwest::ReqwestClient;

    let server = OpenAiServer::start(Mode::ServerError(503)).await;
    let layer = layer();
    let http = client();
    let mut svc = ReqwestClient::new(http.clone(), &layer);
    let url = server.chat_url();

    for _ in 0..4 {
        let request: reqwest::Request = chat_request(&http, &url).build().unwrap();
        let res: reqwest::Response = svc.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(res.status(), 503);
        assert_eq!(res.url().as_str(), url);
        assert!(res.error_for_status_ref().is_err());
        assert!(res.text().await.unwrap().contains("error"));
    }
    assert_eq!(layer.breaker().state(), State::Open);

    let request = chat_request(&http, &url).build().unwrap();
    let err = svc.execute(request).await.unwrap_err();
    assert_eq!(
        err.circuit_open().unwrap().retry_after(),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        server.hits(),
        4,
        "an open circuit does not call the upstream"
    );

    server.set(Mode::Json);
    tokio::time::advance(Duration::from_secs(30)).await;
    for _ in 0..2 {
        let request = chat_request(&http, &url).build().unwrap();
        let res = svc.execute(request).await.unwrap();
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["choices"][0]["message"]["content"], "pong");
    }
    assert_eq!(layer.breaker().state(), State::Closed);
}

#[tokio::test(start_paused = true)]
async fn send_through_keeps_the_builder_and_a_stream_is_decided_at_its_events() {
    use tower_circuit_breaker::reqwest::RequestBuilderExt;

    let server = OpenAiServer::start(Mode::StreamError).await;
    let layer = layer().with_classifier(LlmClassifier::new());
    let http = client();

    let res = chat_request(&http, &server.chat_url())
        .send_through(&layer)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        layer.breaker().snapshot().counters.failures,
        0,
        "not read yet"
    );
    assert!(res.text().await.unwrap().contains("overloaded_error"));
    assert_eq!(layer.breaker().snapshot().counters.failures, 1);

    // A request that does not build is not admitted.
    let err = http
        .post("not a url")
        .send_through(&layer)
        .await
        .unwrap_err();
    let inner: BoxError = err.into_box();
    assert!(inner.downcast_ref::<reqwest::Error>().unwrap().is_builder());
    assert_eq!(layer.breaker().snapshot().counters.admitted, 1);

    // A refused connection stays a reqwest::Error, and is a failure.
    let closed = closed_port();
    let err = http
        .get(format!("http://{closed}/v1/models"))
        .send_through(&layer)
        .await
        .unwrap_err();
    let inner: BoxError = err.into_box();
    assert!(inner.downcast_ref::<reqwest::Error>().unwrap().is_connect());
    assert_eq!(layer.breaker().snapshot().counters.failures, 2);
}
