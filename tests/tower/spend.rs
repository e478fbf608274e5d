//! The spend guard over real connections: an upstream on 127.0.0.1:0 that
//! answers with `usage`, a hyper-util client, a $1 budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use tower::retry::Retry;
use tower::{ServiceBuilder, ServiceExt};
use tower_circuit_breaker::classify::LlmClassifier;
use tower_circuit_breaker::retry::RetryPolicy;
use tower_circuit_breaker::spend::{Meter, Period, Price, Prices, SpendGuard, Unit};
use tower_circuit_breaker::{response, Breaker, CircuitBreaker, Error, Failover, Rejection, State};

use crate::support::{http_client, read_all, serve, Hits, HttpClient};

/// $0.45 a call with the prices below: 100k input tokens at $2.50 per
/// million, 20k output tokens at $10.
const USAGE: &str = r#"{"id":"chatcmpl-1","model":"gpt-4o-2024-08-06","choices":[{"message":{"content":"ok"}}],
"usage":{"prompt_tokens":100000,"completion_tokens":20000}}"#;

const SSE: &str = "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"ok\"}}],\"usage\":null}\n\n\
data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":100000,\"completion_tokens\":20000}}\n\n\
data: [DONE]\n\n";

fn prices() -> Prices {
    Prices::new().model("gpt-4o", Price::per_million(2.50, 10.00, 1.25))
}

fn upstream(hits: Hits) -> Router {
    let json = hits.clone();
    Router::new()
        .route(
            "/v1/chat/completions",
            post(move || {
                json.hit();
                async { ([("content-type", "application/json")], USAGE) }
            }),
        )
        .route(
            "/v1/stream",
            post(move || {
                hits.hit();
                async { ([("content-type", "text/event-stream")], SSE) }
            }),
        )
}

const HOUR: Duration = Duration::from_secs(3600);

fn guarded() -> Breaker {
    Breaker::builder()
        .name("agent")
        .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::Rolling(HOUR)))
        .build()
        .unwrap()
}

type Metered = CircuitBreaker<HttpClient, Meter<LlmClassifier>, Breaker>;

fn client(breaker: &Breaker) -> Metered {
    CircuitBreaker::with_classifier(
        http_client(),
        breaker.clone(),
        Meter::new(LlmClassifier::new(), prices()),
    )
}

fn post_req(addr: std::net::SocketAddr, path: &str) -> Request<Empty<Bytes>> {
    Request::post(format!("http://{addr}{path}"))
        .body(Empty::new())
        .unwrap()
}

/// One call, its body read to the end.
async fn call(svc: &Metered, addr: std::net::SocketAddr, path: &str) -> Result<StatusCode, Error> {
    let res = svc.clone().oneshot(post_req(addr, path)).await?;
    let status = res.status();
    read_all(res.into_body()).await.unwrap();
    Ok(status)
}

#[tokio::test(start_paused = true)]
async fn the_call_that_crosses_completes_and_the_next_is_rejected_until_the_reset() {
    let hits = Hits::default();
    let addr = serve(upstream(hits.clone())).await;
    let breaker = guarded();
    let svc = client(&breaker);

    // $0.45, $0.90, then $1.35: the third call crosses the budget and completes.
    for n in 1..=3u64 {
        assert_eq!(
            call(&svc, addr, "/v1/chat/completions").await.unwrap(),
            StatusCode::OK
        );
        assert_eq!(breaker.snapshot().spend.unwrap().spent, n * 450_000);
    }
    assert_eq!(hits.get(), 3);

    // The next is rejected at once, and says why.
    let start = tokio::time::Instant::now();
    let err = call(&svc, addr, "/v1/chat/completions").await.unwrap_err();
    assert_eq!(tokio::time::Instant::now(), start, "rejected at once");
    let open = err.circuit_open().expect("a rejection");
    assert_eq!(open.reason(), Rejection::SpendExceeded);
    assert_eq!(open.state(), State::Closed);
    let spend = open.spend().unwrap();
    assert_eq!(
        (spend.budget(), spend.spent(), spend.unit()),
        (1_000_000, 1_350_000, Unit::MicroDollars)
    );
    assert_eq!(
        spend.resets_at() - start,
        HOUR,
        "every charge was in the first minute"
    );
    assert_eq!(open.retry_after(), Some(HOUR));

    // 0 upstream calls until the reset.
    tokio::time::advance(HOUR - Duration::from_secs(1)).await;
    for _ in 0..5 {
        let err = call(&svc, addr, "/v1/chat/completions").await.unwrap_err();
        assert_eq!(
            err.circuit_open().unwrap().reason(),
            Rejection::SpendExceeded
        );
    }
    assert_eq!(hits.get(), 3);

    // Then the charges age out of the rolling hour: calls go through again.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        call(&svc, addr, "/v1/chat/completions").await.unwrap(),
        StatusCode::OK
    );
    assert_eq!(hits.get(), 4);
    assert_eq!(breaker.snapshot().spend.unwrap().spent, 450_000);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_answer_is_charged_from_its_final_usage_event() {
    let hits = Hits::default();
    let addr = serve(upstream(hits.clone())).await;
    let breaker = guarded();
    let svc = client(&breaker);
    for _ in 0..3 {
        call(&svc, addr, "/v1/stream").await.unwrap();
    }
    let spend = breaker.snapshot().spend.unwrap();
    assert_eq!((spend.spent, spend.observed_calls), (1_350_000, 3));
    let err = call(&svc, addr, "/v1/stream").await.unwrap_err();
    assert_eq!(
        err.circuit_open().unwrap().reason(),
        Rejection::SpendExceeded
    );
    assert_eq!(hits.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn retry_policy_makes_no_retry_of_a_spent_budget() {
    let hits = Hits::default();
    let addr = serve(upstream(hits.clone())).await;
    let breaker = guarded();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let inner = client(&breaker);
    // Counts the attempts the retry layer makes, below it.
    let attempt = tower::service_fn(move |req: Request<Empty<Bytes>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        inner.clone().oneshot(req)
    });
    let svc = Retry::new(
        RetryPolicy::new()
            .max_retries(3)
            .backoff(Duration::from_millis(10), Duration::from_millis(10)),
        attempt,
    );
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(post_req(addr, "/v1/chat/completions"))
            .await
            .unwrap();
        res.into_body().collect().await.unwrap();
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 3);

    let err = svc
        .clone()
        .oneshot(post_req(addr, "/v1/chat/completions"))
        .await
        .unwrap_err();
    assert_eq!(
        err.circuit_open().unwrap().reason(),
        Rejection::SpendExceeded
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 4, "one attempt, no retry");
    assert_eq!(hits.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn failover_returns_a_spent_budget_instead_of_trying_the_next_member() {
    let (a_hits, b_hits) = (Hits::default(), Hits::default());
    let a = serve(upstream(a_hits.clone())).await;
    let b = serve(upstream(b_hits.clone())).await;
    let breaker = guarded();
    let svc = Failover::new(client(&breaker)).fallback_with(
        client(&Breaker::builder().build().unwrap()),
        move |req: &mut Request<Empty<Bytes>>| {
            *req.uri_mut() = format!("http://{b}/v1/chat/completions").parse().unwrap();
        },
    );
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(post_req(a, "/v1/chat/completions"))
            .await
            .unwrap();
        res.into_body().collect().await.unwrap();
    }
    assert_eq!((a_hits.get(), b_hits.get()), (3, 0));
    let err = svc
        .clone()
        .oneshot(post_req(a, "/v1/chat/completions"))
        .await
        .unwrap_err();
    assert_eq!(
        err.circuit_open().unwrap().reason(),
        Rejection::SpendExceeded
    );
    assert_eq!(
        (a_hits.get(), b_hits.get()),
        (3, 0),
        "the next member is not tried"
    );
}

#[tokio::test(start_paused = true)]
async fn each_key_of_a_keyed_set_has_its_own_budget() {
    let hits = Hits::default();
    let addr = serve(upstream(hits.clone())).await;
    let keyed = tower_circuit_breaker::keyed::KeyedBreakers::builder()
        .spend_guard(SpendGuard::micro_dollars(1_000_000, Period::Rolling(HOUR)))
        .build()
        .unwrap();
    let agent = keyed.get_or_insert("agent");
    let user = keyed.get_or_insert("user");
    let (agent_svc, user_svc) = (client(&agent), client(&user));
    for _ in 0..3 {
        call(&agent_svc, addr, "/v1/chat/completions")
            .await
            .unwrap();
    }
    let err = call(&agent_svc, addr, "/v1/chat/completions")
        .await
        .unwrap_err();
    assert_eq!(err.circuit_open().unwrap().key(), Some("agent"));
    assert_eq!(
        call(&user_svc, addr, "/v1/chat/completions").await.unwrap(),
        StatusCode::OK
    );
    assert_eq!(user.snapshot().spend.unwrap().spent, 450_000);
}

// === the axum mapping ===

async fn on_error(err: Error) -> Response {
    match err.circuit_open() {
        Some(open) => response::rejected(open),
        None => Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(axum::body::Body::from(err.to_string()))
            .unwrap(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_axum_app_answers_a_spent_budget_with_a_402_the_sdks_do_not_retry() {
    let hits = Hits::default();
    let upstream_addr = serve(upstream(hits.clone())).await;
    let breaker = guarded();
    let svc = client(&breaker);
    let proxy = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(on_error))
        .service(tower::service_fn(move |_req: Request<axum::body::Body>| {
            let svc = svc.clone();
            async move {
                let res = svc
                    .oneshot(post_req(upstream_addr, "/v1/chat/completions"))
                    .await?;
                let (parts, body) = res.into_parts();
                let body = read_all(body).await.unwrap();
                Ok::<_, Error>(Response::from_parts(parts, axum::body::Body::from(body)))
            }
        }));
    let app = serve(Router::new().route_service("/chat", proxy)).await;
    let outside = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let ask = || async {
        let res = outside.request(post_req(app, "/chat")).await.unwrap();
        let status = res.status();
        let retry = res.headers().get("x-should-retry").cloned();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, retry, String::from_utf8(body.to_vec()).unwrap())
    };
    for _ in 0..3 {
        assert_eq!(ask().await.0, StatusCode::OK);
    }
    let (status, retry, body) = ask().await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(retry.unwrap(), "false");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["error"]["type"], "spend_exceeded");
    assert_eq!(json["error"]["budget"], 1_000_000);
    assert_eq!(json["error"]["spent"], 1_350_000);
    assert_eq!(json["error"]["unit"], "usd_micros");
    assert_eq!(json["error"]["resets_in_ms"], 3_600_000);
    assert_eq!(hits.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn under_stream_deadlines_a_stream_is_charged_from_its_usage_too() {
    use tower_circuit_breaker::deadline::StreamDeadlines;
    let hits = Hits::default();
    let addr = serve(upstream(hits.clone())).await;
    let breaker = guarded();
    let svc = client(&breaker)
        .stream_deadlines(StreamDeadlines::new().stall(Duration::from_secs(30)))
        .unwrap();
    for path in ["/v1/stream", "/v1/chat/completions"] {
        let res = svc.clone().oneshot(post_req(addr, path)).await.unwrap();
        read_all(res.into_body()).await.unwrap();
    }
    let spend = breaker.snapshot().spend.unwrap();
    assert_eq!((spend.spent, spend.observed_calls), (900_000, 2));
}
