//! The keyed stack: a breaker per model, a retry that watches the request's
//! own key, keyed stacks as failover members; over mocks and over a real
//! connection.
#![cfg(not(loom))]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_circuit_breaker::TripMode;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_circuit_breaker::failover::Failover;
use tower_circuit_breaker::keyed::{self, KeyedBreakers};
use tower_circuit_breaker::retry::RetryPolicy;
use tower_circuit_breaker::stack::Stack;
use tower_circuit_breaker::{Breaker, CircuitOpen, State};

/// When each call reached an upstream, per model.
type Calls = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

fn model_of<B>(req: &Request<B>) -> String {
    req.headers()["x-model"].to_str().unwrap().to_owned()
}

fn for_model(model: &str) -> Request<String> {
    Request::post("/v1/chat/completions")
        .header("x-model", model)
        .body(String::new())
        .unwrap()
}

/// Answers the n-th call (from 0) for a model with `script(model, n)`.
fn scripted(
    calls: &Calls,
    script: fn(&str, usize) -> Response<String>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + use<> {
    let calls = Arc::clone(calls);
    tower::service_fn(move |req: Request<String>| {
        let model = model_of(&req);
        let mut calls = calls.lock().unwrap();
        let seen = calls.entry(model.clone()).or_default();
        seen.push(Instant::now());
        std::future::ready(Ok(script(&model, seen.len() - 1)))
    })
}

fn status(code: u16) -> Response<String> {
    Response::builder()
        .status(code)
        .body(String::new())
        .unwrap()
}

fn slow_down(secs: u64) -> Response<String> {
    Response::builder()
        .status(429)
        .header("retry-after", secs.to_string())
        .body(String::new())
        .unwrap()
}

fn count(calls: &Calls, model: &str) -> usize {
    calls.lock().unwrap().get(model).map_or(0, Vec::len)
}

/// A set that opens a key on its first failure and keeps it open for an
/// hour, so no assertion depends on the open period ending.
fn per_model() -> tower_circuit_breaker::Builder<KeyedBreakers> {
    KeyedBreakers::builder()
        .trip_mode(TripMode::Open)
        .consecutive_failures(1)
        .open_duration(Duration::from_secs(3600))
        .max_open_duration(Duration::from_secs(3600))
        .jitter(0.0)
}

#[tokio::test(start_paused = true)]
async fn a_keyed_stack_stops_retrying_a_model_the_moment_its_key_opens_and_leaves_other_models_alone(
) {
    // "big": slow down for 10 s, then broken. "small": slow down for 10 s,
    // then fine.
    let calls = Calls::default();
    let upstream = scripted(&calls, |model, n| match (model, n) {
        (_, 0) => slow_down(10),
        ("big", _) => status(503),
        _ => status(200),
    });
    let layer = Stack::keyed(per_model(), keyed::header("x-model"))
        .max_retries(3)
        .build()
        .unwrap();
    let models = layer.breakers().clone();
    let client = layer.layer(upstream);
    let start = Instant::now();

    // A waits out big's Retry-After; C waits out small's.
    let a = tokio::spawn(client.clone().oneshot(for_model("big")));
    let c = tokio::spawn(client.clone().oneshot(for_model("small")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // B fails on big at 1 s: big's circuit opens.
    let b = client.clone().oneshot(for_model("big")).await.unwrap_err();
    assert_eq!(models.get("big").unwrap().state(), State::Open);
    assert_eq!(
        CircuitOpen::find(&*b).unwrap().key(),
        Some("big"),
        "B's retry met the open circuit"
    );

    // A's wait ended the moment big opened: its retry was rejected then,
    // without reaching the upstream.
    let a = a.await.unwrap().unwrap_err();
    assert_eq!(CircuitOpen::find(&*a).unwrap().key(), Some("big"));
    assert_eq!(Instant::now() - start, Duration::from_secs(1));
    assert_eq!(count(&calls, "big"), 2, "A's first attempt and B's");

    // C, on another key, waited its 10 s in full and was answered.
    let c = c.await.unwrap().unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, Duration::from_secs(10));
    assert_eq!(count(&calls, "small"), 2);
    assert_eq!(models.get("small").unwrap().state(), State::Closed);
    assert_eq!(models.get("big").unwrap().snapshot().counters.rejected, 2);
}

#[tokio::test(start_paused = true)]
async fn keyed_stacks_as_failover_members_skip_the_member_whose_key_is_open() {
    // Provider A cannot serve "gpt" at all; provider B serves everything.
    let (a_calls, b_calls) = (Calls::default(), Calls::default());
    let a = Stack::keyed(per_model(), keyed::header("x-model"))
        .max_retries(2)
        .build()
        .unwrap();
    let b = Stack::keyed(per_model(), keyed::header("x-model"))
        .max_retries(2)
        .build()
        .unwrap();
    let a_models = a.breakers().clone();
    let failover = Failover::new(a.layer(scripted(&a_calls, |model, _| match model {
        "gpt" => status(503),
        _ => status(200),
    })))
    .fallback(b.layer(scripted(&b_calls, |_, _| status(200))));

    // The first "gpt" request opens A's "gpt" key (its retry is rejected at
    // once) and fails over to B.
    let res = failover.clone().oneshot(for_model("gpt")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(a_models.get("gpt").unwrap().state(), State::Open);
    assert_eq!((count(&a_calls, "gpt"), count(&b_calls, "gpt")), (1, 1));

    // The next one skips A without calling it and without a pause.
    let start = Instant::now();
    let res = failover.clone().oneshot(for_model("gpt")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(Instant::now(), start, "no pause after a rejection");
    assert_eq!((count(&a_calls, "gpt"), count(&b_calls, "gpt")), (1, 2));

    // Another model is still served by A.
    let res = failover.clone().oneshot(for_model("mini")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((count(&a_calls, "mini"), count(&b_calls, "mini")), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_retry_around_keyed_failover_members_ends_its_wait_when_the_key_is_open_in_all() {
    // Both providers slow "gpt" down first and then fail it; "mini" is
    // slowed down and then served.
    let primary = per_model().build().unwrap();
    let fallback = per_model().build().unwrap();
    let member = |set: &KeyedBreakers| {
        tower_circuit_breaker::CircuitBreakerLayer::keyed(set.clone(), keyed::header("x-model"))
            .layer(scripted(&Calls::default(), |model, n| match (model, n) {
                (_, 0) => slow_down(10),
                ("gpt", _) => status(503),
                _ => status(200),
            }))
    };
    let failover = Failover::new(member(&primary))
        .fallback(member(&fallback))
        .jitter(Duration::ZERO, Duration::ZERO);
    let policy = RetryPolicy::new()
        .max_retries(3)
        .watch_keyed(primary.clone(), keyed::header("x-model"))
        .watch_keyed(fallback.clone(), keyed::header("x-model"));
    let client = tower::retry::Retry::new(policy, failover);
    let start = Instant::now();

    // The first "gpt" request is slowed down by the primary (10 s) and sent
    // on to the fallback, which slows it down too: the retry waits 10 s.
    let first = tokio::spawn(client.clone().oneshot(for_model("gpt")));
    let mini = tokio::spawn(client.clone().oneshot(for_model("mini")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // At 1 s another "gpt" request fails on both: "gpt" is open in both
    // sets, and the first request's wait ends then.
    let second = client.clone().oneshot(for_model("gpt")).await.unwrap_err();
    assert!(second.is_circuit_open());
    assert_eq!(primary.get("gpt").unwrap().state(), State::Open);
    assert_eq!(fallback.get("gpt").unwrap().state(), State::Open);
    let first = first.await.unwrap().unwrap_err();
    assert!(first.is_circuit_open());
    assert_eq!(Instant::now() - start, Duration::from_secs(1));

    // "mini" is open nowhere: its request waited its 10 s and was served.
    let mini = mini.await.unwrap().unwrap();
    assert_eq!(mini.status(), StatusCode::OK);
    assert_eq!(Instant::now() - start, Duration::from_secs(10));
}

// === over a real connection ===

/// A server on 127.0.0.1:0 for which "big" is down (503) and every other
/// model is fine; it notes when each call came.
async fn models_server() -> (std::net::SocketAddr, Calls) {
    let calls = Calls::default();
    let seen = Arc::clone(&calls);
    let app = axum::Router::new().fallback(move |req: Request<axum::body::Body>| {
        let model = model_of(&req);
        seen.lock()
            .unwrap()
            .entry(model.clone())
            .or_default()
            .push(Instant::now());
        let code = if model == "big" { 503 } else { 200 };
        async move { (StatusCode::from_u16(code).unwrap(), "{}") }
    });
    (crate::support::serve(app).await, calls)
}

#[tokio::test(start_paused = true)]
async fn a_hyper_client_behind_a_keyed_stack_stops_retrying_the_broken_model_only() {
    let (addr, calls) = models_server().await;
    let layer = Stack::keyed(
        KeyedBreakers::builder()
            .trip_mode(TripMode::Open)
            .consecutive_failures(2)
            .open_duration(Duration::from_secs(3600))
            .max_open_duration(Duration::from_secs(3600))
            .jitter(0.0),
        keyed::header("x-model"),
    )
    .max_retries(5)
    .backoff(Duration::from_millis(500), Duration::from_secs(5))
    .seed(7)
    .build()
    .unwrap();
    let models = layer.breakers().clone();
    let mut client =
        layer.layer(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());
    let request = |model: &str| {
        Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("x-model", model)
            .body(Empty::<Bytes>::new())
            .unwrap()
    };

    // Two 503s open "big"; the retry after the second is not waited for.
    let err = client
        .ready()
        .await
        .unwrap()
        .call(request("big"))
        .await
        .unwrap_err();
    let ended = Instant::now();
    let open = CircuitOpen::find(&*err).expect("a rejection");
    assert_eq!(open.key(), Some("big"));
    assert_eq!(open.state(), State::Open);
    let big = calls.lock().unwrap()["big"].clone();
    assert_eq!(big.len(), 2, "five retries allowed, two attempts made");
    assert_eq!(ended, big[1], "rejected the moment the second 503 came");

    // "small" is served, and "big" is rejected without reaching the server.
    let res = client
        .ready()
        .await
        .unwrap()
        .call(request("small"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let err = client
        .ready()
        .await
        .unwrap()
        .call(request("big"))
        .await
        .unwrap_err();
    assert!(CircuitOpen::find(&*err).is_some());
    assert_eq!(calls.lock().unwrap()["big"].len(), 2);
    assert_eq!(models.get("small").unwrap().state(), State::Closed);
    // One set, every clone of the stack: the layer's set is the service's.
    assert_eq!(client.breakers().len(), 2);
    let _: &Breaker = &models.get("big").unwrap();
}
